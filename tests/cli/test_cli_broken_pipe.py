"""`pyrouq fit MODEL | head -1` still writes its run; and small leftovers beside it: an ELBO's
gradients under torch.no_grad(), regression targets on the meta device, fit()'s own
checkpoints (written as save() writes them, their resume state made of Python's values)."""

from __future__ import annotations

import enum
import os
import subprocess
import sys

import numpy as np
import pyro
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data

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


# -- fit()'s own checkpoints --------------------------------------------------------------


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
