"""Saved state loaded into a rebuilt model or guide: :func:`load_state` gives the module the
saved floating dtypes and shared member norms, then loads the state dict, saying why it does
not fit; :func:`frozen_names` and :func:`refreeze` keep which parameters are frozen."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn

from pyrouq._util import class_name
from pyrouq.checkpoint._describe import own_way_note, share_out_member_norms
from pyrouq.checkpoint._error import CheckpointError

__all__ = ["frozen_names", "load_state", "refreeze"]


def frozen_names(module: nn.Module) -> list[str]:
    """The names of the frozen parameters (``requires_grad=False``) of ``module``."""
    return [name for name, p in module.named_parameters() if not p.requires_grad]


def refreeze(module: nn.Module, names: Any) -> None:
    """Give the parameters of ``module`` the saved flags: frozen if named, trainable else."""
    frozen = set(names or [])
    for name, param in module.named_parameters():
        param.requires_grad_(name not in frozen)


def load_state(
    module: nn.Module, state: Any, what: str, path: Any, built: str = "built from the description"
) -> None:
    """Load the saved ``state`` of the ``what`` (``"model"`` or ``"guide"``) of the checkpoint
    ``path`` into ``module`` (``built`` as the message says), or a :class:`CheckpointError`
    saying why it does not fit."""
    if not isinstance(state, dict):
        raise CheckpointError(f"{str(path)!r}: the {what} state is not a dict; re-save it.")
    _take_dtypes(module, state)
    share_out_member_norms(module, state)
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        reason = " ".join(line.strip() for line in first[:3])
        why = _converted_own_way(module, state) or "The file is damaged or was edited."
        raise CheckpointError(
            f"{str(path)!r}: the saved {what} parameters do not fit the {class_name(module)} "
            f"{built} ({reason}). {why}"
        ) from None


def _converted_own_way(module: nn.Module, state: dict[str, Any]) -> str:
    """Why a BatchEnsemble's state does not fit, where it holds member factors for layers of
    subclasses with a computation of their own (:func:`own_way_note`); else ``""``."""
    net = getattr(module, "net", None)
    if not isinstance(net, nn.Module):
        return ""
    layers = [k[4:].rpartition(".")[0] for k in state if k.startswith("net.") and k.endswith(".r")]
    return own_way_note(net, layers)


_UNINITIALIZED = (nn.UninitializedParameter, nn.UninitializedBuffer)


def _take_dtypes(module: nn.Module, state: dict[str, Any]) -> None:
    """Give ``module``, rebuilt in float32, the floating dtypes of its saved tensors: a float64
    network comes back float64, its unsaved buffers too (the whole module is cast when the
    saved tensors share one dtype), not cast into a float32 rebuild."""
    saved = {v.dtype for v in state.values() if torch.is_tensor(v) and v.is_floating_point()}
    lazy = any(isinstance(p, _UNINITIALIZED) for p in module.parameters())
    if len(saved) == 1 and not lazy:
        module.to(saved.pop())
    for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
        value = state.get(name)
        if (
            torch.is_tensor(value)
            and value.is_floating_point()
            and not isinstance(tensor, _UNINITIALIZED)
            and tensor.is_floating_point()
            and value.dtype != tensor.dtype
        ):
            tensor.data = tensor.data.to(value.dtype)
