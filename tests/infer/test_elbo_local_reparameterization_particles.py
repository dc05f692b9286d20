"""Local reparameterisation's Monte Carlo KL uses every particle's draws.

The audit: with ``local_reparameterization=True`` the KL of the sites without a closed form
(a latent noise scale, a site with a LogNormal guide under a Gamma prior, a Normal guide under
a scale-mixture prior) was estimated from one fresh draw whatever ``num_particles`` was, so its
spread did not shrink with particles (a latent noise's: 0.80 at 1 particle, 1.20 at 64).
"""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pyrouq
from pyrouq.infer import KLWeightedELBO

torch.set_num_threads(1)

F64 = torch.float64
N, B = 6, 2  # the NLL is scaled N / B = 3


def _params(guide):
    return [p for _, p in sorted(guide.named_parameters())]


def _gamma_model():
    """A Linear(1, 2) whose weight and bias have a Gamma prior (LogNormal guides, drawn whole):
    at x = 0 its outputs are the bias, at x = 1 weight + bias, so they show the draws."""
    torch.manual_seed(0)
    net = nn.Linear(1, 2).double()
    with torch.no_grad():
        net.weight.abs_().add_(0.5)
        net.bias.abs_().add_(0.5)
    prior = dist.Gamma(torch.tensor(2.0, dtype=F64), torch.tensor(2.0, dtype=F64))
    model = pyrouq.bayesian(net, prior=prior, num_data=N, local_reparameterization=True)
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    assert guide.positive == ("weight", "bias")
    return model, guide


