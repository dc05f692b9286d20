"""Audit 10 of the objective, the layers and the engine's fast paths.

KLWeightedELBO against the DESIGN.md formula computed by hand with the same draws (and against
Pyro's TraceMeanField_ELBO at kl_weight 1), its gradients against autograd of that formula,
local reparameterisation's pre-activation moments against their closed form, the engine's CPU
paths against a plain ``torch.func.functional_call`` of the original network, BatchEnsemble
layers against ``((x * r) @ W.T) * s + b``, and the ELBO's refusals of a guide that does not
belong to the model.
"""

from __future__ import annotations

import copy

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from torch import nn
from torch.func import functional_call

from pyrouq import (
    BatchEnsembleConv2d,
    BatchEnsembleLinear,
    BatchEnsembleNetwork,
    BayesianMLP,
    KLWeightedELBO,
    batchensemble,
    bayesian,
    fit,
    mean_field_guide,
)

N = 50


def _batch(b=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, generator=g), torch.randint(0, 2, (b,), generator=g)


def _hand_loss(model, guide, x, y, kl_weight, particles, vectorized, seed):
    """DESIGN.md's loss with the draws the ELBO makes under ``seed`` (site by site in the
    guide's order, particle after particle; every particle at once per site when vectorised):
    ``-(N/B) sum log p(y | x, w)`` from a trace of the model conditioned on the draws, plus
    ``kl_weight`` times torch's closed-form KL, or ``log q - log p`` on the same draws where
    torch knows no closed form."""
    pyro.set_rng_seed(seed)
    loc = {s: guide.site_loc(s) for s in guide.sites}
    scale = {s: guide.site_scale(s) for s in guide.sites}
    if vectorized:
        eps = {s: torch.randn((particles, *loc[s].shape)) for s in loc}
        draws = [{s: loc[s] + eps[s][i] * scale[s] for s in loc} for i in range(particles)]
    else:
        draws = [
            {s: loc[s] + torch.randn(loc[s].shape) * scale[s] for s in loc}
            for _ in range(particles)
        ]
    priors = model.priors()
    kl = torch.zeros(())
    for s in loc:
        q = dist.Normal(loc[s], scale[s]).to_event(loc[s].dim())
        try:
            kl = kl + torch.distributions.kl_divergence(q, priors[s])
        except NotImplementedError:
            kl = kl + sum(q.log_prob(d[s]) - priors[s].log_prob(d[s]) for d in draws) / particles
    nll = torch.zeros(())
    for d in draws:
        trace = poutine.trace(poutine.condition(model, data=d)).get_trace(x, y)
        trace.compute_log_prob()
        nll = nll - trace.nodes["obs"]["log_prob_sum"]  # (scaled N/B by the model)
    return nll / particles + kl_weight * kl, nll / particles, kl


def _net():
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


PRIORS = {
    "mlp": None,
    "normal": 1.0,
    "laplace": dist.Laplace(0.0, 0.5),  # torch's closed form KL(Normal || Laplace)
    "studentt": dist.StudentT(3.0, 0.0, 1.0),  # Monte Carlo on the particles' draws
    "dict": {"0": 0.3, "2": dist.StudentT(4.0, 0.0, 1.0)},
}


def _model(kind):
    torch.manual_seed(1)
    if kind == "mlp":
        return BayesianMLP(in_features=3, hidden_features=5, out_features=2, num_data=N)
    return bayesian(_net(), prior=PRIORS[kind], num_data=N)


