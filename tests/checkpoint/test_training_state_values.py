"""fit()'s own checkpoints: written as save() writes them (their resume state not walked again
by save()'s check), that state made of Python's own values (a schedule named by numpy's str_ or
a str Enum stopped fit() after its first epoch; a loader of one's own whose ``batch_size`` is
numpy's, read from a config or an array, has it recorded and compared on resume, as a Python
int's is)."""

from __future__ import annotations

import enum
import warnings

import numpy as np
import pyro
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from torch import nn

import pyrouq


def _fit(path, **kw):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = tiny_mlp()
    guide = pyrouq.MeanFieldGuide(model)
    x, y = toy_data(16)
    pyrouq.fit(model, guide, ListLoader(x, y, 8), epochs=3, progress=False, seed=0,
               checkpoint=path, **kw)  # fmt: skip
    return model, guide


def test_fit_writes_the_bytes_save_writes_of_its_state(tmp_path, monkeypatch):
    payloads, real = [], torch.save

    def save(obj, f, *args, **kwargs):  # what each of fit()'s checkpoints held
        payloads.append(obj)
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    model, guide = _fit(tmp_path / "fit.pt", metadata={"note": "run"})
    last = payloads[-1]  # the third epoch's, written as the model and guide are now
    assert len(payloads) == 3 and len(last["training"]["history"]) == 3
    again = pyrouq.save(
        tmp_path / "save.pt",
        model,
        guide,
        optimizer=last["optimizer"],
        metadata={"note": "run"},
        training=last["training"],
    )
    assert again.read_bytes() == (tmp_path / "fit.pt").read_bytes()


class _Schedule(str, enum.Enum):
    COSINE = "cosine"


@pytest.mark.parametrize(
    "schedule", [np.str_("cosine"), _Schedule.COSINE], ids=["np.str_", "str-Enum"]
)
def test_a_schedule_named_by_a_str_subclass_is_saved_as_its_name(tmp_path, schedule):
    # (it was kept as numpy's str_ / the Enum, which load() refuses: fit() stopped after its
    # first epoch with "Expected save(training=...) to be the dict of resume state ...")
    _fit(tmp_path / "fit.pt", lr_schedule=schedule)
    training = pyrouq.load(tmp_path / "fit.pt").training
    assert training is not None
    assert type(training["lr_schedule"]) is str and training["lr_schedule"] == "cosine"


class _SizedBatches(ListLoader):
    """A loader of one's own: a list of batches that tells its batch size as given."""

    def __init__(self, x, y, batch_size):
        super().__init__(x, y, int(batch_size))
        self.batch_size = batch_size


def _run_sized(batch_size, path, **kw):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=16)
    loader = _SizedBatches(x, y, batch_size)
    pyrouq.fit(
        model, pyrouq.mean_field_guide(model), loader, progress=False, seed=0, checkpoint=path, **kw
    )


@pytest.mark.filterwarnings("ignore:fit\\(resume_from=\\.\\.\\.\\) trains a finished run")
@pytest.mark.parametrize("kind", [np.int64, np.int32])
def test_a_numpy_batch_size_is_recorded_and_compared_on_resume(tmp_path, kind):
    # it was recorded as 0 (told none), so a resume with batches of 7 where the run took 6
    # (16 rows: 3 batches an epoch either way) went on without a word
    path = tmp_path / "run.pt"
    _run_sized(kind(6), path, epochs=1)
    recorded = torch.load(path, weights_only=True)["training"]["batch_size"]
    assert (recorded, type(recorded)) == (6, int)
    with pytest.warns(
        UserWarning,
        match=r"continues a run of batch size 6 with a loader of batch size 7: its steps see "
        r"other batches than the run's would have",
    ):
        _run_sized(kind(7), tmp_path / "other.pt", epochs=2, resume_from=path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=r".*trains a finished run")  # (its own test)
        _run_sized(6, tmp_path / "same.pt", epochs=2, resume_from=path)
