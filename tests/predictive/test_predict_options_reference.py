"""Audit 13: predict() and fit() options against independent references (hand loops over
guide traces and ``torch.func.functional_call``, a hand KL-weighted ELBO, the schedule's
formula), and predict() on a BayesianNetwork subclass whose forward samples a site of its own."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import tiny_mlp, toy_data
from pyro.infer import Predictive
from pyro.infer.autoguide import AutoNormal
from torch import nn
from torch.distributions import Normal, kl_divergence
from torch.func import functional_call

import pyrouq
from pyrouq import MLP, fit, mean_field_guide, predict, rank1
from pyrouq.models import BayesianMLP


def _moved(guide, scale=0.1):
    """The guide's parameters moved off their start, so that draws differ visibly."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return guide


def _hand_guide_probs(model, guide, x, num_samples, seed):
    """S guide traces drawn first (as Predictive draws them), then the plain network under
    each draw's weights by functional_call, softmaxed."""
    plain = model.plain_network()
    with torch.random.fork_rng():
        pyro.set_rng_seed(seed)
        traces = [pyro.poutine.trace(guide).get_trace(x) for _ in range(num_samples)]
    probs = []
    for trace in traces:
        weights = {site: trace.nodes[site]["value"].detach() for site in model.latent_sites()}
        probs.append(torch.softmax(functional_call(plain, weights, (x,)), -1))
    return torch.stack(probs)


# --------------------------------------------------------------------------------------------
# predict(): guide draws, seeds, posterior samples, rank-1
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 7, 13])
@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("num_samples", [1, 5])
def test_guide_draws_equal_a_hand_loop_of_traces_and_functional_call(
    batch_size, parallel, num_samples
):
    model, (x, _) = tiny_mlp(), toy_data(13)
    guide = _moved(mean_field_guide(model))
    got = predict(
        model, x, guide, num_samples, batch_size, parallel=parallel, seed=3, progress=False
    )
    want = _hand_guide_probs(model, guide, x, num_samples, seed=3)
    assert got.probs.shape == (num_samples, 13, 2) and got.probs.dtype == torch.float32
    torch.testing.assert_close(got.probs, want, rtol=0, atol=1e-6)
    assert torch.equal(got.predicted, want.double().mean(0).argmax(-1))


def test_seed_repeats_leaves_the_global_stream_and_is_pyros_seed():
    model, (x, _) = tiny_mlp(), toy_data(9)
    guide = _moved(mean_field_guide(model))
    before = torch.get_rng_state()
    first = predict(model, x, guide, num_samples=4, seed=11, progress=False)
    assert torch.equal(torch.get_rng_state(), before)
    torch.randn(5)  # the global stream moved: the seeded call does not care
    again = predict(model, x, guide, num_samples=4, seed=11, progress=False)
    assert torch.equal(first.probs, again.probs)
    pyro.set_rng_seed(11)  # without seed=, the global stream as pyro.set_rng_seed leaves it
    unseeded = predict(model, x, guide, num_samples=4, progress=False)
    assert torch.equal(first.probs, unseeded.probs)
    assert predict(model, x, guide, progress=False).num_samples == 32  # DEFAULT_NUM_SAMPLES


def test_autonormal_draws_equal_the_hand_loop():
    model, (x, y) = tiny_mlp(num_data=13), toy_data(13)
    guide = AutoNormal(model, init_scale=0.2)
    guide(x, y)
    got = predict(model, x, guide, num_samples=4, batch_size=5, seed=7, progress=False)
    torch.testing.assert_close(
        got.probs, _hand_guide_probs(model, guide, x, 4, seed=7), rtol=0, atol=1e-6
    )


def test_posterior_samples_equal_a_hand_loop_in_the_models_dtype():
    model, (x, _) = tiny_mlp(), toy_data(13)
    g = torch.Generator().manual_seed(2)
    draws = {k: 0.5 * torch.randn(6, *s, generator=g) for k, s in model.latent_sites().items()}
    plain = model.plain_network()
    want = torch.stack(
        [
            torch.softmax(functional_call(plain, {k: v[s] for k, v in draws.items()}, (x,)), -1)
            for s in range(6)
        ]
    )
    numpy64 = {k: v.double().numpy() for k, v in draws.items()}
    for samples in (draws, numpy64):
        got = predict(model, x, posterior_samples=samples, batch_size=7, progress=False)
        assert got.probs.dtype == torch.float32
        torch.testing.assert_close(got.probs, want, rtol=0, atol=1e-6)


