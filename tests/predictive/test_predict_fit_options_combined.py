"""predict()'s and fit()'s options in combinations the other reference tests leave out, each
against an independent computation: the BatchEnsemble formula ``diag(s_m) W diag(r_m)`` run by
hand, ``torch.func.functional_call`` of the draws, scipy's Gaussian and Laplace densities, the
law of total variance, and the KL-weighted ELBO of DESIGN.md written out and differentiated by
autograd (one SGD step of lr 1 moves every parameter by minus its gradient)."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.stats as st
import torch
import torch.nn.functional as F
from _toy import toy_data
from torch import nn
from torch.distributions import HalfNormal, LogNormal, Normal, kl_divergence
from torch.func import functional_call

from pyrouq import (
    MLP,
    Gaussian,
    batchensemble,
    bayesian,
    decompose,
    fit,
    mcmc,
    mean_field_guide,
    predict,
    rank1,
)
from pyrouq.likelihoods import Categorical, Likelihood
from pyrouq.regression import GaussianPredictions

F64 = torch.float64


def _zero():
    return torch.zeros((), dtype=F64)


def _sgd(params):
    return torch.optim.SGD(params, lr=1.0)


def _step_moves(model, guide, batches, **options):
    """What one fit() step of SGD with lr 1 moved every trained parameter by: its gradient."""
    named = list(model.named_parameters()) + list(guide.named_parameters())
    before = {name: p.detach().clone() for name, p in named}
    result = fit(model, guide, batches, epochs=1, optim=_sgd, lr_schedule="constant",
                 progress=False, **options)  # fmt: skip
    return result, {name: before[name] - p.detach() for name, p in named}


# --------------------------------------------------------------------------------------------
# likelihoods at extreme values, against torch.distributions / scipy in float64
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, F64])
def test_categorical_at_logits_of_80_and_1e4_is_torchs_float64_categorical(dtype):
    logits = torch.tensor([[80.0, -80.0, 0.0], [-80.0, 80.0, 80.0], [0.0, 0.0, 0.0]])
    if torch.finfo(dtype).max > 1e4:
        logits = torch.cat([logits, torch.tensor([[1e4, -1e4, 3.0]])])
    y = torch.tensor([1, 0, 2, 1])[: logits.shape[0]]
    lik = Categorical()
    nll = lik.nll(logits.to(dtype), y)
    # bfloat16 keeps 3 digits of a logit: the reference takes the logits as the dtype holds them
    held = logits.to(dtype).double()
    want = -torch.distributions.Categorical(logits=held).log_prob(y).sum()
    assert nll.dtype == (F64 if dtype == F64 else torch.float32)
    assert float(nll.detach()) == pytest.approx(float(want), rel=1e-6 if dtype != F64 else 1e-15)
    probs = lik.predictive(logits.to(dtype))
    torch.testing.assert_close(probs.double(), torch.softmax(held, -1), rtol=0, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("noise", [1e-12, 0.5, 1e12, "heteroscedastic", "learned"])
def test_gaussian_nll_and_moments_at_extreme_scales_are_scipys(noise, dtype):
    out = torch.tensor([[0.0, 1.0, -80.0, 80.0], [2.0, -3.0, 30.0, -30.0]], dtype=dtype)
    if noise != "heteroscedastic":
        out = out[:, :2]
    y = torch.tensor([[0.25, 1.125], [1.0, -3.0]], dtype=dtype)
    lik = Gaussian(noise)
    loc = out.double()[:, :2]
    if noise == "heteroscedastic":
        scale = 1e-3 + F.softplus(out.double()[:, 2:])
    else:
        scale = torch.full_like(loc, 1.0 if noise == "learned" else noise)  # learned starts at 1
    want = -st.norm(loc.numpy(), scale.numpy()).logpdf(y.double().numpy()).sum()
    nll = float(lik.nll(out, y).detach())
    assert nll == pytest.approx(want, rel=1e-15 if dtype == F64 else 1e-6)
    got_loc, got_scale = lik.predictive(out)
    assert got_loc.dtype == got_scale.dtype == dtype
    torch.testing.assert_close(got_loc.double(), loc, rtol=0, atol=0)
    torch.testing.assert_close(got_scale.double(), scale, rtol=1e-7, atol=0)


# --------------------------------------------------------------------------------------------
# predict(): ensembles with seeds and batch sizes, one draw of a regression, own likelihoods
# --------------------------------------------------------------------------------------------


def _hand_batchensemble(ens, x):
    """Member m's logits: ``(x * r_m) W^T * s_m + b_m`` layer by layer, tanh between."""
    p = dict(ens.named_parameters())
    out = []
    for m in range(ens.num_members):
        h = x
        for i, layer in enumerate(("net.0", "net.2")):
            h = (h * p[f"{layer}.r"][m]) @ p[f"{layer}.weight"].T * p[f"{layer}.s"][m]
            h = h + p[f"{layer}.bias"][m]
            h = torch.tanh(h) if i == 0 else h
        out.append(h)
    return torch.stack(out).detach()


