"""Eighth audit of the objective and the layers, against independent references: the
KL-weighted ELBO of DESIGN.md written out as a Pyro model and guide (``TraceMeanField_ELBO``
on the same draws, in float64, for every form of prior, sequential and vectorised particles,
kl_weight 0 and 1, a last partial batch, a latent noise scale), the Monte Carlo KL of
non-Normal priors against a large independent sample, local reparameterisation's outputs
against their closed-form moments and weight-space draws, a rank-1 network's members against
``F.conv2d(x * r) * s + b``, a guide's ``init_scale`` / ``init_from`` against a hand-built
guide; and the audit's fixes: an initial scale that is inf in the model's dtype, a
``max_plate_nesting`` that is not a count, a tensor given as a prior, a float64 rank-1
network's prior."""

from __future__ import annotations

import copy
import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import Flattened, LatentScale, tiny_mlp, toy_data
from pyro import poutine
from torch import nn

from pyrouq import Gaussian, KLWeightedELBO, bayesian, mean_field_guide, rank1

F64 = torch.float64
N = 50
SITES = {"0.weight": (4, 3), "0.bias": (4,), "2.weight": (2, 4), "2.bias": (2,)}


def _t(value):
    return torch.tensor(value, dtype=F64)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def _batch(size, regression=False):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(size, 3, generator=g, dtype=F64)
    if regression:
        return x, torch.randn(size, 2, generator=g, dtype=F64)
    return x, torch.randint(0, 2, (size,), generator=g)


def _mixture():
    """Bayes by Backprop's scale mixture: no closed-form KL to a Normal."""
    return dist.MixtureSameFamily(
        dist.Categorical(_t([0.3, 0.7])), dist.Normal(_t([0.0, 0.0]), _t([0.1, 2.0]))
    )


_PRIORS = {  # what bayesian() is given, and the same priors site by site for the hand model
    "float": (0.7, {s: dist.Normal(_t(0.0), _t(0.7)) for s in SITES}),
    "Distribution": (
        dist.Laplace(_t(0.2), _t(0.5)), {s: dist.Laplace(_t(0.2), _t(0.5)) for s in SITES}
    ),
    "dict by prefix": (
        {"0": dist.Laplace(_t(0.2), _t(0.5)), "2.weight": _mixture()},
        {
            "0.weight": dist.Laplace(_t(0.2), _t(0.5)),
            "0.bias": dist.Laplace(_t(0.2), _t(0.5)),
            "2.weight": _mixture(),
            "2.bias": dist.Normal(_t(0.0), _t(1.0)),  # a key-less site: Normal(0, 1)
        },
    ),
    "callable": (
        lambda name, param: 0.5 if name.endswith("bias") else dist.Cauchy(_t(0.0), _t(1.0)),
        {s: dist.Normal(_t(0.0), _t(0.5)) if s.endswith("bias")
         else dist.Cauchy(_t(0.0), _t(1.0)) for s in SITES},
    ),
}  # fmt: skip


def _flat(value, shape):
    """A draw under a vectorised particle plate, ``(P, 1, *shape)``, as ``(P, *shape)``."""
    return value.reshape(-1, *shape) if value.dim() > len(shape) else value


def _hand_model(priors, batch, noise=None):
    """DESIGN.md's model written out: every site from its prior, the network by hand, the
    observations scaled N/B with B the batch's own size."""

    def model(x, y):
        w = {s: pyro.sample(s, priors[s].expand(shape).to_event(len(shape)))
             for s, shape in SITES.items()}  # fmt: skip
        w = {s: _flat(v, SITES[s]) for s, v in w.items()}
        h = torch.tanh(x @ w["0.weight"].mT + w["0.bias"].unsqueeze(-2))
        out = h @ w["2.weight"].mT + w["2.bias"].unsqueeze(-2)
        if noise is not None:
            prior, shape = noise
            sigma = pyro.sample("sigma", prior.expand(shape).to_event(len(shape)))
            sigma = sigma.reshape(-1, 1, *(shape or (1,))) if sigma.dim() > len(shape) else sigma
        with pyro.plate("data", batch, dim=-1), poutine.scale(scale=N / batch):
            if noise is None:
                pyro.sample("obs", dist.Categorical(logits=out), obs=y)
            else:
                pyro.sample("obs", dist.Normal(out, sigma).to_event(1), obs=y)

    return model


