"""Eighth audit of pyrouq.diagnostics: exports against independent references (arviz's own
from_pyro of a Pyro NUTS run, forward passes by hand for guide draws, Gaussian likelihoods and
BatchEnsemble members, numpy's PSIS-LOO and p_loo), and bad inputs that met torch's errors or
were exported wrong without a word: MCMCResults whose sites disagree on (chain, draw), NaN
draws, a diverged guide, outputs that overflow, labels outside a Pyro model's Categorical, a
single draw."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import PyroClassifier, hand_made_chains, regression_data, regression_model
from pyro.infer.autoguide import AutoNormal
from scipy.special import logsumexp

import pyrouq
from pyrouq.diagnostics import psis_diagnostic, summary, to_inference_data
from pyrouq.infer import mean_field_guide
from pyrouq.models import BayesianMLP

az = pytest.importorskip("arviz")

N = 10
F64 = torch.float64


def _classification(n=N, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, classes, (n,), generator=g)


def _hand_made_result(num_chains=2, num_draws=4):
    """A Bayesian linear regression (noise 0.5) and chains of its weights, as mcmc() returns
    them, without a sampler."""
    return hand_made_chains(N, num_chains, num_draws)[0]


# --------------------------------------------------------------------------------------------
# Against independent references
# --------------------------------------------------------------------------------------------


def test_an_mcmc_export_equals_arviz_from_pyro_of_the_same_chains(monkeypatch):
    """Three chains of Pyro's own NUTS on a pyrouq regression: az.from_pyro (arviz's
    reference exporter) and to_inference_data of the same draws as an MCMCResult agree on the
    posterior, chain by chain, on the pointwise log-likelihood, and so on az.loo, az.rhat,
    az.ess and the summary."""
    from pyro.infer.mcmc import api

    monkeypatch.setattr(api.mp, "cpu_count", lambda: 1)  # the chains one after another
    x, y = regression_data()
    model = regression_model()
    model.num_data = len(x)
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Chains will be drawn sequentially"
        kernel = pyro.infer.NUTS(model)
        run = pyro.infer.MCMC(kernel, 8, warmup_steps=8, num_chains=3, disable_progbar=True)
        run.run(x, y)
    reference = az.from_pyro(run, log_likelihood=True)
    samples = run.get_samples(group_by_chain=True)
    shape = (3, 8)
    stats = {
        "diverging": torch.zeros(shape, dtype=torch.bool),
        "step_size": torch.ones(shape, dtype=F64),
        "tree_depth": torch.ones(shape, dtype=torch.long),
        "energy": torch.zeros(shape, dtype=F64),
    }
    result = pyrouq.MCMCResult(dict(samples), stats, "nuts", 8, model=model, x=x, y=y)
    ours = to_inference_data(result)
    for site in ("weight", "bias"):
        assert ours.posterior[site].shape[:2] == (3, 8)
        np.testing.assert_array_equal(ours.posterior[site].values, reference.posterior[site])
    np.testing.assert_allclose(
        ours.log_likelihood["obs"].values, reference.log_likelihood["obs"].values, atol=1e-5
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo, ref_loo = az.loo(ours), az.loo(reference, var_name="obs")
        np.testing.assert_allclose(float(loo.elpd_loo), float(ref_loo.elpd_loo), rtol=1e-6)
        np.testing.assert_allclose(float(loo.p_loo), float(ref_loo.p_loo), rtol=1e-4)
        for stat in (az.rhat, az.ess):
            np.testing.assert_allclose(stat(ours)["weight"], stat(reference)["weight"])
        table = summary(ours)
        expected = az.summary(reference, var_names=["weight", "bias"])
    assert "r_hat" in table.columns  # MCMC chains: the diagnostics columns too
    np.testing.assert_allclose(table.loc[expected.index].values, expected.values)


def test_guide_draws_log_likelihood_is_categorical_log_prob_of_a_hand_forward_pass():
    """Every draw of the posterior group, run through the MLP by hand: the log-likelihood
    group is Categorical(logits).log_prob(y), probs its softmax; az.loo's elpd_loo and p_loo
    are numpy's PSIS-LOO on it."""
    x, y = _classification()
    pyro.set_rng_seed(0)
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    guide = mean_field_guide(model, init_scale=0.3)
    idata = to_inference_data(model, guide, x, y, num_samples=30)
    post = {k: torch.as_tensor(v.values[0]).double() for k, v in idata.posterior.items()}
    hidden = torch.relu(
        torch.einsum("shi,ni->snh", post["fc1.weight"], x.double()) + post["fc1.bias"][:, None]
    )
    logits = torch.einsum("sch,snh->snc", post["fc2.weight"], hidden) + post["fc2.bias"][:, None]
    expected = torch.distributions.Categorical(logits=logits).log_prob(y).numpy()
    log_lik = idata.log_likelihood["obs"].values[0]
    np.testing.assert_allclose(log_lik, expected, atol=1e-5)
    np.testing.assert_allclose(
        idata.posterior_predictive["probs"].values[0], logits.softmax(-1).numpy(), atol=1e-6
    )
    smoothed, _ = az.psislw(-log_lik.T.copy(), reff=1.0)
    elpd_i = logsumexp(smoothed + log_lik.T, axis=1)
    lppd_i = logsumexp(log_lik, axis=0) - np.log(30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(idata)
    assert float(loo.elpd_loo) == pytest.approx(elpd_i.sum(), rel=1e-9)
    assert float(loo.p_loo) == pytest.approx((lppd_i - elpd_i).sum(), rel=1e-6)


@pytest.mark.parametrize("noise", ["fixed", "learned", "latent", "heteroscedastic"])
def test_gaussian_exports_are_normal_log_probs_of_a_hand_forward_pass(noise):
    """log p(y_n | w_s) = sum over the D = 2 outputs of Normal(loc, scale).log_prob(y), with
    loc and scale from the posterior group by hand: a known noise (0.4), a learned one
    (softplus of its parameter), a latent sigma (the posterior's draws) and a
    heteroscedastic one (1e-3 + softplus of the second half of the outputs)."""
    likelihoods = {
        "fixed": pyrouq.Gaussian(0.4),
        "learned": pyrouq.Gaussian("learned"),
        "latent": pyrouq.Gaussian(dist.HalfNormal(torch.ones(2))),
        "heteroscedastic": pyrouq.Gaussian("heteroscedastic"),
    }
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 3, generator=g), torch.randn(N, 2, generator=g)
    pyro.set_rng_seed(0)
    outputs = 4 if noise == "heteroscedastic" else 2
    model = pyrouq.bayesian(torch.nn.Linear(3, outputs), likelihood=likelihoods[noise])
    idata = to_inference_data(model, mean_field_guide(model), x, y, num_samples=5)
    post = idata.posterior
    w, b = (torch.as_tensor(post[k].values[0]).double() for k in ("weight", "bias"))
    out = torch.einsum("soi,ni->sno", w, x.double()) + b[:, None]
    loc, scale = out[..., :2], torch.full_like(out, 0.4)
    if noise == "learned":  # softplus(raw), initialised to 1.0
        scale = torch.ones_like(out)
    elif noise == "latent":
        scale = torch.as_tensor(post["sigma"].values[0]).double()[:, None].expand_as(out)
    elif noise == "heteroscedastic":
        scale = 1e-3 + torch.nn.functional.softplus(out[..., 2:])
    expected = torch.distributions.Normal(loc, scale).log_prob(y.double()).sum(-1)
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], expected, atol=1e-5)
    pp = idata.posterior_predictive
    np.testing.assert_allclose(pp["loc"].values[0], loc, atol=1e-5)
    np.testing.assert_allclose(pp["scale"].values[0], scale, atol=1e-5)
    assert pp["obs"].dims == ("chain", "draw", "obs_id", "output")
    assert pp["obs"].shape == (1, 5, N, 2)
    assert idata.observed_data["obs"].dims == ("obs_id", "output")
    assert idata.log_likelihood["obs"].dims == ("chain", "draw", "obs_id")


