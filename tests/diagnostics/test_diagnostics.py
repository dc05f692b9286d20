from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

import pyrouq
from pyrouq.diagnostics import (
    DEFAULT_IDATA_SAMPLES,
    PSISResult,
    psis_diagnostic,
    summary,
    to_inference_data,
)
from pyrouq.infer import mean_field_guide
from pyrouq.models import BatchEnsembleMLP, BayesianMLP

az = pytest.importorskip("arviz")

N, C = 12, 3

# arviz warns about high Pareto k in LOO on a dozen points with few draws; expected here.
LOO_WARNINGS = pytest.mark.filterwarnings(
    "ignore:Estimated shape parameter:UserWarning",
    "ignore:For one or more samples the posterior variance:UserWarning",
)


@pytest.fixture
def data():
    return torch.randn(N, 4), torch.randint(0, C, (N,))


@pytest.fixture
def bayes():
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=C)
    return model, mean_field_guide(model, init_scale=0.2)


@pytest.fixture
def ensemble():
    return BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=C, num_members=4)


def _log_probs_at_labels(idata) -> np.ndarray:
    """log probs[s, n, y_n] recomputed from the stored predictive probabilities."""
    probs = idata.posterior_predictive["probs"].values[0]  # (S, N, C)
    y = idata.observed_data["obs"].values
    return np.log(np.take_along_axis(probs, y[None, :, None], axis=-1)[..., 0])


