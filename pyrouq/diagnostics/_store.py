"""The arrays of a ``to_inference_data`` export: predictions and pointwise log-likelihoods
filled draw by draw, and the ``obs`` drawn from them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from pyrouq._mixture_terms import mixture_mean
from pyrouq.diagnostics._common import _check_labels, _numpy
from pyrouq.likelihoods import Categorical, Likelihood


class _Draws:
    """``(S, ...)`` CPU tensors, filled one draw at a time."""

    def __init__(self, num_draws: int):
        self.num_draws = num_draws
        self.values: dict[str, Tensor] = {}

    def alloc(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        self.values[name] = torch.empty((self.num_draws, *shape), dtype=dtype)
        return self.values[name]

    def put(self, name: str, s: int, value: Tensor) -> None:
        """Store draw ``s`` of ``name`` (allocated on its first value)."""
        if name not in self.values:
            self.alloc(name, tuple(value.shape), value.dtype)
        self.values[name][s] = value.detach().cpu()

    def numpy(self, name: str, chains: int = 1) -> np.ndarray:
        """``(chain, draw, ...)``: the S draws split into ``chains`` chains (one by default)."""
        value = _numpy(self.values[name])  # (a bfloat16 model's draws as float32)
        return value.reshape(chains, value.shape[0] // chains, *value.shape[1:])


def _stored_dtype(value: Tensor) -> torch.dtype:
    """float64 for a float64 model's predictions, float32 for any other (half included)."""
    return torch.promote_types(value.dtype, torch.float32)


_LATENT = "posterior/"
"""The prefix of the latent sites' draws in :class:`_Draws`: a Pyro model's site "scale" (or
"probs", "log_lik") is not the predictions' of that name."""

_MEMBER_LOC, _MEMBER_SCALE = "_member_loc", "_member_scale"
"""A rank-1 Gaussian's per-member means and standard deviations ``(S, M, N, D)``, not
exported: :func:`_sample_obs` draws ``obs`` from their mixture."""


def _store_logits(
    out: _Draws,
    draws: int | slice,
    cols: slice,
    logits: Tensor,
    y: Tensor,
    n: int,
    likelihood: Likelihood,
    latent: dict[str, Tensor] | None = None,
    mixture: bool = False,
    density: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> None:
    """Store the predictions and the pointwise log-likelihood ``(S, N)`` of outputs ``(B, D)``
    (draw ``draws``) or ``(S, B, D)`` (every member, ``draws=slice(None)``) on the points
    ``cols`` of the targets ``y``, both from the model's likelihood: class probabilities
    ``probs`` ``(S, N, C)`` for a classifier, ``loc`` and ``scale`` ``(S, N, D)`` for a
    Gaussian. With ``mixture`` the outputs ``(M, B, D)`` are a rank-1 draw's members, stored
    as their equally weighted mixture (its probabilities; for a Gaussian its mean, standard
    deviation and density, the members' own Normals kept to draw ``obs`` from). Predictions
    are stored in float32, or in float64 for a float64 model (:func:`_stored_dtype`).
    ``density``: given the targets and the likelihood's log-likelihood, the one stored (that
    of a forward's own ``"obs"``: :class:`~pyrouq.diagnostics._own_forward.ObservedDensity`)."""
    stored = _stored_dtype(logits)
    outputs = logits.double()
    if isinstance(likelihood, Categorical):
        if mixture:
            log_probs = torch.log_softmax(outputs, dim=-1)
            outputs = torch.logsumexp(log_probs, dim=0) - np.log(outputs.shape[0])
        if "probs" not in out.values:  # the first batch: C is known now
            _check_labels("to_inference_data()", y, logits.shape[-1])
            out.alloc("probs", (n, logits.shape[-1]), stored)
            out.alloc("log_lik", (n,), torch.float64)
        target = y[cols].expand(*outputs.shape[:-1])
        out.values["probs"][draws, cols] = likelihood.predictive(outputs).to(stored).cpu()
        log_lik = likelihood.distribution(outputs, latent).log_prob(target)
    else:
        loc, scale = likelihood.predictive(outputs, latent)  # (M, B, D) each with mixture
        if "loc" not in out.values:
            # every target, not the first batch's alone (a NaN further on met torch's check)
            problem = likelihood.target_problem(y, loc.shape[-1])
            if problem is not None:
                raise ValueError(f"to_inference_data(): {problem}.")
            likelihood.check_targets(y[cols], logits, "to_inference_data()")
            for name in ("loc", "scale"):
                out.alloc(name, (n, loc.shape[-1]), stored)
            if mixture:
                for name in (_MEMBER_LOC, _MEMBER_SCALE):
                    out.alloc(name, (loc.shape[0], n, loc.shape[-1]), stored)
            out.alloc("log_lik", (n,), torch.float64)
        target = likelihood.shape_targets(y[cols], outputs).double()
        log_lik = likelihood.distribution(outputs, latent).log_prob(target)
        if mixture:
            out.values[_MEMBER_LOC][draws, :, cols] = loc.to(stored).cpu()
            out.values[_MEMBER_SCALE][draws, :, cols] = scale.to(stored).cpu()
            mean = mixture_mean(loc)  # (identical members: their value, as predict()'s mean)
            loc, scale = mean, (scale**2 + (loc - mean) ** 2).mean(0).sqrt()
            log_lik = torch.logsumexp(log_lik, dim=0) - np.log(outputs.shape[0])
        out.values["loc"][draws, cols] = loc.to(stored).cpu()
        out.values["scale"][draws, cols] = scale.to(stored).cpu()
    if density is not None:
        log_lik = density(target, log_lik)
    out.values["log_lik"][draws, cols] = log_lik.cpu()


def _sample_obs(out: _Draws, y: Tensor) -> None:
    """Draw ``obs`` from the stored predictions (a Categorical of ``probs``, a Normal of
    ``loc`` and ``scale``), one draw at a time (the random stream then does not depend on
    ``batch_size``), shaped as the observed ``y``."""
    for s in range(out.num_draws):
        if "probs" in out.values:
            value = torch.distributions.Categorical(probs=out.values["probs"][s]).sample()
        elif _MEMBER_LOC in out.values:  # a mixture of the members' Normals: a member per point
            loc, scale = out.values[_MEMBER_LOC][s], out.values[_MEMBER_SCALE][s]
            member = torch.randint(loc.shape[0], (loc.shape[1],))
            points = torch.arange(loc.shape[1])
            normal = torch.distributions.Normal(loc[member, points], scale[member, points])
            value = normal.sample().reshape(y.shape)
        else:
            normal = torch.distributions.Normal(out.values["loc"][s], out.values["scale"][s])
            value = normal.sample().reshape(y.shape)
        out.put("obs", s, value)
