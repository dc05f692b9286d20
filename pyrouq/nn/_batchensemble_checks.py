"""The argument checks of the BatchEnsemble layers (:mod:`pyrouq.nn._batchensemble`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pyrouq._numbers import (
    check_at_most,
    check_elements,
    finite_float,
    is_integer,
    shown,
    text_hint,
)
from pyrouq._util import check_count, check_int, warn_caller
from pyrouq._words import close_hint, close_names, did_you_mean, slip_hint

_CONV_SETTINGS = ("stride", "padding", "dilation", "groups", "padding_mode")
"""The convolution settings a BatchEnsemble convolution passes on to the torch layer it builds."""

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
"""torch's convolution padding modes (a transposed convolution takes ``"zeros"`` alone)."""

_FACTOR_OPTIONS = ("init", "r_mean", "r_std", "s_mean", "s_std", "base")
"""The keywords of a BatchEnsemble convolution beside the settings of torch's layer."""

_CONV_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "padding_mode": "zeros",
                  "output_padding": 0}  # fmt: skip
"""Their defaults (and a transposed convolution's ``output_padding``'s), as in torch."""


def _check_members(num_members: object, made: str = "a BatchEnsemble") -> int:
    """``num_members`` as an int >= 1, else refused saying that ``made`` (what is built: "a
    BatchEnsemble", "a rank-1 network") needs one."""
    return check_count(
        "num_members",
        num_members,
        f"{made[:1].upper()}{made[1:]} needs at least one member; 4 is a common choice.",
    )


def _check_sizes(name: str, **sizes: object) -> tuple[int, ...]:
    """The feature or channel sizes of a BatchEnsemble layer built without ``base=`` as ints,
    or a ValueError naming the layer and the size (torch's layer would take ``True`` as 1,
    build a layer of 0 inputs, or fail on a float or a negative size in its own words)."""
    return tuple(
        check_int(f"{name}'s {key}", value, hint=f"Pass {key} as an int such as 16.")
        for key, value in sizes.items()
    )


_CONV_DIMS = {
    1: (nn.Conv1d, nn.ConvTranspose1d),
    2: (nn.Conv2d, nn.ConvTranspose2d),
    3: (nn.Conv3d, nn.ConvTranspose3d),
}


def _check_conv_args(
    name: str, base_type: type, sizes: tuple[object, object], kernel_size: object, settings: dict
) -> None:
    """Refuse the arguments of a BatchEnsemble convolution built without ``base=`` that
    torch's layer would take and fail on later (a stride of 0 at the first forward) or in its
    own words: channels and ``groups`` not positive ints, channels ``groups`` does not divide,
    ``kernel_size``, ``stride``, ``dilation`` not ints >= 1 and ``padding`` (but a
    convolution's "same" / "valid", torch's to check) and ``output_padding`` not ints >= 0,
    or tuples of one per spatial dim."""
    channels = _check_sizes(name, in_channels=sizes[0], out_channels=sizes[1])
    groups = check_int(
        f"{name}'s groups", settings.get("groups", 1), hint="Pass e.g. groups=1 (dense)."
    )
    if any(size % groups for size in channels):
        raise ValueError(
            f"{name} got groups={groups} for {channels[0]} input and {channels[1]} output "
            "channels: groups must divide both. Pass groups=1 for a dense convolution, or "
            "groups=in_channels for a depthwise one."
        )
    transposed = issubclass(base_type, nn.modules.conv._ConvTransposeNd)
    mode = settings.get("padding_mode", "zeros")
    modes = ("zeros",) if transposed else _PADDING_MODES
    if not isinstance(mode, str) or mode not in modes:  # (torch: "unhashable type: 'list'")
        raise ValueError(
            f"Expected {name}'s padding_mode to be "
            + (" or ".join(map(repr, modes)) if len(modes) < 3 else f"one of {modes}")
            + f", got {mode!r}{slip_hint(mode, modes)}. Pass e.g. padding_mode='zeros'"
            + (" (a transposed convolution pads with zeros only)." if transposed else ".")
        )
    dims = next(  # (a subclass of torch's layer keeps its dims)
        d for d, kinds in _CONV_DIMS.items() if issubclass(base_type, kinds)
    )
    for key, minimum, example in (("kernel_size", 1, 3), ("stride", 1, 1), ("dilation", 1, 1),
                                  ("padding", 0, 1), ("output_padding", 0, 1)):  # fmt: skip
        value = kernel_size if key == "kernel_size" else settings.get(key, _CONV_DEFAULTS[key])
        if key == "padding" and isinstance(value, str) and not transposed:
            continue  # torch's to check; a transposed convolution would take "same" as 4 ints
        values = tuple(value) if isinstance(value, (tuple, list)) else (value,) * dims
        if len(values) != dims or not all(is_integer(v) and v >= minimum for v in values):
            raise ValueError(
                f"Expected {name}'s {key} to be an int >= {minimum} or a tuple of {dims} of "
                f"them, got {value!r}. Pass e.g. {key}={example}."
            )
        for v in values:  # (past int64: torch's "Overflow when unpacking long long")
            if is_integer(v):
                check_at_most(f"{name}'s {key}", int(v), f"Pass e.g. {key}={example}.")
        if key == "kernel_size":
            kernel = {f"kernel_size[{i}]": int(k) for i, k in enumerate(values) if is_integer(k)}
    first, second = ("in", "out") if transposed else ("out", "in")  # torch's weight's dims
    size = dict(zip(("in", "out"), channels, strict=True))
    shape = {
        f"{first}_channels": size[first],
        f"{second}_channels / groups": size[second] // groups,
    }
    check_elements(f"{name}'s weight", shape | kernel, "Pass fewer channels or a smaller kernel.")