def test_an_ensembles_members_ignore_the_seed_and_the_batch_size():
    torch.manual_seed(0)
    ens = batchensemble(nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 4)), 3).double()
    with torch.no_grad():  # factors away from their start, so members differ
        for name, p in ens.named_parameters():
            if name.endswith((".r", ".s")):
                p.add_(0.5 * torch.randn_like(p))
    x = torch.randn(11, 3, dtype=F64)
    want = torch.softmax(_hand_batchensemble(ens, x), -1)
    got = predict(ens, x, seed=1, batch_size=1024, progress=False)
    assert got.probs.shape == (3, 11, 4) and got.probs.dtype == F64
    torch.testing.assert_close(got.probs, want, rtol=0, atol=1e-12)
    assert (want[0] - want[1]).abs().max() > 1e-2  # the members differ: their order is checked
    for other in (
        predict(ens, x, seed=2, batch_size=1024, progress=False),  # the seed draws nothing
        predict(ens, x, progress=False),
    ):
        assert torch.equal(other.probs, got.probs)
    for other in (
        predict(ens, x, seed=1, batch_size=2, progress=False),
        predict(ens, [x[:0], x[:1], x[1:]], seed=1, progress=False),  # an empty batch skipped
    ):
        torch.testing.assert_close(other.probs, got.probs, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"num_samples=4 given for a BatchEnsemble: its 3 "):
        predict(ens, x, num_samples=4, progress=False)


def test_a_regression_of_one_draw_has_no_epistemic_part_and_scores_as_one_gaussian():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    model = bayesian(net, likelihood=Gaussian("learned"))
    with torch.no_grad():
        model.likelihood.prepare(torch.zeros(1, 2, dtype=F64))
        model.likelihood.raw_scale.copy_(torch.tensor([-1.0, 0.5]))
    x = torch.randn(13, 3, dtype=F64)
    y = torch.randn(13, 2, dtype=F64)
    draw = {k: torch.randn(1, *s, dtype=F64) for k, s in model.latent_sites().items()}
    got = predict(model, [(x[:6], y[:6]), (x[6:], y[6:])], posterior_samples=draw, progress=False)
    mu = functional_call(model.net, {k: v[0] for k, v in draw.items()}, (x,))
    sd = F.softplus(torch.tensor([-1.0, 0.5], dtype=F64)).expand_as(mu)
    assert isinstance(got, GaussianPredictions) and got.loc.shape == (1, 13, 2)
    torch.testing.assert_close(got.loc[0], mu.detach(), rtol=0, atol=1e-13)
    torch.testing.assert_close(got.scale[0], sd, rtol=0, atol=0)
    d = got.uncertainty()
    assert torch.equal(d.epistemic, torch.zeros(13, dtype=F64))
    torch.testing.assert_close(d.total, (sd**2).sum(-1), rtol=1e-15, atol=0)
    ev = got.evaluate()  # the targets the loader gave
    m, s, t = mu.detach().numpy(), sd.numpy(), y.numpy()
    assert ev["nll"] == pytest.approx(-st.norm(m, s).logpdf(t).sum(-1).mean(), rel=1e-12)
    z = (t - m) / s  # the CRPS of one Gaussian (Gneiting & Raftery 2007)
    crps = s * (z * (2 * st.norm.cdf(z) - 1) + 2 * st.norm.pdf(z) - 1 / math.sqrt(math.pi))
    assert ev["crps"] == pytest.approx(crps.mean(), rel=1e-10)
    for level in (0.5, 0.9, 0.95):
        lo, hi = st.norm.interval(level, m, s)
        assert ev[f"width_{round(100 * level)}"] == pytest.approx((hi - lo).mean(), rel=1e-9)
        inside = ((t >= lo) & (t <= hi)).mean()
        assert ev[f"coverage_{round(100 * level)}"] == inside


