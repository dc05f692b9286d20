"""Fourth audit of pyrouq.diagnostics: a Pyro model's latent sites named like the exported
predictions, summary()'s var_names and groups, and PSIS-LOO / k-hat against independent
references (exact leave-one-out of a conjugate model, a numpy fit of the Pareto tail)."""

from __future__ import annotations

import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch

import pyrouq
from pyrouq.diagnostics import psis_diagnostic, summary, to_inference_data
from pyrouq.models import BayesianMLP

az = pytest.importorskip("arviz")

F64 = torch.float64


# --------------------------------------------------------------------------------------------
# to_inference_data: latent sites named "scale", "loc", "probs", "log_lik"
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["scale", "loc", "probs", "log_lik"])
def test_a_pyro_models_site_named_like_a_prediction_is_its_own_variable(name):
    """A Pyro regression's noise site "scale" (or "loc", "probs", "log_lik") shared its key
    with the exported predictions: xarray's "different number of dimensions on data and dims"
    (torch's expand error for "log_lik")."""
    x, y = torch.randn(6, 1), torch.randn(6)

    def model(x, y):
        mu = pyro.sample("mu", dist.Normal(0.0, 1.0))
        noise = pyro.sample(name, dist.HalfNormal(1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(mu * x[:, 0], noise), obs=y)

    def guide(x, y):
        pyro.sample("mu", dist.Normal(0.3, 0.2))
        pyro.sample(name, dist.LogNormal(0.0, 0.3))

    pyro.set_rng_seed(0)
    idata = to_inference_data(model, guide, x, y, num_samples=5)
    assert list(idata.posterior.data_vars) == ["mu", name]
    assert idata.posterior[name].dims == ("chain", "draw")
    assert list(idata.posterior_predictive.data_vars) == ["obs"]
    mu, noise = (torch.from_numpy(idata.posterior[k].values[0]) for k in ("mu", name))
    assert bool((noise > 0).all()) and len(set(noise.tolist())) == 5  # the guide's draws
    expected = dist.Normal(mu[:, None] * x[:, 0], noise[:, None]).log_prob(y)  # (S, N)
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], expected.numpy(), rtol=1e-6)


def test_a_latent_probs_keeps_its_dims_beside_the_predictive_probs():
    """A Dirichlet site "probs" of a classifier that records its "logits": the posterior's
    probs (C,) took the predictive probs' dims (obs_id, class), and the export failed."""
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])

    def model(x, y):
        probs = pyro.sample("probs", dist.Dirichlet(torch.ones(3)))
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 3), 1.0).to_event(2))
        logits = pyro.deterministic("logits", x @ w + probs.log())
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)

    pyro.set_rng_seed(0)
    guide = pyro.infer.autoguide.AutoNormal(model)
    idata = to_inference_data(model, guide, x, y, num_samples=4)
    assert idata.groups() == [
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
    ]
    post, pp = idata.posterior, idata.posterior_predictive
    assert post["probs"].dims == ("chain", "draw", "probs_dim_0") and post["probs"].shape[1:] == (
        4,
        3,
    )
    assert pp["probs"].dims == ("chain", "draw", "obs_id", "class")
    w, probs = (torch.from_numpy(post[k].values[0]) for k in ("w", "probs"))
    np.testing.assert_allclose(probs.sum(-1).numpy(), 1.0, rtol=1e-5)
    expected = torch.softmax(torch.einsum("nd,sdc->snc", x, w) + probs.log()[:, None], -1)
    np.testing.assert_allclose(pp["probs"].values[0], expected.numpy(), rtol=1e-5, atol=1e-6)
    picked = expected[:, torch.arange(6), y].double().log()
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], picked.numpy(), rtol=1e-5)


def test_the_draws_are_those_predict_uses_with_the_same_seed():
    model = BayesianMLP(in_features=4, hidden_features=5, out_features=3)
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    x, y = torch.randn(7, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0])
    pyro.set_rng_seed(5)
    preds = pyrouq.predict(model, x, guide, num_samples=6, progress=False)
    pyro.set_rng_seed(5)
    idata = to_inference_data(model, guide, x, y, num_samples=6)
    np.testing.assert_allclose(
        idata.posterior_predictive["probs"].values[0], preds.probs.numpy(), rtol=1e-5, atol=1e-6
    )


# --------------------------------------------------------------------------------------------
# summary()
# --------------------------------------------------------------------------------------------


def _small_export():
    x, y = torch.randn(8, 2), torch.randn(8)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(x @ w + b, 0.5), obs=y)

    def guide(x, y):
        pyro.sample("w", dist.Normal(torch.tensor([1.0, -1.0]), 0.2).to_event(1))
        pyro.sample("b", dist.Normal(0.5, 0.1))

    pyro.set_rng_seed(0)
    return to_inference_data(model, guide, x, y, num_samples=40)


def test_summary_takes_a_tuple_of_names():
    """The documented "sequence of str" as a tuple met xarray's KeyError "No variable named
    ('b',)": arviz reads a tuple as one name."""
    idata = _small_export()
    table = summary(idata, var_names=("b", "w"))
    assert list(table.index) == ["b", "w[0]", "w[1]"]
    np.testing.assert_allclose(
        table["mean"].values, [idata.posterior[k].values.mean() for k in ("b",)]
        + list(idata.posterior["w"].values[0].mean(0)), atol=1e-3,
    )  # fmt: skip
    assert table.equals(summary(idata, var_names=["b", "w"]))


