"""Where a layer that refuses its input sits: its dotted path in the network running it, found
on the call stack when the refusal is raised (never on the way of a run that succeeds)."""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

_MAX_FRAMES = 200
"""How far up the call stack the network running a layer is looked for."""


def running_path(layer: nn.Module) -> tuple[str, str] | None:
    """The dotted path of ``layer`` in the outermost module that holds it among the local
    variables of the frames calling it (the network whose forward runs it, the model that
    runs that one), and that module's class name; None where no caller holds it in a module
    (a layer called alone)."""
    found: tuple[str, str] | None = None
    looked: set[int] = {id(layer)}
    frame: Any = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        for value in list(frame.f_locals.values()):
            if not isinstance(value, nn.Module) or id(value) in looked:
                continue
            looked.add(id(value))
            path = next((p for p, m in value.named_modules() if m is layer), None)
            if path:
                found = (path, type(value).__name__)
        frame = frame.f_back
    return found


def layer_label(layer: nn.Module) -> str:
    """``layer`` named for a refusal: its class, with its settings, dotted path and network
    where a caller holds it in one (``BatchEnsembleConv2d(3, 4, ...) 'net.2.0' of
    BatchEnsembleNetwork``); else its class alone."""
    name = type(layer).__name__
    where = running_path(layer)
    if where is None:
        return name
    settings = layer.extra_repr()
    return f"{name}({settings}) at {where[0]!r} of {where[1]}"
