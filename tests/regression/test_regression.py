"""Regression: Gaussian likelihoods, GaussianPredictions and its metrics checked against
independent computations, tabular helpers, plots, checkpoints and arviz export."""

from __future__ import annotations

import math
import re
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import (
    ArrayLoader,
    Gaussian,
    GaussianPredictions,
    Predictions,
    Standardizer,
    batchensemble,
    bayesian,
    evaluate,
    fit,
    format_table,
    load,
    mean_field_guide,
    plot_calibration,
    plot_regression,
    predict,
    psis_diagnostic,
    save,
    to_inference_data,
    train_test_split,
)
from pyrouq.regression import mixture_crps


def _mixture(seed=0, s=5, n=7, d=2):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(s, n, d, generator=g, dtype=torch.float64)
    scale = torch.rand(s, n, d, generator=g, dtype=torch.float64) + 0.2
    y = torch.randn(n, d, generator=g, dtype=torch.float64)
    return GaussianPredictions(loc, scale, y), loc, scale, y


def _normal_cdf(z):
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


# -- the metric formulae ---------------------------------------------------------------------


def test_mixture_nll_matches_a_direct_sum_over_components():
    p, loc, scale, y = _mixture()
    s, n, d = loc.shape
    for i in range(n):
        density = 0.0
        for k in range(s):
            prod = 1.0
            for j in range(d):
                z = (y[i, j] - loc[k, i, j]) / scale[k, i, j]
                prod *= math.exp(-0.5 * z**2) / (scale[k, i, j] * math.sqrt(2 * math.pi))
            density += prod / s
        assert abs(p.log_prob()[i].item() - math.log(density)) < 1e-10
    assert abs(p.evaluate()["nll"] + p.log_prob().mean().item()) < 1e-12


def test_crps_matches_numeric_integration_of_the_cdf():
    p, loc, scale, y = _mixture()
    # CRPS = int (F(t) - 1[t >= y])^2 dt, split at y so that the integrand is smooth
    crps = torch.zeros_like(y)
    for i in range(y.shape[0]):
        for j in range(y.shape[1]):
            m, sd, t0 = loc[:, i, j], scale[:, i, j], y[i, j]
            for lo, hi, step in ((t0 - 30, t0, 0), (t0, t0 + 30, 1)):
                grid = torch.linspace(float(lo), float(hi), 40001, dtype=torch.float64)
                cdf = (0.5 * (1 + torch.erf((grid[:, None] - m) / sd / math.sqrt(2)))).mean(1)
                crps[i, j] += torch.trapezoid((cdf - step) ** 2, grid)
    assert torch.allclose(p.crps(), crps.mean(-1), atol=1e-5, rtol=0)
    assert abs(p.evaluate()["crps"] - crps.mean().item()) < 1e-5


def test_crps_of_many_draws_takes_fewer_inputs_at_a_time_with_the_same_values():
    from pyrouq.regression import CRPS_PAIR_VALUES, mixture_crps

    g = torch.Generator().manual_seed(0)
    s = 700  # S^2 = 490,000 values per input: about 8 inputs a chunk, not 1,024
    loc, scale = torch.randn(s, 20, 1, generator=g), torch.rand(s, 20, 1, generator=g) + 0.5
    y = torch.randn(20, 1, generator=g)
    assert CRPS_PAIR_VALUES // s**2 < 20
    together = mixture_crps(loc[:40], scale[:40], y)  # one chunk
    one_by_one = mixture_crps(loc[:40], scale[:40], y, chunk=1)
    torch.testing.assert_close(together, one_by_one, rtol=1e-12, atol=0)
    var = scale.double().square()
    i = 3  # one input by the formula, every pair at once
    first = (_crps(y[i].double() - loc[:, i].double(), var[:, i])).mean(0)
    pair = _crps(
        loc[:, None, i].double() - loc[None, :, i].double(), var[:, None, i] + var[None, :, i]
    )
    torch.testing.assert_close(mixture_crps(loc, scale, y)[i], first - 0.5 * pair.mean((0, 1)))


def _crps(diff, var):
    """E|Z| for Z ~ N(diff, var): the closed form the mixture's CRPS is built from."""
    sd = var.sqrt()
    z = diff / sd
    cdf = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
    pdf = torch.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    return diff * (2 * cdf - 1) + 2 * sd * pdf