def test_import_pyrouq_loads_neither_arviz_nor_matplotlib():
    code = (
        "import sys, pyrouq\n"
        "assert callable(pyrouq.to_inference_data) and callable(pyrouq.psis_diagnostic)\n"
        "import pyrouq.diagnostics\n"
        "print(sorted(m for m in ('arviz', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_names():
    for name in ("to_inference_data", "psis_diagnostic", "PSISResult", "summary"):
        assert name in pyrouq.__all__
    assert pyrouq.to_inference_data is to_inference_data


# --------------------------------------------------------------------------------------------
# to_inference_data: Bayesian MLP
# --------------------------------------------------------------------------------------------


def test_bayesian_groups_shapes_and_dims(bayes, data):
    model, guide = bayes
    x, y = data
    idata = to_inference_data(model, guide, x, y, num_samples=7, batch_size=5)
    assert idata.groups() == [
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
    ]
    post = idata.posterior
    assert list(post.data_vars) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert post["fc1.weight"].shape == (1, 7, 8, 4)
    assert post["fc1.weight"].dims == ("chain", "draw", "fc1_out", "fc1_in")
    assert post["fc1.bias"].dims == ("chain", "draw", "fc1_out")
    assert post["fc2.weight"].shape == (1, 7, 3, 8)
    assert post["fc2.weight"].dtype == np.float32
    pp = idata.posterior_predictive
    assert pp["obs"].dims == ("chain", "draw", "obs_id") and pp["obs"].shape == (1, 7, N)
    assert pp["probs"].dims == ("chain", "draw", "obs_id", "class")
    assert pp["probs"].shape == (1, 7, N, C)
    assert set(np.unique(pp["obs"].values)) <= set(range(C))
    ll = idata.log_likelihood["obs"]
    assert ll.dims == ("chain", "draw", "obs_id") and ll.dtype == np.float64
    np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
    np.testing.assert_array_equal(idata.observed_data["obs_id"].values, np.arange(N))
    assert idata.posterior.attrs["draws"] == "independent guide draws"


def test_dims_follow_each_layers_layout():
    net = torch.nn.Sequential(
        torch.nn.ConvTranspose2d(1, 2, 3),  # weight (in, out, kh, kw)
        torch.nn.Flatten(2),
        torch.nn.Conv1d(2, 4, 3, groups=2),  # on (B, 2, 25): weight (out, in / groups, k)
        torch.nn.Flatten(1),
    )
    model = pyrouq.bayesian(net)
    x, y = torch.randn(3, 1, 3, 3), torch.zeros(3, dtype=torch.long)
    post = to_inference_data(model, mean_field_guide(model), x, y, num_samples=2).posterior
    assert post["0.weight"].dims == ("chain", "draw", "0_in", "0_out", "0_kh", "0_kw")
    assert post["0.weight"].shape == (1, 2, 1, 2, 3, 3)  # not joined with the bias's 0_out
    assert not np.isnan(post["0.weight"].values).any()
    assert post["2.weight"].dims == ("chain", "draw", "2_out", "2_in_per_group", "2_k")
    assert post["2.weight"].shape == (1, 2, 4, 1, 3)  # in / groups = 1, the bias's 2_out = 4
    transposed = torch.nn.ConvTranspose1d(4, 4, 3, groups=2)  # weight (in, out / groups, k)
    grouped = pyrouq.bayesian(torch.nn.Sequential(transposed, torch.nn.Flatten()))
    x, y = torch.randn(3, 4, 2), torch.zeros(3, dtype=torch.long)
    post = to_inference_data(grouped, mean_field_guide(grouped), x, y, num_samples=2).posterior
    assert post["0.weight"].dims == ("chain", "draw", "0_in", "0_out_per_group", "0_k")
    assert post["0.weight"].shape == (1, 2, 4, 2, 3) and post["0.bias"].shape == (1, 2, 4)
    assert not np.isnan(post["0.weight"].values).any()  # 0_out (4) was joined with 2 before
    rank1 = pyrouq.rank1(torch.nn.Sequential(torch.nn.Linear(4, 3)), 2)
    draws = pyrouq.mean_field_guide(rank1)
    post = to_inference_data(rank1, draws, torch.randn(5, 4), torch.zeros(5, dtype=torch.long),
                             num_samples=2).posterior  # fmt: skip
    assert post["0.r"].dims == ("chain", "draw", "0_member", "0_in")
    assert post["0.s"].dims == ("chain", "draw", "0_member", "0_out")


def test_layers_whose_dim_names_would_meet_keep_their_dots():
    """``block.fc`` and ``block_fc`` both gave ``block_fc_out``: xarray joined a 5 with a 3
    and padded the smaller sites with NaN, without a word."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Module()
            self.block.fc = torch.nn.Linear(4, 5)
            self.block_fc = torch.nn.Linear(5, 3)

        def forward(self, x):
            return self.block_fc(torch.relu(self.block.fc(x)))

    model = pyrouq.bayesian(Net())
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    post = to_inference_data(model, mean_field_guide(model), x, y, num_samples=2).posterior
    assert post["block.fc.weight"].dims == ("chain", "draw", "block.fc_out", "block.fc_in")
    assert post["block_fc.weight"].dims == ("chain", "draw", "block_fc_out", "block_fc_in")
    assert post["block.fc.weight"].shape == (1, 2, 5, 4)
    assert post["block_fc.bias"].shape == (1, 2, 3)
    assert not any(np.isnan(post[k].values).any() for k in post.data_vars)


def test_default_number_of_draws(bayes, data):
    idata = to_inference_data(*bayes, *data)
    assert idata.posterior.sizes["draw"] == DEFAULT_IDATA_SAMPLES


def test_predictions_are_the_posterior_draws(bayes, data):
    """probs[s] is the network run with the exported draw s of the weights."""
    model, guide = bayes
    x, y = data
    idata = to_inference_data(model, guide, x, y, num_samples=5)
    probs = torch.from_numpy(idata.posterior_predictive["probs"].values[0])
    for s in range(5):
        weights = {
            name: torch.from_numpy(idata.posterior[name].values[0, s]) for name in guide.sites
        }
        expected = model.outputs(x, weights).softmax(-1)
        torch.testing.assert_close(probs[s], expected)
    # the draws differ: a real posterior, not the guide mean
    assert not torch.allclose(probs[0], probs[1])


def test_log_likelihood_equals_log_of_stored_probs(bayes, data):
    idata = to_inference_data(*bayes, *data, num_samples=6)
    np.testing.assert_allclose(
        idata.log_likelihood["obs"].values[0], _log_probs_at_labels(idata), rtol=1e-5, atol=1e-6
    )


def test_result_does_not_depend_on_batch_size(bayes, data):
    pyro.set_rng_seed(1)
    one = to_inference_data(*bayes, *data, num_samples=4, batch_size=N)
    pyro.set_rng_seed(1)
    many = to_inference_data(*bayes, *data, num_samples=4, batch_size=5)
    for group in ("posterior", "posterior_predictive", "log_likelihood"):
        for name, values in one[group].data_vars.items():
            if group == "posterior" or not np.issubdtype(values.dtype, np.floating):
                np.testing.assert_array_equal(values.values, many[group][name].values)
            else:  # the same draws; the network's float32 kernels may round by batch size
                np.testing.assert_allclose(
                    values.values, many[group][name].values, rtol=1e-5, atol=1e-6
                )


def test_var_names_export_a_subset(bayes, data):
    pyro.set_rng_seed(2)
    full = to_inference_data(*bayes, *data, num_samples=4)
    pyro.set_rng_seed(2)
    part = to_inference_data(*bayes, *data, num_samples=4, var_names=["fc2.bias", "fc1.bias"])
    assert list(part.posterior.data_vars) == ["fc1.bias", "fc2.bias"]  # the model's order
    np.testing.assert_array_equal(part.posterior["fc2.bias"], full.posterior["fc2.bias"])
    np.testing.assert_array_equal(part.log_likelihood["obs"], full.log_likelihood["obs"])
    single = to_inference_data(*bayes, *data, num_samples=2, var_names="fc1.weight")
    assert list(single.posterior.data_vars) == ["fc1.weight"]


@LOO_WARNINGS
def test_loo_waic_and_summary_run(bayes, data):
    idata = to_inference_data(*bayes, *data, num_samples=100)
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo) and loo.elpd_loo < 0
    # elpd_loo is a sum over points of log predictive densities
    assert loo.n_data_points == N
    assert np.isfinite(az.waic(idata).elpd_waic)
    stats = az.summary(idata, kind="stats")
    assert len(stats) == 8 * 4 + 8 + 3 * 8 + 3
    assert list(stats.columns) == ["mean", "sd", "hdi_3%", "hdi_97%"]
    ours = summary(idata, var_names=["fc2.bias"])
    assert list(ours.index) == ["fc2.bias[0]", "fc2.bias[1]", "fc2.bias[2]"]
    np.testing.assert_allclose(
        ours["mean"].values, idata.posterior["fc2.bias"].values[0].mean(0), atol=1e-3
    )
    assert "r_hat" not in ours.columns


# --------------------------------------------------------------------------------------------
# to_inference_data: BatchEnsemble and plain Pyro models
# --------------------------------------------------------------------------------------------


@LOO_WARNINGS
def test_batchensemble_members_are_the_draws(ensemble, data):
    x, y = data
    idata = to_inference_data(ensemble, None, x, y, batch_size=5)
    assert idata.groups() == ["posterior_predictive", "log_likelihood", "observed_data"]
    assert idata.log_likelihood["obs"].shape == (1, 4, N)
    assert idata.posterior_predictive["obs"].shape == (1, 4, N)
    probs = torch.from_numpy(idata.posterior_predictive["probs"].values[0])
    with torch.no_grad():
        torch.testing.assert_close(probs, ensemble(x).softmax(-1))
    np.testing.assert_allclose(
        idata.log_likelihood["obs"].values[0], _log_probs_at_labels(idata), rtol=1e-5, atol=1e-6
    )
    # no posterior group to estimate the relative efficiency from: the members are independent
    assert np.isfinite(az.loo(idata, reff=1.0).elpd_loo)
    assert idata.log_likelihood.attrs["draws"] == "ensemble members"
    stats = summary(idata, var_names=["probs"], group="posterior_predictive")
    assert len(stats) == N * C


@LOO_WARNINGS
@pytest.mark.filterwarnings("ignore:The inplace keyword:DeprecationWarning")  # arviz, pandas 3
def test_az_compare_takes_a_batchensemble_through_its_loo_as_documented(ensemble, bayes, data):
    # a researcher ranking a BatchEnsemble beside a guide (or NUTS): az.compare computes each
    # model's LOO itself, which needs a posterior group; the README gives it the LOO instead
    x, y = data
    members = to_inference_data(ensemble, None, x, y)
    draws = to_inference_data(*bayes, x, y, num_samples=20, seed=0)
    with pytest.raises(TypeError):
        az.compare({"ensemble": members, "guide": draws})
    members_loo = az.loo(members, pointwise=True, reff=1.0)
    table = az.compare({"ensemble": members_loo, "guide": draws})
    assert sorted(table.index) == ["ensemble", "guide"]
    assert table.loc["ensemble", "elpd_loo"] == pytest.approx(members_loo.elpd_loo, rel=1e-12)
    assert table.loc["guide", "elpd_loo"] == pytest.approx(az.loo(draws).elpd_loo, rel=1e-12)


def _regression(dtype=torch.float64, n=30, noise=0.5, prior=1.0):
    """Bayesian linear regression with known noise: the posterior of w is Gaussian."""
    x = torch.randn(n, 2, dtype=dtype)
    y = x @ torch.tensor([1.0, -2.0], dtype=dtype) + noise * torch.randn(n, dtype=dtype)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=dtype), prior).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w, noise), obs=y)

    precision = x.T @ x / noise**2 + torch.eye(2, dtype=dtype) / prior**2
    cov = torch.linalg.inv(precision)
    mean = cov @ x.T @ y / noise**2
    evidence = dist.MultivariateNormal(
        torch.zeros(n, dtype=dtype), noise**2 * torch.eye(n, dtype=dtype) + prior**2 * x @ x.T
    ).log_prob(y)
    return model, x, y, mean, cov, float(evidence)


def _mvn_guide(mean, scale_tril):
    def guide(x, y):
        pyro.sample("w", dist.MultivariateNormal(mean, scale_tril=scale_tril))

    return guide


@LOO_WARNINGS
def test_plain_pyro_model_export():
    model, x, y, mean, cov, _ = _regression()
    guide = _mvn_guide(mean, torch.linalg.cholesky(cov))
    idata = to_inference_data(model, guide, x, y, num_samples=9)
    assert idata.groups() == [
        "posterior",
        "posterior_predictive",
        "log_likelihood",
        "observed_data",
    ]
    w = torch.from_numpy(idata.posterior["w"].values[0])  # (S, 2)
    assert w.shape == (9, 2)
    expected = dist.Normal(w @ x.T, 0.5).log_prob(y)  # (S, N)
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], expected.numpy())
    assert idata.posterior_predictive["obs"].shape == (1, 9, 30)
    assert "probs" not in idata.posterior_predictive
    assert np.isfinite(az.loo(idata).elpd_loo)


def _observed(logits, y):
    """A Pyro model's likelihood of its labels, returning its logits."""
    with pyro.plate("data", logits.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def _autonormal_posterior(model):
    """The posterior group of two AutoNormal draws of a Pyro model on (N, 4) inputs."""
    guide = pyro.infer.autoguide.AutoNormal(model)
    x, y = torch.randn(N, 4), torch.randint(0, C, (N,))
    return to_inference_data(model, guide, x, y, num_samples=2).posterior


def test_a_pyro_models_layer_called_net_gets_named_dims():
    from pyro.nn import PyroModule, PyroSample

    class Model(PyroModule):  # sites named from the model's root: "net.weight"
        def __init__(self):
            super().__init__()
            self.net = PyroModule[torch.nn.Linear](4, C)
            self.net.weight = PyroSample(dist.Normal(0.0, 1.0).expand([C, 4]).to_event(2))

        def forward(self, x, y=None):
            return _observed(self.net(x), y)

    post = _autonormal_posterior(Model())
    assert post["net.weight"].dims == ("chain", "draw", "net_out", "net_in")


def test_a_pyro_models_root_sites_are_not_named_after_its_layer_called_net():
    from pyro.nn import PyroModule

    class Model(PyroModule):  # its own sites "weight" (8, C) and "bias" (C,) at the root
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 8)  # a deterministic feature layer, weight (8, 4)

        def forward(self, x, y=None):
            w = pyro.sample("weight", dist.Normal(0.0, 1.0).expand([8, C]).to_event(2))
            b = pyro.sample("bias", dist.Normal(0.0, 1.0).expand([C]).to_event(1))
            return _observed(torch.relu(self.net(x)) @ w + b, y)

    post = _autonormal_posterior(Model())
    assert post["bias"].shape == (1, 2, C)  # not joined with an "out" of 8
    assert not np.isnan(post["weight"].values).any() and not np.isnan(post["bias"].values).any()


# --------------------------------------------------------------------------------------------
# to_inference_data: errors
# --------------------------------------------------------------------------------------------


def test_length_mismatch(bayes, data):
    x, y = data
    with pytest.raises(ValueError, match=r"same number of points.*x with 12.*y with 11"):
        to_inference_data(*bayes, x, y[:-1])


def test_inputs_must_be_tensors(bayes, data):
    x, y = data
    with pytest.raises(TypeError, match=r"expected x to be a torch.Tensor, got list"):
        to_inference_data(*bayes, x.tolist(), y)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_num_samples_must_be_positive(bayes, data, bad):
    with pytest.raises(ValueError, match=rf"num_samples to be an integer >= 1, got {bad}"):
        to_inference_data(*bayes, *data, num_samples=bad)


def test_unknown_var_names_lists_the_valid_ones(bayes, data):
    with pytest.raises(ValueError, match=r"Unknown var_names \['fc9.weight'\].*'fc1.weight'"):
        to_inference_data(*bayes, *data, var_names=["fc1.bias", "fc9.weight"])
    with pytest.raises(ValueError, match=r"var_names is empty.*the latent sites are \['fc1"):
        to_inference_data(*bayes, *data, var_names=[])


def test_bayesian_model_needs_a_guide(bayes, data):
    model, _ = bayes
    with pytest.raises(ValueError, match=r"BayesianMLP has latent sites but guide is None"):
        to_inference_data(model, None, *data)


def test_batchensemble_takes_no_guide(ensemble, bayes, data):
    with pytest.raises(ValueError, match=r"guide was given for a BatchEnsemble.*guide=None"):
        to_inference_data(ensemble, bayes[1], *data)
    # predict()'s words for the one fact (it said "members are the draws"):
    with pytest.raises(
        ValueError,
        match=r"num_samples=5 given for a BatchEnsemble \(\w+\): its "
        r"4 members are fixed, not sampled, so S = 4, and it has no posterior",
    ):
        to_inference_data(ensemble, None, *data, num_samples=5)
    with pytest.raises(ValueError, match=r"var_names=.* given for a BatchEnsemble"):
        to_inference_data(ensemble, None, *data, var_names=["fc1.weight"])
    # a count that is no count: told to leave it out, as any count would be, not told it is
    # the number of guide draws (there are none)
    with pytest.raises(
        ValueError,
        match=r">= 1, got 0\. Leave it out: a BatchEnsemble's 4 "
        r"members are fixed, not sampled, so S = 4\.$",
    ):  # (as predict() says)
        to_inference_data(ensemble, None, *data, num_samples=0)
    with pytest.raises(
        ValueError,
        match=r"got 0\. Leave it out: a BatchEnsemble's 4 members are fixed, not sampled, so "
        r"S = 4\.$",
    ):  # predict()'s words, the same
        pyrouq.predict(ensemble, data[0], num_samples=0)


@pytest.mark.parametrize("bad", [0, -3, 2.0])
def test_a_bad_batch_size_is_refused_in_predicts_words(bayes, data, bad):
    # to_inference_data() said what was expected and what came, not what to do
    words = (
        rf"Expected batch_size to be a positive integer, got {bad}\. Pass e\.g\. batch_size=256\.$"
    )
    with pytest.raises(ValueError, match=words):
        to_inference_data(*bayes, *data, num_samples=2, batch_size=bad)
    with pytest.raises(ValueError, match=words):  # the same words
        pyrouq.predict(bayes[0], data[0], bayes[1], num_samples=2, batch_size=bad)


@pytest.mark.parametrize("validation", [True, False])
def test_labels_out_of_range(bayes, data, validation):
    x, _ = data
    y = torch.tensor([0] * (N - 1) + [5])
    # psis_diagnostic() said it as the model's under Pyro's validation ("labels in [0, 5],
    # ..." without the words below), as observed values outside the support without it; now
    # in to_inference_data()'s words under both settings, as that says them
    told = (
        f"expected y as (N,) integer class labels in [0, 3), got shape ({N},): labels in [0, 5], "
        "expected class indices in [0, 2] for a model with 3 classes. Check the targets or the "
        "model's number of classes."
    )
    with pyro.validation_enabled(validation):
        for call in (psis_diagnostic, to_inference_data):
            with pytest.raises(ValueError) as info:
                call(*bayes, x, y, num_samples=25, seed=0)
            assert str(info.value) == f"{call.__name__}(): {told}"


def test_psis_runs_the_model_once_a_draw(bayes, data):
    # labels in [0, 3) up to 2 (outside [0, 1]): C is read from the first replay's outputs,
    # not from one more run of the model before it (26 forward passes for 25 draws)
    model, guide = bayes
    x, _ = data
    y = torch.arange(N) % C
    passes = []
    handle = model.register_forward_pre_hook(lambda module, args: passes.append(1))
    try:
        psis_diagnostic(model, guide, x, y, num_samples=25, seed=0)
    finally:
        handle.remove()
    assert len(passes) == 25


def test_summary_errors(ensemble, data):
    idata = to_inference_data(ensemble, None, *data)
    with pytest.raises(ValueError, match=r"no 'posterior' group.*group='posterior_predictive'"):
        summary(idata)
    with pytest.raises(
        TypeError, match=r"summary\(\) of ensemble members always uses kind='stats'"
    ):
        summary(idata, group="posterior_predictive", kind="all")
    table = summary(idata, group="posterior_predictive", var_names=["probs"], kind="stats")
    assert list(table.columns) == ["mean", "sd", "hdi_3%", "hdi_97%"]  # the kind it uses
    missing = r"var_names \['nope'\] are not in idata's 'posterior_predictive' group, which holds"
    with pytest.raises(ValueError, match=missing + r" \['obs', 'probs'\]"):
        summary(idata, var_names=["nope"], group="posterior_predictive")


def test_a_plain_network_has_no_posterior_to_export(data):
    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    with pytest.raises(ValueError, match=r"Sequential has no posterior to export: no latent "
                       r"sites \(a plain network\) and no ensemble members"):  # fmt: skip
        to_inference_data(net, None, *data)


# --------------------------------------------------------------------------------------------
# psis_diagnostic
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_psis_exact_posterior_guide(dtype):
    """With the exact posterior as guide every ratio p(w, D) / q(w) equals the evidence p(D)."""
    model, x, y, mean, cov, evidence = _regression(dtype)
    guide = _mvn_guide(mean, torch.linalg.cholesky(cov))
    result = psis_diagnostic(model, guide, x, y, num_samples=200)
    assert isinstance(result, PSISResult)
    assert result.log_weights.shape == (200,) and result.log_weights.dtype == torch.float64
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(
        result.log_weights, torch.full((200,), evidence, dtype=torch.float64), rtol=0, atol=tol
    )
    assert result.k_hat < 0.5 and result.reliable
    assert result.interpretation.startswith("good")
    assert math.isclose(float(torch.logsumexp(result.smoothed_log_weights, 0)), 0.0, abs_tol=1e-9)


def test_psis_near_exact_and_wrong_guides():
    model, x, y, mean, cov, _ = _regression()
    tril = torch.linalg.cholesky(cov)
    sd = cov.diagonal().sqrt()
    # slightly too wide: bounded ratios, a finite and small k-hat
    wide = psis_diagnostic(model, _mvn_guide(mean, 1.2 * tril), x, y, num_samples=1000)
    # far too narrow and off-centre: heavy-tailed ratios
    wrong = psis_diagnostic(model, _mvn_guide(mean + 3 * sd, 0.3 * tril), x, y, num_samples=1000)
    assert math.isfinite(wide.k_hat) and wide.k_hat < 0.5
    assert wrong.k_hat > 0.7 and wrong.k_hat > wide.k_hat + 1.0
    assert wrong.interpretation.startswith("bad") and not wrong.reliable
    assert "unreliable" in wrong.interpretation and "k_hat=" in repr(wrong)
    assert math.isclose(float(torch.logsumexp(wrong.smoothed_log_weights, 0)), 0.0, abs_tol=1e-9)


@pytest.mark.parametrize("prior", ["uniform", "exponential"])
def test_psis_weighs_a_guide_draw_outside_the_models_support_zero(prior):
    """A Normal(0.5, 1) guide for a Uniform(0, 1) or Exponential(1) site: the draws outside the
    support have log weight -inf (weight 0), under Pyro's default validation too (torch's
    support check raised; without it, Exponential's density is finite below 0)."""
    family = {"uniform": dist.Uniform(0.0, 1.0), "exponential": dist.Exponential(1.0)}[prior]

    def model(x, y):
        pyro.sample("z", family)

    def guide(x, y):
        pyro.sample("z", dist.Normal(0.5, 1.0))

    pyro.set_rng_seed(0)
    with pyro.validation_enabled(True):
        result = psis_diagnostic(model, guide, torch.randn(5, 2), torch.randn(5), num_samples=400)
    outside = torch.isinf(result.log_weights)
    # P(z < 0) = 0.31 under the guide, P(z > 1) another 0.31 for Uniform(0, 1)
    share = 0.62 if prior == "uniform" else 0.31
    assert abs(float(outside.double().mean()) - share) < 0.08
    assert bool((result.log_weights[outside] < 0).all())
    if prior == "uniform":  # inside: log 1 - log N(z; 0.5, 1) >= log sqrt(2 pi)
        inside = result.log_weights[~outside]
        assert bool((inside >= 0.5 * math.log(2 * math.pi) - 1e-6).all())
    assert math.isfinite(result.k_hat)


def test_psis_takes_likelihoods_without_a_support_and_masked_observations():
    """The support is checked on the latent sites only, where it is declared: a likelihood of
    one's own without one, or observations a mask leaves out (NaN there), weigh as before."""

    class NoSupport(dist.TorchDistribution):
        arg_constraints: dict = {}  # noqa: RUF012 (torch reads it off the class)

        def __init__(self, loc):
            self.loc = loc
            super().__init__(loc.shape, torch.Size())

        def log_prob(self, value):
            return -((value - self.loc) ** 2)

    x = torch.randn(6, 1)
    y = torch.tensor([0.3, float("nan"), -0.2, 1.0, float("nan"), 0.1])
    seen = ~torch.isnan(y)

    def own(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 6):
            pyro.sample("obs", NoSupport(w * x[:, 0]), obs=torch.nan_to_num(y))

    def masked(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 6):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0).mask(seen), obs=y)

    def guide(x, y):
        pyro.sample("w", dist.Normal(0.0, 0.5))

    def latent_masked(x, y):  # the guide's draws below 0 only where the model masks them out
        with pyro.plate("units", 2):
            keep = torch.tensor([True, False])
            pyro.sample("rate", dist.Exponential(1.0).mask(keep))
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 6):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=torch.nan_to_num(y))

    def latent_guide(x, y):
        with pyro.plate("units", 2):
            pyro.sample("rate", dist.Normal(torch.tensor([1.0, -1.0]), 0.1))
        pyro.sample("w", dist.Normal(0.0, 0.5))

    for model, q in ((own, guide), (masked, guide), (latent_masked, latent_guide)):
        pyro.set_rng_seed(0)
        with pyro.validation_enabled(False):
            result = psis_diagnostic(model, q, x, y, num_samples=50)
        assert bool(torch.isfinite(result.log_weights).all()) and math.isfinite(result.k_hat)

    def coins(x, y):  # labels in {-1, 1}: data a Bernoulli cannot produce, refused
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 6):
            pyro.sample("obs", dist.Bernoulli(logits=w * x[:, 0]), obs=torch.sign(x[:, 0]))

    with pytest.raises(
        ValueError,
        match=r"The observed values of site 'obs' lie outside the "
        r"support of its distribution \(Bernoulli, .*at \d+ entries.*Pass data",
    ):
        with pyro.validation_enabled(False):
            psis_diagnostic(coins, guide, x, y, num_samples=25)

    def classes(x, y):  # label 3 of 3 classes: said before torch's index error
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", 6):
            logits = torch.stack([w * x[:, 0], -w * x[:, 0], 0 * x[:, 0]], -1)
            labels = torch.tensor([0, 1, 2, 3, 0, 1])
            pyro.sample("obs", dist.Categorical(logits=logits), obs=labels)

    with pytest.raises(ValueError, match=r"site 'obs' lie outside .*Categorical, .* 1 entries"):
        with pyro.validation_enabled(False):
            psis_diagnostic(classes, guide, x, y, num_samples=25)

    def mixture(x, y):  # inside one component's support: a mixture's check is not made
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        parts = dist.Uniform(torch.tensor([0.0, 5.0]), torch.tensor([1.0, 6.0]))
        with pyro.plate("data", 6):
            mix = dist.MixtureSameFamily(dist.Categorical(logits=torch.stack([w, -w])), parts)
            data = torch.tensor([0.5, 5.5, 0.2, 5.1, 0.9, 5.9])
            pyro.sample("obs", mix.expand([6]), obs=data)

    with pyro.validation_enabled(False):
        assert math.isfinite(psis_diagnostic(mixture, guide, x, y, num_samples=25).k_hat)

    def anchored(x, y):  # a scalar observation broadcast over a (2, 3) event
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("anchor", dist.Normal(w.expand(2, 3), 1.0).to_event(2), obs=torch.tensor(0.0))

    assert math.isfinite(psis_diagnostic(anchored, guide, x, y, num_samples=25).k_hat)

    def plain_number(x, y):  # a Python float observed
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        pyro.sample("extra", dist.Normal(w, 1.0), obs=0.5)

    assert math.isfinite(psis_diagnostic(plain_number, guide, x, y, num_samples=25).k_hat)

    def event_entries(x, y):  # an entry-wise support under an event: checked entry by entry
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        rates = dist.Exponential(w.exp().expand(3)).to_event(1)
        with pyro.plate("rows", 5):
            pyro.sample("obs", rates, obs=torch.tensor([1.0, -1.0, 1.0]))

    with pytest.raises(ValueError, match=r"site 'obs' lie outside .* at 1 entries"):
        psis_diagnostic(event_entries, guide, x, y, num_samples=25)

    def masked_nowhere(x, y):  # a mask of True everywhere leaves nothing out: still checked
        with pyro.plate("units", 3), poutine.mask(mask=torch.ones(3, dtype=torch.bool)):
            pyro.sample("rate", dist.Exponential(1.0))

    def loose(x, y):
        with pyro.plate("units", 3):
            pyro.sample("rate", dist.Normal(0.0, 1.0))

    pyro.set_rng_seed(0)
    weights = psis_diagnostic(masked_nowhere, loose, x, y, num_samples=40).log_weights
    assert 20 < int(torch.isinf(weights).sum()) < 40  # P(some rate < 0) = 7/8


