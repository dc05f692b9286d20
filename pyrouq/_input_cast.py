"""Whose dtype floating inputs are cast to (:func:`typed_by`): the model's or, for a Pyro model
of the user's own without floating parameters, its guide's; and what fit() says where that
guide holds none yet, before its first call, and the inputs are of another dtype than the
model's latent sites (:func:`latent_dtype_refusal`), or where the guide is a function, whose
parameters it cannot see, drawing them in another dtype than the inputs'
(:func:`function_guide_refusal`; predict()'s words: :func:`guide_draws_refusal`), or where a
model holding parameters of one dtype draws its latent sites in another (from its priors, which
``model.to()`` leaves as they are, or from its guide: :func:`latent_sites_refusal`); and the
dtype an autoguide not built yet will take from Pyro's param store, where values loaded there
to resume a run wait for it (:func:`stored_dtype`)."""

from __future__ import annotations

import functools
import inspect
import itertools
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.nn import PyroModule
from torch import nn

from pyrouq._mismatch import dtype_words, torch_words
from pyrouq._own_models import name_of
from pyrouq._util import global_streams_kept, module_dtype
from pyrouq._wrappers import under_handlers

__all__ = [
    "cast_call",
    "function_guide_refusal",
    "guide_draws_refusal",
    "latent_dtype_refusal",
    "latent_sites_refusal",
    "refuse_guide_of_another_dtype",
    "stored_dtype",
    "typed_by",
]

_TO = {torch.float32: "float", torch.float64: "double", torch.float16: "half"}


def cast_call(holder: str, dtype: torch.dtype) -> str:
    """How to cast ``holder`` (``"x"``, ``"model"``) to ``dtype`` in words of code:
    ``x.double()``, or ``x.to(torch.bfloat16)`` for a dtype without a method of its own
    here."""
    return f"{holder}.{_TO[dtype]}()" if dtype in _TO else f"{holder}.to({dtype})"


def typed_by(model: Any, guide: Any) -> Any:
    """Whose dtype predict() and fit() cast floating inputs to: the model's, or, for a model of
    the user's own without floating parameters (every weight a ``PyroSample``, a function), its
    guide's, whose draws the model computes with (a fitted autoguide's float32 draws times
    float64 inputs from numpy would fail in the model). A model with an ``nn.Embedding`` keeps
    its own say: its integer inputs are indices, which the guide does not take."""
    if module_dtype(model) is not None or module_dtype(guide) is None:
        return model
    indices = isinstance(model, nn.Module) and any(
        isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in model.modules()
    )
    return model if indices else guide


def stored_dtype(guide: Any) -> torch.dtype | None:
    """The dtype a guide not built yet (an autoguide before its first call) takes on its first
    call from Pyro's param store: that of the store's entries under its name (``AutoNormal.``),
    loaded there to resume a run (``pyro.get_param_store().load(path)``), which a
    ``PyroModule`` takes in place of the values it builds. None for another guide, under
    ``module_local_params`` (the store is not read), and for entries of several dtypes."""
    if not isinstance(guide, PyroModule) or module_dtype(guide) is not None:
        return None
    if pyro.settings.get("module_local_params"):
        return None
    prefix = guide._pyro_name + "."
    dtypes = {
        value.dtype
        for name, value in pyro.get_param_store().named_parameters()
        if name.startswith(prefix) and value.is_floating_point()
    }
    return dtypes.pop() if len(dtypes) == 1 else None