@pytest.mark.parametrize("kind", list(PRIORS))
@pytest.mark.parametrize(("particles", "vectorized"), [(1, False), (3, False), (3, True)])
def test_the_loss_is_the_design_formula_with_the_same_draws(kind, particles, vectorized):
    model = _model(kind)
    guide = mean_field_guide(model, init_scale=0.2)
    x, y = _batch()
    elbo = KLWeightedELBO(0.3, num_particles=particles, vectorize_particles=vectorized)
    pyro.set_rng_seed(7)
    terms = elbo.terms(model, guide, x, y)
    loss, nll, kl = _hand_loss(model, guide, x, y, 0.3, particles, vectorized, seed=7)
    torch.testing.assert_close(terms.nll, nll.detach(), rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(terms.kl, kl.detach(), rtol=2e-6, atol=1e-5)
    torch.testing.assert_close(terms.loss.detach(), loss.detach(), rtol=2e-6, atol=1e-5)
    assert float(kl.detach()) > 5.0 and float(nll.detach()) > 5.0  # (both terms count)


@pytest.mark.parametrize("kind", ["mlp", "normal"])
@pytest.mark.parametrize("particles", [1, 3])
def test_kl_weight_one_is_pyros_trace_mean_field_elbo(kind, particles):
    model = _model(kind)
    guide = mean_field_guide(model, init_scale=0.2)
    x, y = _batch()
    pyro.set_rng_seed(3)
    ref = pyro.infer.TraceMeanField_ELBO(num_particles=particles).differentiable_loss(
        model, guide, x, y
    )
    pyro.set_rng_seed(3)
    ours = KLWeightedELBO(1.0, num_particles=particles).differentiable_loss(model, guide, x, y)
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("kind", ["mlp", "normal"])
@pytest.mark.parametrize("particles", [1, 3])
def test_the_gradients_are_autograds_of_the_hand_formula(kind, particles):
    model = _model(kind)
    guide = mean_field_guide(model, init_scale=0.2)
    x, y = _batch()
    params = dict(guide.named_parameters())
    pyro.set_rng_seed(11)
    KLWeightedELBO(0.3, num_particles=particles).loss_and_grads(model, guide, x, y)
    ours = {k: p.grad.clone() for k, p in params.items()}
    for p in params.values():
        p.grad = None
    loss, _, _ = _hand_loss(model, guide, x, y, 0.3, particles, False, seed=11)
    loss.backward()
    for k, p in params.items():
        torch.testing.assert_close(ours[k], p.grad, rtol=1e-5, atol=1e-5, msg=k)


def test_local_reparameterisation_draws_the_closed_form_moments_and_keeps_the_kl():
    torch.manual_seed(0)
    layer = nn.Linear(3, 4)
    x, y = torch.randn(5, 3), torch.randint(0, 4, (5,))
    model = bayesian(layer, num_data=20, local_reparameterization=True)
    guide = mean_field_guide(model, init_scale=0.3)
    mu, sd = guide.means(), guide.scales()
    draws = 4000
    pyro.set_rng_seed(0)
    elbo = KLWeightedELBO(num_particles=draws, vectorize_particles=True)
    out = elbo.terms(model, guide, x, y).outputs  # (draws, B, 4) pre-activations
    mean = x @ mu["weight"].T + mu["bias"]
    var = x.square() @ sd["weight"].square().T + sd["bias"].square()
    z_mean = (out.mean(0) - mean) / (var / draws).sqrt()
    z_var = (out.var(0) - var) / (var * (2 / draws) ** 0.5)
    assert float(z_mean.abs().max()) < 4.5 and float(z_var.abs().max()) < 4.5
    plain = bayesian(layer, num_data=20)
    kl_plain = KLWeightedELBO().terms(plain, mean_field_guide(plain, init_scale=0.3), x, y).kl
    kl_local = KLWeightedELBO().terms(model, guide, x, y).kl
    expected = sum(
        torch.distributions.kl_divergence(dist.Normal(mu[s], sd[s]), dist.Normal(0.0, 1.0)).sum()
        for s in mu
    )
    torch.testing.assert_close(kl_local, kl_plain)
    torch.testing.assert_close(kl_local, expected, rtol=1e-6, atol=1e-5)


# -- the engine's CPU paths against functional_call ------------------------------------------


def _pool_net():
    # 16-128 channels: channels-last; 2x2 pools after ReLUs (swapped, strided-maxima kernel);
    # other pools channels-last (ceil_mode, padding, dilation); BatchNorm; an in-place ReLU
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 20, 3, stride=(1, 2), padding=1, bias=False),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True),
        nn.Conv2d(20, 20, 3, groups=20, padding=2, dilation=2),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.Flatten(),
        nn.LazyLinear(3),
    )
    net(torch.randn(2, 3, 11, 13))
    return net


def _inputs(b, layout, dtype):
    g = torch.Generator().manual_seed(b)
    if layout == "non-contiguous":
        return torch.randn(b, 3, 13, 26, generator=g, dtype=dtype)[:, :, 1:12, ::2]
    x = torch.randn(b, 3, 11, 13, generator=g, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last) if layout == "channels-last" else x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("train", [False, True])