def _hand_guide(guide):
    """The mean-field guide written out: Normal(loc, softplus(rho)) per site, LogNormal for a
    site on (0, inf), in the guide's site order."""

    def run(x, y):
        for s in guide.sites:
            family = dist.LogNormal if s in guide.positive else dist.Normal
            loc = guide.site_loc(s)
            pyro.sample(s, family(loc, guide.site_scale(s)).to_event(loc.dim()))

    return run


def _against_pyro(model, guide, batch, by_hand, kl_weight, particles, vectorize, noise=None):
    """Our loss, its gradients (differentiable_loss and terms_and_grads, what fit() calls) and
    Pyro's TraceMeanField_ELBO of the hand-written model and guide, from one seed."""
    x, y = batch
    params = list(guide.parameters())
    elbo = KLWeightedELBO(kl_weight, particles, vectorize, max_plate_nesting=1)
    pyro.set_rng_seed(3)
    ours = elbo.differentiable_loss(model, guide, x, y)
    ours_grads = torch.autograd.grad(ours, params)
    pyro.set_rng_seed(3)
    terms = elbo.terms_and_grads(model, guide, x, y)
    reference = pyro.infer.TraceMeanField_ELBO(particles, vectorize_particles=vectorize,
                                               max_plate_nesting=1)  # fmt: skip
    pyro.set_rng_seed(3)
    hand = _hand_model(by_hand, len(x), noise)
    theirs = reference.differentiable_loss(
        LatentScale(kl_weight)(hand), LatentScale(kl_weight)(_hand_guide(guide)), x, y
    )
    theirs_grads = torch.autograd.grad(theirs, params)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(terms.loss, theirs.detach(), rtol=1e-12, atol=1e-10)
    for mine, ref, param in zip(ours_grads, theirs_grads, params, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(param.grad, ref, rtol=1e-10, atol=1e-10)
    return terms


_PARTICLES = [(1, False), (3, False), (3, True)]


@pytest.mark.parametrize("prior", list(_PRIORS))
@pytest.mark.parametrize(("particles", "vectorize"), _PARTICLES)
@pytest.mark.parametrize("kl_weight", [0.0, 1.0])
@pytest.mark.parametrize("size", [7, 3])  # 3: a last partial batch, scaled N/3
def test_the_loss_is_pyros_mean_field_elbo_in_float64_for_every_form_of_prior(
    prior, particles, vectorize, kl_weight, size
):
    given, by_hand = _PRIORS[prior]
    model = bayesian(_net(), prior=given, num_data=N)
    guide = mean_field_guide(model, init_scale=0.3)
    terms = _against_pyro(model, guide, _batch(size), by_hand, kl_weight, particles, vectorize)
    if kl_weight == 0:
        assert terms.loss == terms.nll and terms.kl > 0  # the KL is reported, not counted


@pytest.mark.parametrize(
    "noise",
    [
        (dist.HalfNormal(_t(1.0)), ()),  # Monte Carlo KL of a LogNormal guide
        (dist.LogNormal(_t([0.0, -1.0]), _t([1.0, 0.5])), (2,)),  # closed form, per output
        (dist.Gamma(_t(2.0), _t(3.0)), ()),
    ],
    ids=["HalfNormal", "LogNormal per output", "Gamma"],
)
@pytest.mark.parametrize(("particles", "vectorize"), _PARTICLES)
def test_a_latent_noise_scale_is_pyros_elbo_with_its_lognormal_guide(noise, particles, vectorize):
    model = bayesian(_net(), likelihood=Gaussian(noise[0]), num_data=N)
    guide = mean_field_guide(model, init_scale=0.3)
    assert guide.positive == ("sigma",)
    by_hand = {s: dist.Normal(_t(0.0), _t(1.0)) for s in SITES}
    _against_pyro(model, guide, _batch(5, True), by_hand, 0.3, particles, vectorize, noise)


@pytest.mark.parametrize("vectorize", [False, True])
def test_the_monte_carlo_kl_of_non_normal_priors_is_unbiased(vectorize):
    """The ELBO's KL of Laplace / Cauchy / mixture / StudentT priors, averaged over many
    particles, against 200,000 independent draws of log q(w) - log p(w)."""
    priors = {
        "0.weight": dist.Laplace(_t(0.2), _t(0.5)),
        "0.bias": dist.Cauchy(_t(0.0), _t(1.0)),
        "2.weight": _mixture(),
        "2.bias": dist.StudentT(_t(3.0), _t(0.0), _t(1.0)),
    }
    model = bayesian(_net(), prior=priors, num_data=N)
    guide = mean_field_guide(model, init_scale=0.3)
    gen = torch.Generator().manual_seed(5)
    reference = 0.0
    for site in guide.sites:
        loc, scale = guide.site_loc(site).detach(), guide.site_scale(site).detach()
        w = loc + scale * torch.randn(200_000, *loc.shape, generator=gen, dtype=F64)
        log_ratio = dist.Normal(loc, scale).log_prob(w) - priors[site].log_prob(w)
        reference += float(log_ratio.flatten(1).sum(1).mean())
    elbo = KLWeightedELBO(num_particles=2000, vectorize_particles=vectorize)
    pyro.set_rng_seed(0)
    with torch.no_grad():
        kl = float(elbo.terms(model, guide, *_batch(4)).kl)
    # one particle's estimate has a standard deviation of about 2.7 nats: 0.06 for 2000
    assert kl == pytest.approx(reference, abs=0.25)
    assert reference == pytest.approx(21.43, abs=0.05)


_LOCAL_LAYERS = [
    (lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), groups=2,
                       padding_mode="reflect"), (3, 4, 6, 5)),
    (lambda: nn.Conv1d(2, 4, 3, padding=2, dilation=2, padding_mode="circular"), (3, 2, 7)),
    (lambda: nn.Conv3d(2, 2, 2, stride=2, bias=False), (2, 2, 4, 4, 4)),
]  # fmt: skip