@pytest.mark.parametrize("particles, vectorize", [(1, False), (3, True)])
def test_a_gamma_sites_kl_takes_the_draws_the_nll_took_with_the_reference_gradients(
    particles, vectorize
):
    """Loss and gradients of Pyro's TraceMeanField_ELBO estimator for these draws: the mean
    over particles of ``NLL(w) + log q(w) - log p(w)``, each particle's w read back from its
    outputs (before, the KL took one fresh draw: another w)."""
    model, guide = _gamma_model()
    x = torch.tensor([[0.0], [1.0]], dtype=F64)
    y = torch.tensor([0, 1])
    elbo = KLWeightedELBO(0.7, num_particles=particles, vectorize_particles=vectorize)
    pyro.set_rng_seed(1)
    guide.zero_grad()
    terms = elbo.terms_and_grads(model, guide, x, y)
    out = terms.outputs.reshape(particles, B, 2)
    drawn = {"weight": (out[:, 1] - out[:, 0]).unsqueeze(-1), "bias": out[:, 0]}
    nll_ref = kl_ref = torch.zeros((), dtype=F64)
    for p in range(particles):
        values = {}
        for site, value in drawn.items():
            loc, scale = guide.site_loc(site), guide.site_scale(site)
            eps = (value[p].log() - loc.detach()) / scale.detach()
            values[site] = (loc + scale * eps).exp()  # the same draw, differentiable
            log_q = dist.LogNormal(loc, scale).log_prob(values[site])
            log_p = model.priors()[site].base_dist.log_prob(values[site])
            kl_ref = kl_ref + (log_q - log_p).sum()
        logits = F.linear(x, values["weight"], values["bias"])
        nll_ref = nll_ref + (N / B) * F.cross_entropy(logits, y, reduction="sum")
    nll_ref, kl_ref = nll_ref / particles, kl_ref / particles
    loss_ref = nll_ref + 0.7 * kl_ref
    torch.testing.assert_close(terms.kl, kl_ref.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(terms.nll, nll_ref.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(terms.loss, loss_ref.detach(), rtol=1e-10, atol=1e-10)
    grads_ref = torch.autograd.grad(loss_ref, _params(guide))
    for param, ref in zip(_params(guide), grads_ref, strict=True):
        torch.testing.assert_close(param.grad, ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("vectorize", [False, True])
def test_a_latent_noise_scales_kl_takes_the_draw_the_nll_took_with_the_reference_gradients(
    vectorize,
):
    """A noise scale sigma ~ HalfNormal under a LogNormal guide, with outputs 0 (x = 0, no
    bias) and targets 0: the NLL is ``3 * (2 log sigma + log 2 pi)``, which gives sigma back;
    the KL must be the weight's closed form plus ``log q(sigma) - log p(sigma)`` there."""
    torch.manual_seed(0)
    noise = pyrouq.likelihoods.Gaussian(dist.HalfNormal(torch.ones(1, dtype=F64)))
    model = pyrouq.bayesian(
        nn.Linear(1, 1, bias=False).double(),
        likelihood=noise,
        num_data=N,
        local_reparameterization=True,
    )
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    assert guide.positive == ("sigma",)
    x, y = torch.zeros(B, 1, dtype=F64), torch.zeros(B, 1, dtype=F64)
    pyro.set_rng_seed(2)
    guide.zero_grad()
    terms = KLWeightedELBO(vectorize_particles=vectorize).terms_and_grads(model, guide, x, y)
    sigma = torch.exp((terms.nll / (N / B) - B * 0.5 * math.log(2 * math.pi)) / B)
    loc, scale = guide.site_loc("sigma"), guide.site_scale("sigma")
    sigma_ref = (loc + scale * (sigma.log() - loc.detach()) / scale.detach()).exp()
    closed = torch.distributions.kl_divergence(
        dist.Normal(guide.site_loc("weight"), guide.site_scale("weight")),
        dist.Normal(torch.zeros((), dtype=F64), torch.ones((), dtype=F64)),
    ).sum()
    kl_ref = (
        closed
        + (
            dist.LogNormal(loc, scale).log_prob(sigma_ref)
            - dist.HalfNormal(torch.ones(1, dtype=F64)).log_prob(sigma_ref)
        ).sum()
    )
    nll_ref = (N / B) * (B * sigma_ref.log() + B * 0.5 * math.log(2 * math.pi)).sum()
    torch.testing.assert_close(terms.kl, kl_ref.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(terms.loss, (nll_ref + kl_ref).detach(), rtol=1e-10, atol=1e-10)
    grads_ref = torch.autograd.grad(nll_ref + kl_ref, _params(guide))
    for param, ref in zip(_params(guide), grads_ref, strict=True):
        torch.testing.assert_close(param.grad, ref, rtol=1e-8, atol=1e-10)


def _spread_models():
    torch.manual_seed(0)
    noise = pyrouq.likelihoods.Gaussian(dist.HalfNormal(torch.ones(2)))
    model = pyrouq.bayesian(
        nn.Linear(3, 2), likelihood=noise, num_data=7, local_reparameterization=True
    )
    yield "noise", model, torch.randn(7, 2)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        net[2].weight.abs_()
        net[2].bias.abs_()
    prior = {"2": dist.Gamma(2.0, 2.0)}
    model = pyrouq.bayesian(net, prior=prior, num_data=7, local_reparameterization=True)
    yield "gamma", model, torch.randint(0, 2, (7,))
    weights = dist.Categorical(torch.tensor([0.5, 0.5]))
    mixture = dist.MixtureSameFamily(weights, dist.Normal(torch.zeros(2), torch.tensor([1.0, 0.1])))
    model = pyrouq.bayesian(
        nn.Linear(3, 2), prior=mixture, num_data=7, local_reparameterization=True
    )
    yield "mixture", model, torch.randint(0, 2, (7,))


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("which", ["noise", "gamma", "mixture"])
def test_the_monte_carlo_kls_spread_shrinks_with_particles(which, vectorize):
    """64 particles: about 1/8 of one particle's spread (was about 1: one draw either way)."""
    name, model, y = next(m for m in _spread_models() if m[0] == which)
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(1))
    spread = {}
    for particles in (1, 64):
        elbo = KLWeightedELBO(num_particles=particles, vectorize_particles=vectorize)
        kls = []
        for seed in range(30):
            pyro.set_rng_seed(seed)
            kls.append(elbo.terms(model, guide, x, y).kl)
        spread[particles] = torch.stack(kls).std()
    assert spread[1] > 0.5, name  # a Monte Carlo KL: it does vary
    assert spread[64] < 0.35 * spread[1], (name, spread)


def test_a_normal_only_models_kl_is_its_closed_form_for_any_particles():
    """No Monte Carlo part: the same KL, the closed form, whatever the particles and seed."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    prior = {"0": 1.0, "2": 0.3}
    model = pyrouq.bayesian(net, prior=prior, num_data=7, local_reparameterization=True)
    guide = pyrouq.mean_field_guide(model, init_scale=0.2)
    x, y = torch.randn(7, 3), torch.randint(0, 2, (7,))
    closed = sum(
        torch.distributions.kl_divergence(
            dist.Normal(guide.site_loc(s), guide.site_scale(s)),
            dist.Normal(0.0, 1.0 if s.startswith("0.") else 0.3),
        ).sum()
        for s in guide.sites
    )
    kls = []
    for seed, (particles, vectorize) in enumerate([(1, False), (8, False), (8, True)]):
        pyro.set_rng_seed(seed)
        elbo = KLWeightedELBO(num_particles=particles, vectorize_particles=vectorize)
        kls.append(elbo.terms(model, guide, x, y).kl)
    assert kls[0].item() == kls[1].item() == kls[2].item()
    torch.testing.assert_close(kls[0], closed.detach(), rtol=1e-5, atol=1e-5)
