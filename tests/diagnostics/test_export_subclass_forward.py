"""Fix 13: to_inference_data() runs a BayesianNetwork subclass's own forward under each draw
(as predict() and Pyro's Predictive do), against hand references: the model replayed /
conditioned on each draw with pyro.poutine, its outputs' log-softmax or Normal log-density at
the targets (and the density of its own "obs" site)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import toy_data
from pyro.infer.autoguide import AutoNormal
from torch import nn
from torch.func import functional_call

import pyrouq
from pyrouq import MCMCResult, mean_field_guide, to_inference_data
from pyrouq.models import BayesianMLP


class _Tempered(BayesianMLP):
    """A forward that draws a temperature beside the weights and divides the logits by it."""

    def forward(self, x, y=None):
        t = pyro.sample("temp", dist.LogNormal(0.0, 1.0))
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        logits = self.outputs(x, weights) / t
        pyro.deterministic("logits", logits)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


class _Shifted(pyrouq.BayesianNetwork):
    """A regression whose forward draws a shift beside the weights."""

    def forward(self, x, y=None):
        shift = pyro.sample("shift", dist.Normal(0.0, 1.0))
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        out = self.outputs(x, weights) + shift
        return self.likelihood.observe(out, y, self.num_data, "Shifted")


class _Doubled(BayesianMLP):
    """A forward that transforms its inputs (no site of its own)."""

    def forward(self, x, y=None):
        return super().forward(2 * x, y)


def _autonormal(model, x, y, site, loc):
    guide = AutoNormal(model, init_scale=0.3)
    guide(x, y)
    with torch.no_grad():
        getattr(guide.locs, site).fill_(loc)  # far from the prior's centre
    return guide


def _guide_traces(guide, x, y, num_samples, seed):
    """The export's guide draws: S traces of the guide on the first batch, in one seeded
    stream (the forward runs between them keep the random state)."""
    with torch.random.fork_rng():
        pyro.set_rng_seed(seed)
        return [pyro.poutine.trace(guide).get_trace(x, y) for _ in range(num_samples)]


def test_log_likelihood_of_a_tempered_subclass_is_its_forwards():
    """The export ran outputs() on the weights alone: the log-likelihood was the untempered
    log-softmax, and 'temp' was missing from the posterior group."""
    x, y = toy_data(13)
    model = _Tempered(in_features=3, hidden_features=8, out_features=2, num_data=13)
    guide = _autonormal(model, x, y, "temp", 1.5)  # temperatures about e^1.5
    idata = to_inference_data(model, guide, x, y, num_samples=4, batch_size=5, seed=5)
    traces = _guide_traces(guide, x[:5], y[:5], 4, seed=5)
    model.eval()
    ll, obs_ll, probs = [], [], []
    for t in traces:
        run = pyro.poutine.trace(pyro.poutine.replay(model, trace=t)).get_trace(x, y)
        logits = run.nodes["logits"]["value"]
        ll.append(torch.log_softmax(logits.double(), -1).gather(-1, y[:, None])[:, 0])
        obs_ll.append(run.nodes["obs"]["fn"].log_prob(y))
        probs.append(torch.softmax(logits, -1))
    got = torch.from_numpy(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, torch.stack(ll).detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(got.float(), torch.stack(obs_ll).detach(), rtol=0, atol=1e-5)
    want_probs = torch.stack(probs).detach()
    got_probs = torch.from_numpy(idata.posterior_predictive["probs"].values[0])
    torch.testing.assert_close(got_probs, want_probs, rtol=0, atol=1e-6)
    temps = torch.stack([t.nodes["temp"]["value"] for t in traces]).detach()
    assert list(idata.posterior.data_vars) == [*model.latent_sites(), "temp"]
    torch.testing.assert_close(torch.from_numpy(idata.posterior["temp"].values[0]), temps)
    assert (temps > 2).all()  # far from 1: the untempered log-softmax differs
    untempered = torch.log_softmax(torch.stack(probs).log() * temps[:, None, None], -1)
    assert (got - untempered.gather(-1, y.expand(4, 13)[..., None])[..., 0]).abs().max() > 0.05


def test_var_names_takes_the_site_of_the_forward():
    x, y = toy_data(13)
    model = _Tempered(in_features=3, hidden_features=8, out_features=2, num_data=13)
    guide = _autonormal(model, x, y, "temp", 1.0)
    idata = to_inference_data(model, guide, x, y, num_samples=3, var_names="temp", seed=1)
    assert list(idata.posterior.data_vars) == ["temp"]
    assert idata.posterior["temp"].shape == (1, 3)


def test_a_guide_without_the_site_of_the_forward_is_refused():
    """mean_field_guide draws the weights alone: the export ran without the temperature."""
    x, y = toy_data(13)
    model = _Tempered(in_features=3, hidden_features=8, out_features=2)
    with pytest.raises(ValueError, match=r"the model's latent site 'temp' \(\) is not in it"):
        to_inference_data(model, mean_field_guide(model), x, y, num_samples=2)


def test_a_regression_subclass_keeps_loc_and_scale_and_its_density():
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(4))
    y = x.sum(-1)
    model = _Shifted(nn.Linear(3, 1), likelihood=pyrouq.Gaussian(0.5), num_data=9)
    guide = _autonormal(model, x, y, "shift", 3.0)
    idata = to_inference_data(model, guide, x, y, num_samples=3, batch_size=4, seed=2)
    traces = _guide_traces(guide, x[:4], y[:4], 3, seed=2)
    loc = torch.stack(
        [
            functional_call(
                nn.Linear(3, 1), {k: t.nodes[k]["value"] for k in ("weight", "bias")}, (x,)
            )
            + t.nodes["shift"]["value"]
            for t in traces
        ]
    ).detach()
    model.eval()
    drawn = [{k: t.nodes[k]["value"] for k in ("weight", "bias", "shift")} for t in traces]
    obs_ll = [
        pyro.poutine.trace(pyro.poutine.condition(model, data=d))
        .get_trace(x, y)
        .nodes["obs"]["fn"]
        .log_prob(y[:, None])
        .reshape(9)
        for d in drawn
    ]
    want = torch.distributions.Normal(loc.double(), 0.5).log_prob(y[:, None].double())[..., 0]
    got = torch.from_numpy(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.float(), torch.stack(obs_ll).detach(), rtol=0, atol=1e-5)
    pp = idata.posterior_predictive
    torch.testing.assert_close(torch.from_numpy(pp["loc"].values[0]), loc, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.from_numpy(pp["scale"].values[0]), torch.full_like(loc, 0.5))
    assert "shift" in idata.posterior.data_vars


def test_mcmc_draws_of_a_subclass_transforming_its_inputs_run_its_forward():
    """The MCMCResult branch ran the network on x, not on the forward's 2 * x."""
    x, y = toy_data(13)
    model = _Doubled(in_features=3, hidden_features=4, out_features=2)
    g = torch.Generator().manual_seed(2)
    samples = {k: torch.randn(2, 3, *s, generator=g) for k, s in model.latent_sites().items()}
    result = MCMCResult(samples, {}, "nuts", 0, model=model, x=x, y=y)
    idata = to_inference_data(result, batch_size=5, seed=4)
    plain = model.plain_network()
    want = torch.stack(
        [
            torch.log_softmax(
                functional_call(plain, {k: v[c, d] for k, v in samples.items()}, (2 * x,)), -1
            )
            .double()
            .gather(-1, y[:, None])[:, 0]
            for c in range(2)
            for d in range(3)
        ]
    ).reshape(2, 3, 13)
    got = torch.from_numpy(idata.log_likelihood["obs"].values)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # a compiled wrapper of the subclass runs the same forward
    result.model = torch.compile(model)
    again = to_inference_data(result, batch_size=5, seed=4)
    assert (again.log_likelihood["obs"].values == idata.log_likelihood["obs"].values).all()
