"""The wrappers a model or guide may come in, and what pyrouq takes off them.

Three wrappers hold a module with the same parameters: ``DistributedDataParallel`` and
``DataParallel`` (as ``.module``) and ``torch.compile``'s ``OptimizedModule`` (as
``_orig_mod``). A user training under DDP passes the wrapped object on to the rest of the API,
and each function here says how far in to look:

* :func:`unwrapped`: every wrapper off, however they nest (what :func:`pyrouq.save` stores);
* :func:`uncompiled`: torch.compile's wrappers off, a parallel one kept;
* :func:`given_model`: what the public functions run. A pyrouq model comes out of every
  wrapper; any other module (a plain network, a guide) out of DDP only, whose forward would
  take part in the group's collectives; a torch.compile wrapper around a DDP is made again,
  with the same compiler settings, around the module inside it.

A wrapper is told by its class (never by an ``_orig_mod`` or ``module`` attribute alone, which a
user's own module may have).

A model function or module may also come inside Pyro's effect handlers
(``poutine.condition(model, data=...)``: a ``functools.partial`` of Pyro's), run as they are;
:func:`under_handlers` names the model inside and the handlers, for messages
(:func:`name_of`, :func:`held_name`: the one home of a model's name in messages)."""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

from pyro import poutine
from pyro.poutine.messenger import Messenger
from torch import nn

_PARALLEL = (nn.parallel.DistributedDataParallel, nn.DataParallel)


def _inner(module: Any, compiled_too: bool = True) -> Any:
    """The module that one wrapper (``module``) holds, else None (not a wrapper, or one that
    holds no module). torch._dynamo is not imported for it: a compiled module exists only
    once it has been."""
    if isinstance(module, _PARALLEL):
        inner = module.module
    elif not compiled_too:
        return None
    else:
        eval_frame = sys.modules.get("torch._dynamo.eval_frame")
        compiled = getattr(eval_frame, "OptimizedModule", None)
        if compiled is None or not isinstance(module, compiled):
            return None
        inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else None


def unwrapped(module: Any) -> Any:
    """The module that ``torch.compile`` (``module._orig_mod``), ``DistributedDataParallel``
    or ``DataParallel`` (``module.module``) wrapped, however the wrappers nest, else ``module``
    itself."""
    while (inner := _inner(module)) is not None:
        module = inner
    return module


def name_of(model: Any) -> str:
    """A model's name for messages: a function's own name, else its class's; one inside Pyro's
    effect handlers is named with them, "BNN (under poutine.condition)", not as the
    ``functools.partial`` they make (:func:`under_handlers`). :func:`held_name` names one
    inside torch's wrappers too."""
    inner, handlers = under_handlers(model)
    name = getattr(inner, "__name__", None) or type(inner).__name__
    return f"{name} (under {', '.join(handlers)})" if handlers else name


def held_name(module: Any) -> str:
    """The name (:func:`name_of`) of the model inside ``module``'s wrappers, with the
    wrappers, innermost first, for messages that name what the user holds:
    ``"BayesianNetwork (in DataParallel)"``, ``"Net (in DistributedDataParallel in
    torch.compile)"``; :func:`name_of` ``module`` where it is in none."""
    wrappers = []
    while (inner := _inner(module)) is not None:
        wrappers.append(type(module).__name__ if isinstance(module, _PARALLEL) else "torch.compile")
        module = inner
    name = name_of(module)
    return f"{name} (in {' in '.join(reversed(wrappers))})" if wrappers else name


def held_paths(held: Any, module: Any) -> dict[str, str]:
    """The names of ``module``'s submodules (``module.named_modules()``) as ``held``, the
    wrapper the user holds around it, names them (``held.get_submodule(name)``): DataParallel's
    ``'module.net.1'`` for ``'net.1'``; a submodule ``held`` does not hold keeps its name."""
    paths = {id(sub): name for name, sub in held.named_modules()}
    return {name: paths.get(id(sub), name) for name, sub in module.named_modules()}


def uncompiled(module: Any) -> Any:
    """The module ``torch.compile`` wrapped (its ``_orig_mod``), however many times, else
    ``module`` itself: a parallel wrapper is kept, and so is a module of another class that has
    an ``_orig_mod`` attribute (a user's own, no compiled wrapper)."""
    while not isinstance(module, _PARALLEL) and (inner := _inner(module)) is not None:
        module = inner
    return module


