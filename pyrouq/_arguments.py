"""Argument checks shared by the loaders, the data files and the figures: a path, a device, a
shuffling generator's saved state. Each refuses in words naming the argument, what came and
what to pass (torch's and pathlib's own errors named none of them)."""

from __future__ import annotations

import os
from typing import Any

import torch


def check_folder(name: str, value: object, hint: str) -> None:
    """Refuse a folder ``value`` that is not a path (a str or an ``os.PathLike``, such as a
    ``pathlib.Path``): pathlib's "expected str, bytes or os.PathLike object, not int" did not
    name the argument. ``hint`` says what to pass."""
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"Expected {name} to be a folder path (str or pathlib.Path), got "
            f"{type(value).__name__}. {hint}"
        )


def check_device(device: Any, caller: str, lost: str = "the loaders would serve no data") -> None:
    """Refuse a ``device`` (None: the default, left alone) that torch cannot put tensors on
    here (no GPU, a name torch does not know) or the meta device, which holds no values
    (``lost``: what the call would lose on it), before anything is read: torch's errors
    ("Found no NVIDIA driver") came after the files were read, naming neither the argument
    nor the call."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{caller}: expected device to be a torch device, e.g. 'cpu' or 'cuda', got "
            f"{device!r} ({first}). Pass device='cpu' or leave it out."
        ) from None
    if parsed.type == "meta":
        raise ValueError(
            f"{caller}: device={device!r} holds shapes, no values, so {lost}. Pass "
            "device='cpu' or 'cuda' (or leave it out)."
        )
    try:
        torch.zeros(1, device=parsed)
    except (RuntimeError, AssertionError) as err:  # no GPU, no CUDA build, no such index
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"{caller}: torch cannot use device={device!r} here ({first}). Pass device='cpu' "
            "or leave it out."
        ) from None


def set_generator_state(generator: torch.Generator, state: object, who: str) -> None:
    """``generator.set_state(state)``, or a TypeError where ``state`` is not the uint8 tensor
    that ``get_rng_state()`` returns (torch's own: "expected a torch.ByteTensor, but got
    NoneType"), a ValueError where it has another number of bytes than the generator's."""
    if not torch.is_tensor(state) or state.dtype != torch.uint8:
        got = f"a {state.dtype} tensor" if torch.is_tensor(state) else type(state).__name__
        raise TypeError(
            f"{who}.set_rng_state() expects the torch.uint8 tensor that get_rng_state() "
            f"returns, got {got}. Pass loader.get_rng_state() of this kind of loader."
        )
    size = generator.get_state().numel()
    if state.numel() != size:  # torch's "Expected a CPUGeneratorImplState of size 5056 ..."
        raise ValueError(
            f"{who}.set_rng_state() expects the {size}-byte state that get_rng_state() returns, "
            f"got a uint8 tensor of {state.numel()} bytes (another generator's?). Pass "
            "loader.get_rng_state() of this kind of loader."
        )
    generator.set_state(state)
