"""The warnings of a BatchEnsemble conversion (:func:`pyrouq.batchensemble`, and
:func:`pyrouq.rank1`, which builds its BatchEnsemble first): a bias whose tie to a kept
parameter breaks, ``nn.Bilinear`` layers the members share, and layers whose parametrization
the BatchEnsemble layers drop; and the name of the function
that converts (:data:`CALLER`), which they and the other conversion warnings begin with, and
what it makes (:func:`made`), which its refusals name."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from torch import nn

from pyrouq._util import warn_caller
from pyrouq.convert._select import _names_list

#: The function that converts, as the conversion's warnings name it: ``"batchensemble()"``,
#: or ``"rank1()"`` while :func:`pyrouq.rank1` builds its BatchEnsemble (:func:`converting_as`).
CALLER: ContextVar[str] = ContextVar("pyrouq_converting_as", default="batchensemble()")


@contextlib.contextmanager
def converting_as(name: str) -> Iterator[None]:
    """While it runs, the conversion's warnings name ``name`` (e.g. ``"rank1()"``)."""
    token = CALLER.set(name)
    try:
        yield
    finally:
        CALLER.reset(token)


def made() -> str:
    """What the conversion makes, as its refusals name it: ``"a BatchEnsemble"``, or ``"a
    rank-1 network"`` while :func:`pyrouq.rank1` builds its BatchEnsemble."""
    return "a rank-1 network" if CALLER.get() == "rank1()" else "a BatchEnsemble"


def made_layers() -> str:
    """The layers the conversion makes, as its refusals name them: ``"BatchEnsemble
    layers"``, or ``"rank-1 layers"`` while :func:`pyrouq.rank1` builds its BatchEnsemble."""
    return "rank-1 layers" if CALLER.get() == "rank1()" else "BatchEnsemble layers"


class _TiedBiasKeptWarning(UserWarning):
    """The warning :func:`warn_kept_tied` gives; ``load()``, rebuilding a saved ensemble,
    silences it."""


def warn_kept_tied(net: nn.Module, originals: list[nn.Parameter]) -> None:
    """Warn of the parameters of the converted ``net`` that are tied to the bias of a layer the
    conversion replaced (``originals``: the biases the replaced layers held): their tie to it
    breaks, the layer's per-member biases replacing it in the layer only."""
    tied = {id(bias) for bias in originals}
    kept_tied = [n for n, p in net.named_parameters(remove_duplicate=False) if id(p) in tied]
    if kept_tied:  # a bias tied to a parameter left as it is: the tie cannot hold
        warn_caller(
            f"{CALLER.get()}: {_names_list(kept_tied, 4)}, tied to the bias of a converted "
            "layer, stays as it is (not the bias of a layer converted): the layer's "
            "per-member biases (M, out) replace the bias in the layer only, so the two are "
            "no longer one tensor and train apart. A bias tied between converted layers stays "
            "tied; to keep this tie, tie the bias only to converted layers' biases, or use "
            "pyrouq.bayesian(net), which keeps every tie.",
            _TiedBiasKeptWarning,
        )


class _BilinearSharedWarning(UserWarning):
    """:func:`warn_bilinear`'s: ``load()`` rebuilding a saved ensemble does not repeat it."""


def warn_bilinear(net: nn.Module, num_members: int) -> None:
    """Warn of the ``nn.Bilinear`` layers of a converted network, which have no BatchEnsemble
    version: each stays one layer that every member shares (with ``select=None`` and
    ``"last_layer"``, :func:`pyrouq.bayesian` of the plain network takes them)."""
    kept = [name for name, m in net.named_modules() if isinstance(m, nn.Bilinear)]
    if kept:
        warn_caller(
            f"The nn.Bilinear layer(s) {_names_list(kept, 4)} of the network, which have no "
            "BatchEnsemble version, stay one layer each, one set of weights that all "
            f"{num_members} members share: no factors of their own (in rank1(), none latent; in "
            "batchensemble(), bayesian(ensemble, select='last_layer') picks the last converted "
            "layer's, not theirs). To give each member its own, compute it as an "
            "nn.Linear(in1 * in2, out) of "
            "the flattened outer product, torch.einsum('bi,bj->bij', x1, x2).flatten(1), which "
            "is converted; or keep it shared.",
            _BilinearSharedWarning,
        )


class _ParametrizationDroppedWarning(UserWarning):
    """:func:`warn_parametrized`'s: ``load()`` rebuilding a saved ensemble, whose W it then
    loads, does not repeat it."""


def warn_parametrized(count: int, reset: bool) -> None:
    """Warn that ``count`` converted layers carried a parametrization (weight_norm,
    spectral_norm), which their BatchEnsemble layers drop: W starts from the layer's computed
    weight (or a re-initialised one: ``reset``) and trains directly."""
    warn_caller(
        f"{CALLER.get()}: {count} of the converted layers carried a "
        "parametrization (e.g. weight_norm, spectral_norm); their BatchEnsemble layers "
        f"start from {'a re-initialised' if reset else 'its current'} weight and train W "
        "directly, without it.",
        _ParametrizationDroppedWarning,
    )
