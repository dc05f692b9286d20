"""The ``seed=`` of :func:`pyrouq.predict`, :func:`pyrouq.to_inference_data` and
:func:`pyrouq.psis_diagnostic`: the call's draws come from torch's random streams seeded with
it, inside a fork of the random state, so that the call repeats to the bit and leaves the
global streams as it found them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from pyrouq._util import check_seed, module_device, seed_generators

__all__ = ["draw_devices", "seeded"]


def draw_devices(model: Any, guide: Any, x: Any) -> list[torch.device]:
    """The accelerators whose generators a call's draws may come from: the model's (or its
    guide's) device; for a model without tensors (a Pyro model function), that of the inputs
    ``x`` (a tensor); with neither known (such a model and a loader), every CUDA device in use.
    Empty on the CPU, whose generator is forked and seeded always."""
    device = module_device(model, guide)
    if device is None and torch.is_tensor(x):
        device = x.device
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        return []
    return [] if device.type in ("cpu", "meta") else [device]


@contextlib.contextmanager
def seeded(seed: object, where: str, devices: list[torch.device]) -> Iterator[None]:
    """The block run with torch's CPU generator and each of ``devices``' seeded with ``seed``
    (checked: an integer in ``[0, 2**32 - 1]``, else the house ValueError naming ``where``),
    as ``pyro.set_rng_seed(seed)`` seeds them (so the draws are those it would give), in a
    fork of their states (``torch.random.fork_rng``): they are put back as they were after
    the block, whatever it raised. Numpy's and Python's streams are left alone: pyrouq draws
    nothing from them there."""
    value = check_seed(seed, where)
    with contextlib.ExitStack() as forks:
        kinds = sorted({device.type for device in devices})
        for kind in kinds:
            same = [device for device in devices if device.type == kind]
            forks.enter_context(torch.random.fork_rng(devices=same, device_type=kind))
        if not kinds:  # the CPU's alone
            forks.enter_context(torch.random.fork_rng(devices=[]))
        seed_generators(None, value)  # the CPU's, then each device's
        for device in devices:
            seed_generators(device, value)
        yield
