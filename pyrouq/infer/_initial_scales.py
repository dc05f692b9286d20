"""The initial scales of a :class:`~pyrouq.MeanFieldGuide` in the model's dtype (private):
each held as ``rho = softplus^-1(scale)``, computed in float64 and cast, and refused where
torch's softplus of it, in that dtype, is 0 or inf (a KL of ``-log 0`` or of ``inf``).

What is 0 is measured, not read off ``torch.finfo``: below a dtype's smallest normal number
(float16's 6.1e-05, float32's and bfloat16's 1.2e-38) a scale is subnormal, held with fewer
digits (1e-07 is 1.19e-07 in float16) but not 0, down to about half of its smallest positive
number (float16's 5.96e-08, bfloat16's 9.18e-41), where it rounds to 0; float32's deepest
ones (1.4e-45) are 0 through torch's vector code on CPU, which the check runs. Training may
overflow above that (a float16 MLP built at 3e-07 stopped on gradients past 65,504; at 5e-07
it trained), which fit() refuses in its own words."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def inverse_softplus(scale: Tensor, device: torch.device | str, dtype: torch.dtype) -> Tensor:
    """``softplus^-1(scale)`` of a float64 ``scale``, computed in float64, in ``dtype``."""
    return (scale + torch.log(-torch.expm1(-scale))).to(device, dtype)


def held(rho: Tensor, fill: bool) -> Tensor:
    """The scales ``softplus(rho)`` as the guide computes them: every entry, and with ``fill``
    (one scale for the site) one more through torch's scalar code."""
    return F.softplus(torch.cat([rho, rho[:1]]) if fill else rho)


def smallest_held(dtype: torch.dtype, device: torch.device | str, entries: int) -> float:
    """The smallest positive ``dtype`` number times a power of 2 that torch's softplus (its
    vector and scalar code, on ``entries`` and one entry) gives back as a positive scale."""
    info = torch.finfo(dtype)
    least = info.tiny * info.eps  # the smallest positive (subnormal) number
    while least < info.tiny:
        scale = torch.full((entries,), least, dtype=torch.float64)
        if bool((held(inverse_softplus(scale, device, dtype), True) > 0).all()):
            break
        least *= 2
    return least


def check_initial_scales(
    site: str, scale: Tensor, sp: Tensor, dtype: torch.dtype, option: str, default: float
) -> None:
    """Refuse a site's initial scales (``scale``, float64) whose scales in ``dtype``, ``sp``,
    are not all positive and finite, naming ``option`` (``init_scale`` or
    ``init_scale_relative``) and the smallest or largest scale ``dtype`` holds. (A prior's
    scale, cast to ``dtype`` as it is rather than through softplus, is
    :func:`pyrouq._util.check_held`'s.)"""
    if not bool((sp > 0).all()):  # (a KL of -log 0: inf)
        info = torch.finfo(dtype)
        least = smallest_held(dtype, sp.device, max(sp.numel() - 1, 1))
        raise ValueError(
            f"mean_field_guide(): the initial scale of site {site!r} "
            f"({float(scale.min()):g}) is 0 in {dtype}, so its KL would be infinite. "
            f"Pass an {option} of at least {least:.3g}, the smallest scale {dtype} holds "
            f"here; below {info.tiny:.3g}, its smallest normal number, a scale keeps fewer "
            f"digits and training may overflow (the default init_scale is {default:g})."
        )
    if not bool(torch.isfinite(sp).all()):  # (1e39 in float32: inf)
        raise ValueError(
            f"mean_field_guide(): the initial scale of site {site!r} "
            f"({float(scale.max()):g}) is inf in {dtype}, so its KL would be infinite. "
            f"Pass a smaller {option}: {dtype} holds at most {torch.finfo(dtype).max:g} "
            f"(the default init_scale is {default:g})."
        )
