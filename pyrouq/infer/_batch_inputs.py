"""fit()'s refusals of training batches whose inputs are not one tensor: several tensors (or
one inside a tuple), a dict of named inputs (a network of several inputs), or a batch's
examples left as they came (dicts or ``(x, y)`` pairs that a ``collate_fn`` returned as they
are), each told what to serve instead."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import torch

from pyrouq._input_kind import WRAPPER
from pyrouq._words import article


def refuse_several_inputs(batch: tuple | list, epoch: int, step: int) -> None:
    """A TypeError for the ``(x, y)`` batch whose ``x`` is several tensors (or one in a tuple
    or list) or a dict of them (or whose two items are examples, dicts with the same keys or
    ``(x, y)`` pairs); nothing for other batches."""
    x, y = batch
    where = f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch}"
    examples = unbatched_examples(batch, epoch, step)  # two examples, not one (x, y)
    if examples is not None:
        raise TypeError(examples)
    if isinstance(x, (tuple, list)) and len(x) == 1 and torch.is_tensor(x[0]):
        raise TypeError(  # one input in a tuple: no other inputs to compute or concatenate
            f"{where} is ({type(x).__name__} of 1 tensor, {type(y).__name__}): the input "
            f"tensor inside a {type(x).__name__}, and pyrouq runs the network on the tensor "
            "itself. Serve it as x, not inside a tuple or list (x[0])."
        )
    if isinstance(x, (tuple, list)) and x and all(torch.is_tensor(t) for t in x):
        raise TypeError(  # several inputs: (ids, padding mask), (features, lengths)
            f"{where} is ({type(x).__name__} of {len(x)} tensors, {type(y).__name__}), and "
            "pyrouq runs the network on one input tensor x. Serve one tensor: compute the "
            "other inputs from x in forward (a padding mask: x == pad_id), or concatenate "
            "them into x and split it there."
        )
    if not isinstance(x, Mapping):
        return
    # a network of named inputs, {"input_ids": ..., "attention_mask": ...}, whatever y is
    targets = "" if torch.is_tensor(y) else ", and y as one tensor of targets"
    came = f"{type(y).__name__} of {_entries(y)}" if isinstance(y, Mapping) else None
    raise TypeError(
        f"{where} is ({type(x).__name__} of {_entries(x)}, {came or type(y).__name__}), "
        "and pyrouq runs the network on one input tensor x. Wrap the network in "
        f"{WRAPPER.format(what='the dict')}, convert that wrapper, and serve that tensor as "
        f"x{targets}."
    )


def _entries(mapping: Mapping) -> str:
    """ "1 entry", "2 entries"."""
    return f"{len(mapping)} {'entry' if len(mapping) == 1 else 'entries'}"


def unbatched_examples(batch: Any, epoch: int, step: int) -> str | None:
    """The refusal of a batch that is a list (or tuple) of two or more dicts with the same
    keys, or of ``(x, y)`` examples (:func:`_example_pairs`): a batch's examples as they
    came, not one ``(x, y)`` pair (a ``collate_fn`` that returns its items as they are);
    None for other batches."""
    pairs = _example_pairs(batch)
    if pairs is not None:
        return (
            f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} is a "
            f"{type(batch).__name__} of {pairs}: the examples of a batch as they came, "
            "uncollated (a collate_fn that returns its items as they are, as collate_fn=lambda "
            "b: b), not one (x, y) pair. Leave collate_fn out: the DataLoader's default one "
            "stacks the examples into (x, y); or return "
            "torch.utils.data.default_collate(items) from yours."
        )
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        return None
    if not all(isinstance(item, Mapping) for item in batch):
        return None
    keys = list(batch[0])
    if not keys or any(list(item) != keys for item in batch[1:]):
        return None
    named = ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "")
    return (
        f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} is a "
        f"{type(batch).__name__} of {len(batch)} dicts with the same keys ({named}): the "
        "examples of a batch as they came (a collate_fn that returns its items as they are), "
        "not one (x, y) pair. Serve each batch as one pair of tensors, e.g. a collate_fn "
        "returning (torch.stack([item['x'] for item in items]), "
        "torch.as_tensor([item['y'] for item in items])) with your keys."
    )


def _example_pairs(batch: Any) -> str | None:
    """What a list (or tuple) of ``(x, y)`` examples holds, "2 (x, y) examples (a tensor of
    shape (3,) and a tensor of shape ())", or None for another batch: one or more pairs of a
    tensor and a tensor or number (numpy's too), the same shapes in every pair (one pair: its
    y one label, a number or a 0-d tensor, not a batch's targets)."""
    if not isinstance(batch, (tuple, list)) or not batch:
        return None
    if not all(isinstance(item, (tuple, list)) and len(item) == 2 for item in batch):
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
        f"(a tensor of shape {x_shape} and {y_kind})"
    )
