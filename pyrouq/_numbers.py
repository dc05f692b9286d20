"""What counts as a number in an argument: Python's and numpy's, never a bool or a tensor
(:func:`is_one_number` takes one-value tensors and arrays too, where a value may be one)."""

from __future__ import annotations

import math
import numbers
from typing import Any, TypeGuard

import numpy as np
import torch

INT64_MAX = 2**63 - 1
"""The largest count pyrouq takes (:func:`check_at_most`): torch holds sizes, counts and
indices as int64, and a larger int is its "Overflow when unpacking long long"."""


def is_integer(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an integer number: a Python int or a numpy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: object) -> TypeGuard[float]:
    """Whether ``value`` is a real number: a Python int or float or a numpy scalar of either,
    not a bool (a tensor is not: pass ``float(t)``). Typed as int and float, which numpy's
    scalars stand in for."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def finite_float(value: object) -> float | None:
    """``value`` as a float if it is a real number (:func:`is_real`) whose float is finite, else
    None: NaN, inf, and an int too large for a float (``10**400``, which ``float()`` refuses
    with an OverflowError)."""
    if not is_real(value):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown(value: object) -> str:
    """``repr(value)`` for a message, but an int too large for a float as ``about 10**N``
    (Python refuses to print an int of over 4300 digits)."""
    if is_integer(value) and abs(int(value)) > 10**308:
        sign = "-" if int(value) < 0 else ""
        return f"about {sign}10**{math.floor(math.log10(abs(int(value))))}"
    return repr(value)


def check_at_most(name: str, value: int, hint: str = "", maximum: int = INT64_MAX) -> None:
    """Refuse an int ``value`` past ``maximum``, by default :data:`INT64_MAX` (``10**400``
    was torch's "Overflow when unpacking long long", or a hang where it counted layers);
    ``hint`` (what to pass) ends the message."""
    if value > maximum:
        bound = "2**63 - 1, torch's largest int64" if maximum == INT64_MAX else f"{maximum}"
        tail = f" {hint}" if hint else ""
        raise ValueError(f"Expected {name} to be at most {bound}, got {shown(value)}.{tail}")


def check_elements(what: str, sizes: dict[str, int], hint: str) -> None:
    """Refuse ``sizes`` whose product, the elements of ``what`` (a layer's weight), is past
    :data:`INT64_MAX`, which no torch tensor holds (torch's "Storage size calculation
    overflowed", or a layer that took them and failed at its first forward); numpy ints
    are taken as Python ints (their product wraps around past int64)."""
    if (elements := math.prod(int(size) for size in sizes.values())) > INT64_MAX:
        product = " x ".join(f"{name} {shown(int(size))}" for name, size in sizes.items())
        raise ValueError(
            f"Expected {what} to hold at most 2**63 - 1 elements (torch's largest int64), got "
            f"{product} = {shown(elements)}. {hint}"
        )


def tensor_hint(value: object, *, integer: bool = False) -> str:
    """For the message refusing ``value``: what to do when it is a tensor, else ``""``:
    ``float(t)`` (a number argument takes a float, and ``int(t)`` would cut one); with
    ``integer``, the argument takes an integer alone, so ``int(t)`` (``float(t)``, 5.0, is
    refused as no integer), except for a tensor holding a number that is no integer (2.5, or
    a complex 2.5+0j or 2+1j: ``int(t)`` would cut it to 2 unsaid), which is told so, as the
    float 2.5 is. A tensor of other than one element (``int(t)``, ``float(t)`` raise for it)
    is told its shape."""
    if not torch.is_tensor(value):
        return ""
    if value.numel() != 1:  # (int(t): "only one element tensors can be converted")
        kind = "integer" if integer else "number"
        return f" (a tensor of shape {tuple(value.shape)}: pass one Python {kind})"
    if integer:
        inexact = value.is_floating_point() or value.is_complex()  # (int(2.5+0j): 2 too)
        if inexact and value.device.type != "meta":
            number = complex(value.detach()) if value.is_complex() else float(value.detach())
            if number.imag or not number.real.is_integer():  # (nor nan, nor inf)
                return f" (a tensor holding {number!r}, not an integer)"
        return " (a tensor: pass a Python integer, int(t))"
    return " (a tensor: pass a Python number, float(t))"  # (int(t) would cut 0.1 to 0)


def text_hint(
    value: object,
    name: str,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_allowed: bool = False,
    inf_allowed: bool = False,
) -> str:
    """For the message refusing ``value`` (no real number to :func:`is_real`): where it is a
    string holding a finite number, or a number that is not real to pyrouq (a Decimal), what
    to pass, ``name=<its float>`` where that float lies in the range (``low``, ``high``) (from
    ``low`` itself where ``low_allowed``; ``'inf'`` too, as ``name=float('inf')``, where
    ``inf_allowed``), else ``""``. A ``name`` that is no argument's (``"each std"``, an
    element of a sequence) is told the float alone; one ending in ``=`` is kept."""
    if isinstance(value, str):
        kind = "a string"
    elif isinstance(value, numbers.Number) and not isinstance(value, (numbers.Real, complex)):
        kind = f"a {type(value).__name__}"
    else:
        return ""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (ValueError, TypeError, OverflowError):
        return ""
    if number == math.inf and inf_allowed:
        return _pass_float(kind, name, "float('inf')")
    if not math.isfinite(number):
        return ""
    if (low <= number if low_allowed else low < number) and number < high:
        return _pass_float(kind, name, repr(number))
    opening = "[" if low_allowed else "("
    if high == math.inf:
        return f" ({kind}: pass a float {'>=' if low_allowed else '>'} {low:g})"
    return f" ({kind}: pass a float in {opening}{low:g}, {high:g}))"


def _pass_float(kind: str, name: str, written: str) -> str:
    """:func:`text_hint`'s advice to pass the float ``written`` (``name=`` it, for an argument)."""
    if name.isidentifier() or name.endswith("="):
        return f" ({kind}: pass a float, {name.rstrip('=')}={written})"
    return f" ({kind}: pass the float {written})"


def is_array_like(value: object) -> bool:
    """Whether ``value`` is a list, a tuple or an array (numpy's, a pandas frame: it has
    ``__array__``) rather than a tensor: what ``torch.as_tensor`` makes one of."""
    return isinstance(value, (list, tuple)) or hasattr(value, "__array__")


def is_one_number(value: object) -> bool:
    """Whether ``value`` is one real number: a Python or numpy scalar (not a bool), or a
    tensor or array holding one real value (``noise / scaler.y_std`` is a 0-d tensor, a metric
    may be left as one)."""
    if torch.is_tensor(value):
        return value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool
    if isinstance(value, np.ndarray):
        return value.size == 1 and value.dtype.kind in "fiu"
    return is_real(value)


def one_number(value: Any) -> float:
    """The number :func:`is_one_number` accepted, as a float (a tensor's detached)."""
    if torch.is_tensor(value):
        return float(value.detach().reshape(()))
    if isinstance(value, np.ndarray):
        return float(value.reshape(()))
    return float(value)


def finite_number(value: object) -> float | None:
    """:func:`finite_float` of a number :func:`is_one_number` accepts (a one-value tensor or
    array too, as its value): None for NaN, inf, an int too large for a float (``10**400``)
    and anything that is not one number."""
    if not is_one_number(value):
        return None
    return finite_float(value if is_real(value) else one_number(value))
