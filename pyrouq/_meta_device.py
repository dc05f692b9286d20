"""The refusals of a model or a guide on the meta device (shapes, no values) before a call runs
on it, and of a tensor there where values are read: torch's own errors say ".item() cannot
be called on meta tensors" or "no data"."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from pyrouq._util import module_device


def refuse_meta(value: object, name: str, why: str, got: str | None = None) -> None:
    """Refuse ``value``, a tensor on the meta device, where its values are to be read (torch's
    own words: ".item() cannot be called on meta tensors", "Cannot copy out of meta tensor");
    ``why``: what is missing, and what to do; ``got``: what came, by default "a tensor of
    shape ...". Anything else passes."""
    if isinstance(value, Tensor) and value.is_meta:
        got = f"a tensor of shape {tuple(value.shape)}" if got is None else got
        raise ValueError(
            f"Expected {name} on a real device (cpu or cuda), got {got} on the meta device "
            f"(shapes, no values): {why}"
        )


def real_device(caller: str, model: Any, guide: Any = None) -> Any:
    """:func:`module_device` of ``model`` and ``guide`` (the model's first), or a clear error
    where either is on the meta device, naming which: the guide alone was told "the model is
    on the meta device" where the model held no tensors (a Pyro model function), and one
    beside a model on the CPU was told to move the guide ``guide.to(device)``, which copies
    no values out of it."""
    devices = {"model": module_device(model), "guide": module_device(guide)}  # (each once)
    for name, device in devices.items():
        if device is not None and device.type == "meta":
            raise ValueError(
                f"{caller}: the {name} is on the meta device (shapes, no values), as one built "
                "under torch.set_default_device('meta') or `with torch.device('meta')` is. "
                f"Build it on the CPU, or load its weights: {name}.to_empty(device='cpu'), "
                "then load_state_dict."
            )
    model_device = devices["model"]  # (as module_device(model, guide): the model's first)
    return model_device if model_device is not None else devices["guide"]