def given_model(model: Any, keep_compiled: bool = False) -> Any:
    """The model a public function (predict(), fit(), the diagnostics, mcmc(),
    mean_field_guide()) works on when given a wrapped one, and the guide (predict(), fit(),
    the diagnostics): a guide, no pyrouq model, comes out of DDP as any other module.

    A pyrouq model (:func:`~pyrouq.bayesian`, :func:`~pyrouq.batchensemble`,
    :func:`~pyrouq.rank1`) comes out of every wrapper: pyrouq reads its members, sites and
    ``outputs()``, which a wrapper's ``forward`` would hide (a BatchEnsemble's ``(M, B, C)``
    outputs taken for one batch's). With ``keep_compiled`` (fit(), which took a compiled
    model as it came before DDP was seen through, and keeps it so), the ``torch.compile``
    wrapper nearest the outside is kept, the parallel ones outside it taken off; one that
    compiled a parallel wrapper (``torch.compile(DDP(model))``) is made again, with the same
    compiler settings, around the model inside (DDP's forward would reduce the gradients a
    second time, and hides the model's ``num_data``).

    Any other model (a plain network, a Pyro model of one's own) comes out of its
    ``DistributedDataParallel`` wrappers only: their forward takes part in the group's
    collectives (a broadcast of the buffers, each pass), which a rank predicting alone would
    wait on, and fit() averages the gradients itself. A ``DataParallel`` or a
    ``torch.compile`` wrapper of such a model is kept, its forward run as it is (the same
    outputs, split over devices or compiled); one that compiled a DDP wrapper
    (``torch.compile(DDP(net))``, the order torch advises) is made again, with the same
    compiler settings, around the module inside the DDP."""
    if getattr(unwrapped(model), "_pyrouq_model", False):
        if not keep_compiled:
            return unwrapped(model)
        while (inner := _inner(model, compiled_too=False)) is not None:
            model = inner
        return _compiled_around(model, unwrapped(model))
    while isinstance(model, nn.parallel.DistributedDataParallel):
        inner = _inner(model)
        if inner is None:
            break
        model = inner
    inside = model  # (through compile and DDP wrappers; a DataParallel is kept)
    while not isinstance(inside, nn.DataParallel) and (inner := _inner(inside)) is not None:
        inside = inner
    return _compiled_around(model, inside)


def _compiled_around(compiled: Any, model: Any) -> Any:
    """``compiled`` (``model`` itself, or a ``torch.compile`` wrapper holding it) as it is
    where only compile wrappers lie between the two, else ``model`` compiled with
    ``compiled``'s compiler settings: its ``dynamo_ctx`` (the backend, mode, options,
    ``fullgraph`` and ``dynamic`` it was given) called on ``model``, as torch.compile calls
    it to make its wrapper."""
    inner = compiled
    while inner is not model:
        if isinstance(inner, _PARALLEL):
            break
        inner = _inner(inner)
    else:
        return compiled
    settings = vars(compiled).get("dynamo_ctx")
    if not callable(settings):  # (a torch whose wrapper keeps them otherwise)
        raise TypeError(
            f"Got torch.compile() of a {type(inner).__name__} holding {type(model).__name__}; "
            f"pyrouq runs the module inside the {type(inner).__name__} (fit() averages the "
            "gradients itself, and DDP's forward waits on the other ranks), but this torch's "
            "compiled wrapper keeps no compiler settings (dynamo_ctx) to compile that module "
            f"with again. Pass torch.compile(model), or {type(inner).__name__}(torch.compile("
            "model)): compile inside the parallel wrapper."
        )
    return settings(model)


def under_handlers(fn: Any) -> tuple[Any, list[str]]:
    """The model that Pyro's effect handlers wrapped (``poutine.condition(model, data=...)``,
    however they nest: ``partial(_context_wrap, messenger, model)`` in a ``_bound_partial``),
    and the handlers, outermost first, as written (``"poutine.condition"``; a handler of
    another name, its class's); ``fn`` itself and none where it is no such wrapper."""
    inner, handlers = fn, []
    while isinstance(inner, functools.partial):
        if len(inner.args) == 2 and isinstance(inner.args[0], Messenger):
            kind = type(inner.args[0]).__name__
            word = re.sub(r"(?<!^)(?=[A-Z])", "_", kind.removesuffix("Messenger")).lower()
            handlers.append(f"poutine.{word}" if hasattr(poutine, word) else kind)
            inner = inner.args[1]
        elif not inner.args and isinstance(inner.func, functools.partial):
            inner = inner.func  # (the _bound_partial around the handler's partial)
        else:
            break
    return (inner, handlers) if handlers else (fn, [])
