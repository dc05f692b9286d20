"""The draws :func:`pyrouq.predict` takes as ``posterior_samples=``: an :class:`MCMCResult`, a
``pyro.infer.MCMC`` run or a dict of stacked draws, read into ``{site: (S, *shape)}`` and
checked against the model's latent sites (private; moved out of :mod:`pyrouq.mcmc`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyro
import torch
from torch import Tensor

from pyrouq.mcmc import MCMCResult

__all__ = ["posterior_draws"]


def posterior_draws(source: Any, model: Any) -> dict[str, Tensor]:
    """``{site: (S, *shape)}`` from an :class:`MCMCResult` or a dict of stacked draws, checked
    against the model's latent sites (every site, one S for all)."""
    from pyrouq._own_models import unpadded
    from pyrouq.infer._site_checks import check_draws

    if isinstance(source, MCMCResult):
        draws = source.draws()
    elif isinstance(source, pyro.infer.MCMC):  # a run of Pyro's own: every chain's draws
        if getattr(source, "_samples", None) is None:  # (its get_samples() fails on None)
            raise ValueError(
                "posterior_samples is a pyro.infer.MCMC that has not run: it holds no draws "
                "yet. Run it first, run.run(x, y), then pass it (or pyrouq.mcmc()'s result)."
            )
        draws = {site: value.detach() for site, value in source.get_samples().items()}
    elif isinstance(source, dict):
        draws = {}
        for site, value in source.items():
            if isinstance(value, np.ndarray) and value.dtype != object:
                # numpy's draws (arviz's posterior, say): reversed or big-endian ones too
                native = value.dtype.newbyteorder("=")
                value = torch.as_tensor(np.ascontiguousarray(value, dtype=native))
            if not torch.is_tensor(value):
                raise TypeError(
                    f"posterior_samples: site {site!r} holds a {type(value).__name__}, "
                    "expected its draws as a tensor (or numpy array) of shape (S, *shape). "
                    "Convert it with torch.as_tensor(...)."
                )
            draws[site] = value
    else:
        way = ""  # a guide, or a kernel, where the draws go
        if isinstance(source, pyro.infer.mcmc.mcmc_kernel.MCMCKernel):
            way = (
                " A kernel is run first: pass pyrouq.mcmc(model, x, y, ...)'s result, or "
                "run = pyro.infer.MCMC(kernel, ...) after run.run(x, y)."
            )
        elif callable(source):
            way = " A guide is passed as the guide: predict(model, x, guide)."
        elif _arviz_draws(source):  # an export (to_inference_data, from_netcdf) or its group
            way = (
                " An arviz export's posterior goes in as a dict of its draws, (chain, draw) "
                "flattened: {site: v.values.reshape(-1, *v.shape[2:]) for site, v in "
                "idata.posterior.items()} (or the MCMCResult itself, where you have it)."
            )
        raise TypeError(
            "Expected posterior_samples to be an MCMCResult, a pyro.infer.MCMC run or a dict "
            f"{{site: (S, ...)}} of tensors, got {type(source).__name__}.{way}"
        )
    for site, value in draws.items():
        if value.dim() == 0 or value.shape[0] == 0:
            what = "no draw dimension" if value.dim() == 0 else "no draws (S = 0)"
            raise ValueError(
                f"posterior_samples: site {site!r} has {what}, shape {tuple(value.shape)}. "
                "Give every site its draws first, (S, *shape) with S >= 1 (one draw: "
                "value[None])."
            )
    sites = getattr(model, "latent_sites", None)
    shapes = sites() if callable(sites) else {}
    present = [k for k in shapes if k in draws]  # (none: the site check below names them)
    if present and all(tuple(draws[k].shape) == tuple(shapes[k]) for k in present):
        raise ValueError(  # (the count check would read each site's first dim as its S)
            "posterior_samples holds one value of each site, of the site's own shape, without "
            "the draw dimension: predict() takes (S, *shape). For one draw, pass "
            "{site: value[None] for site, value in posterior_samples.items()}."
        )
    counts = {site: int(v.shape[0]) for site, v in draws.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(
            f"posterior_samples must give every site the same number S of draws, got {counts}: "
            "draw s is one value of every site. Pass the sites' draws of one run (an "
            "MCMCResult itself, or its .draws()), or cut them to the smallest S: value[:S]."
        )
    for site, value in draws.items():  # arviz's (chain, draw, *shape), not flattened
        shape = tuple(shapes.get(site, ()))  # (a draw dim of 1: Predictive's padding, below)
        chained = site in shapes and value.dim() == len(shape) + 2 and value.shape[2:] == shape
        if chained and value.shape[1] > 1:
            raise ValueError(
                f"posterior_samples: site {site!r} has shape {tuple(value.shape)}, read as "
                f"(chain, draw) = {tuple(value.shape[:2])} before the site's shape {shape}: "
                "predict() takes the draws flattened, (S, *shape). Pass value.reshape(-1, "
                "*value.shape[2:]) for every site (chain after chain), or the MCMCResult itself."
            )
    if callable(sites):  # Predictive's plate padding dropped (a model of the user's own: later)
        draws = {k: unpadded(v, tuple(shapes[k])) if k in shapes else v for k, v in draws.items()}
        for site, value in draws.items():
            if site in shapes and not value.is_floating_point():
                raise TypeError(
                    f"posterior_samples: site {site!r} holds {value.dtype} draws, expected "
                    f"floating-point weights. Convert them: posterior_samples[{site!r}].float()."
                )
    check_draws(model, draws, "predict()", source="posterior_samples")
    for site, value in draws.items():  # a NaN draw would make its predictions NaN, silently
        if site in shapes and value.is_floating_point():  # (not "logits": unread; own: on x)
            # each draw's sum, NaN or inf where a value is (or where it overflows: those
            # draws checked value by value), without isfinite's full-size temporaries
            sums = value.sum(tuple(range(1, value.dim()))) if value.dim() > 1 else value
            odd = (~torch.isfinite(sums)).nonzero().flatten().tolist()
            bad = [s for s in odd if not bool(torch.isfinite(value[s]).all())]
            if len(bad):
                raise ValueError(
                    f"posterior_samples: site {site!r} holds NaN or inf in {len(bad)} of "
                    f"{len(value)} draws, the first at draw {int(bad[0])}: those draws' "
                    "predictions would be NaN. Check how the draws were made or loaded, or keep "
                    "the finite draws of every site (value[keep])."
                )
    return draws


def _arviz_draws(source: Any) -> bool:
    """Whether ``source`` is an arviz ``InferenceData`` with a posterior group, or an xarray
    ``Dataset`` of draws (``chain`` and ``draw`` dims: such a group), read without importing
    either library."""
    module = type(source).__module__
    if module.startswith("arviz"):
        return hasattr(source, "posterior")
    dims: Any = getattr(source, "dims", ())
    return module.startswith("xarray") and "draw" in dims
