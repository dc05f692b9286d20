"""Sixth audit of pyrouq.diagnostics: k-hat verdicts at small S against arviz's sample-size
threshold, a guide with every draw outside the model's support, an MCMC export given x= alone,
MCMC draws of a float32 run exported with a float16 model, -inf log-likelihoods, and the chains
of an MCMC export against a hand computation of az.loo and az.waic."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import hand_made_chains
from scipy.special import logsumexp

from pyrouq.diagnostics import psis_diagnostic, to_inference_data

az = pytest.importorskip("arviz")

N = 12


def _regression_model():
    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 0.5), obs=y)

    def guide(x, y):
        pyro.sample("w", dist.Normal(0.3, 0.2))

    return model, guide


def _arviz_good_k(num_samples: int) -> float:
    """az.loo's own threshold for S draws, read off an ELPDData (not recomputed here)."""
    rng = np.random.default_rng(0)
    idata = az.from_dict(
        posterior={"a": rng.normal(size=(1, num_samples))},
        log_likelihood={"obs": rng.normal(size=(1, num_samples, 3))},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(az.loo(idata, reff=1.0).good_k)


@pytest.mark.parametrize(
    ("num_samples", "k"), [(25, 0.45), (25, 0.2), (50, 0.6), (1000, 0.6), (1000, 0.69)]
)
def test_psis_reliability_agrees_with_arviz_at_small_s(monkeypatch, num_samples, k):
    """k-hat 0.45 from 25 draws read "good" and reliable, while az.loo (arviz 0.23) warns from
    min(1 - 1/log10(S), 0.7) = 0.28 on: 25 draws are too few at that k-hat (Vehtari et al.
    2024). The Yao et al. reading stays; reliable and the text follow arviz's threshold."""
    monkeypatch.setattr(az, "psislw", lambda lw, reff: (lw - lw.max(), k))
    model, guide = _regression_model()
    x, y = torch.randn(N, 1), torch.randn(N)
    result = psis_diagnostic(model, guide, x, y, num_samples=num_samples)
    good_k = _arviz_good_k(num_samples)
    assert result.reliable == (k < good_k)
    assert result.interpretation.startswith("good (k-hat" if k < 0.5 else "ok (0.5 <= k-hat"), (
        result.interpretation
    )
    too_few = "too few at this k-hat" in result.interpretation
    assert too_few == (good_k <= k < 0.7), result.interpretation
    if too_few:
        needed = math.floor(10 ** (1 / (1 - k))) + 1  # S > 10^(1/(1-k)) (Vehtari et al. 2024)
        assert f"= {good_k:.2f} " in result.interpretation
        assert f"{needed:,} draws or more" in result.interpretation
        assert "too few" in repr(result)


def test_psis_with_every_guide_draw_outside_the_support_is_a_clear_error():
    """A guide whose draws all lie outside Uniform(0, 1): az.psislw gave NaN smoothed weights
    (numpy's "invalid value" warning) and k-hat inf, read as an ordinary "bad" guide."""

    def model(x, y):
        pyro.sample("z", dist.Uniform(0.0, 1.0))

    def guide(x, y):
        pyro.sample("z", dist.Normal(5.0, 0.1))

    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(
            ValueError,
            match=r"psis_diagnostic\(\): all 100 log importance ratios are -inf \(weight 0\): "
            r"every guide draw lies outside the support of a latent site of the model.*Use a "
            r"guide that draws inside the model's support",
        ):
            psis_diagnostic(model, guide, torch.randn(5, 2), torch.randn(5), num_samples=100)


@pytest.mark.parametrize("validate", [True, False])
def test_a_draw_outside_a_scales_support_weighs_zero_though_the_likelihood_is_nan(validate):
    """A Normal guide for a HalfNormal noise scale: a draw below 0 is outside the site's
    support, weight 0 as the docstring says, but the likelihood it scales, Normal(0, s < 0),
    gave NaN, and -inf + NaN made the ratio NaN: the call refused the guide ("8 of 200 log
    importance ratios are NaN or +inf"). Its log ratio is now -inf, the others as by hand."""
    x, y = torch.randn(2, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = 0.7 * y
    drawn = []

    def model(x, y):
        s = pyro.sample("s", dist.HalfNormal(torch.tensor(1.0, dtype=torch.float64)))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(torch.zeros_like(x), s), obs=y)

    def guide(x, y):
        drawn.append(
            float(pyro.sample("s", dist.Normal(torch.tensor(0.7, dtype=torch.float64), 0.4)))
        )

    with pyro.validation_enabled(validate):
        result = psis_diagnostic(model, guide, x, y, num_samples=200, seed=0)
    s = np.array(drawn)
    inside = s > 0
    assert (~inside).sum() == 8  # (seed 0: eight draws below 0)
    from scipy import stats

    by_hand = np.full(200, -np.inf)
    by_hand[inside] = [
        stats.halfnorm.logpdf(v) + stats.norm(0, v).logpdf(y.numpy()).sum()
        - stats.norm(0.7, 0.4).logpdf(v)
        for v in s[inside]
    ]  # fmt: skip
    np.testing.assert_allclose(result.log_weights.numpy(), by_hand, rtol=1e-12)
    assert result.k_hat == pytest.approx(float(az.psislw(by_hand.copy(), reff=1.0)[1]), rel=1e-9)


def test_a_first_draw_outside_the_support_weighs_zero_under_validation_too():
    """Later draws run without Pyro's validation and a draw outside a latent site's support
    weighs 0; the first runs under it, where the Normal it scales refused it: the same guide
    and seed gave torch's 'Expected parameter scale ... GreaterThan(lower_bound=0.0)' under
    pyro.validation_enabled(True) (Pyro's default) and a k-hat without it. Now the same k-hat."""
    x, y, model, guide = _noise_scale_toy()

    results = []
    for validate in (False, True):
        with pyro.validation_enabled(validate):
            results.append(psis_diagnostic(model, guide, x, y, num_samples=30, seed=4))
    assert results[0].log_weights[0] == -math.inf  # (seed 4: the first draw is below 0)
    assert torch.equal(results[1].log_weights, results[0].log_weights)
    assert results[1].k_hat == results[0].k_hat and math.isfinite(results[1].k_hat)


def test_a_first_draw_outside_the_support_does_not_hide_a_fault_validation_finds():
    """The first draw outside the support, refused under validation, was replayed without it,
    and so were the rest: a fault of the model that only validation finds (a Gamma likelihood
    of negative concentration, whose log density torch computes all the same) went unseen,
    and a k-hat came where the first draw inside the support gives Pyro's refusal. The first
    draw inside it now runs under the caller's validation setting."""
    x, y = torch.rand(2, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def model(x, y):
        s = pyro.sample("s", dist.HalfNormal(torch.tensor(1.0, dtype=torch.float64)))
        with pyro.plate("data", len(x)):  # (the fault: x - 3 < 0)
            pyro.sample("obs", dist.Gamma(x - 3.0, s.expand(len(x))), obs=y + 0.5)

    def guide(x, y):
        pyro.sample("s", dist.Normal(torch.tensor(0.05, dtype=torch.float64), 0.3))

    with pyro.validation_enabled(False):
        unchecked = psis_diagnostic(model, guide, x, y, num_samples=30, seed=4)
    assert unchecked.log_weights[0] == -math.inf  # (seed 4: the first draw is below 0)
    assert torch.isfinite(unchecked.log_weights[1])  # (the second inside: the fault's value)
    with pyro.validation_enabled(True), pytest.raises(ValueError, match="parameter concentration"):
        psis_diagnostic(model, guide, x, y, num_samples=30, seed=4)


@pytest.mark.parametrize("validate", [True, False])
def test_an_export_of_a_guide_drawing_outside_a_sites_support_names_the_draw(validate):
    """Exported, the Normal guide's draw below 0 for the HalfNormal scale failed in torch's
    words, 'normal expects all elements of std >= 0.0' (drawing the predictive obs), or Pyro's
    'Expected parameter scale ... GreaterThan' under validation at the first draw."""
    x, y, model, guide = _noise_scale_toy()

    for seed, draw in ((4, 0), (5, 1)):  # (the first draw below 0: seed 4's first, 5's second)
        with pyro.validation_enabled(validate), pytest.raises(ValueError) as err:
            to_inference_data(model, guide, x, y, num_samples=5, seed=seed)
        assert str(err.value) == (
            f"to_inference_data(): the guide's draw {draw} of site 's' lies outside the support "
            "of model's prior there (GreaterThanEq(lower_bound=0.0)), so the model cannot "
            "produce it, nor its predictions and log-likelihood. Use a guide that draws inside "
            "the model's support: pyro.infer.autoguide.AutoNormal(model) transforms to it."
        )


def _hand_made_chains(num_chains=2, num_draws=4):
    return hand_made_chains(N, num_chains, num_draws)


def _hand_log_lik(result, x, y):
    """log N(y_n; w_s . x_n + b_s, 0.5) in float64, (chain, draw, N)."""
    w = result.samples["weight"][..., 0, :].double()
    b = result.samples["bias"][..., 0].double()
    loc = torch.einsum("cdk,nk->cdn", w, x.double()) + b[..., None]
    return torch.distributions.Normal(loc, 0.5).log_prob(y.double()).numpy()


def test_an_mcmc_export_given_x_alone_names_result_y():
    """to_inference_data(result, x=x_new) said "x with 5 ... and y with 12", naming no
    result.y, whose length it was."""
    result, x, y = _hand_made_chains()
    with pytest.raises(
        ValueError,
        match=r"to_inference_data\(\): x= holds 5 points, but result\.y, the targets the chains "
        r"ran on, holds 12: x= replaces result\.x alone\. Pass y= too.*"
        r"to_inference_data\(result, x=x, y=y\)",
    ):
        to_inference_data(result, x=torch.randn(5, 2))
    with pytest.raises(
        ValueError,
        match=r"y= holds 3 points, but result\.x, the inputs the chains ran on, holds 12",
    ):
        to_inference_data(result, y=torch.randn(3))
    idata = to_inference_data(result, x=x[:5], y=y[:5])  # both given: the new data
    assert idata.log_likelihood["obs"].shape == (2, 4, 5)


@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float16, 3e-3), (torch.bfloat16, 3e-2)])
def test_a_float32_runs_draws_export_with_a_half_precision_model(dtype, rtol):
    """mcmc() refuses a float16 model and says to sample a float32 copy; exporting those
    draws with the float16 model (result.model = model) failed in F.linear: "mat1 and mat2
    must have the same dtype, but got Half and Float". The draws now run in the model's dtype,
    as in predict(), and the posterior group keeps them as they came."""
    result, x, y = _hand_made_chains()
    expected = _hand_log_lik(result, x, y)
    result.model = copy.deepcopy(result.model).to(dtype)
    idata = to_inference_data(result)
    np.testing.assert_array_equal(idata.posterior["weight"].values, result.samples["weight"])
    assert idata.posterior["weight"].dtype == np.float32
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, expected, rtol=rtol, atol=0.1)


