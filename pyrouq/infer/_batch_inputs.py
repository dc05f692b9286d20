"""fit()'s refusals of training batches whose inputs are not one tensor: several tensors (or
one inside a tuple), a dict of named inputs (a network of several inputs), or a batch's
examples left as they came (dicts or ``(x, y)`` pairs that a ``collate_fn`` returned as they
are), each told what to serve instead."""

from __future__ import annotations

from typing import Any

from pyrouq._input_kind import several_inputs
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
    several = several_inputs(x, y)
    if several is not None:
        raise TypeError(f"{where} is {several}")


def unbatched_examples(batch: Any, epoch: int, step: int) -> str | None:
    """The refusal of a training batch that is a batch's examples as they came, not one
    ``(x, y)`` pair (:func:`pyrouq._uncollated.uncollated`: a ``collate_fn`` that returns its
    items as they are); None for other batches."""
    words = uncollated(batch)
    if words is None:
        return None
    return f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} is {words}"
