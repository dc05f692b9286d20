"""The fix for a loader that yields dicts where :func:`pyrouq.fit` and :func:`pyrouq.predict`
take ``(x, y)`` pairs: a ``collate_fn`` that collates the examples as torch does, then returns
the pair of the dict's own keys (one that indexed its argument by key failed in torch's words,
for a ``collate_fn`` gets the list of examples, not the collated dict)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["dict_batch_fix"]

_LABEL_KEYS = ("label", "labels", "target", "targets", "y")


def dict_batch_fix(batch: Mapping[Any, Any], needs_labels: bool = True) -> str:
    """``"a dict with keys 'image', 'label'. Map it to pairs, e.g. ..."``: the input key is
    the first that is not named like labels, the label key the first that is (placeholders
    ``'x'`` and ``'y'`` where the dict has none such). Where labels are not needed
    (:func:`pyrouq.predict`) a dict with no label key is mapped to its inputs alone (its
    placeholder ``b['y']`` failed with a KeyError)."""
    keys = list(batch)
    labels = [k for k in keys if isinstance(k, str) and k.lower() in _LABEL_KEYS]
    inputs = [k for k in keys if k not in labels]
    x, y = (inputs[0] if inputs else "x"), (labels[0] if labels else "y")
    shown = ", ".join(repr(k) for k in keys[:5])
    if not (labels or needs_labels):
        return (
            f"a dict with keys {shown}. Map it to tensors of inputs, e.g. a collate_fn that "
            f"collates the examples and returns them: def inputs(items): return "
            f"torch.utils.data.default_collate(items)[{x!r}]; then "
            "DataLoader(..., collate_fn=inputs)."
        )
    return (
        f"a dict with keys {shown}. Map it to pairs, e.g. a collate_fn that collates the "
        f"examples and returns the pair: def pairs(items): b = "
        f"torch.utils.data.default_collate(items); return b[{x!r}], b[{y!r}]; then "
        "DataLoader(..., collate_fn=pairs)."
    )
