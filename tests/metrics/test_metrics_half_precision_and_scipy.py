"""Audit 12 of the metrics, the decompositions and their plots: half-precision Gaussian
predictions (their moments overflowed float16: a variance of inf), and the metrics against
independent references (scipy's Mann-Whitney U, the average precision by hand, the CRPS by
numerical integration, the law of total variance)."""

from __future__ import annotations

import math
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from scipy import integrate, stats

from pyrouq import metrics
from pyrouq.plotting import plot_regression, plot_reliability
from pyrouq.regression import GaussianPredictions, mixture_crps


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ---------------------------------------------------------------------------------------------
# Half-precision Gaussian predictions


def test_float16_predictions_decompose_a_variance_above_65504_without_overflow():
    """Two draws N(0, 300^2) and N(600, 300^2): aleatoric 300^2 = 90000, epistemic the
    variance of {0, 600} = 90000, total 180000; in float16 (largest 65504) each read inf."""
    loc = torch.tensor([[[0.0]], [[600.0]]], dtype=torch.float16)
    scale = torch.full((2, 1, 1), 300.0, dtype=torch.float16)
    preds = GaussianPredictions(loc, scale)
    parts = preds.uncertainty()
    assert parts.aleatoric.item() == 90000.0
    assert parts.epistemic.item() == 90000.0
    assert parts.total.item() == 180000.0
    assert preds.stddev.item() == pytest.approx(math.sqrt(180000.0), rel=1e-6)
    assert preds.loc.dtype == preds.scale.dtype == torch.float32


def test_float32_variances_are_finite_where_float32_holds_them_and_warned_of_where_not():
    """float32 scales of 1.9e19 square to inf (float32's largest number is 3.4e38): the mean
    square of input 0 (one such scale, three of 1) is 9.025e37 and read inf; input 1's
    variance, 3.61e38, is inf in float32 however computed: a warning names it and double()
    (it was a silent inf), and its stddev 1.9e19 is finite."""
    loc, scale = torch.zeros(4, 3, 1), torch.ones(4, 3, 1)
    scale[0, 0], scale[:, 1] = 1.9e19, 1.9e19
    preds = GaussianPredictions(loc, scale)
    wide = preds.double()
    words = (
        r"total variance is above torch.float32's largest number \(3.4e\+38\) at inputs "
        r"\[1\] \(1 of 3 inputs\): it is inf there .*preds.double\(\).uncertainty\(\)"
    )
    with pytest.warns(RuntimeWarning, match=words):
        parts = preds.uncertainty()
    total = wide.uncertainty().total
    assert total[1].item() == pytest.approx(1.9e19**2, rel=1e-6) and total[1] > 3.4029e38
    assert parts.total.dtype == parts.aleatoric.dtype == torch.float32
    assert parts.total.tolist() == [float(total[0].float()), math.inf, 1.0]
    assert parts.aleatoric.tolist() == parts.total.tolist() and parts.epistemic.tolist() == [0] * 3
    with pytest.warns(RuntimeWarning, match=r"GaussianPredictions' variance is above"):
        assert preds.variance[:, 0].tolist() == parts.total.tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # finite: no warning
        assert preds.stddev.dtype == torch.float32
        assert preds.stddev[:, 0].tolist() == wide.stddev.float()[:, 0].tolist()
        assert preds.stddev[1, 0].item() == pytest.approx(1.9e19, rel=1e-6)
    # the moments that came finite are kept to the bit (float32's own mean of squares, not one
    # recomputed in float64 and rounded, which differs here in its last bit)
    odd = torch.ones(4, 2, 1)
    odd[0, 0], odd[:, 1, 0] = 1.9e19, torch.tensor([1.60476756, 0.59640956, 1.97763515, 1.97067082])
    kept = GaussianPredictions(torch.zeros(4, 2, 1), odd).aleatoric_variance[1, 0]
    assert kept == odd.square().mean(0)[1, 0] != odd.double().square().mean(0)[1, 0].float()


