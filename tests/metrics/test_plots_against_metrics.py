"""Audit of data loading, tabular data and plotting: values the plots draw against
:mod:`pyrouq.metrics`, and the fixes of the audit."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.collections import LineCollection

import pyrouq
from pyrouq import metrics
from pyrouq.plotting import (
    plot_image_grid,
    plot_most_uncertain,
    plot_regression,
    plot_reliability,
    plot_risk_coverage,
)
from pyrouq.regression import GaussianPredictions
from pyrouq.tabular import train_test_split


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _probs(s: int = 3, n: int = 13, c: int = 4, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(s, n, c, generator=g).round(), -1)  # ties in confidence


def _labels(n: int = 13, c: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, c, (n,), generator=torch.Generator().manual_seed(seed))


def test_float_images_of_raw_pixels_are_refused_not_shown_white():
    p = _probs(n=4)
    raw = torch.randint(0, 256, (4, 28, 28), generator=torch.Generator().manual_seed(0))
    raw = raw.to(torch.uint8)
    open_before = plt.get_fignums()  # (figures other tests left open)
    for plot in (plot_image_grid, plot_most_uncertain):
        with pytest.raises(ValueError, match=r"got values in \[0, 255\].*as uint8"):
            plot(p, raw.float())
    assert plt.get_fignums() == open_before  # refused before a figure was made
    # uint8, [0, 1] floats and an explicit normalized=False are shown as before
    shown = [
        np.asarray(plot_image_grid(p, imgs, rows=1, cols=1).axes[0].images[0].get_array())
        for imgs in (raw, raw.float() / 255)
    ]
    np.testing.assert_allclose(shown[1], shown[0], atol=1e-6)
    fig = plot_image_grid(p, raw.float(), rows=1, cols=1, normalized=False)
    arr = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_allclose(arr, raw[0].float().clamp(0, 1).numpy())


def test_uint8_images_with_a_normalisation_are_refused_not_drawn_raw():
    # uint8 images drew their raw pixels whatever normalized=True, mean= or std= said (and
    # mean= with normalized=False, refused for float images, passed)
    p = _probs(n=4)
    raw = torch.randint(0, 256, (4, 28, 28), generator=torch.Generator().manual_seed(0))
    raw = raw.to(torch.uint8)
    open_before = plt.get_fignums()
    told = r"Expected no normalisation for uint8 images \(raw 0-255 pixels, shown as they are\)"
    for plot in (plot_image_grid, plot_most_uncertain):
        with pytest.raises(ValueError, match=told + r", got normalized=True; drop it,"):
            plot(p, raw, normalized=True)
        with pytest.raises(ValueError, match=r"got mean= and std=; drop them, or pass the float"):
            plot(p, raw, mean=0.5, std=0.5)
        with pytest.raises(ValueError, match=r"got normalized=True and mean=; drop them"):
            plot(p, raw, normalized=True, mean=0.5)
        with pytest.raises(ValueError, match=r"got mean=; drop it"):
            plot(p, raw, normalized=False, mean=0.5)
    assert plt.get_fignums() == open_before  # refused before a figure was made
    fig = plot_image_grid(p, raw, rows=1, cols=1, normalized=False)  # raw pixels, as said
    arr = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_allclose(arr, raw[0].float().numpy() / 255, atol=1e-6)


def test_regression_title_counts_one_draw_in_the_singular():
    loc, scale = torch.zeros(1, 5, 1), torch.ones(1, 5, 1)
    fig = plot_regression(GaussianPredictions(loc, scale), torch.arange(5.0))
    assert fig.axes[0].get_title() == "Predictive mean and uncertainty (1 draw)"
    fig = plot_regression(GaussianPredictions(loc.expand(2, 5, 1), scale.expand(2, 5, 1)),
                          torch.arange(5.0))  # fmt: skip
    assert fig.axes[0].get_title() == "Predictive mean and uncertainty (2 draws)"


@pytest.mark.parametrize("num_bins", [5, 15])
def test_reliability_bars_give_the_ece_of_their_bins(num_bins):
    p, y = _probs(), _labels()
    fig = plot_reliability(p, y, num_bins=num_bins)
    ax, ax_n = fig.axes
    gaps = np.array([r.get_height() for r in ax.patches[num_bins : 2 * num_bins]])
    fractions = np.array([r.get_height() for r in ax_n.patches])
    assert fractions.sum() == pytest.approx(1.0)
    assert np.nansum(fractions * np.abs(gaps)) == pytest.approx(
        metrics.ece(p, y, num_bins=num_bins)
    )


@pytest.mark.parametrize("n", [1, 5, 13])
def test_risk_coverage_curve_and_risk_at_80_point(n):
    p, y = _probs(n=n), _labels(n=n)
    ax = plot_risk_coverage(p, y).axes[0]
    risk = ax.lines[0].get_ydata()
    (x80,), (r80,) = ax.lines[-1].get_data()
    assert risk.mean() == pytest.approx(metrics.aurc(p, y))
    assert r80 == pytest.approx(metrics.risk_at_80_cov(p, y))
    k = round(x80 * n)
    assert k == int(np.ceil(0.8 * n)) and risk[k - 1] == pytest.approx(r80)  # on the curve
    assert ax.lines[0].get_xdata()[k - 1] == pytest.approx(x80)


def test_a_line_through_one_point_is_drawn_as_a_marker():
    # a line of one point draws nothing: one input drew an empty risk-coverage curve and an
    # empty regression (its bands of no width too); more points draw lines as before
    ax = plot_risk_coverage(_probs(n=1), _labels(n=1)).axes[0]
    assert [(len(line.get_xdata()), line.get_marker()) for line in ax.lines[:2]] == [
        (1, "o"),
        (1, "x"),
    ]
    assert [line.get_clip_on() for line in ax.lines[:2]] == [False, False]  # (at coverage 1)
    assert [
        line.get_marker()
        for line in plot_risk_coverage(_probs(n=2), _labels(n=2)).axes[0].lines[:2]
    ] == ["None", "None"]
    preds = GaussianPredictions(torch.tensor([[[0.0]], [[0.5]]]), torch.full((2, 1, 1), 0.5))
    ax = plot_regression(preds, torch.tensor([1.0])).axes[0]
    assert (len(ax.lines[0].get_xdata()), ax.lines[0].get_marker()) == (1, "o")
    bands = [np.asarray(band.get_segments()).tolist() for band in ax.collections]
    assert bands == [[[[1.0, -0.75], [1.0, 1.25]]], [[[1.0, -0.25], [1.0, 0.75]]]]  # +-2 sd
    assert [band.get_linewidths().tolist() for band in ax.collections] == [[8.0], [8.0]]
    two = GaussianPredictions(torch.zeros(2, 2, 1), torch.ones(2, 2, 1))
    ax = plot_regression(two, torch.tensor([0.0, 1.0])).axes[0]
    assert ax.lines[0].get_marker() == "None" and len(ax.collections) == 2
    assert not any(isinstance(band, LineCollection) for band in ax.collections)  # filled bands
    # one class: the thin line of each of 11 draws (beyond the bars' 10) is a tick
    ax = plot_most_uncertain(torch.ones(11, 2, 1), torch.rand(2, 1, 4, 4), k=1).axes[1]
    assert [line.get_marker() for line in ax.lines] == ["_"] * 11 + ["."]
    plt.close("all")


def test_train_test_split_partitions_the_rows():
    x, y = torch.arange(40.0).reshape(20, 2), torch.arange(20)
    tx, ty, vx, vy = train_test_split(x, y, test_fraction=0.25, seed=3)
    assert (len(ty), len(vy)) == (15, 5)
    assert sorted(ty.tolist() + vy.tolist()) == list(range(20))  # disjoint, every row once
    assert torch.equal(tx[:, 0], 2.0 * ty) and torch.equal(vx[:, 0], 2.0 * vy)  # rows aligned


def test_tensor_loader_refuses_images_already_scaled_to_0_1():
    """They were divided by 255 again and trained near 0, without a word."""
    images, labels = torch.rand(8, 4, 4), torch.arange(8) % 2
    with pytest.raises(ValueError) as info:
        pyrouq.data.TensorLoader(images, labels, 4, shuffle=False, flatten=False,
                                 normalize=False, seed=0)  # fmt: skip
    low, high = images.min().item(), images.max().item()
    assert str(info.value) == (
        f"TensorLoader: expected raw pixel values in 0-255, got floats in [{low:.3g}, "
        f"{high:.3g}], images already scaled to [0, 1], which it would divide by 255 again. "
        "Pass images * 255, or train on them as they are with "
        "pyrouq.ArrayLoader(images.unsqueeze(1), labels, batch_size)."
    )
    loader = pyrouq.data.TensorLoader(images * 255, labels, 4, shuffle=False, flatten=False,
                                      normalize=False, seed=0)  # fmt: skip
    assert torch.allclose(next(iter(loader))[0][:, 0], images[:4])
    as_they_are = pyrouq.ArrayLoader(images.unsqueeze(1), labels, 4, shuffle=False)
    assert torch.equal(next(iter(as_they_are))[0][:, 0], images[:4])
