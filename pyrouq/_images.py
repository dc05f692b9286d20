"""Batches of one-channel or RGB images: their layout and the normalisation to undo, shared by
:func:`pyrouq.rotation.rotate` and the image plots of :mod:`pyrouq.plotting`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pyrouq._numbers import finite_number, is_one_number, is_real, one_number, shown, text_hint
from pyrouq.data import MNIST_MEAN, MNIST_STD

#: The channel counts taken: one (grey) and three (RGB).
CHANNELS = (1, 3)

#: Per-channel constants, as ``mean=`` and ``std=`` take them: a number for every channel, or
#: one number per channel.
Constants = float | Sequence[float] | None

_CIFAR = "mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616) for CIFAR-10"


def as_nchw(images: Tensor, *, array: bool = False) -> Tensor:
    """``images`` as an ``(N, C, H, W)`` view with C = 1 or 3: ``(N, 1, H, W)`` and
    ``(N, 3, H, W)`` as they are, ``(N, H, W)`` and square flattened ``(N, H * H)`` as one
    channel; another layout is refused with a ValueError saying what to pass (``array``: the
    caller was given a numpy array, whose fixes are numpy's)."""
    shape = images.shape
    if images.dim() == 4 and shape[1] in CHANNELS:
        return images
    if images.dim() == 3:
        return images.unsqueeze(1)
    if images.dim() == 2 and math.isqrt(shape[1]) ** 2 == shape[1]:
        side = math.isqrt(shape[1])
        return images.reshape(shape[0], 1, side, side)
    raise _layout_error(shape, array)


def _layout_error(shape: Sequence[int], array: bool = False) -> ValueError:
    """The ValueError for images that :func:`as_nchw` does not take, saying what to pass (in
    numpy's words for a numpy ``array``, which has no ``permute`` or ``unsqueeze``)."""
    shape = tuple(shape)
    if len(shape) == 4 and shape[3] in CHANNELS:
        turn = "transpose" if array else "permute"
        fix = f"; for channels-last (N, H, W, C) images pass images.{turn}(0, 3, 1, 2)"
    elif len(shape) == 4:
        fix = f"; {shape[1]} channels are not supported, only 1 (grey) or 3 (RGB): " + (
            "drop the alpha channel of RGBA images with images[:, :3]"
            if shape[1] == 4
            else "pass one channel at a time, images[:, c:c + 1]"
        )
    elif len(shape) == 1 or (len(shape) == 2 and shape[0] == shape[1]):  # one image?
        fix = f"; for one image use images{'[None]' if array else '.unsqueeze(0)'}"
    elif len(shape) == 2:
        fix = "; reshape flattened images to (N, C, H, W) unless they are grey and square"
    else:
        fix = "; pass a batch of images in one of these layouts"
    return ValueError(
        f"Expected images of shape (N, 1, H, W) or (N, 3, H, W) (grey or RGB), (N, H, W) or "
        f"(N, H * H) (grey, square, flattened), got shape {shape}{fix}."
    )


def normalisation(
    normalized: bool, mean: Constants, std: Constants, channels: int, *, detected: bool = False
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The per-channel ``(mean, std)`` that images of ``channels`` channels were normalised
    with, ``(x - mean) / std``, or None when they are not (``normalized`` False).

    Without ``mean`` and ``std``, one-channel images get MNIST's constants; RGB images get a
    ValueError saying what to pass (``detected``: their normalisation was read off negative
    pixels, not asked for). A number applies to every channel."""
    if (mean is None) != (std is None):
        given, missing = ("mean", "std") if std is None else ("std", "mean")
        raise ValueError(
            f"Expected mean= and std= together (the normalisation (x - mean) / std), got "
            f"{given}= alone; pass {missing}= too."
        )
    if not normalized:
        if mean is not None:
            raise ValueError(
                "Expected no mean= or std= with normalized=False (images in [0, 1]), got "
                "both; pass normalized=True for images normalised with them, or drop them."
            )
        return None
    if mean is None or std is None:
        if channels == 1:
            return (MNIST_MEAN,), (MNIST_STD,)
        why = " (some pixels are negative)" if detected else ""
        raise ValueError(
            f"Expected mean= and std= for normalised RGB images{why}: the default, MNIST's "
            f"normalisation, has one channel, not {channels}. Pass the per-channel constants "
            f"the images were normalised with, e.g. {_CIFAR}, or normalized=False for images "
            "in [0, 1]."
        )
    return _per_channel("mean", mean, channels), _per_channel("std", std, channels)


def _one_axis(value: Any) -> bool:
    """Whether ``value`` is a tensor or array (anything with a ``shape``, a pandas Series
    too) of one dim or more whose values lie along one axis, the others of size 1."""
    shape = getattr(value, "shape", None)
    return isinstance(shape, tuple) and len(shape) >= 1 and sum(n != 1 for n in shape) <= 1


def _shown_all(value: Any) -> str:
    """``value`` for a message, as repr writes it but each number of a list, tuple, set or
    object array shown by :func:`shown` (an int too large for a float as ``about 10**400``,
    which repr writes out in 401 digits, or refuses past 4300)."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        return f"array({_shown_all(value.tolist())})"
    if not isinstance(value, (list, tuple, set, frozenset)) or not value:
        return shown(value)
    inner = ", ".join(_shown_all(v) for v in value)
    if isinstance(value, tuple):
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return f"[{inner}]" if isinstance(value, list) else f"{{{inner}}}"


def _per_channel(name: str, value: Any, channels: int) -> tuple[float, ...]:
    """``value`` (a number, a tensor or array of one element, or a sequence of numbers / a
    tensor or array of one value per channel, 1-D or shaped to broadcast, ``(1, C, 1, 1)``)
    as ``channels`` finite floats (positive for ``std``), or a TypeError / ValueError naming
    ``name``."""
    low = 0.0 if name == "std" else -math.inf  # (what a string's number must pass: a hint)
    values = value
    if is_one_number(value):  # 0.5, tensor(0.5), tensor([0.5]): as torch broadcasts it,
        values = [value if is_real(value) else one_number(value)] * channels  # for each channel
    elif _one_axis(value):  # (C,), (C, 1, 1), (1, C, 1, 1), a pandas Series, (0,) too
        flat = value.reshape(-1) if torch.is_tensor(value) else np.asarray(value).reshape(-1)
        values = flat.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(
            f"Expected {name} to be a number or a sequence of numbers, one per channel, got "
            f"{type(value).__name__} {_shown_all(value)}{text_hint(value, name, low)}; pass e.g. "
            f"{_CIFAR}."
        )
    if len(values) != channels:
        raise ValueError(
            f"Expected {name} to hold {channels} value(s), one per channel of the images, got "
            f"{len(values)} ({_shown_all(value)}); pass one value per channel, or one number for "
            "all."
        )
    out = []
    for v in values:
        number = finite_number(v)  # tensor(0.5) too; None for 10**400, which float() refuses
        if number is None or (name == "std" and number <= 0):
            need = "a finite number > 0" if name == "std" else "a finite number"
            raise ValueError(
                f"Expected each {name} to be {need}, got {shown(v)}"
                f"{text_hint(v, f'each {name}', low)} in {name}={_shown_all(value)}; "
                f"pass the per-channel {name} the images were normalised with, e.g. {_CIFAR}."
            )
        out.append(number)
    return tuple(out)
