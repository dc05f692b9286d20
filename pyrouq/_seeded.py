"""The ``seed=`` of :func:`pyrouq.predict`, :func:`pyrouq.to_inference_data` and
:func:`pyrouq.psis_diagnostic`: the call's draws come from torch's random streams seeded with
it, inside a fork of the random state, so that the call repeats to the bit and leaves the
global streams as it found them. Also the seed of draws made apart from a run's own (fit()'s
set-up pass: :func:`seed_apart`)."""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from pyrouq._util import check_seed, module_device, seed_generators

__all__ = ["derived_seed", "draw_devices", "seed_apart", "seeded"]


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


def derived_seed(seed: int | None, label: str) -> int:
    """A seed in ``[0, 2**32 - 1]`` for draws kept apart from a run's own, derived without
    drawing a number: from ``seed`` and ``label`` for a seeded run (the same on every rank of
    a process group given the same seed, and from one process to the next: ``hashlib``, not
    ``hash()``), else from torch's CPU generator state and ``label`` (the state left as it
    is, so the run draws on as it would have)."""
    digest = hashlib.sha256(label.encode())
    if seed is not None:
        digest.update(b"seed %d" % seed)
    else:
        digest.update(b"state " + torch.get_rng_state().numpy().tobytes())
    return int.from_bytes(digest.digest()[:4], "little")


def seed_apart(device: torch.device | None, value: int) -> None:
    """Seed torch's CPU generator and ``device``'s (not every CUDA device's), numpy's and
    Python's global ones with ``value``, as ``pyro.set_rng_seed`` seeds them: inside a fork
    of those streams (:func:`~pyrouq._util.global_streams_kept`), its draws are kept apart
    from the run's."""
    seed_generators(device, value)
    np.random.seed(value)  # noqa: NPY002
    random.seed(value)