def test_batchensemble_members_log_likelihood_by_hand_and_seeds_reproduce():
    """Member m computes ((x * r_m) W^T) * s_m + b_m: the export's members are those, in
    order, for a classifier (Categorical log-probs) and a heteroscedastic regression; a seed
    gives the same obs draws again."""
    x, y = _classification(classes=4)
    net = pyrouq.batchensemble(torch.nn.Linear(4, 4), num_members=3)
    layer = net.net[0]
    w, r, s, b = (t.detach().double() for t in (layer.weight, layer.r, layer.s, layer.bias))
    logits = torch.stack([((x.double() * r[m]) @ w.T) * s[m] + b[m] for m in range(3)])
    pyro.set_rng_seed(3)
    idata = to_inference_data(net, None, x, y)
    assert idata.groups() == ["posterior_predictive", "log_likelihood", "observed_data"]
    expected = torch.distributions.Categorical(logits=logits).log_prob(y)
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], expected, atol=1e-5)
    pyro.set_rng_seed(3)
    again = to_inference_data(net, None, x, y)
    np.testing.assert_array_equal(
        idata.posterior_predictive["obs"].values, again.posterior_predictive["obs"].values
    )
    regression = pyrouq.batchensemble(
        torch.nn.Linear(4, 2), num_members=3, likelihood=pyrouq.Gaussian("heteroscedastic")
    )
    targets = torch.randn(N)
    layer = regression.net[0]
    w, r, s, b = (t.detach().double() for t in (layer.weight, layer.r, layer.s, layer.bias))
    out = torch.stack([((x.double() * r[m]) @ w.T) * s[m] + b[m] for m in range(3)])
    scale = 1e-3 + torch.nn.functional.softplus(out[..., 1])
    expected = torch.distributions.Normal(out[..., 0], scale).log_prob(targets.double())
    exported = to_inference_data(regression, None, x, targets)
    np.testing.assert_allclose(exported.log_likelihood["obs"].values[0], expected, atol=1e-5)


