"""The close names told for a factory name with a typo (``pyrouq fit nets:tiny_mpl``): read
without running the user's code (no property, no lazy import, no module ``__dir__`` that
fails), so that the advice can never fail in the user's place; and the factory without
arguments to write for one that takes some (:func:`calling_factory`)."""

from __future__ import annotations

import inspect
import re
import types
from typing import Any

from pyrouq._words import close_names, did_you_mean, name_slip, slip_hint


def calling_factory(called: str, arguments: str, module_name: str) -> str:
    """The factory without arguments to write for one that takes some, ``called``:
    ``"def make(): return called(arguments), given as module_name:make"`` (``make_net`` where
    ``called`` is ``make`` itself: ``def make(): return make(...)`` would call itself)."""
    new = "make_net" if called == "make" else "make"
    return f"def {new}(): return {called}({arguments}), given as {module_name}:{new}"


def _static(owner: Any, name: str) -> Any:
    """``owner.name`` as stored, without running a property or a module's ``__getattr__``
    (a class's classmethod and staticmethod unwrapped to their function); None if absent."""
    try:
        value = inspect.getattr_static(owner, name)
    except Exception:  # absent, or a lazy name only a module's __getattr__ makes
        return None
    if isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    return value


def _reaches_a_callable(owner: Any, names: list[str]) -> bool:
    for name in names:
        owner = _static(owner, name)
        if owner is None:
            return False
    return callable(owner)


def attribute_advice(owner: Any, parts: list[str], i: int, module_name: str) -> str:
    """What to name instead of ``parts[i]``, missing from ``owner`` (the module, or what the
    name goes through), put after the message's ``(factory ...)``: the names of ``owner``
    closest to it (in any case, where none is close as written), public, through which the
    rest of the name (``parts[i + 1:]``) reaches a callable, each shown as the whole factory
    name; a lower-case name that ``parts[i]`` only slipped from (its case, spaces, ``-`` for
    ``_``) is asked in :func:`~pyrouq._words.slip_hint`'s words, as an option's name is."""
    try:
        names = [n for n in dir(owner) if isinstance(n, str) and not n.startswith("_")]
    except Exception:  # a module's own __dir__ that fails
        names = []
    rest = parts[i + 1 :]
    # (joined: arguments with a dot, nets:make(0.5) or make(nn.ReLU()), were split into parts)
    call = re.fullmatch(r"([A-Za-z_]\w*)\((.*\S.*)\)", ".".join(parts[i:]))
    if call and _reaches_a_callable(owner, [call[1]]):  # nets:make(16): its 16 was dropped
        named = ".".join([*parts[:i], call[1]])
        return (
            "; MODEL names a factory, which pyrouq calls without arguments, not a call: name "
            f"one that calls it with yours ({calling_factory(named, call[2], module_name)})"
        )
    names = [n for n in names if _reaches_a_callable(owner, [n, *rest])]
    lower = [n for n in names if n == n.lower()]  # (slip_hint's names are lower case)
    hint = slip_hint(parts[i], lower)  # (did you mean 'tiny_mlp'? the names are lower case)
    slip = name_slip(parts[i], lower, joins=True)
    if hint and slip is not None:
        return f"{hint}; name {module_name}:{'.'.join([*parts[:i], slip[0], *rest])}"
    close = close_names(parts[i], names, n=3)  # (in any case where none is as written)
    if close:  # (did you mean 'nets:TinyNet'?), the whole name
        return did_you_mean([f"{module_name}:{'.'.join([*parts[:i], c, *rest])}" for c in close])
    name = getattr(owner, "__name__", None) if isinstance(owner, type) else None
    where = "that module" if isinstance(owner, types.ModuleType) else repr(name or parts[i - 1])
    return f"; name a function or class of {where} that builds the network"