def test_a_minus_inf_log_likelihood_warns_that_loo_will_be_nan():
    """A draw that gives an observed count probability 0 (Poisson rate 0) has log-likelihood
    -inf there: az.loo and az.waic return NaN, and the export said nothing (it warned of NaN
    and +inf alone)."""

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Poisson(torch.relu(w) * x[:, 0]), obs=y)

    def guide(x, y):
        pyro.sample("w", dist.Normal(0.5, 1.0))

    pyro.set_rng_seed(0)
    with pytest.warns(
        RuntimeWarning,
        match=r"log-likelihood is -inf at \d+ of 100 entries, in draws \[.*az\.loo and az\.waic "
        r"will return NaN\. Those draws give the observed points probability 0",
    ) as record:
        idata = to_inference_data(model, guide, torch.ones(5, 1), torch.ones(5), num_samples=20)
    assert {w.filename for w in record if "-inf at" in str(w.message)} == {__file__}  # here
    log_lik = idata.log_likelihood["obs"].values[0]
    assert np.isneginf(log_lik).any() and not np.isnan(log_lik).any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert math.isnan(az.loo(idata).elpd_loo) and math.isnan(az.waic(idata).elpd_waic)


def test_mcmc_chains_stay_apart_and_loo_waic_match_a_hand_computation():
    """Three chains of five draws: each group keeps (chain, draw) as mcmc() laid them out, and
    az.loo / az.waic on the export equal numpy's PSIS-LOO and WAIC of log p(y | theta)."""
    result, x, y = _hand_made_chains(num_chains=3, num_draws=5)
    idata = to_inference_data(result)
    log_lik = _hand_log_lik(result, x, y)  # (3, 5, N)
    assert idata.log_likelihood["obs"].dims == ("chain", "draw", "obs_id")
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, log_lik, rtol=1e-5)
    np.testing.assert_array_equal(idata.posterior["bias"].values, result.samples["bias"])
    np.testing.assert_array_equal(
        idata.sample_stats["energy"].values, np.arange(15.0).reshape(3, 5)
    )
    assert idata.posterior_predictive["obs"].shape == (3, 5, N)
    assert idata.observed_data["obs"].dims == ("obs_id",)
    flat = log_lik.reshape(15, N)
    smoothed, _ = az.psislw(-flat.T.copy(), reff=1.0)  # (N, S), normalised
    elpd_loo = logsumexp(smoothed + flat.T, axis=1).sum()
    lppd = logsumexp(flat, axis=0) - np.log(15)
    elpd_waic = (lppd - flat.var(axis=0)).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(idata, reff=1.0)
        waic = az.waic(idata)
    assert loo.elpd_loo == pytest.approx(elpd_loo, rel=1e-5)
    assert waic.elpd_waic == pytest.approx(elpd_waic, rel=1e-5)


