"""The network sites' priors as :class:`KLWeightedELBO`'s direct paths read them: which meet
a Normal guide in a closed-form KL, and which are one fixed Normal for the whole site."""

from __future__ import annotations

from typing import Any

from pyrouq.convert import BayesianNetwork
from pyrouq.infer._normal_kl import scalar_prior


def _priors(model: BayesianNetwork) -> list[Any]:
    """The model's network sites' priors (:class:`~pyrouq.convert.SitePrior`, whose
    parameters are buffers), in site order."""
    return list(model.site_priors)


def _normal_prior(site: str, known: Any, positive: tuple[str, ...]) -> bool:
    """Whether a Normal guide meets a Normal prior at ``site`` (a KL :func:`normal_kl` takes
    from the tensors): a Normal prior held by its parameters, at a site not drawn LogNormal."""
    return site not in positive and known.family == "Normal" and known.opaque is None


def _scalar_normal_sites(model: BayesianNetwork, positive: tuple[str, ...]) -> dict[str, Any]:
    """The network's sites whose prior is one fixed Normal for the whole site (a Normal
    guide's KL from it is :func:`normal_kl`'s three sums), with their priors."""
    return {
        site: known
        for site, known in zip(model.network_sites(), _priors(model), strict=True)
        if _normal_prior(site, known, positive) and scalar_prior(known.loc, known.scale)
    }
