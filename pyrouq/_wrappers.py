"""The module inside the wrappers a model may come in: ``DistributedDataParallel``,
``DataParallel`` (their ``.module``) and ``torch.compile``'s (its ``_orig_mod``), each holding
the same parameters. A user training under DDP passes the wrapped object on to the rest of the
API; :func:`unwrapped` takes them all off (what :func:`pyrouq.save` stores),
:func:`given_model` those that the public functions taking a model see through."""

from __future__ import annotations

import sys
from typing import Any

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


def given_model(model: Any, keep_compiled: bool = False) -> Any:
    """The model a public function (predict(), fit(), the diagnostics, mcmc(),
    mean_field_guide()) works on when given a wrapped one.

    A pyrouq model (:func:`~pyrouq.bayesian`, :func:`~pyrouq.batchensemble`,
    :func:`~pyrouq.rank1`) comes out of every wrapper: pyrouq reads its members, sites and
    ``outputs()``, which a wrapper's ``forward`` would hide (a BatchEnsemble's ``(M, B, C)``
    outputs taken for one batch's). With ``keep_compiled`` (fit(), which took a compiled
    model as it came before DDP was seen through, and keeps it so), the ``torch.compile``
    wrapper nearest the outside is kept, the parallel ones outside it taken off.

    Any other model (a plain network, a Pyro model of one's own) comes out of the
    ``DistributedDataParallel`` wrappers outside it only: their forward takes part in the
    group's collectives (a broadcast of the buffers, each pass), which a rank predicting
    alone would wait on, and fit() averages the gradients itself. A ``DataParallel`` or a
    ``torch.compile`` wrapper of such a model is kept, its forward run as it is (the same
    outputs, split over devices or compiled)."""
    if getattr(unwrapped(model), "_pyrouq_model", False):
        if not keep_compiled:
            return unwrapped(model)
        while (inner := _inner(model, compiled_too=False)) is not None:
            model = inner
        return model
    while isinstance(model, nn.parallel.DistributedDataParallel):
        inner = _inner(model)
        if inner is None:
            break
        model = inner
    return model
