"""How the predictions' ``to()`` read their arguments as ``Tensor.to`` takes them:
:func:`device_and_dtype`."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["device_and_dtype"]


def device_and_dtype(owner: str, device: Any, dtype: Any) -> tuple[Any, Any, str]:
    """``(device, dtype, came)`` of ``owner``'s ``to(device, dtype)`` (``owner`` the method's
    name in the refusal, ``"Predictions.to()"``): a dtype in the device's place is the dtype,
    a tensor gives its device and dtype (``came`` then ``"a tensor of dtype "``, what gave the
    dtype, else ``""``); a TypeError for a dtype or a tensor followed by a dtype. The dtype is
    not checked: each ``to()`` says which it takes."""
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
    return device, dtype, came
