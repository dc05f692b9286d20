"""Shared pieces of :mod:`pyrouq.plotting`: option types, the lazy pyplot import, input
checks and :func:`~pyrouq.plotting.save_figures`."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, get_args

import numpy as np
import torch
from torch import Tensor

from pyrouq._arguments import check_folder
from pyrouq._images import Constants, as_nchw, normalisation
from pyrouq._metric_inputs import carried_targets
from pyrouq._words import close_hint
from pyrouq.metrics import _prepare, _prepare_probs

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


Component = Literal["total", "aleatoric", "epistemic"]
"""A part of a :class:`~pyrouq.uncertainty.Decomposition`."""

DistributionKind = Literal["hist", "ecdf"]
"""How :func:`~pyrouq.plotting.plot_uncertainty_distributions` draws a distribution: a density
histogram or the empirical CDF."""

_COMPONENTS: tuple[str, ...] = get_args(Component)
_KINDS: tuple[str, ...] = get_args(DistributionKind)
_KIND_WORDS: dict[str, str | None] = {"ccdf": None, "survival": None}
"""Kinds not drawn whose names difflib finds close to one that is (``'ccdf'`` to ``'ecdf'``):
the complementary CDF is 1 minus the ECDF, no typo of it, so no "did you mean" is asked."""

#: Up to this many draws/members, :func:`~pyrouq.plotting.plot_most_uncertain` draws grouped
#: bars (one colour per member) while there are at most 300 of them (S x C, 1.6 pixels wide at
#: 100 dpi); beyond either, one thin line per draw.
MAX_BARS = 10

Probs = Any  # Predictions, (S, N, C) or (N, C) tensor


_P = ParamSpec("_P")
_R = TypeVar("_R")


def closes_its_figures(plot: Callable[_P, _R]) -> Callable[_P, _R]:
    """``plot``, closing the figures it made when it fails: pyplot keeps every figure, and one
    that failed half-drawn (in ``tight_layout``, with ``text.usetex`` and no LaTeX) was left
    open with no handle to close it. A figure given through ``ax=`` is the caller's: kept."""

    @functools.wraps(plot)
    def drawn(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        pyplot = sys.modules.get("matplotlib.pyplot")
        before = set(pyplot.get_fignums()) if pyplot is not None else set()
        try:
            return plot(*args, **kwargs)
        except BaseException:
            pyplot = sys.modules.get("matplotlib.pyplot")  # (imported by plot, maybe)
            if pyplot is not None:
                for number in set(pyplot.get_fignums()) - before:
                    pyplot.close(number)
            raise

    return drawn


def ink() -> Any:
    """The colour of the style's text (black by default, white with ``dark_background``), for
    what is drawn in black on a light figure: a hard-coded black vanished on a dark one. As
    rcParams holds it: a name, or an RGB(A) tuple (whose ``str()`` no colour argument takes)."""
    return _pyplot().rcParams["text.color"]


def lone_point(n: int, marker: str = "o") -> dict[str, Any]:
    """Keyword arguments of ``Axes.plot`` for a line through ``n`` points: a ``marker`` where
    it has one (a line through one point draws nothing), not clipped (drawn whole on an axis
    limit: the risk-coverage point of one input is at coverage 1), else none."""
    return {"marker": marker, "clip_on": False} if n == 1 else {}


# ---------------------------------------------------------------------------------------------
# Saving


def save_figures(figures: Mapping[str, Figure], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each figure to ``out_dir/<name>.png`` (dpi 100) and close it.

    Parameters
    ----------
    figures : dict of str to Figure
        File names (without ``.png``, which is added unless present) and figures, e.g.
        ``{"reliability": plot_reliability(preds, y)}``. Names are plain file names: no
        directory separators, not starting with a dot.
    out_dir : path
        Created (with its parents) when missing.

    Returns
    -------
    list of Path
        The written files, in the order of ``figures``.

    Raises
    ------
    TypeError, ValueError
        For bad names, values that are not figures or an ``out_dir`` that is a file or no
        path, before anything is written: the figures stay open, to be saved again.
    Exception
        Whatever creating ``out_dir`` or writing a figure raised (a full disk, a read-only
        folder): every figure of ``figures`` is closed first, the written and the unwritten
        ones (the files written before the failure stay).

    Examples
    --------
    >>> import tempfile
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> from pyrouq.plotting import plot_reliability
    >>> probs, targets = torch.tensor([[0.9, 0.1], [0.3, 0.7]]), torch.tensor([0, 1])
    >>> fig = plot_reliability(probs, targets)
    >>> with tempfile.TemporaryDirectory() as out_dir:
    ...     [path.name for path in save_figures({"reliability": fig}, out_dir)]
    ['reliability.png']
    >>> plt.fignum_exists(fig.number)  # closed
    False
    """
    if not isinstance(figures, Mapping):
        raise TypeError(
            f"Expected figures to be a dict of name -> Figure, got {type(figures).__name__}; "
            "pass e.g. {'reliability': fig}."
        )
    planned = []
    owners: dict[str, tuple[str, str]] = {}  # file name, without case -> (figure, file)
    for name, fig in figures.items():
        if (
            not isinstance(name, str)
            or not name
            or name.startswith(".")
            or any(sep in name for sep in ("/", "\\", os.sep))
        ):
            raise ValueError(
                f"Expected each figure name to be a plain file name (no directory separators, "
                f"not starting with '.'), got {name!r}; pass e.g. 'reliability'."
            )
        if not callable(getattr(fig, "savefig", None)):
            raise TypeError(
                f"Expected figures[{name!r}] to be a matplotlib Figure, got "
                f"{type(fig).__name__}; pass what the plot_* functions return."
            )
        file = name if name.lower().endswith(".png") else f"{name}.png"
        twin, twin_file = owners.setdefault(file.lower(), (name, file))
        if twin != name:
            where = repr(file) if twin_file == file else f"{twin_file!r} and {file!r}"
            raise ValueError(
                f"Figures {twin!r} and {name!r} would both be written to {where}, one file "
                "where names are compared without case (as on macOS and Windows; '.png' is "
                "added unless present). Give them other names."
            )
        planned.append((file, fig))
    check_folder("out_dir", out_dir, "Pass e.g. out_dir='figures' (created if missing).")
    plt = _pyplot()
    directory = Path(out_dir)
    if directory.exists() and not directory.is_dir():
        raise ValueError(
            f"Expected out_dir to be a folder, got the file {str(directory)!r}; pass a folder "
            "(created if missing)."
        )
    paths = []
    try:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a file on the path, no permission: pathlib's named no argument
            raise type(err)(  # errno and file name kept (the command reads them)
                err.errno,
                f"save_figures() could not create out_dir ({err.strerror or err}); pass a "
                "folder you can write to (created if missing)",
                str(directory),
            ) from err
        for filename, fig in planned:
            path = directory / filename
            fig.savefig(path, dpi=100)
            plt.close(fig)
            paths.append(path)
    except BaseException:  # none left open (pyplot keeps them) for a failure to leak
        for _, fig in planned:
            plt.close(fig)
        raise
    return paths


# ---------------------------------------------------------------------------------------------
# Drawing into a given Axes


def _figure_and_axes(ax: Any, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """``(fig, ax)``: a new figure of ``figsize`` with one axes when ``ax`` is None, else ``ax``
    (checked) and the figure holding it (the top-level one, also for an axes of a subfigure)."""
    plt = _pyplot()
    if ax is None:
        return plt.subplots(figsize=figsize)  # type: ignore[no-any-return]
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

    if not isinstance(ax, Axes):
        fix = "pass one Axes, such as the ax of fig, ax = plt.subplots()"
        got = type(ax).__name__
        if isinstance(ax, np.ndarray):
            first = "axes[" + ", ".join("0" * ax.ndim) + "]" if ax.ndim else "axes.item()"
            got, fix = f"a numpy array of shape {ax.shape}", f"pass one Axes, such as {first}"
        elif isinstance(ax, (Figure, SubFigure)):
            got, fix = f"a {got}", "pass one of its Axes, such as fig.axes[0] or fig.add_subplot()"
        elif isinstance(ax, (list, tuple)):
            got, fix = f"a {got} of {len(ax)}", "pass one Axes, such as axes[0]"
        raise TypeError(
            f"Expected ax to be one matplotlib Axes to draw into, got {got}; {fix}, or leave "
            "ax=None for a figure of its own."
        )
    name = getattr(ax, "name", None)
    if name != "rectilinear":  # a 3-D, polar or map projection: drawing fails inside it
        raise TypeError(
            f"Expected ax to be a 2-D (rectilinear) Axes, got a {name} Axes; pass one made by "
            "plt.subplots() or fig.add_subplot() without a projection, or leave ax=None for a "
            "figure of its own."
        )
    fig = ax.figure
    if fig is None:
        raise ValueError(
            "Expected ax to be an Axes of a figure, got one that was removed from its figure "
            "(ax.remove()); pass an Axes that is still drawn."
        )
    if isinstance(fig, SubFigure):  # its top-level figure (SubFigure.figure is the root)
        fig = fig.figure
    return fig, ax


# ---------------------------------------------------------------------------------------------
# Private helpers


def _pyplot() -> Any:
    """``matplotlib.pyplot``, imported on first use, with Agg where there is no display."""
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency
        raise ImportError(
            "pyrouq.plotting needs matplotlib; install it with `pip install matplotlib`."
        ) from e
    if "matplotlib.pyplot" not in sys.modules and _headless():
        chosen = getattr(matplotlib.rcParams, "_get_backend_or_none", lambda: None)()
        if chosen is None and not os.environ.get("MPLBACKEND"):
            matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _headless() -> bool:
    """No display to draw on: Linux (or another non-macOS Unix) without X11 or Wayland."""
    if sys.platform in ("win32", "darwin"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _check_choice(
    name: str,
    value: object,
    allowed: tuple[str, ...],
    other_words: Mapping[str, str | None] | None = None,
) -> None:
    if value not in allowed:  # (other_words: close_hint's)
        hint = close_hint(value, allowed, other_words)  # (a slip's, a typo's: 'histogram')
        raise ValueError(
            f"Unknown {name} {value!r}{hint}; expected one of {', '.join(map(repr, allowed))}."
        )


def _probs(value: Probs, name: str) -> Tensor:
    """Validated ``(S, N, C)`` float64 probabilities on the CPU."""
    return _prepare_probs(value, name=name).detach().cpu()


def _targets(targets: Tensor | None, predictions: Probs) -> Tensor:
    """``targets``, else ``predictions.targets`` (:func:`carried_targets`), on the CPU."""
    targets = carried_targets(targets, predictions)
    return targets.detach().cpu() if isinstance(targets, Tensor) else targets


def _optional_targets(targets: Tensor | None, predictions: Probs, p: Tensor) -> Tensor | None:
    """Like :func:`_targets`, checked against ``p``, but None when there are none."""
    if targets is None and getattr(predictions, "targets", None) is None:
        return None
    return _prepare(p, _targets(targets, predictions))[1]


def _display_images(
    images: Any,
    n: int,
    normalized: bool | None,
    index: list[int],
    mean: Constants = None,
    std: Constants = None,
) -> np.ndarray:
    """``images[index]`` as a float array in ``[0, 1]`` for imshow: ``(len(index), H, W)`` for
    grey images, ``(len(index), H, W, 3)`` for RGB ones."""
    if normalized is not None and not isinstance(normalized, (bool, np.bool_)):
        raise TypeError(  # ("no" was taken as True, and the images drawn as normalised)
            f"Expected normalized to be True, False or None (None: told from the pixels), got "
            f"{normalized!r}. Pass normalized=True for normalised images, False for [0, 1]."
        )
    array = isinstance(images, np.ndarray)  # (told numpy's fixes: it has no .permute or .to)
    given = str(getattr(images, "dtype", ""))  # numpy's name for an array: int64, not torch's
    if array:
        images = torch.from_numpy(images)
    if not isinstance(images, Tensor):
        raise TypeError(
            f"Expected images to be a torch.Tensor (or numpy array) of N images, got "
            f"{type(images).__name__}; pass e.g. torch.cat([x for x, _ in loader])."
        )
    shape = tuple(images.shape)
    if images.dim() == 0 or shape[0] != n:
        raise ValueError(
            f"Expected images with N={n} entries, one per input of the predictions, got shape "
            f"{shape}; pass the images that were predicted, in the same order."
        )
    nchw = as_nchw(images.detach().cpu(), array=array)
    x = nchw[:, 0] if nchw.shape[1] == 1 else nchw.permute(0, 2, 3, 1)  # (N, H, W[, 3])
    if x.dtype == torch.uint8:  # raw 0-255 pixels: nothing to undo (was: normalized=True,
        # mean= and std= silently ignored)
        said = [f"{k}=" for k, v in (("mean", mean), ("std", std)) if v is not None]
        if normalized:
            said.insert(0, "normalized=True")
        if said:
            raise ValueError(
                f"Expected no normalisation for uint8 images (raw 0-255 pixels, shown as they "
                f"are), got {' and '.join(said)}; drop {'it' if len(said) == 1 else 'them'}, "
                "or pass the float images that were normalised."
            )
        return (x[index].to(torch.float32) / 255).numpy()
    if not x.is_floating_point():
        to_u8, to_float = (
            ("images.astype(np.uint8)", "images.astype(np.float32)")
            if array
            else ("images.to(torch.uint8)", "images.float()")
        )
        raise TypeError(
            f"Expected images of a float dtype or uint8, got {given}; convert them: 0-255 "
            f"pixels with {to_u8} ({to_float} keeps 0-255, which is refused as neither [0, 1] "
            f"nor normalised), values in [0, 1] with {to_float}."
        )
    bad = ~torch.isfinite(x)
    if bad.any():  # NaN would be drawn as a blank image; it also hides the normalisation test
        rows = bad.flatten(1).any(1).nonzero()[:, 0].tolist()  # every image, shown or not
        at = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
        raise ValueError(
            f"Expected finite images, got {int(bad.sum())} NaN or inf pixel(s) in image(s) "
            f"[{at}] ({len(rows)} of {n}); check how the images were made (e.g. a "
            "normalisation by a zero std), or drop those images and their predictions."
        )
    detected = normalized is None and mean is None and std is None
    if normalized is None and not detected:  # mean= and std= (or one of them) say how
        normalized = True
    if normalized is None:
        low, high = float(x.min()), float(x.max())
        normalized = low < 0
        if not normalized and high > 1 + 1e-3:  # neither [0, 1] nor (with black) normalised
            raise ValueError(
                f"Expected float images in [0, 1] or normalised, got values in "
                f"[{low:g}, {high:g}], which would be shown clipped to [0, 1]. Pass raw "
                "0-255 pixels as uint8 (or divide them by 255), normalized=True for "
                "normalised images (with mean= and std= unless MNIST's), or normalized=False "
                "to show them clipped."
            )
    norm = normalisation(normalized, mean, std, nchw.shape[1], detected=detected)
    out = x[index].to(torch.float32)
    if norm is not None and nchw.shape[1] == 1:  # numbers, as grey images always were
        out = out * norm[1][0] + norm[0][0]
    elif norm is not None:  # per channel, the last axis
        scale, shift = (
            torch.tensor(v, dtype=out.dtype, device=out.device) for v in (norm[1], norm[0])
        )
        out = out * scale + shift
    return out.clamp(0.0, 1.0).numpy()
