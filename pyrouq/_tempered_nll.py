"""The validation NLL that :func:`pyrouq.calibration.temperature_scale` minimises over T: the
NLL of the mixture of the S tempered draws, ``-mean_n log mean_s softmax(log p_sn / T)[y_n]``,
read at the ~110 temperatures of its search on one ``(S, N, C)`` float64 buffer.

Each temperature took three ``(S, N, C)`` float64 temporaries beside ``log p`` (``log p / T``,
its log-softmax, and the log-sum-exp's ``exp(x - max)``), allocated afresh each time: 6.3
times float32 probabilities of S = 64, N = 2000, C = 1000 at the peak, and 430 s for the fit.
Here the draws are tempered and log-softmaxed a few at a time (as many as make about 2**20
values, or one draw where one holds more: two temporaries of that size, ``log p / T`` and its
log-softmax, each row's values those of all draws at once) into one buffer kept for the whole
search, and the log-sum-exp over the draws runs in that buffer, with the operations of
``torch.logsumexp`` in their order: the same NLL to the bit."""

from __future__ import annotations

import math
import sys

import torch
from torch import Tensor

from pyrouq._numbers import shown

__all__ = ["TemperedNLL", "check_not_overflowing", "log_probs", "tempered_nll"]

_CHUNK = 2**20  # values tempered at once (8 MiB of float64; a draw's N * C where more)


def log_probs(probs: Tensor) -> Tensor:
    """``log p`` in float64, clamped at ``log(NLL_CLAMP)`` (-27.6), as the NLL the metrics
    report is: a probability that underflowed to 0 says only "very small", and a far smaller
    stand-in (1e-300: -690.8) let one confidently wrong input outweigh the rest of the
    validation split in the fit (and gave float32 and float64 probabilities two
    temperatures). One float64 copy of ``probs`` (the log taken in place in it)."""
    from pyrouq._metric_inputs import _float64
    from pyrouq.metrics import NLL_CLAMP

    return _float64(probs).clamp_min(NLL_CLAMP).log_()  # (clamp_min's copy: never probs)


def check_not_overflowing(temperature: float) -> None:
    """Refuse a temperature by which :func:`log_probs`'s smallest value, ``log(NLL_CLAMP)``
    (-27.6), divided overflows float64 to -inf: one below about 1.54e-307, a subnormal one
    such as 5e-324 among them (whose 1 / T is inf itself). A row all -inf once tempered made
    the probabilities NaN, and :class:`~pyrouq.Predictions` refused them as the model's
    ("check the model outputs")."""
    from pyrouq.metrics import NLL_CLAMP

    if math.isinf(math.log(NLL_CLAMP) / temperature):
        smallest = -math.log(NLL_CLAMP) / sys.float_info.max
        raise ValueError(
            f"Expected a temperature of at least {smallest:.3g}, got {shown(temperature)}: the "
            f"log-probabilities (down to log {NLL_CLAMP:g} = {math.log(NLL_CLAMP):.1f}) "
            "divided by it overflow float64 to -inf, and the tempered probabilities would "
            "be NaN. Pass a larger T: as T -> 0 every draw becomes one-hot on its top class "
            "(ties shared), which T = 1e-300 gives already."
        )


class TemperedNLL:
    """``nll(T)``: the tempered mixture's NLL on ``logp`` ``(S, N, C)`` (float64, from
    :func:`log_probs`) and labels ``y`` ``(N,)``, every call in one buffer like ``logp``."""

    def __init__(self, logp: Tensor, y: Tensor) -> None:
        self.logp, self.at = logp, y[:, None]
        self.buffer: Tensor | None = None

    def __call__(self, temperature: float) -> float:
        logp = self.logp
        if self.buffer is None:
            self.buffer = torch.empty_like(logp)
        logq = self.buffer
        # draws a few at a time (each row's values are those of all at once): two temporaries
        # (log p / T, its log-softmax) of about _CHUNK values, and no Python loop of S small
        # steps where S is large
        step = max(1, _CHUNK // max(logp[0].numel(), 1))
        for s in range(0, logp.shape[0], step):
            logq[s : s + step] = torch.log_softmax(logp[s : s + step] / temperature, dim=-1)
        # torch.logsumexp(logq, dim=0), as torch computes it, in place
        maxes = logq.amax(0, keepdim=True)
        maxes.masked_fill_(maxes.abs() == math.inf, 0)
        mixture = logq.sub_(maxes).exp_().sum(0).log_().add_(maxes[0])
        mixture = mixture - math.log(logp.shape[0])  # (N, C)
        return float(-mixture.gather(1, self.at).mean())


def tempered_nll(logp: Tensor, y: Tensor, temperature: float) -> float:
    """The tempered mixture's NLL at one temperature (see :class:`TemperedNLL`)."""
    return TemperedNLL(logp, y)(temperature)
