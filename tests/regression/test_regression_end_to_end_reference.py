"""Regression end to end against independent references: each noise model's predictions from
given draws (by hand, and the mixture's moments by numpy), NUTS against the conjugate
posterior predictive, the ``"obs"`` site's N/B scale against ``torch.distributions.Normal``,
(N,) and (N, 1) targets alike, the scores against closed forms and a Monte Carlo estimate,
standardised targets scaled back by y_std and y_std^2, and targets that the network cannot
observe refused by mcmc() and fit()."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn

from pyrouq import (
    ArrayLoader,
    Gaussian,
    GaussianPredictions,
    Standardizer,
    bayesian,
    conformal,
    fit,
    mcmc,
    mean_field_guide,
    predict,
)
from pyrouq.regression import mixture_crps

N_IN, N_OUT, S = 3, 2, 4


def _noise(kind):
    """``(likelihood, network outputs)`` for two targets per input."""
    return {
        "fixed": (Gaussian(0.3), N_OUT),
        "learned": (Gaussian("learned"), N_OUT),
        "latent shared": (Gaussian(dist.HalfNormal(1.0)), N_OUT),
        "latent per output": (Gaussian(dist.HalfNormal(torch.ones(N_OUT))), N_OUT),
        "heteroscedastic": (Gaussian("heteroscedastic"), 2 * N_OUT),
    }[kind]


@pytest.mark.parametrize(
    "kind", ["fixed", "learned", "latent shared", "latent per output", "heteroscedastic"]
)
def test_predictions_from_given_draws_are_each_draws_gaussian_and_their_mixture(kind):
    """float64 end to end: every draw's mean and sd by hand, and the mixture's moments
    (numpy, E[X^2] - E[X]^2) split as total = aleatoric + epistemic."""
    likelihood, width = _noise(kind)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, N_IN, generator=g, dtype=torch.float64)
    model = bayesian(nn.Linear(N_IN, width).double(), likelihood=likelihood)
    draws = {
        "weight": torch.randn(S, width, N_IN, generator=g, dtype=torch.float64),
        "bias": torch.randn(S, width, generator=g, dtype=torch.float64),
    }
    if kind.startswith("latent"):
        shape = (S,) if kind == "latent shared" else (S, N_OUT)
        draws["sigma"] = 0.1 + torch.rand(shape, generator=g, dtype=torch.float64)
    if kind == "learned":  # its noise exists once a network was seen: then set it by hand
        predict(model, x, posterior_samples=draws, progress=False)
        with torch.no_grad():
            model.likelihood.raw_scale.copy_(
                torch.tensor([0.3, 2.0], dtype=torch.float64).expm1().log()
            )
    p = predict(model, x, posterior_samples=draws, progress=False)

    out = torch.einsum("soi,ni->sno", draws["weight"], x) + draws["bias"][:, None]
    mu = out[..., :N_OUT]
    if kind == "fixed":
        sd = torch.full_like(mu, 0.3)
    elif kind == "learned":
        sd = torch.tensor([0.3, 2.0], dtype=torch.float64).expand_as(mu)
    elif kind == "latent shared":
        sd = draws["sigma"][:, None, None].expand_as(mu)
    elif kind == "latent per output":
        sd = draws["sigma"][:, None, :].expand_as(mu)
    else:  # D means, then D raw scales
        sd = 1e-3 + F.softplus(out[..., N_OUT:])
    assert p.loc.dtype == p.scale.dtype == torch.float64
    assert p.loc.shape == p.scale.shape == (S, 5, N_OUT)
    torch.testing.assert_close(p.loc, mu, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p.scale, sd, rtol=1e-12, atol=1e-12)

    m, s = mu.numpy(), sd.numpy()
    second = (s**2 + m**2).mean(0)  # E[X^2] of the equal-weight mixture
    np.testing.assert_allclose(p.mean.numpy(), m.mean(0), rtol=1e-12)
    np.testing.assert_allclose(p.variance.numpy(), second - m.mean(0) ** 2, rtol=1e-10)
    d = p.uncertainty()
    np.testing.assert_allclose(d.aleatoric.numpy(), (s**2).mean(0).sum(-1), rtol=1e-12)
    np.testing.assert_allclose(d.epistemic.numpy(), m.var(0).sum(-1), rtol=1e-10)
    np.testing.assert_allclose(d.total.numpy(), (second - m.mean(0) ** 2).sum(-1), rtol=1e-10)


def test_nuts_predictions_match_the_conjugate_posterior_predictive():
    """Bayesian linear regression with known noise: mean x'm, epistemic variance x'Cx, total
    sigma^2 + x'Cx (C, m: the exact posterior). 400 draws of one chain, about 5 s."""
    torch.manual_seed(0)
    n, sigma, alpha = 20, 0.5, 1.0
    x = torch.randn(n, 1)
    y = 2 * x[:, 0] - 1 + sigma * torch.randn(n)
    model = bayesian(nn.Linear(1, 1), prior=alpha, likelihood=Gaussian(sigma))
    result = mcmc(
        model, x, y, num_samples=400, warmup_steps=200, num_chains=1, seed=0, progress=False
    )
    new = torch.tensor([[-3.0], [0.0], [2.0]])
    p = predict(model, new, posterior_samples=result, progress=False)

    phi = torch.cat([x, torch.ones(n, 1)], 1).double()
    cov = torch.linalg.inv(torch.eye(2, dtype=torch.float64) / alpha**2 + phi.T @ phi / sigma**2)
    mean = cov @ phi.T @ y.double() / sigma**2
    at = torch.cat([new, torch.ones(3, 1)], 1).double()
    exact_mean, exact_epistemic = at @ mean, ((at @ cov) * at).sum(1)

    d = p.uncertainty()
    assert p.num_samples == 400
    torch.testing.assert_close(d.aleatoric, torch.full((3,), sigma**2))  # the known noise
    z = (p.mean[:, 0].double() - exact_mean) / exact_epistemic.sqrt()
    assert z.abs().max() < 0.3  # within 0.3 posterior sd (400 correlated draws)
    ratio = d.epistemic.double() / exact_epistemic
    assert ((ratio > 0.6) & (ratio < 1.4)).all(), ratio
    # the far input is the most uncertain, as the closed form says (0.14 vs 0.014 at x = 0)
    assert d.epistemic.argmax() == 0 and d.epistemic.argmin() == 1
    torch.testing.assert_close(d.total, d.aleatoric + d.epistemic)


