"""fit()'s refusals of training batches whose inputs are not one tensor: several tensors (or
one inside a tuple), a dict of named inputs (a network of several inputs), or a batch's
examples left as they came (dicts or ``(x, y)`` pairs that a ``collate_fn`` returned as they
are), each told what to serve instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pyrouq._input_kind import WRAPPER
from pyrouq._uncollated import uncollated


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
    """The refusal of a training batch that is a batch's examples as they came, not one
    ``(x, y)`` pair (:func:`pyrouq._uncollated.uncollated`: a ``collate_fn`` that returns its
    items as they are); None for other batches."""
    words = uncollated(batch)
    if words is None:
        return None
    return f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} is {words}"
