"""What :func:`pyrouq.save` checks of what it is given beside the model's description: the
optimizer (an optimizer, not a scheduler or a module; numpy's numbers in its state written as
Python's), the model's own ``default_kl_weight``, and parameters a converted network keeps in
Pyro's param store (a wrapped model is saved as the module it wraps:
:func:`pyrouq._wrappers.unwrapped`)."""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np
import pyro.optim
import torch
from torch import nn

from pyrouq._numbers import finite_float, shown, tensor_hint
from pyrouq._util import class_name
from pyrouq._words import article
from pyrouq._wrappers import unwrapped
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.checkpoint._file import unreadable

#: The class a ``torch.compile`` d module's record names (files written before 2026-12-06 hold
#: the wrapper, its parameters named ``_orig_mod.``...).
COMPILED_CLASS = "torch._dynamo.eval_frame.OptimizedModule"


_STORE_PARAMS = "_network_pyro_params"
"""The attribute of a converted model naming the parameters its network creates with
``pyro.param`` (in Pyro's param store, not in the model's state), as fit() found them."""


def note_store_params(model: Any, names: list[str]) -> None:
    """Record on ``model`` (a converted one; in a wrapper, on the module inside it, which
    save() stores) the ``names`` of the parameters its network creates with ``pyro.param``
    (:func:`check_store_params` refuses them)."""
    setattr(unwrapped(model), _STORE_PARAMS, tuple(names))


def check_store_params(model: Any, caller: str) -> None:
    """Refuse to save a model whose network creates parameters with ``pyro.param`` (as fit()
    found them): they are Pyro's param store's, with a constraint the file could not hold as
    data, so a loaded model would start them again from their initial values."""
    names = getattr(unwrapped(model), _STORE_PARAMS, ())
    if names:
        listed = ", ".join(map(repr, names[:3])) + (", ..." if len(names) > 3 else "")
        raise CheckpointError(
            f"{caller} cannot store the parameter(s) {listed} that the network of "
            f"{class_name(model)} creates with pyro.param in its forward (fit() trains them): "
            "they are kept in Pyro's param store, not in the model's state, so the loaded model "
            "would start them again from their initial values. Make each an nn.Parameter of "
            "its module (a converted model keeps it as a point estimate, which fit() trains and "
            "save() stores), or a PyroParam attribute of a PyroModule "
            "(self.t = PyroParam(torch.tensor(1.0), constraints.positive)), which the model's "
            "state holds."
        )


def own_kl_weight(model: Any) -> float | None:
    """The ``default_kl_weight`` the model (or, left unset there, its likelihood) sets for
    fit(), as the float it saves, or None; refused when it is no finite number >= 0 (a value
    set by hand), naming the attribute."""
    owner, own = "model", getattr(model, "default_kl_weight", None)
    if own is None:  # one set on the likelihood, which load() rebuilds with its class's
        owner = "model.likelihood"
        own = getattr(getattr(model, "likelihood", None), "__dict__", {}).get("default_kl_weight")
    if own is None:
        return None
    if finite_float(own) is None or own < 0:
        try:  # the number a string or a one-value tensor holds, for the example
            example = float(own) if math.isfinite(float(own)) and float(own) >= 0 else 1.0
        except (TypeError, ValueError, RuntimeError, OverflowError):
            example = 1.0
        raise CheckpointError(
            f"save() cannot write {class_name(model)}: {owner}.default_kl_weight (fit()'s "
            f"kl_weight when none is given) is expected to be a finite float >= 0, got "
            f"{shown(own)} ({type(own).__name__}){tensor_hint(own)}. Set {owner}.default_kl_weight "
            f"= {example!r} (say), or None for the likelihood's default."
        )
    return float(own)


def optimizer_state(optimizer: Any) -> Any:
    """What ``save(optimizer=...)`` writes: a torch optimizer's (or one like it, with
    ``param_groups``, ``step()`` and ``state_dict()``: pyrouq's Adam) ``state_dict()``, a Pyro
    optimizer's ``get_state()`` or a state dict, numpy's numbers in it made Python's (a numpy
    float64 learning rate: load() would refuse it as a pickled object). A scheduler, a module
    or another object is refused, as is a state holding a value load() would not read back."""
    if optimizer is None:
        return None
    if isinstance(optimizer, pyro.optim.PyroOptim):
        state = optimizer.get_state()
    elif isinstance(optimizer, dict):
        state = optimizer
    elif isinstance(optimizer, torch.optim.Optimizer) or (
        isinstance(getattr(optimizer, "param_groups", None), list)
        and callable(getattr(optimizer, "step", None))
        and callable(getattr(optimizer, "state_dict", None))
    ):
        state = optimizer.state_dict()
    else:
        raise CheckpointError(
            f"save(optimizer=) takes a torch optimizer, a Pyro optimizer or a state dict of "
            f"tensors, numbers and strings; got {class_name(optimizer)}, {_not_one(optimizer)}"
        )
    state = python_numbers(state)
    found = unreadable(state, "optimizer")
    if found:
        raise CheckpointError(
            f"save(optimizer=) got a state whose {found[0]} is {article(found[1])} {found[1]}, "
            "which load() would refuse to unpickle, as any Python object (it reads back "
            "tensors, numbers, strings, and lists, tuples and dicts of them). Make it one of "
            "those (float(x), x.tolist()), or leave optimizer= out."
        )
    return state


def _not_one(optimizer: Any) -> str:
    """Why ``optimizer`` is not one save() takes, and what to pass instead."""
    if isinstance(optimizer, torch.optim.lr_scheduler.LRScheduler) or isinstance(
        getattr(optimizer, "optimizer", None), torch.optim.Optimizer
    ):
        return (
            "a learning-rate scheduler. Pass the optimizer it schedules, "
            "optimizer=scheduler.optimizer; to keep the scheduler's state too, pass "
            "optimizer={'optimizer': opt.state_dict(), 'scheduler': scheduler.state_dict()}."
        )
    if isinstance(optimizer, nn.Module):
        return (
            "a module, not an optimizer. Pass the model as model= (its guide as guide=) and "
            "the optimizer training them as optimizer=."
        )
    return "which load() could only unpickle (it refuses to). Pass optimizer.state_dict()."


def python_numbers(value: Any) -> Any:
    """``value`` with numpy's scalars (in dicts, lists and tuples, keys too) as the Python
    numbers of the same value (exact: a float64 is a float, a float32 or float16 widens
    exactly); a number no Python one holds exactly (a long double) is left as it is."""
    if isinstance(value, np.generic) and np.ndim(value) == 0:
        item = value.item()
        same = item == value or (item != item and value != value)  # (a NaN is no NaN's equal)
        return item if type(item) in (bool, int, float, complex) and same else value
    if type(value) in (dict, collections.OrderedDict):
        out = type(value)((python_numbers(k), python_numbers(v)) for k, v in value.items())
        if hasattr(value, "_metadata"):
            out._metadata = value._metadata
        return out
    if type(value) in (list, tuple):
        return type(value)(python_numbers(v) for v in value)
    return value
