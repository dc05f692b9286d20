"""Audit of mcmc() and of Pyro models of one's own: draws against Pyro's NUTS and HMC on the
same seed, a closed-form posterior, arviz's diagnostics on the raw draws and predict() against
a hand loop; the refusals of an MCMC run never run, a guide or kernel given as draws, counts
out of range and a model of one's own that observes nothing; and a network recording Pyro
sites under the converted model's own names."""

from __future__ import annotations

import re

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.infer.mcmc.nuts as pyro_nuts
import pytest
import torch
from _toy import regression_data, sampled_linear, toy_data
from pyro.infer import HMC, MCMC, NUTS, Predictive
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from torch import nn
from torch.func import functional_call

import pyrouq
from pyrouq import Gaussian, bayesian, mcmc, predict

QUIET = {"progress": False}


def _closed_form_regression():
    x, y = regression_data()
    return x, y, bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))


# --------------------------------------------------------------------------------------------
# mcmc() against independent references
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["nuts", "hmc"])
def test_draws_are_pyros_own_mcmc_draws_on_the_same_seed(kernel):
    x, y, model = _closed_form_regression()
    result = mcmc(model, x, y, 6, 4, 1, kernel=kernel, seed=3, **QUIET)
    model.num_data = len(x)
    model.eval()
    pyro.set_rng_seed(3)
    sampler = NUTS(model) if kernel == "nuts" else HMC(model)
    run = MCMC(sampler, num_samples=6, warmup_steps=4, disable_progbar=True)
    run.run(x, y)
    theirs = run.get_samples()
    assert set(theirs) == set(result.samples) == {"weight", "bias"}
    for site, value in theirs.items():
        assert torch.equal(result.samples[site][0], value)


