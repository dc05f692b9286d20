"""Fifth audit of the likelihoods and the decompositions: a model whose ``num_data`` was set to
0, a negative number or a bool (it is a plain attribute) is told so by name (Pyro's "Expected
scale > 0 but got 0.0", or a silent scale of 1/B for True); NaN probabilities name the inputs
that hold them; the scaled "obs" site of every Gaussian noise, members plate included, against
scipy."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.stats
import torch
from torch import nn

import pyrouq
from pyrouq.likelihoods import Categorical, Gaussian
from pyrouq.uncertainty import decompose, entropy


@pytest.mark.parametrize("value", [0, -5, True, math.nan, math.inf])
@pytest.mark.parametrize("make", ["bayesian", "batchensemble"])
def test_a_num_data_that_is_no_training_set_size_is_told_by_name(make, value):
    net = nn.Linear(3, 2)
    model = pyrouq.bayesian(net) if make == "bayesian" else pyrouq.batchensemble(net, 2)
    model.num_data = value
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    who = type(model).__name__
    with pytest.raises(ValueError, match=rf"^{who}\.num_data is {value!r}, expected the training"):
        model(x, y)


@pytest.mark.parametrize("value", [8, np.int64(8), torch.tensor(8)])
def test_a_valid_num_data_scales_the_obs_site_by_n_over_b(value):
    logits, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    lik = Categorical()
    trace = pyro.poutine.trace(lambda: lik.observe(logits, y, value, "M")).get_trace()
    want = 2.0 * float(torch.distributions.Categorical(logits=logits).log_prob(y).sum())
    assert float(trace.log_prob_sum()) == pytest.approx(want, rel=1e-6)


def test_nan_probabilities_name_the_inputs_that_hold_them():
    probs = torch.full((3, 10, 2), 0.5)
    probs[1, 3, 0] = math.nan
    probs[:, 7, 1] = math.inf
    with pytest.raises(
        ValueError,
        match=r"got 4 NaN or inf entries; check the model outputs of inputs \[3, 7\] "
        r"\(2 of 10 inputs; did the fit diverge\?\)",
    ):
        decompose(probs)
    with pytest.raises(ValueError, match=r"of inputs \[0, 1, 2, 3, 4, \.\.\.\] \(8 of 8 inputs"):
        decompose(torch.full((1, 8, 2), math.nan))
    # probabilities of another layout (entropy() takes any shape): no dim is called the inputs
    grid = torch.full((2, 3, 4, 5), 0.2)
    grid[1, 2, 3, 0] = math.nan
    with pytest.raises(ValueError, match=r"check the model outputs \(did the fit diverge\?\)"):
        entropy(grid)


@pytest.mark.parametrize(
    "noise", ["fixed", "learned", "heteroscedastic", "latent", "latent_per_output"]
)
def test_the_gaussian_obs_site_of_an_ensemble_is_the_scaled_scipy_log_density(noise):
    g = torch.Generator().manual_seed(0)
    members, batch, d, num_data = 3, 5, 2, 20
    lik = {
        "fixed": lambda: Gaussian(0.3),
        "learned": lambda: Gaussian("learned"),
        "heteroscedastic": lambda: Gaussian("heteroscedastic", min_scale=0.01),
        "latent": lambda: Gaussian(dist.HalfNormal(1.0)),
        "latent_per_output": lambda: Gaussian(dist.HalfNormal(torch.ones(d))),
    }[noise]()
    width = 2 * d if noise == "heteroscedastic" else d
    outputs = torch.randn(members, batch, width, generator=g, dtype=torch.float64)
    y = torch.randn(batch, d, generator=g, dtype=torch.float64)
    latent = None
    loc = outputs.numpy()
    if noise == "fixed":
        scale = np.full(loc.shape, 0.3)
    elif noise == "learned":
        scale = np.ones(loc.shape)  # softplus(raw) starts at 1
    elif noise == "heteroscedastic":
        loc, raw = loc[..., :d], loc[..., d:]
        scale = 0.01 + np.logaddexp(0.0, raw)  # min_scale + softplus(raw)
    else:
        shape = (members,) if noise == "latent" else (members, d)
        sigma = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
        latent = {"sigma": sigma}
        scale = np.broadcast_to(sigma.numpy().reshape(members, 1, -1), loc.shape)
    want = num_data / batch * scipy.stats.norm.logpdf(y.numpy(), loc, scale).sum()
    trace = pyro.poutine.trace(
        lambda: lik.observe(outputs, y, num_data, "M", members=members, latent=latent)
    ).get_trace()
    assert trace.nodes["obs"]["fn"].batch_shape == (members, batch)
    assert float(trace.log_prob_sum().detach()) == pytest.approx(want, rel=1e-10)
    # the fast NLL that fit() back-propagates
    fast = -float(lik.nll(outputs, y, latent).detach()) * num_data / batch
    assert fast == pytest.approx(want, rel=1e-10)


class _Delegating(nn.Module):
    """A likelihood with a pyrouq Likelihood's methods, of no subclass of it (as one reloaded
    in a notebook, whose class is then another object)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


def test_a_likelihood_of_the_interface_but_not_the_class_is_used_everywhere():
    # fit() read it as absent (a Categorical: "labels of dtype torch.float32 ... for a model
    # built with likelihood='gaussian'") while the model's forward used it
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(3, 1), likelihood=Gaussian(0.5), num_data=32)
    model.likelihood = _Delegating(model.likelihood)
    x, y = torch.randn(32, 3), torch.randn(32)
    guide = pyrouq.mean_field_guide(model)
    loader = pyrouq.ArrayLoader(x, y, 16, seed=0)
    pyrouq.fit(model, guide, loader, epochs=1, progress=False)
    preds = pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert type(preds).__name__ == "GaussianPredictions"
