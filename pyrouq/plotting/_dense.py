"""Drawing many points: curves thinned to what a figure's pixels show, dense artists
rasterized in vector files.

A curve of a million points (the risk-coverage curve, an ECDF, a regression's mean and bands
over a test set) costs seconds to draw, and more to place a ``loc="best"`` legend, which tests
every vertex; the figure cannot show more than a few points per pixel column. Filled bands and
scatters of that many points make SVG and PDF files of 100 MB or more (a line is simplified by
matplotlib, a fill or markers are not)."""

from __future__ import annotations

from typing import Any

import numpy as np

#: Curves of more points than this are thinned (:func:`thinned`); fewer are drawn whole.
THIN_ABOVE = 100_000
#: :func:`thinned` keeps at most four points in each of this many equal slices of the x range:
#: a slice is 0.15 pixel of a 6-inch axes at 100 dpi (0.44 pixel at 300 dpi).
THIN_SLICES = 4096
#: Fills and scatters of more points than this are rasterized in vector files (SVG, PDF).
RASTERIZE_ABOVE = 10_000


def thinned(x: np.ndarray, *ys: np.ndarray, slices: int = THIN_SLICES) -> np.ndarray:
    """Indices of the points of the curves ``(x, y)`` (one per ``y``, on the same ``x``,
    sorted) to draw: all of them up to :data:`THIN_ABOVE` points, else in each of ``slices``
    equal slices of the x range its first and last point, and the lowest and the highest
    point of each curve (the first of equals), in order.

    Drawn through these points, a curve passes within one slice's width of every point of the
    whole curve: within a slice it still runs from its first point through its lowest and
    highest to its last (taking every height between), and from one slice to the next it is
    the whole curve's segment. With ``drawstyle="steps-post"`` the same holds (the steps are
    merged within a slice)."""
    n = len(x)
    if n <= THIN_ABOVE:
        return np.arange(n)
    x = np.asarray(x, dtype=np.float64)
    span = x[-1] - x[0]
    where = (x - x[0]) / span * slices if span > 0 else np.zeros(n)
    slice_of = np.minimum(where.astype(np.int64), slices - 1)
    starts = np.flatnonzero(np.r_[True, slice_of[1:] != slice_of[:-1]])
    sizes = np.diff(np.r_[starts, n])
    kept = [starts, starts + sizes - 1]
    for y in ys:
        y = np.asarray(y)
        for extreme in (np.minimum, np.maximum):
            at = np.flatnonzero(y == np.repeat(extreme.reduceat(y, starts), sizes))
            first = np.r_[True, slice_of[at][1:] != slice_of[at][:-1]]  # one per slice
            kept.append(at[first])
    return np.unique(np.concatenate(kept))


def rasterized(n: int) -> dict[str, Any]:
    """Keyword arguments of a fill or a scatter of ``n`` points: ``rasterized=True`` above
    :data:`RASTERIZE_ABOVE` (a picture at the file's dpi in a vector file, no change in a
    PNG), none below."""
    return {"rasterized": True} if n > RASTERIZE_ABOVE else {}
