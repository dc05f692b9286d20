"""A batch that is a loader's examples as they came, uncollated (a ``collate_fn`` that returns
its items as they are, ``collate_fn=lambda b: b``): a list of ``(x, y)`` examples, of ``(x,)``
ones (a ``TensorDataset`` of the inputs alone), of dicts with the same keys or, from a torch
``DataLoader`` of such a collate_fn, of single tensors. What :func:`pyrouq.fit` and
:func:`pyrouq.predict` say of it (:func:`uncollated`), in the same words."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import torch

from pyrouq._util import len_or
from pyrouq._words import article

__all__ = ["uncollated", "uncollated_tensors"]

_AS_THEY_CAME = "the examples of a batch as they came"
_ONE_BATCH = "one stacked batch"  # what predict() reads instead (fit(): one (x, y) pair)
_INPUTS = "one batch of inputs"


def uncollated(batch: Any, needs_targets: bool = True, loader: Any = None) -> str | None:
    """What ``batch`` is and what to do, ``"a list of 4 (x, y) examples (...): the examples of
    a batch as they came, uncollated (...), not one (x, y) pair. Leave collate_fn out: ..."``,
    where it is a batch's examples as they came; None for other batches. ``needs_targets``:
    fit()'s words (each batch one ``(x, y)`` pair), else predict()'s (inputs, with or without
    targets). ``loader``: the loader whose first batch it is, which tells a list of single
    tensors (:func:`uncollated_tensors`) from the ``[x, y]`` of a batch."""
    unit = "one (x, y) pair" if needs_targets else _ONE_BATCH
    held = _examples(batch) or _tensors(batch, loader)
    if held is not None:
        what, into = held
        words = (
            f"a {type(batch).__name__} of {what}: {_AS_THEY_CAME}, uncollated (a collate_fn "
            "that returns its items as they are, as collate_fn=lambda b: b), not "
            f"{unit}. Leave collate_fn out: the DataLoader's default one stacks the examples "
            f"into {into}; or return torch.utils.data.default_collate(items) from yours."
        )
        if needs_targets and into != "(x, y)":
            words += (
                " fit() needs the targets too: serve (x, y) examples, e.g. "
                "DataLoader(TensorDataset(x, y), batch_size=64)."
            )
        return words
    keys = _same_keys(batch)
    if keys is None:
        return None
    named = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    serve = (
        "Serve each batch as one pair of tensors, e.g. a collate_fn returning "
        "(torch.stack([item['x'] for item in items]), "
        "torch.as_tensor([item['y'] for item in items])) with your keys."
        if needs_targets
        else "Serve each batch as a tensor of inputs (or an (x, y) pair of tensors), e.g. a "
        "collate_fn returning torch.stack([item['x'] for item in items]) with your inputs' "
        "key."
    )
    return (
        f"a {type(batch).__name__} of {len(batch)} dicts with the same keys ({named}): "
        f"{_AS_THEY_CAME} (a collate_fn that returns its items as they are), not {unit}. " + serve
    )


def uncollated_tensors(batch: Any, loader: Any) -> bool:
    """Whether ``batch``, the first batch of ``loader``, a list of tensors of one shape, is a
    torch ``DataLoader``'s examples as they came rather than a batch's ``[x, y, ...]``: the
    loader has a ``collate_fn`` of its own and a dataset of ``batch_size`` examples or more,
    the list holds ``batch_size`` tensors (two or more), and they are not ``batch_size`` rows
    each (as the ``x`` and ``y`` of a first, full, batch are)."""
    data = torch.utils.data
    if not isinstance(loader, data.DataLoader) or not isinstance(batch, list):
        return False
    if loader.collate_fn in (data.default_collate, data.default_convert):
        return False
    size = loader.batch_size
    if size is None or size < 2 or len(batch) != size or len_or(loader.dataset, size) < size:
        return False
    if not all(torch.is_tensor(t) for t in batch) or len({t.shape for t in batch}) != 1:
        return False
    first = batch[0]
    return not (first.dim() and first.shape[0] == size)


def _tensors(batch: Any, loader: Any) -> tuple[str, str] | None:
    if not uncollated_tensors(batch, loader):
        return None
    return f"{len(batch)} tensors of shape {tuple(batch[0].shape)}", _INPUTS


def _same_keys(batch: Any) -> list | None:
    """The keys of a list (or tuple) of two or more dicts with the same keys; else None."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        return None
    if not all(isinstance(item, Mapping) for item in batch):
        return None
    keys = list(batch[0])
    if not keys or any(list(item) != keys for item in batch[1:]):
        return None
    return keys


def _examples(batch: Any) -> tuple[str, str] | None:
    """What a list (or tuple) of examples holds, ``"2 (x, y) examples (a tensor of shape (3,)
    and a tensor of shape ())"``, and what the default collate_fn stacks them into; None for
    another batch. ``(x, y)`` examples: one or more pairs of a tensor and a tensor or number,
    the same shapes in every pair (one pair: its y one label, a number or a 0-d tensor, not a
    batch's targets); ``(x,)`` examples: two or more 1-tuples of tensors of one shape (a
    ``TensorDataset`` of the inputs alone)."""
    if not isinstance(batch, (tuple, list)) or not batch:
        return None
    if not all(isinstance(item, (tuple, list)) for item in batch):
        return None
    if len(batch) >= 2 and all(len(item) == 1 and torch.is_tensor(item[0]) for item in batch):
        if len({item[0].shape for item in batch}) != 1:
            return None
        return f"{len(batch)} (x,) examples (a tensor of shape {tuple(batch[0][0].shape)})", _INPUTS
    if not all(len(item) == 2 for item in batch):
        return None
    if not all(torch.is_tensor(x) for x, _ in batch):
        return None
    if not all(torch.is_tensor(y) or isinstance(y, numbers.Number) for _, y in batch):
        return None
    shapes = {(tuple(x.shape), tuple(y.shape) if torch.is_tensor(y) else None) for x, y in batch}
    label = batch[0][1]
    if len(shapes) != 1 or (len(batch) == 1 and torch.is_tensor(label) and label.dim()):
        return None
    x_shape, y_shape = shapes.pop()
    kind = type(label).__name__
    y_kind = f"a tensor of shape {y_shape}" if y_shape is not None else f"{article(kind)} {kind}"
    return (
        f"{len(batch)} (x, y) example{'s' if len(batch) > 1 else ''} "
        f"(a tensor of shape {x_shape} and {y_kind})",
        "(x, y)",
    )
