"""mcmc() and its arviz export against independent references: the closed-form posterior of a
Bayesian linear regression (mean and full covariance), arviz's own R-hat / ESS on the raw draws,
hand log-likelihoods, PSIS-LOO and WAIC by numpy, predict() as a hand loop over the draws, and
the PSIS log importance ratios of a guide by hand (Jacobian of a positive site included)."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import tiny_mlp, toy_data
from scipy.special import logsumexp
from torch import nn

import pyrouq
from pyrouq.likelihoods import Gaussian

N, SIGMA, TAU = 25, 0.5, 1.0


def _regression_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=gen)
    y = x @ torch.tensor([1.0, -0.5]) + 0.3 + SIGMA * torch.randn(N, generator=gen)
    return x, y


def _closed_form(x, y):
    """Posterior mean and covariance of (w1, w2, b): Normal(0, TAU) priors, noise SIGMA."""
    a = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    precision = a.T @ a / SIGMA**2 + torch.eye(3, dtype=torch.float64) / TAU**2
    cov = torch.linalg.inv(precision)
    return cov @ a.T @ y.double() / SIGMA**2, cov


@pytest.fixture(scope="module")
def run():
    x, y = _regression_data()
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=Gaussian(SIGMA), prior=TAU)
    result = pyrouq.mcmc(model, x, y, 150, 50, 2, seed=3, progress=False, parallel=False)
    return model, x, y, result


def _flat(result):
    draws = result.draws()
    return torch.cat([draws["weight"].reshape(-1, 2), draws["bias"].reshape(-1, 1)], 1).double()


def _hand_log_lik(result, x, y):
    """log Normal(y_n | x_n w_cd + b_cd, SIGMA), (chain, draw, N), float64."""
    w, b = result.samples["weight"].double(), result.samples["bias"].double()
    mu = torch.einsum("nd,cskd->csnk", x.double(), w)[..., 0] + b
    return torch.distributions.Normal(mu, SIGMA).log_prob(y.double()).numpy()


def test_two_chains_match_the_closed_form_mean_and_covariance(run):
    _, x, y, result = run
    mean, cov = _closed_form(x, y)
    got = _flat(result)
    sd = cov.diagonal().sqrt()
    # 300 draws (ESS ~ 250): the mean within 0.25 posterior sd (~5 MCSE), variances within
    # 30 %, correlations within 0.2 (~4 standard errors)
    assert ((got.mean(0) - mean).abs() < 0.25 * sd).all(), (got.mean(0), mean)
    sample_cov = torch.cov(got.T)
    assert ((sample_cov.diagonal() / cov.diagonal() - 1).abs() < 0.3).all()
    corr = cov / torch.outer(sd, sd)
    sample_corr = sample_cov / torch.outer(
        sample_cov.diagonal().sqrt(), sample_cov.diagonal().sqrt()
    )
    assert (sample_corr - corr).abs().max() < 0.2, (sample_corr, corr)
    assert result.num_chains == 2 and result.num_samples == 150
    assert not torch.equal(result.samples["bias"][0], result.samples["bias"][1])


def test_export_keeps_the_chains_and_its_log_likelihood_loo_and_waic_are_the_hand_ones(run):
    _, x, y, result = run
    idata = pyrouq.to_inference_data(result)
    assert set(idata.groups()) == {
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "sample_stats",
        "observed_data",
    }
    assert idata.posterior["weight"].dims == ("chain", "draw", "out", "in")
    assert idata.posterior["weight"].shape == (2, 150, 1, 2)
    np.testing.assert_array_equal(idata.posterior.chain.values, [0, 1])
    np.testing.assert_array_equal(idata.posterior["bias"].values, result.samples["bias"].numpy())
    assert idata.posterior_predictive["obs"].dims == ("chain", "draw", "obs_id")
    assert idata.posterior_predictive["loc"].dims == ("chain", "draw", "obs_id", "output")
    for name in ("diverging", "step_size", "tree_depth", "energy"):
        assert idata.sample_stats[name].dims == ("chain", "draw")
        np.testing.assert_array_equal(
            idata.sample_stats[name].values, result.sample_stats[name].numpy()
        )
    np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
    log_lik = _hand_log_lik(result, x, y)
    assert idata.log_likelihood["obs"].dtype == np.float64
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, log_lik, rtol=1e-5, atol=1e-5)

    flat = log_lik.reshape(-1, N)  # (S, N)
    s = flat.shape[0]
    lppd = logsumexp(flat, axis=0) - np.log(s)
    elpd_waic = (lppd - flat.var(axis=0)).sum()  # (arviz's p_waic: the variance over S)
    smoothed, _ = az.psislw(-flat.T.copy(), reff=1.0)
    elpd_loo = logsumexp(smoothed + flat.T, axis=1).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert az.waic(idata).elpd_waic == pytest.approx(elpd_waic, rel=1e-6)
        assert az.loo(idata, reff=1.0).elpd_loo == pytest.approx(elpd_loo, rel=1e-6)


def test_summary_r_hat_and_ess_are_arvizs_on_the_raw_draws(run):
    _, _, _, result = run
    table = pyrouq.summary(pyrouq.to_inference_data(result))
    assert list(table.columns) == [
        "mean", "sd", "hdi_3%", "hdi_97%", "mcse_mean", "mcse_sd", "ess_bulk", "ess_tail",
        "r_hat",
    ]  # fmt: skip
    raw = result.samples["weight"].numpy()[..., 0, 1]  # (chain, draw), straight from mcmc()
    row = table.loc["weight[0, 1]"]
    assert row["r_hat"] == pytest.approx(float(az.rhat(raw)), abs=0.006)  # (rounded to 2)
    assert row["ess_bulk"] == pytest.approx(float(az.ess(raw, method="bulk")), abs=0.6)
    assert row["ess_tail"] == pytest.approx(float(az.ess(raw, method="tail")), abs=0.6)
    assert row["mean"] == pytest.approx(float(raw.mean()), abs=6e-4)


def test_predict_on_mcmc_draws_is_a_hand_loop_over_the_draws_chain_after_chain():
    x, y = toy_data(20)
    model = tiny_mlp()
    result = pyrouq.mcmc(model, x, y, 3, 3, 2, seed=1, progress=False, parallel=False)
    preds = pyrouq.predict(model, x, posterior_samples=result)
    hand = []
    for c in range(2):
        for d in range(3):
            w = {k: v[c, d] for k, v in result.samples.items()}
            hidden = torch.relu(x @ w["fc1.weight"].T + w["fc1.bias"])
            hand.append(torch.softmax(hidden @ w["fc2.weight"].T + w["fc2.bias"], -1))
    torch.testing.assert_close(preds.probs, torch.stack(hand), rtol=1e-5, atol=1e-6)
    idata = pyrouq.to_inference_data(result)
    labels = torch.stack(hand).reshape(2, 3, 20, 2).double().log()[..., torch.arange(20), y]
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, labels, rtol=1e-5, atol=1e-6)


def test_a_seed_repeats_its_draws_and_another_seed_does_not():
    x, y = _regression_data()
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=Gaussian(SIGMA), prior=TAU)

    def draws(seed):
        return pyrouq.mcmc(model, x, y, 4, 4, 2, seed=seed, progress=False, parallel=False)

    first, again, other = draws(10), draws(10), draws(20)
    for site in first.samples:
        torch.testing.assert_close(first.samples[site], again.samples[site], rtol=0, atol=0)
        assert not torch.equal(first.samples[site], other.samples[site])


def test_one_draw_per_chain_without_warmup_exports_chain_by_draw():
    x, y = _regression_data()
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=Gaussian(SIGMA), prior=TAU)
    result = pyrouq.mcmc(model, x, y, 1, 0, 2, seed=0, progress=False, parallel=False)
    assert result.samples["weight"].shape == (2, 1, 1, 2)
    assert all(v.shape == (2, 1) for v in result.sample_stats.values())
    idata = pyrouq.to_inference_data(result)
    assert idata.log_likelihood["obs"].shape == (2, 1, N)
    np.testing.assert_allclose(
        idata.log_likelihood["obs"].values, _hand_log_lik(result, x, y), rtol=1e-5, atol=1e-5
    )
    single = pyrouq.mcmc(model, x, y, 1, 0, 1, seed=0, progress=False, parallel=False)
    with pytest.warns(UserWarning, match=r"one draw exported \(S = 1\): az\.loo fails"):
        pyrouq.to_inference_data(single)


def test_psis_log_weights_of_a_latent_noise_guide_are_the_hand_log_joint_minus_log_q():
    """log p(w, sigma, D) - log q(w, sigma), q's LogNormal density of sigma (the Jacobian of
    its log transform included); k-hat is az.psislw's of the same ratios."""
    x, y = _regression_data()
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=Gaussian(dist.HalfNormal(1.0)), prior=TAU)
    guide = pyrouq.mean_field_guide(model, init_scale=0.1)
    guide(x, y)
    result = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=40, seed=7)
    pyro.set_rng_seed(7)  # the diagnostic's draws: guide draws in a stream seeded with 7
    hand = []
    for _ in range(40):
        d = {k: v.double() for k, v in guide.sample().items()}
        w, b, sigma = d["weight"], d["bias"], d["sigma"]
        log_p = (
            dist.Normal(0.0, TAU).log_prob(w).sum()
            + dist.Normal(0.0, TAU).log_prob(b).sum()
            + dist.HalfNormal(1.0).log_prob(sigma).sum()
            + dist.Normal((x.double() @ w.T)[:, 0] + b, sigma).log_prob(y.double()).sum()
        )
        q = guide.get_distributions()
        log_q = sum(q[k].log_prob(d[k].to(q[k].mean.dtype)).double() for k in d)
        hand.append(float((log_p - log_q).detach()))
    hand_t = torch.tensor(hand, dtype=torch.float64)
    torch.testing.assert_close(result.log_weights, hand_t, rtol=1e-5, atol=1e-4)
    _, k_hat = az.psislw(hand_t.numpy().copy(), reff=1.0)
    assert result.k_hat == pytest.approx(float(k_hat), abs=1e-3)


