"""The parameters a model or guide took, on its first call in fit()'s set-up pass
(:class:`~pyrouq.infer._probe.Probe`), from Pyro's global param store, which already held them
under those names (:func:`adopted`): fit() warns of them (:func:`adoption_warning`), and
blames them for an error of the pass that they can cause (:func:`adoption_refusal`)."""

from __future__ import annotations

import re
from typing import Any

import pyro
import torch
from torch import nn

from pyrouq._own_models import GuideMismatch

# What taking another's tensors changes is their shapes, dtypes and devices (their values
# alone raise nothing in the pass); an error that names none of those (Pyro's "Multiple
# sample sites named '2.bias'" of a guide that samples a site twice, a site missing from the
# guide) comes of something else, and is left in its own words
_WHAT_IT_CHANGES = re.compile(r"\bshapes?\b|\bsizes?\b|\bdtypes?\b|scalar type|\bdevices?\b", re.I)


def module_params(model: Any, guide: Any) -> list[torch.Tensor]:
    """The parameters the model and a guide module hold."""
    modules = [m for m in (model, guide) if isinstance(m, nn.Module)]  # (a module, or None)
    return [p for m in modules for p in m.parameters()]


def adopted(
    model: nn.Module, guide: Any, held: set[int], stored: set[int]
) -> tuple[list[str], list[str]]:
    """The names of the parameters that the model or guide took, on its first call, from Pyro's
    global param store, which already held them under those names, and which of the two took
    them (``held``: the ids of the parameters they held before; ``stored``: those of the
    store's): a ``PyroModule`` takes a stored value of its parameter's name in place of its
    own, so a new ``AutoNormal`` of a second model of the same class starts from the first
    fit's posterior and shares its tensors (training one moves the other's guide), and one of
    a model of other sizes gets tensors of the first one's shapes."""
    store = pyro.get_param_store()
    taken, takers = [], []
    for who, owner in ((type(model).__name__, model), (f"{type(model).__name__}'s guide", guide)):
        mine = [
            store.param_name(p) or "?"
            for p in module_params(owner, None)
            if id(p) not in held and id(p) in stored
        ]
        taken += mine
        takers += [who] if mine else []
    return taken, takers


def adopted_text(taken: list[str], takers: list[str]) -> str:
    shown = ", ".join(map(repr, taken[:3])) + (", ..." if len(taken) > 3 else "")
    return (
        f"fit(): {' and '.join(takers)} took {len(taken)} parameter(s) ({shown}) from "
        "Pyro's param store, which already held them under those names (another model's or "
        "guide's: an AutoNormal of a model of the same class fitted before, say)."
    )


def adoption_refusal(
    err: Exception, model: nn.Module, guide: Any, held: set[int], stored: set[int]
) -> ValueError | None:
    """fit()'s refusal of the set-up pass's error ``err`` as the work of the parameters the
    model or guide took from the store (:func:`adopted`): None where they took none, or where
    ``err`` names no shape, size, dtype or device (nothing taking them can cause)."""
    taken, takers = adopted(model, guide, held, stored)
    why = err.problem if isinstance(err, GuideMismatch) else f"{type(err).__name__}: {err}"
    why = why.strip().splitlines()[0] if why.strip() else why  # (not Pyro's trace shapes)
    if not taken or not _WHAT_IT_CHANGES.search(why):
        return None
    return ValueError(
        f"{adopted_text(taken, takers)} Those do not fit {type(model).__name__} "
        f"({' '.join(why.split())}). Call "
        "pyro.clear_param_store() before building this model and guide, or "
        "pyro.settings.set(module_local_params=True) before building the models to "
        "keep each one's parameters its own. Nothing was trained."
    )


def adoption_warning(taken: list[str], takers: list[str]) -> str:
    """fit()'s warning of parameters the model or guide took (:func:`adopted`) and that fit."""
    return (
        f"{adopted_text(taken, takers)} It starts from those values instead of its "
        "own, and shares the tensors, so training it also changes the other one. Call "
        "pyro.settings.set(module_local_params=True) before building the models to "
        "keep each one's parameters its own (or pyro.clear_param_store() before "
        "building this model and guide, if the other is no longer used); values you "
        "loaded into the store to resume a run are taken as intended."
    )