def test_psis_works_with_an_autoguide():
    model, x, y, *_ = _regression()
    guide = pyro.infer.autoguide.AutoNormal(model)
    result = psis_diagnostic(model, guide, x, y, num_samples=50)
    assert math.isfinite(result.k_hat) and result.log_weights.shape == (50,)


def test_psis_pyrouq_model_scales_the_likelihood_with_num_data(bayes, data):
    """log w(num_data=3N) - log w(default) = 2 * sum_n log p(y_n | w), draw by draw."""
    model, guide = bayes
    x, y = data
    model.num_data = 1000
    pyro.set_rng_seed(4)
    plain = psis_diagnostic(model, guide, x, y, num_samples=30)
    pyro.set_rng_seed(4)
    scaled = psis_diagnostic(model, guide, x, y, num_samples=30, num_data=3 * N)
    assert model.num_data == 1000  # restored
    pyro.set_rng_seed(4)
    log_lik = []
    for _ in range(30):
        weights = guide()
        log_lik.append(model.outputs(x, weights).log_softmax(-1).gather(1, y[:, None]).sum())
    torch.testing.assert_close(
        scaled.log_weights - plain.log_weights,
        2 * torch.stack(log_lik).double().detach(),
        rtol=1e-5,
        atol=1e-4,
    )
    # a full-size-like situation: the mean-field guide at initialisation is far off
    assert plain.k_hat > 0.7


