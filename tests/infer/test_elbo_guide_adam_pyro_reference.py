"""The KL-weighted ELBO, the mean-field guide and fit()'s Adam against Pyro's and torch's own
implementations, and the defects a sixth audit of them found."""

from __future__ import annotations

import pyro
import pytest
import torch
from _toy import LatentScale
from pyro.infer import autoguide
from torch import nn

from pyrouq import bayesian
from pyrouq.infer import KLWeightedELBO, MeanFieldGuide, mean_field_guide
from pyrouq.infer._adam import Adam
from pyrouq.models import BayesianMLP


class _TracedGuide(MeanFieldGuide):
    """A MeanFieldGuide that Pyro's ELBOs (and KLWeightedELBO) trace: forward overridden."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


def _mlp(dtype=torch.float32):
    torch.manual_seed(0)
    model = BayesianMLP(in_features=3, hidden_features=5, out_features=2, num_data=50)
    return model.to(dtype)


def _batch(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 3, generator=g, dtype=dtype), torch.randint(0, 2, (8,), generator=g)


def test_vectorised_particles_are_pyros_vectorised_mean_field_elbo_in_float64():
    model = _mlp(torch.float64)
    x, y = _batch(torch.float64)
    guide = mean_field_guide(model, init_scale=0.1)
    traced = _TracedGuide(model, init_scale=0.1)
    traced.load_state_dict(guide.state_dict())
    elbo = KLWeightedELBO(0.3, num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    pyro.set_rng_seed(1)
    ours = elbo.differentiable_loss(model, guide, x, y)
    ours_grads = torch.autograd.grad(ours, list(guide.parameters()))
    reference = pyro.infer.TraceMeanField_ELBO(
        num_particles=3, vectorize_particles=True, max_plate_nesting=1
    )
    pyro.set_rng_seed(1)  # the same draws: one (3, *shape) block per site, in site order
    theirs = reference.differentiable_loss(LatentScale(0.3)(model), LatentScale(0.3)(traced), x, y)
    theirs_grads = torch.autograd.grad(theirs, list(traced.parameters()))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    for mine, ref in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-10, atol=1e-12)


def test_an_autonormals_weighted_loss_is_pyros_trace_elbo_with_its_latent_sites_scaled():
    model = _mlp()
    x, y = _batch()
    guide = autoguide.AutoNormal(model)
    guide(x, y)
    params = [p for _, p in pyro.get_param_store().named_parameters()]
    elbo = KLWeightedELBO(0.3, num_particles=2, vectorize_particles=True, max_plate_nesting=1)
    pyro.set_rng_seed(1)
    ours = elbo.differentiable_loss(model, guide, x, y)
    ours_grads = torch.autograd.grad(ours, params)
    reference = pyro.infer.Trace_ELBO(
        num_particles=2, vectorize_particles=True, max_plate_nesting=1
    )
    pyro.set_rng_seed(1)
    theirs = reference.differentiable_loss(LatentScale(0.3)(model), LatentScale(0.3)(guide), x, y)
    theirs_grads = torch.autograd.grad(theirs, params)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-5)
    for mine, ref in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("particles", "vectorize"), [(1, False), (2, False), (2, True)])
def test_kl_weight_zero_drops_a_kl_made_infinite_by_a_scale_that_underflowed(particles, vectorize):
    # without a prior (kl_weight=0) the scales shrink; one that underflows to 0 makes the KL
    # infinite, which kl_weight=0 drops: the loss was 0 * inf = NaN, and so were the gradients
    model = _mlp()
    x, y = _batch()
    guide = mean_field_guide(model)
    with torch.no_grad():
        guide.rho["fc1__bias"].fill_(-200.0)  # softplus(-200) is 0 in float32
    assert float(guide.scales()["fc1.bias"].max()) == 0.0
    elbo = KLWeightedELBO(0.0, num_particles=particles, vectorize_particles=vectorize)
    pyro.set_rng_seed(2)
    terms = elbo.terms(model, guide, x, y)
    assert terms.kl.item() == float("inf")
    assert torch.isfinite(terms.loss) and torch.equal(terms.loss.detach(), terms.nll)
    pyro.set_rng_seed(2)
    guide.zero_grad()
    split = elbo.terms_and_grads(model, guide, x, y)  # what fit() calls
    assert torch.isfinite(split.loss) and torch.equal(split.loss, split.nll)
    torch.testing.assert_close(split.nll, terms.nll, rtol=1e-6, atol=0)
    for name, param in guide.named_parameters():
        assert param.grad is not None and bool(param.grad.isfinite().all()), name


@pytest.mark.parametrize("vectorize", [False, True])
def test_a_frozen_guide_with_several_particles_trains_the_models_own_parameters(vectorize):
    # a trained guide frozen, the BatchNorm trained on: terms_and_grads (fit's path) raised
    # "element 0 of tensors does not require grad" with more than one particle
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2))
    model = bayesian(net, num_data=50)
    guide = mean_field_guide(model, init_scale=0.1)
    guide.requires_grad_(False)
    x, y = _batch()
    elbo = KLWeightedELBO(0.5, num_particles=2, vectorize_particles=vectorize)
    own = list(model.parameters())
    pyro.set_rng_seed(4)
    whole = elbo.terms(model, guide, x, y)
    expected = torch.autograd.grad(whole.loss, own)
    pyro.set_rng_seed(4)
    split = elbo.terms_and_grads(model, guide, x, y)
    torch.testing.assert_close(split.loss, whole.loss.detach(), rtol=1e-6, atol=0)
    for param, grad in zip(own, expected, strict=True):
        torch.testing.assert_close(param.grad, grad, rtol=1e-5, atol=1e-6)
    assert all(p.grad is None for p in guide.parameters())


@pytest.mark.parametrize("particles", [1, 2])
def test_a_guide_built_for_another_network_is_refused_with_the_first_differing_site(particles):
    # the dtype check read the model's first site from the guide first: a bare KeyError
    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), num_data=50)
    other = mean_field_guide(_mlp())  # sites fc1.weight, ...: not the model's 0.weight, ...
    head = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), select="last_layer")
    last = mean_field_guide(head)  # sites 2.weight, 2.bias only
    x, y = _batch()
    for guide in (other, last):
        message = r"does not belong to BayesianNetwork.*'0\.weight'.*mean_field_guide\(model\)"
        with pytest.raises(ValueError, match=message):
            KLWeightedELBO(num_particles=particles).terms_and_grads(model, guide, x, y)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("transposed", [False, True])
def test_default_adam_updates_a_complex_parameter_as_torch_adam(dtype, transposed):
    # torch's Adam updates the real and imaginary parts (view_as_real); ours took the complex
    # g * g as the second moment: 0.1 off after one step at lr 0.1
    torch.manual_seed(0)
    start = [torch.randn(5, 3, dtype=dtype), torch.randn(4, dtype=dtype.to_real())]
    ours = [t.clone().requires_grad_() for t in start]
    theirs = [t.clone().requires_grad_() for t in start]
    mine, reference = Adam(ours, lr=0.1), torch.optim.Adam(theirs, lr=0.1, foreach=True)
    tol = 2 * torch.finfo(dtype.to_real()).eps
    for step in range(6):
        first = torch.randn(3, 5, dtype=dtype).t() if transposed else torch.randn(5, 3, dtype=dtype)
        grads = [first, torch.randn(4, dtype=dtype.to_real())]
        for p, q, g in zip(ours, theirs, grads, strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        if step == 3:  # a schedule's change between steps
            mine.param_groups[0]["lr"] = reference.param_groups[0]["lr"] = 0.03
        mine.step()
        reference.step()
        for p, q in zip(ours, theirs, strict=True):
            torch.testing.assert_close(p, q, rtol=tol, atol=tol)
    assert mine.state[ours[0]]["exp_avg_sq"].dtype == dtype  # torch's layout: loads either way
    torch.testing.assert_close(
        mine.state[ours[0]]["exp_avg_sq"],
        reference.state[theirs[0]]["exp_avg_sq"],
        rtol=tol,
        atol=0,
    )


def test_guide_sample_is_pyros_particle_plate_draw_and_refuses_a_bad_count():
    model = _mlp()
    guide = mean_field_guide(model, init_scale=0.2)
    pyro.set_rng_seed(5)
    ours = guide.sample(3)
    pyro.set_rng_seed(5)
    with pyro.plate("particles", 3, dim=-1):
        trace = pyro.poutine.trace(guide).get_trace()
    for site in guide.sites:
        assert ours[site].shape == (3, *guide.site_loc(site).shape)
        assert torch.equal(ours[site], trace.nodes[site]["value"])
    for bad in (-1, 0, 2.0, True):
        # (-1 was torch's "negative dimension", 2.0 and True its "tuple of ints")
        with pytest.raises(
            ValueError, match=rf"Expected num_samples to be an integer >= 1, got {bad}"
        ):
            guide.sample(bad)