def test_the_engine_runs_the_network_as_functional_call_does(dtype, train):
    torch.manual_seed(0)
    net = _pool_net().to(dtype).train(train)
    reference = copy.deepcopy(net)
    model = bayesian(net, num_data=N).train(train)
    draws = 2
    cases = [(1, "contiguous"), (7, "channels-last"), (7, "non-contiguous"), (257, "contiguous")]
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    for b, layout in cases:
        if b == 1 and train:
            continue  # (BatchNorm needs two values per channel)
        x = _inputs(b, layout, dtype)
        weights = {
            s: (0.3 * torch.randn(draws, *shape, dtype=dtype)).requires_grad_()
            for s, shape in model.latent_sites().items()
        }
        out = model.outputs(x, weights)
        grads = torch.autograd.grad(out.square().sum(), list(weights.values()))
        same = {s: w.detach().clone().requires_grad_() for s, w in weights.items()}
        ref = torch.stack(
            [functional_call(reference, {s: w[i] for s, w in same.items()}, (x,)) for i in range(2)]
        )
        ref_grads = torch.autograd.grad(ref.square().sum(), list(same.values()))
        torch.testing.assert_close(out, ref, **tol)
        top = max(float(g.abs().max()) for g in ref_grads)  # (a bias before BatchNorm: 0)
        for got, want in zip(grads, ref_grads, strict=True):
            assert float((got - want).abs().max()) <= 2e-5 * top
        for name, buffer in reference.named_buffers():  # BatchNorm's running statistics
            torch.testing.assert_close(model.net.get_buffer(name), buffer)
    with torch.no_grad():  # (eval without gradients: 600 inputs run in chunks on CPU)
        x = _inputs(600, "contiguous", dtype)
        fixed = {
            s: 0.3 * torch.randn(shape, dtype=dtype) for s, shape in model.latent_sites().items()
        }
        torch.testing.assert_close(
            model.outputs(x, fixed), functional_call(reference, fixed, (x,)), **tol
        )


# -- BatchEnsemble layers ---------------------------------------------------------------------

M = 3


def _by_member(x, r, s, b, op, nd):
    """``op(x_m * r_m) * s_m + b_m`` member by member, the batch folded member-major."""
    view = (-1, *[1] * nd)
    return torch.cat(
        [
            op(xm * r[m].reshape(view)) * s[m].reshape(view) + b[m].reshape(view)
            for m, xm in enumerate(x.chunk(M))
        ]
    )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("features", [5, 64])  # 64: weights outnumber the activations
def test_batchensemble_linear_is_the_rank1_formula_per_member(bias, features):
    torch.manual_seed(0)
    layer = BatchEnsembleLinear.from_module(nn.Linear(features, 4, bias=bias), M)
    x = torch.randn(M * 7, features)
    hand = _by_member(x, layer.r, layer.s, layer.bias, lambda h: h @ layer.weight.T, 0)
    torch.testing.assert_close(layer(x), hand, rtol=1e-5, atol=1e-5)
    if not bias:
        assert float(layer.bias.detach().abs().max()) == 0.0


