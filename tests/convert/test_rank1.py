"""Rank-1 Bayesian BatchEnsembles: ``bayesian(batchensemble(net, M))`` and ``rank1()``."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import KLWeightedELBO, batchensemble, bayesian, mean_field_guide, predict, rank1

M = 3


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)
    )


def _batch(n=6):
    torch.manual_seed(1)
    return torch.randn(n, 1, 8, 8), torch.randint(0, 5, (n,))


def test_composition_makes_the_factors_latent_and_keeps_the_rest_point_estimates():
    ensemble = batchensemble(_net(), M, norms="shared")  # rank1()'s default
    model = bayesian(
        ensemble, select=lambda name, p: name.endswith((".r", ".s")), prior=dist.Normal(1.0, 0.1)
    )
    assert {s: tuple(v) for s, v in model.latent_sites().items()} == {
        "0.r": (M, 1),
        "0.s": (M, 4),
        "4.r": (M, 144),
        "4.s": (M, 5),
    }
    # shared weights, member biases and BatchNorm stay ordinary parameters
    assert [n for n, _ in model.named_parameters()] == [
        "net.0.weight",
        "net.0.bias",
        "net.1.weight",
        "net.1.bias",
        "net.4.weight",
        "net.4.bias",
    ]
    assert model.num_members == M
    prior = model.priors()["4.r"]
    assert torch.allclose(prior.mean, torch.ones(M, 144))
    assert torch.allclose(prior.stddev, torch.full((M, 144), 0.1))
    # select=None picks the same factors, and rank1() is this composition
    with pytest.warns(UserWarning, match=r"puts a Normal\(0, 1.0\) prior on the rank-1 factors"):
        assert list(bayesian(ensemble).latent_sites()) == list(model.latent_sites())
    same = rank1(_net(), M)
    assert list(same.latent_sites()) == list(model.latent_sites())
    assert [n for n, _ in same.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert batchensemble(_net(), M).options["norms"] == "per_member"  # a BatchEnsemble's default


def test_last_layer_of_a_batchensemble_is_its_last_linears_factors():
    net = nn.Sequential(nn.Conv1d(2, 4, 3), nn.Flatten(), nn.Linear(8, 6), nn.Tanh(),
                        nn.Linear(6, 3))  # fmt: skip
    model = bayesian(batchensemble(net, 2), select="last_layer", prior=dist.Normal(1.0, 0.1))
    assert {k: tuple(v) for k, v in model.latent_sites().items()} == {
        "4.r": (2, 6),
        "4.s": (2, 3),
    }
    convs = batchensemble(nn.Sequential(nn.Conv1d(2, 3, 4), nn.Flatten()), 2)
    with pytest.raises(ValueError, match=r"needs a BatchEnsembleLinear .* this BatchEnsemble has "
                       r"none\. .* e\.g\. its last convolution's: \['0\.r', '0\.s'\]"):  # fmt: skip
        bayesian(convs, select="last_layer", prior=dist.Normal(1.0, 0.1))
    # nor any layer at all: the message, not an IndexError
    with pytest.raises(ValueError, match=r"select='last_layer' needs an nn.Linear, and "
                       r"Sequential has none\. Pass select= the names"):  # fmt: skip
        bayesian(nn.Sequential(nn.Embedding(5, 3), nn.Flatten()), select="last_layer")
    # messages and repr name the user's classes, not the engine's faster stand-ins
    ensemble = batchensemble(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)), 2)
    with pytest.raises(ValueError, match="matches no parameter of Sequential\\."):
        bayesian(ensemble, select=["zzz"], prior=dist.Normal(1.0, 0.1))
    pooled = bayesian(nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.MaxPool2d(3, 1),
                                    nn.Flatten(), nn.Linear(2, 3)))  # fmt: skip
    shown = repr(pooled)
    assert "(net): Sequential(" in shown and shown.count("MaxPool2d(kernel_size=") == 2
    assert "Swapping" not in shown and "MaxPool2x2" not in shown and "ChannelsLast" not in shown


def test_under_the_ensembles_own_factors_it_predicts_what_the_batchensemble_predicts():
    ensemble = batchensemble(_net(), M).eval()
    model = rank1(_net(), M)
    model.net.load_state_dict(ensemble.net.state_dict(), strict=False)
    layers = dict(ensemble.net.named_modules())
    draws = {
        site: getattr(layers[site[:-2]], site[-1]).detach()[None] for site in model.latent_sites()
    }
    x, _ = _batch()
    got = predict(model, x, posterior_samples=draws).probs
    assert got.shape == (M, 6, 5)
    assert torch.allclose(got, predict(ensemble, x).probs, atol=1e-6)


@pytest.mark.parametrize("members", [M, 1])  # one member: still (K * 1, B, C)
def test_predict_gives_k_times_m_draws_in_draw_major_order(members):
    model = rank1(_net(), members)
    model.eval()
    guide = mean_field_guide(model, init_scale=0.3)
    x, _ = _batch()
    k = 4
    draws = {site: torch.stack([guide.sample()[site] for _ in range(k)]) for site in guide.sites}
    probs = predict(model, x, posterior_samples=draws).probs
    assert probs.shape == (k * members, 6, 5)
    for draw in range(k):
        outputs = model.outputs(x, {s: v[draw] for s, v in draws.items()})  # (M, B, C)
        for member in range(members):
            expected = torch.softmax(outputs[member], -1)
            assert torch.allclose(probs[draw * members + member], expected, atol=1e-6)
    # the guide path: K draws, each running every member
    assert predict(model, x, guide, num_samples=k).probs.shape == (k * members, 6, 5)


def test_predict_with_the_same_seed_gives_the_same_draws():
    model = rank1(_net(), M)
    guide = mean_field_guide(model, init_scale=0.3)
    x, _ = _batch()
    pyro.set_rng_seed(7)
    first = predict(model, x, guide, num_samples=5).probs
    pyro.set_rng_seed(7)
    again = predict(model, x, guide, num_samples=5).probs
    pyro.set_rng_seed(8)
    other = predict(model, x, guide, num_samples=5).probs
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_the_objective_is_the_members_summed_nll_plus_the_per_component_kl():
    model = rank1(_net(), M, prior_scale=0.2)
    model.num_data = 60
    guide = mean_field_guide(model, init_scale=1e-8)  # draws at the locations
    x, y = _batch()
    model.eval()  # BatchNorm with running statistics: members run independently
    terms = KLWeightedELBO(kl_weight=0.5).terms(model, guide, x, y)
    # KL of every member row's Gaussian to Normal(1, 0.2), by the closed form
    kl = 0.0
    for site in guide.sites:
        mu, sd = guide.site_loc(site).detach(), guide.site_scale(site).detach()
        kl += float(
            (math.log(0.2) - torch.log(sd) + (sd**2 + (mu - 1) ** 2) / (2 * 0.2**2) - 0.5).sum()
        )
    assert float(terms.kl) == pytest.approx(kl, rel=1e-5)
    outputs = model.outputs(x, {s: guide.site_loc(s) for s in guide.sites})
    nll = sum(
        torch.nn.functional.cross_entropy(outputs[m], y, reduction="sum") for m in range(M)
    ).detach() * (60 / 6)
    assert float(terms.nll) == pytest.approx(float(nll), rel=1e-4)
    assert float(terms.loss.detach()) == pytest.approx(float(nll) + 0.5 * kl, rel=1e-4)


def test_fit_trains_the_factors_guide_and_the_shared_weights():
    model = rank1(_net(), M)
    guide = mean_field_guide(model)
    x, y = _batch(12)
    before_w = model.net[0].weight.clone()
    before_loc = guide.site_loc("0.s").detach().clone()
    pyrouq.fit(model, guide, [(x, y)], epochs=2, progress=False, num_data=12, seed=0)
    assert not torch.equal(model.net[0].weight, before_w)
    assert not torch.equal(guide.site_loc("0.s"), before_loc)


def test_checkpoints_round_trip_bit_exactly(tmp_path):
    model = rank1(_net(), M)
    guide = mean_field_guide(model)
    x, y = _batch(12)
    pyrouq.fit(model, guide, [(x, y)], epochs=2, progress=False, num_data=12, seed=0)
    path = tmp_path / "rank1.pt"
    pyrouq.save(path, model, guide)
    saved = pyrouq.load(path, module=_net())
    assert saved.model.num_members == M
    for a, b in ((model, saved.model), (guide, saved.guide)):
        state, loaded = a.state_dict(), b.state_dict()
        assert state.keys() == loaded.keys()
        assert all(torch.equal(state[k], loaded[k]) for k in state)
    pyro.set_rng_seed(3)
    first = predict(model, x, guide, num_samples=2).probs
    pyro.set_rng_seed(3)
    assert torch.equal(first, predict(saved.model, x, saved.guide, num_samples=2).probs)


def test_a_rank1_lenet_checkpoint_loads_without_a_skeleton(tmp_path):
    model = rank1(pyrouq.LeNet(), 2)
    path = tmp_path / "lenet.pt"
    pyrouq.save(path, model, mean_field_guide(model))
    saved = pyrouq.load(path)
    assert list(saved.model.latent_sites()) == list(model.latent_sites())


def test_inference_data_mixes_each_draws_members():
    model = rank1(_net(), M).eval()
    guide = mean_field_guide(model, init_scale=0.3)
    x, y = _batch()
    pyro.set_rng_seed(0)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=4)
    assert idata.posterior["4.r"].shape == (1, 4, M, 144)
    loglik = torch.as_tensor(idata.log_likelihood["obs"].values[0])  # (S, N)
    weights = {s: torch.as_tensor(idata.posterior[s].values[0]) for s in model.latent_sites()}
    for draw in range(4):
        outputs = model.outputs(x, {s: w[draw] for s, w in weights.items()})
        mixture = torch.softmax(outputs, -1).mean(0)[torch.arange(6), y].log()
        assert torch.allclose(loglik[draw].float(), mixture, atol=1e-5)


@pytest.mark.parametrize("scale", ["heteroscedastic", dist.HalfNormal(1.0)])
def test_inference_data_of_a_gaussian_rank1_is_each_draws_member_mixture(scale):
    torch.manual_seed(0)
    out = 2 if scale == "heteroscedastic" else 1
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, out))
    model = rank1(net, M, likelihood=pyrouq.Gaussian(scale))
    guide = mean_field_guide(model, init_scale=0.3)
    x, y = torch.randn(50, 3), torch.randn(50)
    pyro.set_rng_seed(0)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=4)
    assert set(idata.posterior_predictive) == {"obs", "loc", "scale"}
    assert idata.posterior_predictive["loc"].shape == (1, 4, 50, 1)
    names = [s for s in model.latent_sites() if s != "sigma"]
    weights = {s: torch.as_tensor(idata.posterior[s].values[0]) for s in model.latent_sites()}
    loglik = torch.as_tensor(idata.log_likelihood["obs"].values[0])
    for draw in range(4):
        one = {s: w[draw] for s, w in weights.items()}
        outputs = model.outputs(x, {s: one[s] for s in names}).double()  # (M, N, out)
        if out == 2:
            loc, sd = outputs[..., 0], 1e-3 + nn.functional.softplus(outputs[..., 1])
        else:
            loc, sd = outputs[..., 0], one["sigma"].double().expand_as(outputs[..., 0])
        # the mixture's log density, mean and standard deviation, by hand
        density = torch.distributions.Normal(loc, sd).log_prob(y.double()).exp().mean(0)
        torch.testing.assert_close(loglik[draw], density.log(), rtol=0, atol=1e-4)
        mean = loc.mean(0)
        spread = ((sd**2 + loc**2).mean(0) - mean**2).sqrt()
        pp = idata.posterior_predictive
        torch.testing.assert_close(
            torch.as_tensor(pp["loc"].values[0, draw, :, 0]).double(), mean, atol=1e-5, rtol=0
        )
        torch.testing.assert_close(
            torch.as_tensor(pp["scale"].values[0, draw, :, 0]).double(), spread, atol=1e-5,
            rtol=0,
        )  # fmt: skip
    # obs is drawn from the mixture itself: 4,000 copies of one input (in batches of 1,024)
    # under one draw follow the members' mixture, not the Normal of the same mean and spread
    pyro.set_rng_seed(0)
    with pytest.warns(UserWarning, match="one draw exported"):  # (az.loo is not wanted here)
        many = pyrouq.to_inference_data(model, guide, x[:1].expand(4000, 3),
                                        y[:1].expand(4000), num_samples=1)  # fmt: skip
    obs = torch.as_tensor(many.posterior_predictive["obs"].values[0, 0]).double().sort().values
    one = {s: torch.as_tensor(many.posterior[s].values[0, 0]) for s in model.latent_sites()}
    outputs = model.outputs(x[:1], {s: one[s] for s in names}).double()[:, 0]  # (M, out)
    loc = outputs[:, 0]
    sd = 1e-3 + nn.functional.softplus(outputs[:, 1]) if out == 2 else one["sigma"].double()
    mixture = torch.distributions.Normal(loc[:, None], sd[..., None]).cdf(obs).mean(0)
    empirical = torch.arange(1, 4001, dtype=torch.float64) / 4000
    assert (mixture - empirical).abs().max() < 0.03  # Kolmogorov-Smirnov, p < 0.001 beyond
    if out == 2:  # members of distinct means and scales: the moment-matched Normal is off
        spread = float(many.posterior_predictive["scale"].values[0, 0, 0, 0])
        normal = torch.distributions.Normal(loc.mean(), spread).cdf(obs)
        assert (normal - empirical).abs().max() > 2 * (mixture - empirical).abs().max()


def test_stacked_draws_with_per_member_batchnorms_in_training():
    """Per-member BatchNorm copies still compute batch statistics: stacked draws in training
    run one draw at a time on every schedule (no vmap over in-place running statistics)."""
    from pyrouq import _engine

    model = rank1(_net(), M, norms="per_member")
    guide = mean_field_guide(model, init_scale=0.3)
    x, _ = _batch()
    draws = {site: torch.stack([guide.sample()[site] for _ in range(3)]) for site in guide.sites}
    model.train()
    one_by_one = torch.stack(
        [model.outputs(x, {s: v[d] for s, v in draws.items()}) for d in range(3)]
    )
    for kind in ("cpu", "accelerator"):
        with _engine.schedule(kind):
            torch.testing.assert_close(model.outputs(x, draws), one_by_one, rtol=1e-5, atol=1e-6)
