"""What :func:`pyrouq.mcmc` tells after sampling (private): divergent transitions, draws whose
trajectory reached ``max_tree_depth``, and chains whose log density ``lp`` has not mixed
(rank-normalised split R-hat above :data:`RHAT_BOUND`), read off the run's sampler statistics
in one warning; nothing on a run that shows none of them.

The R-hat and bulk ESS are those of Vehtari et al. (2021, "Rank-normalization, folding, and
localization: an improved R-hat"), as ``az.rhat`` and ``az.ess`` compute them, here in torch:
arviz's import would cost more than a small run's sampling. They are computed on ``lp``, the
log joint (plus the transforms' log-Jacobian), which a network's symmetries (hidden units
swapped, signs flipped) leave unchanged: the weights' R-hat counts those copies of one mode
as chains that disagree."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["RHAT_BOUND", "TREE_DEPTH_SHARE", "bulk_ess", "rank_rhat", "trouble"]

#: Above this R-hat of ``lp``, the chains are told that they have not mixed (Vehtari et al.).
RHAT_BOUND = 1.01

#: Above this share of the draws at ``max_tree_depth``, the run is told so.
TREE_DEPTH_SHARE = 0.1


def _split(values: Tensor) -> Tensor:
    """(chain, draw) -> (2 chain, draw // 2): each chain's first and last halves (the middle
    draw of an odd number left out)."""
    half = values.shape[1] // 2
    return torch.cat([values[:, :half], values[:, values.shape[1] - half :]])


def _normal_scores(values: Tensor) -> Tensor:
    """The values replaced by the normal quantiles of their ranks over the whole array (ties
    given their average rank; Blom's offset 3/8)."""
    flat = values.reshape(-1)
    _, inverse, counts = torch.unique(flat, sorted=True, return_inverse=True, return_counts=True)
    last = torch.cumsum(counts, 0).to(torch.float64)  # each distinct value's last rank
    ranks = (last - (counts - 1) / 2)[inverse]
    scores = torch.special.ndtri((ranks - 3 / 8) / (flat.numel() + 1 / 4))
    return scores.reshape(values.shape)


def _median(values: Tensor) -> Tensor:
    """The median of all the values, of an even number the mean of the middle two (as numpy
    rounds it: the two then fold onto one value, a tie)."""
    ordered = values.reshape(-1).sort().values
    middle = ordered.numel() // 2
    if ordered.numel() % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _rhat(values: Tensor) -> float:
    """Gelman and Rubin's potential scale reduction of (chain, draw) values."""
    draws = values.shape[1]
    within = values.var(1).mean()
    between = draws * values.mean(1).var()
    return math.sqrt(float((between / within + draws - 1) / draws))


def rank_rhat(values: Tensor) -> float:
    """The rank-normalised split R-hat of (chain, draw) values, the larger of the bulk's and
    the tails' (the values folded about their median): ``az.rhat``'s. NaN with fewer than 2
    chains or 4 draws, or values not all finite or all equal."""
    values = values.detach().to(torch.float64)
    if values.shape[0] < 2 or values.shape[1] < 4 or not bool(values.isfinite().all()):
        return math.nan
    if bool((values == values.reshape(-1)[0]).all()):
        return math.nan
    split = _split(values)
    folded = (split - _median(split)).abs()
    return max(_rhat(_normal_scores(split)), _rhat(_normal_scores(folded)))


def bulk_ess(values: Tensor) -> float:
    """The bulk effective sample size of (chain, draw) values: ``az.ess``'s ``"bulk"``, the
    effective size of the normal scores of the split chains. NaN with fewer than 10 draws a
    chain, whose halves have no autocorrelations to sum (arviz gives draws * log10(draws)
    there, its bound), or values not all finite."""
    values = values.detach().to(torch.float64)
    if values.shape[1] < 10 or not bool(values.isfinite().all()):
        return math.nan
    return _ess(_normal_scores(_split(values)))


def _ess(values: Tensor) -> float:
    """The effective sample size of (chain, draw) values by the Stan reference manual's
    estimator: autocorrelations from the chains' autocovariances and the between-chain
    variance, summed in pairs up to the first pair that is not positive (Geyer's initial
    positive sequence), the pairs made non-increasing (his initial monotone sequence), the
    next even lag added where positive, and the result at most draws * log10(draws)."""
    chains, draws = values.shape
    size = chains * draws
    if float(values.max() - values.min()) < 1e-15:
        return float(size)
    centred = values - values.mean(1, keepdim=True)
    spectrum = torch.fft.rfft(centred, n=2 * draws)
    autocov = torch.fft.irfft(spectrum.abs() ** 2, n=2 * draws)[:, :draws] / draws
    within = autocov[:, 0].mean() * draws / (draws - 1)
    spread = within * (draws - 1) / draws
    if chains > 1:
        spread = spread + values.mean(1).var()
    rho = 1 - (within - autocov.mean(0)) / spread
    rho[0] = 1.0
    last = (draws - 3) // 2  # the last pair of lags (2k, 2k + 1) looked at
    pairs = rho[: 2 * last + 2].reshape(-1, 2).sum(1)  # pairs[k] = rho[2k] + rho[2k + 1]
    ended = (pairs[1:] <= 0).nonzero()
    end = int(ended[0]) + 1 if len(ended) else last  # the pair the sum stops at (left out)
    kept = torch.cummin(pairs[:end], 0).values
    extra = float(rho[2 * end]) if end > 0 else 1.0
    tau = -1 + 2 * float(kept.sum()) + max(extra, 0.0)
    return size / max(tau, 1 / math.log10(size))


def trouble(
    stats: dict[str, Tensor], kernel: str, max_tree_depth: int, warmup_steps: int
) -> str | None:
    """The warning for a run with these sampler statistics ((chain, draw) tensors), or None
    where they show no divergence, at most :data:`TREE_DEPTH_SHARE` of NUTS's draws at
    ``max_tree_depth``, and (with 2 chains or more) an R-hat of ``lp`` within
    :data:`RHAT_BOUND`: a sentence for each finding, what it means and what to do."""
    found: list[str] = []
    diverging = stats.get("diverging")
    if diverging is not None and bool(diverging.any()):
        found.append(
            f"{_share(int(diverging.sum()), int(diverging.numel()))} diverged: the step size "
            "was too large for the posterior's curvature there, and the draws near a "
            f"divergence are biased. Take a longer warm-up (warmup_steps={warmup_steps} now), "
            "which adapts the step size, or give the posterior a gentler shape: standardise x "
            "and y (pyrouq.Standardizer), and fit the priors and the noise scale to them."
        )
    depth = stats.get("tree_depth")
    if kernel == "nuts" and depth is not None and depth.numel():
        count = int((depth >= max_tree_depth).sum())
        if count > TREE_DEPTH_SHARE * depth.numel():
            steps = 2**max_tree_depth - 1
            found.append(
                f"{_share(count, int(depth.numel()))} reached max_tree_depth={max_tree_depth} "
                f"({steps:,} gradient{'s' if steps > 1 else ''} a draw): NUTS stopped their "
                "trajectories before they turned back, so the chains explore slowly. Raise "
                "max_tree_depth (each level doubles the cost of a draw), or take a longer "
                "warm-up, whose adapted mass matrix shortens the trajectories."
            )
    lp = stats.get("lp")
    if lp is not None and lp.dim() == 2 and lp.shape[0] >= 2:
        rhat = rank_rhat(lp)
        if rhat > RHAT_BOUND:
            ess = bulk_ess(lp)
            told = f" (bulk ESS {ess:,.0f} of {lp.numel():,} draws)" if math.isfinite(ess) else ""
            found.append(
                f"The log density lp has an R-hat of {_above(rhat)} across the {lp.shape[0]} "
                f"chains, above {RHAT_BOUND}{told}: the chains disagree, in regions of "
                "different density or too short to tell. Run longer chains (more "
                "warmup_steps and num_samples). lp is the same at a network's symmetric "
                "copies of one mode (hidden units swapped), which the weights' R-hat "
                "(pyrouq.summary) counts as disagreeing chains."
            )
    if not found:
        return None
    one = diverging is not None and diverging.dim() == 2 and diverging.shape[0] == 1
    return (
        f"mcmc(): the {'chain' if one else 'chains'} may not have sampled the posterior. "
        + " ".join(found)
        + " result.sample_stats holds diverging, tree_depth and lp per draw."
    )


def _above(rhat: float) -> str:
    """R-hat to 3 decimals, or 4 where 3 would read as the bound itself (1.0103: 1.010)."""
    text = f"{rhat:.3f}"
    return f"{rhat:.4f}" if float(text) <= RHAT_BOUND else text


def _share(count: int, size: int) -> str:
    """'12 of 400 draws (3 %)': the percentage whole from 10 %, else to 2 significant figures."""
    percent = 100 * count / size
    return (
        f"{count:,} of {size:,} draws ({percent:.0f} %)"
        if percent >= 10
        else (f"{count:,} of {size:,} draws ({percent:.2g} %)")
    )
