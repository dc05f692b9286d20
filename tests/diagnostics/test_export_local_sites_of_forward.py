"""Review of fix 13 (to_inference_data runs a subclass's own forward under each draw): a local
site the forward samples is drawn anew for every input batch, as predict() draws it; the
log-likelihood is the density of the forward's own 'obs'; its messages name
to_inference_data()."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import NoisyMLP, toy_data
from torch import nn

import pyrouq
from pyrouq import mean_field_guide, to_inference_data
from pyrouq.models import BayesianMLP


def test_a_local_site_is_drawn_anew_for_every_batch():
    """The random state was put back after every batch: within a draw, rows 0-4, 5-9 and
    10-12 had the same eps (the export depended on batch_size)."""
    x, y = toy_data(13)
    model = NoisyMLP(in_features=3, hidden_features=4, out_features=2, num_data=13)
    idata = to_inference_data(model, mean_field_guide(model), x, y, 3, batch_size=5, seed=0)
    probs = torch.from_numpy(idata.posterior_predictive["probs"].values[0, :, :, 1])  # (3, 13)
    for draw in probs:
        assert len(set(draw.tolist())) == 13, draw
    again = to_inference_data(model, mean_field_guide(model), x, y, 3, batch_size=5, seed=0)
    assert (again.posterior_predictive["probs"].values == idata.posterior_predictive["probs"]).all()


class _Wide(pyrouq.BayesianNetwork):
    """A regression built with Gaussian(0.5) whose forward observes Normal(out, 3.0)."""

    def forward(self, x, y=None):
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        out = self.outputs(x, weights)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(out, 3.0).to_event(1), obs=y)
        return out


def test_log_likelihood_is_the_density_of_the_forwards_obs():
    """The export's log-likelihood was the likelihood's Normal(out, 0.5), not the Normal(out,
    3.0) the forward observes, without a word."""
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(4))
    y = 4 * x.sum(-1)
    model = _Wide(nn.Linear(3, 1), likelihood=pyrouq.Gaussian(0.5), num_data=9)
    with pytest.warns(UserWarning, match=r"^to_inference_data\(\): _Wide's forward draws 'obs'"):
        idata = to_inference_data(model, mean_field_guide(model), x, y, 3, batch_size=4, seed=1)
    loc = torch.from_numpy(idata.posterior_predictive["loc"].values[0]).double()  # (3, 9, 1)
    want = torch.distributions.Normal(loc, 3.0).log_prob(y[:, None].double())[..., 0]
    got = torch.from_numpy(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


class _Softmaxed(BayesianMLP):
    """A forward that returns class probabilities (and draws 'obs' from them)."""

    def forward(self, x, y=None):
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        probs = self.outputs(x, weights).softmax(-1)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(probs=probs), obs=y)
        return probs


def test_the_own_forwards_refusals_name_to_inference_data():
    """The export's own-forward path refused class probabilities as 'predict(): ...'."""
    x, y = toy_data(13)
    model = _Softmaxed(in_features=3, hidden_features=4, out_features=2)
    with pytest.raises(ValueError, match=r"^to_inference_data\(\): _Softmaxed returned class pro"):
        to_inference_data(model, mean_field_guide(model), x, y, num_samples=2, seed=0)
