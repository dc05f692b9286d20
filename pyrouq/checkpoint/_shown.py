"""A loaded :class:`~pyrouq.checkpoint.Checkpoint` at a glance: its one-line repr names the
model's and the guide's classes and sizes, whether an optimizer state came, the training
state's epochs and the file, where the dataclass's own repr held the whole model, guide and
optimizer state (a screenful in a notebook). The attributes hold every value."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

__all__ = ["checkpoint_repr"]

_METADATA_SHOWN = 60
"""Characters up to which the metadata is shown whole; a longer dict is shown by its keys."""


def checkpoint_repr(checkpoint: Any) -> str:
    """``Checkpoint(model=<class, size>, guide=..., optimizer_state=..., metadata=...,
    training=<epochs done of planned>, path=...)`` on one line."""
    metadata = repr(checkpoint.metadata)
    if len(metadata) > _METADATA_SHOWN:
        metadata = f"<keys {', '.join(repr(key) for key in checkpoint.metadata)}>"
    saved = None if checkpoint.optimizer_state is None else "<saved>"
    path = None if checkpoint.path is None else str(checkpoint.path)
    return (
        f"Checkpoint(model={_module(checkpoint.model)}, guide={_module(checkpoint.guide)}, "
        f"optimizer_state={saved}, metadata={metadata}, "
        f"training={_training(checkpoint.training)}, path={path!r})"
    )


def _module(module: nn.Module | None) -> str:
    """``<class, its latent sites' and its parameters' sizes>``, or ``None``."""
    if module is None:
        return "None"
    parts = []
    latent = getattr(module, "latent_sites", None)
    if callable(latent):  # a Bayesian model: its weights are latent sites, not parameters
        shapes = latent()
        weights = sum(math.prod(shape) for shape in shapes.values())
        sites = f"{len(shapes)} latent site{'' if len(shapes) == 1 else 's'}"
        parts.append(f"{sites} ({weights:,} values)")
    held = sum(p.numel() for p in module.parameters())
    if held or not parts:
        parts.append(f"{held:,} parameter{'' if held == 1 else 's'}")
    return f"<{type(module).__name__}, {', '.join(parts)}>"


def _training(training: dict[str, Any] | None) -> str:
    """``<done of planned epochs>`` of fit()'s training state, or ``None``."""
    if training is None:
        return "None"
    try:
        done = int(training["epochs_done"])
        planned = f" of {int(training['epochs'])}" if "epochs" in training else ""
    except (KeyError, TypeError, ValueError):  # (load() checks it: not reached from there)
        return "<saved>"
    return f"<{done}{planned} epochs done>"
