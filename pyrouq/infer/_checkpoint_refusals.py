"""What ``fit(checkpoint=...)`` refuses before training rather than after its first epoch: a
target, model, guide or metadata :func:`pyrouq.save` would refuse (:func:`check_checkpoint`),
and any other of save()'s checks run early (:func:`refuse_checkpoint`), each told as the run's
refusal."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from pyrouq import checkpoint as _checkpoint
from pyrouq._wrappers import unwrapped

__all__ = ["check_checkpoint", "refuse_checkpoint"]


def check_checkpoint(checkpoint: Any, metadata: Any, model: Any, guide: Any) -> None:
    """Refuse, before training, a ``fit(checkpoint=..., metadata=...)`` run whose checkpoint
    :func:`pyrouq.save` would refuse (the target, the model, the guide, the metadata); warn of
    ``metadata`` without ``checkpoint``, which nothing keeps."""
    if metadata is not None and checkpoint is None:
        warnings.warn(
            "fit(metadata=...) is stored in the checkpoints, but no checkpoint= was given: "
            "it is not kept. Pass checkpoint=PATH, or save it with pyrouq.save(..., "
            "metadata=...).",
            stacklevel=3,
        )
    if checkpoint is not None:
        _checkpoint.check_target(checkpoint, "fit(checkpoint=...)")
        # (out of their wrappers, as save() takes them: DataParallel, torch.compile)
        refuse_checkpoint(_checkpoint.describe_model, unwrapped(model))
        refuse_checkpoint(_checkpoint.describe_guide, unwrapped(guide))
        _checkpoint.json_text(metadata if metadata is not None else {})


def refuse_checkpoint(check: Callable, *args: Any) -> None:
    """Run one of :func:`pyrouq.save`'s checks for ``fit(checkpoint=...)``, before training,
    its refusal told as the run's."""
    try:
        check(*args)
    except _checkpoint.CheckpointError as err:
        raise _checkpoint.CheckpointError(
            f"fit(checkpoint=...) saves with pyrouq.save(), which refuses this run: {err} "
            "Or leave checkpoint= out."
        ) from None
