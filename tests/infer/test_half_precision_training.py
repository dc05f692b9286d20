"""Half and mixed precision end to end (float16, bfloat16, torch.autocast): the KL, the
default Adam and fit() against float64 / float32 references, and the defects an audit found.
Every check goes through the public API (KLWeightedELBO, mean_field_guide, fit, predict)."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import half_site_guide, half_site_model
from pyro import poutine
from pyro.infer.autoguide import AutoDiagonalNormal, AutoNormal
from torch import nn

import pyrouq
from pyrouq import batchensemble, bayesian, fit, predict
from pyrouq.infer import KLWeightedELBO, mean_field_guide

HALF = [torch.float16, torch.bfloat16]
D = torch.distributions  # the float64 references: torch's own distributions


def _net(dtype=torch.float32, width=1000):
    """20 -> width -> 3: the first layer's 20k weights hold about 82,000 nats of KL at the
    guide's initial scale, past float16's 65,504."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, width), nn.ReLU(), nn.Linear(width, 3)).to(dtype)


def _separable(n=512):
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 20, generator=g) * 3
    y = torch.randint(0, 3, (2 * n,), generator=g)
    x = centres[y] + torch.randn(2 * n, 20, generator=g)
    return x[:n], y[:n], x[n:], y[n:]


def _loader(x, y, batch_size=64):
    data = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True)


def _guide_q(guide, site):
    """The mean-field guide's q of ``site`` in float64."""
    return D.Normal(
        guide.site_loc(site).detach().double(), guide.site_scale(site).detach().double()
    )


def _finite_grads(*modules):
    grads = [p.grad for m in modules for p in m.parameters() if p.grad is not None]
    return bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)


# -- the KL of a half-precision model ----------------------------------------------------------


def _shaped_normal(name, param):
    """A prior with a (0, 1) per weight: the KL's elementwise (non-scalar) path."""
    return dist.Normal(torch.zeros_like(param), torch.ones_like(param))


@pytest.mark.parametrize("vectorize", [False, True], ids=["draw-with-kl", "kl-alone"])
@pytest.mark.parametrize("prior", [1.0, _shaped_normal], ids=["scalar", "shaped"])
@pytest.mark.parametrize("dtype", HALF)
def test_half_model_kl_is_float32_and_matches_float64(dtype, prior, vectorize):
    """A float16 network's 23k-weight KL overflowed (inf at fit()'s first step); a bfloat16
    one was rounded to 3 digits. Both are now float32, to float32 precision of the float64
    value, for a scalar prior (its KL taken with the draw, or alone) and a shaped one."""
    model = bayesian(_net(dtype), prior=prior, num_data=512)
    guide = mean_field_guide(model)
    x, y, _, _ = _separable(64)
    expected = sum(
        float(D.kl_divergence(_guide_q(guide, s), D.Normal(0.0, 1.0)).sum()) for s in guide.sites
    )
    assert expected > 65_504
    elbo = KLWeightedELBO(0.02, vectorize_particles=vectorize)
    terms = elbo.terms(model, guide, x.to(dtype), y)
    assert terms.kl.dtype == terms.loss.dtype == torch.float32
    assert math.isfinite(float(terms.loss.detach()))
    assert math.isclose(float(terms.kl), expected, rel_tol=1e-5)
    stepped = elbo.terms_and_grads(model, guide, x.to(dtype), y)
    assert stepped.kl.dtype == torch.float32
    assert math.isclose(float(stepped.kl), expected, rel_tol=1e-5)
    assert _finite_grads(guide)
    assert all(p.grad.dtype == dtype for p in guide.parameters())