def test_a_regression_plot_draws_float32_scales_whose_variance_float32_cannot_hold():
    # a band of scales of 1.9e19 (variances 3.6e38, inf in float32) is drawn from the float64
    # variances, whose roots are finite: no warning of an inf, a band 1.9e19 wide
    loc, scale = torch.zeros(2, 5, 1), torch.full((2, 5, 1), 1.9e19)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_regression(GaussianPredictions(loc, scale), torch.linspace(0, 1, 5))
    try:
        tops = [c.get_paths()[0].vertices[:, 1].max() for c in fig.axes[0].collections]
        assert max(tops) == pytest.approx(2 * 1.9e19, rel=1e-6)  # (num_sd=2)
    finally:
        plt.close(fig)


def test_bfloat16_predictions_have_the_moments_of_their_values_not_bfloat16_rounding():
    """The moments of the bfloat16 values themselves (exact in float64), not rounded to
    bfloat16's 8 bits: the variance of {100, 103, 105} is 38/9 = 4.2222, which bfloat16
    computed as 4.21875."""
    loc = torch.tensor([100.0, 103.0, 105.0], dtype=torch.bfloat16).view(3, 1, 1)
    scale = torch.tensor([0.3, 0.7, 1.1], dtype=torch.bfloat16).view(3, 1, 1)
    preds = GaussianPredictions(loc, scale)
    exact_epistemic = float(np.var(loc.double().flatten().numpy()))
    exact_aleatoric = float(np.mean(scale.double().flatten().numpy() ** 2))
    parts = preds.uncertainty()
    assert exact_epistemic == pytest.approx(38 / 9)
    assert parts.epistemic.item() == pytest.approx(exact_epistemic, rel=1e-6)
    assert parts.aleatoric.item() == pytest.approx(exact_aleatoric, rel=1e-6)
    assert preds.mean.item() == pytest.approx(308 / 3, rel=1e-6)


def test_the_bands_of_float16_predictions_are_drawn_at_their_width():
    """plot_regression of float16 predictions with a standard deviation of 300: the aleatoric
    band is mean +- 2 * 300 (it had an infinite half-width and was not drawn)."""
    loc = torch.tensor([[[10.0], [20.0]], [[10.0], [20.0]]], dtype=torch.float16)
    scale = torch.full((2, 2, 1), 300.0, dtype=torch.float16)
    fig = plot_regression(GaussianPredictions(loc, scale), torch.tensor([0.0, 1.0]))
    band = fig.axes[0].collections[0]
    assert band.get_label() == "aleatoric (+-2 sd)"
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(10.0 - 600.0)
    assert ys.max() == pytest.approx(20.0 + 600.0)


def test_half_loc_with_float32_scale_is_still_refused():
    loc = torch.zeros(1, 2, 1, dtype=torch.float16)
    with pytest.raises(ValueError, match="Expected loc and scale of one dtype on one device"):
        GaussianPredictions(loc, torch.ones(1, 2, 1))


# ---------------------------------------------------------------------------------------------
# Against independent references


def test_ood_auroc_is_scipys_mann_whitney_u_and_aupr_the_average_precision_by_hand():
    """Scores on a coarse grid (many ties, across and within the two sets)."""
    rng = np.random.default_rng(12)
    for _ in range(20):
        s_in = rng.integers(0, 5, size=int(rng.integers(2, 9))).astype(float)
        s_out = rng.integers(0, 5, size=int(rng.integers(2, 9))).astype(float)
        t_in, t_out = torch.tensor(s_in), torch.tensor(s_out)
        if len(set(s_in) | set(s_out)) > 1:
            u = stats.mannwhitneyu(s_out, s_in).statistic / (s_in.size * s_out.size)
            assert metrics.ood_auroc(t_in, t_out) == pytest.approx(u, abs=1e-12)
        scores = np.concatenate([s_in, s_out])
        is_out = np.r_[np.zeros(s_in.size), np.ones(s_out.size)]
        ap, recall_before = 0.0, 0.0
        for t in np.unique(scores)[::-1]:
            flagged = scores >= t
            recall = is_out[flagged].sum() / s_out.size
            ap += (recall - recall_before) * is_out[flagged].mean()
            recall_before = recall
        assert metrics.ood_aupr(t_in, t_out) == pytest.approx(ap, abs=1e-12)
        fpr = next(
            (s_in >= t).mean() for t in np.unique(scores)[::-1] if (s_out >= t).mean() >= 0.95
        )
        assert metrics.ood_fpr95(t_in, t_out) == pytest.approx(fpr, abs=1e-12)


