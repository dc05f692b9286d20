"""fit()'s refusal, before anything runs, of SyncBatchNorm layers in a process group whose
model is on the CPU: torch synchronises their batch statistics on GPUs only."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pyrouq._util import module_device

_SYNCED_ON = ("cuda", "hpu", "xpu")
"""The devices whose inputs torch's SyncBatchNorm takes in a process group (and PrivateUse1's)."""


def check_sync_batchnorm(model: Any, guide: Any) -> None:
    """Refuse a model (or guide module) holding ``nn.SyncBatchNorm`` layers that fit() would
    train on the CPU (or another device torch's SyncBatchNorm does not take) while
    ``torch.distributed`` is initialised: in training mode every such layer raises torch's
    "SyncBatchNorm expected input tensor to be on GPU or XPU", on every rank, at the first
    step. Outside a process group they run as BatchNorm does, and pass."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    device = module_device(model, guide) or torch.device("cpu")  # fit()'s, as its loop's
    if device.type in (*_SYNCED_ON, torch._C._get_privateuse1_backend_name()):
        return
    names = [
        name or type(module).__name__
        for owner in (model, guide)
        if isinstance(owner, nn.Module)
        for name, module in owner.named_modules()
        if isinstance(module, nn.SyncBatchNorm)
    ]
    if not names:
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise ValueError(
        f"fit() runs {type(model).__name__} on {device.type} in a torch.distributed process "
        f"group (backend {dist.get_backend()}), but it holds SyncBatchNorm layers ({shown}), "
        "which torch synchronises across ranks on GPUs only (torch: 'SyncBatchNorm expected "
        "input tensor to be on GPU or XPU'). For a CPU run, build the network with "
        "BatchNorm layers instead (leave out nn.SyncBatchNorm.convert_sync_batchnorm): each "
        "rank then normalises with its own batch's statistics, and fit() averages the running "
        "statistics across the ranks at each epoch's end. Or train on GPUs in an nccl group "
        "(each rank's model on its own GPU)."
    )