class _Tempered(Categorical):
    """A likelihood of one's own: the labels drawn from the logits divided by a temperature."""

    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature

    def distribution(self, outputs, latent=None):
        return dist.Categorical(logits=outputs / self.temperature)

    def nll(self, outputs, y, latent=None):
        return super().nll(outputs / self.temperature, y)

    def predictive(self, outputs, latent=None):
        return torch.softmax(outputs / self.temperature, -1)


def test_an_own_likelihood_predicts_mcmc_draws_through_its_predictive():
    x, y = toy_data(11)
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)),
                     likelihood=_Tempered(3.0))  # fmt: skip
    result = mcmc(model, x, y, num_samples=3, warmup_steps=3, num_chains=2, seed=0, progress=False)
    got = predict(model, x, posterior_samples=result, batch_size=4, seed=5, progress=False)
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in result.samples.items()}  # chain-major
    want = torch.stack([
        torch.softmax(functional_call(model.net, {k: v[s] for k, v in flat.items()}, (x,)) / 3, -1)
        for s in range(6)
    ])  # fmt: skip
    assert got.probs.shape == (6, 11, 2)
    torch.testing.assert_close(got.probs, want, rtol=0, atol=1e-6)
    q = want.double().numpy()
    mean = q.mean(0)
    total = -(mean * np.log(mean)).sum(-1)
    aleatoric = -(q * np.log(q)).sum(-1).mean(0)
    d = decompose(got.probs.double())
    np.testing.assert_allclose(d.total.numpy(), total, rtol=0, atol=1e-6)
    np.testing.assert_allclose(d.aleatoric.numpy(), aleatoric, rtol=0, atol=1e-6)


class _Laplace(Likelihood):
    """A regression likelihood of one's own: Laplace noise of a fixed scale b, predicted as
    Gaussians of its variance 2 b^2."""

    name = "laplace"
    target_words = ("targets", "target")

    def __init__(self, b):
        super().__init__()
        self.b = b

    def check_targets(self, y, outputs, where):
        if not torch.is_tensor(y) or y.shape != outputs.shape[-2:]:
            raise ValueError(f"{where}: expected targets of shape {tuple(outputs.shape[-2:])}")

    def target_problem(self, y, num_outputs):
        return None

    def distribution(self, outputs, latent=None):
        return dist.Laplace(outputs, self.b).to_event(1)

    def nll(self, outputs, y, latent=None):
        return -torch.distributions.Laplace(outputs, self.b).log_prob(y).sum()

    def predictive(self, outputs, latent=None):
        return outputs.clone(), torch.full_like(outputs, self.b * math.sqrt(2))

    def predictions(self, parts, targets):
        loc = torch.cat([p[0] for p in parts], 1)
        return GaussianPredictions(loc, torch.cat([p[1] for p in parts], 1), targets)


