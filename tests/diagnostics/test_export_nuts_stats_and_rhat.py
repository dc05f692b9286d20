"""Audit 12 of the diagnostics and the arviz export: NUTS's sample stats against Pyro's own
MCMC run, R-hat against pyro.ops.stats, and the refusals of exports arviz would have got wrong
(a site named as a dim, dropped without a word; an MCMCResult of no draws, or of another
model, told as if it were a guide)."""

from __future__ import annotations

import re
import warnings

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import hand_made_chains, regression_data, regression_model
from pyro.infer import MCMC, NUTS
from pyro.infer.autoguide import AutoNormal
from pyro.infer.mcmc.util import initialize_model
from pyro.ops.stats import split_gelman_rubin

from pyrouq import Gaussian, MCMCResult, bayesian, mcmc, to_inference_data

QUIET = {"progress": False}


def test_nuts_sample_stats_are_pyros_own_divergences_step_size_energy_lp_and_acceptance():
    """Each chain of mcmc() rerun by Pyro's MCMC on the chain's seed: the same draws, the
    divergent transitions at the draws Pyro's diagnostics() lists, the final step size, and an
    energy that is the previous draw's potential energy (Pyro's potential_fn) plus a kinetic
    energy of a momentum drawn afresh, chi-square(d) / 2 with d = 3 latent values; an lp that
    is the draw's own -potential energy, and acceptance probabilities whose mean is Pyro's."""
    x, y = regression_data()
    model = regression_model()
    result = mcmc(model, x, y, 30, 4, 2, seed=5, parallel=False, **QUIET)
    idata = to_inference_data(result)
    for name, value in result.sample_stats.items():
        np.testing.assert_array_equal(idata.sample_stats[name].values, value.numpy())
    assert idata.sample_stats["diverging"].dims == ("chain", "draw")
    model.num_data = len(x)
    model.eval()
    _, potential_fn, transforms, _ = initialize_model(model, model_args=(x, y))
    kinetic, lp = [], []
    means = []  # Pyro's running mean of the acceptance probability, after each step

    def hook(kernel, *_):
        means.append(kernel._mean_accept_prob)

    for chain in range(2):
        pyro.set_rng_seed(5 + chain)
        means.clear()
        run = MCMC(
            NUTS(model, jit_compile=False), 30, warmup_steps=4, disable_progbar=True, hook_fn=hook
        )
        with pyro.validation_enabled(False):
            run.run(x, y)
        # the draws' mean acceptance probability is the one Pyro's progress bar shows ("acc.
        # prob"), each draw's in [0, 1]; lp is the draw's log density, -potential energy
        accept = result.sample_stats["acceptance_rate"][chain]
        assert float(accept.mean()) == pytest.approx(means[-1], rel=1e-12)
        assert 0 <= float(accept.min()) < float(accept.max()) <= 1
        for d in range(30):
            z = {k: transforms[k](v[chain, d]) for k, v in result.samples.items()}
            lp.append(float(result.sample_stats["lp"][chain, d]) + float(potential_fn(z)))
        for site, value in run.get_samples().items():
            assert torch.equal(result.samples[site][chain], value)
        diverged = result.sample_stats["diverging"][chain].nonzero().flatten().tolist()
        assert diverged == run.diagnostics()["divergences"]["chain 0"]
        assert float(result.sample_stats["step_size"][chain, -1]) == run.kernel.step_size
        for d in range(1, 30):
            z = {k: transforms[k](v[chain, d - 1]) for k, v in result.samples.items()}
            kinetic.append(float(result.sample_stats["energy"][chain, d]) - float(potential_fn(z)))
    assert lp == [0.0] * 60  # (identity transforms: the draws are the sampled z)
    assert 0 < result.divergences < 60  # some draws diverged, not all: the check tells
    assert min(kinetic) > 0
    assert 1.5 - 0.6 < np.mean(kinetic) < 1.5 + 0.6  # E[chi2(3) / 2] = 1.5, sd of mean 0.16


def test_rhat_of_the_export_is_pyros_split_gelman_rubin_of_the_raw_draws():
    result, _, _ = hand_made_chains(8, num_chains=3, num_draws=12)
    idata = to_inference_data(result)
    for site, value in result.samples.items():
        np.testing.assert_array_equal(idata.posterior[site].values, value.numpy())
        ours = az.rhat(idata, var_names=[site], method="split")[site].values
        theirs = split_gelman_rubin(value.double(), chain_dim=0, sample_dim=1).numpy()
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert list(idata.posterior.chain.values) == [0, 1, 2]
    assert idata.posterior["weight"].dims == ("chain", "draw", "out", "in")


def _model_with(*sites):
    def model(x, y):
        w = 0.0
        for site in sites:
            w = w + pyro.sample(site, dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Bernoulli(logits=x @ w), obs=y)

    return model