@pytest.mark.parametrize("dtype", HALF)
def test_half_kl_from_a_laplace_prior_is_torchs_closed_form_in_float32(dtype):
    """A prior other than a Normal with a closed form (torch's): the float16 sum overflowed."""
    model = bayesian(_net(dtype), prior=dist.Laplace(0.0, 1.0), num_data=512)
    guide = mean_field_guide(model)
    x, y, _, _ = _separable(64)
    laplace = D.Laplace(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0).double())
    expected = sum(float(D.kl_divergence(_guide_q(guide, s), laplace).sum()) for s in guide.sites)
    assert expected > 65_504
    kl = KLWeightedELBO(0.02).terms(model, guide, x.to(dtype), y).kl
    assert kl.dtype == torch.float32
    assert math.isclose(float(kl), expected, rel_tol=1e-5)


@pytest.mark.parametrize("dtype", HALF)
def test_half_kl_from_a_student_t_prior_is_estimated_in_float32(dtype):
    """StudentT (no closed form in torch): the KL is ``log q(w) - log p(w)`` at the step's
    draw, whose float16 sum overflowed. One draw of 23k weights is within 1% of the float64
    expectation (its standard deviation is about 0.1% of it)."""
    model = bayesian(_net(dtype), prior=dist.StudentT(3.0, 0.0, 1.0), num_data=512)
    guide = mean_field_guide(model)
    x, y, _, _ = _separable(64)
    student = D.StudentT(torch.tensor(3.0, dtype=torch.float64))
    g = torch.Generator().manual_seed(2)
    expected = 0.0
    for s in guide.sites:
        q = _guide_q(guide, s)
        w = q.loc + q.scale * torch.randn((200, *q.loc.shape), generator=g, dtype=torch.float64)
        expected += float((q.log_prob(w) - student.log_prob(w)).sum()) / 200
    assert expected > 65_504
    torch.manual_seed(1)
    kl = KLWeightedELBO(0.02).terms(model, guide, x.to(dtype), y).kl
    assert kl.dtype == torch.float32 and math.isfinite(float(kl))
    assert math.isclose(float(kl), expected, rel_tol=1e-2)


def test_float16_kl_of_an_autodiagonalnormal_joint_latent_is_float32():
    """An AutoDiagonalNormal's joint latent of a float16 network: its 24k log-densities summed
    in float16 overflowed (the loss inf; Pyro's own Trace_ELBO gives NaN). The reference:
    the same draw (the seed repeated) in float64, ``log q(z) - sum log p(w)``."""
    model = bayesian(_net(torch.float16), num_data=512)
    guide = AutoDiagonalNormal(model, init_scale=0.01)
    x, y, _, _ = _separable(64)
    args = (x.half(), y)
    guide(*args)  # its parameters are made (from draws of the model) on the first call
    pyro.set_rng_seed(3)
    kl = KLWeightedELBO(1.0).terms(model, guide, *args).kl
    pyro.set_rng_seed(3)
    trace = poutine.trace(guide).get_trace(*args)
    q = guide.get_posterior().base_dist
    z = trace.nodes["_AutoDiagonalNormal_latent"]["value"].detach().double()
    expected = float(D.Normal(q.loc.detach().double(), q.scale.detach().double()).log_prob(z).sum())
    for name in model.network_sites():
        w = trace.nodes[name]["value"].detach().double()
        expected -= float(D.Normal(0.0, 1.0).log_prob(w).sum())
    assert expected > 65_504
    assert kl.dtype == torch.float32
    assert math.isclose(
        float(kl), expected, rel_tol=1e-3
    )  # (Pyro's log(scale) in float16: 27 nats)


_own_model, _own_guide = half_site_model(), half_site_guide()


