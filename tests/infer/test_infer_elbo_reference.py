"""KLWeightedELBO against independent references: the KL of a half-precision network whose
prior has no closed form, against the same draws' ``log q - log p`` in float64."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import KLWeightedELBO, MeanFieldGuide, bayesian, mean_field_guide


class _TracedGuide(MeanFieldGuide):
    """A MeanFieldGuide of one's own forward: the ELBO traces it (Pyro's path)."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "prior", [dist.StudentT(3.0, 0.0, 0.5), dist.Cauchy(0.0, 0.25)], ids=["studentt", "cauchy"]
)
def test_a_half_networks_monte_carlo_kl_is_the_float64_value_of_its_draws(dtype, prior):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3000), nn.Tanh(), nn.Linear(3000, 2)).to(dtype)
    model = bayesian(net, prior=prior, num_data=50)
    guide = mean_field_guide(model, init_scale=0.25)
    x = torch.randn(10, 3, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = torch.tensor([0, 1] * 5)
    elbo = KLWeightedELBO()
    torch.manual_seed(5)
    kl = float(elbo.terms(model, guide, x, y).kl)
    torch.manual_seed(5)
    draws = guide.sample()  # the weights the loss drew (one particle, site by site)
    base = type(prior)(*(torch.as_tensor(float(getattr(prior, k))).double() for k in _args(prior)))
    reference = 0.0
    for site, w in draws.items():
        loc, scale = guide.site_loc(site).double(), guide.site_scale(site).double()
        q = dist.Normal(loc, scale).to_event(w.dim())
        p = base.expand(w.shape).to_event(w.dim())
        reference += float(q.log_prob(w.double()) - p.log_prob(w.double()))
    # (the prior read in the network's dtype, its normaliser rounded once per weight, was 7
    # to 129 nats off on these 12k weights; the traced path, Pyro's, widened it)
    assert kl == pytest.approx(reference, abs=0.05)
    traced = _TracedGuide(model, init_scale=0.25)
    traced.load_state_dict(guide.state_dict())
    torch.manual_seed(5)
    with pyro.validation_enabled(False):
        assert float(elbo.terms(model, traced, x, y).kl) == pytest.approx(kl, abs=1e-6)


def _args(prior):
    return ("df", "loc", "scale") if isinstance(prior, dist.StudentT) else ("loc", "scale")
