"""What pyrouq reads off a distribution: the kind of its support (:func:`support_of`), its
family inside its wrappers (:func:`innermost_distribution`) and the masks along its chain of
base distributions (:func:`distribution_masks`)."""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = [
    "distribution_masks",
    "innermost_distribution",
    "is_discrete",
    "refuse_undecided_support",
    "support_of",
    "support_undecided",
]


def _bound_is(bound: Any, value: float) -> bool:
    """Whether a support's bound (a float, a tensor, or None) is ``value`` everywhere."""
    if bound is None:
        return False
    if torch.is_tensor(bound):
        return bool((bound == value).all())
    return isinstance(bound, (int, float)) and float(bound) == value


def support_of(prior: Any) -> str | None:
    """``"real"`` for a prior on the real line, ``"positive"`` for one on (0, inf) (what a
    mean-field guide fits by a Normal and by a LogNormal), ``"nonnegative"`` for any other
    support within [0, inf) (a Uniform(0.1, 2), a Beta), None for the rest, discrete supports
    too (a Poisson's integers from 0 on are no interval, however bounded)."""
    support = prior.support
    wrappers = (
        torch.distributions.constraints.independent,
        getattr(torch.distributions.constraints, "MixtureSameFamilyConstraint", ()),
    )  # a scale-mixture prior's support is its components'
    while isinstance(support, wrappers):
        support = support.base_constraint
    if _discrete(support):
        return None
    if type(support) is type(torch.distributions.constraints.real):
        return "real"
    lower = getattr(support, "lower_bound", None)
    if _bound_is(lower, 0.0) and _bound_is(getattr(support, "upper_bound", math.inf), math.inf):
        return "positive"
    if lower is not None and bool(torch.as_tensor(lower).ge(0).all()):
        return "nonnegative"
    return None


def is_discrete(fn: Any) -> bool:
    """Whether a distribution's support is discrete (one without rsample may be continuous:
    torch's VonMises; one of one's own that declares no support, or torch's ``dependent``
    placeholder, whose ``is_discrete`` torch cannot tell, counts as continuous)."""
    try:
        return _discrete(fn.support)
    except (AttributeError, NotImplementedError):  # (Distribution.support: NotImplementedError)
        return False


def support_undecided(fn: Any) -> bool:
    """Whether ``fn`` declares torch's ``dependent`` placeholder as its support: torch can tell
    neither whether it is discrete nor its bounds (no ``biject_to`` maps it for NUTS)."""
    try:
        bool(getattr(fn.support, "is_discrete", False))
    except NotImplementedError:
        return True
    except AttributeError:
        return False
    return False


def refuse_undecided_support(caller: str, site: str, prior: Any, why: str) -> None:
    """Refuse a ``prior`` of :func:`support_undecided` in ``caller``'s words (``why``: what it
    would need the support for)."""
    if support_undecided(prior):
        raise ValueError(
            f"{caller}: the prior of site {site!r} ({type(prior).__name__}) declares torch's "
            f"constraints.dependent placeholder as its support, whose bounds torch cannot tell; "
            f"{why}. Declare the support its values lie in, in its class (support = "
            "constraints.real, constraints.positive, ...), or give the site one of torch's "
            "priors, pyrouq.bayesian(net, prior=...) (Normal, Laplace, StudentT)."
        )


def _discrete(support: Any) -> bool:
    """``support.is_discrete``, False where torch cannot tell (``constraints.dependent``
    raises NotImplementedError) or the constraint has no such attribute."""
    try:
        return bool(getattr(support, "is_discrete", False))
    except NotImplementedError:
        return False


def innermost_distribution(fn: Any) -> Any:
    """The distribution inside ``fn``'s ``Independent`` / ``ExpandedDistribution`` /
    ``MaskedDistribution`` wrappers (its family)."""
    import pyro.distributions as dist

    while isinstance(
        fn, (torch.distributions.Independent, dist.ExpandedDistribution, dist.MaskedDistribution)
    ):
        fn = fn.base_dist
    return fn


def distribution_masks(fn: Any) -> list[Any]:
    """The masks of the ``.mask(...)`` wrappers (``MaskedDistribution``) anywhere in ``fn``'s
    chain of base distributions (inside ``Independent``, ``TransformedDistribution``, ...)."""
    import pyro.distributions as dist

    found = []
    while isinstance(fn, torch.distributions.Distribution):
        if isinstance(fn, dist.MaskedDistribution):
            found.append(fn._mask)
        fn = getattr(fn, "base_dist", None)
    return found