def test_float16_analytic_kl_of_a_traced_site_is_summed_in_float32():
    """A traced site's KL (a Pyro model of one's own and its guide): torch's elementwise
    closed form of a float16 site, summed in float16, overflowed."""
    x, y, _, _ = _separable(64)
    elbo = KLWeightedELBO(1.0)
    terms = elbo.terms(_own_model, _own_guide, x, y)
    loc, scale = pyro.param("loc").detach().double(), pyro.param("scale").detach().double()
    expected = float(D.kl_divergence(D.Normal(loc, scale), D.Normal(0.0, 1.0)).sum())
    assert expected > 65_504
    assert terms.kl.dtype == torch.float32
    assert math.isclose(float(terms.kl), expected, rel_tol=1e-3)  # (elementwise in float16)
    elbo.terms_and_grads(_own_model, _own_guide, x, y)
    params = [pyro.param("loc").unconstrained(), pyro.param("scale").unconstrained()]
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in params)


def test_float16_kl_of_an_autonormal_guide_is_float32():
    """AutoNormal (Pyro 1.9) draws each site unconstrained and hands the model a Delta: the
    KL is estimated from that draw, ``log q(u) - log p(w)``; float16 sums overflowed."""
    x, y, _, _ = _separable(64)
    pyro.set_rng_seed(0)
    guide = AutoNormal(_own_model, init_scale=0.01)
    guide(x, y)  # its parameters are made (from draws of the model) on the first call
    pyro.set_rng_seed(3)
    kl = KLWeightedELBO(1.0).terms(_own_model, guide, x, y).kl
    pyro.set_rng_seed(3)
    trace = poutine.trace(guide).get_trace(x, y)
    u = trace.nodes["w_unconstrained"]["value"].detach().double()
    q = D.Normal(guide.locs.w.detach().double(), guide.scales.w.detach().double())
    expected = float((q.log_prob(u) - D.Normal(0.0, 1.0).log_prob(u)).sum())
    assert expected > 65_504
    assert kl.dtype == torch.float32
    assert math.isclose(float(kl), expected, rel_tol=1e-3)  # (Pyro's log(scale) in float16)


# -- fit()'s default Adam on half-precision parameters -----------------------------------------


