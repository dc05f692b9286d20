"""What fit()'s error for a non-finite loss advises (private): the usual causes (a step too
long, NaN or inf in the data, a guide's scales too wide), or, where the likelihood's term and
the KL are finite and the loss is not, the KL term that ``kl_weight`` made too large, or their
sum, past the loss dtype's range."""

from __future__ import annotations

import math

import torch

#: The advice for a non-finite loss whose cause the loss's terms do not show.
USUAL_FIX = "Lower lr, check the inputs and targets for NaN/inf, or use a smaller init_scale."


def loss_fix(loss: float, nll: float, kl: float, kl_weight: float, dtype: torch.dtype) -> str:
    """The advice for a step stopped on its ``loss``, ``nll + kl_weight * kl`` computed in
    ``dtype``, of finite or non-finite terms ``nll`` and ``kl`` (the unweighted KL): where the
    loss is not finite, the KL term's own where both terms are finite and it is the larger
    one, or ``kl_weight`` does not fit in ``dtype`` (a KL of 0 times an infinite weight is
    NaN); the dtype's range where the NLL is the larger and only their sum overflows;
    otherwise :data:`USUAL_FIX` (a finite loss, of gradients that overflowed, too: no term
    overflowed it). An init_scale further below the prior's scale makes that KL larger,
    and lr has not acted on a first step's."""
    if math.isfinite(loss) or not (math.isfinite(nll) and math.isfinite(kl)) or not kl_weight:
        return USUAL_FIX
    largest = torch.finfo(dtype).max
    term = kl_weight * kl
    if kl_weight <= largest and abs(term) < abs(nll):  # (the likelihood's term the larger)
        return USUAL_FIX if abs(nll + term) <= largest else _sum_fix(nll, term, dtype)
    return (
        f"The KL term overflowed it: kl_weight * KL = {kl_weight:g} * {kl:.6g} = {term:.3g}, "
        f"beside an NLL of {nll:.6g}, in {str(dtype).removeprefix('torch.')} (largest "
        f"{largest:.3g}). Pass a smaller kl_weight (1 is the exact ELBO; kl_weight = k * N "
        "for a loss of mean NLL + k * KL per example); an init_scale further below the "
        "prior's scale would make the KL larger."
    )


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
