"""Plots of predictions on images: the most uncertain inputs, a grid of test images."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from pyrouq._images import Constants
from pyrouq._util import check_int
from pyrouq.plotting._common import (
    _COMPONENTS,
    MAX_BARS,
    Component,
    _check_choice,
    _display_images,
    _optional_targets,
    _probs,
    _pyplot,
    closes_its_figures,
    ink,
    lone_point,
)
from pyrouq.uncertainty import Measure, _check_measure, decompose

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pyrouq.predictive import Predictions

#: Most bars of one chart of :func:`plot_most_uncertain` (S draws x C classes): each is 1.6
#: pixels wide at 100 dpi (10 000 of them took a minute to make and draw, 0.05 pixel each).
_MOST_BARS = 300
#: Most classes of :func:`plot_most_uncertain` that are each a tick: 1000 labels merged into a
#: black band (and took seconds to lay out); beyond, a few integer ticks.
_MOST_CLASS_TICKS = 30


@closes_its_figures
def plot_most_uncertain(
    predictions: Predictions | Tensor,
    images: Tensor,
    targets: Tensor | None = None,
    *,
    k: int = 8,
    measure: Measure = "entropy",
    component: Component = "epistemic",
    normalized: bool | None = None,
    mean: Constants = None,
    std: Constants = None,
) -> Figure:
    """The k most uncertain inputs, each beside every draw's / member's class probabilities.

    Inputs are ranked by ``component`` of the decomposition in float64, as the metrics compute
    it: ``decompose(predictions.probs.double(), measure)`` (decreasing; ties keep input order).
    ``predictions.uncertainty(measure)`` computes in the probabilities' own dtype (float32 from
    :func:`~pyrouq.predict`), where inputs within its rounding of each other may tie or order
    otherwise. Row r shows the r-th image, titled with its index, true label (when
    known) and predicted class, and a chart of the class probabilities ``p_s`` of every draw s:
    grouped bars for up to 10 draws/members and 300 bars (S x C; 1.6 pixels wide at 100 dpi),
    one thin line per draw beyond either, with the mean ``p̄`` as a line in the style's text
    colour (black by default). Up to 30 classes each class is a tick and a dot of the mean;
    of more (ImageNet's 1000, whose labels merged into a black band), a few integer ticks
    (matplotlib's ``MaxNLocator(integer=True)``) and a plain line.

    Parameters
    ----------
    predictions : Predictions or Tensor
        ``(S, N, C)`` (or ``(N, C)``) probabilities on N inputs.
    images : Tensor or numpy.ndarray
        The N inputs: grey ``(N, 1, H, W)``, ``(N, H, W)`` or flattened ``(N, H * H)``, or
        RGB ``(N, 3, H, W)`` (drawn in colour); float (normalised or in ``[0, 1]``) or uint8
        (raw 0-255 pixels). Other channel counts are refused.
    targets : Tensor, optional
        ``(N,)`` labels; default ``predictions.targets`` when it has them. Third, as in
        :func:`plot_image_grid` (or by name).
    k : int, default 8
        Number of inputs (rows) shown; at most N.
    measure : {"entropy", "variance", "zero_one"}, default "entropy"
        Uncertainty measure of :func:`pyrouq.uncertainty.decompose`.
    component : {"total", "aleatoric", "epistemic"}, default "epistemic"
        The part of the decomposition that ranks the inputs.
    normalized : bool, optional
        Whether float images are normalised as ``(x - mean) / std`` (they are mapped back to
        ``[0, 1]`` for display, then clipped to it). Default: yes when ``mean`` and ``std``
        are given or any pixel is negative; float images with none negative and some above 1
        (raw 0-255 pixels as floats) are refused, as neither. uint8 images are raw pixels:
        ``normalized=True``, ``mean=`` or ``std=`` with them is refused.
    mean, std : float or sequence of float, optional
        The normalisation to undo: one value per channel (or one number for every channel),
        e.g. ``mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616)`` for CIFAR-10.
        Default: MNIST's ``0.1307`` and ``0.3081`` for grey images; normalised RGB images
        need them (a ValueError says so), RGB images in ``[0, 1]`` do not.

    Returns
    -------
    Figure
        A new figure of ``min(k, N)`` rows of two axes (image, probabilities); no ``ax=``, as it
        draws several panels and sizes the figure to k. For one draw (S = 1) the
        epistemic part is 0 for every input: ranked by it, the rows are the first inputs, and
        the title says so.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> probs = torch.tensor([[[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]],
    ...                       [[0.9, 0.1], [0.3, 0.7], [0.1, 0.9]]])  # S = 2, N = 3, C = 2
    >>> images = torch.rand(3, 1, 28, 28)
    >>> fig = plot_most_uncertain(probs, images, targets=torch.tensor([0, 1, 1]), k=2)
    >>> [ax.get_title() for ax in fig.axes[::2]]  # by input index: the draws disagree most on #2
    ['#2 true 1 pred 1', '#1 true 1 pred 1']
    >>> plt.close(fig)
    """
    p = _probs(predictions, "predictions")
    s, n, c = p.shape
    k = check_int("k", k, hint="It is the number of images to show, e.g. k=8.")
    _check_measure(measure)
    _check_choice("component", component, _COMPONENTS)
    y = _optional_targets(targets, predictions, p)
    scores = getattr(decompose(p, measure), component)
    order = torch.argsort(scores, descending=True, stable=True)[: min(k, n)].tolist()
    pics = _display_images(images, n, normalized, order, mean, std)
    p_bar = p.mean(0)
    predicted = p_bar.argmax(-1)

    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(
        len(order),
        2,
        figsize=(9.0, 1.6 * len(order) + 0.6),
        gridspec_kw={"width_ratios": [1, 5]},
        squeeze=False,
    )
    classes = np.arange(c)
    width = 0.8 / s
    bars = s <= MAX_BARS and s * c <= _MOST_BARS  # else one thin line per draw
    colors = plt.get_cmap("tab10")
    for row, i in enumerate(order):
        ax_img, ax_p = axes[row]
        ax_img.imshow(pics[row], **_grey(pics))
        ax_img.set_axis_off()
        label = f"#{i}" + ("" if y is None else f" true {int(y[i])}")
        ax_img.set_title(f"{label} pred {int(predicted[i])}", fontsize=8)
        if bars:
            for j in range(s):
                offset = (j - (s - 1) / 2) * width
                ax_p.bar(
                    classes + offset,
                    p[j, i].numpy(),
                    width=width,
                    color=colors(j % 10),
                    label=f"{j + 1}",
                )
        else:
            for j in range(s):
                ax_p.plot(
                    classes,
                    p[j, i].numpy(),
                    color="tab:blue",
                    alpha=0.25,
                    lw=0.8,
                    label=f"{s} draw{'s' if s != 1 else ''}" if j == 0 else None,
                    **lone_point(len(classes), "_"),
                )
        dotted = ".-" if c <= _MOST_CLASS_TICKS else "-"  # (1000 dots: a thick line)
        ax_p.plot(classes, p_bar[i].numpy(), dotted, color=ink(), lw=1.0, label="mean")
        ax_p.set_ylim(0.0, 1.02)
        if c <= _MOST_CLASS_TICKS:
            ax_p.set_xticks(classes)
        else:
            ax_p.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_p.tick_params(labelsize=7)
        ax_p.set_ylabel("prob.", fontsize=7)
        ax_p.set_title(f"{component} {measure} = {float(scores[i]):.4f}", fontsize=8)
    axes[0, 1].legend(
        fontsize=6,
        title="draw / member" if bars else None,
        title_fontsize=6,
        ncol=min(s + 1, 6),
        loc="upper right",
    )
    axes[-1, 1].set_xlabel("class", fontsize=8)
    title = (
        f"The {len(order)} most uncertain of {n} inputs by {component} uncertainty ({measure}), "
        f"S = {s}"
    )
    if s == 1 and component == "epistemic":  # 0 for every input: the ranking is input order
        title = (
            f"The first {len(order)} of {n} inputs: one draw (S = 1) has no epistemic part, "
            "use component='total'"
        )
    fig.suptitle(title, fontsize=10)
    # fixed margins (in inches, whatever k) instead of tight_layout, which measured about
    # 0.5 s for 6 rows
    height = fig.get_figheight()
    fig.subplots_adjust(
        left=0.02, right=0.98, top=1 - 0.55 / height, bottom=0.5 / height, wspace=0.12,
        hspace=0.5,
    )  # fmt: skip
    return fig


@closes_its_figures
def plot_image_grid(
    predictions: Predictions | Tensor,
    images: Tensor,
    targets: Tensor | None = None,
    *,
    rows: int = 4,
    cols: int = 8,
    normalized: bool | None = None,
    mean: Constants = None,
    std: Constants = None,
) -> Figure:
    """A grid of the first ``rows * cols`` inputs with truth, prediction and the draws' spread.

    Each image is titled ``GT <true> / P <predicted>`` (red when wrong) and ``σ <std>``, the
    standard deviation over the S draws of the probability of the predicted class
    ``argmax_c p̄_c`` (population std, divided by S; 0 when S = 1).

    Parameters
    ----------
    predictions : Predictions or Tensor
        ``(S, N, C)`` (or ``(N, C)``) probabilities on N inputs.
    images : Tensor or numpy.ndarray
        The N inputs, as in :func:`~pyrouq.plotting.plot_most_uncertain`.
    targets : Tensor, optional
        ``(N,)`` labels; default ``predictions.targets`` (without either, titles omit GT).
    rows, cols : int, default 4 and 8
        Grid size; cells beyond N stay blank, but a grid of more than 1,024 cells (32 x 32)
        that is more than half blank is refused (the figure is sized to it: 45 x 56 inches).
    normalized, mean, std
        As in :func:`~pyrouq.plotting.plot_most_uncertain`.

    Returns
    -------
    Figure
        A new figure of one axes holding the cells, in row-major order: cell i's image is
        ``axes[0].images[i]`` and its title ``axes[0].texts[i]``; cells beyond N stay blank. No
        ``ax=``: the cells are laid out in inches, on a figure sized to ``rows`` and ``cols``.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> probs = torch.tensor([[[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]],
    ...                       [[0.9, 0.1], [0.1, 0.9], [0.3, 0.7]]])  # S = 2, N = 3, C = 2
    >>> images = torch.rand(3, 1, 28, 28)
    >>> fig = plot_image_grid(probs, images, torch.tensor([0, 1, 1]), rows=1, cols=3)
    >>> print(fig.axes[0].texts[1].get_text())  # input 1: p_1 is 0.5 or 0.9, std 0.2
    GT 1 / P 1
    σ 0.200
    >>> plt.close(fig)
    """
    p = _probs(predictions, "predictions")
    s, n, _ = p.shape
    rows = check_int("rows", rows, hint="It is the number of rows of the grid, e.g. rows=4.")
    cols = check_int("cols", cols, hint="It is the number of columns of the grid, e.g. cols=8.")
    if rows * cols > max(1024, 2 * n):  # (more than half blank: the figure is sized to it)
        fit = min(cols, n)
        raise ValueError(
            f"plot_image_grid(): got rows={rows} x cols={cols} for N={n} inputs, which leaves "
            "more than half of the cells blank: a grid of more than 1,024 cells (32 x 32) must "
            "be at least half full (its figure is sized to rows x cols). Pass e.g. "
            f"rows={-(-n // fit)}, cols={fit}."
        )
    y = _optional_targets(targets, predictions, p)
    shown = list(range(min(rows * cols, n)))
    pics = _display_images(images, n, normalized, shown, mean, std)
    predicted = p.mean(0).argmax(-1)
    top = p.gather(-1, predicted.view(1, n, 1).expand(s, n, 1)).squeeze(-1)  # (S, N)
    spread = top.std(0, correction=0)

    plt = _pyplot()
    # One axes in inch coordinates holds every cell (an image and its title): 32 axes of their
    # own measured 0.8 s to build and draw, this 0.15 s. Each cell is 1.4 x 1.75 inches.
    width, height = 1.4 * cols, 1.75 * rows + 0.5
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_axis_off()
    for cell in range(len(shown)):
        row, col = divmod(cell, cols)
        left, upper = 1.4 * col + 0.075, 0.5 + 1.75 * row + 0.4
        ax.imshow(pics[cell], extent=(left, left + 1.25, upper + 1.25, upper), **_grey(pics))
        pred = int(predicted[cell])
        truth = "" if y is None else f"GT {int(y[cell])} / "
        wrong = y is not None and int(y[cell]) != pred
        ax.text(
            left + 0.625,
            upper - 0.05,
            f"{truth}P {pred}\nσ {float(spread[cell]):.3f}",
            ha="center",
            va="bottom",
            fontsize=8,
            color="tab:red" if wrong else ink(),
        )
    ax.set_xlim(0.0, width)  # after imshow, which sets the limits to the images' extent
    ax.set_ylim(height, 0.0)  # y grows downwards, like the rows
    title = (
        f"Ground truth, prediction and std of the top-class probability over S = {s} draws"
        if cols >= 5
        else f"GT, P and σ over S = {s} draws"  # what fits above a narrow grid
    )
    fig.suptitle(title, fontsize=10, wrap=True)
    return fig


def _grey(pics: np.ndarray) -> dict[str, Any]:
    """imshow's colour map for grey images in ``[0, 1]``; none for RGB ones, drawn as they are."""
    return {"cmap": "gray", "vmin": 0.0, "vmax": 1.0} if pics.ndim == 3 else {}
