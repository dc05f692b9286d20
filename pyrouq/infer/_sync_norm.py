"""fit()'s refusal, before anything runs, of SyncBatchNorm layers in training mode in a process
group whose model is on the CPU (or another device torch's SyncBatchNorm does not sync on):
torch synchronises their batch statistics on GPUs only, and checks the device only in
training mode, so a layer frozen with ``.eval()`` passes."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pyrouq._util import module_device
from pyrouq._wrappers import held_name, held_paths

_SYNCED_ON = ("cuda", "hpu", "xpu")
"""The device types whose inputs torch's ``SyncBatchNorm.forward`` takes in training mode in a
process group (besides the PrivateUse1 backend's, read at the call): the list written out in
that forward of torch 2.14 (torch keeps it there as a literal, with no constant to read)."""


def check_sync_batchnorm(model: Any, guide: Any, held: Any = None) -> None:
    """Refuse a model (or guide module) holding ``nn.SyncBatchNorm`` layers in training mode
    that fit() would train on the CPU (or another device torch's SyncBatchNorm does not take)
    while ``torch.distributed`` is initialised: every such layer raises torch's "SyncBatchNorm
    expected input tensor to be on GPU or XPU", on every rank, at the first step. A layer in
    eval mode (frozen, ``layer.eval()``) runs as BatchNorm does and passes, unless the whole
    model is in eval mode (``.eval()``, fit() and load() leave it so), which fit() switches to
    training mode throughout: the refusal then tells to call ``model.train()``, then
    ``layer.eval()``, before fit(). Outside a process group they run as BatchNorm does, and pass.
    The refusal names the model and its layers as ``held``, the wrapper fit() was given around
    ``model`` (DDP's ``'module.net.1'``), if any."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    device = module_device(model, guide) or torch.device("cpu")  # fit()'s, as its loop's
    if device.type in (*_SYNCED_ON, torch._C._get_privateuse1_backend_name()):
        return
    # fit() trains a model left in eval mode with model.train() (every submodule), one in
    # training mode with the modes its submodules have; a guide with the modes it has
    switched = (
        {id(m) for m in model.modules()}
        if isinstance(model, nn.Module) and not model.training
        else set()
    )
    held = model if held is None or not isinstance(model, nn.Module) else held
    paths = held_paths(held, model) if isinstance(model, nn.Module) else {}
    names = [
        (paths.get(name, name) if owner is model else name) or type(module).__name__
        for owner in (model, guide)
        if isinstance(owner, nn.Module)
        for name, module in owner.named_modules()
        if isinstance(module, nn.SyncBatchNorm) and (module.training or id(module) in switched)
    ]
    if not names:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    model_name = held_name(held)
    if switched:  # fit()'s model.train() would unfreeze a layer frozen before
        why = (
            f"{model_name} is in eval mode (model.eval() leaves a model so, and so do fit() "
            "and load()), and fit() switches a model in eval mode to training mode "
            "throughout, these layers with it"
        )
        first = next(
            (
                name
                for name, m in model.named_modules()
                if id(m) in switched and isinstance(m, nn.SyncBatchNorm) and name
            ),
            None,
        )
        first = paths.get(first, first) if first else first
        example = f"here model.get_submodule('{first}').eval(); " if first else ""
        freeze = (
            "or keep such a layer frozen: call model.train(), then layer.eval(), before fit() "
            f"({example}fit() trains a model in training mode with the modes its layers have, "
            "and torch does not synchronise a layer in eval mode)"
        )
    else:
        why = (
            "these are in training mode, and fit() trains a model in training mode with the "
            "modes its layers have"
        )
        freeze = "or freeze such a layer with .eval() (torch does not synchronise it then)"
    raise ValueError(
        f"fit() runs {model_name} on {device.type} in a torch.distributed process "
        f"group (backend {dist.get_backend()}), but it holds SyncBatchNorm layers ({shown}), "
        "which torch synchronises across ranks on GPUs only (torch: 'SyncBatchNorm expected "
        "input tensor to be on GPU or XPU'). Torch synchronises them in training mode only, "
        f"and {why}. For a run on {device.type}, build the network with BatchNorm layers "
        "instead (leave out nn.SyncBatchNorm.convert_sync_batchnorm): each rank then "
        "normalises with its own batch's statistics, and fit() averages the running "
        f"statistics across the ranks at each epoch's end; {freeze}. Or train on GPUs in an "
        "nccl group (each rank's model on its own GPU)."
    )