def test_intervals_hold_their_mass_and_coverage_counts_targets_inside():
    p, loc, scale, y = _mixture(s=4, n=50, d=1)
    for level in (0.5, 0.9, 0.95):
        lo, hi = p.interval(level)
        assert torch.allclose(p.cdf(hi) - p.cdf(lo), torch.full_like(lo, level), atol=1e-9)
        # one output: (N,) values are the (N, 1) ones, not a broadcast (N, N)
        assert torch.equal(p.cdf(hi[:, 0]), p.cdf(hi)) and p.cdf(hi[:, 0]).shape == (50, 1)
        inside = ((y >= lo) & (y <= hi)).double().mean().item()
        assert p.evaluate()[f"coverage_{round(100 * level)}"] == pytest.approx(inside)
    # Monte Carlo from the mixture: a component, then a Gaussian draw
    g = torch.Generator().manual_seed(1)
    draws = 400_000
    comp = torch.randint(0, 4, (draws,), generator=g)
    sample = loc[comp, 0, 0] + scale[comp, 0, 0] * torch.randn(draws, generator=g, dtype=loc.dtype)
    lo, hi = p.interval(0.9)
    mass = ((sample >= lo[0, 0]) & (sample <= hi[0, 0])).double().mean().item()
    assert abs(mass - 0.9) < 3 * math.sqrt(0.09 / draws)


def test_variance_decomposition_is_the_law_of_total_variance():
    p, loc, scale, _ = _mixture()
    second_moment = (scale**2 + loc**2).mean(0)
    assert torch.allclose(p.variance, second_moment - p.mean**2, atol=1e-12)
    d = p.uncertainty()
    assert torch.allclose(d.total, d.aleatoric + d.epistemic, atol=1e-12)
    assert torch.allclose(d.epistemic, loc.var(0, unbiased=False).sum(-1))
    assert torch.allclose(d.aleatoric, (scale**2).mean(0).sum(-1))


def test_point_errors_and_calibration_error_by_hand():
    loc = torch.tensor([[[0.0], [1.0]], [[2.0], [3.0]]])  # S=2, N=2, D=1
    p = GaussianPredictions(loc, torch.ones(2, 2, 1), torch.tensor([2.0, 0.0]))
    m = p.evaluate()
    assert m["rmse"] == pytest.approx(math.sqrt((1.0 + 4.0) / 2))  # means 1 and 2
    assert m["mae"] == pytest.approx(1.5)
    pit = p.cdf(p.targets)
    levels = torch.arange(1, 20, dtype=torch.float64) / 20
    observed = (pit.flatten()[None] <= levels[:, None]).double().mean(1)
    assert m["calibration_error"] == pytest.approx(((observed - levels) ** 2).mean().item())
    assert list(m) == [
        "rmse", "mae", "nll", "crps", "coverage_50", "width_50", "coverage_90", "width_90",
        "coverage_95", "width_95", "calibration_error",
    ]  # fmt: skip
    assert evaluate(p, p.targets) == m
    table = format_table(m)
    assert "│ RMSE" in table and "│ Coverage 90%" in table and "Classification" not in table


def test_rescale_moves_predictions_to_original_units():
    p, *_ = _mixture(d=1)
    q = p.rescale(10.0, 2.0)
    assert torch.allclose(q.mean, 10 + 2 * p.mean) and torch.allclose(q.stddev, 2 * p.stddev)
    assert q.evaluate()["crps"] == pytest.approx(2 * p.evaluate()["crps"])


# -- models ----------------------------------------------------------------------------------


def _data(n=64, d_out=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.randn(3, d_out, generator=g) + 0.1 * torch.randn(n, d_out, generator=g)
    return x, (y[:, 0] if d_out == 1 else y)


@pytest.mark.parametrize("scale", [0.5, "learned", dist.HalfNormal(1.0), "heteroscedastic"])
def test_each_noise_model_fits_predicts_and_round_trips(scale, tmp_path):
    hetero = scale == "heteroscedastic"
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4 if hetero else 2))
    model = bayesian(net, likelihood=Gaussian(scale))
    guide = mean_field_guide(model)
    x, y = _data(d_out=2)
    result = fit(model, guide, ArrayLoader(x, y, 16, seed=0), epochs=3, progress=False, seed=0)
    assert result.kl_weight == 1.0 and math.isnan(result.history[-1].train_acc)
    pyro.set_rng_seed(0)
    p = predict(model, x, guide, num_samples=4)
    assert isinstance(p, GaussianPredictions) and p.loc.shape == p.scale.shape == (4, 64, 2)
    if isinstance(scale, dist.Distribution):  # the noise is a latent site: it varies by draw
        assert list(model.latent_sites())[-1] == "sigma" and "sigma" in guide.sites
        assert p.scale[:, 0, 0].unique().numel() == 4
    path = save(tmp_path / "m.pt", model, guide)
    saved = load(
        path, module=nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4 if hetero else 2))
    )
    pyro.set_rng_seed(0)
    again = predict(saved.model, x, saved.guide, num_samples=4)
    assert torch.equal(again.loc, p.loc) and torch.equal(again.scale, p.scale)


