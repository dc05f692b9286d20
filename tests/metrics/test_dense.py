"""Plots of many points (pyrouq/plotting/_dense.py): curves thinned to what the figure's pixels
show, fills and scatters rasterized in vector files."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from pyrouq import decompose
from pyrouq.metrics import _error_counts
from pyrouq.plotting import (
    _dense,
    plot_regression,
    plot_risk_coverage,
    plot_uncertainty_distributions,
)
from pyrouq.plotting._dense import RASTERIZE_ABOVE, THIN_ABOVE, THIN_SLICES, thinned
from pyrouq.predictive import GaussianPredictions

#: Curves are thinned above THIN_ABOVE points (100,000); the plots' tests lower it to FEW,
#: to measure every point's distance to the drawn line in a fraction of the time.
FEW = 20_000
MANY = FEW + 10_000


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def thinned_above_few(monkeypatch):
    monkeypatch.setattr(_dense, "THIN_ABOVE", FEW)


def _steps(xy: np.ndarray) -> np.ndarray:
    """The vertices of a ``steps-post`` line through ``xy``."""
    out = np.empty((2 * len(xy) - 1, 2))
    out[0::2], out[1::2, 0], out[1::2, 1] = xy, xy[1:, 0], xy[:-1, 1]
    return out


def _max_deviation_px(ax, x, y, line, steps=False, window=0.5):
    """The largest distance, in pixels of the figure as drawn, from a point of the whole curve
    ``(x, y)`` (x sorted) to the drawn line (of segments starting within ``window`` pixels)."""
    full = ax.transData.transform(np.column_stack([x, y]))
    drawn = ax.transData.transform(line.get_xydata())
    if steps:
        full, drawn = _steps(full), _steps(drawn)
    a, b = drawn[:-1], drawn[1:]
    worst = 0.0
    for p in np.array_split(full, max(1, len(full) // 20_000)):
        lo = np.maximum(np.searchsorted(a[:, 0], p[:, 0] - window) - 1, 0)
        hi = np.searchsorted(a[:, 0], p[:, 0] + window, "right")
        near = lo[:, None] + np.arange(int((hi - lo).max()))
        sa, d = a[np.minimum(near, len(a) - 1)], (b - a)[np.minimum(near, len(a) - 1)]
        t = np.einsum("nkj,nkj->nk", p[:, None] - sa, d) / np.maximum((d * d).sum(-1), 1e-300)
        gap = np.linalg.norm(p[:, None] - (sa + np.clip(t, 0, 1)[..., None] * d), axis=-1)
        worst = max(worst, float(np.where(near < hi[:, None], gap, np.inf).min(1).max()))
    return worst


def _within(ax, x, y, line, steps=False):
    """The deviations at 100 and 300 dpi."""
    fig, deviations = ax.figure, []
    for dpi in (100, 300):
        fig.set_dpi(dpi)
        deviations.append(_max_deviation_px(ax, x, y, line, steps))
    fig.set_dpi(100)
    return deviations


def test_thinned_keeps_each_slices_ends_and_extremes_and_every_point_up_to_the_threshold():
    g = np.random.default_rng(0)
    n = THIN_ABOVE + 10_000
    x = np.sort(g.uniform(-3, 5, n))
    y, z = g.normal(size=n), np.repeat([0.0, 1.0], n // 2)  # noise; a step with ties
    np.testing.assert_array_equal(thinned(x[:THIN_ABOVE], y[:THIN_ABOVE]), np.arange(THIN_ABOVE))
    kept = thinned(x, y, z)
    assert kept[0] == 0 and kept[-1] == n - 1 and np.all(np.diff(kept) > 0)
    assert len(kept) <= 6 * THIN_SLICES  # first, last and each curve's lowest and highest
    slice_of = np.minimum(((x - x[0]) / (x[-1] - x[0]) * THIN_SLICES).astype(int), 4095)
    for curve in (y, z):
        for extreme in (np.minimum, np.maximum):  # each slice's lowest and highest are kept
            every = extreme.reduceat(curve, np.flatnonzero(np.diff(slice_of, prepend=-1)))
            np.testing.assert_array_equal(
                extreme.reduceat(curve[kept], np.flatnonzero(np.diff(slice_of[kept], prepend=-1))),
                every,
            )
    assert len(thinned(np.zeros(n), y)) == 4  # all in one slice (no x range)


@pytest.mark.usefixtures("thinned_above_few")
def test_a_risk_coverage_curve_of_many_inputs_is_drawn_within_a_fraction_of_a_pixel():
    # a million inputs: 2 lines of a million points took seconds, most of it placing the
    # loc="best" legend, which tests every vertex; every point is now within 0.1 pixel
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(2 * torch.randn(MANY, 4, generator=g), -1)
    y = torch.randint(0, 4, (MANY,), generator=g)
    fig = plot_risk_coverage(probs, y)
    fig.canvas.draw()
    ax = fig.axes[0]
    errors = _error_counts(probs.double(), y).numpy()
    k = np.arange(1, MANY + 1)
    best = np.clip(k - (MANY - errors[-1]), 0, None) / k
    for line, risk in zip(ax.lines[:2], (errors / k, best), strict=True):
        assert len(line.get_xdata()) <= 4 * THIN_SLICES
        low, high = _within(ax, k / MANY, risk, line)
        assert low < 0.15 and high < 0.45  # pixels at 100 and 300 dpi
    few = plot_risk_coverage(probs[:FEW], y[:FEW]).axes[0]
    assert [len(line.get_xdata()) for line in few.lines[:2]] == [FEW] * 2


@pytest.mark.usefixtures("thinned_above_few")
def test_the_ecdfs_of_many_inputs_are_drawn_within_a_fraction_of_a_pixel():
    g = torch.Generator().manual_seed(1)
    p_in = torch.softmax(2 * torch.randn(2, MANY, 3, generator=g), -1)
    p_out = torch.softmax(torch.randn(2, 50, 3, generator=g), -1)  # (few: drawn whole)
    fig = plot_uncertainty_distributions(p_in, p_out, kind="ecdf")
    fig.canvas.draw()
    parts = decompose(p_in.double())
    for ax, name in zip(fig.axes, ("total", "aleatoric", "epistemic"), strict=True):
        line, ood = ax.lines
        assert len(line.get_xdata()) <= 2 * THIN_SLICES and len(ood.get_xdata()) == 51
        values = np.sort(getattr(parts, name).numpy())
        xs, fractions = np.r_[values[:1], values], np.arange(MANY + 1) / MANY
        assert (line.get_xdata()[[0, -1]] == xs[[0, -1]]).all()  # from 0 to 1, whole
        np.testing.assert_array_equal(line.get_ydata()[[0, -1]], [0.0, 1.0])
        if name == "total":  # (each panel is thinned alike: one measured)
            low, high = _within(ax, xs, fractions, line, steps=True)
            assert low < 0.1 and high < 0.3


def _gaussian(n: int, seed: int = 2) -> tuple[GaussianPredictions, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g) * 10 - 5  # unsorted; a noisy mean, the hardest to thin
    loc = torch.sin(x)[None, :, None] + 0.1 * torch.randn(3, n, 1, generator=g)
    return GaussianPredictions(loc, 0.2 + 0.1 * torch.rand(3, n, 1, generator=g)), x


@pytest.mark.usefixtures("thinned_above_few")
def test_a_regression_of_many_points_is_drawn_within_a_fraction_of_a_pixel():
    preds, x = _gaussian(MANY)
    fig = plot_regression(preds, x)
    fig.canvas.draw()
    ax = fig.axes[0]
    order = torch.argsort(x.double())
    grid, mean = x.double()[order].numpy(), preds.mean[:, 0].double()[order].numpy()
    (line,) = ax.lines
    assert len(line.get_xdata()) <= 4 * THIN_SLICES
    low, high = _within(ax, grid, mean, line)
    assert low < 0.15 and high < 0.45
    for band in ax.collections:  # the bands' outlines: thinned too
        assert len(band.get_paths()[0].vertices) < 2 * 6 * THIN_SLICES + 10


@pytest.mark.parametrize("n", [RASTERIZE_ABOVE, RASTERIZE_ABOVE + 1])
def test_regression_bands_and_scatters_of_many_points_are_rasterized(n):
    # a million points wrote an SVG of 100 MB (190 MB with the training points): each fill
    # and marker was a vector path; above RASTERIZE_ABOVE points they are one picture
    preds, x = _gaussian(n)
    fig = plot_regression(preds, x, train_x=x, train_y=x.sin())
    ax = fig.axes[0]
    many = n > RASTERIZE_ABOVE
    assert [a.get_rasterized() for a in ax.collections] == [many] * 3  # 2 bands, the scatter
    assert not ax.lines[0].get_rasterized()  # a line is simplified by matplotlib itself
    svg = io.BytesIO()
    fig.savefig(svg, format="svg")
    assert (b"<image " in svg.getvalue()) is many
    assert len(svg.getvalue()) < (1 if many else 9) * 2**20
