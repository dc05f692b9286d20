"""Review of 24ba4f7 (predict() runs a BayesianNetwork subclass's own forward): a regression
subclass of two outputs or more, and a compiled subclass, against functional_call references."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import toy_data
from torch import nn
from torch.func import functional_call

import pyrouq
from pyrouq import mean_field_guide, predict
from pyrouq.models import BayesianMLP


class _Shifted(pyrouq.BayesianNetwork):
    """A forward of its own: the network's outputs plus 1 (no site of its own)."""

    def forward(self, x, y=None):
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        out = self.outputs(x, weights) + 1.0
        latent = {site: weights[site] for site in self.likelihood.latent_sites()}
        return self.likelihood.observe(out, y, self.num_data, "Shifted", latent=latent or None)


@pytest.mark.parametrize("mode", [0.5, "heteroscedastic"])
def test_a_regression_subclass_of_several_outputs_predicts(mode):
    """Its outputs (B, 2) or (B, 4) were taken for class logits and the call refused ('a
    regression model, whose 2 outputs per input predict() would take for the logits')."""
    x, _ = toy_data(9)
    width = 4 if mode == "heteroscedastic" else 2
    model = _Shifted(nn.Linear(3, width), likelihood=pyrouq.Gaussian(mode))
    g = torch.Generator().manual_seed(3)
    draws = {k: torch.randn(4, *s, generator=g) for k, s in model.latent_sites().items()}
    got = predict(model, x, posterior_samples=draws, progress=False)
    # the reference: functional_call of the Linear under each draw, plus 1, split and scaled
    # by the built-in forward's likelihood (a network without a forward of its own)
    raw = torch.stack(
        [
            functional_call(nn.Linear(3, width), {k: v[s] for k, v in draws.items()}, (x,))
            for s in range(4)
        ]
    )
    base = pyrouq.BayesianNetwork(nn.Linear(3, width), likelihood=pyrouq.Gaussian(mode))
    shifted = {**draws, "bias": draws["bias"] + 1.0}  # a Linear's outputs + 1
    want = predict(base, x, posterior_samples=shifted, progress=False)
    torch.testing.assert_close(got.loc, (raw + 1.0)[..., :2], rtol=0, atol=1e-5)
    torch.testing.assert_close(got.loc, want.loc, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.scale, want.scale, rtol=0, atol=1e-5)
    if mode == 0.5:
        torch.testing.assert_close(got.scale, torch.full_like(got.loc, 0.5))


def test_a_regression_subclass_with_a_learned_noise_predicts_from_its_guide():
    x, _ = toy_data(9)
    model = _Shifted(nn.Linear(3, 2), likelihood=pyrouq.Gaussian(dist.HalfNormal(1.0)))
    guide = mean_field_guide(model)
    base = pyrouq.BayesianNetwork(nn.Linear(3, 2), likelihood=pyrouq.Gaussian(dist.HalfNormal(1.0)))
    base.load_state_dict(model.state_dict())
    got = predict(model, x, guide, 3, seed=4, progress=False)
    want = predict(base, x, guide, 3, seed=4, progress=False)  # same draws, outputs + 1
    torch.testing.assert_close(got.loc, want.loc + 1.0, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.scale, want.scale, rtol=0, atol=0)


def test_a_compiled_subclass_runs_its_own_forward():
    """torch.compile's wrapper hid the subclass: predict() ran outputs() on x, not on 2 * x
    (max |probs - reference| 0.16)."""

    class Doubled(BayesianMLP):
        def forward(self, x, y=None):
            return super().forward(2 * x, y)

    x, _ = toy_data(13)
    model = Doubled(in_features=3, hidden_features=8, out_features=2)
    guide = mean_field_guide(model)
    want = predict(model, x, guide, 3, seed=1, progress=False).probs
    got = predict(torch.compile(model), x, guide, 3, seed=1, progress=False).probs
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    other = BayesianMLP(in_features=3, hidden_features=8, out_features=2)
    plain = predict(other, 2 * x, guide, 3, seed=1, progress=False).probs
    torch.testing.assert_close(want, plain, rtol=0, atol=1e-6)