def test_a_noise_prior_without_a_closed_form_mean_starts_its_guide_at_one():
    # a folded Normal has no .mean: mean_field_guide raised a bare NotImplementedError
    model = bayesian(
        nn.Linear(3, 1), likelihood=Gaussian(dist.FoldedDistribution(dist.Normal(0.0, 1.0)))
    )
    guide = mean_field_guide(model)
    assert guide.means()["sigma"].item() == pytest.approx(1.0)  # the median exp(loc) = 1


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_bounded_noise_prior_for_mcmc_round_trips(tmp_path):
    model = bayesian(nn.Linear(3, 1), likelihood=Gaussian(dist.Uniform(0.1, 2.0)))
    back = load(save(tmp_path / "u.pt", model), module=nn.Linear(3, 1)).model
    prior = back.likelihood.noise_prior.base()  # once rebuilt as Uniform(1, 1): refused
    assert isinstance(prior, dist.Uniform)
    assert (float(prior.low), float(prior.high)) == (pytest.approx(0.1), 2.0)


@pytest.mark.parametrize("scale", ["learned", dist.HalfNormal(1.0)])
def test_a_float64_network_with_its_own_noise_parameters_computes_in_float64(scale):
    # the likelihood's float32 noise parameter, registered before the network, does not decide
    # the dtype the float64 network's inputs are cast to
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    model = bayesian(net, likelihood=Gaussian(scale))
    guide = mean_field_guide(model)
    x, y = (t.double() for t in _data(d_out=2))
    result = fit(model, guide, ArrayLoader(x, y, 16, seed=0), epochs=1, progress=False, seed=0)
    assert math.isfinite(result.history[-1].loss)
    p = predict(model, ArrayLoader(x, y, 16), guide, num_samples=2, progress=False)
    assert p.loc.shape == (2, 64, 2) and torch.isfinite(p.loc).all()
    assert p.loc.dtype == p.scale.dtype == torch.float64  # as a classifier's probabilities
    assert math.isfinite(p.evaluate()["nll"])


def test_learned_noise_is_one_point_estimate_per_output_saved_with_the_model(tmp_path):
    model = batchensemble(nn.Linear(3, 2), 3, likelihood=Gaussian("learned"))
    x, y = _data(d_out=2)
    fit(model, None, ArrayLoader(x, y, 16, seed=0), epochs=2, progress=False, seed=0)
    raw = model.likelihood.raw_scale
    assert raw.shape == (2,) and any(p is raw for p in model.parameters())
    assert not torch.allclose(torch.nn.functional.softplus(raw), torch.ones(2))  # trained
    saved = load(save(tmp_path / "be.pt", model), module=nn.Linear(3, 2))
    assert torch.equal(saved.model.likelihood.raw_scale, raw)
    p = predict(model, x)
    assert p.loc.shape == (3, 64, 2)
    assert torch.allclose(p.scale[:, :, 1], torch.nn.functional.softplus(raw[1]).expand(3, 64))


def test_default_kl_weight_follows_the_likelihood():
    x, y = _data()
    classifier = bayesian(nn.Linear(3, 2))
    result = fit(classifier, mean_field_guide(classifier), [(x, (y > 0).long())], epochs=1,
                 num_data=64, progress=False)  # fmt: skip
    assert result.kl_weight == 0.02
    regressor = bayesian(nn.Linear(3, 1), likelihood="gaussian")
    result = fit(regressor, mean_field_guide(regressor), ArrayLoader(x, y, 32, seed=0),
                 epochs=1, progress=False)  # fmt: skip
    assert result.kl_weight == 1.0
    assert regressor.likelihood.fixed == 0.5  # "gaussian" is Gaussian(scale=0.5)


