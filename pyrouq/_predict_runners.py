"""Which runner :func:`pyrouq.predict` evaluates its input batches with, but for a guide's (whose
draws are taken in chunks, in predict() itself): one for draws given as ``posterior_samples``
(an MCMC result or run, or a dict of stacked draws: checked against the model's latent sites,
cast to the model's device and dtype, or to the inputs' for a model without parameters of
its own, and copied chunk by chunk as they run), and one for a model given no draws (a
BatchEnsemble's members, a Pyro model run from its priors, a plain network once); and the
advice of predict()'s refusal of a num_samples that is no count, which depends on that choice."""

from __future__ import annotations

from functools import partial
from typing import Any

import pyro
from torch import Tensor, nn

from pyrouq import _runners
from pyrouq._posterior_draws import posterior_draws
from pyrouq._util import has_latent_sites, module_dtype
from pyrouq._words import ensemble_draws


def _in_dtype_of(draws: dict[str, Tensor], x: Tensor) -> dict[str, Tensor]:
    """``draws`` on the device of the inputs ``x`` (where a model without tensors computes),
    their floating tensors in the dtype of floating ``x``."""
    dtype = x.dtype if x.is_floating_point() else None
    return {k: v.to(x.device, dtype if v.is_floating_point() else None) for k, v in draws.items()}


def posterior_samples_runner(
    model: Any,
    posterior_samples: Any,
    guide: Any,
    num_samples: int | None,
    device: Any,
    parallel: bool,
    batch_size: int,
    refit: Any,
) -> Any:
    """The runner of predict() for ``posterior_samples``: every input batch evaluated under
    those draws (refused alongside a guide or num_samples, or when they hold no draws)."""
    if guide is not None or num_samples is not None:
        raise ValueError(
            "predict() got posterior_samples and a guide or num_samples: the draws "
            "come from one source, and S is the number of posterior samples. "
            "Pass posterior_samples alone."
        )
    fixed = posterior_draws(posterior_samples, model)
    if not fixed:
        raise ValueError(
            "predict() got posterior_samples with no draws (an empty dict): give "
            "the model's latent sites, {site: (S, *shape)}."
        )
    # numpy's or arviz's float64 draws, say, in the model's dtype (a model without
    # parameters of its own tells none: its draws take the inputs' dtype); the runner copies
    # each chunk of them as it runs it: a network that changes its weight in place as it runs
    # (a clamp_ under no_grad) changes the copies, not the caller's tensors (an MCMCResult's,
    # numpy's), and every input batch runs on the draws as given
    dtype = module_dtype(model)
    fixed = {
        k: v.to(device, dtype if v.is_floating_point() and dtype else v.dtype)
        for k, v in fixed.items()
    }
    count = int(next(iter(fixed.values())).shape[0])
    return _runners.bayesian_runner(
        model,
        partial(_in_dtype_of, fixed) if dtype is None else lambda x: fixed,
        count,
        parallel,
        batch_size,
        refit,
        "posterior_samples",
        copied=True,
    )


def runner_without_draws(
    model: Any, num_samples: int | None, parallel: bool, batch_size: int, default_num_samples: int
) -> Any:
    """The runner of predict() for a model given no guide nor ``posterior_samples``: a
    BatchEnsemble's M members, a Pyro model run ``num_samples`` times from its priors
    (``default_num_samples``, predict()'s :data:`~pyrouq.predictive.DEFAULT_NUM_SAMPLES` as it
    reads it, where None), a plain network once (refused for a model with latent sites, or
    num_samples where S is fixed)."""
    if has_latent_sites(model):
        raise ValueError(
            f"{type(model).__name__} has latent sites: pass its fitted guide, "
            "predict(model, x, guide), to draw from the posterior."
        )
    elif isinstance(model, pyro.nn.PyroModule) and _runners.is_ensemble(model):
        if num_samples is not None:
            raise ValueError(
                f"num_samples={num_samples} given for a BatchEnsemble: its "
                f"{ensemble_draws(model.num_members)}. Leave num_samples=None."
            )
        return _runners.ensemble_runner(model)
    elif isinstance(model, pyro.nn.PyroModule) or not isinstance(model, nn.Module):
        # a Pyro model (a PyroModule or a function), run S times from its priors
        count = num_samples or default_num_samples
        return _runners.sampled_runner(model, count, parallel, batch_size)
    else:
        if num_samples is not None:
            raise ValueError(
                f"num_samples={num_samples} given for a deterministic network "
                f"({type(model).__name__}): S = 1. Leave num_samples=None."
            )
        return _runners.plain_runner(model)


def num_samples_hint(model: Any, guide: Any, posterior_samples: Any, default: int) -> str:
    """What predict()'s refusal of a ``num_samples`` that is no positive integer advises: a
    number of draws where the call draws them (a guide, a Pyro model's priors), else to leave
    it out, as the refusal of any number there would (posterior_samples given, a
    BatchEnsemble's members, a plain network's one prediction)."""
    if posterior_samples is not None:
        return "Leave it out: S is the number of draws in posterior_samples."
    if guide is None and not has_latent_sites(model):
        if isinstance(model, pyro.nn.PyroModule) and _runners.is_ensemble(model):
            return f"Leave it out: a BatchEnsemble's {ensemble_draws(model.num_members)}."
        if isinstance(model, nn.Module) and not isinstance(model, pyro.nn.PyroModule):
            return f"Leave it out: a deterministic network ({type(model).__name__}) gives S = 1."
    return f"Pass e.g. num_samples={default} (draws), or leave it out."
