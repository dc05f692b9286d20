"""mcmc()'s warning after sampling (pyrouq._mcmc_health): divergences, draws at max_tree_depth
and an R-hat of lp above 1.01 told once, with their figures; a healthy run told nothing; the
R-hat and bulk ESS those figures come from against arviz's own."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from unittest import mock

import arviz as az
import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq._mcmc_health import RHAT_BOUND, TREE_DEPTH_SHARE, bulk_ess, rank_rhat, trouble
from pyrouq.likelihoods import Gaussian

QUIET = {"progress": False, "parallel": False}


def _slope():
    """One weight, y = 0.5 x + noise 0.3 on 30 points: a posterior NUTS mixes well (sd ~0.05)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, generator=gen)
    y = 0.5 * x[:, 0] + 0.3 * torch.randn(30, generator=gen)
    model = pyrouq.bayesian(nn.Linear(1, 1, bias=False), likelihood=Gaussian(0.3), prior=1.0)
    return model, x, y


def _told(*args, **kwargs):
    """mcmc()'s result and the one warning it gave."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = pyrouq.mcmc(*args, **kwargs, **QUIET)
    told = [w for w in record if str(w.message).startswith("mcmc(): the chain")]
    assert len(told) == 1, [str(w.message) for w in record]
    assert told[0].filename == __file__  # the caller's line
    return result, str(told[0].message)


def test_a_healthy_run_is_told_nothing():
    model, x, y = _slope()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = pyrouq.mcmc(model, x, y, 150, 50, 2, seed=14, **QUIET)
    stats = result.sample_stats
    # healthy by every figure the warning reads: no divergence, trajectories of 1-3 doublings,
    # and the chains' lp in agreement (az.rhat's figure, here well below 1.01)
    assert result.divergences == 0
    assert int(stats["tree_depth"].max()) <= 3
    assert float(az.rhat(stats["lp"].numpy())) < 1.005


def test_draws_at_max_tree_depth_are_told_with_their_share_and_cost():
    model, x, y = _slope()
    result, message = _told(model, x, y, 20, 10, 1, seed=0, max_tree_depth=1)
    assert (result.sample_stats["tree_depth"] == 1).all()
    assert message.startswith("mcmc(): the chain may not have sampled the posterior. 20 of ")
    assert "20 of 20 draws (100 %) reached max_tree_depth=1 (1 gradient a draw)" in message
    assert "Raise max_tree_depth (each level doubles the cost of a draw)" in message
    assert "diverged" not in message and "R-hat" not in message  # one chain: no R-hat


def test_divergences_are_told_with_their_number_share_and_the_warm_up_to_lengthen():
    model, x, y = _slope()
    # 20 warm-up steps leave this chain a step size of 1.4, some 25 posterior sds
    result, message = _told(model, x, y, 20, 20, 1, seed=1)
    assert result.divergences == 20
    assert "20 of 20 draws (100 %) diverged: the step size was too large" in message
    assert "Take a longer warm-up (warmup_steps=20 now)" in message
    assert message.endswith("result.sample_stats holds diverging, tree_depth and lp per draw.")


def test_chains_whose_lp_disagrees_are_told_arviz_r_hat_and_bulk_ess():
    model, x, y = _slope()
    result, message = _told(model, x, y, 12, 0, 2, seed=0, max_tree_depth=1)
    lp = result.sample_stats["lp"].numpy()
    rhat, ess = float(az.rhat(lp)), float(az.ess(lp, method="bulk"))
    assert rhat > 1.01
    expected = (
        f"The log density lp has an R-hat of {rhat:.3f} across the 2 chains, above 1.01 "
        f"(bulk ESS {ess:,.0f} of 24 draws): the chains disagree"
    )
    assert expected in message
    assert "which the weights' R-hat (pyrouq.summary) counts as disagreeing chains" in message


def _chains(seed, chains, draws, phi, offset, ties):
    """AR(1) chains (coefficient phi), each shifted by offset times a normal draw."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(chains, draws))
    values = np.zeros((chains, draws))
    for t in range(1, draws):
        values[:, t] = phi * values[:, t - 1] + noise[:, t]
    values += offset * rng.normal(size=(chains, 1))
    return np.round(values, 1) if ties else values