def test_summary_says_what_an_empty_var_names_or_a_group_without_draws_lacks():
    """var_names=[] met arviz's "Dimension(s) 'chain', 'draw' do not exist. Expected one or
    more of set()"; group='observed_data' the same error about {'obs_id'}."""
    idata = _small_export()
    with pytest.raises(ValueError, match=r"summary\(\): var_names is empty.* holds \['w', 'b'\]"):
        summary(idata, var_names=[])
    with pytest.raises(
        ValueError,
        match=r"'observed_data' group holds no draws \(its dims are \['obs_id'\], no 'chain' "
        r"and 'draw'\).*one of \['posterior', 'posterior_predictive', 'log_likelihood'\]",
    ):
        summary(idata, group="observed_data")


# --------------------------------------------------------------------------------------------
# PSIS-LOO and k-hat against independent references
# --------------------------------------------------------------------------------------------


def _conjugate(n=20, noise=0.5, prior=1.0):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g, dtype=F64)
    y = x @ torch.tensor([1.0, -2.0], dtype=F64) + noise * torch.randn(n, generator=g, dtype=F64)

    def posterior(x, y):
        precision = x.T @ x / noise**2 + torch.eye(2, dtype=F64) / prior**2
        cov = torch.linalg.inv(precision)
        return cov @ x.T @ y / noise**2, cov

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=F64), prior).to_event(1))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(x @ w, noise), obs=y)

    return model, posterior, x, y, noise


def test_elpd_loo_and_waic_match_exact_leave_one_out_and_numpy():
    """Exact-posterior draws of a conjugate regression: az.loo on the export gives the exact
    sum of log p(y_i | y_-i) (a Gaussian in closed form), az.waic the numpy formula
    (arviz takes the variance of the pointwise log-likelihood over draws with ddof 0)."""
    model, posterior, x, y, noise = _conjugate()
    n = len(y)
    mean, cov = posterior(x, y)
    tril = torch.linalg.cholesky(cov)

    def guide(x, y):
        pyro.sample("w", dist.MultivariateNormal(mean, scale_tril=tril))

    exact = 0.0
    for i in range(n):
        rest = torch.arange(n) != i
        m_i, c_i = posterior(x[rest], y[rest])
        sd = (noise**2 + x[i] @ c_i @ x[i]).sqrt()
        exact += float(dist.Normal(x[i] @ m_i, sd).log_prob(y[i]))
    pyro.set_rng_seed(0)
    idata = to_inference_data(model, guide, x, y, num_samples=2000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo, waic = az.loo(idata), az.waic(idata)
    assert loo.n_data_points == n and float(loo.pareto_k.max()) < 0.7
    assert float(loo.elpd_loo) == pytest.approx(exact, abs=0.05)
    ll = idata.log_likelihood["obs"].values.reshape(-1, n)
    lppd = (np.logaddexp.reduce(ll, axis=0) - np.log(len(ll))).sum()
    assert float(waic.elpd_waic) == pytest.approx(lppd - ll.var(0).sum(), abs=1e-9)


def _numpy_k_hat(log_weights: np.ndarray) -> float:
    """Pareto k-hat by hand: the largest ceil(min(S / 5, 3 sqrt(S))) ratios (relative
    efficiency 1), Zhang and Stephens' (2009) fit of their exceedances, the weak prior of
    Vehtari et al. (2024) toward 0.5."""
    s = len(log_weights)
    m = int(np.ceil(min(s / 5, 3 * np.sqrt(s))))
    lw = np.sort(log_weights - log_weights.max())
    cut = lw[-m - 1]
    tail = np.exp(lw[lw > cut]) - np.exp(cut)
    n = len(tail)
    grid = 30 + int(np.sqrt(n))
    b = 1 / tail[-1] + (1 - np.sqrt(grid / (np.arange(1, grid + 1) - 0.5))) / (
        3 * tail[int(n / 4 + 0.5) - 1]
    )
    k = np.log1p(-b[:, None] * tail).mean(1)
    profile = n * (np.log(-b / k) - k - 1)
    weights = 1 / np.exp(profile[None, :] - profile[:, None]).sum(1)
    b_hat = (b * weights).sum() / weights.sum()
    k_hat = np.log1p(-b_hat * tail).mean()
    return float((n * k_hat + 10 * 0.5) / (n + 10))


def test_psis_k_hat_is_a_numpy_fit_of_the_known_tail():
    """A Normal(0, 1/2) guide of a Normal(0, 1) posterior: ratios exp(3 z^2 / 8), z ~ N(0, 1),
    whose tail has k = 1 - (1/2)^2 = 0.75; S = 4000 draws estimate it a little low."""

    def model(x, y):
        pyro.sample("z", dist.Normal(torch.tensor(0.0, dtype=F64), 1.0))

    def guide(x, y):
        pyro.sample("z", dist.Normal(torch.tensor(0.0, dtype=F64), 0.5))

    x, y = torch.zeros(3, 1, dtype=F64), torch.zeros(3, dtype=F64)
    pyro.set_rng_seed(0)
    result = psis_diagnostic(model, guide, x, y, num_samples=4000)
    # log N(z; 0, 1) - log N(z; 0, 1/2) = 3 z^2 / 2 - log 2 >= -log 2
    assert float(result.log_weights.min()) >= -np.log(2.0) - 1e-12
    assert result.k_hat == pytest.approx(_numpy_k_hat(result.log_weights.numpy()), abs=1e-9)
    assert 0.6 < result.k_hat < 0.85 and result.interpretation.startswith(("ok", "bad"))
