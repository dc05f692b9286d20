"""Review of the eighth audit's checkpoint, command and diagnostics changes: an extra state of a
subclass of a plain type (an IntEnum, numpy's float64) passed save()'s check and the file then
failed to load; a classifier's logits of -inf (a masked class, which fit() and predict() take)
were refused by to_inference_data(); an MCMCResult's statistic with dims after (chain, draw) was
refused; `pyrouq evaluate` of a file that is no run's checkpoint named '.' as the run's folder."""

from __future__ import annotations

import enum
import os

import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq.cli import main

az = pytest.importorskip("arviz")


class _Mode(enum.IntEnum):
    FAST = 1


class _Extra(nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.extra = extra

    def get_extra_state(self):
        return self.extra

    def set_extra_state(self, state):
        self.extra = state

    def forward(self, x):
        return self.fc(x)


_IN_THE_DICT = (
    "its state entry '_extra_state' (what its module's get_extra_state() returns) holds a "
    f"{__name__}._Mode at _extra_state['mode'], which load() would refuse to unpickle"
)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (_Mode.FAST, "its state entry '_extra_state' is a _Mode (what its module's "),
        (np.float64(1.5), "its state entry '_extra_state' is a float64 (what its module's "),
        (np.zeros(2), "its state entry '_extra_state' is an ndarray (what its module's "),
        ({"mode": _Mode.FAST}, _IN_THE_DICT),
        ([1, object()], "holds an object at _extra_state[1], which load() would refuse"),
    ],
    ids=["intenum", "np", "ndarray", "nested", "in a list"],
)
def test_save_refuses_a_subclass_of_a_plain_type_that_load_would_refuse(tmp_path, extra, words):
    """isinstance(IntEnum member, int) held, so it passed as plain data: save() wrote the file
    and load() refused it as holding pickled Python objects. A value inside the dict or list
    that get_extra_state() returns is named where it lies (the refusal said the dict itself
    was what load() would refuse, which its advice, to return dicts, contradicted)."""
    with pytest.raises(pyrouq.CheckpointError) as err:
        pyrouq.save(tmp_path / "c.pt", _Extra(extra))
    assert words in str(err.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("extra", [torch.Size([2, 3]), torch.float64, {"n": 3, "t": (1, 2.0)}])
def test_extra_states_that_load_reads_back_are_saved(tmp_path, extra):
    path = pyrouq.save(tmp_path / "c.pt", _Extra(extra))
    assert pyrouq.load(path, module=_Extra(None)).model.extra == extra


class _Masked(nn.Module):
    """A classifier whose last class is masked out (logit -inf)."""

    def __init__(self, all_classes=False):
        super().__init__()
        self.fc = nn.Linear(2, 3)
        mask = [True, True, True] if all_classes else [False, False, True]
        self.register_buffer("mask", torch.tensor(mask))

    def forward(self, x):
        return self.fc(x).masked_fill(self.mask, float("-inf"))


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_logits_of_minus_inf_export_as_predict_sees_them(kind):
    torch.manual_seed(0)
    x, y = torch.randn(12, 2), torch.randint(0, 2, (12,))
    if kind == "bayesian":
        model = pyrouq.bayesian(_Masked())
        guide, draws = pyrouq.mean_field_guide(model), 3
    else:
        model, guide, draws = pyrouq.batchensemble(_Masked(), 2), None, None
    torch.manual_seed(1)
    want = pyrouq.predict(model, x, guide, num_samples=draws, progress=False).probs
    torch.manual_seed(1)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=draws)
    probs = torch.as_tensor(idata.posterior_predictive["probs"].values[0])
    torch.testing.assert_close(probs, want)
    assert bool((probs[..., 2] == 0).all())
    log_lik = torch.as_tensor(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(log_lik, want.double().gather(-1, y.expand(len(want), -1)[..., None])
                               .squeeze(-1).log(), rtol=1e-5, atol=1e-6)  # fmt: skip
    # every class -inf is no distribution: refused, naming the inputs
    model = pyrouq.bayesian(_Masked(all_classes=True))
    with pytest.raises(ValueError, match=r"the model's outputs are NaN or inf at guide draw 0"):
        pyrouq.to_inference_data(model, pyrouq.mean_field_guide(model), x, y, num_samples=2)


def test_an_mcmc_statistic_with_dims_of_its_own_is_exported():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 2, generator=g), torch.randn(6, generator=g)
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=pyrouq.Gaussian(0.5))
    samples = {"weight": torch.randn(2, 4, 1, 2, generator=g), "bias": torch.randn(2, 4, 1)}
    stats = {"diverging": torch.zeros(2, 4, dtype=torch.bool), "parts": torch.randn(2, 4, 3)}
    result = pyrouq.MCMCResult(samples, stats, "nuts", 10, model=model, x=x, y=y)
    idata = pyrouq.to_inference_data(result)
    np.testing.assert_array_equal(idata.sample_stats["parts"].values, stats["parts"].numpy())
    result.sample_stats["parts"] = torch.randn(2, 3, 3)  # other draws: still refused
    with pytest.raises(ValueError, match=r"got \{'parts': \(2, 3, 3\)\}"):
        pyrouq.to_inference_data(result)


def test_evaluate_of_a_file_that_is_no_runs_checkpoint_names_no_folder(tmp_path, capsys):
    path = pyrouq.save(tmp_path / "model.pt", pyrouq.MLP())
    assert main(["evaluate", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"pyrouq: error: RUN_DIR {str(path)!r} is a file; pass a folder of `pyrouq fit` (the "
        "folder holding its checkpoint.pt)\n"
    )
