"""How :func:`pyrouq.predict` reads its inputs: ``x`` (or ``batchnorm_data``) as input batches,
each with the labels a loader of ``(x, y)`` batches gives, and what it says of labels that
cannot be the predictions' targets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from pyrouq._input_kind import WRAPPER, several_inputs
from pyrouq._numbers import is_array_like
from pyrouq._uncollated import uncollated, uncollated_tensors
from pyrouq._util import describe_batch, other_items_fix, warn_caller
from pyrouq._words import article


def batches(
    x: Tensor | Iterable, batch_size: int, what: str = "x"
) -> Iterable[tuple[Tensor, Tensor | None]]:
    """``(inputs, labels or None)`` of each batch of ``what``: a tensor cut into
    ``batch_size`` rows, or an iterable of tensors or ``(x, y)`` batches (anything else is
    refused, in words naming ``what``)."""
    if torch.is_tensor(x):
        for start in range(0, x.shape[0], batch_size):
            yield x[start : start + batch_size], None
        return
    other = x is None or isinstance(x, (Mapping, str, int, float))  # would fail, or give its keys
    if other or hasattr(x, "__array__"):  # a numpy array, a pandas frame: rows are no batches
        shape = f" of shape {tuple(x.shape)}" if hasattr(x, "shape") else ""
        fix = f"Convert an array first: torch.as_tensor({what})"
        fix = "Pass a tensor (N, ...) or a DataLoader" if other else fix
        if isinstance(x, Mapping):  # the inputs of a network of named inputs
            fix += (
                ". pyrouq runs networks of one tensor input: for a network whose forward takes "
                f"a dict, wrap it in {WRAPPER.format(what='the dict')}, and convert that wrapper"
            )
        came = "None" if x is None else f"{article(type(x).__name__)} {type(x).__name__}"
        raise TypeError(
            f"predict() expects {what} as a torch.Tensor or an iterable of batches, got "
            f"{came}{shape}. {fix}."
        )
    data = torch.utils.data
    if isinstance(x, data.Dataset) and not isinstance(x, data.IterableDataset):
        raise TypeError(
            f"predict() reads {what} as batches of inputs; it got "
            f"{article(type(x).__name__)} {type(x).__name__}, whose "
            f"items are single examples. Pass a loader of it: DataLoader({what}, "
            "batch_size=256) (without shuffle=True, to keep its order)."
        )
    if _looks_like_one_pair(x):
        first, second = x[0], x[1]  # type: ignore[index]
        raise TypeError(
            f"predict() reads {what} as inputs or as an iterable of batches; it got a "
            f"{type(x).__name__} of two tensors that looks like one (x, y) pair (shapes "
            f"{tuple(first.shape)} and {tuple(second.shape)}), whose second tensor would be read "
            f"as a batch of inputs. Pass the inputs alone, {what}=x, or the pair as a list of "
            f"batches, [(x, y)]."
        )
    for index, batch in enumerate(x):
        loader = x if index == 0 else None  # (a last batch may be short: [x, y] of 1 row each)
        if torch.is_tensor(batch):
            yield batch, None
        elif _stacked(batch, loader):
            if len(batch) > 2:  # (x, y, weights) or (x, extra, y): which is y? (fit() refuses)
                raise TypeError(
                    f"predict() expects {what} as a tensor or an iterable of tensors / (x, y) "
                    f"batches; batch {index + 1} of {what} is {describe_batch(batch, False)}"
                    + other_items_fix(batch)
                )
            target = batch[1] if len(batch) > 1 and torch.is_tensor(batch[1]) else None
            yield batch[0], target
        else:
            as_they_came = uncollated(batch, needs_targets=False, loader=loader)
            pair = isinstance(batch, (tuple, list)) and len(batch) == 2 and as_they_came is None
            several = several_inputs(*batch) if pair else None  # (a network of several inputs)
            arrays = is_array_like(batch) and as_they_came is None and several is None
            fix = " Make them tensors (torch.as_tensor)." if arrays else ""
            raise TypeError(
                f"predict() expects {what} as a tensor or an iterable of tensors / (x, y) batches; "
                f"a batch was {as_they_came or several or describe_batch(batch, False)}{fix}"
            )


def _stacked(batch: Any, loader: Any) -> bool:
    """Whether ``batch`` is an ``(x, y)`` (or ``(x,)``, ``(x, y, ...)``) batch of tensors, not
    a torch ``DataLoader``'s single tensors as they came (:func:`uncollated_tensors`: told by
    the first batch, ``loader`` None for the others)."""
    if not isinstance(batch, (tuple, list)) or not batch or not torch.is_tensor(batch[0]):
        return False
    return not uncollated_tensors(batch, loader)


def _looks_like_one_pair(x: Any) -> bool:
    """Whether ``x`` is a tuple/list ``(x, y)`` rather than two batches of inputs: two tensors
    of as many rows but of different ranks (batches of one input have one rank; not widths,
    which differ between batches of sequences of two lengths). Read by index: iterating may
    count as a read."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        return False
    first, second = x[0], x[1]
    if not (torch.is_tensor(first) and torch.is_tensor(second)):
        return False
    if first.dim() == 0 or second.dim() == 0 or first.shape[0] != second.shape[0]:
        return False
    return first.dim() != second.dim()


def unaligned_labels(
    inputs: Tensor,
    labels: Tensor,
    index: int,
    first: Tensor | None = None,
    words: tuple[str, str] = ("labels", "label"),
) -> str | None:
    """Why the labels of the ``index``-th (0-based) batch cannot be its inputs' targets (not
    one label per input, or not of the shape per input of ``first``, the labels of the first
    batch that had some, which they are joined to), or None when they can. ``words``: what
    the likelihood calls them, plural and singular (a regression's: targets)."""
    many, one = words
    if not labels.dim() or labels.shape[0] != inputs.shape[0]:
        return (
            f"batch {index + 1} of x holds {inputs.shape[0]} inputs and {many} of shape "
            f"{tuple(labels.shape)}, not one {one} per input"
        )
    if first is not None and labels.shape[1:] != first.shape[1:]:
        return (
            f"batch {index + 1} of x holds {many} of shape {tuple(labels.shape)} and an earlier "
            f"batch {many} of shape {tuple(first.shape)}: their shapes per input differ"
        )
    return None


def warn_of_labels(why: str, words: tuple[str, str] = ("labels", "label")) -> None:
    """Warn that the labels x yields are not kept as the predictions' targets, and why
    (``words``, as in :func:`unaligned_labels`)."""
    warn_caller(
        f"predict(): the {words[0]} x yields cannot be the predictions' targets ("
        f"{' '.join(why.split())}); the predictions carry none. Pass targets to evaluate(), "
        "or yield (x, y) batches whose y are the targets."
    )