def test_an_own_regression_likelihood_trains_on_its_nll_and_predicts_its_moments():
    x = torch.randn(20, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    y = x[:, :2].clone()

    def make():
        torch.manual_seed(0)
        model = bayesian(nn.Linear(3, 2).double(), likelihood=_Laplace(0.4))
        return model, mean_field_guide(model, init_scale=0.1)

    model, guide = make()
    result, moved = _step_moves(model, guide, [(x[:8], y[:8])], num_data=20, seed=2)
    assert result.kl_weight == 1.0  # a likelihood's default_kl_weight, the base class's
    hand_model, hand_guide = make()
    loc = {s: hand_guide.site_loc(s) for s in hand_guide.sites}
    scale = {s: hand_guide.site_scale(s) for s in hand_guide.sites}
    pyro.set_rng_seed(2)
    w = {s: loc[s] + scale[s] * torch.randn(loc[s].shape, dtype=F64) for s in loc}
    out = functional_call(hand_model.net, w, (x[:8],))
    nll = -(20 / 8) * torch.distributions.Laplace(out, 0.4).log_prob(y[:8]).sum()
    kl = sum(kl_divergence(Normal(loc[s], scale[s]), Normal(_zero(), 1.0)).sum() for s in loc)
    (nll + kl).backward()
    assert result.history[0].loss == pytest.approx(float((nll + kl).detach()), rel=1e-14)
    for name, p in hand_guide.named_parameters():
        torch.testing.assert_close(moved[name], p.grad, rtol=0, atol=1e-13)
    draws = {k: torch.randn(3, *s, dtype=F64) for k, s in model.latent_sites().items()}
    got = predict(model, x, posterior_samples=draws, batch_size=7, progress=False)
    mu = torch.stack(
        [functional_call(model.net, {k: v[s] for k, v in draws.items()}, (x,)) for s in range(3)]
    ).detach()
    torch.testing.assert_close(got.loc, mu, rtol=0, atol=1e-13)
    torch.testing.assert_close(got.variance, 2 * 0.4**2 + mu.var(0, unbiased=False))


@pytest.mark.parametrize("shape", [(), (2,)], ids=["one-noise", "noise-per-output"])
def test_latent_noise_draws_split_the_variance_by_the_law_of_total_variance(shape):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    model = bayesian(net, likelihood=Gaussian(dist.HalfNormal(torch.ones(shape, dtype=F64))))
    x = torch.randn(7, 3, dtype=F64)
    g = torch.Generator().manual_seed(1)
    draws = {k: torch.randn(4, *s, generator=g, dtype=F64) for k, s in model.latent_sites().items()}
    draws["sigma"] = torch.rand(4, *shape, generator=g, dtype=F64) + 0.1
    got = predict(model, x, posterior_samples=draws, batch_size=3, progress=False)
    weights = [{k: v[s] for k, v in draws.items() if k != "sigma"} for s in range(4)]
    mu = torch.stack([functional_call(model.net, w, (x,)) for w in weights]).detach()
    sd = draws["sigma"].reshape(4, 1, -1).expand_as(mu)
    torch.testing.assert_close(got.loc, mu, rtol=0, atol=1e-14)
    torch.testing.assert_close(got.scale, sd, rtol=0, atol=0)
    d = got.uncertainty()  # E[Var] + Var[E], written as E[y^2] - E[y]^2 of the mixture
    second = (sd**2 + mu**2).mean(0) - mu.mean(0) ** 2
    torch.testing.assert_close(d.total, second.sum(-1), rtol=1e-12, atol=0)
    torch.testing.assert_close(d.aleatoric, (sd**2).mean(0).sum(-1), rtol=1e-14, atol=0)
    # rank-1: every draw's noise serves its M members, draw-major
    r1 = rank1(MLP(in_features=3, hidden_features=4, out_features=2).double(), 3,
               likelihood=Gaussian(dist.HalfNormal(torch.ones(shape, dtype=F64))))  # fmt: skip
    factors = {k: 1 + 0.3 * torch.randn(2, *s, dtype=F64) for k, s in r1.latent_sites().items()}
    factors["sigma"] = torch.tensor([0.25, 2.0], dtype=F64).reshape(2, *([1] * len(shape)))
    factors["sigma"] = factors["sigma"].expand(2, *shape).clone()
    got = predict(r1, x, posterior_samples=factors, batch_size=4, progress=False)
    with torch.no_grad():
        members = torch.cat(
            [r1.outputs(x, {k: v[i] for k, v in factors.items() if k != "sigma"}) for i in range(2)]
        )
    assert got.loc.shape == (6, 7, 2)
    torch.testing.assert_close(got.loc, members, rtol=0, atol=1e-14)
    assert got.scale[:3].eq(0.25).all() and got.scale[3:].eq(2.0).all()


def test_an_own_models_prior_draws_repeat_with_the_seed_whatever_the_batches():
    def own(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2, dtype=x.dtype), 1.0).to_event(2))
        logits = x @ w
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits

    x = torch.randn(9, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    got = predict(own, x, num_samples=4, seed=1, batch_size=2, progress=False)
    for other in (
        predict(own, x, num_samples=4, seed=1, batch_size=100, progress=False),
        predict(own, [x[:5], x[5:]], num_samples=4, seed=1, progress=False),
    ):
        assert torch.equal(other.probs, got.probs)
    assert (
        predict(own, x, num_samples=4, seed=2, progress=False).probs - got.probs
    ).abs().max() > 0.1
    # each draw is one network on every input: its log-odds are linear in x, x @ (w1 - w0)
    log_odds = got.probs[..., 1].log() - got.probs[..., 0].log()
    for s in range(4):
        fitted = torch.linalg.lstsq(x, log_odds[s].unsqueeze(-1)).solution
        torch.testing.assert_close(x @ fitted, log_odds[s].unsqueeze(-1), rtol=0, atol=1e-12)


def _models_of_every_kind():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    bayes = bayesian(net)
    regression = bayesian(nn.Linear(3, 1), likelihood=Gaussian(0.3))
    ranked = rank1(MLP(in_features=3, hidden_features=4, out_features=2), 2)
    return {
        "bayesian": (bayes, mean_field_guide(bayes, init_scale=0.3)),
        "regression": (regression, mean_field_guide(regression, init_scale=0.3)),
        "rank1": (ranked, mean_field_guide(ranked, init_scale=0.3)),
        "ensemble": (batchensemble(net, 2), None),
        "plain": (net, None),
    }


@pytest.mark.parametrize("kind", ["bayesian", "regression", "rank1", "ensemble", "plain"])
def test_one_row_is_the_first_row_of_many_and_zero_rows_are_refused(kind):
    model, guide = _models_of_every_kind()[kind]
    x, _ = toy_data(9)
    draws = {} if guide is None else {"num_samples": 3}
    many = predict(model, x, guide, seed=0, progress=False, **draws)
    one = predict(model, x[:1], guide, seed=0, progress=False, **draws)
    for field in ("probs", "loc", "scale"):
        if hasattr(many, field):
            torch.testing.assert_close(getattr(one, field), getattr(many, field)[:, :1],
                                       rtol=0, atol=1e-6)  # fmt: skip
    for empty in (x[:0], [x[:0], x[:0]]):
        with pytest.raises(ValueError, match=r"^predict\(\) got no inputs: x is empty\. Expected"):
            predict(model, empty, guide, seed=0, progress=False, **draws)


def test_batchnorm_data_with_posterior_samples_weighs_each_batch_by_its_size():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).double()
    model = bayesian(net)
    x, train = torch.randn(10, 3, dtype=F64), torch.randn(23, 3, dtype=F64) * 2 + 1
    g = torch.Generator().manual_seed(1)
    draws = {k: torch.randn(3, *s, generator=g, dtype=F64) for k, s in model.latent_sites().items()}
    batches = [train[:8], train[8:11], train[11:]]  # 8, 3, 12 inputs
    got = predict(model, x, posterior_samples=draws, batchnorm_data=batches, progress=False)
    want = []
    for s in range(3):
        first = {"weight": draws["0.weight"][s], "bias": draws["0.bias"][s]}
        h = [functional_call(model.net[0], first, (b,)) for b in batches]
        n = [b.shape[0] for b in h]  # per-batch statistics averaged with weights of their sizes
        mean = sum(k * b.mean(0) for k, b in zip(n, h, strict=True)) / sum(n)
        var = sum(k * b.var(0) for k, b in zip(n, h, strict=True)) / sum(n)
        z = (functional_call(model.net[0], first, (x,)) - mean) / (var + 1e-5).sqrt()
        z = torch.relu(z * model.net[1].weight + model.net[1].bias)
        last = {"weight": draws["3.weight"][s], "bias": draws["3.bias"][s]}
        want.append(torch.softmax(functional_call(model.net[3], last, (z,)), -1))
    torch.testing.assert_close(got.probs, torch.stack(want).detach(), rtol=0, atol=1e-14)
    assert float(model.net[1].running_mean.abs().max()) == 0.0  # the model's own left as is