def latent_dtype_refusal(
    err: BaseException,
    model: Any,
    guide: Any,
    x: torch.Tensor,
    y: torch.Tensor | None,
    caller: str = "fit()",
) -> str | None:
    """Why a Pyro model of the user's own without floating parameters failed on ``x``
    (torch's words on a dtype, ``err``) where its guide holds no parameters yet to cast ``x``
    to: its latent sites, drawn from its priors (read off a trace of ``model(x, y)`` up to the
    error, the random state kept), are of another dtype than ``x``; and what to do, in
    ``caller``'s words (fit()'s first run, a diagnostic of a guide not fitted yet, an
    autoguide building itself on x, or predict() from the priors, ``guide`` None).
    None for another error, and for a model or guide that holds floating parameters (``x``
    was cast to their dtype: serving it in another would change nothing)."""
    said = _dtype_words(err, model, guide, x)
    if said is None:
        return None
    sites = _sites_drawn(model, x, y)
    other = {name: dtype for name, dtype in sites.items() if dtype != x.dtype}
    if not other:
        return None
    dtype, names, cast = _told(other)
    name, own = name_of(model), name_of(under_handlers(model)[0])  # (own: its priors' holder)
    if guide is None:  # predict() from the priors: no guide to take a dtype from
        return (
            f"{caller}: {name} draws its latent sites ({names}) in {dtype}, its priors' dtype, "
            f"but x is {x.dtype}, and torch does not mix the two ({type(err).__name__}: "
            f"{said}). It holds no floating parameters to cast x to, nor is there a guide. "
            f"Pass x in {dtype} ({cast}), or build {own}'s priors in {x.dtype} (their "
            f"parameters as {x.dtype} tensors)."
        )
    if caller != "fit()":  # a diagnostic: its guide is not fitted (fit() builds it on x)
        return (
            f"{caller}: {name} draws its latent sites ({names}) in {dtype}, its priors' dtype, "
            f"but x is {x.dtype}, and torch does not mix the two ({type(err).__name__}: "
            f"{said}). Its guide holds no parameters yet to take the dtype from: it has not "
            "been fitted (a fitted guide's dtype is what x is cast to). Fit it first, "
            f"pyrouq.fit(model, guide, ...), or pass x in {dtype} ({cast}), or build {own}'s "
            f"priors in {x.dtype}."
        )
    return (
        f"fit(): {name} draws its latent sites ({names}) in {dtype}, its priors' dtype, but "
        f"train_loader's inputs are {x.dtype}, and torch does not mix the two "
        f"({type(err).__name__}: {said}). Its guide holds no parameters yet to take the dtype "
        "from (a model without parameters of its own has its inputs cast to its guide's "
        "dtype, as predict() and a later fit() do). Serve the inputs in "
        f"{dtype} ({cast}, e.g. TensorDataset({cast}, y)), or build {own}'s priors in "
        f"{x.dtype} (their parameters as {x.dtype} tensors). Nothing was trained."
    )


def latent_sites_refusal(
    err: BaseException,
    model: Any,
    guide: Any,
    x: torch.Tensor,
    y: torch.Tensor | None,
    drawn: dict[str, torch.dtype],
    caller: str,
) -> str | None:
    """Why a Pyro model of the user's own holding floating parameters, to whose dtype ``x``
    was cast, failed on ``x`` in torch's words on a dtype (``err``): its latent sites are drawn
    in another dtype, by its guide (``drawn``: the floating sites' dtypes of its draws, where
    the caller has them; else read off a trace of ``guide(x, y)``) or from its priors (a trace
    of ``model(x, y)`` up to the error), which ``model.to()`` does not convert; and what to
    do. ``caller``: ``"fit()"`` or ``"predict()"``. None for another error, a model without
    floating parameters or with some of another dtype (the fix is then to give it one), or
    draws of its dtype (a pyrouq model's priors: buffers it casts)."""
    lines = torch_words(err).strip().splitlines()  # (not Pyro's trace shapes after them)
    said = lines[0] if lines else ""
    dtype = module_dtype(model)
    if dtype is None or x.dtype != dtype or not dtype_words(said):
        return None
    if _dtypes(model) != {dtype}:  # a model of mixed dtypes: its own to make one
        return None
    source = "its guide draws"
    if not drawn and guide is not None:
        drawn = _sites_drawn(guide, x, y)
    if not drawn:
        source, drawn = "its priors draw", _sites_drawn(model, x, y)
    other = {name: kind for name, kind in drawn.items() if kind != dtype}
    if not other:
        return None
    their, names, _ = _told(other)
    name, own = name_of(model), name_of(under_handlers(model)[0])  # (own: its priors' holder)
    inputs = "train_loader's inputs are" if caller == "fit()" else "x is"
    if source == "its priors draw":
        why = (
            "model.to() converts a module's parameters and buffers, not the distributions "
            "of its PyroSample attributes nor the tensors its forward builds them from"
        )
        fix = f"Build {own}'s priors in {dtype} (their parameters as {dtype} tensors)"
    else:
        why = "the guide was built, or fitted, in that dtype"
        fix = f"Build and fit a guide of {own} in {dtype}"
    ending = " Nothing was trained." if caller == "fit()" else ""
    return (
        f"{caller}: {name}'s parameters are {dtype}, and {inputs} cast to them, but {source} "
        f"its latent sites ({names}) in {their}, and torch does not mix the two "
        f"({type(err).__name__}: {said}); {why}. {fix}, or give the model {their} "
        f"(model.to({their})).{ending}"
    )


