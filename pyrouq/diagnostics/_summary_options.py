"""The options :func:`pyrouq.summary` passes on to ``az.summary``, checked by name first (a
misspelled one was Python's bare "unexpected keyword argument", naming neither the options
there are nor the one meant)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from pyrouq._words import close_hint

_OWN = ("data", "var_names", "group", "hdi_prob")
"""``az.summary``'s arguments that ``summary()`` sets itself (``data`` is its ``idata``)."""


def check_summary_options(options: Mapping[str, Any], az_summary: Callable[..., Any]) -> None:
    """Refuse an option of ``options`` that ``az_summary`` (``arviz.summary``) has no argument
    for, by its signature (read, so that another arviz version's options hold), asking whether
    the closest name was meant; ``data=``, which ``summary()`` passes ``idata`` as, too."""
    try:
        parameters = inspect.signature(az_summary).parameters
    except (TypeError, ValueError):  # no signature to read: arviz is left to check
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    if "data" in options:
        raise TypeError(
            "summary() got data=, but it passes idata to az.summary as its data: pass the "
            "InferenceData as idata, the first argument, and leave data= out."
        )
    known = [name for name in parameters if name not in _OWN]
    for name in options:
        if name in known:
            continue
        meant = close_hint(name, known)  # (its case, spaces, '-' for '_', or a typo)
        raise TypeError(
            f"summary() got an unknown option {name!r}{meant}: it passes its options on to "
            f"az.summary, which takes {', '.join(known)}. Pass one of these, or leave it out."
        )
