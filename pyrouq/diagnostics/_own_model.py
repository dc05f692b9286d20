"""``to_inference_data(model, None, x, y)`` of a Pyro model of the user's own (a function, a
``PyroModule``): its latent sites named, and its guide or its run asked for."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.nn import PyroModule
from torch import Tensor, nn

from pyrouq._mismatch import size_error
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
    reads), and where that raises a ``RuntimeError``, ``IndexError`` or ``ValueError``
    that may be on sizes and shapes (:func:`pyrouq._mismatch.size_error`: a plate's "Shape
    mismatch", an ``expand``, an index out of bounds, of a plate or a latent of a fixed size
    N) once more on the whole ``(x, y)``; a dtype, device, out-of-memory or accelerator
    error on the 2 rows is told as it came (not run on the whole data, which could exhaust
    an accelerator's memory). It
    leaves the random states and Pyro's param store as they were (the model reads the
    parameters there; those it creates are dropped, and the values of those it reads put
    back, should it change one in place)."""
    if isinstance(model, nn.Module) and not isinstance(model, PyroModule):
        return
    whole = (x, y)
    takes_y = _takes_targets(model, whole)
    if x.shape[0] > 2:
        try:
            sites = _sites(model, (x[:2], y[:2]), takes_y, n)
        except _Untraced as untraced:  # pyrouq's cutting, perhaps: the whole data
            err = untraced.__cause__
            assert err is not None
            if not size_error(err):
                raise _untraced(fn, model, untraced, err, cut=True) from err
            sites = _traced_whole(fn, model, whole, takes_y, n)
    else:
        sites = _traced_whole(fn, model, whole, takes_y, n)
    if sites:
        raise ValueError(
            f"{fn}: {name_of(model)} samples the latent sites {sites[:3]} but guide is None: "
            f"its posterior is a guide's or a run's draws. {_PASS}"
        )


def _traced_whole(
    fn: str, model: Any, whole: tuple[Tensor, Tensor], takes_y: bool | None, n: int
) -> list[str]:
    """The latent sites of a trace of the model on the whole ``(x, y)``, or the refusal of a
    model that could not be traced so (its error chained)."""
    try:
        return _sites(model, whole, takes_y, n)
    except _Untraced as untraced:
        err = untraced.__cause__
        assert err is not None
        raise _untraced(fn, model, untraced, err) from err


class _Untraced(Exception):
    """A trace that failed, run as ``model(x, y)`` (``with_y``) or ``model(x)``; the model's
    error is its cause, and ``retry`` the error of ``model(x)`` tried after it, if it was."""

    def __init__(self, with_y: bool, retry: BaseException | None = None) -> None:
        super().__init__()
        self.with_y, self.retry = with_y, retry


def _sites(model: Any, rows: tuple[Tensor, Tensor], takes_y: bool | None, n: int) -> list[str]:
    """The latent sites of a trace of ``model(*rows)`` (``model(x)`` where it takes x alone,
    or where it has no signature and refuses ``(x, y)`` with a TypeError); ``_Untraced``
    where that fails."""
    try:
        return _latent_sites(model, rows if takes_y is not False else rows[:1], n)
    except Exception as err:
        if takes_y is not None or not isinstance(err, TypeError):
            raise _Untraced(takes_y is not False) from err
        try:  # no signature to read, and model(x, y) refused: a model(x), perhaps
            return _latent_sites(model, rows[:1], n)
        except Exception as second:
            raise _Untraced(True, second) from err


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


class _FirstReads(dict[str, Tensor]):
    """Pyro's param store's dict of parameters during the trace, keeping a copy of each
    parameter stored before it at its first read by name: ``pyro.param`` (a ``PyroModule``
    reads its parameters so), under ``poutine.block()`` too, and ``store[name]`` (all go
    through ``ParamStoreDict.__getitem__``): only those, not the whole store (a large
    network's guide). A tensor taken without its name (``store.named_parameters()``) is not
    seen."""

    def __init__(self, stored: dict[str, Tensor]) -> None:
        super().__init__(stored)
        self._stored = dict(stored)  # (the tensors, not copies)
        self.held: dict[str, tuple[Tensor, Tensor]] = {}

    def __getitem__(self, name: str) -> Tensor:
        param = super().__getitem__(name)
        if name not in self.held and name in self._stored and self._stored[name] is param:
            self.held[name] = (param, param.data.clone())
        return param


@contextlib.contextmanager
def _store_kept() -> Iterator[None]:
    """Pyro's param store as it was, after the block: the parameters it creates dropped (a
    scope of the store's state, whose parameters the block reads), and the values of those
    held before that it reads put back into the same tensors (a ``PyroModule`` holds them),
    should the block change one in place (``pyro.param("noise").data.mul_(2)``)."""
    store = pyro.get_param_store()
    reads = _FirstReads(dict(store.named_parameters()))
    try:
        with store.scope(store.get_state()):
            store._params = reads  # (the scope's exit sets a new dict of the old state)
            yield
    finally:
        with torch.no_grad():
            for param, value in reads.held.values():
                if param.data.shape == value.shape and param.dtype == value.dtype:
                    param.data.copy_(value)
                else:  # resized or cast in place: the old value, in the same tensor
                    param.data = value


def _latent_sites(model: Any, args: tuple[Tensor, ...], n: int) -> list[str]:
    """The unobserved sample sites of a trace of ``model(*args)``."""
    with (
        _store_kept(),
        _prepared(model, n),
        global_streams_kept(args[0].device),
        pyro.validation_enabled(False),
    ):
        return unobserved_sites(poutine.trace(model).get_trace(*args))


def _untraced(
    fn: str, model: Any, untraced: _Untraced, err: BaseException, cut: bool = False
) -> ValueError:
    """The refusal of a model that could not be traced, run as ``model(x, y)`` or ``model(x)``
    (on their first 2 rows where ``cut``), naming the error of a ``model(x)`` tried after."""
    with_y, retry = untraced.with_y, untraced.retry
    how = "model(x, y)" if with_y else "model(x)"
    rows = (
        f" The trace ran on {'x[:2], y[:2]' if with_y else 'x[:2]'} (the site names are all it "
        "reads; an error there that is not on a dtype, a device or memory is traced once "
        "more on the whole data)."
        if cut
        else ""
    )
    retried = "" if retry is None else f"; run as model(x), {_said(retry)}"
    return ValueError(
        f"{fn}: {name_of(model)} could not be traced to find its latent sites (run as {how}, "
        f"{_said(err)}{retried}), and guide is None.{rows} Fix the model if "
        f"the error is its own; its posterior is a guide's or a run's draws. {_PASS}"
    )


def _said(err: BaseException) -> str:
    lines = str(err).strip().splitlines()  # (not the trace shapes Pyro adds below)
    return f"it raised {type(err).__name__}: {lines[0] if lines else ''}"