@pytest.mark.parametrize("column", [False, True])
def test_the_obs_site_of_a_heteroscedastic_minibatch_is_n_over_b_torch_normal(column):
    """A batch of B = 3 of N = 10: the site is scaled 10/3 and its log-density is that of
    Normal(mean, 1e-3 + softplus(raw)) at the targets, given as (B,) or (B, 1)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, N_IN, generator=g), torch.randn(3, generator=g)
    model = bayesian(nn.Linear(N_IN, 2), likelihood=Gaussian("heteroscedastic"), num_data=10)
    trace = poutine.trace(model).get_trace(x, y[:, None] if column else y)
    trace.compute_log_prob()
    out = trace.nodes["outputs"]["value"]
    obs = trace.nodes["obs"]
    reference = torch.distributions.Normal(out[:, :1], 1e-3 + F.softplus(out[:, 1:]))
    assert obs["scale"] == pytest.approx(10 / 3)
    assert obs["value"].shape == (3, 1)
    expected = 10 / 3 * reference.log_prob(y[:, None]).sum()
    torch.testing.assert_close(obs["log_prob_sum"], expected)
    # the fast NLL that fit() back-propagates is the same density, unscaled
    torch.testing.assert_close(model.likelihood.nll(out, y), -reference.log_prob(y[:, None]).sum())


def test_targets_given_as_n_or_as_a_column_train_and_predict_alike():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, N_IN, generator=g)
    y = x[:, 0] - 0.5 * x[:, 1] + 0.2 * torch.randn(24, generator=g)
    runs = []
    for targets in (y, y[:, None]):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = bayesian(nn.Linear(N_IN, 1), likelihood=Gaussian("learned"))
        guide = mean_field_guide(model)
        loader = ArrayLoader(x, targets, batch_size=8, seed=0)
        result = fit(model, guide, loader, epochs=3, progress=False, seed=0)
        pyro.set_rng_seed(1)
        test = ArrayLoader(x, targets, batch_size=10, shuffle=False)
        runs.append((result, predict(model, test, guide, num_samples=3, progress=False)))
    (first, p), (second, q) = runs
    assert [r.loss for r in first.history] == [r.loss for r in second.history]
    assert torch.equal(p.loc, q.loc) and torch.equal(p.scale, q.scale)
    assert p.targets.shape == q.targets.shape == (24, 1)
    assert torch.equal(p.targets[:, 0], y)
    assert p.evaluate() == q.evaluate() == p.evaluate(y)


def _phi(z):
    return np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)


def _cdf(z):
    return 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))


def test_scores_of_one_gaussian_are_its_closed_forms():
    """S = 1: CRPS = sigma (z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)), NLL the Gaussian's,
    the central q interval mu +- z_q sigma, and its coverage counted by hand."""
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(1, 200, 1, generator=g, dtype=torch.float64)
    sd = 0.2 + torch.rand(1, 200, 1, generator=g, dtype=torch.float64)
    y = mu[0, :, 0] + sd[0, :, 0] * 1.3 * torch.randn(200, generator=g, dtype=torch.float64)
    p = GaussianPredictions(mu, sd, y)
    m, s, t = mu.numpy()[0, :, 0], sd.numpy()[0, :, 0], y.numpy()
    z = (t - m) / s
    crps = s * (z * (2 * _cdf(z) - 1) + 2 * _phi(z) - 1 / math.sqrt(math.pi))
    np.testing.assert_allclose(p.crps().numpy(), crps, rtol=1e-12, atol=1e-14)
    ev = p.evaluate()
    assert ev["crps"] == pytest.approx(crps.mean(), rel=1e-12)
    assert ev["nll"] == pytest.approx((0.5 * z**2 + np.log(s * math.sqrt(2 * math.pi))).mean())
    for level in (0.5, 0.9, 0.95):
        half = NormalDist().inv_cdf(0.5 + level / 2) * s
        lo, hi = p.interval(level)
        np.testing.assert_allclose(lo.numpy()[:, 0], m - half, rtol=0, atol=1e-9)
        np.testing.assert_allclose(hi.numpy()[:, 0], m + half, rtol=0, atol=1e-9)
        key = round(100 * level)
        assert ev[f"coverage_{key}"] == np.mean(np.abs(t - m) <= half)
        assert ev[f"width_{key}"] == pytest.approx(2 * half.mean(), rel=1e-9)
    # targets drawn 1.3 sd wide: the intervals under-cover (a 90 % interval holds ~79 %)
    assert ev["coverage_90"] < 0.86


def test_the_mixture_crps_is_the_sample_estimate_and_the_nll_its_log_sum_exp():
    """E|X - y| - E|X - X'| / 2 from 400,000 numpy draws of the mixture; the joint NLL of
    two outputs by log-sum-exp over the draws."""
    g = torch.Generator().manual_seed(1)
    loc = 2 * torch.randn(5, 3, N_OUT, generator=g, dtype=torch.float64)
    scale = 0.1 + torch.rand(5, 3, N_OUT, generator=g, dtype=torch.float64)
    y = torch.randn(3, N_OUT, generator=g, dtype=torch.float64)
    p = GaussianPredictions(loc, scale, y)
    L, Sc, Y = loc.numpy(), scale.numpy(), y.numpy()
    rng = np.random.default_rng(0)
    draws = 400_000
    for n in range(3):
        for d in range(N_OUT):
            a, b = rng.integers(0, 5, draws), rng.integers(0, 5, draws)
            x1, x2 = rng.normal(L[a, n, d], Sc[a, n, d]), rng.normal(L[b, n, d], Sc[b, n, d])
            estimate = np.abs(x1 - Y[n, d]).mean() - 0.5 * np.abs(x1 - x2).mean()
            assert float(mixture_crps(loc, scale, y)[n, d]) == pytest.approx(estimate, abs=6e-3)
    torch.testing.assert_close(p.crps(), mixture_crps(loc, scale, y).mean(-1))
    per_draw = (-0.5 * ((Y - L) / Sc) ** 2 - np.log(Sc * math.sqrt(2 * math.pi))).sum(-1)
    top = per_draw.max(0)
    log_mix = top + np.log(np.exp(per_draw - top).mean(0))
    np.testing.assert_allclose(p.log_prob().numpy(), log_mix, rtol=1e-12)
    assert p.evaluate()["nll"] == pytest.approx(-log_mix.mean(), rel=1e-12)


def test_standardised_targets_come_back_scaled_by_y_std_and_its_square():
    """Two outputs on very different scales (about 1e4 and 1e-2): means scale by y_std and
    shift by y_mean, variances and each part of the decomposition scale by y_std^2, the NLL
    shifts by sum log y_std, coverage and calibration stay; conformal intervals follow."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, N_IN, generator=g, dtype=torch.float64)
    y = torch.stack([1e4 + 3e3 * x[:, 0], 0.02 * x[:, 1]], 1)
    y = y + torch.tensor([500.0, 0.005]) * torch.randn(40, 2, generator=g, dtype=torch.float64)
    scaler = Standardizer.fit(x, y)
    std, mean = scaler.y_std, scaler.y_mean
    z = scaler.transform_y(y)
    loc = z + 0.3 * torch.randn(S, 40, 2, generator=g, dtype=torch.float64)
    scale = 0.2 + torch.rand(S, 40, 2, generator=g, dtype=torch.float64)
    standard = GaussianPredictions(loc, scale, z)
    original = scaler.inverse(standard)

    assert original.loc.dtype == torch.float64
    torch.testing.assert_close(original.targets, y)
    torch.testing.assert_close(original.mean, standard.mean * std + mean)
    torch.testing.assert_close(original.stddev, standard.stddev * std)
    torch.testing.assert_close(original.variance, standard.variance * std**2)
    a, b = original.uncertainty(), standard.uncertainty()
    torch.testing.assert_close(a.aleatoric, (standard.aleatoric_variance * std**2).sum(-1))
    torch.testing.assert_close(a.epistemic, (standard.epistemic_variance * std**2).sum(-1))
    torch.testing.assert_close(a.total, a.aleatoric + a.epistemic)
    assert not torch.allclose(a.total, b.total)  # (the units changed)

    eo, es = original.evaluate(), standard.evaluate()
    assert eo["nll"] - es["nll"] == pytest.approx(float(std.log().sum()), rel=1e-10)
    error = (original.mean - y).numpy()
    assert eo["rmse"] == pytest.approx(np.sqrt((error**2).mean()), rel=1e-10)
    assert eo["mae"] == pytest.approx(np.abs(error).mean(), rel=1e-10)
    for key in ("coverage_50", "coverage_90", "coverage_95", "calibration_error"):
        assert eo[key] == es[key]
    lo_o, hi_o = original.interval(0.9)
    lo_s, hi_s = standard.interval(0.9)
    torch.testing.assert_close(lo_o, lo_s * std + mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(hi_o - lo_o, (hi_s - lo_s) * std, rtol=1e-9, atol=1e-12)

    # normalised residuals have no units; the CQR threshold is in the targets' units
    ao, as_ = conformal(original, alpha=0.2), conformal(standard, alpha=0.2)
    torch.testing.assert_close(ao.threshold, as_.threshold, rtol=1e-9, atol=0)
    co, cs = (
        conformal(original, alpha=0.2, score="cqr"),
        conformal(standard, alpha=0.2, score="cqr"),
    )
    torch.testing.assert_close(co.threshold, cs.threshold * std, rtol=1e-9, atol=1e-12)
    lo, hi = co.intervals(original)
    lo_z, hi_z = cs.intervals(standard)
    torch.testing.assert_close(lo, lo_z * std + mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(hi, hi_z * std + mean, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    ("targets", "error", "match"),
    [
        (lambda y: y.long(), ValueError,
         r"mcmc\(\): targets of dtype torch.int64, expected real values \(a floating dtype\): "
         r"class labels belong to a Categorical likelihood; for real targets use y.float\(\)"),
        (lambda y: y.index_fill(0, torch.tensor([2]), float("nan")), ValueError,
         r"mcmc\(\): NaN or inf targets at rows \[2\]; remove or repair them"),
        (lambda y: y[:, None].expand(12, 2), ValueError,
         r"mcmc\(\): targets of shape \(12, 2\), expected \(N, 1\) or \(N,\) for a network "
         r"with 1 output\(s\)"),
        (lambda y: y[:11], ValueError,
         r"mcmc\(\): x and y must hold the same number N >= 1 of points, got 12 and 11"),
    ],
)  # fmt: skip
def test_mcmc_refuses_targets_that_no_gaussian_observes(targets, error, match):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 2, generator=g), torch.randn(12, generator=g)
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    with pytest.raises(error, match=match):
        mcmc(model, x, targets(y), num_samples=3, warmup_steps=3, num_chains=1, progress=False)


def test_a_classifier_sized_network_given_real_targets_is_told_its_output_count():
    """Ten outputs (a classifier's logits) and one real target per input: fit() names the
    shape it expected before training."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, N_IN, generator=g), torch.randn(12, generator=g)
    model = bayesian(nn.Linear(N_IN, 10), likelihood=Gaussian(0.5))
    guide = mean_field_guide(model)
    with pytest.raises(
        ValueError,
        match=r"train_loader has targets of shape \(12,\), expected \(N, 10\) for a network "
        r"with 10 output\(s\); nothing was trained",
    ):
        fit(model, guide, ArrayLoader(x, y, batch_size=4, seed=0), epochs=1, progress=False)
    # and two outputs for one target: read as a mean and a scale, it suggests so
    model = bayesian(nn.Linear(N_IN, 2), likelihood=Gaussian(0.5))
    with pytest.raises(ValueError, match=r"pass likelihood=Gaussian\(scale='heteroscedastic'\)"):
        fit(model, mean_field_guide(model), ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False)
