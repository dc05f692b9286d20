"""Audit of the arviz export and the PSIS check against hand computations and arviz itself."""

from __future__ import annotations

import re
import warnings

import arviz as az
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import hand_made_chains, regression_data, tiny_mlp, toy_data
from torch import nn

from pyrouq import Gaussian, bayesian, mean_field_guide, psis_diagnostic, to_inference_data


def test_guide_export_log_likelihood_is_log_softmax_at_the_label_of_each_draw():
    pyro.set_rng_seed(0)
    x, y = toy_data(20)
    model = tiny_mlp()
    idata = to_inference_data(model, mean_field_guide(model), x, y, num_samples=8, seed=1)
    post, ll = idata.posterior, idata.log_likelihood["obs"].values
    assert ll.shape == (1, 8, 20) and idata.log_likelihood["obs"].dims[-1] == "obs_id"
    for d in range(8):
        w = {name: torch.as_tensor(post[name].values[0, d]) for name in post.data_vars}
        hidden = torch.relu(F.linear(x, w["fc1.weight"], w["fc1.bias"]))
        logits = F.linear(hidden, w["fc2.weight"], w["fc2.bias"]).double()
        hand = logits.log_softmax(-1)[torch.arange(20), y].numpy()
        np.testing.assert_allclose(ll[0, d], hand, atol=1e-6)
    np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
    lppd = np.log(np.exp(ll[0]).mean(0)).sum()  # the in-sample bound az.loo sits just below
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (Pareto k warnings at S = 8)
        elpd = az.loo(idata).elpd_loo
    assert lppd - 1.0 < elpd <= lppd


def test_mcmc_export_puts_chain_c_draw_d_where_the_result_has_it():
    result, x, y = hand_made_chains(10, num_chains=3, num_draws=4)
    idata = to_inference_data(result, seed=0)
    ll = idata.log_likelihood["obs"].values
    assert ll.shape == (3, 4, 10)
    for c in range(3):
        for d in range(4):
            w, b = result.samples["weight"][c, d], result.samples["bias"][c, d]
            np.testing.assert_array_equal(idata.posterior["weight"].values[c, d], w.numpy())
            loc = (x @ w.T + b).squeeze(-1).double()
            hand = torch.distributions.Normal(loc, 0.5).log_prob(y.double()).numpy()
            np.testing.assert_allclose(ll[c, d], hand, atol=1e-9)
            assert idata.sample_stats["energy"].values[c, d] == c * 4 + d
    raw = az.convert_to_dataset({"bias": result.samples["bias"].numpy()})
    np.testing.assert_allclose(az.rhat(idata)["bias"].values, az.rhat(raw)["bias"].values)


def test_multi_output_regression_sums_the_log_density_over_outputs():
    pyro.set_rng_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 3, generator=g), torch.randn(12, 2, generator=g)
    model = bayesian(nn.Linear(3, 2), likelihood=Gaussian(0.5))
    idata = to_inference_data(model, mean_field_guide(model), x, y, num_samples=3, seed=0)
    assert idata.observed_data["obs"].dims == ("obs_id", "output")
    np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
    assert idata.posterior_predictive["obs"].shape == (1, 3, 12, 2)
    for d in range(3):
        w = torch.as_tensor(idata.posterior["weight"].values[0, d])
        b = torch.as_tensor(idata.posterior["bias"].values[0, d])
        normal = torch.distributions.Normal((x @ w.T + b).double(), 0.5)
        hand = normal.log_prob(y.double()).sum(-1).numpy()
        np.testing.assert_allclose(idata.log_likelihood["obs"].values[0, d], hand, atol=1e-9)


def test_psis_log_weights_and_k_hat_match_a_hand_computation_and_arviz():
    x, y = regression_data(12)
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    loc, bias, scale = torch.tensor([[0.9, -0.8]]), torch.tensor([0.05]), 0.1

    def guide(x, y):
        pyro.sample("weight", dist.Normal(loc, scale).to_event(2))
        pyro.sample("bias", dist.Normal(bias, scale).to_event(1))

    result = psis_diagnostic(model, guide, x, y, num_samples=100, seed=3, num_data=24)
    pyro.set_rng_seed(3)  # the same draws, as the seed= documents
    hand = []
    for _ in range(100):
        w, b = dist.Normal(loc, scale).sample(), dist.Normal(bias, scale).sample()
        prior = dist.Normal(0.0, 1.0).log_prob(w).sum() + dist.Normal(0.0, 1.0).log_prob(b).sum()
        lik = dist.Normal((x @ w.T + b).squeeze(-1), 0.3).log_prob(y).sum()
        q = dist.Normal(loc, scale).log_prob(w).sum() + dist.Normal(bias, scale).log_prob(b).sum()
        hand.append(float(prior + 2.0 * lik - q))  # num_data=24 of N=12: likelihood x 2
    np.testing.assert_allclose(result.log_weights.numpy(), hand, rtol=1e-5, atol=1e-4)
    _, k_hat = az.psislw(result.log_weights.numpy().copy(), reff=1.0)
    assert result.k_hat == pytest.approx(float(k_hat))


