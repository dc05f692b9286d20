"""The rank-1 factors of a BatchEnsemble made Bayesian (:func:`pyrouq.bayesian` of a
BatchEnsemble, :func:`pyrouq.rank1`): the sites ``select`` picks among them
(:func:`factor_names`), the priors that would pull them to 0 (:func:`warn_factor_priors`; a
caller with words of its own for a float's, :func:`float_prior_words`), and the refusal of
local reparameterisation for them (:data:`NO_LOCAL_RANK1`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar

import torch
from torch import nn

from pyrouq._numbers import is_real
from pyrouq._util import warn_caller
from pyrouq.convert._hints import names_list
from pyrouq.convert._select import PriorSpec, SelectSpec, SitePrior, _owner
from pyrouq.nn import BatchEnsembleLinear

__all__ = ["NO_LOCAL_RANK1", "factor_names", "float_prior_words", "warn_factor_priors"]

NO_LOCAL_RANK1 = (
    "local_reparameterization applies to nn.Linear / convolution layers with latent weights; "
    "a BatchEnsemble's layers draw their rank-1 factors instead. Leave "
    "local_reparameterization=False."
)
"""The refusal of local reparameterisation on a rank-1 network (its constructor, its setter)."""


def factor_names(net: nn.Module, select: SelectSpec) -> SelectSpec:
    """What ``select`` means for a BatchEnsemble's ``net``: None, the rank-1 factors ``r`` and
    ``s`` of every BatchEnsemble layer; "last_layer", those of its last ``BatchEnsembleLinear``
    (in ``named_modules()`` order, as for a plain network); anything else, itself."""
    if select is not None and not (isinstance(select, str) and select == "last_layer"):
        return select
    layers = [
        path
        for path, layer in net.named_modules()
        if getattr(layer, "_is_batchensemble", False)
        and (select is None or isinstance(layer, BatchEnsembleLinear))
    ]
    if not layers:
        convs = [path for path, m in net.named_modules() if getattr(m, "_is_batchensemble", 0)]
        last = (
            f", e.g. its last convolution's: {[f'{convs[-1]}.r', f'{convs[-1]}.s']}"
            if convs
            else ""
        )
        raise ValueError(
            "select='last_layer' needs a BatchEnsembleLinear (a converted nn.Linear), and this "
            f"BatchEnsemble has none. Pass select= the names of the factors to make Bayesian{last}."
        )
    if select is not None:
        layers = layers[-1:]
    return [f"{path}.{factor}" if path else factor for path in layers for factor in ("r", "s")]


# The words of the warning of a float prior on the factors, given the float (None: bayesian()'s)
_FLOAT_PRIOR_WORDS: ContextVar[Callable[[float], str] | None] = ContextVar(
    "pyrouq_float_prior_words", default=None
)


@contextlib.contextmanager
def float_prior_words(words: Callable[[float], str]) -> Iterator[None]:
    """While it runs, bayesian()'s warning of a float prior on a BatchEnsemble's factors says
    ``words(prior)`` (e.g. ``pyrouq fit``'s, whose user cannot follow advice in Python): the
    same warning, of the same category and place, in a caller's words."""
    token = _FLOAT_PRIOR_WORDS.set(words)
    try:
        yield
    finally:
        _FLOAT_PRIOR_WORDS.reset(token)


def _is_function(prior: object) -> bool:
    return callable(prior) and not isinstance(prior, torch.distributions.Distribution)


def _is_factor(net: nn.Module, site: str) -> bool:
    """Whether ``site`` is a rank-1 factor (``r``, ``s``) of a BatchEnsemble layer of ``net``."""
    return site.rpartition(".")[2] in ("r", "s") and bool(
        getattr(net.get_submodule(_owner(site)), "_is_batchensemble", False)
    )


def _warn_zero_mean_factors(net: nn.Module, priors: Mapping[str, SitePrior]) -> None:
    """Warn when a dict or callable prior gives rank-1 factors (``r``, ``s`` of a
    BatchEnsemble layer) a prior centred on 0, as a dict does any factor its keys miss."""
    zero = [
        site
        for site, prior in priors.items()
        if _is_factor(net, site)
        and prior.family in ("Normal", "Laplace", "StudentT", "Cauchy")  # loc: the centre
        and not bool(prior.get_buffer("loc").any())
    ]
    if zero:
        warn_caller(
            f"The prior=... for a BatchEnsemble gives the rank-1 factors {names_list(zero)} "
            "a prior centred on 0 (a dict gives the sites none of its keys matches Normal(0, 1)). "
            "The factors start near 1 and scale the shared weights: that prior pulls them to "
            "0. rank1() uses Normal(1, 0.1): give them e.g. dist.Normal(1.0, 0.1), through a "
            "dict key for each of their layers or one distribution for all."
        )


def warn_factor_priors(
    net: nn.Module, sites: Iterable[str], prior: PriorSpec, priors: Mapping[str, SitePrior]
) -> None:
    """Warn when ``prior``, as given to ``bayesian()`` or ``BayesianNetwork`` of a
    BatchEnsemble whose network is ``net`` (``sites``: its latent sites, ``priors``: theirs),
    pulls rank-1 factors to 0: a float puts ``Normal(0, s)`` on them, a dict or callable may
    centre them on 0 (one distribution: the user's choice, or the placeholder
    ``pyrouq.load()`` replaces). Its words name neither route (the user took one of two)."""
    if is_real(prior) and any(_is_factor(net, s) for s in sites):  # (not the weights, norms)
        words = _FLOAT_PRIOR_WORDS.get()  # (a caller's own: float_prior_words())
        if words is not None:  # the command's line that called bayesian() (tests pin it)
            warnings.warn(words(prior), stacklevel=4)
        else:
            warn_caller(  # the user's line, by bayesian() or BayesianNetwork(...) alike
                f"A float prior={prior!r} for a BatchEnsemble puts a Normal(0, {prior!r}) "
                "prior on the rank-1 factors, which start near 1 and scale the shared "
                "weights: that prior pulls them to 0. rank1() uses Normal(1, 0.1): pass "
                "prior=dist.Normal(1.0, 0.1), or build it with pyrouq.rank1(net, M)."
            )
    if isinstance(prior, Mapping) or _is_function(prior):
        _warn_zero_mean_factors(net, priors)  # (a float has warned)