@pytest.mark.parametrize(
    "settings",
    [
        {"groups": 2, "stride": 2, "padding": 1},
        {"groups": 4, "stride": (1, 2), "padding": (2, 0), "dilation": 2},
        {"padding": 2, "padding_mode": "circular", "stride": 3},
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_batchensemble_conv2d_is_the_rank1_formula_per_member(settings, bias):
    torch.manual_seed(0)
    base = nn.Conv2d(4, 8, 3, bias=bias, **settings)
    layer = BatchEnsembleConv2d.from_module(base, M)
    x = torch.randn(M * 5, 4, 9, 10)
    hand = _by_member(
        x, layer.r, layer.s, layer.bias, lambda h: base._conv_forward(h, layer.weight, None), 2
    )
    torch.testing.assert_close(layer(x), hand, rtol=1e-5, atol=1e-5)
    laid = x.contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(layer(laid), hand, rtol=1e-5, atol=1e-5)


# -- refusals ---------------------------------------------------------------------------------


def test_a_missing_guide_for_a_bayesian_model_is_named():
    model = _model("mlp")
    x, y = _batch()
    with pytest.raises(ValueError, match=r"got guide=None for BayesianMLP, whose latent sites "):
        KLWeightedELBO().loss(model, None, x, y)  # was a TypeError from Pyro's trace


def test_a_guide_for_another_network_names_the_differing_shapes():
    model = _model("mlp")
    other = mean_field_guide(BayesianMLP(in_features=3, hidden_features=6, out_features=2))
    x, y = _batch()
    message = (
        r"KLWeightedELBO: the guide does not belong to BayesianMLP, its sites differ from the "
        r"model's latent sites: site 'fc1\.weight' has "
        r"shape \(6, 3\) in the guide but \(5, 3\) in the model\. Pass the guide built"
    )
    with pytest.raises(ValueError, match=message):
        KLWeightedELBO().loss(model, other, x, y)


def _ensemble():
    torch.manual_seed(0)
    ensemble = batchensemble(_net(), M)
    ensemble.num_data = N
    return ensemble


def test_a_mean_field_guide_given_with_a_batchensemble_is_refused():
    x, y = _batch()
    guide = mean_field_guide(_model("mlp"))
    with pytest.raises(ValueError, match=r"KLWeightedELBO got a guide for a BatchEnsemble"):
        KLWeightedELBO().loss(_ensemble(), guide, x, y)  # was a loss counting its log q


def test_the_model_as_its_own_guide_is_refused():
    model = _model("normal")
    x, y = _batch()
    with pytest.raises(ValueError, match=r"was passed as its own guide"):
        KLWeightedELBO().loss(model, model, x, y)


class _OwnEnsemble(BatchEnsembleNetwork):
    def forward(self, x, y=None):  # overridden: the traced path
        return super().forward(x, y)


def test_a_batchensemble_subclass_takes_no_guide_as_the_ensemble_does():
    x, y = _batch()
    ensemble = _ensemble()
    own = copy.deepcopy(ensemble)
    own.__class__ = _OwnEnsemble
    expected = KLWeightedELBO().loss(ensemble, None, x, y)
    assert KLWeightedELBO().loss(own, None, x, y) == pytest.approx(expected, rel=1e-6)


def test_a_kl_weight_schedule_is_refused_with_the_way_to_anneal_which_works():
    # a callable kl_weight was told "Pass a number" only, by KLWeightedELBO and by fit()
    schedule = lambda step: min(1.0, step / 4)  # noqa: E731
    told = r"\(the exact ELBO\)\. A schedule \(KL annealing\) is not taken as a function: "
    with pytest.raises(TypeError, match=told + r"set elbo\.kl_weight between steps instead"):
        KLWeightedELBO(schedule)
    model = BayesianMLP(in_features=3, hidden_features=5, out_features=2, num_data=8)
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    with pytest.raises(TypeError, match=r"networks\)\. A schedule \(KL annealing\) is not taken "
                       r"as a function: fit\(\) trains under one kl_weight; train with pyro\.infer"
                       r"\.SVI\(model, guide, optim, elbo\)"):  # fmt: skip
        fit(model, guide, [(x, y)], epochs=1, kl_weight=schedule, progress=False)
    # the advice: each SVI step's loss is NLL + (the weight set before it) * KL
    elbo = KLWeightedELBO()
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), elbo)
    for step in range(6):
        elbo.kl_weight = schedule(step)
        pyro.set_rng_seed(step)
        terms = elbo.terms(model, guide, x, y)
        pyro.set_rng_seed(step)
        loss = svi.step(x, y)
        expected = float(terms.nll) + schedule(step) * float(terms.kl)
        assert loss == pytest.approx(expected, rel=1e-5)
        assert (step == 0) == (loss == pytest.approx(float(terms.nll), rel=1e-5))


def test_setting_the_kl_weight_checks_it_as_the_constructor_does():
    elbo = KLWeightedELBO(0.5)
    elbo.kl_weight = 2  # a KL annealing schedule between steps
    assert elbo.kl_weight == 2.0 and isinstance(elbo.kl_weight, float)
    with pytest.raises(ValueError, match=r"Expected kl_weight to be a finite float >= 0, got -1"):
        elbo.kl_weight = -1
    with pytest.raises(TypeError, match=r"Expected kl_weight to be a float >= 0, got '0\.1' "
                       r"\(a string: pass a float, kl_weight=0\.1\)\. Pass a number"):  # fmt: skip
        elbo.kl_weight = "0.1"
    assert elbo.kl_weight == 2.0