@pytest.mark.parametrize(("make", "shape"), _LOCAL_LAYERS)
def test_local_reparameterisation_draws_the_outputs_weight_sampling_gives(make, shape):
    """A one-layer network trained by local reparameterisation: its outputs (every vectorised
    particle's, as ELBOTerms.outputs holds them) have the mean layer(x; loc) and variance
    layer(x^2; scale^2) + bias_scale^2, computed here with torch's own convolution on the
    layer's padding, and so do draws of the whole weight."""
    torch.manual_seed(0)
    layer = make().double()
    model = bayesian(Flattened(layer), likelihood="gaussian", num_data=10,
                     local_reparameterization=True)  # fmt: skip
    guide = mean_field_guide(model, init_scale=0.2)
    x = torch.randn(*shape, dtype=F64)
    y = torch.zeros_like(Flattened(layer)(x))
    draws = 4000
    pyro.set_rng_seed(0)
    with torch.no_grad():
        outputs = (
            KLWeightedELBO(num_particles=draws, vectorize_particles=True)
            .terms(model, guide, x, y)
            .outputs
        )
    assert outputs.shape == (draws, *y.shape)
    loc = {s: guide.site_loc(s).detach() for s in guide.sites}
    scale = {s: guide.site_scale(s).detach() for s in guide.sites}
    has_bias = "layer.bias" in loc

    def conv(h, weight, bias):
        if layer.padding_mode != "zeros":
            h = F.pad(h, layer._reversed_padding_repeated_twice, mode=layer.padding_mode)
            padding = 0
        else:
            padding = layer.padding
        ops = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}
        out = ops[h.dim()](h, weight, bias, layer.stride, padding, layer.dilation, layer.groups)
        return out.flatten(1)

    mean = conv(x, loc["layer.weight"], loc.get("layer.bias"))
    var = conv(x * x, scale["layer.weight"] ** 2, scale["layer.bias"] ** 2 if has_bias else None)
    sd = var.sqrt()
    assert float(((outputs.mean(0) - mean) / sd).abs().max()) < 0.08  # SE: 1/sqrt(4000)
    assert float((outputs.var(0) / var - 1).abs().max()) < 0.12  # SE: sqrt(2/4000)
    gen = torch.Generator().manual_seed(1)
    whole = torch.stack([  # weight-space draws: one weight (and bias) for the whole batch
        conv(x, loc["layer.weight"] + scale["layer.weight"] * torch.randn(
            loc["layer.weight"].shape, generator=gen, dtype=F64),
            loc["layer.bias"] + scale["layer.bias"] * torch.randn(
            loc["layer.bias"].shape, generator=gen, dtype=F64) if has_bias else None)
        for _ in range(draws)
    ])  # fmt: skip
    assert float(((whole.mean(0) - mean) / sd).abs().max()) < 0.08
    assert float((whole.var(0) / var - 1).abs().max()) < 0.12


