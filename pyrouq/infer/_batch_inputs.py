"""fit()'s refusals of training batches whose inputs are not one tensor: several tensors (or
one inside a tuple), a dict of named inputs (a network of several inputs), or a batch's
examples left as they came (dicts that a ``collate_fn`` returned as they are), each told what
to serve instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pyrouq._input_kind import WRAPPER


def refuse_several_inputs(batch: tuple | list, epoch: int, step: int) -> None:
    """A TypeError for the ``(x, y)`` batch whose ``x`` is several tensors (or one in a tuple
    or list) or a dict of them (or whose two items are examples, dicts with the same keys);
    nothing for other batches."""
    x, y = batch
    where = f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch}"
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
    examples = unbatched_examples(batch, epoch, step)
    if examples is not None:
        raise TypeError(examples)
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
    keys: a batch's examples as they came, not one ``(x, y)`` pair (a ``collate_fn`` that
    returns its items as they are); None for other batches."""
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