def _refuse_unknown(name: str, base_type: type, options: dict[str, Any]) -> None:
    """Refuse keywords of ``options`` a BatchEnsemble convolution does not take, naming the
    layer ``name`` (not the private class whose ``__init__`` Python's own TypeError named) and
    what it takes."""
    transposed = issubclass(base_type, nn.modules.conv._ConvTransposeNd)
    settings = (*_CONV_SETTINGS, "output_padding") if transposed else _CONV_SETTINGS
    factors, torch_name = _FACTOR_OPTIONS[:-1], base_type.__name__
    known = (*settings, *_FACTOR_OPTIONS)
    unknown = [key for key in options if key not in known]
    if not unknown:
        return
    own = ("bias", "device", "dtype", "output_padding")  # torch's layers': told below
    guessed = [key for key in unknown if key not in own]
    if len(guessed) == 1:  # (a slip in case, spaces or '-' told as such)
        meant = close_hint(guessed[0], known)
        far = [] if meant else guessed
    else:
        close = {key: close_names(key, known) for key in guessed}
        meant = did_you_mean([m for names in close.values() for m in names])
        far = [key for key in guessed if not close[key]]
    fix = " Leave them out." if far and far == guessed else ""
    if far and far != guessed:  # (the others asked about above)
        one = len(far) == 1
        fix = f" {' and '.join(map(repr, far))} {'is' if one else 'are'} close to none of the "
        fix += f"names it takes: leave {'it' if one else 'them'} out."
    if "output_padding" in unknown:  # (not transposed: a transposed one takes it)
        fix += " output_padding is a transposed convolution's setting: for one, use "
        fix += f"BatchEnsembleConvTranspose{torch_name[-2:]}."
    if "device" in unknown or "dtype" in unknown:  # torch's layers take them
        fix += (
            f" For another device or dtype, copy a {torch_name} made there, base=nn."
            f"{torch_name}(..., device=..., dtype=...), or move the layer: .to(device, dtype)."
        )
    if "bias" in unknown:  # torch's layers take one
        fix += (
            " Every member has biases of its own (from 0 where base has none), so there is no "
            "bias= to set: leave it out."
        )
    raise TypeError(
        f"{name} got the keyword argument(s) {', '.join(map(repr, unknown))}{meant}, which it "
        f"does not take: beside the channels, kernel_size and num_members it takes "
        f"{torch_name}'s settings ({', '.join(settings)}), the factor options "
        f"({', '.join(factors)}) and base (a {torch_name} to copy).{fix}"
    )


def _check_factor_init(init: str, r_mean: float, r_std: float, s_mean: float, s_std: float) -> None:
    if init not in ("normal", "random_sign"):
        hint = slip_hint(init, ("normal", "random_sign"))
        raise ValueError(
            f"Unknown init {init!r}{hint}: expected 'normal' (r ~ N(r_mean, r_std), s ~ N(s_mean, "
            "s_std)) or 'random_sign' (entries +-1)."
        )
    for name, value in (("r_std", r_std), ("s_std", s_std)):
        if finite_float(value) is None or value < 0:
            raise ValueError(
                f"Expected {name} >= 0 (a finite float), got {shown(value)}"
                f"{text_hint(value, name, 0, low_allowed=True)}. It is the standard deviation of "
                "the rank-1 factors around their mean; 0.5 is the default."
            )
    for name, value in (("r_mean", r_mean), ("s_mean", s_mean)):
        if finite_float(value) is None:
            raise ValueError(
                f"Expected {name} to be a finite float, got {shown(value)}"
                f"{text_hint(value, name)}. It is the mean of the rank-1 factors; 1.0 (the "
                "default) starts every member at the shared weight."
            )


NORMAL_DEFAULTS = {"r_mean": 1.0, "r_std": 0.5, "s_mean": 1.0, "s_std": 0.5}
"""The factor options ``init="normal"`` draws with, and their defaults."""


def warn_unread_by_random_sign(init: str, options: dict[str, float]) -> None:
    """Warn where ``init="random_sign"`` is given a factor mean or std other than its default:
    it sets every entry to +-1 and reads none of them (``init="normal"`` draws with them)."""
    unread = [f"{k}={v!r}" for k, v in options.items() if v != NORMAL_DEFAULTS[k]]
    if init == "random_sign" and unread:
        one = len(unread) == 1
        warn_caller(
            f"init='random_sign' sets every factor entry to +1 or -1 and reads no mean or "
            f"std: {', '.join(unread)} {'is' if one else 'are'} ignored. Leave "
            f"{'it' if one else 'them'} out, or pass init='normal' to draw r ~ N(r_mean, "
            "r_std), s ~ N(s_mean, s_std)."
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
    if isinstance(value, tuple):
        value = tuple(int(v) if is_integer(v) else v for v in value)  # (numpy ints too)
    if isinstance(base_value, tuple) and is_integer(value):
        value = (int(value),) * len(base_value)
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
