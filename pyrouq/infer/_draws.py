"""Reparameterised draws from a mean-field Normal guide's locations and scales: one run's
(:func:`draw`, differentiable) or many runs' at once (:func:`draw_runs`, for prediction)."""

from __future__ import annotations

import torch

__all__ = ["draw", "draw_runs"]


def draw(
    loc: dict[str, torch.Tensor],
    scale: dict[str, torch.Tensor],
    num_samples: int | None = None,
    positive: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """``loc + scale * eps`` for every site of ``loc`` in order (``(num_samples, *shape)``
    with ``num_samples``; ``exp`` of it for the ``positive`` sites), differentiable with
    respect to ``loc`` and ``scale``."""
    lead = () if num_samples is None else (num_samples,)
    out = {}
    for site, mean in loc.items():
        eps = torch.empty(lead + tuple(mean.shape), dtype=mean.dtype, device=mean.device)
        value = mean + eps.normal_() * scale[site]
        out[site] = value.exp() if site in positive else value
    return out


@torch.no_grad()
def draw_runs(
    loc: dict[str, torch.Tensor],
    scale: dict[str, torch.Tensor],
    num_samples: int,
    positive: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """``num_samples`` draws of every site, ``(num_samples, *shape)``, without gradients: the
    draws of ``num_samples`` runs of the guide, one run after another, each drawing its sites
    in order (:func:`draw`'s values for each run, to the bit: ``eps * scale + loc`` is the same
    floating-point number as ``loc + scale * eps``). Each value is drawn and transformed in
    place in its slot of the stack: no per-draw temporaries and no copy into the stack."""
    out = {
        site: torch.empty((num_samples, *mean.shape), dtype=mean.dtype, device=mean.device)
        for site, mean in loc.items()
    }
    for run in range(num_samples):
        for site, mean in loc.items():
            value = out[site][run].normal_().mul_(scale[site]).add_(mean)
            if site in positive:
                value.exp_()
    return out
