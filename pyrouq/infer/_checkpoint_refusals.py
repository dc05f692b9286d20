"""What ``fit(checkpoint=...)`` refuses before training rather than after its first epoch: a
target, model, guide or metadata :func:`pyrouq.save` would refuse (:func:`check_checkpoint`),
and any other of save()'s checks run early (:func:`refuse_checkpoint`), each told as the run's
refusal; and what it warns of: a file there holding an interrupted run, which a run not
resuming it writes over."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from pyrouq import checkpoint as _checkpoint
from pyrouq._util import warn_caller
from pyrouq._wrappers import unwrapped
from pyrouq.checkpoint._stopped import stopped_run

__all__ = ["check_checkpoint", "refuse_checkpoint"]


def check_checkpoint(
    checkpoint: Any, metadata: Any, model: Any, guide: Any, resume_from: Any = None
) -> None:
    """Refuse, before training, a ``fit(checkpoint=..., metadata=...)`` run whose checkpoint
    :func:`pyrouq.save` would refuse (the target, the model, the guide, the metadata); warn of
    ``metadata`` without ``checkpoint``, which nothing keeps, and of a ``checkpoint`` holding
    an interrupted run when no ``resume_from`` is given."""
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
        if resume_from is None:
            _warn_of_an_interrupted_run(checkpoint)


def _warn_of_an_interrupted_run(checkpoint: str | os.PathLike[str]) -> None:
    """Warn when ``checkpoint`` holds the training state of a run fit() did not finish (fewer
    epochs done than it planned: stopped by Ctrl-C, an error or a killed process), which this
    run, started afresh, writes over with its first checkpoint (a notebook cell run again
    without ``resume_from``). Nothing for a finished run, a checkpoint without a training
    state (save()'s, the command line's final one), another file or none."""
    where = _where_stopped(checkpoint)
    if where is None:
        return
    done, planned, steps = where["epochs_done"], where["epochs"], where["steps"]
    path = str(checkpoint)
    warn_caller(
        f"fit(checkpoint={path!r}): that file holds an interrupted run ({done} of {planned} "
        f"epochs done, {steps} step{'' if steps == 1 else 's'}), and no resume_from was given, "
        "so this run starts afresh and writes over it with its own checkpoints. To continue "
        f"that run instead, pass resume_from={path!r} (and epochs={planned}, its total); to "
        "keep it, pass another checkpoint= path; to start anew without this warning, delete "
        "the file."
    )


def _where_stopped(checkpoint: str | os.PathLike[str]) -> dict[str, int] | None:
    """Where the unfinished fit() run ``checkpoint`` holds stopped (its epochs planned, epochs
    done and steps), or None: no file, another file, a checkpoint without a training state,
    a finished run. Only the training state is read: the file's tensors are mapped, not
    loaded."""
    if not os.path.isfile(checkpoint):
        return None
    try:
        payload = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        return stopped_run(payload.get("training"))
    except Exception:  # (not fit()'s: whatever it is, the run writes over it, as save() does)
        return None


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
