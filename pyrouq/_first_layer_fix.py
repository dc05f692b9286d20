"""What to do where the model's input does not fit its network's first layer, of other channels
or features than it takes: :func:`input_fix`, which a BatchEnsemble layer's check
(:mod:`pyrouq.nn._checks`) and a torch layer's refusal (:mod:`pyrouq._engine._layer_errors`)
say, and :func:`channel_fix`, its words for images, which the plain networks' checks
(:mod:`pyrouq.models.plain`) say too. "The layer before it" is none: the input, or the
network's first layer, must change."""

from __future__ import annotations

import math

import torch

__all__ = ["ONE_EXAMPLE", "channel_fix", "input_fix", "no_values_fix"]

#: What to do with one example given without its batch dim.
ONE_EXAMPLE = "Pass it as a batch of one, x.unsqueeze(0)."


def input_fix(x: torch.Tensor, dim: int, size: int, groups: int = 1) -> str:
    """What to do where a layer expecting ``size`` channels (``dim`` 1; a convolution of
    ``groups`` groups) or features (``dim`` -1) is given the model's input ``x`` as it came
    (its first layer): "the layer before it" is none; the input, or the network's first
    layer, must change. (Also said after torch's words where a layer of torch's refuses it:
    :mod:`pyrouq._engine._layer_errors`.)"""
    got, plural = x.shape[dim], "s" if x.shape[dim] != 1 else ""
    if got == 0:  # (a network for no inputs is no fix)
        kind = "channel" if dim == 1 else "feature"
        said = f"the model's input, of no {kind}s (it holds no values) where this layer takes"
        return f"{said} {size}. {no_values_fix(kind, size)}."
    if dim == 1:
        said = f"the model's input, of {got} channel{plural} where this layer takes {size}."
        fix = channel_fix(got, size, x.dim() - 2)
        built = f"build the network for {got} input channel{plural}"
        # (a grouped convolution takes in_channels divisible by its groups: depthwise ones too)
        group = f", groups={math.gcd(got, groups)}" if got % groups else ""
        return f"{said} {fix}, or {built} (its first layer's in_channels={got}{group})."
    values = math.prod(x.shape[1:])
    if x.dim() > 2 and values == size:  # images to a network of flat inputs
        said = f"the model's input, of {got} feature{plural} where this layer takes {size}."
        return f"{said} Flatten it, x.flatten(1), or put nn.Flatten() first in the network."
    if x.dim() > 3:  # images of another size or channels than the flat ones it takes (a
        # sequence, (B, T, F), is F features a step)
        said = (
            f"the model's input, of shape {tuple(x.shape[1:])} an example ({values} values), "
            f"where this layer takes {size} features."
        )
        return (
            f"{said} Pass inputs of {size} values an example, or build the network for "
            f"{values} (its first layer's in_features={values}) with nn.Flatten() before it."
        )
    said = f"the model's input, of {got} feature{plural} where this layer takes {size}."
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


def no_values_fix(kind: str, size: int, made: str = "it", noun: str = "inputs") -> str:
    """What to do about inputs (``made``: "it" or "them") holding no ``kind`` ("channel" or
    "feature") where ``size`` are taken: building for 0 of them makes no network; the step
    that made the input emptied it."""
    plural = "s" if size != 1 else ""
    sliced = "x[:, 3:] of 3-channel images" if kind == "channel" else "x[..., 784:]"
    return (
        f"Check the step that made {made} (an empty slice or selection of the {kind}s, such as "
        f"{sliced}, leaves none) and pass {noun} of {size} {kind}{plural}"
    )