FEATURES = re.escape("failed on x (shape (10, 4), dtype torch.float32)")


def test_export_names_x_a_bayesian_network_does_not_take():
    model = bayesian(nn.Linear(3, 1), likelihood=Gaussian(0.5))
    x, y = torch.randn(10, 4), torch.randn(10)
    with pytest.raises(ValueError, match=r"to_inference_data\(\): BayesianNetwork " + FEATURES):
        to_inference_data(model, mean_field_guide(model), x, y, num_samples=2)


def test_mcmc_export_names_x_the_network_does_not_take():
    result, _, _ = hand_made_chains(10)
    # (the network is a bare Linear: named at 'net' with its fix since ee6c631, where it said
    # 'Check that the model takes x (shape, channels, flattening ...)')
    told = r"cannot be multiplied .* at 'net' of the model\): the model's input, of 3 features "
    with pytest.raises(ValueError, match=told + r"where this layer takes 2\. Pass inputs of 2 "):
        to_inference_data(result, x=torch.randn(10, 3))


def test_psis_names_x_a_bayesian_network_does_not_take():
    model = bayesian(nn.Linear(3, 1), likelihood=Gaussian(0.5))
    x, y = torch.randn(10, 4), torch.randn(10)
    with pytest.raises(ValueError, match=FEATURES + " at the guide's first draw: mat1") as info:
        psis_diagnostic(model, mean_field_guide(model), x, y, num_samples=25)
    assert "Trace Shapes" not in str(info.value)


def test_mcmc_export_of_more_chains_than_draws_does_not_warn_of_a_wrong_layout():
    result, _, _ = hand_made_chains(10, num_chains=4, num_draws=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = to_inference_data(result, seed=0)
    assert [str(w.message) for w in caught if "More chains" in str(w.message)] == []
    assert idata.posterior["weight"].dims[:2] == ("chain", "draw")
    np.testing.assert_array_equal(idata.posterior["bias"].values, result.samples["bias"].numpy())


def test_export_and_psis_say_a_first_layers_fix_for_x_once():
    """8066050 said a converted network's first layer's fix for x (a colour network given grey
    images) in fit(), predict() and mcmc() alone: the export and the PSIS check put a second
    period and their generic hint after it ('in_channels=1).. Check that the model takes x')."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(64, 3)))
    guide = mean_field_guide(model)
    x, y = torch.randn(4, 1, 6, 6), torch.tensor([0, 1, 2, 0])
    fix = re.escape(
        "at 'net.0' of the model): the model's input, of 1 channel where this layer takes 3. "
        "Repeat the grey channel, x.expand(-1, 3, -1, -1), or build the network for 1 input "
        "channel (its first layer's in_channels=1)."
    )
    with pytest.raises(ValueError, match=r"^to_inference_data\(\): .*" + fix + "$"):
        to_inference_data(model, guide, x, y, num_samples=2)
    with pytest.raises(ValueError, match=r"^psis_diagnostic\(\): .*draw: .*" + fix + "$"):
        psis_diagnostic(model, guide, x, y, num_samples=25)


def test_a_rank1_draws_identical_members_export_their_own_mean():
    # the members' mixture mean was loc.mean(0), an ulp off identical members' value (7 of
    # 0.1: -1.4e-17) where GaussianPredictions.mean keeps it within the draws' range; both
    # now take the one mixture_mean
    from pyrouq.diagnostics._store import _Draws, _store_logits
    from pyrouq.regression import GaussianPredictions

    v = torch.tensor([0.1, 0.7, 1 / 3, 2.2], dtype=torch.float64)
    members = v.reshape(1, 4, 1).expand(7, 4, 1).clone()  # (M, N, D): seven alike
    assert not torch.equal(members.mean(0), members[0])  # (sum / M is an ulp off)
    out = _Draws(1)
    _store_logits(out, 0, slice(0, 4), members, v.clone(), 4, Gaussian(0.5), None, True)
    assert torch.equal(out.values["loc"][0], members[0])
    assert torch.equal(out.values["scale"][0], torch.full((4, 1), 0.5, dtype=torch.float64))
    preds = GaussianPredictions(members, torch.full_like(members, 0.5))
    assert torch.equal(out.values["loc"][0], preds.mean)  # one quantity, one value