def test_to_inference_data_and_psis_for_a_latent_noise():
    x, y = _data(n=40)
    model = bayesian(nn.Linear(3, 1), likelihood=Gaussian(dist.HalfNormal(1.0)))
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, 40, seed=0), epochs=800, progress=False, seed=0)
    idata = to_inference_data(model, guide, x, y, num_samples=30)
    assert idata.posterior["sigma"].dims == ("chain", "draw")
    assert idata.posterior_predictive["loc"].dims == ("chain", "draw", "obs_id", "output")
    assert idata.log_likelihood["obs"].shape == (1, 30, 40)
    assert float(idata.posterior["sigma"].mean()) == pytest.approx(0.1, abs=0.05)
    # the pointwise log-likelihood is the Normal's, with each draw's own noise
    draw0 = idata.posterior_predictive
    loc, scale = (
        torch.tensor(draw0["loc"].values[0, 0, :, 0]),
        torch.tensor(draw0["scale"].values[0, 0, :, 0]),
    )
    expected = torch.distributions.Normal(loc.double(), scale.double()).log_prob(y.double())
    assert torch.allclose(
        torch.tensor(idata.log_likelihood["obs"].values[0, 0]), expected, atol=1e-4
    )
    psis = psis_diagnostic(model, guide, x, y, num_samples=100)
    assert psis.log_weights.shape == (100,) and math.isfinite(psis.k_hat)


