"""What both families of layers check on their inputs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pyrouq._util import input_hint

#: The spatial dims of a convolution's input, by the rank of its weight.
_SPATIAL = {3: "L", 4: "H, W", 5: "D, H, W"}


def check_layer_input(
    layer: nn.Module,
    x: Any,
    dim: int,
    size: int,
    expected: str,
    ranks: tuple[int, ...] | None = None,
    min_rank: int = 1,
) -> None:
    """Refuse an input of a layer that is not a tensor, or whose rank (one of ``ranks``, or
    at least ``min_rank``) or feature size (``x.shape[dim]``) is not the layer's, naming the
    shape expected and the one given."""
    name = type(layer).__name__
    if not torch.is_tensor(x):
        raise TypeError(
            f"{name} expects a torch.Tensor input, got {type(x).__name__}{input_hint(x)}."
        )
    rank_ok = x.dim() >= min_rank if ranks is None else x.dim() in ranks
    if not rank_ok or x.shape[dim] != size:
        raise ValueError(
            f"{name} expects inputs of shape {expected}, got shape {tuple(x.shape)}. Check the "
            "output size of the layer before it, or this layer's input size."
        )
