"""The module inside the wrappers a model may come in: ``DistributedDataParallel``,
``DataParallel`` (their ``.module``) and ``torch.compile``'s (its ``_orig_mod``), each holding
the same parameters. A user training under DDP passes the wrapped object on to the rest of the
API; :func:`unwrapped` takes them all off (what :func:`pyrouq.save` stores)."""

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
