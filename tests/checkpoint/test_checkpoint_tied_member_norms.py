"""Review Q1 of today's fixes: a checkpoint of a BatchEnsemble whose per-member norm copies
are tied across two norm layers in today's model but were saved apart (before 2026-12-06)
loads as saved, and resuming it is refused naming them; pyrouq imports and checks labels on
a torch without uint16/32/64 (torch 2.2); conformal() names 'abs' scores that overflow
float64; evaluate() and conformal() name uint16/32/64 labels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _toy import ListLoader, toy_data
from torch import nn

import pyrouq
from pyrouq import GaussianPredictions, Predictions, batchensemble, conformal, evaluate, fit

WIDE_UNSIGNED = [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)]


class _TiedNorms(nn.Module):
    """``bn2`` shares ``bn1``'s weight and bias."""

    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.bn1 = nn.BatchNorm1d(4)
        self.l2 = nn.Linear(4, 4)
        self.bn2 = nn.BatchNorm1d(4)
        self.bn2.weight = self.bn1.weight
        self.bn2.bias = self.bn1.bias
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.bn2(self.l2(torch.tanh(self.bn1(self.l1(x))))))


def _saved_apart():
    """A model laid out as one converted before 2026-12-06 (each member's copies of the two
    tied norms, a tensor each: the same keys and description as a file of 2d810b0^), whose
    copies of bn2 trained apart from bn1's."""
    torch.manual_seed(0)
    model = batchensemble(_TiedNorms(), 3)
    first = model.net.bn1.norms[0]
    assert first.weight is model.net.bn2.norms[0].weight  # today's conversion keeps the tie
    for copy in model.net.bn2.norms:
        for name in ("weight", "bias"):
            value = getattr(copy, name).detach()
            setattr(copy, name, nn.Parameter(value + torch.randn_like(value)))
    return model


def test_a_checkpoint_whose_tied_member_norms_were_saved_apart_loads_as_saved(tmp_path):
    """load() re-tied the copies and wrote both saved values into one tensor: outputs off,
    no warning."""
    model = _saved_apart().eval()
    pyrouq.save(tmp_path / "m.pt", model)
    loaded = pyrouq.load(tmp_path / "m.pt", module=_TiedNorms()).model.eval()
    x = torch.randn(8, 3)
    assert torch.equal(loaded(x), model(x))
    assert loaded.net.bn1.norms[1].weight is not loaded.net.bn2.norms[1].weight
    assert torch.equal(loaded.net.bn2.norms[1].bias, model.net.bn2.norms[1].bias)
    torch.manual_seed(0)
    pyrouq.save(tmp_path / "tied.pt", batchensemble(_TiedNorms(), 3))  # a tie saved as one
    tied = pyrouq.load(tmp_path / "tied.pt", module=_TiedNorms()).model
    assert tied.net.bn1.norms[2].weight is tied.net.bn2.norms[2].weight


def test_resuming_a_run_whose_tied_member_norms_trained_apart_is_refused_naming_them(tmp_path):
    x, y = toy_data(32)
    loader = ListLoader(x, y, 16)
    path = tmp_path / "run.pt"
    fit(_saved_apart(), None, loader, epochs=1, lr=0.01, progress=False, checkpoint=path)
    torch.manual_seed(0)
    tied = batchensemble(_TiedNorms(), 3)
    with pytest.raises(pyrouq.CheckpointError) as err:
        fit(tied, None, loader, epochs=2, lr=0.01, progress=False, resume_from=path)
    text = str(err.value)
    assert text.startswith(
        f"resume_from={str(path)!r} was saved when the per-member norm parameters "
        "['net.bn2.norms.0.weight', 'net.bn2.norms.0.bias', 'net.bn2.norms.1.weight', "
    )
    assert "fit(pyrouq.load(path).model, ..., resume_from=path)" in text
    loaded = pyrouq.load(path, module=_TiedNorms()).model  # the way the message gives
    history = fit(loaded, None, loader, epochs=2, lr=0.01, progress=False, resume_from=path)
    assert len(history.losses) == 2


def test_pyrouq_checks_labels_and_scores_on_a_torch_without_uint16_32_64():
    """torch 2.2 (which pyproject allows) has no torch.uint16 / uint32 / uint64: reading them
    raised AttributeError."""
    code = (
        "import torch\n"
        "for name in ('uint16', 'uint32', 'uint64'):\n"
        "    if hasattr(torch, name): delattr(torch, name)\n"
        "import pyrouq, pyrouq.metrics\n"
        "from pyrouq.likelihoods import Categorical\n"
        "assert Categorical.label_problem(torch.tensor([0, 1]), 2) is None\n"
        "p = pyrouq.Predictions(torch.tensor([[[0.9, 0.1], [0.2, 0.8]]]), torch.tensor([0, 1]))\n"
        "assert pyrouq.evaluate(p)['acc'] == 1.0\n"
        "assert pyrouq.metrics.ood_auroc(torch.tensor([1, 2]), torch.tensor([3, 4])) == 1.0\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "ok"


def test_conformal_names_abs_scores_that_overflow_float64():
    """The scale 1e-300 squares to 0 in float64: every score was inf, and the predictor's
    check said 'conformal() refuses an alpha that would need one', not the cause."""
    loc = torch.zeros(1, 20, 1, dtype=torch.float64)
    scale = torch.full((1, 20, 1), 1e-300, dtype=torch.float64)
    y = torch.linspace(1e10, 2e10, 20, dtype=torch.float64)[:, None]
    with pytest.raises(ValueError) as err:
        conformal(GaussianPredictions(loc, scale, y), alpha=0.1)
    assert str(err.value) == (
        "conformal(): expected finite 'abs' scores, but 20 of the 20 calibration scores of "
        "output(s) [0] are NaN or inf, which made the threshold [inf]: the scores "
        "|y - mean| / stddev, computed in float64, overflow: a predictive stddev of 0 or one "
        "too small for its residual (the smallest stddev 0, the largest residual 2e+10; a "
        "scale below about 1e-154 squares to 0). Rescale the targets and fit again "
        "(standardise them, pyrouq.Standardizer), or give the model larger scales (e.g. a "
        "larger Gaussian(min_scale=...) floor), then predict and calibrate again."
    )
    scale[0, :19] = 1.0  # the threshold (the 19th of 20 scores) below the one infinite score
    assert conformal(GaussianPredictions(loc, scale, y), alpha=0.1).threshold.isfinite().all()


@pytest.mark.parametrize("dtype", WIDE_UNSIGNED, ids=str)
def test_evaluate_and_conformal_name_uint16_32_64_labels(dtype):
    """torch's '"min_all" not implemented for 'UInt16'' came instead."""
    probs = torch.softmax(torch.randn(1, 10, 3), -1)
    labels = torch.arange(10).remainder(3).to(dtype)
    for name, call in (  # (each naming its argument)
        ("targets", lambda: evaluate(Predictions(probs, labels))),
        ("val_targets", lambda: conformal(Predictions(probs), labels)),
    ):
        with pytest.raises(TypeError) as err:
            call()
        assert str(err.value) == (
            f"Expected int64 {name} (class indices), got dtype {dtype}, which torch can "
            "neither take the minimum of nor compare with int64 predictions; convert them "
            f"with {name}.long()."
        )
