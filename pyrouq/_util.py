"""Private helpers shared across modules: argument checks and module introspection."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn


def check_int(name: str, value: object, minimum: int = 1, hint: str = "") -> int:
    """``value`` as an int ``>= minimum``, or a ValueError naming ``name``, the bound and ``value``.

    ``hint`` (what to do) is appended to the message.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"Expected {name} to be {expected}, got {value!r}.{_space(hint)}")
    return value


def check_count(name: str, value: object, hint: str = "") -> int:
    """Like :func:`check_int` with ``minimum=1``, worded "an integer >= 1" (counts of things)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Expected {name} to be an integer >= 1, got {value!r}.{_space(hint)}")
    return value


def check_positive_float(name: str, value: object, hint: str = "") -> float:
    """``value`` as a finite float ``> 0``, or a ValueError naming ``name`` and ``value``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"Expected {name} > 0 (a finite float), got {value!r}.{_space(hint)}")
    return float(value)


def _space(hint: str) -> str:
    return f" {hint}" if hint else ""


def module_device(*modules: Any) -> torch.device | None:
    """Device of the first parameter or buffer of the first ``nn.Module`` that has one."""
    for module in modules:
        if isinstance(module, nn.Module):
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                return tensor.device
    return None


def has_latent_sites(model: Any) -> bool:
    """Whether ``model`` is a pyrouq model with latent sites (``latent_sites()`` non-empty)."""
    sites = getattr(model, "latent_sites", None)
    return bool(sites()) if callable(sites) else False


def forget_params(prefix: str) -> None:
    """Remove every entry of Pyro's param store registered under ``prefix``."""
    import pyro

    store = pyro.get_param_store()
    for name in [n for n in store.keys() if n.startswith((prefix + ".", prefix + "$$$"))]:
        del store[name]


def register_params(prefix: str, module: nn.Module) -> None:
    """Record every parameter of ``module`` as a Pyro ``param`` site named ``prefix$$$name``.

    Like ``pyro.module(prefix, module)``, so that Pyro's optimizers (``SVI``) see the point
    estimates of a model, except that the param store is made to hold the module's *current*
    tensors: after ``module.to(device)`` or ``load_state_dict`` with new tensors, a stale entry
    is replaced instead of being the one optimised.
    """
    import pyro

    store = pyro.get_param_store()
    for name, param in module.named_parameters():
        full = f"{prefix}$$${name}"
        if full not in store or store[full] is not param:
            store[full] = param
        pyro.param(full)