def test_a_normal_mean_is_sampled_within_three_monte_carlo_errors_of_its_posterior():
    az = pytest.importorskip("arviz")

    class Mean(nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = nn.Parameter(torch.zeros(1, dtype=torch.float64))

        def forward(self, x):
            return self.mu.expand(x.shape[0], 1)

    n, sigma = 10, 0.5
    g = torch.Generator().manual_seed(1)
    y = 1.3 + sigma * torch.randn(n, generator=g, dtype=torch.float64)
    x = torch.zeros(n, 1, dtype=torch.float64)
    model = bayesian(Mean(), select=["mu"], likelihood=Gaussian(sigma))  # prior Normal(0, 1)
    result = mcmc(model, x, y, 150, 60, 2, seed=0, parallel=False, **QUIET)
    variance = 1.0 / (1.0 + n / sigma**2)  # conjugate: precision 1 + n / sigma^2
    mean = variance * float(y.sum()) / sigma**2
    draws = result.samples["mu"][..., 0].numpy()
    assert abs(draws.mean() - mean) < 3 * float(az.mcse(draws))
    assert abs(draws.std() - variance**0.5) < 3 * float(az.mcse(draws, method="sd"))


def test_tree_depth_counts_the_doublings_of_the_leapfrog_steps_pyro_took(monkeypatch):
    leapfrogs: list[int] = []
    step, sample = pyro_nuts.velocity_verlet, pyro_nuts.NUTS.sample

    def counted_step(*args, **kwargs):
        leapfrogs[-1] += 1
        return step(*args, **kwargs)

    def counted_sample(self, params):
        leapfrogs.append(0)
        return sample(self, params)

    monkeypatch.setattr(pyro_nuts, "velocity_verlet", counted_step)
    monkeypatch.setattr(pyro_nuts.NUTS, "sample", counted_sample)
    x, y, model = _closed_form_regression()
    result = mcmc(model, x, y, 25, 10, 1, seed=4, max_tree_depth=3, **QUIET)
    depths = result.sample_stats["tree_depth"][0].tolist()
    kept = leapfrogs[10:]
    assert len(kept) == 25 and max(depths) <= 3
    # d doublings take between 2^(d-1) and 2^d - 1 leapfrog steps (Stan's convention)
    assert all(2 ** (d - 1) <= steps <= 2**d - 1 for d, steps in zip(depths, kept, strict=True))


def test_shapes_diagnostics_and_predictions_are_those_of_the_raw_draws():
    az = pytest.importorskip("arviz")
    x, y = toy_data(24)

    class Net(PyroModule):  # a PyroModule of one's own, its last layer made Bayesian
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    model = bayesian(Net(), select=["fc2"])
    result = mcmc(model, x, y, 6, 0, 3, seed=2, **QUIET)  # no warm-up: allowed
    assert {k: tuple(v.shape) for k, v in result.samples.items()} == {
        "fc2.weight": (3, 6, 2, 4),
        "fc2.bias": (3, 6, 2),
    }
    assert {tuple(v.shape) for v in result.sample_stats.values()} == {(3, 6)}
    assert tuple(result.draws()["fc2.weight"].shape) == (18, 2, 4)
    idata = pyrouq.to_inference_data(result)
    for site, value in result.samples.items():
        raw = value.reshape(3, 6, -1).numpy()
        exported = idata.posterior[site].values.reshape(3, 6, -1)
        np.testing.assert_array_equal(exported, raw)
        for j in range(raw.shape[-1]):
            assert float(az.rhat(exported[..., j])) == float(az.rhat(raw[..., j]))
            assert float(az.ess(exported[..., j])) == float(az.ess(raw[..., j]))
    new = torch.randn(5, 3)
    preds = predict(model, new, posterior_samples=result, **QUIET)
    fixed = dict(model.net.named_parameters())  # fc1: the point estimates
    draws = result.draws()
    by_hand = torch.stack(
        [
            functional_call(model.net, {**fixed, **{k: v[s] for k, v in draws.items()}}, (new,))
            for s in range(18)
        ]
    ).softmax(-1)
    torch.testing.assert_close(preds.probs, by_hand.detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(preds.mean_probs, by_hand.mean(0).detach(), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Pyro models of one's own, sampled by Pyro's NUTS, predicted by pyrouq
# --------------------------------------------------------------------------------------------


def _plated(x, y=None):
    """A model with its weights in a plate, a positive temperature and deterministic sites."""
    with pyro.plate("classes", 2):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    tau = pyro.sample("tau", dist.LogNormal(0.0, 0.5))
    logits = x @ w.T / tau
    pyro.deterministic("norm", w.norm())
    pyro.deterministic("scaled", logits)
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def test_own_models_pyro_nuts_draws_are_predicted_as_pyro_condition_runs_them():
    x, y = toy_data(20)
    new = torch.randn(6, 3)
    run = MCMC(NUTS(_plated), num_samples=8, warmup_steps=6, disable_progbar=True)
    run.run(x, y)
    draws = run.get_samples()
    by_hand = torch.stack(
        [
            pyro.condition(_plated, data={k: v[s] for k, v in draws.items()})(new).softmax(-1)
            for s in range(8)
        ]
    )
    sites = ["w", "tau", "norm", "scaled", "obs"]  # Predictive's padding and extra sites
    predictive = Predictive(_plated, posterior_samples=draws, return_sites=sites)(x)
    assert tuple(predictive["tau"].shape) == (8, 1)
    for given in (run, draws, predictive):
        preds = predict(_plated, new, posterior_samples=given, **QUIET)
        torch.testing.assert_close(preds.probs, by_hand, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Fixes
# --------------------------------------------------------------------------------------------


def test_a_pyro_mcmc_that_never_ran_is_told_to_run_first():
    # before: AttributeError: 'NoneType' object has no attribute 'items' (from Pyro)
    x, _ = toy_data(10)
    model = bayesian(nn.Linear(3, 2), num_data=10)
    run = MCMC(NUTS(model), num_samples=5, warmup_steps=5, disable_progbar=True)
    with pytest.raises(ValueError) as err:
        predict(model, x, posterior_samples=run, **QUIET)
    assert str(err.value) == (
        "posterior_samples is a pyro.infer.MCMC that has not run: it holds no draws yet. Run "
        "it first, run.run(x, y), then pass it (or pyrouq.mcmc()'s result)."
    )


def test_a_guide_or_a_kernel_given_as_posterior_samples_is_told_where_it_goes():
    # before: what was expected and what came, not what to do
    x, _ = toy_data(10)
    model = bayesian(nn.Linear(3, 2), num_data=10)
    expected = re.escape(
        "Expected posterior_samples to be an MCMCResult, a pyro.infer.MCMC run or a dict "
        "{site: (S, ...)} of tensors, got "
    )
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(TypeError, match=expected + re.escape(
        "MeanFieldGuide. A guide is passed as the guide: predict(model, x, guide)."
    )):  # fmt: skip
        predict(model, x, posterior_samples=guide, **QUIET)
    with pytest.raises(TypeError, match=expected + re.escape(
        "NUTS. A kernel is run first: pass pyrouq.mcmc(model, x, y, ...)'s result, or "
        "run = pyro.infer.MCMC(kernel, ...) after run.run(x, y)."
    )):  # fmt: skip
        predict(model, x, posterior_samples=NUTS(model), **QUIET)


def test_an_arviz_export_given_as_posterior_samples_is_told_how_its_draws_go_in():
    # before: 'got InferenceData.' (or Dataset), and nothing of what to do; the dict the
    # words give is read back as the run's draws, from an export to_netcdf would store
    x, y = toy_data(10)
    model = bayesian(nn.Linear(3, 2), num_data=10)
    result = mcmc(model, x, y, 3, 3, 2, seed=0, max_tree_depth=2, **QUIET)
    idata = pyrouq.to_inference_data(result)
    fix = (
        ". An arviz export's posterior goes in as a dict of its draws, (chain, draw) "
        "flattened: {site: v.values.reshape(-1, *v.shape[2:]) for site, v in "
        "idata.posterior.items()} (or the MCMCResult itself, where you have it)."
    )
    for given, name in ((idata, "InferenceData"), (idata.posterior, "Dataset")):
        with pytest.raises(TypeError) as err:
            predict(model, x, posterior_samples=given, **QUIET)
        assert str(err.value).endswith(f"of tensors, got {name}{fix}"), str(err.value)
    # arviz's or xarray's objects that hold no posterior draws are not told of them
    import arviz
    import xarray

    no_draws = arviz.InferenceData(observed_data=idata.observed_data)
    for given in (no_draws, xarray.Dataset({"a": ("x", np.zeros(3))})):
        with pytest.raises(TypeError) as err:
            predict(model, x, posterior_samples=given, **QUIET)
        assert str(err.value).endswith(f"of tensors, got {type(given).__name__}."), str(err.value)
    draws = {site: v.values.reshape(-1, *v.shape[2:]) for site, v in idata.posterior.items()}
    told = predict(model, x, posterior_samples=draws, **QUIET)
    assert torch.equal(told.probs, predict(model, x, posterior_samples=result, **QUIET).probs)


@pytest.mark.parametrize(
    "counts, message",
    [
        ((0, 5), "Expected num_samples to be a positive integer, got 0. It counts the draws "
         "each chain keeps: e.g. 500."),
        ((5, -1), "Expected warmup_steps to be an integer >= 0, got -1. It counts each "
         "chain's adaptation steps (0: no adaptation): e.g. 500."),
    ],
)  # fmt: skip
def test_counts_out_of_range_say_what_they_count(counts, message):
    # before: the bound and the value only
    x, y, model = _closed_form_regression()
    with pytest.raises(ValueError) as err:
        mcmc(model, x, y, *counts, 1, **QUIET)
    assert str(err.value) == message


class _ObservesNothing(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = sampled_linear(3, 2, bias_scale=1.0)

    def forward(self, x, y=None):
        pyro.deterministic("logits", self.fc(x))  # recorded, but y is never observed
        return self.fc(x)


def test_fit_refuses_a_model_of_ones_own_that_observes_nothing():
    # before: trained with nll 0, the guide pulled to the prior, without a word
    x, y = toy_data(20)
    model = _ObservesNothing()
    with pytest.raises(ValueError) as err:
        pyrouq.fit(model, AutoNormal(model), [(x, y)], epochs=1, num_data=20, **QUIET)
    assert str(err.value).startswith(
        "fit(): _ObservesNothing observes nothing: run as model(x, y) on the first batch of "
        "train_loader, it has no observed site, so the loss would hold no likelihood of the "
        "targets and training would only pull the guide to the prior. Observe them, e.g. "
        "pyro.sample('obs', dist.Categorical(logits=logits), obs=y)"
    )
    assert "Nothing was trained." in str(err.value)


class _Recording(PyroModule):
    """A network of one's own that records Pyro sites itself (``name``): ``"logits"`` as the
    model contract asks, or a whole likelihood, ``"obs"`` in plate ``"data"``."""

    def __init__(self, name=None):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)
        self.name = name

    def forward(self, x, y=None):
        logits = self.fc2(torch.tanh(self.fc1(x)))
        if self.name == "obs":
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        elif self.name is not None:
            pyro.deterministic(self.name, logits)
        return logits


@pytest.mark.parametrize("name", ["logits", "fc1.weight", "obs"])
def test_a_network_recording_sites_under_the_models_names_is_sampled_and_exported(name):
    # before: Pyro's "Multiple sample sites named 'logits'" (or 'fc1.weight', 'data')
    x, y = toy_data(20)
    torch.manual_seed(0)
    plain = bayesian(_Recording(), select=["fc1"], num_data=20)
    torch.manual_seed(0)
    recording = bayesian(_Recording(name), select=["fc1"], num_data=20)
    result = mcmc(recording, x, y, 5, 5, 1, seed=0, **QUIET)
    assert set(result.samples) == {"fc1.weight", "fc1.bias"}
    if name != "obs":  # (its own draw of "obs" takes random numbers: another chain)
        reference = mcmc(plain, x, y, 5, 5, 1, seed=0, **QUIET)
        for site, value in reference.samples.items():
            assert torch.equal(result.samples[site], value)
    idata = pyrouq.to_inference_data(result)
    assert tuple(idata.log_likelihood["obs"].shape) == (1, 5, 20)
    trace = pyro.poutine.trace(recording).get_trace(x, y)
    assert trace.nodes["obs"]["is_observed"]
    assert torch.equal(trace.nodes["obs"]["value"], y)
