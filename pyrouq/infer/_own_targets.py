"""The likelihood fit() assumes for a Pyro model of the user's own that has real-valued
targets (:class:`OwnTargets`), and the discrete support of its ``"obs"`` site that those
targets must keep."""

from __future__ import annotations

from typing import Any

import torch
from pyro.distributions import MaskedDistribution
from torch.distributions import constraints

from pyrouq._distribution_parts import innermost_distribution, is_discrete


class OwnTargets:
    """The likelihood fit() assumes for a Pyro model of the user's own that has real-valued
    targets (a regression written in Pyro, as in Pyro's Bayesian-regression tutorial): the
    targets are the model's to judge (fit() trains with Pyro's validation off; the model may
    mask missing ones itself: a NaN it lets through shows as a non-finite loss), and there is
    no training accuracy to count. But where the model observes them as given (``obs=y``)
    from a discrete distribution of fixed support (float labels of a ``Categorical``, 0./1. of
    a ``Bernoulli``), targets outside it are refused, as Pyro's validation refuses them (with
    it off, ``Categorical`` reads 0.5 as class 0); not where the model opts out itself
    (``validate_args=False``: soft labels), masks the site, or bounds it per example."""

    def __init__(self, fn: Any = None, where: str = ""):
        self.support = _fixed_discrete_support(fn)
        family = type(innermost_distribution(fn)).__name__
        self.where = f"{where} ({family}: {_described(self.support)})" if fn is not None else ""
        self.reading = ", and a Categorical reads 0.5 as class 0" if family == "Categorical" else ""

    def target_problem(self, y: torch.Tensor, num_outputs: int | None) -> str | None:
        if self.support is None or not y.dtype.is_floating_point:
            return None
        try:
            inside = self.support.check(y)
            outside = y[~inside.expand(y.shape)]
        except (RuntimeError, TypeError, ValueError):  # no elementwise check: none made
            return None
        if not outside.numel():
            return None
        return (
            f"{outside.numel()} target(s) outside the support of {self.where}, e.g. "
            f"{outside[:3].tolist()}: Pyro's validation refuses them (fit() trains with it off"
            f"{self.reading}); give targets in that support, or build the distribution with "
            "validate_args=False to have them taken as they are"
        )


def _fixed_discrete_support(fn: Any) -> Any:
    """``fn``'s support where it is discrete, checked value by value (not a ``Multinomial``'s
    count vectors) and the same for every batch (no bound of one value per example, as a
    ``Binomial``'s ``total_count`` may be); else None."""
    if not is_discrete(fn) or fn.support.event_dim != 0:  # (no support: not discrete)
        return None
    support = fn.support
    bounds = vars(support).values() if hasattr(support, "__dict__") else ()
    if any(torch.is_tensor(b) and b.dim() > 0 for b in bounds):
        return None
    while fn is not None:  # a mask, or validation turned off by the model itself: no check
        if isinstance(fn, MaskedDistribution) or vars(fn).get("_validate_args") is False:
            return None
        fn = getattr(fn, "base_dist", None)
    return support


def _described(support: Any) -> str:
    low, high = getattr(support, "lower_bound", None), getattr(support, "upper_bound", None)
    if low is not None and high is not None:
        return f"integers in [{float(low):g}, {float(high):g}]"
    if low is not None:
        return f"integers >= {float(low):g}"
    return "0 or 1" if support is constraints.boolean else str(support)
