"""The JSON of a checkpoint (its metadata, the description): what JSON cannot write, or would
give back changed (a tuple as a list), refused naming where it lies."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pyrouq.checkpoint._error import CheckpointError


def python_number(value: Any) -> Any:
    """A numpy number (of a model's settings, ``BayesianMLP(hidden_features=np.int64(64))``, or
    of the metadata) as the Python number JSON writes; anything else stays refused."""
    if isinstance(value, np.generic) and np.ndim(value) == 0:
        return value.item()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_text(metadata: Any) -> str:
    """``metadata`` as JSON text, or a :class:`CheckpointError` saying what to convert (what
    JSON would change, a tuple or a key that is not a string, too: it would load otherwise)."""
    changed = _changed_by_json(metadata, "metadata")
    if changed:
        raise CheckpointError(
            f"metadata must hold JSON values, which load back as saved; {changed}. Convert it "
            "(a list for a tuple, str(key) for a key) before saving."
        )
    try:
        return json.dumps(metadata, allow_nan=True, default=python_number)
    except (TypeError, ValueError) as err:
        found = _not_json(metadata, "metadata")
        raise CheckpointError(
            f"metadata must hold JSON values (dicts, lists, strings, numbers, booleans, None); "
            f"got {f'{found[0]} of type {found[1]}' if found else err}. Convert tensors with "
            ".tolist() or float()."
        ) from None


def _not_json(value: Any, where: str, seen: frozenset[int] = frozenset()) -> tuple[str, str] | None:
    """Where in ``value`` the first value lies that JSON cannot write, and its type's name."""
    if value is None or isinstance(value, (str, int, float)) or isinstance(value, np.generic):
        return None
    if not isinstance(value, (dict, list, tuple)):
        return where, type(value).__name__
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items if id(value) not in seen else ():
        found = _not_json(item, f"{where}[{key!r}]", seen | {id(value)})
        if found:
            return found
    return None


def _changed_by_json(value: Any, where: str, seen: frozenset[int] = frozenset()) -> str:
    """Where JSON would give ``value`` back changed (a tuple as a list, a key that is not a
    string as one), and how; ``""`` if nowhere (or in a circular reference, which json.dumps
    refuses itself)."""
    if id(value) in seen:
        return ""
    if isinstance(value, (tuple, dict, list)):
        seen = seen | {id(value)}
    if isinstance(value, tuple):
        return f"{where} is a tuple, which would load back as a list"
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, (int, float, bool)) or key is None:  # json.dumps takes these
                as_text = json.dumps({key: 0})[1:-4]
                return f"{where} has the key {key!r}, which would load back as {as_text}"
            found = _changed_by_json(item, f"{where}[{key!r}]", seen)
            if found:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _changed_by_json(item, f"{where}[{index}]", seen)
            if found:
                return found
    return ""