def test_guide_draws_export_one_chain_and_summarise_as_arviz_stats():
    x, y = toy_data(20)
    model = tiny_mlp()
    guide = pyrouq.mean_field_guide(model, init_scale=0.1)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=12, seed=2)
    assert idata.posterior["fc1.weight"].shape == (1, 12, 20, 3)
    assert "sample_stats" not in idata.groups()
    table = pyrouq.summary(idata, "fc2.bias")
    assert table.equals(az.summary(idata, var_names=["fc2.bias"], kind="stats"))


def test_a_function_model_without_obs_is_named_by_its_own_name():
    """The export's refusal names a function model by its name, not "function"."""
    from pyro.infer.autoguide import AutoNormal

    def my_regression(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("y", dist.Normal(w * x[:, 0], 1.0), obs=y)

    x, y = torch.randn(6, 1), torch.randn(6)
    guide = AutoNormal(my_regression)
    guide(x, y)
    with pytest.raises(ValueError, match="my_regression has no observed site 'obs'"):
        pyrouq.to_inference_data(my_regression, guide, x, y, num_samples=2)


def test_a_function_models_export_and_psis_name_it_by_its_own_name():
    """The export records a function model's own name, and psis_diagnostic() names it."""
    from pyro.infer.autoguide import AutoNormal

    def my_classifier(x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, 3), 1.0).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)

    x, y = torch.randn(6, 2), torch.randint(0, 3, (6,))
    guide = AutoNormal(my_classifier)
    guide(x, y)
    idata = pyrouq.to_inference_data(my_classifier, guide, x, y, num_samples=2)
    assert idata.posterior.attrs["model"] == "my_classifier"

    def no_latents(x, y=None):
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=torch.zeros(x.shape[0], 3)), obs=y)

    with pytest.raises(ValueError, match="no_latents has no latent sites"):
        pyrouq.psis_diagnostic(no_latents, lambda x, y=None: None, x, y, num_samples=25)
