"""float16 Pyro guides of one's own and autoguides: their log-densities and KL terms taken in
float32 (the distributions' parameters, not only the value), checked against float64
references (torch.distributions) on the same draw, and fit() of a float16 network with
AutoNormal / AutoDiagonalNormal."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import half_site_guide as _guide
from _toy import half_site_model as _model
from pyro import poutine
from pyro.infer.autoguide import AutoDiagonalNormal, AutoMultivariateNormal, AutoNormal
from pyro.infer.autoguide.initialization import init_to_feasible
from torch import nn
from torch.distributions import constraints
from torch.nn import functional as F

from pyrouq import bayesian, fit, predict
from pyrouq.infer import KLWeightedELBO

D = torch.distributions  # the float64 references
AUTO = [AutoNormal, AutoDiagonalNormal]


def _separable(n=512):
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 20, generator=g) * 3
    y = torch.randint(0, 3, (2 * n,), generator=g)
    x = centres[y] + torch.randn(2 * n, 20, generator=g)
    return x[:n], y[:n], x[n:], y[n:]


def _net(dtype=torch.float32, width=1000):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, width), nn.ReLU(), nn.Linear(width, 3)).to(dtype)


def _q64():
    return D.Normal(pyro.param("loc").detach().double(), pyro.param("scale").detach().double())


def _p64(prior):
    zero, one = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    return {
        "normal": D.Normal(zero, one),
        "laplace": D.Laplace(zero, one),
        "studentt": D.StudentT(3 * one, zero, one),
    }[prior]


@pytest.mark.parametrize("guide_class", AUTO)
def test_float16_autoguide_step_at_a_small_scale_matches_float64(guide_class):
    """At scale 2^-7 the float16 gradient of Normal.log_prob's ``var = scale**2``,
    ``(u - loc)^2 / (2 var^2)``, passed 65,504 wherever a draw was 2.8 scales off: the step
    was refused as an N-sized overflow (at num_data 64), and log(scale) was taken in float16
    (8 nats off here). The KL is now float64's of the same draw, the gradients its own."""
    x, y, _, _ = _separable(64)
    model = _model()
    guide = guide_class(model, init_loc_fn=init_to_feasible, init_scale=2**-7)
    guide(x, y)  # (at loc 0 a float16 draw keeps its eps: near 1, its steps are 2^-10 = scale/8)
    params = dict(guide.named_parameters())
    loc = next(p for name, p in params.items() if "loc" in name)
    unconstrained = next(p for name, p in params.items() if "scale" in name)
    pyro.set_rng_seed(3)
    terms = KLWeightedELBO(1.0).terms_and_grads(model, guide, x, y)
    pyro.set_rng_seed(3)
    trace = poutine.trace(guide).get_trace(x, y)
    (site,) = [n for n in trace.nodes if n.endswith(("_unconstrained", "_latent"))]
    u = trace.nodes[site]["value"].detach().double()
    centre, scale = loc.detach().double(), F.softplus(unconstrained.detach()).double()
    expected = float((D.Normal(centre, scale).log_prob(u) - D.Normal(0.0, 1.0).log_prob(u)).sum())
    assert expected > 65_504
    assert terms.kl.dtype == torch.float32
    assert math.isclose(float(terms.kl), expected, rel_tol=1e-5)
    # the gradient of the scales (the weights the logits leave out): float64's on this draw
    wide = unconstrained.detach().double().requires_grad_()
    eps = (u - centre) / scale
    draw = centre + F.softplus(wide) * eps
    kl = D.Normal(centre, F.softplus(wide)).log_prob(draw) - D.Normal(0.0, 1.0).log_prob(draw)
    (reference,) = torch.autograd.grad(kl.sum(), wide)
    grad = unconstrained.grad
    assert grad is not None and grad.dtype == torch.float16
    assert bool(torch.isfinite(grad).all()) and bool(torch.isfinite(loc.grad).all())
    error = (grad[60:].double() - reference[60:]).norm() / reference[60:].norm()
    assert float(error) < 1e-3


