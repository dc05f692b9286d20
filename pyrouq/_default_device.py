"""pyrouq's calls under torch's usual default device, the CPU, whatever a script set."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

_F = TypeVar("_F", bound=Callable[..., Any])


def cpu_default() -> contextlib.AbstractContextManager[Any]:
    """torch's default device as the CPU for the time of a call, when a script set another
    (``torch.set_default_device('meta')`` to build large skeletons, ``'cuda'``); else a null
    context (no torch function mode, no cost per call).

    pyrouq and Pyro build tensors without naming a device (fit()'s running sums, a step's
    loss, the random state a checkpoint keeps, a site's scale), then move them to the model's
    or the data's device where needed, as they do under torch's usual default: under another
    default those tensors landed there, and fit() failed in its first backward pass ("Cannot
    copy out of meta tensor; no data!"). The model's own device is not the default taken: a
    CUDA model under a CPU default is the usual case, in which the CPU generators of the
    loaders' shuffles must meet CPU ``randperm`` calls. Code of the user's that runs inside
    the call (a loader, a callback, the network's forward) sees the CPU default too.
    """
    if _default_device().type == "cpu":
        return contextlib.nullcontext()
    return torch.device("cpu")


def _default_device() -> torch.device:
    """torch's default device, as where a new tensor lands: ``torch.get_default_device()``
    (torch >= 2.3) sees a ``with torch.device(...)`` block only from torch 2.8 on."""
    return torch.empty(0).device


def under_cpu_default(fn: _F) -> _F:
    """Run ``fn`` under :func:`cpu_default` (the arviz export and the PSIS diagnostic draw and
    score with Pyro's sites, whose tensors would land on another default device)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with cpu_default():
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]
