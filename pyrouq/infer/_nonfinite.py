"""What fit()'s error for a non-finite loss advises (private): the usual causes (a step too
long, NaN or inf in the data, a guide's scales too wide), or, where the likelihood's term and
the KL are finite and the loss is not, the KL term that ``kl_weight`` made too large, or their
sum, past the loss dtype's range."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

#: The advice for a non-finite loss whose cause the loss's terms do not show.
USUAL_FIX = "Lower lr, check the inputs and targets for NaN/inf, or use a smaller init_scale."


@dataclass(frozen=True)
class KLOverflow:
    """The figures of a loss that ``kl_weight * kl`` overflowed in ``dtype``, beside ``nll``."""

    kl_weight: float
    kl: float
    nll: float
    dtype: torch.dtype

    @property
    def figures(self) -> str:
        """``1e+38 * 505.8 = 5.06e+40, beside an NLL of 25.9, in float32 (largest 3.4e+38)``:
        the weight, the KL, their product, the NLL and the dtype, as fit()'s error words them
        (and the command, which names ``--kl-weight``)."""
        term, largest = self.kl_weight * self.kl, torch.finfo(self.dtype).max
        return (
            f"{self.kl_weight:g} * {self.kl:.6g} = {term:.3g}, beside an NLL of {self.nll:.6g}, "
            f"in {str(self.dtype).removeprefix('torch.')} (largest {largest:.3g})"
        )


class KLOverflowError(FloatingPointError):
    """fit()'s error for a loss that the KL term, times ``kl_weight``, overflowed: a
    ``FloatingPointError`` (as every non-finite loss's) whose :attr:`overflow` holds the
    figures its message gives."""

    def __init__(self, message: str, overflow: KLOverflow) -> None:
        super().__init__(message)
        self.overflow = overflow

    def __reduce__(self) -> tuple[type[KLOverflowError], tuple[str, KLOverflow], dict[str, Any]]:
        # (pickled: a worker's, a rank's) with its __dict__, as BaseException's own: its notes
        return type(self), (str(self), self.overflow), self.__dict__


def _finite_terms_overflowed(loss: float, nll: float, kl: float, kl_weight: float) -> bool:
    """Whether ``loss`` is not finite though ``nll`` and ``kl`` are, and the KL counts
    (``kl_weight`` not 0): one term weighted, or the sum, overflowed it."""
    finite_terms = math.isfinite(nll) and math.isfinite(kl)
    return not math.isfinite(loss) and finite_terms and bool(kl_weight)


def kl_overflow(
    loss: float, nll: float, kl: float, kl_weight: float, dtype: torch.dtype
) -> KLOverflow | None:
    """The figures where :func:`loss_fix` names the KL term as the cause, else None."""
    if not _finite_terms_overflowed(loss, nll, kl, kl_weight):
        return None
    if kl_weight <= torch.finfo(dtype).max and abs(kl_weight * kl) < abs(nll):
        return None  # (the likelihood's term is the larger: not the KL's doing)
    return KLOverflow(kl_weight, kl, nll, dtype)


def loss_fix(loss: float, nll: float, kl: float, kl_weight: float, dtype: torch.dtype) -> str:
    """The advice for a step stopped on its ``loss``, ``nll + kl_weight * kl`` computed in
    ``dtype``, of finite or non-finite terms ``nll`` and ``kl`` (the unweighted KL): where the
    loss is not finite, the KL term's own where both terms are finite and it is the larger
    one, or ``kl_weight`` does not fit in ``dtype`` (a KL of 0 times an infinite weight is
    NaN); the dtype's range where the NLL is the larger and only their sum overflows;
    otherwise :data:`USUAL_FIX` (a finite loss, of gradients that overflowed, too: no term
    overflowed it). An init_scale further below the prior's scale makes that KL larger,
    and lr has not acted on a first step's."""
    if (overflow := kl_overflow(loss, nll, kl, kl_weight, dtype)) is not None:
        return (
            f"The KL term overflowed it: kl_weight * KL = {overflow.figures}. Pass a smaller "
            "kl_weight (1 is the exact ELBO; kl_weight = k * N for a loss of mean NLL + k * KL "
            "per example); an init_scale further below the prior's scale would make the KL "
            "larger."
        )
    if not _finite_terms_overflowed(loss, nll, kl, kl_weight):
        return USUAL_FIX
    term = kl_weight * kl  # the smaller term: the likelihood's the larger
    return USUAL_FIX if abs(nll + term) <= torch.finfo(dtype).max else _sum_fix(nll, term, dtype)


def _sum_fix(nll: float, term: float, dtype: torch.dtype) -> str:
    """The advice where the NLL and the (smaller) KL term are each finite in ``dtype`` and
    their sum is not: neither lr nor the data is the cause, the dtype's range is."""
    name, largest = str(dtype).removeprefix("torch."), torch.finfo(dtype).max
    wider = (
        "bfloat16 (net.bfloat16(): the same memory, float32's range) or in float32"
        if dtype == torch.float16
        else "float64 (net.double())"
    )
    return (
        f"The sum overflowed it: NLL + kl_weight * KL = {nll:.6g} + {term:.6g} = "
        f"{nll + term:.3g}, past {name}'s largest {largest:.3g}, though each term is finite. "
        "The NLL sums a batch's log-likelihood scaled to the N training points (N/B times it), "
        f"so it grows with N; a lower lr does not help. Train in {wider}."
    )
