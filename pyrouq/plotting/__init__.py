"""Plots of predictions, calibration, selective prediction, OOD detection and training.

The only part of pyrouq that imports matplotlib, and only when a function is first called:
``import pyrouq.plotting`` stays cheap. Every function takes results
(:class:`~pyrouq.predictive.Predictions` or probability tensors, a
:class:`~pyrouq.infer.FitResult`, the rows of :func:`~pyrouq.rotation.evaluate_rotations`),
never fits anything, and returns a ``matplotlib.figure.Figure``. Numbers in titles and legends
are computed with :mod:`pyrouq.metrics`, so they agree with :func:`pyrouq.metrics.evaluate`,
and are printed as :func:`pyrouq.metrics.format_table` prints them (percentages with 2
decimals).

Shape convention: S draws or members, N inputs, C classes. Wherever probabilities are taken,
a :class:`~pyrouq.predictive.Predictions`, an ``(S, N, C)`` tensor or an ``(N, C)`` tensor
(S = 1) works. The regression plots (:func:`plot_regression`, :func:`plot_calibration`) take
:class:`~pyrouq.regression.GaussianPredictions`.

The plots of one axes take ``ax=``, as matplotlib's and arviz's do: :func:`plot_risk_coverage`,
:func:`plot_regression`, :func:`plot_calibration`, and :func:`plot_reliability` (the diagram
alone, without its histogram of confidences). Given an Axes, they draw into it, leave the
figure's layout as it is, make no figure and return the figure of the Axes (the top-level one
for an Axes of a subfigure); anything else (an array of Axes, a Figure) is refused with a
TypeError. The plots of several panels (:func:`plot_uncertainty_distributions`,
:func:`plot_training_curves`, :func:`plot_rotation`, :func:`plot_most_uncertain`,
:func:`plot_image_grid`) always make a figure of their own.

Test sets of a million points are drawn as the figure's pixels show them: a curve of more than
100,000 points (risk-coverage, an ECDF, a regression's mean and bands) is drawn through the
first, last, lowest and highest of its points in each 1/4096 of its x range (within 1/4096 of
the axes' width of every point), and a regression's bands and training points, of more than
10,000 points, are rasterized in SVG and PDF files (a picture at the file's dpi; a PNG is the
same).

Figures are made with pyplot, so Jupyter shows them inline; one left as a cell's last
expression is shown twice (by the inline backend, then as the cell's value): assign it
(``fig = plot_reliability(...)``) or end the line with ``;``. Where there is no display (Linux
without ``$DISPLAY`` / ``$WAYLAND_DISPLAY``) and no backend was chosen (``$MPLBACKEND``,
``matplotlib.use``), the non-interactive Agg backend is selected; nothing here calls
``plt.show()``. Close figures you are done with (``plt.close(fig)``), or write them with
:func:`save_figures`, which closes them.

Examples
--------
>>> import matplotlib.pyplot as plt
>>> import torch
>>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])  # (N, C), S = 1
>>> fig = plot_reliability(probs, torch.tensor([0, 0, 1, 1]))
>>> fig.axes[0].get_title()  # ECE = (0.1 + 0.2 + 0.6 + 0.3) / 4
'Reliability diagram (acc 75.00%, ECE 30.00%)'
>>> plt.close(fig)
"""

from __future__ import annotations

from pyrouq.plotting._common import MAX_BARS, Component, DistributionKind, save_figures
from pyrouq.plotting._evaluation import (
    plot_reliability,
    plot_risk_coverage,
    plot_rotation,
    plot_training_curves,
    plot_uncertainty_distributions,
)
from pyrouq.plotting._predictions import plot_image_grid, plot_most_uncertain
from pyrouq.plotting._regression import plot_calibration, plot_regression

__all__ = [
    "MAX_BARS",
    "Component",
    "DistributionKind",
    "plot_calibration",
    "plot_image_grid",
    "plot_most_uncertain",
    "plot_regression",
    "plot_reliability",
    "plot_risk_coverage",
    "plot_rotation",
    "plot_training_curves",
    "plot_uncertainty_distributions",
    "save_figures",
]
