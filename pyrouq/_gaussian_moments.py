"""The variances of :class:`pyrouq.regression.GaussianPredictions` in the dtype of their
``loc``, kept finite where that dtype holds them, and a warning where it does not.

In float32 a scale of 1.9e19 squares to inf (above float32's largest number, 3.4e38) although
the mean of its square with three others of 1 is 9.0e37, and a variance above 3.4e38 is inf
in float32 however it is computed: the first is computed again in float64 and rounded back;
the second is warned of (its float64 value is finite: the predictions' ``double()`` has it),
not left a silent inf in an uncertainty.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from pyrouq._util import warn_caller

__all__ = ["aleatoric", "epistemic", "in_own_dtype", "stddev", "total", "warn_of_overflow"]


def aleatoric(loc: Tensor, scale: Tensor) -> Tensor:
    """``mean_s sigma_s^2`` ``(N, D)``."""
    return scale.square().mean(0)


def epistemic(loc: Tensor, scale: Tensor) -> Tensor:
    """``var_s mu_s`` ``(N, D)``, divided by S."""
    return loc.var(0, unbiased=False)


def total(loc: Tensor, scale: Tensor) -> Tensor:
    """Their sum ``(N, D)``, the mixture's variance (the law of total variance)."""
    return aleatoric(loc, scale) + epistemic(loc, scale)


def stddev(loc: Tensor, scale: Tensor) -> Tensor:
    """The mixture's standard deviation ``(N, D)``."""
    return total(loc, scale).sqrt()


def in_own_dtype(moment: Callable[[Tensor, Tensor], Tensor], loc: Tensor, scale: Tensor) -> Tensor:
    """``moment(loc, scale)`` in their dtype; where it overflowed below float64 (a square
    above the dtype's largest number, in a mean that is not), it is computed again in float64
    and rounded back: finite where the dtype holds it, inf where it does not. The values
    that came finite are kept to the bit (only then is the float64 copy made)."""
    out = moment(loc, scale)
    if loc.dtype == torch.float64 or bool(out.isfinite().all()):
        return out
    wide = moment(loc.double(), scale.double()).to(out.dtype)
    return torch.where(out.isfinite(), out, wide)


def warn_of_overflow(value: Tensor, name: str) -> None:
    """Warn where ``value`` (``(N,)`` or ``(N, D)``, of predictions whose moments are finite
    in float64 when they are float32) is inf: above its dtype's largest number."""
    if bool(value.isfinite().all()):
        return
    rows = (~value.isfinite()).reshape(value.shape[0], -1).any(-1).nonzero()[:, 0]
    shown = ", ".join(map(str, rows[:5].tolist())) + (", ..." if len(rows) > 5 else "")
    largest = torch.finfo(value.dtype).max
    where = f"at inputs [{shown}] ({len(rows)} of {value.shape[0]} inputs)"
    if value.dtype == torch.float64:
        cause, fix = "1e154", "Standardise the targets (pyrouq.Standardizer) and fit again"
    else:
        cause = f"{largest**0.5:.2g}"
        fix = (
            "Take it from the predictions' double() (e.g. preds.double().uncertainty(): "
            "float64, finite up to 1.8e308), or standardise the targets (pyrouq.Standardizer) "
            "and fit again"
        )
    warn_caller(
        f"GaussianPredictions' {name} is above {value.dtype}'s largest number "
        f"({largest:.3g}) {where}: it is inf there (scales, or spreads of the means, past "
        f"about {cause}). {fix}.",
        RuntimeWarning,
    )