@pytest.mark.parametrize("d_out", [1, 2])
def test_to_inference_data_evaluates_a_regressor_in_batches(d_out):
    """More points than batch_size: every batch is checked against its own targets."""
    x, y = _data(n=40, d_out=d_out)
    model = bayesian(nn.Linear(3, d_out), likelihood="gaussian")
    guide = mean_field_guide(model)
    pyro.set_rng_seed(0)
    whole = to_inference_data(model, guide, x, y, num_samples=3)
    pyro.set_rng_seed(0)
    batched = to_inference_data(model, guide, x, y, num_samples=3, batch_size=16)
    pairs = [("log_likelihood", "obs")] + [("posterior_predictive", v) for v in ("loc", "scale")]
    for group, name in [*pairs, ("posterior_predictive", "obs")]:  # the same draws; float32
        # kernels may round differently for batches of 40 and 16 on some CPUs (1 ulp)
        np.testing.assert_allclose(
            whole[group][name].values, batched[group][name].values, rtol=1e-5, atol=1e-6
        )


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: _model()(torch.randn(4, 3), torch.arange(4)), ValueError,
         r"targets of dtype torch.int64, expected real values .*class labels belong to a "
         r"Categorical likelihood"),
        (lambda: _model()(torch.randn(4, 3), torch.tensor([0.0, math.nan, 1.0, 2.0])),
         ValueError, r"NaN or inf targets at rows \[1\]; remove or repair them"),
        (lambda: _model()(torch.randn(4, 3), torch.randn(4, 2)), ValueError,
         r"targets of shape \(4, 2\), expected \(N, 1\) or \(N,\) for a network with 1 output"),
        (lambda: bayesian(nn.Linear(3, 2), likelihood="gaussian")(
            torch.randn(4, 3), torch.randn(4)), ValueError,
         r"targets of shape \(4,\), expected \(N, 2\) for a network with 2 output\(s\) \(if it "
         r"outputs a mean and a scale per target, pass likelihood=Gaussian\(scale='heteros"),
        (lambda: Gaussian(scale=0.0), ValueError,
         r"Expected the Gaussian noise scale > 0 \(a finite float\), got 0.0"),
        (lambda: Gaussian(scale=-1.0), ValueError, r"got -1.0. Pass the noise standard dev"),
        (lambda: Gaussian(scale="fixed"), ValueError,
         r"Unknown noise scale 'fixed': expected a float > 0, 'learned', 'heteroscedastic'"),
        (lambda: Gaussian(scale=dist.Normal(0.0, 1.0)), ValueError,
         r"Expected a noise prior with positive support \(HalfNormal, LogNormal"),
        # bounded priors are fine for mcmc(), but not for the mean-field guide: infinite KL
        (lambda: mean_field_guide(bayesian(nn.Linear(3, 1), likelihood=Gaussian(
            dist.Uniform(0.1, 2.0)))), ValueError,
         r"the prior of site 'sigma' \(Uniform\) has support.* the guide fits a Normal \(on the "
         r"real line\) or a LogNormal \(on \(0, inf\)\), whose KL to a prior with other bounds "
         r"is infinite"),
        (lambda: mean_field_guide(bayesian(nn.Linear(3, 1), likelihood=Gaussian(
            dist.Pareto(1.0, 2.0)))), ValueError, r"the prior of site 'sigma' \(Pareto\)"),
        (lambda: mean_field_guide(bayesian(nn.Linear(3, 1), prior=dist.Uniform(-1.0, 1.0))),
         ValueError, r"the prior of site 'weight' \(Uniform\).*or sample it by mcmc\(\)"),
        (lambda: bayesian(nn.Linear(3, 1), likelihood=Gaussian(dist.HalfNormal(torch.ones(3))))(
            torch.randn(4, 3), torch.randn(4)), ValueError,
         r"the noise prior has batch shape \(3,\), expected \(\) \(one noise for all "
         r"outputs\) or \(1,\) \(one per output\) for a network with 1 output\(s\)"),
        # targets (N,) of 2 outputs: told first (it was "build the prior with (2,)", which then
        # failed on the targets)
        (lambda: bayesian(nn.Linear(3, 2), likelihood=Gaussian(dist.HalfNormal(torch.ones(1))))(
            torch.randn(4, 3), torch.randn(4)), ValueError,
         r"targets of shape \(4,\), expected \(N, 2\) for a network with 2 output\(s\) \(if it "
         r"outputs a mean and a scale per target, pass likelihood=Gaussian\(scale='heteros"),
        (lambda: fit(*(lambda m: (m, mean_field_guide(m)))(bayesian(nn.Linear(3, 2), likelihood=(
            Gaussian(dist.HalfNormal(torch.ones(1)))))), ArrayLoader(torch.randn(8, 3),
         torch.randn(8), 4), epochs=1, progress=False), ValueError,
         r"^train_loader has targets of shape \(8,\), expected \(N, 2\) .*heteroscedastic"),
        (lambda: batchensemble(nn.Linear(3, 1), 2, likelihood=Gaussian(dist.HalfNormal(1.0))),
         ValueError, r"batchensemble\(\) got a likelihood whose noise is a latent site "
         r"\(\['sigma'\], .*Use Gaussian\('learned'\) .*or rank1\(module, M, likelihood=...\)"),
        (lambda: bayesian(nn.Linear(3, 3), likelihood=Gaussian("heteroscedastic"))(
            torch.randn(4, 3), torch.randn(4)), ValueError,
         r"needs a network with 2D outputs \(D means, then D raw scales\), got 3 outputs"),
        (lambda: fit(_model(), None, ArrayLoader(torch.randn(8, 3), torch.randn(8)), epochs=1),
         ValueError, r"has latent sites but guide is None"),
        (lambda: fit(*(lambda m: (m, mean_field_guide(m)))(_model()), [(torch.randn(4, 3),
         torch.arange(4))], epochs=1, num_data=4, progress=False), ValueError,
         r"Batch 1 of epoch 1 has targets of dtype torch.int64, expected real values"),
        (lambda: ArrayLoader(torch.randn(4, 3), torch.ones(4, dtype=torch.bool)), TypeError,
         r"ArrayLoader: expected floating-point or integer y, got dtype torch.bool"),
        (lambda: Standardizer.fit(torch.randn(5, 3), torch.randn(5)).transform_x(
            torch.randn(4, 4)), ValueError, r"Standardizer.transform_x\(\): expected x of shape "
         r"\(N, 3\) as in fit\(\) \(rows of the columns it was fitted on\), got shape \(4, 4\)"),
        (lambda: Standardizer.fit(torch.randn(5, 3), torch.randn(5, 2)).transform_y(
            torch.randn(4)), ValueError, r"expected y of shape \(N, 2\) as in fit\(\)"),
        (lambda: Standardizer.fit(torch.randn(5, 3), torch.arange(5)), TypeError,
         r"Standardizer.fit\(\): expected floating-point y, got dtype torch.int64"),
        (lambda: ArrayLoader(torch.randn(4, 3), torch.randn(4), seed=1.7), ValueError,
         r"ArrayLoader: expected seed to be an integer in \[0, 2\*\*32 - 1\], got 1.7"),
        (lambda: train_test_split(torch.randn(4, 3), torch.randn(4), seed=None), ValueError,
         r"train_test_split\(\): expected seed to be an integer .*got None"),
        (lambda: train_test_split(torch.randn(1, 3), torch.randn(1), test_fraction=0.5),
         ValueError, r"test_fraction=0.5 of 1 row leaves 0 test and 1 training rows"),
        (lambda: train_test_split(torch.randn(4, 3), torch.randn(4), test_fraction=1.5),
         ValueError, r"Expected test_fraction in \(0, 1\), got 1.5"),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1).double()),
         ValueError, r"Expected loc and scale of one dtype on one device, got torch.float32 on "
         r"cpu and torch.float64 on cpu .*pass scale.to\(loc\) or loc.to\(scale\)\."),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 1), -torch.ones(2, 3, 1)), ValueError,
         r"Expected scale > 0 everywhere"),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1)).evaluate(
            torch.arange(3)), TypeError, r"Expected real targets \(a floating dtype\), got "
         r"torch.int64"),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1)).quantile(1.0),
         ValueError, r"Expected a quantile level in \(0, 1\), got 1.0"),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 2), torch.ones(2, 3, 2)).cdf(
            torch.zeros(3)), ValueError, r"Expected cdf values of shape \(3, 2\), one per "
         r"input and output, or one number, got shape \(3,\)"),
        (lambda: plot_regression(torch.zeros(2, 3, 1), torch.zeros(3)), TypeError,
         r"plot_regression\(\) expects GaussianPredictions"),
        (lambda: plot_calibration(Predictions(torch.full((2, 3, 2), 0.5)), torch.zeros(3)),
         TypeError, r"plot_calibration\(\) expects GaussianPredictions .*got Predictions \(a "
         r"classifier's class probabilities\): plot them with plot_reliability\(\), "
         r"plot_risk_coverage\(\), .*plot_image_grid\(\)\.$"),
        (lambda: Standardizer.fit(torch.randn(5, 3), torch.randn(5)).inverse(
            GaussianPredictions(torch.zeros(2, 3, 2), torch.ones(2, 3, 2))), ValueError,
         r"Standardizer.inverse\(\): the predictions have 2 output\(s\), the scaler was "
         r"fitted on targets of 1 column\(s\)"),
        (lambda: mixture_crps(torch.zeros(4, 3, 1), torch.ones(4, 3, 1), torch.zeros(2)),
         ValueError, r"mixture_crps\(\): expected y of shape \(3, 1\) \(N, D\), one target "
         r"per input and output, as loc's \(4, 3, 1\), got \(2,\)"),
        (lambda: mixture_crps(torch.zeros(4, 3, 1), torch.ones(4, 3), torch.zeros(3)),
         ValueError, r"expected loc and scale of one shape \(S, N, D\), or \(S, N\) for one "
         r"output, got \(4, 3, 1\) and \(4, 3\)"),
        (lambda: train_test_split(torch.randn(4, 3), torch.randn(4),
                                  test_fraction=torch.tensor(0.5)), ValueError,
         r"got tensor\(0.5000\) \(a tensor: pass a Python number"),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1)).quantile([0.5]),
         TypeError, r"Expected a quantile level in \(0, 1\), one number, got list; e.g. 0.9"),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1)).interval("0.9"),
         TypeError, r"Expected an interval level in \(0, 1\), one number, got str \(a string: "
         r"pass a float, level=0.9\); e.g. 0.9"),
        (lambda: GaussianPredictions(np.zeros((2, 3, 1)), np.ones((2, 3, 1))), TypeError,
         r"Expected loc to be a floating torch.Tensor \(S, N, D\), got ndarray; pass "
         r"torch.as_tensor\(loc\).float\(\)"),
        (lambda: GaussianPredictions(torch.zeros(2, 3, 1), torch.tensor([1.0, 0.0, -2.0]).expand(
            2, 3).unsqueeze(-1)), ValueError, r"got 4 value\(s\) <= 0, the smallest -2\. Pass "
         r"standard deviations \(not log-scales\)"),
        (lambda: mixture_crps(torch.zeros(4, 3), -torch.ones(4, 3), torch.zeros(3)), ValueError,
         r"mixture_crps\(\): expected scale >= 0 \(standard deviations; 0 for point "
         r"predictions\), got 12 value\(s\) below 0 or NaN, e.g. -1"),
        (lambda: ArrayLoader(torch.randn(4, 3), torch.randn(4, device="meta")), ValueError,
         r"ArrayLoader: x is on cpu and y on meta; their rows are picked by one index, so they "
         r"must be on one device: pass y.to\(x.device\)"),
        (lambda: train_test_split(torch.randn(4, 3, device="meta"), torch.randn(4)), ValueError,
         r"train_test_split\(\): x is on meta and y on cpu"),
        (lambda: Standardizer.fit(torch.randn(5, 3), torch.randn(5)).transform_x(
            torch.zeros(4, 3, dtype=torch.long)), TypeError, r"Standardizer.transform_x\(\): "
         r"expected a floating-point tensor, got torch.int64; the scaler was fitted on real "
         r"values: pass x.float\(\)"),
        (lambda: _learned_for(2).loc_scale(torch.zeros(4, 3)), ValueError,
         r"Gaussian: Gaussian\('learned'\) holds 2 noise scale\(s\), one per output of the "
         r"network it was first called on, got a network with 3 output\(s\)"),
    ],
)  # fmt: skip
def test_regression_refuses_bad_input(call, error, pattern):
    with pytest.raises(error) as info:
        call()
    assert re.search(pattern, str(info.value)), str(info.value)


