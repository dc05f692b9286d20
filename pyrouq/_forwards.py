"""Whether a pyrouq network runs a ``forward`` of the user's own (a subclass's, or one set on
the instance): fit() then traces it, predict(), mcmc() and the export run it under each draw.
A forward set on the instance that is only the built-in one wrapped (``m.forward =
torch.compile(m.forward)``, an argument-free ``functools.partial``) is not the user's own: the
network takes the built-in routes, as without it."""

from __future__ import annotations

import functools
import types
from typing import Any


def _unwrapped(forward: Any, model: Any) -> Any:
    """``forward`` with what only wraps it taken off: torch.compile's wrapper (its
    ``_torchdynamo_orig_callable``), a ``functools.partial`` that binds nothing, or binds
    ``model`` alone as the first argument (as a bound method does). A ``functools.wraps``
    decorator is kept (its ``__wrapped__`` may be called with other arguments, or its result
    changed)."""
    for _ in range(100):  # (a wrapper of itself would loop)
        inner = getattr(forward, "_torchdynamo_orig_callable", None)
        if isinstance(forward, functools.partial) and not forward.keywords:
            if not forward.args:
                inner = forward.func
            elif len(forward.args) == 1 and forward.args[0] is model:
                plain = isinstance(forward.func, types.FunctionType)
                inner = types.MethodType(forward.func, model) if plain else None
        if inner is None:
            break
        forward = inner
    return forward


def own_forward(model: Any) -> bool:
    """Whether ``model``, a :class:`~pyrouq.BayesianNetwork` or
    :class:`~pyrouq.convert.BatchEnsembleNetwork`, runs a ``forward`` other than its pyrouq
    class's built-in one when called: its class overrides it, or a forward set on the instance
    is not that one bound to ``model`` itself (:func:`_unwrapped`). False for anything else."""
    from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork

    kinds = (BayesianNetwork, BatchEnsembleNetwork)
    built_in = next((kind.forward for kind in kinds if isinstance(model, kind)), None)
    if built_in is None:
        return False
    if "forward" not in vars(model):
        return type(model).forward is not built_in
    forward = _unwrapped(vars(model)["forward"], model)
    return getattr(forward, "__self__", None) is not model or (
        getattr(forward, "__func__", None) is not built_in
    )