# --------------------------------------------------------------------------------------------
# fit(): one SGD step of lr 1 against the gradient of the ELBO written out
# --------------------------------------------------------------------------------------------


def _classifier():
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double(), prior=0.8)
    guide = mean_field_guide(model, init_scale=0.2)
    for name, p in guide.named_parameters():  # a guide whose scales are frozen, and one loc
        if name.startswith("rho.") or name == "loc.0__bias":
            p.requires_grad_(False)
    return model, guide


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize(("particles", "kl_weight"), [(1, 0.0), (3, 0.25), (2, 1.0)])
def test_a_fit_step_is_the_gradient_of_the_hand_elbo_with_frozen_guide_parameters(
    particles, kl_weight, vectorize
):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=g, dtype=F64), torch.randint(0, 3, (8,), generator=g)
    model, guide = _classifier()
    frozen = {n: p.detach().clone() for n, p in guide.named_parameters() if not p.requires_grad}
    result, moved = _step_moves(
        model, guide, [(x, y)], num_data=30, kl_weight=kl_weight, num_particles=particles,
        vectorize_particles=vectorize, seed=5,
    )  # fmt: skip
    for name, value in frozen.items():
        assert torch.equal(dict(guide.named_parameters())[name], value)
    hand_model, hand_guide = _classifier()
    loc = {s: hand_guide.site_loc(s) for s in hand_guide.sites}
    scale = {s: hand_guide.site_scale(s) for s in hand_guide.sites}
    pyro.set_rng_seed(5)
    if vectorize:  # every particle's draw of a site at once, site by site
        stacked = {s: torch.randn(particles, *loc[s].shape, dtype=F64) for s in loc}
        eps = [{s: e[i] for s, e in stacked.items()} for i in range(particles)]
    else:  # one particle after another
        eps = [{s: torch.randn(loc[s].shape, dtype=F64) for s in loc} for _ in range(particles)]
    nll = 0.0
    for e in eps:
        w = {s: loc[s] + scale[s] * e[s] for s in loc}
        logits = functional_call(hand_model.net, w, (x,))
        nll = nll + 30 / 8 * F.cross_entropy(logits, y, reduction="sum") / particles
    kl = sum(kl_divergence(Normal(loc[s], scale[s]), Normal(_zero(), 0.8)).sum() for s in loc)
    (nll + kl_weight * kl).backward()
    record = result.history[0]
    assert record.nll == pytest.approx(float(nll.detach()), rel=1e-14)
    assert record.kl == pytest.approx(float(kl.detach()), rel=1e-14)
    for name, p in hand_guide.named_parameters():
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(moved[name], want, rtol=0, atol=1e-13)


