"""Audit of mcmc(): its draws against a closed-form posterior, its energies against the log
density, a discrete prior refused by name, and the advice for draws of unequal counts."""

from __future__ import annotations

import re

import pyro.distributions as dist
import pytest
import torch
from _toy import RaisesItsOwn
from torch import nn

from pyrouq import Gaussian, MCMCResult, bayesian, mcmc, predict


def _regression(n=20, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g, dtype=dtype)
    y = (
        x @ torch.tensor([1.0, -1.0], dtype=dtype)
        + 0.5
        + 0.3 * torch.randn(n, generator=g, dtype=dtype)
    )
    return x, y


def test_draws_match_the_closed_form_posterior_and_energies_the_log_density():
    # Bayesian linear regression, known noise 0.3, Normal(0, 1) priors: a Gaussian posterior
    x, y = _regression()
    model = bayesian(nn.Linear(2, 1).double(), likelihood=Gaussian(0.3))
    result = mcmc(model, x, y, 300, 150, 1, seed=0, progress=False)
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    cov = torch.linalg.inv(design.T @ design / 0.09 + torch.eye(3, dtype=x.dtype))
    mean, sd = cov @ design.T @ y / 0.09, cov.diagonal().sqrt()
    draws = result.draws()
    theta = torch.cat([draws["weight"].reshape(-1, 2), draws["bias"].reshape(-1, 1)], 1)
    assert ((theta.mean(0) - mean).abs() < 0.5 * sd).all()
    assert ((theta.std(0) / sd - 1).abs() < 0.35).all()
    # energy = potential (minus the log joint) at the start of the trajectory, the draw
    # before, plus a kinetic energy >= 0 whose mean is d / 2 = 1.5
    normal = torch.distributions.Normal
    potential = -(
        normal(0.0, 1.0).log_prob(theta).sum(1)
        + normal(theta[:, :2] @ x.T + theta[:, 2:], 0.3).log_prob(y).sum(1)
    )
    kinetic = result.sample_stats["energy"][0, 1:] - potential[:-1]
    assert kinetic.min() >= 0 and 0.8 < kinetic.mean() < 2.5


@pytest.mark.parametrize(
    "prior, name",
    [
        (dist.Bernoulli(0.5), "Bernoulli"),
        (dist.Poisson(1.0), "Poisson"),
        (dist.Categorical(torch.ones(3) / 3), "Categorical"),
    ],
)
def test_a_discrete_prior_is_refused_naming_its_site(prior, name):
    # before: Pyro's advice on enumeration and autoguides, or a dtype error from the matmul
    x, y = _regression(dtype=torch.float32)
    model = bayesian(nn.Linear(2, 1), prior=prior, likelihood=Gaussian(0.3))
    with pytest.raises(ValueError, match=rf"site 'weight' \({name}\) is discrete .*continuous"):
        mcmc(model, x, y, 3, 3, 1, seed=0, progress=False)


def test_draws_of_unequal_counts_are_pointed_to_draws_that_fit():
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    samples = {"weight": torch.randn(2, 3, 1, 2), "bias": torch.randn(2, 3, 1)}
    stats = {"diverging": torch.zeros(2, 3, dtype=torch.bool)}
    result = MCMCResult(samples, stats, "nuts", 0)
    x = torch.randn(4, 2)
    uneven = {"weight": result.draws()["weight"], "bias": result.draws()["bias"][:5]}
    with pytest.raises(ValueError, match="same number S") as info:
        predict(model, x, posterior_samples=uneven, progress=False)
    assert ".draws()" in str(info.value) and ".samples)" not in str(info.value)
    # the advice works, where .samples (chain, draw, ...) is refused
    preds = predict(model, x, posterior_samples=result.draws(), progress=False)
    assert preds.loc.shape == (6, 4, 1)
    expected = result.draws()["weight"][:, 0] @ x.T + result.draws()["bias"]
    torch.testing.assert_close(preds.loc[..., 0], expected)
    with pytest.raises(ValueError, match="chain, draw"):
        predict(model, x, posterior_samples=result.samples, progress=False)


@pytest.mark.parametrize("shape", [(15,), (15, 3)])
def test_inputs_the_network_does_not_take_are_named_with_their_shape(shape):
    # before: torch's bare "mat1 and mat2 shapes cannot be multiplied", no x, no advice
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    model.train()
    with pytest.raises(ValueError, match=rf"failed on x \(shape {re.escape(str(shape))}.*") as info:
        mcmc(model, torch.randn(shape), torch.randn(15), 3, 3, 1, seed=0, progress=False)
    assert "mat1 and mat2" in str(info.value)
    assert (  # (N, 3): the layer, the network itself, says what to do (ee6c631)
        "Check that the network takes x"
        if len(shape) == 1
        else "(in Linear(in_features=2, out_features=1, bias=True) at 'net' of the model): the "
        "model's input, of 3 features where this layer takes 2. Pass inputs of 2 features"
    ) in str(info.value)
    assert model.training and model.num_data is None  # left as it came


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("my own check: x must be standardised"),
        RuntimeError("Expected setup() to be called before forward()"),  # 'Expected': not torch's
        NotImplementedError("no half here"),
    ],
)
def test_an_error_of_the_networks_own_passes_through_unchanged(error):
    # the wrap restated every RuntimeError as a ValueError about x's shape
    model = bayesian(RaisesItsOwn(error), likelihood=Gaussian(0.3))
    with pytest.raises(type(error), match=f"^{re.escape(str(error))}$"):
        mcmc(model, torch.randn(15, 2), torch.randn(15), 3, 3, 1, seed=0, progress=False)


def test_parallel_chains_of_a_main_program_read_from_stdin_say_to_run_it_from_a_file(
    monkeypatch,
):
    # `python - < script.py`: each chain process failed with FileNotFoundError '<stdin>', and
    # the advice (put the code under if __name__ == "__main__") did not help
    import sys

    monkeypatch.setattr(sys.modules["__main__"], "__file__", "/work/main/<stdin>", raising=False)
    x, y = _regression(dtype=torch.float32)
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    told = r"cannot run the main program again: it is no file on disk \('/work/main/<stdin>'"
    with pytest.raises(ValueError, match=told + r".*Run it from a file, or pass parallel=False"):
        mcmc(model, x, y, 3, 3, 2, seed=0, parallel=True, progress=False)
    # the default runs the chains here, one after another
    assert mcmc(model, x, y, 3, 3, 2, seed=0, progress=False).samples["weight"].shape[:2] == (2, 3)
