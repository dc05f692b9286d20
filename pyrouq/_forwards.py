"""Whether a pyrouq network runs a ``forward`` of the user's own (a subclass's, or one set on
the instance): fit() then traces it, predict(), mcmc() and the export run it under each draw.
A forward set on the instance that is only the built-in one wrapped (``m.forward =
torch.compile(m.forward)``, an argument-free ``functools.partial``) is not the user's own: the
network takes the built-in routes, as without it. :func:`forward_module` says which module's
forward predict() and the export run, refusing an ensemble's own."""

from __future__ import annotations

import functools
import types
from typing import Any

from pyrouq._wrappers import uncompiled


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


def forward_module(model: Any, caller: str) -> Any | None:
    """The module whose own ``forward`` ``caller`` (predict(), the export) runs under each
    draw: a :class:`~pyrouq.BayesianNetwork` of one network whose forward is the user's own
    (:func:`own_forward`; torch.compile's wrapper taken off), or None for a model whose
    predictions are its network's outputs alone (``outputs()``: the built-in forward, a Pyro
    model of the user's own, a BatchEnsemble or a rank-1 network of pyrouq's).

    Raises
    ------
    ValueError
        For a BatchEnsemble or rank-1 network with a forward of its own: its predictions are
        each member's outputs (``outputs()``), which would leave out what that forward adds
        (fit() traces it), and its outputs cannot be read per member.
    """
    from pyrouq.convert import BayesianNetwork

    module = uncompiled(model)
    if not own_forward(module):
        return None
    if isinstance(module, BayesianNetwork) and module.num_members is None:
        return module
    kind = "a rank-1 network" if isinstance(module, BayesianNetwork) else "a BatchEnsemble"
    convert = "rank1(net, M)" if isinstance(module, BayesianNetwork) else "batchensemble(net, M)"
    raise ValueError(
        f"{caller} got {kind} ({module._get_name()}) with a forward of its own (its class's or "
        f"one set on the instance). Its predictions are its members' outputs, which {caller} "
        "reads off the network (outputs()): a forward of its own returns one tensor for all "
        "members, and what it adds (a transform of the inputs, a site it samples) cannot be "
        "split per member, so they would leave out what fit() trained with. Put what the "
        f"forward adds into the network: a module wrapping net that does it, converted with "
        f"{convert}, the built-in forward kept."
    )
