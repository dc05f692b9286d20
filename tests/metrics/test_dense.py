"""Plots of many points (pyrouq/plotting/_dense.py): fills and scatters rasterized in vector
files."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import pytest
import torch

from pyrouq.plotting import plot_regression
from pyrouq.plotting._dense import RASTERIZE_ABOVE
from pyrouq.predictive import GaussianPredictions


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _gaussian(n: int, seed: int = 2) -> tuple[GaussianPredictions, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g) * 10 - 5  # unsorted; a noisy mean
    loc = torch.sin(x)[None, :, None] + 0.1 * torch.randn(3, n, 1, generator=g)
    return GaussianPredictions(loc, 0.2 + 0.1 * torch.rand(3, n, 1, generator=g)), x


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