def _model():
    return bayesian(nn.Linear(3, 1), likelihood=Gaussian(0.5), num_data=4)


def _learned_for(d):
    likelihood = Gaussian("learned")
    likelihood.prepare(torch.zeros(1, d))
    return likelihood


# -- tabular helpers and plots ---------------------------------------------------------------


def test_split_standardise_and_loader():
    x = torch.arange(20.0).reshape(10, 2)
    y = torch.arange(10.0) * 3 + 5
    tx, ty, vx, vy = train_test_split(x, y, test_fraction=0.3, seed=1)
    assert (tx.shape[0], vx.shape[0]) == (7, 3)
    assert sorted(torch.cat([ty, vy]).tolist()) == y.tolist()
    again = train_test_split(x, y, test_fraction=0.3, seed=1)
    assert torch.equal(again[0], tx)
    scaler = Standardizer.fit(tx, ty)
    sx, sy = scaler.transform(tx, ty)
    assert torch.allclose(sx.mean(0), torch.zeros(2), atol=1e-6)
    assert torch.allclose(sy.std(), torch.tensor(1.0))
    p = GaussianPredictions(sy[None, :, None], torch.ones(1, 7, 1), sy)
    back = scaler.inverse(p)
    assert torch.allclose(back.mean[:, 0], ty) and torch.allclose(back.targets[:, 0], ty)
    loader = ArrayLoader(sx, sy, 3, seed=0)
    state = loader.get_rng_state()
    first = [yb.tolist() for _, yb in loader]
    loader.set_rng_state(state)
    assert [yb.tolist() for _, yb in loader] == first and len(loader) == 3
    assert sorted(v for batch in first for v in batch) == sorted(sy.tolist())


