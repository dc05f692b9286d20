"""pyrouq's own tensors on the model's device, whatever torch's default device is."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from pyrouq._util import module_device

_F = TypeVar("_F", bound=Callable[..., Any])


def on_device(device: torch.device | str) -> contextlib.AbstractContextManager[Any]:
    """``torch.device(device)`` as a context when torch's default device
    (``torch.set_default_device``) is another one; else a null context (no torch function
    mode, no cost per call)."""
    device = torch.device(device)
    if torch.empty(0).device == device:  # the default, as torch >= 2.2 tells it
        return contextlib.nullcontext()
    return torch.device(device)


def on_model_device(*modules: Any) -> contextlib.AbstractContextManager[Any]:
    """:func:`on_device` of the first of ``modules`` that holds a tensor (none: a null context).

    fit() builds tensors of its own without naming a device (its running sums, the loss of
    a step, the random state a checkpoint keeps), as Pyro's sites do: under a default device
    other than the model's (``torch.set_default_device('meta')`` in a script that builds
    large skeletons, ``'cuda'`` beside a network kept on the CPU) they landed there, and the
    first step failed in torch's backward pass ("Cannot copy out of meta tensor; no data!").
    """
    device = module_device(*modules)
    return contextlib.nullcontext() if device is None else on_device(device)


def on_the_models_device(fn: _F) -> _F:
    """Run ``fn(model, ...)`` under :func:`on_model_device` of ``model`` (of an MCMC result's
    ``.model``): the arviz export and the PSIS diagnostic draw and score with Pyro's sites,
    whose tensors would land on another default device."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        model = args[0] if args else kwargs.get("model")  # (none: fn's own TypeError)
        with on_model_device(model, getattr(model, "model", None)):
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]
