"""What both families of layers check on their inputs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pyrouq._first_layer_fix import ONE_EXAMPLE, input_fix
from pyrouq._input_kind import input_hint
from pyrouq._util import LayerInputError

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
    named: bool = False,
    copies: int = 1,
) -> None:
    """Refuse an input of a layer that is not a tensor, or whose rank (one of ``ranks``, or
    at least ``min_rank``) or feature size (``x.shape[dim]``) is not the layer's, naming the
    shape expected and the one given (``named``: a :class:`LayerInputError`, the layer named
    by its class and settings, and by its paths in a converted network running it; ``copies``:
    of the model's input in the layer's, a BatchEnsemble's folded batch repeating it per
    member)."""
    name = type(layer).__name__
    if not torch.is_tensor(x):
        raise TypeError(
            f"{name} expects a torch.Tensor input, got {type(x).__name__}{input_hint(x)}."
        )
    rank_ok = x.dim() >= min_rank if ranks is None else x.dim() in ranks
    if not rank_ok or x.shape[dim] != size:
        check = "heck the output size of the layer before it, or this layer's input size."
        if not named and not rank_ok and _one_example(x, dim, size, ranks, min_rank):
            # (a layer called on its own has no layer before it: one image, (C, H, W))
            check = f"One example without its batch dim? {ONE_EXAMPLE} Otherwise c{check}"
        elif not named and _one_channel_unsaid(x, size, ranks):
            shape = (x.shape[0], 1, *x.shape[1:])
            check = (
                "A batch of one-channel images without their channel dim? Pass "
                f"x.unsqueeze(1), of shape {shape}. Otherwise c{check}"
            )
        else:
            check = f"C{check}"
        detail = f"expects inputs of shape {expected}, got shape {tuple(x.shape)}. {check}"
        if named:
            error = LayerInputError.of(layer, detail)
            # (said where the model names the layer as given the model's input)
            given = f"expects inputs of shape {expected}, got shape {tuple(x.shape)}"
            if rank_ok:
                fix = input_fix(x, dim, size, getattr(layer, "groups", 1))
            elif _one_example(x, dim, size * copies, ranks, min_rank):
                fix = f"the model's input, one example without its batch dim. {ONE_EXAMPLE}"
            else:
                fix = (
                    "the model's input. Reshape it to that shape, or build the network's first "
                    "layer for inputs of this one."
                )
            error.input_detail = f"{given}: {fix}"
            raise error
        raise ValueError(f"{name} {detail}")


def _one_example(
    x: torch.Tensor, dim: int, size: int, ranks: tuple[int, ...] | None, min_rank: int
) -> bool:
    """Whether ``x``, refused for its rank, is one example of the shape the layer takes
    without the batch dim: ``(size,)`` to a linear layer, ``(size, H, W)`` to a convolution
    taking ``(B, size, H, W)`` (``size`` times the copies folded into the batch dim: an
    input without one, repeated per member, is ``(M * size, H, W)``)."""
    rank_ok = x.dim() + 1 >= min_rank if ranks is None else x.dim() + 1 in ranks
    per_example = dim - 1 if dim > 0 else dim  # (the feature dim, the batch dim gone)
    return rank_ok and x.dim() > 0 and x.shape[per_example] == size


def _one_channel_unsaid(x: torch.Tensor, size: int, ranks: tuple[int, ...] | None) -> bool:
    """Whether ``x`` is a batch of one-channel images without the channel dim, ``(B, H, W)``,
    to a convolution taking ``(B, 1, H, W)`` first (the rank of ``ranks`` one above x's)."""
    return size == 1 and ranks is not None and x.dim() + 1 == min(ranks) and x.dim() > 1


def check_ensemble_input(
    layer: Any, x: Any, dim: int, size: int, spatial: str, **ranks: Any
) -> None:
    """:func:`check_layer_input` for a BatchEnsemble layer: the batch it expects is the folded
    one ``(M * B, ...)``, or one member's ``(B, ...)`` while the engine runs the members one
    after another (on the CPU); the layer is named by its settings, and by its paths in a
    converted network running it."""
    member = getattr(layer, "_member", None) is not None
    batch = "B" if member else "M * B"
    expected = f"({batch}, {size}, {spatial})" if dim == 1 else f"({batch}, ..., {size})"
    if member:
        expected += " (one member's batch: on the CPU the network runs its members in turn)"
    copies = 1 if member else layer.num_members  # (the model's input repeated per member)
    check_layer_input(layer, x, dim, size, expected, named=True, copies=copies, **ranks)
