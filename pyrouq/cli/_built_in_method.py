"""What ``pyrouq fit`` tells a built-in model given ``--method`` (which converts a factory's
network): the built-in model that is that conversion of its network, or how to get it."""

from __future__ import annotations

from typing import Any

_PREFIX = {"plain": "", "bayesian": "bayesian-", "batchensemble": "batchensemble-",
           "rank1": "rank1-"}  # fmt: skip


def built_in_instead(model: str, method: str, models: dict[str, dict[str, Any]]) -> str:
    """The refusal of ``--method method`` for the built-in ``model`` (a key of ``models``),
    naming what to write instead: ``model`` itself without ``--method``, where it is the
    conversion asked for; the built-in model that is (``mlp --method batchensemble``:
    ``batchensemble-mlp``); else the built-in models, and its network named as a factory that
    ``--method`` converts (``pyrouq.models:LeNet --method last-layer``)."""
    network = model.rpartition("-")[2]  # (every built-in model ends in its network's name)
    said = f"--method applies to a factory (package.module:factory); {model} is a built-in model"
    named = f"{_PREFIX[method]}{network}" if method in _PREFIX else None
    if named == model:
        return f"{said}, its network as --method {method} makes it already: leave --method out"
    if named in models:
        return f"{said}. Its --method {method} conversion is built in too: pyrouq fit {named}"
    factory = f"pyrouq.models:{models[network]['class']}" if network in models else "FACTORY"
    return (
        f"{said}, and its --method {method} conversion is not (the built-in models: "
        f"{', '.join(models)}). Convert its network as a factory: pyrouq fit {factory} "
        f"--method {method}"
    )