def test_a_fit_step_with_a_latent_noise_takes_the_monte_carlo_kl_of_its_lognormal():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=g, dtype=F64), torch.randn(8, 2, generator=g, dtype=F64)

    def make():
        torch.manual_seed(0)
        prior = dist.HalfNormal(torch.ones(2, dtype=F64))
        model = bayesian(nn.Linear(3, 2).double(), likelihood=Gaussian(prior))
        return model, mean_field_guide(model, init_scale=0.2)

    model, guide = make()
    result, moved = _step_moves(model, guide, [(x, y)], num_data=20, kl_weight=0.7, seed=4)
    hand_model, hand_guide = make()
    assert hand_guide.sites == ("weight", "bias", "sigma")
    loc = {s: hand_guide.site_loc(s) for s in hand_guide.sites}
    scale = {s: hand_guide.site_scale(s) for s in hand_guide.sites}
    pyro.set_rng_seed(4)
    w = {s: loc[s] + scale[s] * torch.randn(loc[s].shape, dtype=F64) for s in loc}
    w["sigma"] = w["sigma"].exp()  # the noise's guide is a LogNormal
    mu = functional_call(hand_model.net, {"weight": w["weight"], "bias": w["bias"]}, (x,))
    nll = -(20 / 8) * Normal(mu, w["sigma"]).log_prob(y).sum()
    kl = sum(kl_divergence(Normal(loc[s], scale[s]), Normal(_zero(), 1.0)).sum()
             for s in ("weight", "bias"))  # fmt: skip
    noise = LogNormal(loc["sigma"], scale["sigma"]).log_prob(w["sigma"])
    kl = kl + (noise - HalfNormal(_zero() + 1).log_prob(w["sigma"])).sum()
    (nll + 0.7 * kl).backward()
    assert result.history[0].nll == pytest.approx(float(nll.detach()), rel=1e-14)
    assert result.history[0].kl == pytest.approx(float(kl.detach()), rel=1e-14)
    for name, p in hand_guide.named_parameters():
        torch.testing.assert_close(moved[name], p.grad, rtol=0, atol=1e-13)