@pytest.mark.parametrize("guide_class", AUTO)
def test_fit_trains_a_float16_bayesian_network_with_an_autoguide(guide_class):
    """fit() of bayesian(net.half()) with an autoguide at scale 0.01 and the exact ELBO
    stopped at its first step with the float16 overflow error (num_data 512)."""
    x, y, xt, yt = _separable()
    model = bayesian(_net(torch.float16))
    guide = guide_class(model, init_scale=0.01)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x.half(), y), batch_size=64, shuffle=True
    )
    result = fit(model, guide, loader, epochs=3, kl_weight=1.0, progress=False, seed=0)
    assert all(math.isfinite(e.loss) for e in result.history)
    assert result.history[-1].loss < result.history[0].loss
    predictions = predict(model, xt.half(), guide, num_samples=4)
    assert float((predictions.predicted == yt).float().mean()) >= 0.97


@pytest.mark.parametrize("prior", ["normal", "laplace"])
def test_float16_to_event_site_kl_is_summed_in_float32(prior):
    """A site declared with ``.to_event(1)``: torch's KL of two Independent distributions
    summed the event dim in float16 (inf), before the float32 cast. Now float64's closed
    form, and its gradients."""
    x, y, _, _ = _separable(64)
    model, guide = _model(prior, event=True), _guide(event=True)
    terms = KLWeightedELBO(1.0).terms_and_grads(model, guide, x, y)
    loc = pyro.param("loc").unconstrained()
    expected = D.kl_divergence(_q64(), _p64(prior)).sum()
    assert float(expected) > 65_504
    assert terms.kl.dtype == torch.float32
    assert math.isclose(float(terms.kl), float(expected), rel_tol=1e-5)
    wide = loc.detach().double().requires_grad_()
    kl = D.kl_divergence(D.Normal(wide, _q64().scale), _p64(prior)).sum()
    (reference,) = torch.autograd.grad(kl, wide)
    assert loc.grad is not None and bool(torch.isfinite(loc.grad).all())
    assert torch.allclose(loc.grad[60:].double(), reference[60:], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("event", [False, True], ids=["plate", "to_event"])
def test_float16_estimated_kl_of_a_student_t_prior_has_finite_gradients(event):
    """StudentT (no closed form): ``log q(w) - log p(w)`` at the draw; the guide's float16
    Normal gave inf scale gradients (its var's, as above) and log(scale) in float16."""
    x, y, _, _ = _separable(64)
    model, guide = _model("studentt", event), _guide(event)
    pyro.set_rng_seed(1)
    terms = KLWeightedELBO(1.0).terms_and_grads(model, guide, x, y)
    pyro.set_rng_seed(1)
    w = poutine.trace(guide).get_trace(x, y).nodes["w"]["value"].detach().double()
    expected = float((_q64().log_prob(w) - _p64("studentt").log_prob(w)).sum())
    assert expected > 65_504
    assert terms.kl.dtype == torch.float32
    assert math.isclose(float(terms.kl), expected, rel_tol=1e-5)
    for name in ("loc", "scale"):
        grad = pyro.param(name).unconstrained().grad
        assert grad is not None and bool(torch.isfinite(grad).all()), name


def test_float16_automultivariatenormal_log_density_is_float32():
    """A float16 AutoMultivariateNormal's log q(z): torch has no float16 triangular solve on
    the CPU (NotImplementedError); it is now float32's, float64's to 1e-5."""
    x, y, _, _ = _separable(64)
    model = bayesian(_net(torch.float16, width=4), num_data=64)
    guide = AutoMultivariateNormal(model, init_scale=0.05)
    guide(x.half(), y)
    pyro.set_rng_seed(3)
    kl = KLWeightedELBO(1.0).terms_and_grads(model, guide, x.half(), y).kl
    pyro.set_rng_seed(3)
    trace = poutine.trace(guide).get_trace(x.half(), y)
    z = trace.nodes["_AutoMultivariateNormal_latent"]["value"].detach().double()
    posterior = guide.get_posterior()  # (scale_tril: its scales times a unit lower Cholesky)
    loc, tril = posterior.loc.detach().double(), posterior.scale_tril.detach().double()
    q = D.MultivariateNormal(loc, scale_tril=tril)
    expected = float(q.log_prob(z))
    for name in model.network_sites():
        expected -= float(
            D.Normal(0.0, 1.0).log_prob(trace.nodes[name]["value"].detach().double()).sum()
        )
    assert kl.dtype == torch.float32
    assert math.isclose(float(kl), expected, rel_tol=1e-5)
    assert all(bool(torch.isfinite(p.grad).all()) for p in guide.parameters())


@pytest.mark.parametrize("guide_class", AUTO)
def test_float16_overflow_with_an_autoguide_is_still_refused_naming_n(guide_class):
    """The genuine case: N = 10^6 scales the likelihood's gradients past float16's range."""
    x, y, _, _ = _separable(128)
    model = bayesian(_net(torch.float16, width=64), num_data=10**6)
    guide = guide_class(model)
    batches = [(x[:64].half(), y[:64]), (x[64:].half(), y[64:])]
    guide(*batches[0])
    before = [p.detach().clone() for p in guide.parameters()]
    with pytest.raises(FloatingPointError, match="float16 overflowed") as info:
        fit(model, guide, batches, epochs=1, num_data=10**6, progress=False, seed=0)
    message = str(info.value)
    assert "grow with N" in message and "bfloat16" in message and "65,504" in message
    assert all(torch.equal(p, q) for p, q in zip(guide.parameters(), before, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_full_precision_site_kl_is_torchs_own(dtype):
    """float32 / float64 sites are left as they are: the KL is torch's, bit for bit."""
    x, y, _, _ = _separable(64)

    def model(x, y=None):
        pyro.sample("w", dist.Normal(torch.zeros(60, dtype=dtype), 1.0).to_event(1))

    def guide(x, y=None):
        loc = pyro.param("loc", torch.linspace(-1, 1, 60, dtype=dtype))
        scale = pyro.param("scale", torch.full((60,), 0.1, dtype=dtype), constraints.positive)
        pyro.sample("w", dist.Normal(loc, scale).to_event(1))

    kl = KLWeightedELBO(1.0).terms(model, guide, x, y).kl
    q = dist.Normal(pyro.param("loc"), pyro.param("scale")).to_event(1)
    expected = torch.distributions.kl_divergence(
        q, dist.Normal(torch.zeros(60, dtype=dtype), 1.0).to_event(1)
    )
    assert kl.dtype == dtype and torch.equal(kl, expected)


def test_float16_observed_site_log_likelihood_is_summed_in_float32():
    """A float16 likelihood of one's own, scaled by N/B by its subsampled plate: its sum,
    82k nats, was inf in float16 (the loss inf while every gradient was finite, which fit()
    reports as a non-finite loss, advising a lower lr). Now float64's of the same draw."""
    g = torch.Generator().manual_seed(0)
    x, w_true = torch.randn(64, 5, generator=g).half(), torch.randn(5, generator=g).half()
    y = x @ w_true + torch.randn(64, generator=g).half()
    n = 20_000

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(5, dtype=torch.float16), 1.0).to_event(1))
        with pyro.plate("data", n, subsample_size=x.shape[0]):
            one = torch.tensor(1.0, dtype=torch.float16)
            pyro.sample("obs", dist.Normal(x @ w, one), obs=y)

    def guide(x, y=None):
        loc = pyro.param("loc", torch.zeros(5, dtype=torch.float16))
        scale = pyro.param("scale", torch.full((5,), 0.1).half(), constraints.positive)
        pyro.sample("w", dist.Normal(loc, scale).to_event(1))

    pyro.set_rng_seed(1)
    terms = KLWeightedELBO(1.0).terms_and_grads(model, guide, x, y)
    pyro.set_rng_seed(1)
    w = poutine.trace(guide).get_trace(x, y).nodes["w"]["value"].detach().double()
    expected = -float(D.Normal(x.double() @ w, 1.0).log_prob(y.double()).sum()) * n / 64
    assert expected > 65_504
    assert terms.nll.dtype == terms.loss.dtype == torch.float32
    assert math.isclose(float(terms.nll), expected, rel_tol=1e-5)
    assert all(
        bool(torch.isfinite(pyro.param(p).unconstrained().grad).all()) for p in ("loc", "scale")
    )