def test_a_rank1_networks_members_are_the_convolution_of_their_drawn_factors():
    """Member m under draw k: conv(x * r_km, W) * s_km + b_m, then the head likewise; and the
    objective is the members' summed NLL (N/B) plus kl_weight times the KL of every factor
    to Normal(1, 0.1)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2), nn.ReLU(),
                        nn.Flatten(), nn.Linear(36, 3)).double()  # fmt: skip
    members, num = 3, 2
    model = rank1(net, members, num_data=20)
    conv, head = model.net[0], model.net[3]
    weights = {k: v.detach() + 0.3 * torch.randn(num, *v.shape, dtype=F64)
               for k, v in model.template().items()}  # fmt: skip
    x = torch.randn(4, 2, 5, 5, dtype=F64)
    with torch.no_grad():
        out = model.outputs(x, weights)
    assert out.shape == (num, members, 4, 3)
    for k in range(num):
        for m in range(members):
            r, s = weights["0.r"][k, m], weights["0.s"][k, m]
            h = F.conv2d(x * r[:, None, None], conv.weight, None, 2, 1, 1, 2)
            h = (h * s[:, None, None] + conv.bias[m][:, None, None]).relu().flatten(1)
            expected = F.linear(h * weights["3.r"][k, m], head.weight) * weights["3.s"][k, m]
            torch.testing.assert_close(out[k, m], expected + head.bias[m], rtol=0, atol=1e-12)
    guide = mean_field_guide(model, init_scale=0.2)
    y = torch.randint(0, 3, (4,))
    pyro.set_rng_seed(0)
    terms = KLWeightedELBO(0.5).terms(model, guide, x, y)
    pyro.set_rng_seed(0)
    logits = model.outputs(x, guide.sample())
    nll = -(20 / 4) * dist.Categorical(logits=logits).log_prob(y).sum()
    kl = sum(
        torch.distributions.kl_divergence(
            dist.Normal(guide.site_loc(s), guide.site_scale(s)), dist.Normal(_t(1.0), _t(0.1))
        ).sum()
        for s in guide.sites
    )
    torch.testing.assert_close(terms.nll, nll.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(terms.kl, kl.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(terms.loss, (nll + 0.5 * kl).detach(), rtol=1e-12, atol=0)


def test_a_float64_rank1_networks_prior_is_normal_1_0p1_itself():
    """rank1() built its Normal(1, prior_scale) prior in float32 and cast it to a float64
    network's dtype: a scale of 0.10000000149..., its KL 5e-5 nats off on 1,100 factors."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    wide = rank1(copy.deepcopy(net).double(), 3, prior_scale=0.1)
    assert {p.scale.item() for p in wide.site_priors} == {0.1}
    assert {p.loc.item() for p in wide.site_priors} == {1.0}
    narrow = rank1(net, 3, prior_scale=0.1)  # float32: the same prior as before
    assert all(torch.equal(p.scale, torch.tensor(0.1)) for p in narrow.site_priors)
    assert all(p.scale.dtype == torch.float32 for p in narrow.site_priors)


