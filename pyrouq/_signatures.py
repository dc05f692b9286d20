"""How a callable given to pyrouq (a ``select=`` callable, a ``fit()`` callback, an ``optim``
factory, an optimizer's ``step``) reads: the signature it is called with."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["call_signature", "not_callable_as"]

_PASSED_ON = {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}


def call_signature(fn: Any) -> inspect.Signature | None:
    """``fn``'s own signature (a decorator's wrapper's: it may supply arguments of its own),
    unless it only passes ``*args, **kwargs`` on to the function it wraps (``__wrapped__``),
    whose signature it then is; None where there is none to read (some builtins)."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
        kinds = {p.kind for p in signature.parameters.values()}
        if kinds and kinds <= _PASSED_ON and hasattr(fn, "__wrapped__"):
            signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return signature


def not_callable_as(fn: Any, *args: Any) -> str | None:
    """Why ``fn`` cannot be called with ``args`` (Python's own words), or None: it can, or its
    signature cannot be read, where the call itself says."""
    signature = call_signature(fn)
    if signature is None:
        return None
    try:
        signature.bind(*args)
    except TypeError as err:
        return str(err)
    return None
