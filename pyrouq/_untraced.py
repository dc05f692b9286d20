"""A pyrouq model's Pyro bookkeeping kept out of ``torch.compile``'s tracing.

Under ``torch.compile(model)`` dynamo traces the model's ``forward``, Pyro statements included.
Pyro's messages break its graphs (a ``TypedDict`` dynamo does not trace), so what they call
(``pyro.param``, Pyro's effect handlers, the param store's weak references, a site's prior)
becomes frames of its own, which dynamo compiles again for every parameter name, site name and
shape it meets: a network of more than 8 parameters hit ``torch._dynamo.config.recompile_limit``
on ``pyro.param``, warned, and ran those frames eagerly. Run through :func:`untraced`, a model's
per-name statements (its point estimates put in the store and recorded as param sites, its
latent sites drawn) are one graph break, run eagerly, whatever the number of names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

# torch >= 2.3; torch 2.2's torch._utils.is_compiling, which dynamo reads the same way
_compiling = getattr(torch.compiler, "is_compiling", None) or torch._utils.is_compiling


def untraced(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``; where dynamo traces the caller, run eagerly, untraced (one graph break).
    Outside ``torch.compile`` it is a plain call (torch._dynamo is not imported for it)."""
    if _compiling():
        # (imports torch._dynamo, some 2 s, which tracing has done already)
        from pyrouq._untraced_call import call

        return call(fn, *args)  # type: ignore[no-any-return]
    return fn(*args)
