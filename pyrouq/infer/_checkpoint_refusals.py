"""What ``fit(checkpoint=...)`` refuses before training rather than after its first epoch: a
target, model, guide or metadata :func:`pyrouq.save` would refuse (:func:`check_checkpoint`),
and any other of save()'s checks run early (:func:`refuse_checkpoint`), each told as the run's
refusal; and what it warns of, once its arguments are checked
(:func:`warn_of_an_interrupted_run`): a file there holding an interrupted run, which a run not
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

__all__ = ["check_checkpoint", "refuse_checkpoint", "warn_of_an_interrupted_run"]


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


def warn_of_an_interrupted_run(checkpoint: Any, resume_from: Any) -> None:
    """Warn when ``checkpoint`` holds the training state of a run fit() did not finish (fewer
    epochs done than it planned: stopped by Ctrl-C, an error or a killed process), which this
    run writes over with its first checkpoint: one started afresh (a notebook cell run again
    without ``resume_from``) or resuming another file. Nothing where ``resume_from`` is that
    file (the run continues it), for a finished run, a checkpoint without a training state
    (save()'s, the command line's final one), another file or none. fit() calls it once its
    arguments, and the ranks under torch.distributed, are checked (a refused call writes
    nothing over), on every rank, as its other warnings (raised as an error on one rank, it
    stops them all)."""
    if checkpoint is None or _resumes(checkpoint, resume_from):
        return
    where = _where_stopped(checkpoint)
    if where is None:
        return
    done, planned, steps = where["epochs_done"], where["epochs"], where["steps"]
    path = str(checkpoint)
    if resume_from is None:
        given = "no resume_from was given, so this run starts afresh and writes over it"
    else:
        other = _path_of(resume_from)
        shown = "a Checkpoint of no file" if other is None else repr(str(other))
        given = f"this run resumes another ({shown}), so it writes over that file"
    warn_caller(
        f"fit(checkpoint={path!r}): that file holds an interrupted run ({done} of {planned} "
        f"epochs done, {steps} step{'' if steps == 1 else 's'}), and {given} with its own "
        f"checkpoints. To continue that run instead, pass resume_from={path!r} (and "
        f"epochs={planned}, its total); to keep it, pass another checkpoint= path; to start "
        "anew without this warning, delete the file."
    )


def _resumes(checkpoint: str | os.PathLike[str], resume_from: Any) -> bool:
    """Whether ``resume_from`` (a path, or a Checkpoint that pyrouq.load() read from one) is
    the file ``checkpoint``: the same file by another name too (a relative path, a link)."""
    other = _path_of(resume_from)
    if other is None:
        return False
    try:
        return os.path.samefile(checkpoint, other)
    except (OSError, TypeError, ValueError):  # (either missing: compared by their names)
        return os.path.abspath(checkpoint) == os.path.abspath(other)


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


def _path_of(resume_from: Any) -> Any:
    """The file ``resume_from`` names: itself, or the one a Checkpoint was read from (None
    for one of no file)."""
    if isinstance(resume_from, _checkpoint.Checkpoint):
        return resume_from.path
    return resume_from


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
