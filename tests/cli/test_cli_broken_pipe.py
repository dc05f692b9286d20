"""`pyrouq fit MODEL | head -1` still writes its run; and small leftovers beside it: an ELBO's
gradients under torch.no_grad(), regression targets on the meta device."""

from __future__ import annotations

import os
import subprocess
import sys

import pyro
import pytest
import torch
from _toy import tiny_mlp, toy_data

import pyrouq
from pyrouq import GaussianPredictions
from pyrouq.infer import KLWeightedELBO

_RUN_FILES = ("metrics.json", "config.json", "checkpoint.pt", "reliability.png")


def test_fit_piped_into_head_writes_its_run_and_exits_quietly(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64"]
    child = subprocess.Popen(
        [sys.executable, "-m", "pyrouq", *argv, "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None and child.stderr is not None
    first = child.stdout.readline()  # as `| head -1`: one line read, then the reader is gone
    child.stdout.close()
    err = child.stderr.read().decode()
    code = child.wait(timeout=120)
    assert first.startswith(b"pyrouq "), first
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 141  # as before, and as README's exit codes say: the output was cut
    assert all((out / name).is_file() for name in _RUN_FILES), sorted(os.listdir(out))


# -- KLWeightedELBO.loss_and_grads under torch.no_grad() -------------------------------------


@pytest.mark.parametrize("num_particles", [1, 2])
def test_loss_and_grads_under_no_grad_gives_the_gradients_it_gives_outside(num_particles):
    x, y = toy_data(8)
    grads = []
    for context in (torch.enable_grad, torch.no_grad):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = tiny_mlp(num_data=8)
        guide = pyrouq.MeanFieldGuide(model)
        pyro.set_rng_seed(1)
        with context():
            loss = KLWeightedELBO(num_particles=num_particles).loss_and_grads(model, guide, x, y)
        grads.append((loss, [p.grad for p in guide.parameters()]))
    (loss, expected), (loss_no_grad, got) = grads
    assert loss_no_grad == loss
    assert all(g is not None for g in got)  # (2 particles: torch's "does not require grad")
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


# -- GaussianPredictions given targets on the meta device ------------------------------------

_META = (
    "Expected targets on a real device (cpu or cuda), got a tensor of shape (6,) on the meta "
    "device (shapes, no values): there are no targets to check."
)


@pytest.mark.parametrize(
    "call",
    [
        lambda p, y: GaussianPredictions(p.loc, p.scale, y),
        lambda p, y: p.evaluate(y),
        lambda p, y: p.crps(y),
        lambda p, y: p.log_prob(y),
        lambda p, y: p.calibration_curve(y),
        lambda p, y: pyrouq.conformal(p, y),
    ],
    ids=["constructor", "evaluate", "crps", "log_prob", "calibration_curve", "conformal"],
)
def test_regression_targets_on_the_meta_device_are_refused_in_words(call):
    predictions = GaussianPredictions(torch.zeros(3, 6, 1), torch.ones(3, 6, 1))
    with pytest.raises(ValueError, match="^" + _META.replace("(", r"\(").replace(")", r"\)")):
        call(predictions, torch.zeros(6, device="meta"))