def test_a_bfloat16_models_guide_draws_export_as_float32_of_the_same_values():
    """numpy has no bfloat16: the posterior holds the guide's bfloat16 draws as float32 (an
    exact widening), the log-likelihood float64 near the float32 model's."""
    x, y = _classification()
    pyro.set_rng_seed(0)
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    guide = mean_field_guide(model, init_scale=0.1)
    low = copy.deepcopy(model).to(torch.bfloat16)
    low_guide = copy.deepcopy(guide).to(torch.bfloat16)
    pyro.set_rng_seed(1)
    idata = to_inference_data(low, low_guide, x, y, num_samples=4)
    pyro.set_rng_seed(1)
    with torch.no_grad():
        draws = [low_guide() for _ in range(4)]
    weight = idata.posterior["fc1.weight"]
    assert weight.dtype == np.float32
    np.testing.assert_array_equal(
        weight.values[0], torch.stack([d["fc1.weight"] for d in draws]).float().numpy()
    )
    assert idata.log_likelihood["obs"].dtype == np.float64
    assert idata.posterior_predictive["probs"].dtype == np.float32
    exact = [model.outputs(x, {k: v.float() for k, v in d.items()}) for d in draws]
    expected = torch.distributions.Categorical(logits=torch.stack(exact)).log_prob(y)
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], expected, atol=0.05)


# --------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("site", "value", "shown"),
    [
        ("bias", torch.zeros(3, 4, 1), r"'bias': \(3, 4\)"),  # a third chain
        ("bias", torch.zeros(2, 5, 1), r"'bias': \(2, 5\)"),  # a fifth draw
        ("bias", torch.zeros(8, 1), r"'bias': \(8, 1\)"),  # flattened draws
    ],
)
def test_an_mcmc_result_whose_sites_disagree_on_chains_or_draws_is_refused(site, value, shown):
    """Each site was read with the first site's (chain, draw): a third chain of 'bias' was
    dropped, a fifth draw shifted every later draw of chain 1, without a word."""
    result = _hand_made_result()
    result.samples[site] = value
    with pytest.raises(
        ValueError,
        match=r"to_inference_data\(\): the sites of result\.samples hold different \(chain, "
        rf"draw\) counts, \{{'weight': \(2, 4\), {shown}\}}.*Pass the samples of one run, or cut "
        r"every site to common chains and draws \(value\[:C, :S\]\)",
    ):
        to_inference_data(result)


