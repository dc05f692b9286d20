"""Plots of regression predictions: the predictive bands over a 1-D input, and quantile
calibration."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pyrouq._numbers import finite_float, is_integer, shown, tensor_hint, text_hint
from pyrouq.plotting._common import _figure_and_axes, closes_its_figures, ink, lone_point
from pyrouq.plotting._dense import rasterized, thinned

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pyrouq.regression import GaussianPredictions


def _gaussian(predictions: Any, where: str) -> GaussianPredictions:
    from pyrouq.predictive import Predictions
    from pyrouq.regression import GaussianPredictions

    if not isinstance(predictions, GaussianPredictions):
        fix = ""
        if isinstance(predictions, Predictions):  # a classifier's: where they are plotted
            fix = (
                " (a classifier's class probabilities): plot them with plot_reliability(), "
                "plot_risk_coverage(), plot_uncertainty_distributions(), plot_most_uncertain() "
                "or plot_image_grid()"
            )
        raise TypeError(
            f"{where} expects GaussianPredictions (what predict() returns for a model with a "
            f"Gaussian likelihood), got {type(predictions).__name__}{fix}."
        )
    return predictions


def _column(value: Any, name: str, n: int) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(
            f"Expected {name} to be a torch.Tensor, got {type(value).__name__}; pass "
            f"torch.as_tensor({name})."
        )
    flat = value.detach().reshape(-1, 1) if value.dim() < 2 else value.detach().flatten(1)
    if flat.shape[1] != 1 or flat.shape[0] != n:
        raise ValueError(
            f"Expected {name} with one value per point, (N,) or (N, 1) with N = {n}, got shape "
            f"{tuple(value.shape)}; plot_regression draws over a 1-D input."
        )
    _check_finite(flat, name)
    return flat[:, 0].double().cpu()


def _check_finite(value: Tensor, name: str) -> None:
    """A clear error for NaN or infinite values, which would be drawn as gaps or not at all."""
    bad = ~torch.isfinite(value)
    if value.is_floating_point() and bad.any():
        raise ValueError(
            f"{name} holds {int(bad.sum())} NaN or infinite value(s) (first at row "
            f"{int(bad.reshape(value.shape[0], -1).any(1).nonzero()[0])}); plot_regression "
            "draws finite points only. Drop those rows first."
        )


def _targets_of(train_y: Any, n: int, num_outputs: int) -> Tensor:
    """``train_y`` as ``(n, D)``: one row of the D outputs per training point."""
    if not isinstance(train_y, Tensor):
        raise TypeError(
            f"Expected train_y to be a torch.Tensor, got {type(train_y).__name__}; pass "
            "torch.as_tensor(train_y)."
        )
    one = num_outputs == 1 and train_y.dim() == 1
    if train_y.shape[:1] != (n,) or not (one or train_y.shape[1:] == (num_outputs,)):
        allowed = f"({n}, {num_outputs})" + (f" or ({n},)" if num_outputs == 1 else "")
        raise ValueError(
            f"Expected train_y of shape {allowed}, one row of the {num_outputs} output(s) per "
            f"point of train_x, got shape {tuple(train_y.shape)}."
        )
    _check_finite(train_y.detach().reshape(n, num_outputs), "train_y")
    return train_y.detach().reshape(n, num_outputs)


@closes_its_figures
def plot_regression(
    predictions: GaussianPredictions,
    x: Tensor,
    *,
    train_x: Tensor | None = None,
    train_y: Tensor | None = None,
    output: int = 0,
    num_sd: float = 2.0,
    ax: Axes | None = None,
) -> Figure:
    """The predictive mean over a 1-D input with the aleatoric and the epistemic band drawn
    separately, and the training data.

    The bands are ``mean +- num_sd * sqrt(aleatoric variance)`` (the noise the model
    expects) and ``mean +- num_sd * sqrt(epistemic variance)`` (the spread of the draws'
    means, which grows outside the range of the data; mean-field VI leaves it about flat
    across a gap inside that range, see the regression tutorial).

    Of more than 10,000 points, the bands (and a scatter of more than 10,000 training points)
    are rasterized: in an SVG or PDF file they are a picture at the file's dpi (a PNG is the
    same), and an SVG of a million points and as many training points is 0.3 MB, not 190 MB.
    Of more than 100,000 points, the mean and the bands' edges are drawn through the first,
    last, lowest and highest point of each 1/4096 of the x range: within 1/4096 of the axes'
    width of every point (0.13 pixel at 100 dpi, 0.4 at 300 dpi), as the figure shows them,
    and the ``loc="best"`` legend weighs those points, not a million.

    Parameters
    ----------
    predictions : GaussianPredictions
        Predictions on the points ``x``.
    x : torch.Tensor
        ``(N,)`` or ``(N, 1)`` inputs (sorted or not).
    train_x, train_y : torch.Tensor, optional
        Training points to scatter.
    output : int, default 0
        Which of the D outputs to draw.
    num_sd : float, default 2.0
        Half-width of the bands in standard deviations.
    ax : matplotlib Axes, optional
        Draw into this axes (the figure's layout is left as it is); no figure is made.
        Default: a new figure.

    Returns
    -------
    Figure
        One axes, titled ``Predictive mean and uncertainty (… draws)``; with ``ax``, the
        figure of ``ax``.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> from pyrouq import GaussianPredictions
    >>> loc = torch.tensor([[0.0, 1.0, 2.0], [0.5, 1.0, 1.5]]).unsqueeze(-1)  # S = 2, N = 3
    >>> preds = GaussianPredictions(loc, torch.full((2, 3, 1), 0.5))
    >>> fig = plot_regression(preds, torch.tensor([0.0, 1.0, 2.0]))
    >>> fig.axes[0].get_title()
    'Predictive mean and uncertainty (2 draws)'
    >>> plt.close(fig)
    """
    p = _gaussian(predictions, "plot_regression()")
    if not is_integer(output) or not 0 <= output < p.num_outputs:
        raise ValueError(
            f"Expected output in [0, {p.num_outputs}), one of the predictions' outputs, got "
            f"{output!r}{tensor_hint(output, integer=True)}."
        )
    if (sd := finite_float(num_sd)) is None or sd <= 0:  # inf: bands drawn as nothing
        raise ValueError(
            f"Expected num_sd > 0, the bands' half-width in standard deviations, got "
            f"{shown(num_sd)}{tensor_hint(num_sd)}{text_hint(num_sd, 'num_sd', 0)}; pass a "
            "finite number, e.g. num_sd=2."
        )
    if (train_x is None) != (train_y is None):
        given, missing = ("train_x", "train_y") if train_y is None else ("train_y", "train_x")
        raise ValueError(
            f"plot_regression() got {given} without {missing}: the training points are "
            "scattered as (train_x, train_y) pairs. Pass both, or neither."
        )
    xs = _column(x, "x", p.num_inputs)
    order = torch.argsort(xs)
    grid = xs[order].numpy()
    # detached: predictions built from outputs that require grad (to differentiate their
    # CRPS) would otherwise fail in numpy()
    mean = p.mean[:, output].detach().double().cpu()[order].numpy()
    wide = p.double()  # (float32 variances of scales past 1.8e19 are inf, their roots not)
    aleatoric = wide.aleatoric_variance[:, output].detach().cpu()[order].sqrt().numpy()
    epistemic = wide.epistemic_variance[:, output].detach().cpu()[order].sqrt().numpy()
    train = None
    if train_x is not None and train_y is not None:  # checked before a figure is made
        n = train_x.shape[0] if isinstance(train_x, Tensor) and train_x.dim() else 0
        tx = _column(train_x, "train_x", n)
        ty = _targets_of(train_y, n, p.num_outputs)[:, output].double().cpu()
        train = tx.numpy(), ty.numpy()
    own = ax is None
    fig, ax = _figure_and_axes(ax, (7.0, 4.0))
    # one point: a band of no width draws nothing, so its height is drawn as a thick bar
    band = ax.fill_between if len(grid) > 1 else partial(ax.vlines, lw=8)
    for name, spread, color, alpha in (
        ("aleatoric", aleatoric, "tab:orange", 0.25),
        ("epistemic", epistemic, "tab:blue", 0.35),
    ):
        low, high = mean - sd * spread, mean + sd * spread
        edge = thinned(grid, low, high)  # (all of them up to THIN_ABOVE points)
        band(
            grid[edge], low[edge], high[edge], color=color, alpha=alpha,
            label=f"{name} (+-{sd:g} sd)", **rasterized(len(grid)),
        )  # fmt: skip
    curve = thinned(grid, mean)
    ax.plot(
        grid[curve], mean[curve], color="tab:blue", lw=2, label="predictive mean",
        **lone_point(len(grid)),
    )  # fmt: skip
    if train is not None:
        ax.scatter(
            *train, s=12, color=ink(), zorder=3, label="training data", **rasterized(len(train[0]))
        )
    ax.set_xlabel("x")
    ax.set_ylabel("y" if p.num_outputs == 1 else f"y[{output}]")
    draws = f"{p.num_samples} draw{'s' if p.num_samples != 1 else ''}"
    ax.set_title(f"Predictive mean and uncertainty ({draws})")
    ax.legend(loc="best", fontsize="small")
    if own:
        fig.tight_layout()
    return fig


@closes_its_figures
def plot_calibration(
    predictions: GaussianPredictions,
    targets: Tensor | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """Quantile calibration: for each level p, the fraction of targets at or below the
    predictive p-quantile, against p (on the diagonal when calibrated); the title gives
    ``calibration_error`` as :meth:`GaussianPredictions.evaluate` computes it.

    Parameters
    ----------
    predictions : GaussianPredictions
        The predictions to check.
    targets : Tensor, optional
        The observed targets; default ``predictions.targets``.
    ax : matplotlib Axes, optional
        Draw into this axes (the figure's layout is left as it is); no figure is made.
        Default: a new figure.

    Returns
    -------
    Figure
        One axes, titled ``Quantile calibration (error …)``; with ``ax``, the figure of ``ax``.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> from pyrouq import GaussianPredictions
    >>> loc = torch.tensor([[0.0, 1.0, 2.0], [0.5, 1.0, 1.5]]).unsqueeze(-1)  # S = 2, N = 3
    >>> preds = GaussianPredictions(loc, torch.full((2, 3, 1), 0.5), torch.tensor([0.2, 1.0, 1.9]))
    >>> fig, ax = plt.subplots()
    >>> plot_calibration(preds, ax=ax) is fig
    True
    >>> ax.get_title()  # preds.evaluate()["calibration_error"], 4 decimals
    'Quantile calibration (error 0.0583)'
    >>> plt.close(fig)
    """
    p = _gaussian(predictions, "plot_calibration()")
    expected, observed = p.calibration_curve(targets)
    error = float((observed - expected).square().mean())
    own = ax is None
    fig, ax = _figure_and_axes(ax, (4.5, 4.5))
    ax.plot([0, 1], [0, 1], color="gray", ls="--", label="calibrated")
    ax.plot(
        expected.cpu().numpy(), observed.cpu().numpy(), marker="o", color="tab:blue", label="model"
    )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("expected quantile level")
    ax.set_ylabel("observed fraction of targets below it")
    ax.set_title(f"Quantile calibration (error {error:.4f})")
    ax.legend(loc="upper left", fontsize="small")
    if own:
        fig.tight_layout()
    return fig
