"""Pyro's param store and the point estimates of pyrouq's models and guides.

A pyrouq model's plain child modules (its network, its likelihood) and a
:class:`~pyrouq.MeanFieldGuide` hold their parameters themselves; they are put into Pyro's
global param store under ``<name>$$$<parameter>`` (the names ``pyro.module`` gives them), so
that Pyro's ``SVI`` optimises them. The store is made to hold the modules' own tensors, and a
value loaded into it from a file (``pyro.get_param_store().load(path)``) is taken, as a
``PyroModule`` takes a stored value of its parameter's name.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import pyro
import torch
from pyro.nn import PyroModule
from torch import nn

from pyrouq._util import module_device, module_dtype
from pyrouq._wrappers import under_handlers, unwrapped

__all__ = [
    "copy_name",
    "copy_renamed",
    "draws_as_built",
    "forget_params",
    "forget_params_since",
    "hold_params",
    "hold_restored",
    "prototype_shapes",
    "register_children",
    "register_params",
    "register_point_estimates",
    "set_supermodule",
    "shared_copy",
    "store_or_usual_fix",
    "store_taken_fix",
    "take_store_values",
]

_Model = TypeVar("_Model", bound=nn.Module)

_REGISTERED: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
"""The tensors :func:`register_params` put into Pyro's param store, by id: an entry under one
of its names that is none of them was loaded or set there by someone else."""


def forget_params(prefix: str) -> None:
    """Remove the entries of Pyro's param store under ``prefix`` (``<prefix>.`` or
    ``<prefix>$$$``) that hold a tensor :func:`register_params` put there: not another's
    under that name (a model nested in a user's ``PyroModule`` is held under Pyro's name for
    it, ``net``, beside the user's own ``pyro.param("net.scale")`` or ``PyroParam``)."""
    store = pyro.get_param_store()
    mine = (prefix + ".", prefix + "$$$")
    for name, held in list(store.named_parameters()):  # (unconstrained: as registered, and
        if name.startswith(mine) and _REGISTERED.get(id(held)) is held:  # store[name] would
            del store[name]  # transform the others' entries and mark their tensors)


def forget_params_since(before: set[str]) -> None:
    """Remove the entries of Pyro's param store that are not named in ``before`` (its names
    before a pass that was then refused): a guide function's ``pyro.param`` sites, created in
    the dtype of its draws, go, so the call the refusal advises creates them from their init
    in the dtype it names (``pyro.param`` would hand the stored, refused values back)."""
    store = pyro.get_param_store()
    for name in set(store.keys()) - before:
        del store[name]


_COPIES = itertools.count()
"""Numbers the copies (``copy.deepcopy``) of models and guides, apart from the counters that
name built ones: a copy does not change the names of those built after it."""

_HOLDERS: dict[str, weakref.WeakSet[Any]] = {}
"""The live models and guides that keep their entries of Pyro's param store under a name."""

_HELD: weakref.WeakKeyDictionary[Any, tuple[str, weakref.finalize]] = weakref.WeakKeyDictionary()
"""Each holder's name and the finalizer that releases it."""


def copy_name(name: str) -> str:
    """The name in Pyro's param store of a copy of the model or guide named ``name``:
    ``<name>_copy<k>``, whose entries are not under ``<name>.`` or ``<name>$$$``, what
    :func:`forget_params` removes for the original (nor the other way round)."""
    return f"{name}_copy{next(_COPIES)}"


def hold_params(holder: Any, name: str) -> None:
    """Record that ``holder`` (a pyrouq model or guide) keeps its entries of Pyro's param
    store under ``name``, replacing the name it held before: they are removed when the last
    live holder of ``name`` is garbage collected (a shallow ``copy.copy`` shares its
    original's name, its tensors and its entries)."""
    held = _HELD.pop(holder, None)
    if held is not None:
        old, finalizer = held
        finalizer.detach()
        holders = _HOLDERS.get(old)
        if holders is not None:
            holders.discard(holder)
        if old != name:
            _release(old)  # (its entries under the old name, unless another holds them)
    _HOLDERS.setdefault(name, weakref.WeakSet()).add(holder)
    _HELD[holder] = (name, weakref.finalize(holder, _release, name))


def set_supermodule(holder: Any, name: str, context: Any) -> None:
    """A pyrouq model's ``PyroModule._pyro_set_supermodule``: nested in a user's
    ``PyroModule`` (``self.bnn = bayesian(net)``), Pyro renames it (``bnn``), and it holds
    its entries under that name (its clean-up, and a copy unpickled beside it, read it)."""
    PyroModule._pyro_set_supermodule(holder, name, context)
    hold_params(holder, name)


def _release(name: str) -> None:
    """Forget the entries under ``name`` unless a live holder still keeps them (weak
    references to the one collected are already dead when its finalizer runs)."""
    holders = _HOLDERS.get(name)
    if holders is not None and any(True for _ in holders):
        return
    _HOLDERS.pop(name, None)
    forget_params(name)


def hold_restored(holder: Any, name: str) -> str:
    """Hold (:func:`hold_params`) the entries of ``holder``, a pyrouq model or guide just
    unpickled or deep-copied from one named ``name``, under the name it returns: ``name``
    where no live model or guide holds it (a new process loading a pickled model, a spawned
    MCMC chain), else :func:`copy_name`'s ``<name>_copy<k>``, a model's ``PyroModule``
    children renamed with it (``<name>_copy<k>.<child>``, as ``PyroModule`` names them). Two
    distinct objects under one name would put their point estimates into the store in turn
    (a store saved then held one of them, and loading it gave both the same values), a
    network's ``PyroParam`` would be one tensor for both, and the entries of one would be
    the other's. A renamed one's entries are put into the store at once (its point
    estimates, a guide's parameters), as its first run would: a store saved before that run
    holds them (a process with no live holder of ``name``, a worker, registers none here)."""
    holders = _HOLDERS.get(name)
    renamed = holders is not None and any(other is not holder for other in holders)
    if renamed:
        name = copy_name(name)
        if isinstance(holder, PyroModule):
            modules: list[tuple[nn.Module, str]] = [(holder, name)]
            while modules:  # as PyroModule names its PyroModule children (and theirs)
                module, full = modules.pop()
                module.__dict__["_pyro_name"] = full
                modules += [
                    (child, f"{full}.{key}")
                    for key, child in module._modules.items()
                    if isinstance(child, PyroModule)
                ]
    hold_params(holder, name)
    if renamed and isinstance(holder, PyroModule):
        register_children(holder, record=False)
    elif renamed:  # a MeanFieldGuide
        register_params(name, holder, record=False)
    return name


def copy_renamed(model: _Model, memo: dict[int, Any]) -> _Model:
    """``copy.deepcopy`` of a pyrouq model, named ``<name>_copy<k>`` in Pyro's param store
    (its ``PyroModule`` children ``<name>_copy<k>.<child>``) by its ``__setstate__``
    (:func:`hold_restored`: the original holds the name), whose entries are removed when it
    is garbage collected: not the original's names (see :func:`hold_restored`), nor a built
    model's number, which would shift the names of the models built after it (a store saved
    in a run that copied would give them another model's values in a run that did not)."""
    new = type(model).__new__(type(model))
    memo[id(model)] = new
    new.__setstate__(copy.deepcopy(model.__getstate__(), memo))
    return new


def shared_copy(holder: _Model) -> _Model:
    """``copy.copy`` of a pyrouq model or guide: its attributes shared with ``holder`` (its
    modules, its tensors), and so its name in Pyro's param store and its entries there,
    which stay while either lives (not renamed as an unpickled or deep copy is: the shared
    ``PyroModule`` children would be renamed under the original too)."""
    new = type(holder).__new__(type(holder))
    new.__dict__.update(holder.__dict__)
    new.__dict__.pop("_compiled_call_impl", None)  # (as torch's __getstate__ leaves it out)
    held = _HELD.get(holder)
    if held is not None:
        hold_params(new, held[0])
    return new


def _take_stored(full: str, stored: torch.Tensor, param: torch.Tensor, like: Any) -> None:
    """Give ``param`` the value that Pyro's param store holds under its name ``full`` (a
    lazy one made on the device and in the dtype of the network ``like``, as its outputs
    would make it, not the file's: a float32 store, a float64 or GPU model)."""
    if nn.parameter.is_lazy(param):  # (a learned noise scale not yet sized): the stored size
        device, dtype = module_device(like) or stored.device, module_dtype(like) or stored.dtype
        param.materialize(stored.shape, device=device, dtype=dtype)  # type: ignore[attr-defined]
    if stored.shape != param.shape:
        raise ValueError(
            f"Pyro's param store holds {full!r} of shape {tuple(stored.shape)}, but the "
            f"parameter of that name has shape {tuple(param.shape)}: the store was loaded from "
            "another model (pyrouq names its models and guides in the order they are built, "
            "BayesianNetwork_0, MeanFieldGuide_0, ...; copies made with copy.deepcopy do not "
            "count: they are named <name>_copy<k>). To use the stored values, build them as "
            "the run that saved the store did (the same sizes, in the same order) before "
            "loading it; or call pyro.clear_param_store() and restore them with pyrouq.save() "
            "/ pyrouq.load()."
        )
    with torch.no_grad():
        param.copy_(stored)


def register_params(
    prefix: str, module: nn.Module, *, record: bool = True, like: Any = None
) -> bool:
    """Put every trainable parameter of ``module`` into Pyro's param store as
    ``prefix$$$name`` and, with ``record``, make it a Pyro ``param`` site there.

    Like ``pyro.module(prefix, module)``, so that Pyro's optimizers (``SVI``) see the point
    estimates of a model, except that the store is made to hold the module's *own* tensors,
    which SVI then optimises: an entry this function put there before the module got new
    tensors (``load_state_dict(assign=True)``) is replaced, and any other one (loaded into
    the store, ``pyro.get_param_store().load(path)``, or set there) first gives the module
    its value (``pyro.module`` would leave the loaded tensor in the store, which SVI would
    train while the module never reads it). A frozen parameter (``requires_grad=False``) is
    left out and left frozen: Pyro's param store would switch its gradient back on; so is a
    lazy one that the store holds no value for (one it holds a value for is made on the
    device and in the dtype of the network ``like``). A parameter that is not contiguous
    (channels-last) is stored as Pyro stores it, a contiguous copy, which SVI does not train
    and which is never taken back as a loaded value. Returns whether one was left out as lazy.
    """
    store = pyro.get_param_store()
    lazy = False
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        full = f"{prefix}$$${name}"
        stored = store[full] if full in store else None
        if stored is not None and stored is not param:
            if _REGISTERED.get(id(stored)) is not stored:  # not one of ours: loaded there
                _take_stored(full, stored, param, like)
            del store[full]  # (with the constraint it may have been stored under)
        _REGISTERED[id(param)] = param  # (a lazy one too: materialized in place, it is the
        if nn.parameter.is_lazy(param):  # tensor pyro.module puts under its name in forward)
            lazy = True
            continue
        if stored is not param:
            store[full] = param
            held = store[full]  # the param, or the contiguous copy Pyro stores of one that is
            _REGISTERED[id(held)] = held  # not (channels-last): ours too, never a loaded value
        if record:
            pyro.param(full)
    return lazy


def register_children(model: Any, *, record: bool) -> bool:
    """:func:`register_params` of each of a pyrouq model's child modules that is no
    ``PyroModule`` (its network, its likelihood), under the name ``PyroModule`` gives it
    (``<model name>.net``): before the model's ``forward`` reads them (``record=False``;
    ``pyro.module`` records them there), or for the paths of
    :class:`~pyrouq.KLWeightedELBO` that do not run ``forward`` (``record=True``). Not inside
    ``forward`` under ``pyro.settings.set(module_local_params=True)``, where the store is
    the model's own and Pyro keeps no module's parameters in it. Returns whether a lazy
    parameter was left out (one the store holds a value for is made like the network)."""
    if not record and pyro.settings.get("module_local_params"):
        return False
    prefix = model._pyro_name
    lazy = False
    for name, child in model._modules.items():
        if child is not None and not isinstance(child, PyroModule):
            full = f"{prefix}.{name}" if prefix else name
            lazy |= register_params(full, child, record=record, like=getattr(model, "net", None))
    return lazy


def register_point_estimates(model: Any) -> bool:
    """Record the model's own parameters (BatchNorm, ensemble factors, a learned noise scale)
    as Pyro param sites, named as its ``forward`` names them, so that ``SVI`` trains them on
    the direct paths too (no ``forward``). Returns whether a lazy one is left for later."""
    return register_children(model, record=True)


def take_store_values(model: Any, guide: Any = None) -> None:
    """Give a pyrouq model's point estimates and a :class:`~pyrouq.MeanFieldGuide`'s
    parameters the values loaded into Pyro's param store under their names, for the routes
    that read them without running them under Pyro (``predict()``, the diagnostics), as
    their next run would (a Pyro user's ``pyro.get_param_store().load(path)``)."""
    from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork
    from pyrouq.infer.guide import MeanFieldGuide

    if isinstance(model, (BayesianNetwork, BatchEnsembleNetwork)):
        register_children(model, record=False)
    if isinstance(guide, MeanFieldGuide):
        register_params(guide.name, guide, record=False)


def store_taken_fix(
    model: Any, guide: Any, drawn: Mapping[str, Sequence[int]] | None = None
) -> str | None:
    """The way out for draws of ``guide`` that do not fit ``model`` where ``guide`` is a Pyro
    autoguide built for this very model that took, when it first ran, the values Pyro's param
    store held under its parameters' names (a ``PyroModule`` takes a stored value in place of
    its own), another model's, so passing "the guide built for this model" is no fix: clearing
    the store is. ``drawn``: the shape of one draw of each site the guide drew; the store is
    named only where one of them differs from the shape the guide was set up with (its
    prototype trace): a guide that draws as it was built (a model sized by ``x``, given
    another ``x``) took nothing of another shape. None for any other guide (or none)."""
    taken = _stored_names(model, guide)
    if not taken or not _reshaped(guide, drawn):
        return None
    shown = ", ".join(map(repr, taken[:3])) + (", ..." if len(taken) > 3 else "")
    return (
        f"The guide ({type(unwrapped(guide)).__name__}) was built for this model, but "
        f"took the values Pyro's param store held under its parameters' names ({shown}): "
        "another model's, fitted or loaded before. To use the stored values, build the model "
        "with the sizes they have (the guide's shapes above) and a new guide, which takes "
        "them; to fit this model instead, call pyro.clear_param_store() before building "
        "this model and guide (then fit them), or pyro.settings.set(module_local_params="
        "True) before building the models to keep each one's parameters its own."
    )


def store_or_usual_fix(
    usual: str,
    model: Any,
    source: str | None,
    guide: Any,
    drawn: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """The way out for draws from ``source`` that do not fit ``model``: where they are a
    guide's (``source`` None or ``"the guide"``) and :func:`store_taken_fix` finds that
    ``guide`` took the param store's values, clearing the store; else ``usual``."""
    taken = store_taken_fix(model, guide, drawn) if source in (None, "the guide") else None
    return taken or usual


def prototype_shapes(guide: Any) -> dict[str, tuple[int, ...]] | None:
    """The latent sites of a built Pyro autoguide's prototype trace (the model as it was when
    the guide first ran) with their shapes, in the trace's order; None for a guide without one
    (not built yet, or no autoguide)."""
    proto = getattr(unwrapped(guide), "prototype_trace", None)
    if proto is None:
        return None
    return {
        name: tuple(node["value"].shape)
        for name, node in proto.nodes.items()
        if node["type"] == "sample" and not node["is_observed"]
    }


def _reshaped(guide: Any, drawn: Mapping[str, Sequence[int]] | None) -> bool:
    """Whether ``guide`` drew a site (``drawn``, one draw's shapes, leading dims of size 1
    allowed) in another shape than its prototype trace (:func:`prototype_shapes`) held: its
    values have been replaced since, by the store's."""
    if not drawn or (shapes := prototype_shapes(guide)) is None:
        return False
    for site, shape in drawn.items():
        if site not in shapes:
            continue
        built, got = shapes[site], tuple(shape)
        extra = len(got) - len(built)
        if extra < 0 or got[extra:] != built or any(d != 1 for d in got[:extra]):
            return True
    return False


def draws_as_built(model: Any, guide: Any, drawn: Mapping[str, Sequence[int]] | None) -> bool:
    """Whether ``guide`` is a Pyro autoguide built for this very ``model`` whose draws
    (``drawn``, one draw's shapes) have the shapes it was built with (its prototype trace's):
    draws that do not fit the model then come of the model's own shapes on other inputs (a
    weight per column of ``x``), not of another model's guide or values."""
    return bool(drawn) and _built_for(model, guide) and not _reshaped(guide, drawn)


def _built_for(model: Any, guide: Any) -> bool:
    """Whether ``guide`` is a Pyro autoguide built for ``model`` (itself, or the module inside
    its wrapper; an ``AutoNormal`` holds it under its ``InitMessenger``)."""
    from pyro.infer.autoguide import AutoGuide

    guide = unwrapped(guide)
    built_for = getattr(guide, "_model", None) if isinstance(guide, AutoGuide) else None
    if not built_for:  # (an unpickled autoguide holds None)
        return False
    inner, _ = under_handlers(built_for[0])  # (the model inside its handlers: messenger(model))
    return unwrapped(inner) is unwrapped(model)


def _stored_names(model: Any, guide: Any) -> list[str]:
    """The param-store names of ``guide``'s parameters where it is a Pyro autoguide built for
    ``model`` (:func:`_built_for`); else none."""
    if not _built_for(model, guide):
        return []
    guide = unwrapped(guide)
    store = pyro.get_param_store()
    return [name for p in guide.parameters() if (name := store.param_name(p)) is not None]
