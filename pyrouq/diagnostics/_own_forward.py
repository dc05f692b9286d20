"""``to_inference_data`` on a :class:`~pyrouq.BayesianNetwork` whose ``forward`` is its own (a
subclass's, or one set on the instance: :func:`~pyrouq._forwards.own_forward`; the model
compiled or not): that forward runs under each draw, as
:func:`pyrouq.predict` runs it (and Pyro's ``Predictive``), not the network alone
(``outputs()``), and the sites it samples beside the weights (a temperature) are latent sites
of the export like the weights."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from pyrouq._own_models import fitting_draws, traced_latent_sites
from pyrouq._runners import compiled_module, own_forward_outputs, runs_own_forward
from pyrouq._util import rng_state, set_rng_state
from pyrouq.diagnostics._common import _prepared
from pyrouq.likelihoods import Categorical, likelihood_of


def own_forward(model: Any) -> Any | None:
    """The module whose own ``forward`` the export runs under each draw (torch.compile's
    wrapper taken off), or None for a network run alone with each draw (``outputs()``): one
    whose ``forward`` is the built-in one, and a rank-1 network, whose draws run their members
    (as in predict())."""
    if getattr(model, "num_members", None) is not None or not runs_own_forward(model):
        return None
    return compiled_module(model)


def _classes(model: Any) -> bool:
    return isinstance(likelihood_of(model), Categorical)


def exported_sites(model: Any, x: Tensor, n: int) -> list[str]:
    """The latent sites of ``model``: :meth:`latent_sites`, then, for a model whose own forward
    runs (:func:`own_forward`), the sites that forward samples beside them (a temperature), as
    a trace of it on the first inputs of ``x`` finds them (in eval mode, with ``num_data`` ``n``,
    the random state kept)."""
    names = list(model.latent_sites())
    own = own_forward(model)
    if own is None:
        return names
    with _prepared(own, n):
        traced = traced_latent_sites(own, x, _classes(own)) or {}
    return names + [site for site in traced if site not in names]


def conditioned_sites(
    own: Any, weights: dict[str, Tensor], x: Tensor, caller: str, source: str
) -> list[str]:
    """The sites of one draw ``weights`` that the forward of ``own`` runs conditioned on: its
    latent sites, every one of them required of the draws, as predict() requires them
    (:func:`~pyrouq._own_models.fitting_draws`: a site missing or of another shape refused)."""
    drawn = {name: value[None] for name, value in weights.items()}
    return list(fitting_draws(own, drawn, x, caller, source, _classes(own)))


def forward_outputs(own: Any, x: Tensor, weights: dict[str, Tensor], warn: bool) -> Tensor:
    """The outputs of ``own``'s forward run on ``x`` under the draw ``weights``
    (:func:`~pyrouq._runners.own_forward_outputs`), the random state kept: what it samples
    without targets (``"obs"``) does not move the export's next draws."""
    state = rng_state(x.device)
    try:
        return own_forward_outputs(own, x, weights, warn)
    finally:
        set_rng_state(x.device, state)