def test_a_rank1_fit_step_sums_its_members_likelihoods_and_trains_the_shared_weights():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=g, dtype=F64), torch.randint(0, 2, (8,), generator=g)

    def make():
        torch.manual_seed(0)
        model = rank1(MLP(in_features=3, hidden_features=4, out_features=2).double(), 3)
        return model, mean_field_guide(model, init_scale=0.2)

    model, guide = make()
    result, moved = _step_moves(model, guide, [(x, y)], num_data=20, seed=4)
    assert result.kl_weight == 1.0  # rank-1's default
    hand_model, hand_guide = make()
    loc = {s: hand_guide.site_loc(s) for s in hand_guide.sites}
    scale = {s: hand_guide.site_scale(s) for s in hand_guide.sites}
    pyro.set_rng_seed(4)
    w = {s: loc[s] + scale[s] * torch.randn(loc[s].shape, dtype=F64) for s in loc}
    out = hand_model.outputs(x, w)  # (M, B, C)
    nll = 20 / 8 * F.cross_entropy(out.reshape(-1, 2), y.repeat(3), reduction="sum")
    prior = Normal(_zero() + 1, 0.1)  # rank1()'s documented default, Normal(1, prior_scale=0.1)
    kl = sum(kl_divergence(Normal(loc[s], scale[s]), prior).sum() for s in loc)
    (nll + kl).backward()
    assert result.history[0].nll == pytest.approx(float(nll.detach()), rel=1e-14)
    hand = dict(hand_model.named_parameters()) | dict(hand_guide.named_parameters())
    assert any(name.startswith("net.") for name in moved)  # the shared weights are trained
    for name, step in moved.items():
        torch.testing.assert_close(step, hand[name].grad, rtol=0, atol=1e-13)


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("particles", [1, 3])
def test_every_particle_updates_the_batchnorm_statistics_of_its_own_draw(particles, vectorize):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=g, dtype=F64), torch.randint(0, 3, (8,), generator=g)

    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 3))
        model = bayesian(net.double(), select=["0.weight", "0.bias", "3.weight", "3.bias"])
        return model, mean_field_guide(model, init_scale=0.2)

    model, guide = make()
    fit(model, guide, [(x, y)], epochs=1, num_data=20, num_particles=particles,
        vectorize_particles=vectorize, optim=lambda p: torch.optim.SGD(p, lr=0.0),
        lr_schedule="constant", seed=5, progress=False)  # fmt: skip
    _, hand_guide = make()
    loc = {s: hand_guide.site_loc(s).detach() for s in hand_guide.sites}
    scale = {s: hand_guide.site_scale(s).detach() for s in hand_guide.sites}
    pyro.set_rng_seed(5)
    if vectorize:
        stacked = {s: torch.randn(particles, *loc[s].shape, dtype=F64) for s in loc}
        eps = [{s: e[i] for s, e in stacked.items()} for i in range(particles)]
    else:
        eps = [{s: torch.randn(loc[s].shape, dtype=F64) for s in loc} for _ in range(particles)]
    norm = nn.BatchNorm1d(4).double()  # torch's momentum 0.1, one update per pass
    for e in eps:
        h = x @ (loc["0.weight"] + scale["0.weight"] * e["0.weight"]).T
        norm(h + loc["0.bias"] + scale["0.bias"] * e["0.bias"])
    bn = model.net[1]
    assert int(bn.num_batches_tracked) == particles
    torch.testing.assert_close(bn.running_mean, norm.running_mean, rtol=0, atol=1e-15)
    torch.testing.assert_close(bn.running_var, norm.running_var, rtol=0, atol=1e-15)


def test_fit_with_a_frozen_layer_a_learned_noise_particles_and_cosine_is_a_hand_adam_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(14, 3, generator=g, dtype=F64)
    y = x[:, :2] + 0.1 * torch.randn(14, 2, generator=g, dtype=F64)
    batches = [(x[:6], y[:6]), (x[6:12], y[6:12]), (x[12:], y[12:])]  # the last of 2

    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(),
                            nn.Linear(4, 2)).double()  # fmt: skip
        model = bayesian(net, prior=0.7, select=["0.weight", "4.weight"],
                         likelihood=Gaussian("learned"))  # fmt: skip
        model.net[2].weight.requires_grad_(False)  # a frozen layer
        return model, mean_field_guide(model, init_scale=0.1)

    model, guide = make()
    frozen = model.net[2].weight.detach().clone()
    result = fit(model, guide, batches, epochs=2, num_data=14, lr=0.03, kl_weight=0.5,
                 num_particles=2, lr_schedule="cosine", seed=3, progress=False)  # fmt: skip
    assert torch.equal(model.net[2].weight, frozen)
    hand_model, hand_guide = make()
    hand_model.likelihood.prepare(torch.zeros(1, 2, dtype=F64))  # softplus(raw) = 1
    trained = [p for p in [*hand_model.parameters(), *hand_guide.parameters()] if p.requires_grad]
    adam = torch.optim.Adam(trained, lr=0.03)
    pyro.set_rng_seed(3)
    losses = []
    for step in range(6):
        xb, yb = batches[step % 3]
        adam.param_groups[0]["lr"] = 0.03 * 0.5 * (1 + math.cos(math.pi * step / 6))
        adam.zero_grad()
        nll = 0.0
        for _ in range(2):
            drawn = pyro.poutine.trace(hand_guide).get_trace(xb, yb)
            weights = dict(hand_model.net.named_parameters())
            weights |= {s: drawn.nodes[s]["value"] for s in hand_model.latent_sites()}
            mu = functional_call(hand_model.net, weights, (xb,))
            sd = F.softplus(hand_model.likelihood.raw_scale)
            nll = nll - 14 / xb.shape[0] * Normal(mu, sd).log_prob(yb).sum() / 2
        kl = sum(
            kl_divergence(
                Normal(hand_guide.site_loc(s), hand_guide.site_scale(s)), Normal(_zero(), 0.7)
            ).sum()
            for s in hand_guide.sites
        )
        loss = nll + 0.5 * kl
        loss.backward()
        adam.step()
        losses.append(float(loss.detach()))
    assert result.losses == pytest.approx([sum(losses[:3]) / 3, sum(losses[3:]) / 3], rel=1e-8)
    mine = dict(model.named_parameters()) | dict(guide.named_parameters())
    theirs = dict(hand_model.named_parameters()) | dict(hand_guide.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, p in mine.items():
        torch.testing.assert_close(p.detach(), theirs[name].detach(), rtol=0, atol=1e-7)


def test_the_schedule_multiplies_each_learning_rate_of_an_optimizers_groups():
    x, y = toy_data(10)
    torch.manual_seed(0)
    model = bayesian(nn.Linear(3, 2))
    guide = mean_field_guide(model)
    built = []

    def two_groups(params):
        groups = [{"params": params[:2], "lr": 0.1}, {"params": params[2:], "lr": 0.01}]
        built.append(torch.optim.SGD(groups, lr=0.5))
        return built[-1]

    seen = []
    fit(model, guide, [(x[:5], y[:5]), (x[5:], y[5:])], epochs=5, num_data=10, optim=two_groups,
        progress=False, seed=0,
        callbacks=[lambda r: seen.append([g["lr"] for g in built[0].param_groups])])  # fmt: skip
    warm = 2  # int(0.2 * 10) warm-up steps, then a half cosine over the 8 others

    def factor(s):
        return (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / 8))

    want = [[0.1 * factor(2 * e + 1), 0.01 * factor(2 * e + 1)] for e in range(5)]
    assert np.allclose(seen, want, rtol=1e-12, atol=0)