def test_an_export_does_not_refuse_a_draw_outside_a_masked_sites_support():
    # a latent site a mask leaves out may lie anywhere (its support is not checked, as for
    # the PSIS check): the guide's draws of it below 0 are exported, not refused
    x, y = torch.randn(2, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    one = torch.tensor(1.0, dtype=torch.float64)

    def model(x, y):
        with pyro.poutine.mask(mask=False):
            pyro.sample("t", dist.HalfNormal(one))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(torch.zeros_like(x), one), obs=y)

    def guide(x, y):
        pyro.sample("t", dist.Normal(-one, 0.1))

    data = to_inference_data(model, guide, x, y, num_samples=3, seed=0)
    assert (data.posterior["t"].values < 0).all() and data.posterior["t"].shape == (1, 3)


def _noise_scale_toy():
    """20 points of N(0, s) data, s ~ HalfNormal(1), and a Normal guide on s that draws below
    0 (outside the support) now and then: (x, y, model, guide), float64."""
    x, y = torch.randn(2, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def model(x, y):
        s = pyro.sample("s", dist.HalfNormal(torch.tensor(1.0, dtype=torch.float64)))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(torch.zeros_like(x), s), obs=y)

    def guide(x, y):
        pyro.sample("s", dist.Normal(torch.tensor(0.3, dtype=torch.float64), 0.5))

    return x, y, model, guide
