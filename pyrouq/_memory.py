"""The memory of the device new tensors land on, to refuse up front a network that could never
fit in it: one built layer by layer (an ``MLP`` of ``10**12`` hidden layers, a normalisation
layer copied for ``10**12`` members) ran on for hours before the machine ran out of memory."""

from __future__ import annotations

import os

import torch

from pyrouq._default_device import _default_device


def device_memory(device: torch.device) -> int | None:
    """The bytes of memory of ``device``: the machine's RAM for the CPU, the GPU's own for a
    CUDA device; None where unknown (another device, such as the meta device, which holds no
    values; a platform without ``os.sysconf``)."""
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):  # (Windows has no sysconf)
            return None
    if device.type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device() if device.index is None else device.index
        return int(torch.cuda.get_device_properties(index).total_memory)
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def check_fits(
    what: str,
    elements: int,
    hint: str,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Refuse ``what`` (a network, a layer) of ``elements`` tensor elements in ``dtype`` on
    ``device`` (by default torch's default dtype and device, where new layers land) when they
    take more bytes than the whole memory of that device, before anything is built; ``hint``
    says what to pass instead."""
    device = _default_device() if device is None else device
    total = device_memory(device)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    nbytes = elements * torch.empty((), dtype=dtype, device="cpu").element_size()
    if total is not None and nbytes > total:
        raise ValueError(
            f"{what} would hold {elements:.3g} values ({_gib(nbytes)} in {dtype}), more than "
            f"the {_gib(total)} of memory of the {device.type} it is built on: it could never "
            f"be built. {hint}"
        )
