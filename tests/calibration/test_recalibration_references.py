"""Recalibration and the regression plots against independent references: a temperature fitted
at a bound of its search is that bound, as documented and as its warning names it; the
regression plots draw the mixture's moments and scipy's PIT curve, whatever the order of x."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch
from scipy import stats

from pyrouq import GaussianPredictions, Predictions, temperature_scale
from pyrouq.calibration import TEMPERATURE_BOUNDS
from pyrouq.plotting import plot_calibration, plot_regression

matplotlib.use("Agg")


def _random_labels() -> Predictions:
    """One probability vector for every input, whose labels take each class as often: the
    NLL, ``-mean_c log q_c / 3``, falls as q flattens, so the flattest T fits best."""
    probs = torch.tensor([0.7, 0.2, 0.1]).expand(1, 30, 3)
    return Predictions(probs, torch.arange(30) % 3)


def _all_right() -> Predictions:
    """Every input predicted right, and under-confident: the NLL falls toward 0 as T -> 0."""
    y = torch.arange(30) % 3
    probs = torch.nn.functional.one_hot(y, 3).float() * 0.6 + 0.4 / 3
    return Predictions(probs[None], y)


def _lowest_at(temperature: float) -> Predictions:
    """One draw of logits (z, 0) for 20 inputs, 11 labelled 0: the NLL is lowest where
    z / T = log(0.55 / 0.45), the observed log-odds, at T = ``temperature``."""
    z = temperature * math.log(0.55 / 0.45)
    probs = torch.softmax(torch.tensor([[z, 0.0]] * 20, dtype=torch.float64), -1)
    return Predictions(probs[None], (torch.arange(20) >= 11).long())


@pytest.mark.parametrize(
    ("make", "bound", "words"),
    [
        (_random_labels, 20.0, "lowest at T = 20"),
        (_all_right, 0.05, "lowest at T = 0.05"),
        (lambda: _lowest_at(19.995), 20.0, "lowest at T = 20"),  # within 0.1 %: told T = 20
        (lambda: _lowest_at(0.05005), 0.05, "lowest at T = 0.05"),
    ],
)
def test_a_temperature_at_a_bound_of_the_search_is_the_bound_itself(make, bound, words):
    """The docstring says a minimum at a bound "warns and returns the bound", and the warning
    names T = 20 (or 0.05); the scaler held exp(log 20) = 19.999999999999996 (and
    0.05000000000000001), so ``scaler.temperature == 20`` was False; a minimum within 0.1 %
    of the bound, warned of as at T = 20, returned 19.995 (0.05005)."""
    with pytest.warns(UserWarning, match=words):
        scaler = temperature_scale(make())
    assert bound in TEMPERATURE_BOUNDS
    assert scaler.temperature == bound


def test_regression_plots_draw_the_mixtures_moments_and_scipys_pit_curve():
    """plot_regression's mean line and bands against numpy moments of the draws (the law of
    total variance) for unsorted inputs and the second of two outputs; plot_calibration's
    curve against the fraction of targets whose mixture CDF (scipy's normal CDFs, averaged)
    is at most each level 0.05, ..., 0.95, and its title against that curve's mean squared
    gap."""
    rng = np.random.default_rng(3)
    s, n = 6, 30
    loc, scale = rng.normal(size=(s, n, 2)), rng.uniform(0.1, 1.0, size=(s, n, 2))
    y, x = rng.normal(size=(n, 2)), rng.permutation(np.linspace(-2.0, 2.0, n))
    preds = GaussianPredictions(torch.tensor(loc), torch.tensor(scale), torch.tensor(y))

    fig = plot_regression(preds, torch.tensor(x), output=1, num_sd=1.5)
    ax, order = fig.axes[0], np.argsort(x)
    mean = loc[..., 1].mean(0)[order]
    aleatoric = np.sqrt((scale[..., 1] ** 2).mean(0))[order]
    epistemic = loc[..., 1].std(0)[order]  # divided by S, as documented
    np.testing.assert_allclose(ax.lines[0].get_xdata(), x[order])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), mean, atol=1e-12)
    for band, sd in zip(ax.collections[:2], (aleatoric, epistemic), strict=True):
        ys = band.get_paths()[0].vertices[:, 1]
        for edge in (mean - 1.5 * sd, mean + 1.5 * sd):  # every bound of the band is drawn
            assert np.abs(ys[:, None] - edge[None]).min(0).max() < 1e-12
    matplotlib.pyplot.close(fig)

    fig = plot_calibration(preds)
    ax = fig.axes[0]
    pit = stats.norm.cdf(y[None], loc, scale).mean(0).ravel()
    levels = np.arange(1, 20) / 20
    observed = (pit[None] <= levels[:, None]).mean(1)
    np.testing.assert_allclose(ax.lines[1].get_xdata(), levels, atol=1e-15)
    np.testing.assert_allclose(ax.lines[1].get_ydata(), observed)
    error = float(np.mean((observed - levels) ** 2))
    assert ax.get_title() == f"Quantile calibration (error {error:.4f})"
    assert math.isclose(preds.evaluate()["calibration_error"], error, abs_tol=1e-15)
    matplotlib.pyplot.close(fig)
