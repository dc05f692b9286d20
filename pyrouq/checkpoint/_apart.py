"""Tensors tied in a rebuilt model but saved apart: a checkpoint of an older pyrouq whose
conversion gave the tied names a tensor each, which then trained apart. Loading such a state
into the tied model would write both saved values into one tensor (the last one wins), so
:func:`untie_saved_apart` gives each name its own tensor first, and resuming is refused."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _tied_names(module: nn.Module) -> list[list[str]]:
    """The names of each parameter of ``module`` that more than one name holds."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [tied for tied in names.values() if len(tied) > 1]


def _apart(state: Any, tied: list[str], name: str) -> bool:
    """Whether ``state`` holds ``name`` with other values than the first of its ``tied``."""
    first, value = state.get(tied[0]), state.get(name)
    return torch.is_tensor(first) and torch.is_tensor(value) and not _same(value, first)


def saved_apart(module: nn.Module, state: Any) -> list[str]:
    """The paths of the BatchEnsemble layers of ``module`` whose per-member biases are tied to
    another layer's (one tensor under several names) but that ``state`` holds with other
    values than the first name's (NaN entries at the same places count as equal): an ensemble
    saved before a tied bias stayed tied (2026-12-06), whose layers trained their copies
    apart."""
    if not isinstance(state, dict):
        return []
    apart = []
    for tied in _tied_names(module):
        for name in tied[1:]:
            path, _, attr = name.rpartition(".")
            if attr != "bias" or not getattr(module.get_submodule(path), "_is_batchensemble", 0):
                continue
            if _apart(state, tied, name):
                apart.append(path)
    return apart


def member_norms_saved_apart(module: nn.Module, state: Any) -> list[str]:
    """The names of the parameters of per-member norm copies (of a
    :class:`~pyrouq.nn.BatchEnsembleNorm`) of ``module`` tied to another norm's copy of the
    same member (``n2.weight = n1.weight`` in the network) but that ``state`` holds with other
    values (NaN entries at the same places count as equal): an ensemble saved before such a
    tie stayed tied within each member (2026-12-06), whose copies trained apart."""
    if not isinstance(state, dict):
        return []
    copies = {
        f"{path}.norms.{member}" if path else f"norms.{member}"
        for path, norm in module.named_modules()
        if getattr(norm, "_is_member_norm", False)
        for member in range(len(norm.norms))
    }
    apart = []
    for tied in _tied_names(module):
        for name in tied[1:]:
            if name.rpartition(".")[0] in copies and _apart(state, tied, name):
                apart.append(name)
    return apart


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two saved tensors hold the same values, NaN at the same places as equal."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point() and not a.is_complex():
        return a.equal(b)
    return a.isnan().equal(b.isnan()) and torch.where(a.isnan(), 0, a).equal(
        torch.where(b.isnan(), 0, b)
    )


def untie_saved_apart(module: nn.Module, state: Any) -> None:
    """Give each BatchEnsemble layer of ``module`` that :func:`saved_apart` finds a bias
    tensor of its own, and each norm copy's parameter that :func:`member_norms_saved_apart`
    finds a tensor of its own (in place): such an ensemble comes back as saved."""
    names = [f"{path}.bias" if path else "bias" for path in saved_apart(module, state)]
    for name in names + member_norms_saved_apart(module, state):
        path, _, attr = name.rpartition(".")
        layer = module.get_submodule(path)
        param: Any = getattr(layer, attr)
        setattr(layer, attr, nn.Parameter(param.detach().clone(), param.requires_grad))
