"""How a network treats its batch, as the engine checks it: its outputs are one row per input
(:func:`check_outputs`), and which of its normalisation layers take statistics of the batch or
move running statistics with it (so the batch must go through them in one call), and the
buffers a forward may move, kept for a forward run again to find them as they were
(:func:`kept_buffers`, :func:`put_back`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm, _NormBase

from pyrouq._util import class_name


def check_outputs(out: Any, net: nn.Module, batch: int) -> Tensor:
    """``out`` if it is one row of outputs per input, ``(batch, D)``; else a clear error."""
    name, shape = class_name(net), tuple(getattr(out, "shape", ()))
    if isinstance(out, Tensor) and out.dim() == 1 and out.shape[0] == batch:
        raise TypeError(
            f"{name}.forward returned shape {shape} for {batch} inputs: one value per input, "
            "without the outputs' dimension. pyrouq needs outputs (B, D): for a single output "
            f"(regression), return ({batch}, 1), e.g. drop the forward's .squeeze(-1) or return "
            f"outputs.unsqueeze(-1) (under Gaussian('heteroscedastic'), ({batch}, 2): a mean, "
            "then a raw scale, from a last layer of 2 outputs); a classifier returns (B, C) "
            "logits, C >= 2."
        )
    if not isinstance(out, Tensor):
        keys = f" (keys {', '.join(map(repr, list(out)[:5]))})" if isinstance(out, dict) else ""
        fields = [str(f) for f in getattr(out, "_fields", ())]
        fix = (
            _auxiliary_fix(net, fields)
            if any(f.startswith("aux") for f in fields)
            else "Wrap it in a small nn.Module whose forward returns that tensor "
            "(net(x)['logits'] of a dict, net(x)[0] of a tuple)."
        )
        raise TypeError(
            f"{name}.forward returned {type(out).__name__}{keys}; pyrouq needs a network whose "
            f"forward(x) returns one tensor of outputs (B, D) (logits for classification). {fix}"
        )
    if out.dim() != 2 or out.shape[0] != batch:
        per_pixel = (
            " Outputs per pixel or per time step (segmentation, sequence labelling) are not "
            "supported: pool or flatten them to (B, D) inside the network."
            if out.dim() > 2
            else " Reshape them to (B, D) inside the network."
        )
        raise ValueError(
            f"{name}.forward returned outputs of shape {shape} for {batch} inputs; pyrouq "
            f"needs one row of outputs per input, ({batch}, D).{per_pixel}"
        )
    if not out.is_floating_point():  # (no gradient reaches the weights through them)
        raise TypeError(
            f"{name}.forward returned outputs of dtype {out.dtype}; pyrouq needs floating-point "
            "outputs (logits for classification, means for regression), through which the "
            "likelihood's gradients reach the weights. Return them before any rounding, "
            ".long(), .argmax() or comparison at the forward's end."
        )
    return out


def _auxiliary_fix(net: nn.Module, fields: list[str]) -> str:
    """What to do about a namedtuple of outputs with auxiliary fields (``aux...``): in the mode
    the network ran in, with ``aux_logits=False`` only for a network built with that flag
    (torchvision's GoogLeNet and Inception3, whose eager forward returns them in training
    mode only)."""
    aux = [f for f in fields if f.startswith("aux")]
    main = next((f for f in fields if not f.startswith("aux")), None)
    mode = "training" if net.training else "eval"
    pick = f"net(x).{main}" if main is not None else "net(x)[0]"
    wrap = f"a small nn.Module whose forward returns the main logits ({pick})"
    flag = any(isinstance(getattr(m, "aux_logits", None), bool) for m in net.modules())
    return (
        f"It returns auxiliary outputs ({', '.join(map(repr, aux))}) beside the main ones "
        f"in {mode} mode: "
        + (
            f"build it with aux_logits=False, or wrap it in {wrap}."
            if flag
            else f"wrap it in {wrap}."
        )
    )


def _uses_batch_statistics(module: nn.Module) -> bool:
    """A BatchNorm that normalises with its batch's statistics: in training mode, or without
    running statistics (``track_running_stats=False``) in either mode, as torch does."""
    return isinstance(module, _BatchNorm) and (module.training or module.running_mean is None)


def updates_running_statistics(module: nn.Module) -> bool:
    """A BatchNorm or InstanceNorm in training mode with running statistics: each call moves
    them once (by ``momentum``), so the batch must go through it in one call."""
    return isinstance(module, _NormBase) and module.training and module.running_mean is not None


def batch_statistics(net: nn.Module) -> bool:
    """Whether ``net`` computes statistics over its batch (a BatchNorm in training mode, or
    one without running statistics) or updates running statistics from it (an InstanceNorm
    tracking them, in training mode)."""
    return any(_uses_batch_statistics(m) or updates_running_statistics(m) for m in net.modules())


def statistics_across_members(module: nn.Module) -> bool:
    """Whether a BatchEnsemble network has a normalisation layer that the members share and
    that needs their rows in one call: a BatchNorm in training mode (statistics over the folded
    batch) or an InstanceNorm updating running statistics (once per step, not once per member);
    per-member copies see only their member's rows."""
    if getattr(module, "_is_member_norm", False):
        return False
    if _uses_batch_statistics(module) or updates_running_statistics(module):
        return True
    return any(statistics_across_members(child) for child in module.children())


def kept_buffers(net: nn.Module, sites: Collection[str]) -> list[tuple[Tensor, Tensor]]:
    """Each buffer of ``net`` a forward may move (running statistics, a counter or moving
    average of the network's own), with a copy, for a forward run again to find it as it was
    (:func:`put_back`); not the latent sites' (``sites``, their paths), which draws replace."""
    skip = {id(b) for name, b in net.named_buffers(remove_duplicate=False) if name in sites}
    return [(b, b.clone()) for b in net.buffers() if id(b) not in skip]


def put_back(kept: list[tuple[Tensor, Tensor]]) -> None:
    """Set each buffer :func:`kept_buffers` kept back to its copy."""
    with torch.no_grad():
        for buffer, value in kept:
            buffer.copy_(value)