def refuse_guide_of_another_dtype(model: Any, guide: Any, x: torch.Tensor, y: torch.Tensor) -> None:
    """fit()'s :func:`latent_sites_refusal` (a TypeError) for a guide holding parameters of
    another dtype than the model's (a model cast after its autoguide was built), where the
    model fails on the guide's draws; nothing, and no pass, for a guide of the model's dtype
    or a model without floating parameters (a Pyro model whose layers are all drawn: no dtype
    of its own, nothing to tell); nothing for a guide whose draws the model runs on."""
    dtype, held = module_dtype(guide), module_dtype(model)
    if dtype is None or held is None or dtype == held:
        return
    try:
        poutine.replay(model, trace=poutine.trace(guide).get_trace(x, y))(x, y)
    except RuntimeError as err:
        told = latent_sites_refusal(err, model, guide, x, y, {}, "fit()")
        if told is None:
            raise
        raise TypeError(told) from err


def _dtypes(module: nn.Module) -> set[torch.dtype]:
    """The dtypes of ``module``'s floating parameters and buffers."""
    tensors = itertools.chain(module.parameters(), module.buffers())
    return {t.dtype for t in tensors if t.is_floating_point()}


def _sites_drawn(fn: Any, x: torch.Tensor, y: torch.Tensor | None) -> dict[str, torch.dtype]:
    """The floating latent sites ``fn(x, y)`` draws before it returns or fails, with their
    dtypes (a guide's auxiliary sites, such as an ``AutoDiagonalNormal``'s joint latent, left
    out), hidden from the handlers around the call; the random state (torch's, on ``x``'s
    device too, numpy's, Python's) is put back after it, so that a refusal read off it draws
    no number of the caller's stream."""
    with global_streams_kept(x.device), poutine.block(), poutine.trace() as capture:
        try:
            fn(x, y)
        except Exception:  # (the error again: the sites drawn before it are what is read)
            pass
    return {
        name: site["value"].dtype
        for name, site in capture.trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not (site.get("infer") or {}).get("is_auxiliary")
        and torch.is_tensor(site["value"])
        and site["value"].is_floating_point()
    }


def function_guide_refusal(
    err: BaseException, model: Any, guide: Any, x: torch.Tensor, guide_trace: Any
) -> str | None:
    """Why a Pyro model of the user's own without floating parameters failed on ``x`` (torch's
    words on a dtype, ``err``) replayed on a guide written as a function (``guide_trace``, a
    trace of its call), which drew the latent sites in another dtype than ``x``'s: pyrouq
    casts inputs to the dtype of a guide that is a module (an autoguide), but cannot see the
    parameters a function creates; and what to do. None for another error or guide."""
    if guide_trace is None:
        return None
    drawn = {
        name: site["value"].dtype
        for name, site in guide_trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and torch.is_tensor(site["value"])
        and site["value"].is_floating_point()
    }
    return _function_guide_words(err, model, guide, x, drawn, "fit()")


