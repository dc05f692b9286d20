"""What defines the objective a rank trains beyond its parameters, compared between the ranks
before fit()'s first step (:func:`pyrouq.infer._distributed.check_same_model`): the model's
description, what :func:`pyrouq.save` writes to rebuild it (its class, likelihood, priors,
local reparameterisation, ensemble options and network structure), and the guide's kind; and
the words of the refusal when the ranks' differ."""

from __future__ import annotations

import json
import types
from typing import Any

from pyrouq.checkpoint import describe_guide, describe_model

__all__ = ["model_summary", "models_differ"]

_SHOWN = 160
"""The most characters of an entry's value a refusal shows per rank."""

_ENTRIES = 3
"""The most entries whose values a refusal shows (it names all that differ)."""


def _as_main(name: str) -> str:
    """``name`` (``module.QualifiedName``) with the script's module named ``__main__``:
    multiprocessing's spawned processes import it as ``__mp_main__``, so a class defined there
    is ``__mp_main__.Net`` on a spawned rank and ``__main__.Net`` on a rank the script runs."""
    return f"__main__.{name[12:]}" if name.startswith("__mp_main__.") else name


def _qualified(thing: Any) -> str:
    """``module.QualifiedName`` of a class or function, else of the object's class."""
    kind = thing if isinstance(thing, (type, types.FunctionType, types.MethodType)) else type(thing)
    return _as_main(
        f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"
    )


def _json(value: Any) -> str:
    """``value`` as JSON text, the same on every rank for the same value: an object JSON cannot
    write by its class's name (never its repr, which may hold an address or a device)."""
    return json.dumps(value, sort_keys=True, default=lambda o: f"<{_qualified(o)}>")


def _model_entries(model: Any) -> dict[str, str]:
    """``{entry: JSON}`` of the model's description: its class, the entries of its
    configuration and its network's structure (``"module"``). ``num_data`` and the
    ``kl_weight`` it sets are left out: fit() sets and compares them as arguments. A model
    pyrouq cannot describe (a Pyro model of one's own, a likelihood of one's own) is named by
    its class, with its likelihood's class and ``local_reparameterization`` where it has them."""
    try:
        described = describe_model(model)
    except Exception:  # whatever fails: every rank must still take part
        config: dict[str, Any] = {}
        if hasattr(model, "local_reparameterization"):
            config["local_reparameterization"] = model.local_reparameterization
        if getattr(model, "likelihood", None) is not None:
            config["likelihood"] = _qualified(model.likelihood)
        own = not type(model).__module__.startswith("pyrouq.")  # pyrouq's: named as described
        described = {"class": _qualified(model) if own else type(model).__name__, "config": config}
    entries = {"class": _json(described["class"])}
    entries.update({k: _json(v) for k, v in dict(described.get("config") or {}).items()})
    if "module" in described:
        record = described["module"]
        if isinstance(record, dict) and isinstance(record.get("class"), str):
            record = {**record, "class": _as_main(record["class"])}
        entries["module"] = _json(record)
    return entries


def model_summary(model: Any, guide: Any) -> str:
    """JSON text of what defines the objective ``model`` and ``guide`` train, beyond their
    parameters (compared on their own): ``{entry: JSON of its value}``, the model's entries
    (see :func:`_model_entries`) and ``"guide"``: a :class:`~pyrouq.MeanFieldGuide`'s class and
    settings, another guide's class (or function's name), ``null`` without one. It never
    raises: every rank must reach the collectives that compare it, whatever its model."""
    try:
        entries = _model_entries(model)
    except Exception:
        entries = {"class": _json(_qualified(model))}
    try:
        entries["guide"] = _json(describe_guide(guide))
    except Exception:  # an autoguide, a guide of one's own: its kind
        entries["guide"] = _json(_qualified(guide))
    return json.dumps(entries, sort_keys=True)


def _shown(value: str | None) -> str:
    if value is None:  # an entry the rank's description lacks, or one it could not write
        return "(not described)"
    return value if len(value) <= _SHOWN else f"{value[: _SHOWN - 3]}..."


def models_differ(summaries: list[str]) -> str:
    """The refusal of ranks whose :func:`model_summary` texts (one per rank, in rank order)
    differ: the entries that differ between rank 0 and the first rank that differs from it,
    the values of the first few on both, and what to do."""
    ranks = [json.loads(text) for text in summaries]
    first = ranks[0]
    apart = [r for r in range(1, len(ranks)) if ranks[r] != first] or [1]
    other = ranks[apart[0]]
    names = [*first, *(name for name in other if name not in first)]
    differ = [name for name in names if first.get(name) != other.get(name)] or ["?"]
    shown = "; ".join(
        f"{name}: {_shown(first.get(name))} on rank 0 vs {_shown(other.get(name))} on rank "
        f"{apart[0]}"
        for name in differ[:_ENTRIES]
    )
    more = f"; ... ({len(differ) - _ENTRIES} more)" if len(differ) > _ENTRIES else ""
    ranks_apart = f" (ranks {', '.join(map(str, apart))} differ from rank 0)" if apart[1:] else ""
    return (
        f"fit(): the ranks' models differ in their {', '.join(differ)}: {shown}{more}"
        f"{ranks_apart}. Build the same model and guide on every rank (the same likelihood, "
        "priors, local_reparameterization, network and guide): the ranks average their "
        "gradients into one model, and ranks whose objectives differ would train a mix of them "
        "without a word."
    )
