"""``to_inference_data(model, None, x, y)`` of a Pyro model of the user's own (a function, a
``PyroModule``): its latent sites named, and its guide or its run asked for."""

from __future__ import annotations

import inspect
from typing import Any

import pyro
from pyro import poutine
from pyro.nn import PyroModule
from torch import Tensor, nn

from pyrouq._own_models import name_of, unobserved_sites
from pyrouq._util import global_streams_kept
from pyrouq.diagnostics._common import _prepared

_PASS = (
    "Pass its fitted guide, to_inference_data(model, guide, x, y) "
    "(pyro.infer.autoguide.AutoNormal(model) fitted by fit() or SVI); for a pyro.infer.MCMC "
    "run of it, use arviz.from_pyro(run)."
)
"""What to pass for a model of one's own without a guide."""


def refuse_own_model(fn: str, model: Any, x: Tensor, y: Tensor, n: int) -> None:
    """Refuse a model of the user's own given without a guide: it names the latent sites a
    trace of it shows, or says that it could not be traced (its own error chained); either
    way, what to pass. A plain ``nn.Module`` is not run (a network's ``forward(x,
    mask=None)`` would take y as its mask), and a model whose trace samples no latent site
    passes: the caller words both. The trace runs on 2 rows (the site names are all it
    reads), and leaves the random states and Pyro's param store as they were."""
    if isinstance(model, nn.Module) and not isinstance(model, PyroModule):
        return
    rows = (x[:2], y[:2])
    takes_y = _takes_targets(model, rows)
    try:
        sites = _latent_sites(model, rows if takes_y is not False else rows[:1], n)
    except Exception as err:
        if takes_y is not None or not isinstance(err, TypeError):
            raise _untraced(fn, model, takes_y is not False, err) from err
        try:  # no signature to read, and model(x, y) refused: a model(x), perhaps
            sites = _latent_sites(model, rows[:1], n)
        except Exception:
            raise _untraced(fn, model, True, err) from err
    if sites:
        raise ValueError(
            f"{fn}: {name_of(model)} samples the latent sites {sites[:3]} but guide is None: "
            f"its posterior is a guide's or a run's draws. {_PASS}"
        )


def _takes_targets(model: Any, rows: tuple[Tensor, Tensor]) -> bool | None:
    """Whether ``model`` takes ``(x, y)`` (else ``x`` alone), by its signature; None where it
    has none to read."""
    call = model.forward if isinstance(model, nn.Module) else model
    try:
        signature = inspect.signature(call)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*rows)
    except TypeError:
        return False
    return True


def _latent_sites(model: Any, args: tuple[Tensor, ...], n: int) -> list[str]:
    """The unobserved sample sites of a trace of ``model(*args)``."""
    with (
        pyro.get_param_store().scope(),  # a pyro.param it creates is not left behind
        _prepared(model, n),
        global_streams_kept(args[0].device),
        pyro.validation_enabled(False),
    ):
        return unobserved_sites(poutine.trace(model).get_trace(*args))


def _untraced(fn: str, model: Any, with_y: bool, err: BaseException) -> ValueError:
    """The refusal of a model that could not be traced, run as ``model(x, y)`` or ``model(x)``."""
    how = "model(x[:2], y[:2])" if with_y else "model(x[:2])"
    lines = str(err).strip().splitlines()  # (not the trace shapes Pyro adds below)
    said = lines[0] if lines else ""
    return ValueError(
        f"{fn}: {name_of(model)} could not be traced to find its latent sites (run as {how}, "
        f"it raised {type(err).__name__}: {said}), and guide is None. Fix the model if the "
        f"error is its own; its posterior is a guide's or a run's draws. {_PASS}"
    )
