"""How the predictions' ``to()`` read their arguments as ``Tensor.to`` takes them:
:func:`device_and_dtype`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from pyrouq._arguments import check_device

__all__ = ["device_and_dtype"]


def device_and_dtype(owner: str, device: Any, dtype: Any) -> tuple[Any, Any, str]:
    """``(device, dtype, came)`` of ``owner``'s ``to(device, dtype)`` (``owner`` the method's
    name in the refusal, ``"Predictions.to()"``): a dtype in the device's place is the dtype,
    a tensor gives its device and dtype (``came`` then ``"a tensor of dtype "``, what gave the
    dtype, else ``""``); a TypeError for a dtype or a tensor followed by a dtype, or a dtype's
    name (``"float64"``, ``np.float64``) in the device's place; a ValueError for a device
    torch cannot use here (``"cuda"`` without a GPU, a misspelt name) or the meta device (a
    meta tensor's too). The dtype is not checked: each ``to()`` says which it takes."""
    came = ""
    if isinstance(device, (torch.dtype, Tensor)):
        if dtype is not None:
            raise TypeError(
                f"{owner} takes a device, then a dtype; got a {type(device).__name__} in the "
                f"device's place, then dtype={dtype}. Pass to(device, dtype), to(dtype) or "
                "to(tensor)."
            )
        if isinstance(device, Tensor):  # its device and dtype, as Tensor.to(other) takes
            dtype, came = device.dtype, "a tensor of dtype "
            device = device.device
        else:
            device, dtype = None, device
    elif device is not None:  # before any copy: torch's errors named neither call nor argument
        name = device if isinstance(device, str) else getattr(device, "__name__", None)
        name = device.name if isinstance(device, np.dtype) else name  # an array's .dtype
        named = getattr(torch, str(name).removeprefix("torch."), None)  # "float64", np.float64
        if isinstance(named, torch.dtype):
            fix = (  # torch.half, torch.int64: refused by each to() in turn
                f"pass the torch dtype, {named} (the predictions take torch.float32 or "
                "torch.float64)"
                if named in (torch.float32, torch.float64)
                else "pass torch.float32 or torch.float64, the dtypes the predictions take"
            )
            raise TypeError(
                f"{owner} takes a device or a torch dtype, got {device!r}, which names a "
                f"dtype; {fix}, or a device such as 'cpu' or 'cuda'."
            )
    if device is not None:  # a tensor's too: a meta tensor's device holds no values
        check_device(device, owner, "the predictions would hold no values to evaluate")
    return device, dtype, came