def test_psis_pyrouq_model_without_num_data(bayes, data):
    model, guide = bayes
    assert model.num_data is None
    result = psis_diagnostic(model, guide, *data, num_samples=25)
    assert result.log_weights.shape == (25,) and model.num_data is None


def test_psis_errors(bayes, data):
    model, guide = bayes
    x, y = data
    with pytest.raises(ValueError, match=r"num_samples to be an integer >= 25, got 10"):
        psis_diagnostic(model, guide, x, y, num_samples=10)
    with pytest.raises(ValueError, match=r"same number of points"):
        psis_diagnostic(model, guide, x[:3], y)
    with pytest.raises(ValueError, match=r"guide is None"):
        psis_diagnostic(model, None, x, y)
    with pytest.raises(ValueError, match=r"num_data to be an integer >= 1, got 0"):
        psis_diagnostic(model, guide, x, y, num_data=0)
    reg, rx, ry, *_ = _regression()
    with pytest.raises(ValueError, match=r"latent site\(s\) \['w'\] are missing from the guide"):
        psis_diagnostic(reg, lambda x, y: None, rx, ry, num_samples=25)


@pytest.mark.parametrize("fn", ["psis", "export"])
def test_inputs_of_another_shape_are_refused_as_predict_refuses_them(bayes, data, fn):
    """psis_diagnostic() ran BayesianMLP's check of x inside Pyro's trace, which appended
    its table of site shapes ("Trace Shapes: Param Sites: Sample Sites:") to the message and
    chained the same error above it: a traceback twice as long, ending in an empty table,
    where predict() and to_inference_data() say the sentence alone."""
    model, guide = bayes
    x, y = data
    with pytest.raises(ValueError) as info:
        if fn == "psis":
            psis_diagnostic(model, guide, x[:, :3], y, num_samples=25)
        else:
            to_inference_data(model, guide, x[:, :3], y, num_samples=2)
    assert str(info.value) == (
        "BayesianMLP expects inputs of shape (B, 4) (or (B, ...) with 4 values per example), "
        f"got shape ({N}, 3). Flatten the images (load_mnist(flatten=True)) or set in_features."
    )
    assert info.value.__cause__ is None