def test_plots_draw_the_bands_and_the_calibration_curve():
    p, *_ = _mixture(n=20, d=1)
    x = torch.linspace(-1, 1, 20)
    fig = plot_regression(p, x, train_x=x[:5], train_y=p.targets[:5])
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert set(labels) == {
        "predictive mean",
        "training data",
        "aleatoric (+-2 sd)",
        "epistemic (+-2 sd)",
    }
    plt.close(fig)
    fig = plot_calibration(p)
    error = p.evaluate()["calibration_error"]
    assert fig.axes[0].get_title() == f"Quantile calibration (error {error:.4f})"
    plt.close(fig)


def test_array_loader_takes_token_ids_and_class_labels():
    # integer inputs (an embedding's token ids) and labels: a tabular classifier trains on it
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 6, (24, 3), generator=g)
    labels = (tokens[:, 0] >= 3).long()
    net = nn.Sequential(nn.Embedding(6, 4), nn.Flatten(), nn.Linear(12, 2))
    model = bayesian(net)
    guide = mean_field_guide(model)
    loader = ArrayLoader(tokens, labels, 8, seed=0)
    assert next(iter(loader))[0].dtype == torch.int64
    result = fit(model, guide, loader, epochs=2, progress=False, seed=0)
    assert math.isfinite(result.history[-1].loss)
    assert predict(model, loader, guide, num_samples=2, progress=False).probs.shape == (2, 24, 2)


def test_a_gaussian_likelihood_shows_its_noise_prior():
    assert repr(Gaussian(0.3)) == "Gaussian(scale=0.3)"
    per_output = repr(Gaussian(dist.HalfNormal(torch.tensor([1.0, 2.0]))))
    assert "scale=HalfNormal(scale=[1, 2])" in per_output  # a few values: all shown
    wide = repr(Gaussian(dist.HalfNormal(torch.ones(20))))
    assert "scale=HalfNormal(scale=tensor of shape (20,))" in wide


def test_posterior_samples_of_the_noise_must_be_positive():
    model = bayesian(nn.Linear(3, 1), likelihood=Gaussian(dist.HalfNormal(1.0)))
    draws = {"weight": torch.zeros(2, 1, 3), "bias": torch.zeros(2, 1), "sigma": torch.tensor(
        [0.5, -0.3])}  # fmt: skip
    with pytest.raises(ValueError, match=r"predict\(\): the draws of 'sigma' from "
                       r"posterior_samples must be > 0 \(a noise standard deviation\), got a "
                       r"minimum of -0.3"):  # fmt: skip
        predict(model, torch.randn(4, 3), posterior_samples=draws)
    draws["sigma"] = draws["sigma"].abs()
    assert predict(model, torch.randn(4, 3), posterior_samples=draws).scale.shape == (2, 4, 1)