def test_rank1_draws_run_their_members_draw_major():
    x, _ = toy_data(13)
    model = rank1(MLP(in_features=3, hidden_features=8, out_features=2), 3)
    guide = _moved(mean_field_guide(model))
    got = predict(model, x, guide, num_samples=2, batch_size=7, seed=4, progress=False)
    with torch.random.fork_rng():
        pyro.set_rng_seed(4)
        traces = [pyro.poutine.trace(guide).get_trace(x) for _ in range(2)]
    want = torch.cat(
        [
            torch.softmax(
                model.outputs(x, {k: t.nodes[k]["value"] for k in model.latent_sites()}), -1
            )
            for t in traces
        ]
    )
    assert got.probs.shape == (6, 13, 2)  # K = 2 draws of M = 3 members
    torch.testing.assert_close(got.probs, want, rtol=0, atol=1e-6)
    assert predict(model, x, guide, progress=False).num_samples == (32 // 3) * 3


# --------------------------------------------------------------------------------------------
# predict() on a subclass whose forward is its own
# --------------------------------------------------------------------------------------------


class _Tempered(BayesianMLP):
    """A forward that draws a temperature beside the weights and divides the logits by it."""

    def forward(self, x, y=None):
        t = pyro.sample("temp", dist.LogNormal(0.0, 1.0))
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        logits = self.outputs(x, weights) / t
        pyro.deterministic("logits", logits)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def _tempered():
    model = _Tempered(in_features=3, hidden_features=20, out_features=2, num_data=13)
    x, y = toy_data(13)
    guide = AutoNormal(model, init_scale=0.3)
    guide(x, y)
    with torch.no_grad():
        guide.locs.temp.fill_(1.5)  # temperatures about e^1.5: far from 1
    return model, guide, x


def test_predict_with_autonormal_uses_the_site_a_subclass_forward_samples():
    """predict() ran model.outputs() on the weights alone: the temperature drawn in the
    forward was left out (max |probs - reference| 0.32)."""
    model, guide, x = _tempered()
    got = predict(model, x, guide, num_samples=4, batch_size=5, seed=5, progress=False)
    with torch.random.fork_rng():  # the guide's S draws, then the model replayed on each
        pyro.set_rng_seed(5)
        traces = [pyro.poutine.trace(guide).get_trace(x) for _ in range(4)]
    want = torch.stack(
        [
            torch.softmax(
                pyro.poutine.trace(pyro.poutine.replay(model, trace=t))
                .get_trace(x)
                .nodes["logits"]["value"],
                -1,
            )
            for t in traces
        ]
    )
    assert got.probs.shape == (4, 13, 2)
    torch.testing.assert_close(got.probs, want.detach(), rtol=0, atol=1e-6)


def test_predict_on_predictives_draws_gives_predictives_logits():
    model, guide, x = _tempered()
    sites = ["temp", *model.latent_sites(), "logits"]
    with torch.random.fork_rng():
        pyro.set_rng_seed(11)
        ref = Predictive(model, guide=guide, num_samples=5, return_sites=sites)(x)
    got = predict(model, x, posterior_samples=ref, batch_size=4, progress=False)
    want = torch.softmax(ref["logits"].reshape(5, 13, 2), -1)
    torch.testing.assert_close(got.probs, want, rtol=0, atol=1e-6)


def test_a_guide_without_the_site_a_subclass_forward_samples_is_refused():
    """Its draws were taken without the temperature, which predict() left out silently."""
    model, _, x = _tempered()
    with pytest.raises(ValueError, match=r"the model's latent site 'temp' \(\) is not in it"):
        predict(model, x, mean_field_guide(model), num_samples=2, progress=False)


def test_a_subclass_forward_that_transforms_its_inputs_runs():
    """predict() ran the network on x itself, not on the forward's 2 * x."""

    class Doubled(BayesianMLP):
        def forward(self, x, y=None):
            return super().forward(2 * x, y)

    x, _ = toy_data(13)
    model = Doubled(in_features=3, hidden_features=20, out_features=2)
    guide = _moved(mean_field_guide(model))
    got = predict(model, x, guide, num_samples=3, seed=2, progress=False)
    want = _hand_guide_probs(model, guide, 2 * x, 3, seed=2)
    torch.testing.assert_close(got.probs, want, rtol=0, atol=1e-6)


def test_a_regression_subclass_forward_sampling_a_shift_gives_its_outputs():
    class Shifted(pyrouq.BayesianNetwork):
        def forward(self, x, y=None):
            shift = pyro.sample("shift", dist.Normal(0.0, 1.0))
            weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
            out = self.outputs(x, weights) + shift
            return self.likelihood.observe(out, y, self.num_data, "Shifted")

    model = Shifted(nn.Linear(3, 1), likelihood=pyrouq.Gaussian(0.5))
    x, _ = toy_data(9)
    g = torch.Generator().manual_seed(3)
    draws = {"weight": torch.randn(4, 1, 3, generator=g), "bias": torch.randn(4, 1, generator=g)}
    draws["shift"] = torch.tensor([-3.0, 0.0, 1.0, 5.0])
    got = predict(model, x, posterior_samples=draws, progress=False)
    want = torch.stack(
        [x @ draws["weight"][s].T + draws["bias"][s] + draws["shift"][s] for s in range(4)]
    )
    torch.testing.assert_close(got.loc, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.scale, torch.full_like(want, 0.5))


# --------------------------------------------------------------------------------------------
# fit(): the loss against a hand KL-weighted ELBO, the learning-rate schedules
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kl_weight", "num_data"), [(0.3, 100), (1.0, 10), (None, 50)])
def test_first_epoch_loss_is_the_hand_kl_weighted_elbo(kl_weight, num_data):
    """One step on one batch of B = 10: the record is the loss before the update. A guide of
    scale 1e-6 makes the draw its locations, and the KL is analytic against Normal(0, 1)."""
    x, y = toy_data(10)
    model = tiny_mlp()
    guide = mean_field_guide(model, init_scale=1e-6)
    locs = {s: guide.site_loc(s).detach().clone() for s in guide.sites}
    scales = {s: guide.site_scale(s).detach().clone() for s in guide.sites}
    kl = sum(kl_divergence(Normal(locs[s], scales[s]), Normal(0.0, 1.0)).sum() for s in locs)
    logits = functional_call(model.plain_network(), locs, (x,))
    nll = F.cross_entropy(logits, y, reduction="sum") * num_data / 10
    result = fit(
        model, guide, [(x, y)], epochs=1, num_data=num_data, kl_weight=kl_weight,
        lr_schedule="constant", progress=False, seed=0,
    )  # fmt: skip
    weight = 0.02 if kl_weight is None else kl_weight
    record = result.history[0]
    assert (result.kl_weight, result.num_data, result.steps) == (weight, num_data, 1)
    assert record.nll == pytest.approx(float(nll), rel=1e-5)
    assert record.kl == pytest.approx(float(kl), rel=1e-5)
    assert record.loss == pytest.approx(float(nll + weight * kl), rel=1e-5)


@pytest.mark.parametrize("schedule", ["warmup_cosine", "cosine", "constant"])
def test_learning_rate_schedules_follow_their_formulas(schedule):
    x, y = toy_data(10)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    built = []

    def sgd(params):
        built.append(torch.optim.SGD(params, lr=0.1))
        return built[-1]

    seen = []
    fit(
        model, guide, [(x, y)], epochs=10, num_data=10, optim=sgd, lr_schedule=schedule,
        progress=False, seed=0, callbacks=[lambda r: seen.append(built[0].param_groups[0]["lr"])],
    )  # fmt: skip
    steps, warm = 10, 2 if schedule == "warmup_cosine" else 0  # 20 % of 10 steps

    def factor(s):
        if schedule == "constant":
            return 1.0
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm)))

    assert seen == pytest.approx([0.1 * factor(s) for s in range(steps)], rel=1e-9)


def test_default_adam_takes_steps_of_lr():
    """Adam's first step moves every weight by lr (m / sqrt(v) = sign of the gradient)."""
    x, y = toy_data(10)
    model = tiny_mlp()
    guide = mean_field_guide(model, init_scale=1e-6)
    before = guide.site_loc("fc1.weight").detach().clone()
    fit(model, guide, [(x, y)], epochs=1, num_data=10, lr_schedule="constant", progress=False)
    moved = (guide.site_loc("fc1.weight").detach() - before).abs()
    torch.testing.assert_close(moved, torch.full_like(moved, 2e-2), rtol=0, atol=1e-5)
