"""Do draws belong to a model? The checks of weight draws (a guide's, ``posterior_samples``)
against a pyrouq model's latent sites, shared by the guide's own check (:mod:`.guide`), the
predictions and the diagnostics."""

from __future__ import annotations

from typing import Any

import pyro
import torch
from torch import nn

from pyrouq._param_store import store_or_usual_fix
from pyrouq._util import has_latent_sites, takes_labels
from pyrouq._wrappers import unwrapped
from pyrouq.likelihoods import likelihood_of

__all__ = ["check_drawable", "check_draws", "model_sites", "refuse", "site_mismatch"]


def check_draws(
    model: Any,
    draws: dict[str, torch.Tensor],
    caller: str,
    source: str = "the guide",
    guide: Any = None,
) -> None:
    """Refuse S draws ``{site: (S, *shape)}`` that miss a latent site of a pyrouq model or
    give it another shape; ``source`` names where they came from in the message, ``guide``
    (where they came from one) tells why (:func:`refuse`)."""
    expected = model_sites(model)
    if expected is None:
        return
    got = {site: tuple(value.shape[1:]) for site, value in draws.items()}
    problem = site_mismatch(expected, got, strict=False, source=source)
    refuse(model, problem, caller, source, guide, got)
    likelihood = likelihood_of(model)
    for site in getattr(likelihood, "latent_sites", dict)():  # a noise scale: positive
        if site in draws and not bool((draws[site] > 0).all()):
            raise ValueError(
                f"{caller}: the draws of {site!r} from {source} must be > 0 (a noise standard "
                f"deviation), got a minimum of {draws[site].min().item():g}. Pass the draws "
                "of the scale itself, not of its logarithm."
            )


def site_mismatch(
    expected: dict[str, tuple[int, ...]],
    got: dict[str, tuple[int, ...]],
    strict: bool,
    source: str = "the guide",
) -> str | None:
    """The first difference between two ``{site: shape}`` maps (extra sites in ``got`` count
    only when ``strict``), or None; ``source`` is what ``got`` describes."""
    for site, shape in expected.items():
        if site not in got:
            return f"the model's site {site!r} {shape} is not in {source}"
        if got[site] != shape:
            return f"site {site!r} has shape {got[site]} in {source} but {shape} in the model"
    extra = [site for site in got if site not in expected]
    if strict and extra:
        return f"{source}'s site {extra[0]!r} is not a latent site of the model"
    return None


def check_drawable(model: Any, source: str, caller: str) -> None:
    """Refuse weight draws (``source``: a guide, posterior_samples) for a model that has none
    to take: a BatchEnsemble (its members are the draws) or a plain torch network, told by a
    forward that takes no labels (``forward(x)``): an ``nn.Module`` whose ``forward(x, y)``
    calls ``pyro.sample`` is a Pyro model."""
    from pyrouq.convert import BatchEnsembleNetwork

    model = unwrapped(model)  # (fit()'s torch.compile wrapper is kept: no BatchEnsembleNetwork)
    if has_latent_sites(model):
        return
    what = None
    if isinstance(model, BatchEnsembleNetwork) or (
        caller == "predict()" and getattr(model, "num_members", None) is not None
    ):
        what = f"a BatchEnsemble ({type(model).__name__}), whose members are the draws"
    elif (
        isinstance(model, nn.Module)
        and not isinstance(model, pyro.nn.PyroModule)
        and not takes_labels(model)
    ):
        what = f"a plain network ({type(model).__name__}), which has no weights to draw"
    if what is not None:
        leave = "guide=None, no posterior_samples" if caller == "predict()" else "guide=None"
        raise ValueError(
            f"{caller} got {source} for {what}. Leave it out ({leave}); to draw weights, make "
            "the network Bayesian first: pyrouq.bayesian(net), or pyrouq.rank1(net, M) for an "
            "ensemble."
        )


def model_sites(model: Any) -> dict[str, tuple[int, ...]] | None:
    latent = getattr(model, "latent_sites", None)
    if not callable(latent):
        return None
    return {site: tuple(shape) for site, shape in latent().items()}


#: How :func:`refuse` words a mismatch, by where the draws came from: (lead, fix).
_REFUSALS = {
    "the guide": (
        "the guide does not belong to",
        "Pass the guide built for this model (mean_field_guide(model)) and fitted with it.",
    ),
    "posterior_samples": (
        "posterior_samples do not fit",
        "Pass {site: (S, *shape)} with the model's site shapes, or an MCMCResult itself (its "
        ".samples are (chain, draw, *shape)).",
    ),
    "result.samples": (  # an MCMCResult's draws, exported with result.model
        "result.samples do not fit",
        "Set result.model to the model the chains ran on (after pyrouq.load, one built as "
        "that model was), or export the result of mcmc() on this model.",
    ),
}


def refuse(
    model: Any,
    problem: str | None,
    caller: str,
    source: str = "the guide",
    guide: Any = None,
    drawn: dict[str, tuple[int, ...]] | None = None,
) -> None:
    """Raise the house ValueError for ``problem`` (None: nothing to refuse). A Pyro autoguide
    built for this very model whose draws (``drawn``, one draw's shapes) do not fit it, nor
    the shapes it was built with, took, when it first ran, the values Pyro's param store held
    under its parameters' names: passing "the guide built for this model" is then no fix,
    clearing the store is (:func:`~pyrouq._param_store.store_or_usual_fix`)."""
    if problem is None:
        return
    lead, fix = _REFUSALS[source]
    fix = store_or_usual_fix(fix, model, source, guide, drawn)
    raise ValueError(f"{caller}: {lead} {type(model).__name__}: {problem}. {fix}")