@pytest.mark.parametrize("name", ["chain", "draw"])
def test_a_latent_site_named_as_a_dim_is_refused_not_dropped(name):
    # before: arviz made the site the dim's coordinate, and the posterior lost its draws
    # without a word (with no other site, the posterior group was missing altogether)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 3, generator=g), torch.randint(0, 2, (10,), generator=g).float()
    pyro.clear_param_store()
    model = _model_with(name, "w")
    guide = AutoNormal(model)
    guide(x, y)
    expected = (
        f"to_inference_data(): the latent site(s) ['{name}'] share their name with a dim of the "
        "posterior group"
    )
    with pytest.raises(ValueError, match=re.escape(expected)) as err:
        to_inference_data(model, guide, x, y, 4)
    assert "Rename them in the model, or leave them out with var_names=['w']." in str(err.value)
    idata = to_inference_data(model, guide, x, y, 4, var_names="w")  # the way out it names
    assert list(idata.posterior.data_vars) == ["w"]
    pyro.clear_param_store()
    alone = _model_with(name)
    guide = AutoNormal(alone)
    guide(x, y)
    with pytest.raises(ValueError, match=re.escape(expected)) as err:
        to_inference_data(alone, guide, x, y, 4)
    assert str(err.value).endswith("Rename them in the model.")


def test_a_sample_stat_named_as_a_dim_is_refused_not_dropped():
    result, _, _ = hand_made_chains(6)
    result.sample_stats["draw"] = result.sample_stats.pop("tree_depth")
    with pytest.raises(ValueError) as err:
        to_inference_data(result)
    assert str(err.value).startswith(
        "to_inference_data(): the stats ['draw'] share their name with a dim of the "
        "sample_stats group (chain, draw): arviz makes such a variable that dim's coordinate"
    )
    assert "Rename them in result.sample_stats." in str(err.value)


@pytest.mark.parametrize(("chains", "draws"), [(2, 0), (0, 3)])
def test_an_mcmc_result_of_no_draws_is_a_clear_error(chains, draws):
    # before: torch's "cannot reshape tensor of 0 elements into shape [2, 0, -1]"
    x, y = regression_data()
    samples = {"weight": torch.zeros(chains, draws, 1, 2), "bias": torch.zeros(chains, draws, 1)}
    result = MCMCResult(samples, {}, "nuts", 0, model=regression_model(), x=x, y=y)
    with pytest.raises(ValueError) as err:
        to_inference_data(result)
    assert str(err.value).startswith(
        f"to_inference_data(): result.samples hold {chains} chain(s) of {draws} draw(s) each, "
        "so there are no draws to export. Pass the result of a run that kept draws"
    )


def test_an_mcmc_result_of_another_model_names_the_result_not_a_guide():
    # before: "the guide does not belong to BayesianNetwork ... Pass the guide built for this
    # model (mean_field_guide(model))", for an export that has no guide
    result, _, _ = hand_made_chains(6)
    result.model = bayesian(torch.nn.Linear(3, 1), likelihood=Gaussian(0.5))
    result.x = torch.randn(6, 3)
    with pytest.raises(ValueError) as err:
        to_inference_data(result)
    assert str(err.value) == (
        "to_inference_data(): result.samples do not fit BayesianNetwork: site 'weight' has "
        "shape (1, 2) in result.samples but (1, 3) in the model. Set result.model to the model "
        "the chains ran on (after pyrouq.load, one built as that model was), or export the "
        "result of mcmc() on this model."
    )


def test_a_noise_scale_draw_of_an_mcmc_result_is_named_as_the_results():
    result, _, _ = hand_made_chains(6)
    result.model = bayesian(torch.nn.Linear(2, 1), likelihood=Gaussian(dist.HalfNormal(1.0)))
    result.samples["sigma"] = -torch.ones(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"the draws of 'sigma' from result\.samples must"):
            to_inference_data(result)


def test_an_mcmc_result_without_sample_stats_has_a_repr_and_says_it_counts_no_divergences():
    # before: repr() and .divergences raised KeyError('diverging') for a result that save(),
    # load() and to_inference_data() all take
    result = MCMCResult({"w": torch.zeros(2, 3)}, {}, "nuts", 0)
    assert repr(result) == "MCMCResult(kernel='nuts', chains=2, draws=3, sites=1)"
    with pytest.raises(ValueError, match=re.escape("its sample_stats hold [], no 'diverging'")):
        result.divergences  # noqa: B018
    result, _, _ = hand_made_chains(6)
    result.sample_stats["diverging"][1, 2] = True
    assert repr(result) == "MCMCResult(kernel='nuts', chains=2, draws=4, sites=2, divergences=1)"
