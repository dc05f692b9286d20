"""The targets a ``pyro.poutine.condition()`` around a pyrouq model gives its ``"obs"`` site.

``poutine.condition(model, data={"obs": y})(x)`` is, to a Pyro user, ``model(x, y)``: Pyro
makes the site observed whatever its code passed as ``obs=``. The model sees ``y=None`` there,
so :meth:`~pyrouq.likelihoods.Likelihood.observe` reads the value the handler will give the
site, to scale the minibatch's log-likelihood by N/B and check the targets' shape
(:func:`check_conditioned_shape`).
"""

from __future__ import annotations

import math
from typing import Any

import pyro
import torch
from pyro.poutine.block_messenger import BlockMessenger
from pyro.poutine.condition_messenger import ConditionMessenger
from torch import Tensor


def conditioned_value(site: str) -> Tensor | None:
    """The value the active ``poutine.condition()`` handlers give ``site`` (the outermost's,
    which Pyro applies last), or None: none conditions it, the last one that names it gives
    None (Pyro leaves the site unobserved then), or a ``poutine.block()`` between the call
    and the handler hides the site from it (a ``hide_fn`` of one's own that fails on the
    question counts as hiding it)."""
    value: Any = None
    for handler in reversed(getattr(pyro.poutine.runtime, "_PYRO_STACK", None) or []):
        if isinstance(handler, BlockMessenger) and _hides(handler, site, value is not None):
            break
        if isinstance(handler, ConditionMessenger) and handler.data is not None:
            data: Any = handler.data
            if site in data:
                trace = isinstance(data, pyro.poutine.Trace)
                value = data.nodes[site].get("value") if trace else data[site]
    return value if isinstance(value, Tensor) else None


def check_conditioned_shape(
    given: Tensor, site: tuple[int, ...], outputs: Tensor, where: str
) -> None:
    """Refuse targets ``given`` by a condition() whose last dims are not ``site``, the shape
    the ``"obs"`` site holds for a batch: ``(B,)`` labels, a Gaussian's ``(B, D)`` targets.
    Pyro would broadcast them against the outputs instead, silently where it can (a Gaussian
    of 2 outputs scored each of ``(B, 1)`` targets against both means). Leading dims (a
    vectorised Predictive's draws) are Pyro's to check."""
    if given.dim() >= len(site) and tuple(given.shape[given.dim() - len(site) :]) == site:
        return
    try:
        torch.broadcast_shapes(given.shape, (*outputs.shape[:-1], *site[1:]))
        what = f"Pyro would score them broadcast against the outputs {tuple(outputs.shape)}"
    except RuntimeError:
        what = f"Pyro cannot match them to the outputs {tuple(outputs.shape)}"
    raise ValueError(
        f"{where}: a pyro.poutine.condition() around the model gives its 'obs' site targets "
        f"of shape {tuple(given.shape)}, expected {site} as the site holds them: {what}. "
        f"Condition on {_fix(given, site)}, or pass the targets to the model: model(x, y)."
    )


def _fix(given: Tensor, site: tuple[int, ...]) -> str:
    """What to condition on instead of ``given`` for a site of shape ``site``: a reshape only
    where it keeps each target with its input (the same sizes but for dims of 1: ``(B, 1)``
    labels, ``(B,)`` targets of one output); the transpose of ``(D, B)`` targets (their
    reshape pairs them with the wrong inputs); else the shape, in words."""
    if given.numel() == math.prod(site) and [n for n in given.shape if n != 1] == [
        n for n in site if n != 1
    ]:
        return f"y.reshape{site}"
    if len(site) == 2 and site[0] != site[1] and given.shape[-2:] == site[::-1]:
        return "y.mT" if given.dim() > 2 else "y.T"
    each = "one label per input" if len(site) == 1 else "one per output of each input"
    return f"targets of shape {site}, {each}"


def _hides(handler: BlockMessenger, site: str, observed: bool) -> bool:
    message = {
        "type": "sample",
        "name": site,
        "is_observed": observed,
        "infer": {},
        "value": None,
        "fn": None,
        "args": (),
        "kwargs": {},
        "scale": 1.0,
        "mask": None,
        "cond_indep_stack": (),
    }
    try:
        return bool(handler.hide_fn(message))  # type: ignore[arg-type]
    except Exception:
        return True
