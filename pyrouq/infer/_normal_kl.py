"""The KL divergence of a mean-field Normal site from its Normal prior, and the fused draw.

``KL(Normal(loc, scale) || Normal(m, s))`` summed over a site's elements is the closed form of
``torch.distributions.kl_divergence``; for a scalar prior ``(m, s)`` (every default prior) it
is built from three sums, with its gradient written out (:class:`_NormalKL`), and the ELBO's
first weight draw of the site is taken in the same autograd node
(:func:`draw_with_normal_kl`), whose backward builds both terms' gradients together. Each
elementwise step walks the whole site through memory, which is what these save: on an
11M-weight resnet18 a Bayesian epoch measured 1.31x the plain one with both, 1.38x with the
draw and the KL apart, 1.50x with the KL by autograd (``benchmarks/bench_wide.py``, Intel
Xeon, 2 cores).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["draw_with_normal_kl", "kl_dtype", "normal_kl", "scalar_prior"]


def scalar_prior(prior_loc: Tensor, prior_scale: Tensor) -> bool:
    """Whether a Normal prior has one fixed location and scale for the whole site."""
    return (
        prior_loc.numel() == 1
        and prior_scale.numel() == 1
        and not (prior_loc.requires_grad or prior_scale.requires_grad)
    )


def _centred(loc: Tensor, m: Tensor) -> Tensor:
    """``loc - m``; ``loc`` itself for a prior centred at 0 on CPU, where reading ``m`` costs
    nothing (one walk over the site fewer; on an accelerator it would wait for the device)."""
    if m.device.type == "cpu" and float(m) == 0.0:
        return loc
    return loc - m


_LARGE = 1 << 18
"""Sites of this many elements or more are summed by rows (:func:`_row_sum`): one float32 sum
of a large site is off by parts in 1e6 to 1e5, and the KL's terms cancel (11M weights: 45 to
220 nats of the KL, where summing torch's elementwise KL is within 1)."""

_ROW = 1 << 12
"""Length of the rows: each row's sum in the site's dtype, the rows' in float64."""


def _row_sum(flat: Tensor, square: bool = False) -> Tensor:
    """``sum flat`` (``sum flat^2`` with ``square``) of a large site in float64, by rows of
    ``_ROW``."""
    rows = flat.numel() // _ROW
    head, tail = flat[: rows * _ROW].reshape(rows, _ROW), flat[rows * _ROW :]
    wide = torch.promote_types(flat.dtype, torch.float32)  # (a half-precision row's sum: float32)
    if not square:
        return head.sum(1, dtype=wide).double().sum() + tail.double().sum()
    norms = torch.linalg.vector_norm(head, dim=1, dtype=wide).double()
    return torch.dot(norms, norms) + tail.double().square().sum()


