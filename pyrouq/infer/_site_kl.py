"""The KL term of one latent site of a traced model and guide (a user's own Pyro model, or
any guide but pyrouq's mean-field one), as :class:`pyrouq.KLWeightedELBO` adds it up."""

from __future__ import annotations

from typing import Any

import pyro.distributions as dist
import torch
from pyro.distributions.util import scale_and_mask
from torch import Tensor

from pyrouq._util import distribution_masks, innermost_distribution


def site_kl(site: dict[str, Any], guide_site: dict[str, Any]) -> Tensor:
    """A latent site's ``KL(q || p)`` term, weighed as Pyro's ``Trace_ELBO`` weighs ``log q``
    and ``log p``: analytic where torch knows the pair and the model and guide weigh the site
    alike, else the single-draw estimate ``log q(w) - log p(w)``, each side with its own site's
    scale and mask (a model's ``poutine.scale`` or ``mask`` on the prior). An autoguide's
    ``Delta`` site (a constrained site's value, its log-Jacobian as its density) is always
    estimated: the analytic form registered for ``Delta`` leaves that density out; so are two
    distributions masked unlike each other with ``.mask(...)`` (the form registered for them
    keeps the entries both masks keep; masked alike, it is exact)."""
    q, p = guide_site["fn"], site["fn"]
    alike = _same_weight(site["scale"], guide_site["scale"]) and _same_mask(
        site["mask"], guide_site["mask"]
    )
    if alike and not isinstance(innermost_distribution(q), dist.Delta) and _same_masks(q, p):
        try:
            kl_site = torch.distributions.kl_divergence(q, p)
        except NotImplementedError:
            pass
        else:
            kl_site = torch.as_tensor(kl_site)
            return scale_and_mask(kl_site, guide_site["scale"], guide_site["mask"]).sum()
    value = guide_site["value"]
    log_q = scale_and_mask(q.log_prob(value), guide_site["scale"], guide_site["mask"]).sum()
    return log_q - scale_and_mask(p.log_prob(value), site["scale"], site["mask"]).sum()


def _same_masks(q: Any, p: Any) -> bool:
    """Whether ``q`` and ``p`` are masked alike (or not at all): torch's KL of two masked
    distributions keeps the entries both masks keep, right only when the masks are equal."""
    mine, theirs = distribution_masks(q), distribution_masks(p)
    return len(mine) == len(theirs) and all(
        _same_weight(a, b) for a, b in zip(mine, theirs, strict=True)
    )


def _same_weight(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    return bool(a == b)


def _same_mask(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return _same_weight(a, b)


def check_reparameterised(name: str, site: dict[str, Any]) -> None:
    """Refuse a guide site drawn without a reparameterised sampler (a discrete site, or
    ``VonMises``, ``LKJCholesky``...): the KLWeightedELBO's gradients reach the guide through
    its draws only (no score-function term), so such a site's parameters would never learn."""
    fn = site["fn"]
    if getattr(fn, "has_rsample", True):
        return
    what = type(innermost_distribution(fn)).__name__
    try:
        discrete = bool(fn.support.is_discrete)
    except (AttributeError, NotImplementedError):  # a distribution of one's own, no support
        discrete = False
    if discrete:
        kind = "a discrete site"
        fix = (
            "Sum the site out of the model (enumeration: pyro.infer.TraceEnum_ELBO with "
            "pyro.infer.SVI) or train with pyro.infer.SVI and Trace_ELBO."
        )
    else:
        kind = f"torch has no rsample for {what}"
        fix = (
            "Draw it from a reparameterisable distribution in the guide, or train with "
            "pyro.infer.SVI and Trace_ELBO."
        )
    raise ValueError(
        f"The guide draws its site {name!r} from {what}, which has no reparameterised sampler "
        f"({kind}): KLWeightedELBO and fit() take gradients through the guide's draws only, "
        f"with no score-function term, so its parameters would not learn. {fix}"
    )
