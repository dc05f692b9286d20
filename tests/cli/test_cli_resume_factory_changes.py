"""Self-review 12b: `pyrouq fit --resume` of a run stopped while it evaluated is told in the
command's words when its factory now builds another network (it showed fit()'s or load()'s
advice); mcmc() refuses a site a likelihood of the user's own, or a forward replaced on the
instance, samples (NUTS sampled it, the result dropped it); an alpha whose float is 0 or 1
(Fraction(1, 10**400), a long double just below 1) is refused in the house message (a bare
ZeroDivisionError, or taken as 1.0); summary() takes an hdi_prob of one number held in a
tensor or array again; to_inference_data() takes var_names as a generator."""

from __future__ import annotations

import contextlib
import io
from fractions import Fraction

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _cli import one_line_error
from _toy import hand_made_chains
from torch import nn

import pyrouq
from pyrouq.calibration import ConformalRegressor, conformal
from pyrouq.cli import main
from pyrouq.diagnostics import summary, to_inference_data

# --------------------------------------------------------------------------------------------
# fit --resume of a run stopped while it evaluated, whose factory now builds another network
# --------------------------------------------------------------------------------------------

FACTORY = "test_cli_resume_factory_changes:make"
ARGV = ["fit", FACTORY, "--epochs", "1", "--train-size", "64", "--batch-size", "64"]
ARGV += ["--seed", "3", "--num-samples", "2", "--no-progress"]


class Reshaped(nn.Module):
    """An MNIST network of ``width`` hidden units that raises KeyboardInterrupt (Ctrl-C) when
    run in eval mode once trained while ``armed``: the run's evaluation after training."""

    armed = False
    width = 8

    def __init__(self):
        super().__init__()
        width = Reshaped.width
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, 10)
        )
        self.start = self.body[1].weight.detach().clone()

    def forward(self, x):
        trained = not torch.equal(self.body[1].weight.detach(), self.start)
        if Reshaped.armed and trained and not self.training:
            raise KeyboardInterrupt
        return self.body(x)


def make() -> nn.Module:  # `pyrouq fit test_cli_resume_factory_changes:make`
    return Reshaped()


def test_resume_of_a_run_whose_factory_now_builds_another_network_is_told_in_its_words(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    out = tmp_path / "part"
    monkeypatch.setattr(Reshaped, "armed", True)
    with contextlib.redirect_stderr(io.StringIO()):
        assert main([*ARGV, "--out", str(out)]) == 130  # stopped while it evaluated
    monkeypatch.setattr(Reshaped, "armed", False)
    monkeypatch.setattr(Reshaped, "width", 6)
    err = one_line_error(capsys, [*ARGV, "--out", str(out), "--resume"])
    assert (
        f"the factory {FACTORY!r}, called to rebuild the run's network, now builds another "
        "network: " in err
    )
    assert "make the factory build what it built when the run trained" in err
    assert not (out / "metrics.json").exists()
    monkeypatch.setattr(Reshaped, "width", 8)  # the factory as it was: the run is finished
    assert main([*ARGV, "--out", str(out), "--resume"]) == 0
    assert (out / "metrics.json").is_file()


# --------------------------------------------------------------------------------------------
# mcmc(): sites sampled by a likelihood of the user's own or a forward set on the instance
# --------------------------------------------------------------------------------------------


class TempGaussian(pyrouq.Gaussian):
    """A Gaussian likelihood whose observe() draws a temperature of its own."""

    def observe(self, outputs, y, num_data, where, members=None, latent=None):
        temp = pyro.sample("temp", dist.LogNormal(0.0, 0.3))
        return super().observe(outputs * temp, y, num_data, where, members, latent)


def _regression(likelihood):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 2, generator=g), torch.randn(12, 1, generator=g)
    return pyrouq.bayesian(nn.Linear(2, 1), likelihood=likelihood), x, y


def test_mcmc_refuses_a_site_that_a_likelihood_of_ones_own_samples():
    model, x, y = _regression(TempGaussian(0.5))
    with pytest.raises(ValueError, match=r"mcmc\(\): BayesianNetwork samples \['temp'\] in its"):
        pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=1, progress=False)


def test_mcmc_refuses_a_site_that_a_forward_set_on_the_instance_samples():
    model, x, y = _regression(pyrouq.Gaussian(0.5))
    built_in = model.forward

    def forward(x, y=None):
        pyro.sample("temp", dist.LogNormal(0.0, 0.3))
        return built_in(x, y)

    model.forward = forward
    with pytest.raises(ValueError, match=r"samples \['temp'\] in its forward"):
        pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=1, progress=False)


# --------------------------------------------------------------------------------------------
# alpha compared as the float it is used as
# --------------------------------------------------------------------------------------------

ALPHAS = [Fraction(1, 10**400), np.longdouble(1) - np.longdouble(2.0) ** -60]


@pytest.mark.parametrize("alpha", ALPHAS, ids=["tiny-fraction", "long-double-below-1"])
def test_an_alpha_whose_float_is_0_or_1_is_refused(alpha):
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 40, 3, generator=g), -1)
    preds = pyrouq.Predictions(probs, torch.randint(0, 3, (40,), generator=g))
    with pytest.raises(ValueError, match=r"^Expected alpha in \(0, 1\), the allowed miscoverage"):
        conformal(preds, alpha=alpha)
    with pytest.raises(ValueError, match=r"^ConformalRegressor: expected alpha in \(0, 1\)"):
        ConformalRegressor("abs", alpha, torch.tensor([1.0]))


# --------------------------------------------------------------------------------------------
# summary(hdi_prob=) of one number held in a tensor or an array; var_names as a generator
# --------------------------------------------------------------------------------------------


def test_summary_takes_an_hdi_prob_held_in_a_tensor_or_an_array():
    result, _, _ = hand_made_chains(10)
    idata = to_inference_data(result)
    want = summary(idata, hdi_prob=0.9)
    assert "hdi_5%" in want.columns
    for hdi_prob in (torch.tensor(0.9), np.array(0.9), torch.tensor([0.9])):
        assert summary(idata, hdi_prob=hdi_prob).equals(want)
    for bad in (torch.tensor(1.5), torch.tensor([0.9, 0.8]), np.array(np.nan)):
        with pytest.raises(ValueError, match=r"summary\(\): expected hdi_prob in \(0, 1\)"):
            summary(idata, hdi_prob=bad)


def test_to_inference_data_takes_var_names_as_a_generator():
    result, _, _ = hand_made_chains(10)
    idata = to_inference_data(result, var_names=(name for name in ["weight"]))
    assert list(idata.posterior.data_vars) == ["weight"]
    model = pyrouq.BayesianMLP(in_features=3, hidden_features=4, out_features=2)
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    idata = to_inference_data(model, guide, x, y, 3, var_names=iter(["fc1.bias"]), seed=0)
    assert list(idata.posterior.data_vars) == ["fc1.bias"]