def kl_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a site's KL is computed and returned in: float32 for a half-precision site
    (float64 stays). A float16 KL overflows: a 22k-weight site at its initial scale holds
    about 82,000 nats, past float16's 65,504, and the sum of its log-scales (-4.6 each) too;
    a bfloat16 one keeps 3 digits of it."""
    return torch.promote_types(dtype, torch.float32)


def _kl_value(centred: Tensor, scale: Tensor, s: Tensor) -> Tensor:
    """``sum 0.5 (scale^2 + centred^2) / s^2 - 0.5 - log(scale) + log(s)``, the sums combined
    in float64 (those of a large site taken by rows, :func:`_row_sum`), in the site's dtype,
    float32 for a half-precision site (:func:`kl_dtype`: its elements are read in float32)."""
    wide = kl_dtype(scale.dtype)
    flat = scale.reshape(-1).to(wide)
    shifted = centred.reshape(-1).to(wide)
    if flat.numel() < _LARGE:
        quad = (torch.dot(flat, flat) + torch.dot(shifted, shifted)).double()
        log_scale = flat.log().sum().double()
    else:
        quad = _row_sum(flat, square=True) + _row_sum(shifted, square=True)
        log_scale = _row_sum(flat.log())
    count = flat.numel()
    s64 = s.double()
    kl = 0.5 * quad / s64.square() - 0.5 * count - log_scale + count * s64.log()
    return kl.to(wide)


class _NormalKL(torch.autograd.Function):
    """``sum KL(Normal(loc, scale) || Normal(m, s))`` over every element, for a scalar prior
    ``(m, s)``, with its gradient written out: ``(loc - m) / s^2`` and ``scale / s^2 -
    1 / scale``. Autograd through the elementwise closed form allocated and walked about 25
    site-sized temporaries a step (forward and backward); this walks about 10."""

    @staticmethod
    def forward(ctx: Any, loc: Tensor, scale: Tensor, m: Tensor, s: Tensor) -> Tensor:
        ctx.save_for_backward(loc, scale, m, s)
        return _kl_value(_centred(loc, m), scale, s)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None, None]:
        loc, scale, m, s = ctx.saved_tensors
        per_var = grad / s.square()
        grad_loc = _centred(loc, m) * per_var if ctx.needs_input_grad[0] else None
        grad_scale = None
        if ctx.needs_input_grad[1]:
            grad_scale = scale.reciprocal().mul_(-grad).add_(scale * per_var)
        return grad_loc, grad_scale, None, None


def normal_kl(loc: Tensor, scale: Tensor, prior_loc: Tensor, prior_scale: Tensor) -> Tensor:
    """``KL(Normal(loc, scale) || Normal(prior_loc, prior_scale))`` summed over the elements:
    torch's closed form (``_kl_normal_normal``) on the tensors, without distribution objects
    (they measured 2 ms a step of the 20 ms BayesianLeNet step on 2 CPU cores), fused for a
    scalar prior (:class:`_NormalKL`)."""
    if scalar_prior(prior_loc, prior_scale):
        return _NormalKL.apply(loc, scale, prior_loc.reshape(()), prior_scale.reshape(()))
    wide = kl_dtype(torch.promote_types(scale.dtype, loc.dtype))  # a half site's: float32
    loc, scale = loc.to(wide), scale.to(wide)
    var_ratio = (scale / prior_scale).pow(2)
    t1 = ((loc - prior_loc) / prior_scale).pow(2)
    return (0.5 * (var_ratio + t1 - 1 - var_ratio.log())).sum()


class _DrawWithNormalKL(torch.autograd.Function):
    """One draw ``loc + scale * eps`` of a site and its ``KL`` from a scalar Normal prior
    ``(m, s)``, in one node. The backward adds the two terms' gradients as it builds them:
    ``g_w + g_kl (loc - m) / s^2`` for ``loc`` and ``g_w eps + g_kl (scale / s^2 - 1 /
    scale)`` for ``scale``, four walks over the site where the separate draw and KL (and
    autograd's sums of their gradients) took eight."""

    keeps_no_draw = True
    """Nothing holds the draw (the backward reads the noise, the KL is in closed form): a
    network may change it in place, and :func:`pyrouq._engine.run_draws` hands it over
    without a copy."""

    @staticmethod
    def forward(ctx: Any, loc: Tensor, scale: Tensor, m: Tensor, s: Tensor) -> Any:
        eps = torch.empty(loc.shape, dtype=loc.dtype, device=loc.device).normal_()
        value = loc + eps * scale  # draw()'s expression: the same rounding
        centred = _centred(loc, m)
        ctx.save_for_backward(centred, scale, eps, s)
        return value, _kl_value(centred, scale, s)

    @staticmethod
    def backward(
        ctx: Any, grad_value: Tensor, grad_kl: Tensor
    ) -> tuple[Tensor, Tensor, None, None]:
        # (a gradient autograd has none for, such as that of a draw the network does not
        # use, comes as zeros)
        centred, scale, eps, s = ctx.saved_tensors
        per_var = grad_kl / s.square()
        grad_loc = torch.addcmul(grad_value, centred, per_var)
        grad_scale = (grad_value * eps).addcmul_(scale, per_var).addcdiv_(grad_kl, scale, value=-1)
        return grad_loc, grad_scale, None, None


def draw_with_normal_kl(loc: Tensor, scale: Tensor, m: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """One draw of a site, ``loc + scale * eps`` (the value :func:`~pyrouq.infer.guide.draw`
    gives for the same random state, to the bit), and ``KL(Normal(loc, scale) || Normal(m,
    s))`` summed over its elements, for a scalar prior (:func:`scalar_prior`): one autograd
    node, whose backward walks the site fewer times than the draw's and the KL's apart."""
    value, kl = _DrawWithNormalKL.apply(loc, scale, m.reshape(()), s.reshape(()))
    return value, kl