def test_a_callback_that_predicts_and_evaluates_leaves_the_training_as_it_was():
    x, y = toy_data(20)
    data = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=6, shuffle=True,
                                         generator=torch.Generator())  # fmt: skip

    def make():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Tanh(), nn.Linear(8, 2))
        model = bayesian(net)
        return model, mean_field_guide(model)

    def run(callbacks):
        model, guide = make()
        loader.generator.manual_seed(0)
        result = fit(model, guide, loader, epochs=3, seed=1, progress=False,
                     callbacks=callbacks(model, guide))  # fmt: skip
        return result, guide

    plain, plain_guide = run(lambda model, guide: [])
    seen = []

    def monitor(model, guide):
        def callback(record):
            seen.append(predict(model, x, guide, num_samples=3, progress=False))  # unseeded
            model.eval()
            torch.randn(3)  # draws from the global stream
            list(loader)  # reads the training loader (its generator moves)

        return [callback]

    monitored, monitored_guide = run(monitor)
    assert len(seen) == 3 and seen[0].probs.shape == (3, 20, 2)
    assert monitored.losses == plain.losses
    for a, b in zip(plain_guide.parameters(), monitored_guide.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("vectorize", [False, True])
def test_train_acc_of_several_particles_is_the_first_draws_or_their_vectorised_mean(vectorize):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 3, generator=g, dtype=F64), torch.randint(0, 3, (40,), generator=g)

    def make():
        torch.manual_seed(0)
        model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double())
        return model, mean_field_guide(model, init_scale=1.0)

    model, guide = make()
    record = fit(model, guide, [(x, y)], epochs=1, num_data=40, num_particles=5,
                 vectorize_particles=vectorize, optim=lambda p: torch.optim.SGD(p, lr=0.0),
                 lr_schedule="constant", seed=5, progress=False).history[0]  # fmt: skip
    hand_model, hand_guide = make()
    loc = {s: hand_guide.site_loc(s).detach() for s in hand_guide.sites}
    scale = {s: hand_guide.site_scale(s).detach() for s in hand_guide.sites}
    pyro.set_rng_seed(5)
    if vectorize:
        stacked = {s: torch.randn(5, *loc[s].shape, dtype=F64) for s in loc}
        eps = [{s: e[i] for s, e in stacked.items()} for i in range(5)]
    else:
        eps = [{s: torch.randn(loc[s].shape, dtype=F64) for s in loc} for _ in range(5)]
    weights = [{s: loc[s] + scale[s] * e[s] for s in loc} for e in eps]
    logits = torch.stack([functional_call(hand_model.net, w, (x,)) for w in weights])
    first = float((logits[0].argmax(-1) == y).double().mean())
    mean = float((logits.softmax(-1).mean(0).argmax(-1) == y).double().mean())
    assert first != mean  # (these draws tell the two apart)
    assert record.train_acc == (mean if vectorize else first)