def test_a_learned_noise_model_runs_under_plain_pyro_svi_before_fit():
    """A fresh model's learned noise scale has no shape until it sees outputs; calling the
    model, or stepping Pyro's own SVI on it, creates it and trains it with the rest."""
    import pyro

    from pyrouq import batchensemble, bayesian, mean_field_guide

    x, y = torch.randn(8, 3), torch.randn(8)
    for kind in ("bayesian", "batchensemble"):
        pyro.clear_param_store()
        if kind == "bayesian":
            model = bayesian(nn.Linear(3, 1), likelihood=Gaussian("learned"), num_data=8)
            guide = mean_field_guide(model)
        else:
            model = batchensemble(nn.Linear(3, 1), 2, likelihood=Gaussian("learned"))
            model.num_data = 8

            def guide(x, y):
                return None

        svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.1}), pyro.infer.Trace_ELBO())
        svi.step(x, y)
        start = model.likelihood.raw_scale.detach().clone()
        assert start.shape == (1,)
        svi.step(x, y)
        assert not torch.equal(model.likelihood.raw_scale.detach(), start), kind


def test_float32_predictions_are_evaluated_with_float64_moments():
    """A float32 mean of values near 1000 is off by about 6e-5, which an RMSE of 0.01 feels;
    evaluate() and the conformal scores take the moments in float64."""
    g = torch.Generator().manual_seed(0)
    loc = 1000 + 0.01 * torch.randn(8, 500, 1, generator=g)
    scale = torch.full_like(loc, 0.01)
    y = 1000 + 0.01 * torch.randn(500, 1, generator=g)
    narrow, wide = (
        GaussianPredictions(loc, scale, y),
        GaussianPredictions(loc.double(), scale.double(), y.double()),
    )
    assert narrow.double().loc.dtype == torch.float64
    assert narrow.evaluate()["rmse"] == pytest.approx(wide.evaluate()["rmse"], rel=1e-9)
    assert narrow.evaluate()["mae"] == pytest.approx(wide.evaluate()["mae"], rel=1e-9)


def test_a_fixed_noise_scale_may_be_any_one_number():
    """Gaussian(scale) takes a float, a numpy scalar or a tensor of one value (a rescaled noise
    such as noise / scaler.y_std is a 0-d tensor), each as the float it holds."""
    import numpy as np

    quarter = (0.25, np.float32(0.25), np.array(0.25), torch.tensor(0.25), torch.tensor([0.25]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a tensor that requires grad is read detached
        for scale in (*quarter, torch.tensor(0.25, requires_grad=True)):
            likelihood = Gaussian(scale)
            assert likelihood.fixed == 0.25 and isinstance(likelihood.fixed, float)
    assert Gaussian(torch.tensor(2)).fixed == 2.0
    with pytest.raises(ValueError, match=r"got -0\.25"):
        Gaussian(torch.tensor(-0.25))


def test_a_learned_scale_converts_under_torchs_swapping_conversions():
    """bayesian() moves a likelihood to its network's device only when a tensor of it is
    elsewhere: a learned scale, uninitialised until the first outputs, cannot be swapped by
    torch.__future__.set_swap_module_params_on_conversion(True)."""
    keep = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model = bayesian(nn.Linear(3, 2), likelihood=Gaussian("learned"))
    finally:
        torch.__future__.set_swap_module_params_on_conversion(keep)
    preds = predict(model, torch.randn(4, 3), mean_field_guide(model), num_samples=2,
                    progress=False)  # fmt: skip
    assert preds.loc.shape == (2, 4, 2)


def test_crps_takes_targets_of_one_output_as_a_column_and_split_takes_numpy_fractions():
    loc, scale = torch.randn(4, 3, 1), torch.rand(4, 3, 1) + 0.1
    y = torch.randn(3)
    assert torch.equal(mixture_crps(loc, scale, y), mixture_crps(loc, scale, y[:, None]))
    assert torch.equal(
        mixture_crps(loc[..., 0], scale[..., 0], y), mixture_crps(loc, scale, y)[:, 0]
    )
    x = torch.arange(20.0).reshape(10, 2)
    ours = train_test_split(x, x[:, 0], test_fraction=np.float32(0.3), seed=1)
    plain = train_test_split(x, x[:, 0], test_fraction=0.3, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))
