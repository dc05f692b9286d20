"""A loader's batch size, as its attributes tell it: what a resumed run's checkpoint records
and compares (:mod:`pyrouq.infer._loop`, :mod:`pyrouq.infer._resume_warnings`), the batch
fit()'s refusal of NaN or inf inputs names (:mod:`pyrouq.infer._training`) and what fit()'s
refusals name on ranks: a batch too small for a BatchNorm (:mod:`pyrouq._batchnorm`), an epoch
without batches (:mod:`pyrouq.infer._fit_inputs`)."""

from __future__ import annotations

from typing import Any

from pyrouq._numbers import is_integer

__all__ = ["loader_batch_size"]


def loader_batch_size(loader: Any) -> int | None:
    """``loader``'s batch size: its own ``batch_size`` (a DataLoader's, a pyrouq loader's),
    else its batch sampler's (``batch_sampler=``, or a ``BatchSampler`` given as ``sampler=``
    with ``batch_size=None``), as a Python int (a loader or batch sampler of one's own may hold
    numpy's); None where it tells none (a batch sampler of one's own without a
    ``batch_size``, an iterable of batches)."""
    size = getattr(loader, "batch_size", None)
    if size is None:
        batches = getattr(loader, "batch_sampler", None)
        if batches is None or not hasattr(batches, "batch_size"):
            batches = getattr(loader, "sampler", None)
        size = getattr(batches, "batch_size", None)
    return int(size) if is_integer(size) else None