def guide_draws_refusal(
    err: BaseException, model: Any, guide: Any, x: torch.Tensor, drawn: dict[str, torch.dtype]
) -> str | None:
    """:func:`function_guide_refusal` for predict(): ``model`` failed on a batch ``x`` under
    draws of a guide written as a function whose floating sites were of the dtypes ``drawn``
    (site: dtype)."""
    return _function_guide_words(err, model, guide, x, drawn, "predict()")


def _function_guide_words(
    err: BaseException,
    model: Any,
    guide: Any,
    x: torch.Tensor,
    drawn: dict[str, torch.dtype],
    caller: str,
) -> str | None:
    """``caller``'s words where a guide written as a function drew sites in other dtypes than
    ``x``'s (``drawn``: every floating site's) and ``model`` failed on them in torch's words on
    a dtype (``err``); None for another error or guide, or draws all of ``x``'s dtype."""
    said = _dtype_words(err, model, guide, x)
    if said is None or guide is None or isinstance(guide, nn.Module):
        return None
    other = {name: dtype for name, dtype in drawn.items() if dtype != x.dtype}
    if not other:
        return None
    dtype, names, cast = _told(other)
    who = _guide_named(guide)
    if caller == "fit()":
        inputs, ending = "train_loader's inputs", " Nothing was trained."
        serve = f"Serve the inputs in {dtype} ({cast}, e.g. TensorDataset({cast}, y))"
    else:
        inputs, ending, serve = "x's inputs", "", f"Pass x in {dtype} ({cast})"
    return (
        f"{caller}: {who} draws {name_of(model)}'s latent sites "
        f"({names}) in {dtype}, but {inputs} are {x.dtype}, and torch does not mix the two "
        f"({type(err).__name__}: {said}). pyrouq casts the inputs to the dtype of a guide that "
        "is a module holding parameters (an autoguide), not to a function's, whose parameters "
        f"it cannot see. {serve}, or create the guide's parameters in {x.dtype} "
        f"(pyro.param(name, init) with init a {x.dtype} tensor).{ending}"
    )


def _guide_named(guide: Any) -> str:
    """A guide written as a function, as the message names it: "the guide function guide()"
    (a ``functools.partial`` by the function it wraps), "the guide function" (a lambda), "the
    guide MyGuide, a callable," (an instance whose class has ``__call__``)."""
    function = guide
    while isinstance(function, functools.partial):
        function = function.func
    if not inspect.isroutine(function):
        return f"the guide {type(function).__name__}, a callable,"
    name = getattr(function, "__name__", "")
    return f"the guide function {name}()" if name.isidentifier() else "the guide function"


def _dtype_words(err: BaseException, model: Any, guide: Any, x: torch.Tensor) -> str | None:
    """Torch's words in ``err`` (its first line) where they are about mixed dtypes on floating
    inputs ``x`` of a model and guide without floating parameters (where either holds some,
    ``x`` was cast to their dtype: serving it in another would change nothing); else None."""
    lines = torch_words(err).strip().splitlines()  # (not Pyro's trace shapes after them)
    said = lines[0] if lines else ""
    if not x.is_floating_point() or not dtype_words(said):
        return None
    if module_dtype(model) is not None or module_dtype(guide) is not None:
        return None
    return said


def _told(other: dict[str, torch.dtype]) -> tuple[torch.dtype, str, str]:
    """The dtype of the first of the sites ``other`` (name: dtype), up to three of their names
    as the messages list them, and the cast of ``x`` to that dtype."""
    dtype = next(iter(other.values()))
    names = ", ".join(map(repr, list(other)[:3])) + (", ..." if len(other) > 3 else "")
    return dtype, names, cast_call("x", dtype)
