"""Whether a ``torch.autocast`` is on for a device type, and what it casts to, in every torch
pyrouq supports: before torch 2.4, ``torch.is_autocast_enabled()`` and its kin take no device
(a device argument is a ``TypeError`` there), and the CPU's has calls of its own."""

from __future__ import annotations

import torch


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype a ``torch.autocast`` on for ``device_type`` (``"cpu"``, ``"cuda"``) casts to,
    or None where none is on."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cpu":
            on = torch.is_autocast_cpu_enabled()
            return torch.get_autocast_cpu_dtype() if on else None
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        return None
