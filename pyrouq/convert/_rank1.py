"""``rank1()``: the rank-1 Bayesian network of Dusenberry et al. (2020), a BatchEnsemble whose
members' factors are latent."""

from __future__ import annotations

import pyro.distributions as dist
import torch
from torch import nn

from pyrouq._util import check_held, check_positive_float, class_name
from pyrouq.convert._batchensemble import BatchEnsembleNetwork, Norms, _batchensemble
from pyrouq.convert._bayesian import BayesianNetwork
from pyrouq.convert._conversion_warnings import converting_as
from pyrouq.convert._select import check_module
from pyrouq.convert._sites import check_no_pyro_samples
from pyrouq.likelihoods import Likelihood, LikelihoodName
from pyrouq.nn._batchensemble import FactorInit

__all__ = ["DEFAULT_RANK1_PRIOR_SCALE", "rank1"]

DEFAULT_RANK1_PRIOR_SCALE = 0.1
"""Standard deviation of the ``Normal(1, s)`` prior of every rank-1 factor entry."""


def rank1(
    module: nn.Module,
    num_members: int,
    *,
    prior_scale: float = DEFAULT_RANK1_PRIOR_SCALE,
    use_base_weights: bool = True,
    init: FactorInit = "normal",
    r_std: float = 0.5,
    s_std: float = 0.5,
    norms: Norms = "shared",
    likelihood: LikelihoodName | Likelihood = "categorical",
    num_data: int | None = None,
) -> BayesianNetwork:
    """The rank-1 Bayesian network of any ``nn.Module`` (Dusenberry et al., ICML 2020).

    ``bayesian(batchensemble(module, num_members, norms="shared"),
    prior=Normal(1, prior_scale))``: every
    ``nn.Linear`` / convolution becomes a BatchEnsemble layer (shared weight W, per-member
    factors ``r_m``, ``s_m`` and biases; an ``nn.Bilinear`` stays one layer the members share,
    with no factors, which a warning names), and the factors ``r`` ``(M, in)`` and ``s``
    ``(M, out)`` of every layer become latent sites (named ``"<layer>.r"``, ``"<layer>.s"``)
    with a ``Normal(1, prior_scale)`` prior on every entry. W, the biases and normalisation
    layers stay point estimates. With :func:`pyrouq.mean_field_guide` each member row gets its
    own Gaussian, so the guide is a mixture of M Gaussians over the factors, one per member.

    **The objective** (what :class:`pyrouq.KLWeightedELBO` computes): on a minibatch of B of
    N points, with one draw of every member's factors,
    ``sum_m [ -(N/B) sum_b log p(y_b | x_b, W, r_m, s_m) ] + kl_weight * sum_m KL(q_m || p)``:
    the members' summed negative log-likelihoods, as a BatchEnsemble is trained, plus the
    per-component KL of each member's Gaussian to the prior. It is M times the paper's
    average over members of the per-component ELBOs, which leaves Adam's steps unchanged.
    A latent noise scale (a Gaussian likelihood with a prior on ``sigma``) is one site shared
    by the members: its KL counts once against their M summed likelihoods, so its prior
    weighs 1/M of what it weighs in a single network.

    **Predictions**: ``predict(model, x, guide, num_samples=K)`` gives S = K * M draws,
    draw-major: output ``s = k * M + m`` is member m under the k-th draw of the factors.

    Parameters
    ----------
    module : nn.Module
        The network (deep-copied, never changed); see :func:`pyrouq.batchensemble`.
    num_members : int
        Ensemble size M (>= 1).
    prior_scale : float, default 0.1
        Standard deviation of the ``Normal(1, prior_scale)`` prior of each factor entry.
    use_base_weights, init, r_std, s_std
        The BatchEnsemble's options (:func:`pyrouq.batchensemble`): the factors' initial
        values, which become the guide's initial locations. The paper's sign-aware start,
        ``init="random_sign"`` (entries +-1), measured worse here and is not the default: on
        LeNet / MNIST (2 epochs, seeds 0-4) NLL 0.048-0.051 and ECE 1.25-1.50 %, against
        0.034-0.037 and 0.20-0.37 % with ``"normal"``, and accuracy 0.1-0.3 points lower.
    norms : {"shared", "per_member"}, default "shared"
        Whether the members share the normalisation layers. Unlike a BatchEnsemble's
        (``"per_member"``), a rank-1 network's default is ``"shared"``: with a copy per member
        its members disagreed far more and it came out under-confident (residual CNN on
        Fashion-MNIST, 3 epochs, seed 0: ECE 5.41 %, NLL 0.2745, against 0.66 % and 0.2405
        shared). Train-mode BatchNorm divides out the scale of the factors that feed it, so
        their posterior keeps the prior's spread in that direction, which the running
        statistics of prediction do not divide out. ``predict(..., batchnorm_data=train)``
        re-estimates the statistics per draw and removes the excess (ECE 0.72 %, NLL 0.2360),
        but it leaves the network no better than a BatchEnsemble with per-member norms (see the
        README).
    likelihood : {"categorical", "gaussian"} or Likelihood, default "categorical"
    num_data : int, optional
        Training-set size N (set by :func:`pyrouq.fit`).

    Returns
    -------
    BayesianNetwork
        Its ``num_members`` is M.

    Warns
    -----
    UserWarning
        Layers or parameters held in plain Python lists, tuples or dicts (not registered:
        never converted, trained or saved; hold them in ``nn.ModuleList`` / ``nn.ModuleDict``),
        in the first 10,000 items of each attribute's containers.
        An ``nn.Bilinear`` layer, which has no BatchEnsemble version: it stays one layer every
        member shares. A parameter left as it is but tied to the bias of a converted layer: the
        tie breaks (the layer's per-member biases replace that bias in the layer only, and the
        two train apart; :func:`pyrouq.bayesian` keeps every tie).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> model = rank1(net, 2)
    >>> {site: tuple(shape) for site, shape in model.latent_sites().items()}
    {'0.r': (2, 4), '0.s': (2, 8), '2.r': (2, 8), '2.s': (2, 3)}
    >>> model(torch.randn(5, 4)).shape  # (M, B, C) under one draw of the factors
    torch.Size([2, 5, 3])
    """
    scale = check_positive_float(
        "prior_scale",
        prior_scale,
        "It is the standard deviation of the Normal(1, prior_scale) prior of every rank-1 "
        "factor; 0.1 is the default.",
    )
    if not isinstance(module, nn.Module):  # (a BatchEnsemble is refused below, saying why)
        check_module(module, "convert into a rank-1 network")
    # the sites' dtypes (the prior, made in float64, is cast to each): torch's default for a
    # network without floating parameters
    floats = {p.dtype for p in module.parameters() if p.is_floating_point()}
    for kind in sorted(floats or {torch.get_default_dtype()}, key=str):
        check_held("prior_scale", scale, kind, "the factors' dtype", "0.1 is the default.")
    if isinstance(module, BatchEnsembleNetwork):
        raise TypeError(
            f"rank1() converts a plain network and got a {class_name(module)}, already a "
            "BatchEnsemble. Pass the plain network, or use bayesian(ensemble) to make an "
            "existing BatchEnsemble's factors latent."
        )
    check_no_pyro_samples(module, "rank1()", ensemble=True)
    with converting_as("rank1()"):  # (its warnings name rank1())
        ensemble = _batchensemble(
            module,
            num_members,
            use_base_weights=use_base_weights,
            r_mean=1.0,
            r_std=r_std,
            s_mean=1.0,
            s_std=s_std,
            init=init,
            norms=norms,
            likelihood=likelihood,
        )
    # the prior's numbers in float64, cast to each site's dtype by bayesian(): a float64
    # network's prior is Normal(1, prior_scale) itself, not float32's rounding of it
    one, spread = torch.tensor([1.0, scale], dtype=torch.float64)
    return BayesianNetwork(
        ensemble,
        prior=dist.Normal(one, spread),
        likelihood=ensemble.likelihood,
        num_data=num_data,
    )