@pytest.mark.parametrize(
    "seed, chains, draws, phi, offset, ties",
    [
        (0, 2, 150, 0.3, 0.0, False),  # mixed
        (1, 4, 201, 0.9, 0.0, False),  # slow, an odd number of draws
        (2, 3, 60, 0.5, 2.0, False),  # chains apart
        (3, 4, 100, -0.4, 0.0, False),  # anticorrelated: more ESS than draws
        (4, 2, 80, 0.6, 0.5, True),  # ties (rounded values, as a chain that stays put)
        (5, 2, 10, 0.2, 0.0, False),  # the fewest draws given an ESS
    ],
)
def test_rank_rhat_and_bulk_ess_are_arvizs(seed, chains, draws, phi, offset, ties):
    values = _chains(seed, chains, draws, phi, offset, ties)
    tensor = torch.tensor(values)
    assert rank_rhat(tensor) == pytest.approx(float(az.rhat(values)), rel=1e-12)
    assert bulk_ess(tensor) == pytest.approx(float(az.ess(values, method="bulk")), rel=1e-9)


def test_r_hat_and_ess_are_nan_where_they_tell_nothing():
    assert np.isnan(rank_rhat(torch.randn(1, 50)))  # one chain
    assert np.isnan(rank_rhat(torch.randn(2, 3)))  # fewer than 4 draws
    assert np.isnan(rank_rhat(torch.full((2, 10), 1.5)))  # all equal
    assert np.isnan(rank_rhat(torch.tensor([[0.0, 1, 2, float("nan")], [0, 1, 2, 3]])))
    assert np.isnan(bulk_ess(torch.randn(2, 9)))  # halves of 4 draws: no lag to sum


def _stats(depths, chains=1):
    depth = torch.tensor(depths).reshape(chains, -1)
    return {
        "diverging": torch.zeros_like(depth, dtype=torch.bool),
        "tree_depth": depth,
        "lp": torch.randn(depth.shape, generator=torch.Generator().manual_seed(0)),
    }


def test_the_tree_depth_is_told_above_a_tenth_of_the_draws_of_nuts_only():
    assert trouble(_stats([10] * 2 + [4] * 18), "nuts", 10, 100) is None  # 10 %: not above
    told = trouble(_stats([10] * 3 + [4] * 17), "nuts", 10, 100)
    assert told is not None
    assert "3 of 20 draws (15 %) reached max_tree_depth=10 (1,023 gradients a draw)" in told
    # HMC's tree_depth is its number of leapfrog steps, no doubling to cap
    assert trouble(_stats([10] * 20), "hmc", 10, 100) is None


def test_a_small_share_of_divergences_is_given_to_two_figures():
    stats = _stats([3] * 400, chains=2)
    stats["diverging"][1, :3] = True
    told = trouble(stats, "nuts", 10, 500)
    assert told is not None
    assert re.search(r"\. 3 of 400 draws \(0\.75 %\) diverged: ", told), told


def test_the_docs_give_the_bounds_the_check_uses():
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    doc = " ".join((pyrouq.mcmc.__doc__ or "").split())
    share, bound = f"{TREE_DEPTH_SHARE:.0%}".replace("%", " %"), f"{RHAT_BOUND}"
    assert (share, bound) == ("10 %", "1.01")
    assert f"more than {share} of the draws at `max_tree_depth`" in readme
    assert f"an R-hat above {bound} of the log density `lp`" in readme
    assert f"more than {share} of NUTS's draws at ``max_tree_depth``" in doc
    assert f"an R-hat of ``lp`` above {bound} (rank-normalised split R-hat" in doc


@pytest.mark.parametrize(
    "rhat, shown", [(1.0149, "1.015"), (1.0103, "1.0103"), (1.69, "1.690"), (3.176, "3.176")]
)
def test_an_r_hat_just_above_the_bound_is_not_shown_as_the_bound(rhat, shown):
    stats = {"lp": torch.stack([torch.zeros(20), torch.ones(20)])}
    with mock.patch("pyrouq._mcmc_health.rank_rhat", return_value=rhat):
        told = trouble(stats, "nuts", 10, 100)
    assert told is not None
    assert told.startswith(f"mcmc(): the chains may not have sampled the posterior. The log "
                           f"density lp has an R-hat of {shown} across the 2 chains, above 1.01 "
                           "(bulk ESS ")  # fmt: skip