def _linear_run(dtype, epochs, **kwargs):
    """fit() of a plain half-precision nn.Linear on four fixed batches, at a constant lr, with
    the gradients each step gave its parameters. The first five inputs are 0 (so are their
    weights' gradients); N/B = 3000 makes the other gradients reach about 16,000."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 20, generator=g) * 2
    x[:, :5] = 0
    y = torch.randint(0, 3, (64,), generator=g)
    batches = [(x[i : i + 16].to(dtype), y[i : i + 16]) for i in range(0, 64, 16)]
    torch.manual_seed(0)
    net = nn.Linear(20, 3).to(dtype)
    start = {name: p.detach().clone() for name, p in net.named_parameters()}
    grads: dict[str, list[torch.Tensor]] = {name: [] for name in start}
    for name, p in net.named_parameters():
        p.register_post_accumulate_grad_hook(
            lambda q, name=name: grads[name].append(q.grad.detach().clone())
        )
    result = fit(
        net,
        None,
        batches,
        epochs=epochs,
        lr=1e-2,
        lr_schedule="constant",
        num_data=16 * 3000,
        progress=False,
        seed=0,
        **kwargs,
    )
    return net, start, grads, result


@pytest.mark.parametrize("dtype", HALF)
def test_fit_updates_half_parameters_as_float32_adam(dtype):
    """float16: eps = 1e-8 is 0 there, so an entry of zero gradient became 0 / 0 = NaN (as in
    torch.optim.Adam() on float16) and (1 - beta2) g^2 overflowed past |g| = 8,093; bfloat16:
    beta2 v rounded back to v. Every step is now float32 Adam's on the same gradients,
    rounded once into the parameter."""
    net, start, grads, result = _linear_run(dtype, epochs=2)
    assert result.steps == 8 and all(len(g) == 8 for g in grads.values())
    assert max(float(g.abs().max()) for g in grads["weight"]) > 8_093
    assert any(bool((g[:, :5] == 0).all()) for g in grads["weight"])
    reference = {name: nn.Parameter(p.float()) for name, p in start.items()}
    adam = torch.optim.Adam(list(reference.values()), lr=1e-2, foreach=True)
    for step in range(8):
        for name, p in reference.items():
            p.grad = grads[name][step].float()
        adam.step()
        with torch.no_grad():
            for p in reference.values():
                p.copy_(p.to(dtype).float())
    for name, p in net.named_parameters():
        assert p.dtype == dtype and bool(torch.isfinite(p).all())
        assert torch.equal(p.detach().float(), reference[name].detach()), name


def test_fit_resumes_float16_adam_from_its_float32_moments(tmp_path):
    """The checkpoint keeps the moments in float32 and a resumed run loads them so: it ends
    with the parameters of the run never stopped (float16 moments would be inf here)."""
    path = tmp_path / "half.pt"
    whole, _, _, _ = _linear_run(torch.float16, epochs=2)
    _linear_run(torch.float16, epochs=1, checkpoint=path)
    saved = pyrouq.load(path, module=nn.Linear(20, 3).half())
    assert saved.optimizer_state is not None
    moments = saved.optimizer_state["state"].values()
    assert all(s["exp_avg_sq"].dtype == s["exp_avg"].dtype == torch.float32 for s in moments)
    resumed, _, _, result = _linear_run(torch.float16, epochs=2, resume_from=path)
    assert result.steps == 8
    for p, q in zip(resumed.parameters(), whole.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    "kind", ["bayesian-float16", "bayesian-bfloat16", "batchensemble-float16", "plain-float16"]
)
def test_fit_trains_half_precision_models(kind):
    """float16 Bayesian training stopped at step 1 (the KL inf), a float16 BatchEnsemble or
    plain network at step 2 (Adam's NaN); they now train like the float32 model."""
    what, dtype_name = kind.split("-")
    dtype = getattr(torch, dtype_name)
    x, y, xt, yt = _separable()
    net = _net(dtype)
    guide = None
    if what == "bayesian":
        model = bayesian(net)
        guide = mean_field_guide(model)
    elif what == "batchensemble":
        model = batchensemble(net, 4)
    else:
        model = net
    result = fit(model, guide, _loader(x, y), epochs=3, progress=False, seed=0)
    assert all(math.isfinite(e.loss) for e in result.history)
    assert result.history[-1].loss < result.history[0].loss
    predictions = predict(model, xt, guide, num_samples=4) if guide else predict(model, xt)
    assert predictions.probs.dtype == torch.float32
    assert float((predictions.predicted == yt).float().mean()) >= 0.97


@pytest.mark.parametrize("what", ["bayesian", "batchensemble", "plain"])
def test_float16_gradient_overflow_is_refused_naming_the_fix(what):
    """With N large the loss (N/B times a batch's) has gradients past float16's range: the
    step is refused naming float16 and the fix, before the optimizer writes inf / NaN into
    the parameters (which fit() reported as a NaN loss a step later, advising a lower lr; a
    plain network's step was not checked at all)."""
    x, y, _, _ = _separable(128)
    net = _net(torch.float16, width=64)
    guide = None
    if what == "bayesian":
        model = bayesian(net)
        guide = mean_field_guide(model)
    elif what == "batchensemble":
        model = batchensemble(net, 2)
    else:
        model = net
    modules = [model] + ([guide] if guide is not None else [])
    before = [p.detach().clone() for m in modules for p in m.parameters()]
    batches = [(x[:64].half(), y[:64]), (x[64:].half(), y[64:])]
    with pytest.raises(FloatingPointError, match="float16 overflowed") as info:
        fit(model, guide, batches, epochs=1, num_data=10**6, progress=False, seed=0)
    message = str(info.value)
    assert "bfloat16" in message and "lower lr does not help" in message
    assert "65,504" in message
    after = [p.detach() for m in modules for p in m.parameters()]
    assert all(bool(torch.isfinite(p).all()) for p in after)
    assert all(torch.equal(p, q) for p, q in zip(after, before, strict=True))


def test_float16_autocast_gradient_overflow_is_refused_naming_the_fix():
    x, y, _, _ = _separable(64)
    model = bayesian(_net(width=64), num_data=10**6)
    guide = mean_field_guide(model)
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(FloatingPointError, match=r"autocast to torch\.bfloat16"):
            KLWeightedELBO().terms_and_grads(model, guide, x, y)


class _Float32Logits(nn.Module):
    """Mixed-precision habit: the logits cast back to float32 at the end of forward."""

    def __init__(self):
        super().__init__()
        self.body = _net(width=64)

    def forward(self, x):
        return self.body(x).float()


def test_float16_autocast_overflow_is_refused_when_the_network_returns_float32():
    """The check read autocast off float16 outputs only: a network ending in .float() under
    a float16 autocast went on to a NaN loss blamed on the lr, its parameters already NaN."""
    x, y, _, _ = _separable(64)
    model = bayesian(_Float32Logits())
    guide = mean_field_guide(model)
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(FloatingPointError, match=r"autocast to torch\.bfloat16"):
            fit(model, guide, [(x, y)], epochs=2, num_data=10**6, progress=False, seed=0)
    assert all(bool(torch.isfinite(p).all()) for p in guide.parameters())


def test_autocast_around_fit_runs_the_current_point_estimates():
    """Under a torch.autocast the user enters around fit(), autocast caches each leaf
    parameter's cast until the context exits: a select= network's point-estimate layer ran
    with its first step's weights all run (accuracy 0.55 on MNIST where float32 gave 0.88)."""
    x, y, _, _ = _separable(64)
    model = bayesian(_net(width=16), select=["2.weight", "2.bias"], num_data=512)
    guide = mean_field_guide(model)
    elbo = KLWeightedELBO()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        elbo.terms(model, guide, x, y)
        with torch.no_grad():
            model.net[0].weight.mul_(0.0)
            model.net[0].bias.fill_(-1.0)  # every hidden unit off: the outputs are the biases
        torch.manual_seed(0)
        outputs = elbo.terms(model, guide, x, y).outputs
    assert outputs is not None
    assert torch.equal(outputs, outputs[:1].expand_as(outputs))


def test_fit_under_bfloat16_autocast_trains_a_partly_bayesian_network():
    x, y, xt, yt = _separable()
    model = bayesian(_net(width=64), select=["2.weight", "2.bias"])
    guide = mean_field_guide(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fit(model, guide, _loader(x, y), epochs=3, progress=False, seed=0)
        predictions = predict(model, xt, guide, num_samples=4)
    assert float((predictions.predicted == yt).float().mean()) >= 0.97


def test_fit_under_bfloat16_autocast_trains_a_plain_network():
    """A plain nn.Module fitted under an autocast the user enters around fit(): autocast
    caches each parameter's cast until the context exits, so every step ran the first step's
    weights (the loss stuck at its first value, 585.5, and train_acc at the initial
    network's)."""
    x, y, xt, yt = _separable()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        result = fit(net, None, _loader(x, y), epochs=3, progress=False, seed=0)
        predictions = predict(net, xt)
    assert result.history[-1].loss < result.history[0].loss / 10
    assert result.history[-1].train_acc >= 0.97
    assert float((predictions.predicted == yt).float().mean()) >= 0.97


def test_predict_in_one_autocast_block_runs_the_current_weights():
    """predict() twice in one autocast block, the weights changed in between: the second
    ran the first's cached casts (the old probabilities)."""
    _, _, xt, _ = _separable(8)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first = predict(net, xt)
        with torch.no_grad():
            net[2].weight.zero_()
            net[2].bias.zero_()
        second = predict(net, xt)
    assert not torch.allclose(first.probs, torch.full_like(first.probs, 1 / 3), atol=1e-3)
    assert torch.allclose(second.probs, torch.full_like(second.probs, 1 / 3), atol=1e-6)