def test_an_mcmc_results_sample_stats_of_other_chains_are_refused():
    result = _hand_made_result()
    result.sample_stats["energy"] = torch.zeros(3, 4, dtype=F64)
    with pytest.raises(
        ValueError,
        match=r"result\.sample_stats must be \(chain, draw\) = \(2, 4\), as the samples, got "
        r"\{'energy': \(3, 4\)\}\. Pass the stats of the same run",
    ):
        to_inference_data(result)


def test_an_empty_mcmc_result_is_refused():
    """StopIteration from result.num_chains before."""
    result = _hand_made_result()
    result.samples, result.sample_stats = {}, {}
    with pytest.raises(ValueError, match=r"result\.samples is empty: there are no draws"):
        to_inference_data(result)


def test_nan_mcmc_draws_are_named_by_site_chain_and_draw():
    """torch's "Expected parameter loc (Tensor of shape (10, 1)) ... to satisfy the
    constraint Real()" before, naming no site or draw."""
    result = _hand_made_result()
    result.samples["weight"][1, 2, 0, 1] = math.nan
    result.samples["weight"][1, 3, 0, 0] = math.inf
    with pytest.raises(
        ValueError,
        match=r"to_inference_data\(\): result\.samples\['weight'\] holds NaN or inf in 2 of 8 "
        r"draws, the first at chain 1, draw 2: .*keep the finite draws of every site",
    ):
        to_inference_data(result)


@pytest.mark.parametrize("validation", [True, False])
@pytest.mark.parametrize("call", ["to_inference_data", "psis_diagnostic"])
def test_a_guide_with_nan_parameters_is_refused_naming_the_site(validation, call):
    """A fit that diverged: Pyro's "Expected parameter loc (Parameter of shape (8, 4)) ...
    but found invalid values" (validation on), torch's "probability tensor contains either
    inf, nan" (off)."""
    x, y = _classification()
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    guide = mean_field_guide(model)
    with torch.no_grad():
        guide.rho[next(iter(guide.rho))].fill_(math.inf)  # fc1.weight's scale
    diagnostic = {"to_inference_data": to_inference_data, "psis_diagnostic": psis_diagnostic}
    with (
        pyro.validation_enabled(validation),
        pytest.raises(
            ValueError,
            match=rf"{call}\(\): the guide's parameters hold NaN or inf, at 'fc1\.weight' "
            r"\(scale\): its fit diverged.*Fit it again, with a smaller learning rate",
        ),
    ):
        diagnostic[call](model, guide, x, y, num_samples=30)


def test_an_autoguide_with_nan_parameters_is_refused_naming_the_parameter():
    x, y = torch.randn(N, 2), torch.randint(0, 3, (N,))
    model = PyroClassifier()
    guide = AutoNormal(model)
    guide(x, y)
    with torch.no_grad():
        dict(guide.named_parameters())["locs.fc.bias_unconstrained"].fill_(math.nan)
    with pytest.raises(
        ValueError, match=r"parameters hold NaN or inf, at 'locs\.fc\.bias_unconstrained'"
    ):
        to_inference_data(model, guide, x, y, num_samples=3)


def test_a_float16_models_overflowing_outputs_name_the_draw_and_the_inputs():
    """Inputs far beyond 65,504 in float16: torch's "Expected parameter logits ... to satisfy
    the constraint IndependentConstraint(Real(), 1)" before."""
    x, y = _classification()
    x[[6, 7]] *= 1e5  # in the second batch of 4: numbered among all N
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=3).half()
    with pytest.raises(
        ValueError,
        match=r"to_inference_data\(\): the model's outputs are NaN or inf at guide draw 0, for "
        r"inputs \[6, 7\].*a float16 model overflows past 65,504: export a float32 copy",
    ):
        to_inference_data(model, mean_field_guide(model), x, y, num_samples=2, batch_size=4)