# --------------------------------------------------------------------------------------------
# MCMC results: hand-made draws (no sampler run), checked against hand computations
# --------------------------------------------------------------------------------------------


def _hand_made_chain(num_draws=4):
    """A Bayesian linear regression and one chain of draws of its weights, as mcmc() would
    return them, without running a sampler."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=g)
    y = x @ torch.tensor([1.0, -1.0]) + 0.3 * torch.randn(N, generator=g)
    model = pyrouq.bayesian(torch.nn.Linear(2, 1), likelihood=pyrouq.Gaussian(0.5))
    samples = {
        "weight": torch.randn(1, num_draws, 1, 2, generator=g),
        "bias": torch.randn(1, num_draws, 1, generator=g),
    }
    stats = {
        "diverging": torch.zeros(1, num_draws, dtype=torch.bool),
        "step_size": torch.full((1, num_draws), 0.1, dtype=torch.float64),
        "tree_depth": torch.full((1, num_draws), 2),
        "energy": torch.arange(num_draws, dtype=torch.float64)[None],
    }
    result = pyrouq.MCMCResult(samples, stats, "nuts", 10, model=model, x=x, y=y)
    return result, model, x, y


def test_one_mcmc_chain_exports_the_log_likelihood_of_its_draws():
    result, _, x, y = _hand_made_chain()
    idata = to_inference_data(result)
    assert idata.posterior.attrs["draws"] == "1 MCMC chain (nuts)"  # not "1 MCMC chains"
    w, b = result.samples["weight"][0, :, 0].double(), result.samples["bias"][0].double()
    loc = w @ x.double().T + b  # (S, N)
    expected = torch.distributions.Normal(loc, 0.5).log_prob(y.double())
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], expected.numpy(), rtol=1e-6)
    assert idata.sample_stats["energy"].values.tolist() == [[0.0, 1.0, 2.0, 3.0]]


def test_an_mcmc_result_in_a_guides_place_is_a_clear_error():
    result, model, x, y = _hand_made_chain()
    guide = mean_field_guide(model)
    calls = [
        (lambda: to_inference_data(model, result, x, y),
         r"to_inference_data\(\): got an MCMCResult as the guide; an MCMC run is exported "
         r"alone, to_inference_data\(result\)"),
        (lambda: to_inference_data(result, guide),
         r"to_inference_data\(\): got an MCMCResult and a guide \(MeanFieldGuide\); an MCMC "
         r"run's draws are the posterior, with no guide\. Call to_inference_data\(result\)"),
        (lambda: psis_diagnostic(model, result, x, y),
         r"psis_diagnostic\(\): got an MCMCResult; the diagnostic weighs a guide's draws by "
         r"their density q\(w\), which MCMC draws have none of\. .*az\.loo\(idata\)"),
    ]  # fmt: skip
    for call, pattern in calls:
        with pytest.raises(TypeError) as info:
            call()
        assert re.search(pattern, str(info.value)), str(info.value)
