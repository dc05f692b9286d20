"""Audit 6 of regression: quantiles where the mixture's CDF rounds to k / S, the CRPS of
infinite components, conformal thresholds fitted on predictions that require grad, and a
conformal lower bound of 0."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats

from pyrouq import GaussianPredictions, conformal, coverage
from pyrouq.calibration import ConformalRegressor
from pyrouq.regression import mixture_crps


def _preds(locs: list[float], scales: list[float]) -> GaussianPredictions:
    loc = torch.tensor(locs, dtype=torch.float64).view(-1, 1, 1)
    return GaussianPredictions(loc, torch.tensor(scales, dtype=torch.float64).view(-1, 1, 1))


def test_a_quantile_where_the_cdf_rounds_to_k_over_s_is_the_true_one():
    # F(x) = (Phi(x) + Phi(x - 100)) / 2 reads 0.5 in float64 from 8.29 to 91.7; the median is
    # 50 by symmetry (was 8.29, the left end of the stretch)
    assert _preds([0.0, 100.0], [1.0, 1.0]).quantile(0.5).item() == pytest.approx(50.0, abs=1e-9)
    # Phi(-x) = Phi((x - 100) / 2): x = 100 / 3 (the tails underflow there: compared in logs)
    median = _preds([0.0, 100.0], [1.0, 2.0]).quantile(0.5).item()
    assert median == pytest.approx(100 / 3, abs=1e-9)
    # four members around 15: the central 50 % interval is [5, 25] (was [4.15, 24.05])
    lo, hi = _preds([0.0, 10.0, 20.0, 30.0], [0.5] * 4).interval(0.5)
    assert (lo.item(), hi.item()) == pytest.approx((5.0, 25.0), abs=1e-9)


def test_quantiles_match_scipy_bisection_on_the_mixture_cdf():
    g = torch.Generator().manual_seed(0)
    loc = 2 * torch.randn(5, 4, 2, generator=g, dtype=torch.float64)
    scale = torch.rand(5, 4, 2, generator=g, dtype=torch.float64) + 0.2
    preds = GaussianPredictions(loc.float(), scale.float())  # float32 in, float64 out
    m, s = preds.loc.double().numpy(), preds.scale.double().numpy()
    for level in (0.01, 0.2, 0.4, 0.5, 0.975):
        ours = preds.quantile(level).numpy()
        for n in range(4):
            for d in range(2):

                def gap(t: float, n: int = n, d: int = d, level: float = level) -> float:
                    return float(stats.norm.cdf(t, m[:, n, d], s[:, n, d]).mean()) - level

                ref = optimize.brentq(gap, -60, 60, xtol=1e-14)
                assert ours[n, d] == pytest.approx(ref, abs=1e-10)


def test_mixture_crps_matches_the_integral_and_is_inf_for_infinite_components():
    g = torch.Generator().manual_seed(1)
    loc = torch.randn(3, 2, generator=g, dtype=torch.float64)
    scale = torch.rand(3, 2, generator=g, dtype=torch.float64) + 0.3
    y = torch.tensor([0.4, -1.5], dtype=torch.float64)
    ours = mixture_crps(loc, scale, y)
    for n in range(2):
        m, s, t = loc[:, n].numpy(), scale[:, n].numpy(), float(y[n])

        def cdf(x: float, m: np.ndarray = m, s: np.ndarray = s) -> float:
            return float(stats.norm.cdf(x, m, s).mean())

        below = integrate.quad(lambda x: cdf(x) ** 2, -40, t, epsabs=1e-13)[0]
        above = integrate.quad(lambda x: (1 - cdf(x)) ** 2, t, 40, epsabs=1e-13)[0]
        assert float(ours[n]) == pytest.approx(below + above, abs=1e-9)
    # the CRPS grows with the scale (0.234 sigma for one Gaussian at its mean): its limit is
    # inf, and so it is for an infinite mean or target (was NaN: inf - inf)
    inf = math.inf
    assert (
        mixture_crps(
            torch.tensor([[0.0], [0.0]]), torch.tensor([[1.0], [inf]]), torch.zeros(1)
        ).item()
        == inf
    )
    assert mixture_crps(torch.tensor([[inf]]), torch.ones(1, 1), torch.zeros(1)).item() == inf
    assert mixture_crps(torch.zeros(1, 1), torch.ones(1, 1), torch.tensor([-inf])).item() == inf
    # one Gaussian at its mean: (2 - sqrt 2) / sqrt(2 pi); an infinite target beside it: inf
    finite = mixture_crps(torch.zeros(1, 2, 1), torch.ones(1, 2, 1), torch.tensor([0.0, inf]))
    assert finite[0].item() == pytest.approx((2 - math.sqrt(2)) / math.sqrt(2 * math.pi), abs=1e-12)
    assert finite[1].item() == inf


def test_mixture_crps_refuses_nan_means_and_targets_and_a_bad_chunk():
    loc, scale, y = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3)
    with pytest.raises(ValueError, match=r"y holds 1 NaN value\(s\); remove or repair"):
        mixture_crps(loc, scale, torch.tensor([0.0, math.nan, 1.0]))
    with pytest.raises(ValueError, match=r"loc holds 2 NaN value\(s\)"):
        mixture_crps(torch.tensor([[0.0, math.nan, 0.0], [math.nan, 0.0, 0.0]]), scale, y)
    for chunk in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"expected chunk, .* an int >= 1, got"):
            mixture_crps(loc, scale, y, chunk=chunk)  # type: ignore[arg-type]
    assert torch.equal(mixture_crps(loc, scale, y, chunk=np.int64(1)), mixture_crps(loc, scale, y))


def test_a_conformal_threshold_fitted_on_predictions_with_grad_has_no_graph():
    g = torch.Generator().manual_seed(2)
    loc = torch.randn(3, 20, 1, generator=g).requires_grad_()
    preds = GaussianPredictions(loc, torch.ones(3, 20, 1), torch.randn(20, generator=g))
    for score in ("abs", "cqr"):
        predictor = conformal(preds, alpha=0.1, score=score)
        assert not predictor.threshold.requires_grad and predictor.threshold.grad_fn is None
        assert copy.deepcopy(predictor) == predictor  # was refused: not a graph leaf
    by_hand = ConformalRegressor("abs", 0.1, torch.ones(1, requires_grad=True))
    assert not by_hand.threshold.requires_grad


def test_a_conformal_lower_bound_of_zero_is_plus_zero():
    preds = GaussianPredictions(torch.zeros(1, 2, 1), torch.ones(1, 2, 1))
    lo, hi = ConformalRegressor("abs", 0.1, torch.zeros(1)).intervals(preds)
    assert not bool(torch.signbit(lo).any()) and str(lo[0, 0].item()) == "0.0"  # was -0.0
    assert hi.tolist() == [[0.0], [0.0]]


def test_conformal_intervals_cover_at_least_one_minus_alpha_over_random_splits():
    # a misspecified model (biased means, too-small constant scale, heteroscedastic truth):
    # over 200 splits of 100 / 300 the mean coverage is ceil(101 * 0.9) / 101 = 0.901
    g = torch.Generator().manual_seed(3)
    covered: dict[str, list[float]] = {"abs": [], "cqr": []}
    for _ in range(200):
        x = 4 * torch.rand(400, generator=g, dtype=torch.float64) - 2
        y = torch.sin(x) + (0.1 + 0.5 * x.abs()) * torch.randn(
            400, generator=g, dtype=torch.float64
        )
        loc = (torch.sin(x) + 0.1)[None, :, None] + 0.05 * torch.randn(
            3, 400, 1, generator=g, dtype=torch.float64
        )
        preds = GaussianPredictions(loc.float(), torch.full((3, 400, 1), 0.2), y.float())
        cal, test = torch.randperm(400, generator=g).split([100, 300])
        val = GaussianPredictions(preds.loc[:, cal], preds.scale[:, cal], preds.targets[cal])
        new = GaussianPredictions(preds.loc[:, test], preds.scale[:, test], preds.targets[test])
        for score, values in covered.items():
            values.append(
                coverage(conformal(val, alpha=0.1, score=score).intervals(new), new.targets)
            )
    for values in covered.values():
        mean, se = float(np.mean(values)), float(np.std(values) / math.sqrt(len(values)))
        assert mean > 0.9 - 3 * se and mean < 0.901 + 3 * se


@pytest.mark.parametrize(("size", "level"), [(20, 0.9), (40, 0.95), (100, 0.9)])
def test_an_interval_whose_lower_level_rounds_below_k_over_s_stays_symmetric(size, level):
    # (1 - 0.9) / 2 * 20 is 0.9999999999999998, not 1: the lower end slid to the edge of the
    # flat CDF (-91.87 against the upper end's 50.03)
    k = round((1 - level) / 2 * size)  # members at -100 and at 100, the rest at 0
    loc = torch.tensor([-100.0] * k + [0.0] * (size - 2 * k) + [100.0] * k).reshape(-1, 1, 1)
    lower, upper = GaussianPredictions(loc, torch.ones_like(loc)).interval(level)
    assert float(upper) == pytest.approx(50.0, abs=0.05)
    assert float(lower) == pytest.approx(-float(upper), abs=1e-9)


@pytest.mark.parametrize("scale", [1e-3, 1e-155, 1e-300])
def test_the_median_of_two_point_like_components_is_their_midpoint_at_any_scale(scale):
    # below ~1e-154 both tails' logs were -inf and the median jumped (0.19 at 1e-155, ~0 below)
    loc = torch.tensor([0.0, 1.0], dtype=torch.float64).reshape(2, 1, 1)
    median = GaussianPredictions(loc, torch.full_like(loc, scale)).quantile(0.5)
    assert float(median) == pytest.approx(0.5, abs=1e-12)


@pytest.mark.parametrize("level", [1e-300, 1e-16, 2e-16, 1 - 1e-16, 1 - 1e-15])
def test_a_level_near_0_or_1_is_a_tail_quantile_not_a_tie(level):
    # the k/S snapping took these for k = 0 or S and returned the bracket's edge, +-40
    loc = torch.zeros(1, 1, 1, dtype=torch.float64)
    q = GaussianPredictions(loc, torch.ones_like(loc)).quantile(level)
    assert float(q) == pytest.approx(stats.norm.ppf(level), rel=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_mean_of_identical_draws_is_their_value_and_covers_itself(dtype):
    # the sum over 7 draws / 7 was an ulp off the draw for about half of these values, and a
    # target equal to the mean fell outside the point masses' width-0 intervals [draw, draw]
    value = 10 * torch.randn(200, 1, generator=torch.Generator().manual_seed(0), dtype=dtype)
    loc = value.expand(7, 200, 1).clone().requires_grad_()
    tiny = 1e-300 if dtype == torch.float64 else 1e-45  # point masses: scales of ~0
    preds = GaussianPredictions(loc, torch.full_like(loc, tiny))
    assert torch.equal(preds.mean, value)
    scores = preds.evaluate(preds.mean.detach())
    assert (scores["coverage_50"], scores["coverage_90"], scores["width_90"]) == (1.0, 1.0, 0.0)
    assert scores["rmse"] == 0.0  # (float64: 1.3e-15)
    preds.mean.sum().backward()  # the gradient is the mean's own: 1 / S per draw
    assert torch.equal(loc.grad, torch.full_like(loc, 1 / 7))


def test_abs_intervals_of_float64_point_masses_hold_their_mean_with_width_0():
    # scales below ~1e-154 square to a stddev of 0: the scores of targets at the mean were
    # 0 / 0 (conformal() refused the NaN threshold) and every interval came out empty, lo > hi
    loc = torch.tensor([[[-1.5], [0.0], [2.0]]] * 3, dtype=torch.float64)
    preds = GaussianPredictions(loc, torch.full_like(loc, 1e-300), loc[0])
    assert float(preds.double().stddev.max()) == 0.0
    predictor = conformal(preds, alpha=0.5, score="abs")
    assert predictor.threshold.tolist() == [0.0]
    for threshold in (0.0, 1.5):
        lo, hi = ConformalRegressor("abs", 0.2, torch.tensor([threshold])).intervals(preds)
        assert lo.tolist() == hi.tolist() == [[-1.5], [0.0], [2.0]]
        assert coverage((lo, hi), preds.targets) == 1.0


def test_the_mean_of_finite_draws_whose_sum_overflows_is_finite():
    # float32 draws of 3e38: their sum overflows to inf, and keeping the mean within the draws'
    # range computed inf + (3e38 - inf), NaN (before that: inf); the mean is their value
    loc = torch.full((2, 3, 1), 3e38).requires_grad_()
    preds = GaussianPredictions(loc, torch.ones_like(loc))
    assert torch.equal(preds.mean, torch.full((3, 1), 3e38))
    preds.mean.sum().backward()  # the mean's gradient, 1 / S per draw
    assert torch.equal(loc.grad, torch.full_like(loc, 0.5))
    # only the outputs whose mean overflows take the fallback: another output's mean is
    # loc.mean(0) to the last bit (the sum of each / 3 is an ulp below it here)
    small = torch.tensor([0.49625658988952637, 0.7682217955589294, 0.08847743272781372])
    loc = torch.stack([torch.full((3,), 3e38), small], -1)[:, None]  # (3, 1, 2)
    mean = GaussianPredictions(loc, torch.ones_like(loc)).mean
    assert mean[0, 0] == 3e38 and mean[0, 1] == small.mean() != (small / 3).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_crps_in_reused_buffers_is_the_one_on_fresh_temporaries_to_the_bit(dtype):
    # without a graph every chunk's pair term works in one set of buffers (a last, shorter
    # chunk in their first part; point masses; an infinite component): the graph's values
    g = torch.Generator().manual_seed(4)
    for s, n, d, chunk in ((1, 4, 1, 1024), (3, 11, 2, 4), (7, 9, 1, 2)):
        loc = (3 * torch.randn(s, n, d, generator=g, dtype=torch.float64)).to(dtype)
        scale = torch.rand(s, n, d, generator=g, dtype=torch.float64).to(dtype)
        scale[:, ::3] = 0.0
        loc[0, 1, 0] = math.inf
        y = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
        fresh = mixture_crps(loc.requires_grad_(), scale, y, chunk).detach()
        reused = mixture_crps(loc.detach(), scale, y, chunk)
        assert fresh[1, 0] == math.inf and torch.equal(reused, fresh)


def _reference_gap(loc, spread, value, target):  # the sign formula, fresh temporaries each step
    w = (value - loc) / spread
    upper = w > 0
    tail = torch.erfc(w.abs())
    return upper.sum(0, dtype=w.dtype) - target + 0.5 * torch.where(upper, -tail, tail).sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quantiles_in_reused_buffers_are_the_bisection_on_the_formula_to_the_bit(dtype):
    # the bisection's 64 steps share two (S, N, D) float64 buffers, and spread is taken in
    # place in scale's own float64 copy: the same bits as the formula with fresh temporaries
    # (where the tails do not tie), and float64 predictions' scale left as it came
    g = torch.Generator().manual_seed(3)
    for s in (1, 2, 7):
        loc = (3 * torch.randn(s, 5, 3, generator=g, dtype=torch.float64)).to(dtype)
        if s == 1:  # the first step's mid is 0, at loc: w = +0 is not above (its tail: +1)
            loc = torch.zeros_like(loc)
        scale = (torch.rand(s, 5, 3, generator=g, dtype=torch.float64) + 0.05).to(dtype)
        kept = scale.clone()
        preds = GaussianPredictions(loc, scale)
        m, sd = loc.double(), scale.double()
        for level in (0.03, 0.5, 0.9):
            lo, hi = (m - 40 * sd).amin(0), (m + 40 * sd).amax(0)
            for _ in range(64):
                mid = 0.5 * (lo + hi)
                below = _reference_gap(m, sd * math.sqrt(2), mid, level * s) < 0
                lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
            assert torch.equal(preds.quantile(level), 0.5 * (lo + hi))
        assert torch.equal(preds.scale, kept)
    # the count of components below is exact past 255 (a uint8's top): 300 point-like
    # components at 0, 1, ..., 299, the 271.5th of them at 271
    loc = torch.arange(300.0, dtype=dtype).reshape(300, 1, 1)
    assert GaussianPredictions(loc, torch.full_like(loc, 1e-3)).quantile(0.905).item() == 271.0
