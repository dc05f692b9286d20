"""The checks :func:`pyrouq.mcmc` makes before it samples (private): the kernel named, the data
it takes, and the models it refuses (no latent sites, a discrete prior, a site the network
samples itself)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyro
import torch
from torch import Tensor

from pyrouq._distribution_parts import (
    innermost_distribution,
    is_discrete,
    refuse_undecided_support,
)
from pyrouq._numbers import is_array_like
from pyrouq._own_models import unobserved_sites
from pyrouq._util import global_streams_kept, module_device
from pyrouq._words import slip_hint

__all__ = [
    "check_data",
    "check_kernel",
    "refuse_discrete_priors",
    "refuse_forward_sites",
    "refuse_own_latents",
    "refuse_unsampled",
]


KERNELS = ("nuts", "hmc")


def check_kernel(kernel: Any) -> None:
    """Refuse a ``kernel`` other than ``"nuts"`` or ``"hmc"``, saying what to pass: the name in
    lower case where only its case or surrounding spaces differ ("NUTS", "nuts "), the name
    where a Pyro kernel came (an instance, or the class itself)."""
    if isinstance(kernel, str) and kernel in KERNELS:
        return
    hint = slip_hint(kernel, KERNELS)  # (did you mean 'nuts'? the names are lower case)
    if hint:
        raise ValueError(
            f"Unknown kernel {kernel!r}{hint}: expected 'nuts' or 'hmc'. Pass "
            f"kernel={kernel.strip().lower()!r}."
        )
    kind = kernel if isinstance(kernel, type) else type(kernel)
    if issubclass(kind, pyro.infer.mcmc.mcmc_kernel.MCMCKernel):
        name = kind.__name__
        named = f"kernel={name.lower()!r}" if name.lower() in KERNELS else "kernel='nuts' or 'hmc'"
        told = f"{name} (a kernel class)" if kind is kernel else name
        raise ValueError(
            f"Unknown kernel {told}: mcmc() takes a kernel's name, 'nuts' or 'hmc', and builds "
            f"it for the model (NUTS's depth: max_tree_depth). Pass {named}, or run "
            "pyro.infer.MCMC with a kernel of your own."
        )
    raise ValueError(
        f"Unknown kernel {kernel!r}: expected 'nuts' or 'hmc'. Pass kernel='nuts' (the "
        "No-U-Turn sampler, the default) or kernel='hmc' (Hamiltonian Monte Carlo with a fixed "
        "trajectory length)."
    )


def refuse_unsampled(model: Any) -> None:
    """Refuse a model without latent sites for NUTS to sample, saying what it is and what to
    do: a plain network (make it Bayesian), a BatchEnsemble (its members are point estimates),
    a Pyro model of one's own (Pyro's MCMC)."""
    latent = getattr(model, "latent_sites", None)
    if callable(latent) and latent():
        return
    if isinstance(getattr(model, "num_members", None), int):  # a BatchEnsemble
        why = (
            ", which has no latent sites to sample: its members are point estimates, trained by "
            "fit() (predict() runs them). To sample a network's weights, make it Bayesian: "
            "pyrouq.bayesian(net), or pyrouq.rank1(net, num_members) of the network given to "
            "batchensemble() (not of the ensemble; for a BatchEnsembleMLP or BatchEnsembleLeNet, "
            "a pyrouq.MLP or LeNet of its sizes) for an ensemble whose rank-1 factors are "
            "latent; to make this existing BatchEnsemble's factors latent, use "
            "pyrouq.bayesian(ensemble, prior=...) (a prior centred on 1 for the factors, as "
            "rank1()'s Normal(1, 0.1): one centred on 0 pulls them to 0)."
        )
    elif isinstance(model, torch.nn.Module) and not isinstance(model, pyro.nn.PyroModule):
        why = (
            "; make a plain network Bayesian first, pyrouq.bayesian(net) (with likelihood="
            "pyrouq.likelihoods.Gaussian(...) for regression); for any other Pyro model use "
            "pyro.infer.MCMC."
        )
    else:
        why = "; for any other Pyro model use pyro.infer.MCMC."
    raise TypeError(
        f"mcmc() samples a pyrouq Bayesian model (made by pyrouq.bayesian(), BayesianMLP, "
        f"...), got {type(model).__name__}{why}"
    )


def check_data(x: Any, y: Any) -> tuple[Tensor, Tensor]:
    for name, value in (("x", x), ("y", y)):
        if isinstance(value, (list, tuple)) and any(torch.is_tensor(v) for v in value):
            raise TypeError(  # (torch.as_tensor fails on them)
                f"mcmc() needs the full data as tensors x and y, got a {type(value).__name__} "
                f"of tensors for {name}. Join them first: {name} = torch.cat({name}) (a "
                f"loader's batches) or torch.stack({name}) (one tensor per point)."
            )
        if is_array_like(value) and not torch.is_tensor(value):  # numpy's, a pandas frame
            plain = isinstance(value, (np.ndarray, list, tuple))  # (as_tensor fails on a frame)
            convert = f"torch.as_tensor({name})" if plain else f"torch.tensor(np.asarray({name}))"
            raise TypeError(
                f"mcmc() needs the full data as tensors x and y, got {type(value).__name__} "
                f"for {name}. Convert it first: {name} = {convert}."
            )
        if isinstance(value, torch.nn.Module) or callable(value) or value is None:  # a guide
            why = (
                "It takes no guide (NUTS samples the posterior itself)"
                if value is not None
                else "NUTS samples the posterior given the inputs and their targets"
            )
            raise TypeError(
                f"mcmc() needs the full data as tensors x and y, got {type(value).__name__} "
                f"for {name}. {why}: call mcmc(model, x, y, num_samples=..., warmup_steps=...)."
            )
        if not torch.is_tensor(value):
            raise TypeError(
                f"mcmc() needs the full data as tensors x and y, got {type(value).__name__} "
                f"for {name}: NUTS evaluates the likelihood of every point at every step, so it "
                "takes no minibatch loader. Pass x, y = torch.cat over the loader's batches (or "
                "use fit() for minibatch VI)."
            )
        if value.dim() == 0:
            raise ValueError(
                f"mcmc(): expected {name} with a leading dimension of N points, got a scalar "
                f"tensor. Pass every point: x of shape (N, ...) and y of shape (N,) or (N, D)."
            )
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(
            f"mcmc(): x and y must hold the same number N >= 1 of points, got {x.shape[0]} and "
            f"{y.shape[0]}. Pass every point and one target per input: y[i] for x[i]."
        )
    # data, not parameters: a graph (features from a network) would be refused by the chain
    # processes' pickling, and an inference tensor cannot be saved for NUTS's backward passes
    x, y = x.detach(), y.detach()
    return (x.clone() if x.is_inference() else x), (y.clone() if y.is_inference() else y)


def refuse_discrete_priors(model: Any) -> None:
    """A site with a discrete prior (Bernoulli, Poisson, ...) refused, named: NUTS moves
    continuous values by gradients (Pyro's own error speaks of enumeration and autoguides)."""
    priors = getattr(model, "priors", None)
    for site, prior in (priors() if callable(priors) else {}).items():
        try:
            support = prior.support
        except NotImplementedError:  # a distribution of the user's own without a support
            continue
        refuse_undecided_support(  # (torch: ".is_discrete cannot be determined statically")
            "mcmc()",
            site,
            innermost_distribution(prior),
            "NUTS and HMC cannot map it to the real line",
        )
        if is_discrete(prior):
            name = type(getattr(prior, "base_dist", prior)).__name__
            support = getattr(support, "base_constraint", support)  # (Independent's)
            raise ValueError(
                f"mcmc(): the prior of site {site!r} ({name}) is discrete (support "
                f"{support}); NUTS and HMC move continuous values by gradients and cannot "
                "sample it. Give the site a continuous prior, pyrouq.bayesian(net, prior=...) "
                "(Normal, Laplace, StudentT), or leave it out of select= (a point estimate)."
            )


def refuse_own_latents(model: Any, trace: Any) -> None:
    """A site the network samples itself (``pyro.sample`` in its forward, traced with the sites
    forward() hides, as its own "obs", hidden) refused, named: NUTS would infer it as a latent
    variable the result does not keep (predict() on the draws would take it from its prior)."""
    own = unobserved_sites(trace)
    if own:
        raise ValueError(
            f"mcmc(): the network of {type(model).__name__} samples {own[:3]} itself "
            "(pyro.sample in its forward): NUTS would infer it as a latent variable, which the "
            "result does not keep (predict() on the draws would take it from its prior). Draw "
            "such noise with torch (as dropout draws its masks), or sample a model written in "
            "Pyro with pyro.infer.MCMC. Nothing was sampled."
        )


def refuse_forward_sites(model: Any, x: Tensor, y: Tensor) -> None:
    """Sites that the model's ``forward`` samples beside its latent sites (a subclass of
    :class:`~pyrouq.BayesianNetwork` overriding ``forward``, a temperature drawn there)
    refused, named: NUTS would sample them, but the result keeps the latent sites alone, and
    :func:`pyrouq.predict`, which runs that forward, refuses draws without them. The trace draws
    from the priors with the random state put back: the chains' draws are not moved. It runs
    with gradients, as the chains run the forward (an input-gradient penalty takes one), and
    leaves Pyro's param store as it found it; a forward that fails in it is left to the
    chains, which raise its error."""
    store = pyro.get_param_store()
    kept = set(store.keys())
    try:
        with torch.enable_grad(), global_streams_kept(module_device(model)):
            sites = unobserved_sites(pyro.poutine.trace(model).get_trace(x, y))  # (graph dropped)
    except Exception:
        return
    finally:  # the entries the forward put there (its point estimates, register_children)
        for name in set(store.keys()) - kept:
            del store[name]
    latent = model.latent_sites()
    extra = [site for site in sites if site not in latent]
    if extra:
        raise ValueError(
            f"mcmc(): {type(model).__name__} samples {extra[:3]} in its forward beside its "
            f"latent sites {list(latent)[:3]}: NUTS would sample them too, but the result "
            "keeps the latent sites alone, and predict(), which runs that forward, would "
            "refuse draws without those sites. Sample such a model with "
            "pyro.infer.MCMC(NUTS(model)) and pass the run, predict(model, x, "
            "posterior_samples=run), or make the sites latent sites of the model (a noise "
            "scale: a prior, Gaussian(dist.HalfNormal(1.0))). Nothing was sampled."
        )