def test_mixture_crps_is_the_integral_of_the_squared_cdf_difference():
    """CRPS = int (F(t) - 1[t >= y])^2 dt, by scipy's quad over the mixture's CDF."""
    rng = np.random.default_rng(3)
    loc = rng.normal(size=(3, 4, 1)) * 2
    scale = rng.uniform(0.3, 2.0, size=(3, 4, 1))
    y = rng.normal(size=(4, 1)) * 2
    got = mixture_crps(torch.tensor(loc), torch.tensor(scale), torch.tensor(y)).numpy()
    for n in range(4):

        def gap(t: float, n: int = n) -> float:
            cdf = stats.norm.cdf(t, loc[:, n, 0], scale[:, n, 0]).mean()
            return float((cdf - (t >= y[n, 0])) ** 2)

        below = integrate.quad(gap, -60.0, y[n, 0], limit=200, epsabs=1e-13)[0]
        above = integrate.quad(gap, y[n, 0], 60.0, limit=200, epsabs=1e-13)[0]
        assert got[n, 0] == pytest.approx(below + above, abs=1e-9)


def test_regression_metrics_match_scipy_and_the_law_of_total_variance():
    rng = np.random.default_rng(5)
    loc = rng.normal(size=(4, 6, 2))
    scale = rng.uniform(0.2, 1.5, size=(4, 6, 2))
    y = rng.normal(size=(6, 2))
    preds = GaussianPredictions(torch.tensor(loc), torch.tensor(scale), torch.tensor(y))
    scores = preds.evaluate()
    mean = loc.mean(0)
    assert scores["rmse"] == pytest.approx(np.sqrt(((mean - y) ** 2).mean()), abs=1e-12)
    assert scores["mae"] == pytest.approx(np.abs(mean - y).mean(), abs=1e-12)
    joint = np.prod(stats.norm.pdf(y, loc, scale), axis=-1).mean(0)
    assert scores["nll"] == pytest.approx(-np.log(joint).mean(), abs=1e-10)
    second_moment = (scale**2 + loc**2).mean(0)
    np.testing.assert_allclose(preds.variance.numpy(), second_moment - mean**2, atol=1e-12)
    parts = preds.uncertainty()
    np.testing.assert_allclose(parts.total.numpy(), (second_moment - mean**2).sum(-1), atol=1e-12)
    assert GaussianPredictions(preds.loc[:1], preds.scale[:1]).uncertainty().epistemic.eq(0).all()


def test_reliability_bars_are_the_bins_accuracy_and_gap_to_confidence():
    """5 bins of width 0.2: [0.4, 0.6) holds 0.55 (wrong), [0.6, 0.8) 0.6 (wrong) and 0.7
    (right), [0.8, 1] 0.8, 0.9 and 1.0 (right)."""
    probs = torch.tensor(
        [[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7], [0.55, 0.45], [1.0, 0.0]],
        dtype=torch.float64,
    )
    y = torch.tensor([0, 0, 1, 1, 1, 0])
    fig = plot_reliability(probs, y, num_bins=5)
    diagram, counts = fig.axes
    acc_bars, gap_bars = diagram.containers[:2]
    heights = [r.get_height() for r in acc_bars]
    np.testing.assert_allclose(heights[2:], [0.0, 0.5, 1.0])
    assert all(math.isnan(h) for h in heights[:2])
    gaps = [r.get_height() for r in gap_bars][2:]
    np.testing.assert_allclose(gaps, [0.55 - 0.0, 0.65 - 0.5, 0.9 - 1.0], atol=1e-12)
    fractions = [r.get_height() for r in counts.containers[0]]
    np.testing.assert_allclose(fractions, [0, 0, 1 / 6, 2 / 6, 3 / 6])
    value = metrics.ece(probs, y)  # the title's ECE is the 15-bin one, and says so
    assert diagram.get_title() == f"Reliability diagram (acc 66.67%, ECE {value:.2%} (15 bins))"