def test_a_batchensembles_overflowing_outputs_are_named():
    x = torch.randn(N, 4)
    x[5] = 1e5
    net = pyrouq.batchensemble(torch.nn.Linear(4, 1), 2, likelihood=pyrouq.Gaussian(0.5)).half()
    with pytest.raises(
        ValueError, match=r"outputs are NaN or inf in its members, for inputs \[5\]"
    ):
        to_inference_data(net, None, x, torch.randn(N))


@pytest.mark.parametrize("validation", [True, False])
@pytest.mark.parametrize("label", [3, -1])
def test_labels_outside_a_pyro_models_categorical_are_refused(validation, label):
    """torch's "Expected value argument ... to be within the support (IntegerInterval...)"
    (validation on) or "index 3 is out of bounds for dimension 1 with size 3" (off), as
    psis_diagnostic already refused them."""
    x, y = torch.randn(N, 2), torch.randint(0, 3, (N,))
    y[[1, 4]] = label
    model = PyroClassifier()
    with (
        pyro.validation_enabled(validation),
        pytest.raises(
            ValueError,
            match=r"to_inference_data\(\): The observed values of site 'obs' lie outside the "
            r"support of its distribution \(Categorical, support IntegerInterval\(lower_bound=0, "
            r"upper_bound=2\)\) at 2 entries.*of a Categorical in \[0, C\)",
        ),
    ):
        to_inference_data(model, AutoNormal(model), x, y, num_samples=2)


def test_a_pyro_models_draw_dependent_support_still_gives_minus_inf():
    """Uniform(0, theta): a point above a draw's theta is a log-likelihood of -inf at that
    draw (and a warning), not data the model cannot produce."""

    def model(x, y):
        theta = pyro.sample("theta", dist.LogNormal(0.0, 0.5))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Uniform(0.0, theta), obs=y)

    def guide(x, y):
        pyro.sample("theta", dist.LogNormal(0.3, 0.1))

    y = torch.tensor([0.2, 0.5, 1.3])
    pyro.set_rng_seed(0)
    with (
        pyro.validation_enabled(False),
        pytest.warns(RuntimeWarning, match=r"log-likelihood is -inf at \d+ of 60 entries"),
    ):
        idata = to_inference_data(model, guide, torch.zeros(3, 1), y, num_samples=20)
    log_lik = idata.log_likelihood["obs"].values[0]
    theta = idata.posterior["theta"].values[0]
    np.testing.assert_array_equal(np.isneginf(log_lik[:, 2]), theta < 1.3)
    np.testing.assert_allclose(log_lik[:, 0], -np.log(theta), rtol=1e-6)


@pytest.mark.parametrize("source", ["guide", "mcmc", "ensemble"])
def test_a_single_draw_warns_that_az_loo_fails_on_it(source):
    """az.loo raises an IndexError ("index -2 is out of bounds for axis 0 with size 1") on
    an export of one draw; the export now says so, and how to get more."""
    x, y = _classification()
    if source == "guide":
        model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
        args, how = (model, mean_field_guide(model), x, y, 1), "num_samples >= 2"
    elif source == "mcmc":
        args, how = (_hand_made_result(1, 1),), "run two or more draws"
    else:
        args, how = (pyrouq.batchensemble(torch.nn.Linear(4, 3), 1), None, x, y), "two or more"
    with pytest.warns(
        UserWarning,
        match=rf"to_inference_data\(\): one draw exported \(S = 1\): az\.loo fails .*{how}",
    ) as record:
        idata = to_inference_data(*args)
    # at the caller's line (it named pyrouq's _default_device.py, whose decorator it passed)
    assert {w.filename for w in record if "one draw" in str(w.message)} == {__file__}
    with warnings.catch_warnings(), pytest.raises(IndexError):
        warnings.simplefilter("ignore")
        az.loo(idata, reff=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        to_inference_data(_hand_made_result(1, 2))  # two draws: no warning
