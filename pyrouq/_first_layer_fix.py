"""What to do where the model's input does not fit its network's first layer, of other channels
or features than it takes: :func:`input_fix`, which a BatchEnsemble layer's check
(:mod:`pyrouq.nn._checks`) and a torch layer's refusal (:mod:`pyrouq._engine._layer_errors`)
say, and :func:`channel_fix`, its words for images, which the plain networks' checks
(:mod:`pyrouq.models.plain`) say too. "The layer before it" is none: the input, or the
network's first layer, must change."""

from __future__ import annotations

import math

import torch

__all__ = ["channel_fix", "input_fix"]


def input_fix(x: torch.Tensor, dim: int, size: int) -> str:
    """What to do where a layer expecting ``size`` channels (``dim`` 1) or features (``dim``
    -1) is given the model's input ``x`` as it came (its first layer): "the layer before it"
    is none; the input, or the network's first layer, must change. (Also said after torch's
    words where a layer of torch's refuses it: :mod:`pyrouq._engine._layer_errors`.)"""
    got, plural = x.shape[dim], "s" if x.shape[dim] != 1 else ""
    if dim == 1:
        said = f"the model's input, of {got} channel{plural} where this layer takes {size}."
        fix = channel_fix(got, size, x.dim() - 2)
        built = f"build the network for {got} input channel{plural}"
        return f"{said} {fix}, or {built} (its first layer's in_channels={got})."
    said = f"the model's input, of {got} feature{plural} where this layer takes {size}."
    if x.dim() > 2 and math.prod(x.shape[1:]) == size:  # images to a network of flat inputs
        return f"{said} Flatten it, x.flatten(1), or put nn.Flatten() first in the network."
    fix = f"Pass inputs of {size} features, or build the network for {got}"
    return f"{said} {fix} (its first layer's in_features={got})."


def channel_fix(got: int, size: int, spatial: int) -> str:
    """How to give images of ``got`` channels (``spatial`` dims) to a first layer taking
    ``size``: repeat a grey channel, average colour ones to grey, else pass ``size``."""
    if got == 1:  # a greyscale image to a network for colour ones
        return f"Repeat the grey channel, x.expand(-1, {size}{', -1' * spatial})"
    if size == 1:
        return "Make them grey, x.mean(1, keepdim=True)"
    return f"Pass inputs of {size} channels"
