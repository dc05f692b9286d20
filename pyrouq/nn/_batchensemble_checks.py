"""The argument checks of the BatchEnsemble layers (:mod:`pyrouq.nn._batchensemble`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from pyrouq._numbers import is_real
from pyrouq._util import check_count

_CONV_SETTINGS = ("stride", "padding", "dilation", "groups", "padding_mode")
"""The convolution settings a BatchEnsemble convolution passes on to the torch layer it builds."""

_CONV_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "padding_mode": "zeros",
                  "output_padding": 0}  # fmt: skip
"""Their defaults (and a transposed convolution's ``output_padding``'s), as in torch."""


def _check_members(num_members: object) -> int:
    return check_count(
        "num_members",
        num_members,
        "BatchEnsemble needs at least one member; 4 is a common choice.",
    )


def _check_factor_init(init: str, r_mean: float, r_std: float, s_mean: float, s_std: float) -> None:
    if init not in ("normal", "random_sign"):
        raise ValueError(
            f"Unknown init {init!r}: expected 'normal' (r ~ N(r_mean, r_std), s ~ N(s_mean, "
            "s_std)) or 'random_sign' (entries +-1)."
        )
    for name, value in (("r_std", r_std), ("s_std", s_std)):
        if not (is_real(value) and math.isfinite(value)) or value < 0:
            raise ValueError(
                f"Expected {name} >= 0 (a finite float), got {value!r}. It is the standard "
                "deviation of the rank-1 factors around their mean; 0.5 is the default."
            )
    for name, value in (("r_mean", r_mean), ("s_mean", s_mean)):
        if not (is_real(value) and math.isfinite(value)):
            raise ValueError(
                f"Expected {name} to be a finite float, got {value!r}. It is the mean of the "
                "rank-1 factors; 1.0 (the default) starts every member at the shared weight."
            )


def _check_factors_held(dtype: torch.dtype, options: dict[str, float]) -> None:
    """Refuse factor means and stds (``init="normal"``) whose draws a ``dtype`` cannot hold:
    an ``r_mean`` of 1e39 is inf in float32 (1e5 in float16), and every output would be NaN.
    Decided from the numbers (mean + 6 std), not the draws: the same either way, and it reads
    no tensor (meta and fake tensors build as before)."""
    largest = torch.finfo(dtype).max
    for name in ("r", "s"):
        mean, std = options[f"{name}_mean"], options[f"{name}_std"]
        if abs(mean) + 6 * std > largest:
            raise ValueError(
                f"Expected {name}_mean and {name}_std whose draws a {dtype} layer holds (at "
                f"most {largest:.3g} in magnitude), got {name}_mean={mean!r}, {name}_std="
                f"{std!r}: draws would come out inf. Pick a smaller mean and std; 1.0 and 0.5 "
                "(the defaults) start every member near the shared weight."
            )


def _check_base_type(name: str, base: Any, base_type: type) -> None:
    """Refuse a ``base=`` layer that is not a ``base_type``; ``name`` is the BatchEnsemble
    layer's class name."""
    if not isinstance(base, base_type):
        raise TypeError(
            f"{name} copies a {base_type.__name__}, got base={type(base).__name__}. Convert "
            "each layer with its counterpart (pyrouq.batchensemble(net, M) picks it for you)."
        )


def _as_base_has_it(value: Any, base_value: Any) -> Any:
    """``value`` (an int, a list or a tuple) in the form a torch layer stores it: an int
    repeated once per spatial dim of ``base_value``'s tuple, a list as a tuple."""
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(base_value, tuple) and isinstance(value, int) and not isinstance(value, bool):
        value = (value,) * len(base_value)
    return value


def _settings_given(base: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The convolution settings of ``given`` that ``base`` does not have: those given other
    than torch's defaults (which cannot be told from not given) and, once in the form ``base``
    stores them (``3`` for ``(3, 3)``), other than ``base``'s."""
    return {
        k: v
        for k, v in given.items()
        if v != _CONV_DEFAULTS[k] and _as_base_has_it(v, getattr(base, k)) != getattr(base, k)
    }


def _check_base_fits(
    name: str,
    base: Any,
    sizes: tuple[int, int],
    base_sizes: tuple[int, int],
    settings: dict,
    kernel_size: Any = None,
) -> None:
    """Refuse a ``base=`` layer of other sizes (or, for a convolution, another
    ``kernel_size``) than the layer's arguments, or given with other settings than its own
    (``base`` brings its settings)."""
    kernel_differs = kernel_size is not None and (
        _as_base_has_it(kernel_size, base.kernel_size) != base.kernel_size
    )
    if tuple(sizes) != tuple(base_sizes) or kernel_differs:
        what, base_what = f"sizes {tuple(sizes)}", f"sizes {tuple(base_sizes)}"
        if kernel_size is not None:
            what += f", kernel_size={kernel_size!r}"
            base_what += f", kernel_size={base.kernel_size!r}"
        raise ValueError(
            f"{name} got {what} and base={type(base).__name__} of {base_what}: they must "
            f"agree. Use {name}.from_module(base, M), which takes them from base."
        )
    if settings:
        raise ValueError(
            f"{name} got base= and the settings {settings}: base brings its own "
            f"({', '.join(f'{k}={getattr(base, k)!r}' for k in settings)}). Build base with "
            "the settings you want, or leave base out."
        )
