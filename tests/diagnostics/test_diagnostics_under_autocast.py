"""Review of the reproducibility, half-precision and Pyro-native audits (cfa86c4, 73ca729,
02510a2): the same defects through other public routes, and the docs of what they changed."""

from __future__ import annotations

import os
import signal

import pyro
import pytest
import torch
from _toy import PyroClassifier
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq
from pyrouq import TrainingInterrupted, bayesian, fit, load, mean_field_guide


def _data(n=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def _partly_bayesian():
    """A network whose first layer is a point estimate (autocast caches its casts)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model = bayesian(net, select=["2.weight", "2.bias"])
    return model, mean_field_guide(model)


def _log_lik(model, guide, x, y):
    pyro.set_rng_seed(0)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=5)
    return torch.as_tensor(idata.log_likelihood["obs"].values)


def _log_weights(model, guide, x, y):
    pyro.set_rng_seed(0)
    return pyrouq.psis_diagnostic(model, guide, x, y, num_samples=25).log_weights


# -- to_inference_data() and psis_diagnostic() under a torch.autocast ---------------------------


def test_to_inference_data_after_fit_in_one_autocast_block_runs_the_fitted_weights():
    """fit() and predict() drop autocast's cached casts; to_inference_data() did not: after
    fit() in the same block it ran the point estimates of fit()'s last step, before its
    update (pointwise log-likelihoods summing to -194.20 where the fitted network's are
    -192.95)."""
    x, y = _data()
    model, guide = _partly_bayesian()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fit(model, guide, loader, epochs=3, lr=0.05, progress=False, seed=0)
        same_block = _log_lik(model, guide, x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a fresh block: no cached casts
        fresh = _log_lik(model, guide, x, y)
    assert torch.equal(same_block, fresh)


@pytest.mark.parametrize("check", ["to_inference_data", "psis_diagnostic"])
def test_diagnostics_in_one_autocast_block_run_the_current_weights(check):
    """Two checks in one autocast block, the point estimates changed in place in between (a
    checkpoint loaded, more training): the second ran the first's cached casts."""
    x, y = _data()
    model, guide = _partly_bayesian()
    run = _log_lik if check == "to_inference_data" else _log_weights
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = run(model, guide, x, y)
        with torch.no_grad():
            model.net[0].weight.mul_(0.0)
            model.net[0].bias.fill_(-1.0)  # every hidden unit off
        after = run(model, guide, x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fresh = run(model, guide, x, y)
    assert not torch.equal(before, fresh)
    assert torch.equal(after, fresh)


# -- PSISResult's k-hat where it rounds up to a threshold ---------------------------------------


@pytest.mark.parametrize(
    ("k", "shown", "reading"),
    [(0.4996, "k_hat=0.4996,", "good (k-hat 0.4996 < 0.5)"), (0.6997, "k_hat=0.6997,", "ok (")],
)
def test_psis_result_repr_does_not_round_k_hat_up_to_its_threshold(monkeypatch, k, shown, reading):
    """The interpretation no longer reads "0.50 < 0.5", but the result's repr, what a REPL
    or print() shows, still rounded to 3 decimals: "PSISResult(k_hat=0.500, S=25): good
    (k-hat 0.4996 < 0.5) ...", one line saying 0.500 and below 0.5."""
    import arviz

    monkeypatch.setattr(arviz, "psislw", lambda lw, reff: (lw - lw.max(), k))
    x, y = _data()
    model = PyroClassifier(6, 3)
    guide = AutoNormal(model)
    result = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=25)
    assert result.k_hat == k
    assert result.interpretation.startswith(reading)
    assert shown in repr(result)
    assert f"k_hat={k:.3f}," not in repr(result)


# -- fit()'s docstring: a second Ctrl-C while a batch is fetched ---------------------------------


def test_a_second_ctrl_c_in_a_batch_fetch_stops_as_the_first_and_saves(tmp_path):
    """fit()'s docstring said any second press raises a plain KeyboardInterrupt and writes
    nothing; one landing in a fetch (README: "saves as the first would") raises
    TrainingInterrupted with the checkpoint written."""
    x, y = _data(64)

    class PressTwice(torch.utils.data.DataLoader):
        def __iter__(self):
            for i, batch in enumerate(super().__iter__()):
                if i == 2:
                    for _ in range(2):
                        os.kill(os.getpid(), signal.SIGINT)
                yield batch

    loader = PressTwice(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model, guide = _partly_bayesian()
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted) as stopped:
        fit(model, guide, loader, epochs=2, progress=False, seed=0, checkpoint=path)
    assert (stopped.value.epoch, stopped.value.step) == (1, 2)
    saved = load(path, module=nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)))
    assert (saved.training["epochs_done"], saved.training["epoch_steps"]) == (0, 2)
    assert "fetched stops as the first press does" in " ".join(fit.__doc__.split())
