"""Whether the ranks' optimizers are the same, compared before :func:`pyrouq.fit`'s first
step (:func:`check_same_optimizer`): their class, their parameter groups and the groups'
settings, each setting as numbers the ranks can compare (beside the models' descriptions,
:mod:`pyrouq.infer._rank_models`)."""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch

from pyrouq.infer._distributed import Group, extremes

__all__ = ["check_same_optimizer"]


_HOW_ONLY = frozenset({"foreach", "fused", "capturable", "differentiable"})
"""Optimizer settings that choose an implementation, not the numbers: free to differ."""


def _setting_numbers(value: Any) -> list[float]:
    """A setting as numbers the ranks can compare: each number (a tensor's values, a bool as
    0 or 1) as it is, anything else (a string, None, a NaN) by a hash of its repr."""
    many = value if isinstance(value, (tuple, list)) else [value]
    out = []
    many = [
        x for v in many for x in (v.flatten().tolist() if isinstance(v, torch.Tensor) else [v])
    ]  # a tensor by its values (its repr names its device, cuda:<rank>)
    for v in many:
        if isinstance(v, (int, float)) and math.isfinite(v):
            out.append(float(v))
        else:
            out.append(float(zlib.crc32(repr(v).encode())))
    return out


def check_same_optimizer(optimizer: Any, group: Group) -> None:
    """Refuse to start when the ranks' optimizers differ: their class, their parameter groups
    (how many parameters each holds, which settings) and the groups' settings, numbers compared
    exactly (those choosing an implementation, such as ``foreach``, aside). Each rank steps
    its own optimizer from the averaged gradients, and ``optim=`` builds it with settings
    fit() does not see (its ``lr`` is then ignored): ranks whose optimizers differ (an lr
    scaled by the rank, SGD on one and Adam on another) would drift apart silently."""
    if not group.active:
        return
    layout, names, numbers = [type(optimizer).__name__], [], []
    for i, settings in enumerate(optimizer.param_groups):
        keys = sorted(k for k in settings if k != "params" and k not in _HOW_ONLY)
        layout.append(f"group {i}: {len(settings['params'])} {keys}")
        for key in keys:
            values = _setting_numbers(settings[key])
            layout.append(f"{key}: {len(values)}")
            names += [f"param group {i}'s {key}"] * len(values)
            numbers += values
    code = torch.tensor([float(zlib.crc32("|".join(layout).encode()))], dtype=torch.float64)
    high, low = extremes(code, group)
    fix = (
        "Build the same optimizer on every rank (optim=...: the same class, parameter groups "
        "and settings): each rank steps its own optimizer from the averaged gradients, and "
        "ranks whose optimizers differ would train models that drift apart."
    )
    if bool(high != low):
        raise ValueError(
            f"fit(): the optimizers differ between ranks: their class or parameter groups "
            f"({type(optimizer).__name__} with {len(optimizer.param_groups)} parameter "
            f"group(s) on rank {group.rank}). {fix}"
        )
    if not numbers:
        return
    high, low = extremes(torch.tensor(numbers, dtype=torch.float64), group)
    pairs = zip(names, high.tolist(), low.tolist(), strict=True)
    differ = dict.fromkeys(name for name, h, lo in pairs if h != lo)
    if differ:
        raise ValueError(
            f"fit(): the optimizers ({type(optimizer).__name__}) differ between ranks: "
            f"{', '.join(differ)}. {fix}"
        )