def test_a_guide_from_init_from_and_init_scale_is_the_hand_built_guide():
    """mean_field_guide(model, init_scale=s, init_from=trained): the trained parameters as
    locations and s as every scale; its loss is Pyro's with Normal(trained, s) written out."""
    trained = _net()
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(3.0).add_(0.1)
    model = bayesian(_net(), prior=0.7, num_data=N)
    guide = mean_field_guide(model, init_scale=0.05, init_from=trained)
    for name, param in trained.named_parameters():
        assert torch.equal(guide.site_loc(name), param)
        torch.testing.assert_close(guide.site_scale(name), torch.full_like(param, 0.05),
                                   rtol=1e-15, atol=0)  # fmt: skip

    def hand_guide(x, y):
        for name, param in trained.named_parameters():
            q = dist.Normal(param.detach(), torch.full_like(param, 0.05))
            pyro.sample(name, q.to_event(param.dim()))

    x, y = _batch(6)
    pyro.set_rng_seed(2)
    ours = KLWeightedELBO(0.4).loss(model, guide, x, y)
    pyro.set_rng_seed(2)
    by_hand = _hand_model(_PRIORS["float"][1], 6)
    theirs = pyro.infer.TraceMeanField_ELBO().loss(
        LatentScale(0.4)(by_hand), LatentScale(0.4)(hand_guide), x, y
    )
    assert ours == pytest.approx(theirs, rel=1e-12)


# -- the audit's fixes ------------------------------------------------------------------------


def test_an_initial_scale_that_is_inf_in_the_models_dtype_is_refused():
    """init_scale=1e39 built a float32 guide of scale inf (its KL inf, the first step NaN)."""
    model = bayesian(nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"the initial scale of site 'weight' \(1e\+39\) is inf "
                       r"in torch.float32, so its KL would be infinite\. Pass a smaller "
                       r"init_scale: torch.float32 holds at most 3.40282e\+38"):  # fmt: skip
        mean_field_guide(model, init_scale=1e39)
    huge = nn.Linear(3, 2)
    with torch.no_grad():
        huge.weight.fill_(1e38)
    with pytest.raises(ValueError, match=r"is inf in torch.float32.*Pass a smaller "
                       r"init_scale_relative"):  # fmt: skip
        mean_field_guide(model, init_from=huge, init_scale_relative=10.0)
    guide = mean_field_guide(model.double(), init_scale=1e39)  # float64 holds it
    assert guide.site_scale("weight").min().item() == pytest.approx(1e39)


@pytest.mark.parametrize("bad", ["2", -1, 1.5, torch.tensor(2), True])
def test_a_max_plate_nesting_that_is_not_a_count_is_refused(bad):
    """Pyro failed deep in the first vectorised trace ("can only concatenate str (not "int")
    to str", "Expected dim < 0 to index from the right")."""
    with pytest.raises(ValueError, match=r"Expected max_plate_nesting to be an integer >= 0, "
                       r"got .*Pass the number of plates the model nests .*or None to have it "
                       r"guessed\."):  # fmt: skip
        KLWeightedELBO(num_particles=2, vectorize_particles=True, max_plate_nesting=bad)


def test_max_plate_nesting_none_is_not_given():
    """The docstring's "optional": None is guessed from a trace, as Pyro's default inf is
    (it raised "unsupported operand type(s) for +=: 'NoneType' and 'int'")."""
    model = tiny_mlp(num_data=40)
    guide = pyro.infer.autoguide.AutoNormal(model)
    x, y = toy_data(8)
    guide(x, y)  # (its parameters made: their start draws no random numbers in the loop)
    losses = []
    for nesting in (None, float("inf")):
        elbo = KLWeightedELBO(num_particles=2, vectorize_particles=True, max_plate_nesting=nesting)
        pyro.set_rng_seed(0)
        losses.append(elbo.loss(model, guide, x, y))
        assert elbo.max_plate_nesting == 2  # guessed from a trace
    assert losses[0] == losses[1] and math.isfinite(losses[0])


@pytest.mark.parametrize("how", ["float", "dict", "callable"])
def test_a_tensor_given_as_a_prior_says_to_pass_a_number(how):
    scale = torch.tensor(0.5)
    prior = {"float": scale, "dict": {"0": scale}, "callable": lambda name, p: scale}[how]
    subject = r"prior=" if how == "float" else r"The prior of '0.weight'"  # (one for all)
    with pytest.raises(TypeError, match=subject + r" must be a float \(the scale of Normal\(0, "
                       r"s\)\) or a pyro.distributions distribution.*, got Tensor "
                       r"\(a tensor: pass a Python number, float\(t\)"):  # fmt: skip
        bayesian(_net(), prior=prior)
