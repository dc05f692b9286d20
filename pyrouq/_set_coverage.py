"""The metrics of :mod:`pyrouq.calibration`'s prediction sets and intervals: coverage, mean set
size, coverage per class (re-exported there)."""

from __future__ import annotations

import torch
from torch import Tensor

from pyrouq._conformal_scores import _interval_targets, _intervals, _labels_of, _sets


def coverage(sets_or_intervals: Tensor | tuple[Tensor, Tensor], targets: Tensor) -> float:
    """The fraction of inputs whose set holds the label (``(N, C)`` booleans and ``(N,)``
    labels), or of targets inside their interval (``(lo, hi)`` and targets ``(N, D)`` or
    ``(N,)`` when D = 1; every output counts). An interval with ``lo > hi`` covers nothing: a
    CQR interval crosses where the mixture's interval is narrower than ``-2 * threshold``
    (:class:`~pyrouq.ConformalRegressor`), at some inputs or at all of them.

    Examples
    --------
    >>> import torch
    >>> sets = torch.tensor([[True, False, False], [True, True, False], [False, False, True]])
    >>> coverage(sets, torch.tensor([0, 2, 2]))
    0.6666666666666666
    >>> lo, hi = torch.tensor([0.0, 0.0]), torch.tensor([1.0, 2.0])
    >>> coverage((lo, hi), torch.tensor([0.5, 3.0]))  # 3.0 is outside [0, 2]
    0.5
    """
    if isinstance(sets_or_intervals, tuple):
        lo, hi = _intervals(sets_or_intervals)
        shape = tuple(lo.shape)
        if lo.numel() == 0:
            raise ValueError(
                f"coverage(): expected at least one interval, got shape {shape}: the coverage "
                "of no intervals is undefined."
            )
        y = _interval_targets(targets, lo)
        return float(((y >= lo) & (y <= hi)).double().mean())
    sets = _sets(sets_or_intervals, intervals=True)
    y = _labels_of(sets, targets, "coverage()")
    return float(sets.gather(1, y[:, None]).double().mean())


def mean_set_size(sets: Tensor) -> float:
    """The mean number of classes per prediction set.

    Examples
    --------
    >>> import torch
    >>> mean_set_size(torch.tensor([[True, False, False], [True, True, False]]))
    1.5
    """
    return float(_sets(sets).double().sum(1).mean())


def class_conditional_coverage(sets: Tensor, targets: Tensor) -> Tensor:
    """``(C,)``: per class, the fraction of its inputs whose set holds it (NaN for a class
    with no input).

    Examples
    --------
    >>> import torch
    >>> sets = torch.tensor([[True, False, False], [True, True, False], [False, False, True]])
    >>> class_conditional_coverage(sets, torch.tensor([0, 2, 2]))  # no input of class 1
    tensor([1.0000,    nan, 0.5000], dtype=torch.float64)
    """
    sets = _sets(sets)
    y = _labels_of(sets, targets, "class_conditional_coverage()")
    hit = sets.gather(1, y[:, None])[:, 0].double()
    count = torch.zeros(sets.shape[1], dtype=torch.float64, device="cpu").index_add_(
        0, y.cpu(), torch.ones_like(hit).cpu()
    )  # (counted on the CPU whatever the default device, as the labels are)
    covered = torch.zeros(sets.shape[1], dtype=torch.float64, device="cpu")
    covered.index_add_(0, y.cpu(), hit.cpu())
    return covered / count
