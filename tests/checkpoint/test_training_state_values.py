"""fit()'s own checkpoints: written as save() writes them (their resume state not walked again
by save()'s check), that state made of Python's own values (a schedule named by numpy's str_ or
a str Enum stopped fit() after its first epoch)."""

from __future__ import annotations

import enum

import numpy as np
import pyro
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data

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
