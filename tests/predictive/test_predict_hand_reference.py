"""predict() against hand computations (functional_call of the drawn weights, the rank-1 draw
order, per-draw BatchNorm statistics), its invariance to how x and the draws are cut, and the
arguments the second audit of the predictive API found mishandled: a FitResult, draws or the
inputs in the model's or the guide's place, flags that are not bools, float64 inputs of a Pyro
model of one's own with a guide."""

from __future__ import annotations

import copy

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.infer.autoguide import AutoNormal
from torch import nn
from torch.func import functional_call
from torch.utils.data import DataLoader, TensorDataset

from pyrouq import BayesianMLP, bayesian, fit, mean_field_guide, predict, rank1
from pyrouq.likelihoods import Gaussian


def _mlp():
    torch.manual_seed(0)
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    return model, mean_field_guide(model, init_scale=0.3)


def _predict(model, x, guide=None, seed=5, **kwargs):
    torch.manual_seed(seed)
    return predict(model, x, guide, progress=False, **kwargs)


def _one_after_another(guide, count):
    """``count`` draws of the guide, one after another (the draws predict() takes), stacked."""
    with torch.no_grad():
        draws = [guide.sample() for _ in range(count)]
    return {site: torch.stack([d[site] for d in draws]) for site in draws[0]}


def test_probabilities_are_the_softmax_of_the_guides_draws_run_by_functional_call():
    model, guide = _mlp()
    x = torch.randn(9, 4)
    got = _predict(model, x, guide, num_samples=4)
    torch.manual_seed(5)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(4)]  # the draws, one run after
    expected = []  # another, as the guide's own traces give them
    for trace in traces:
        weights = {k: v["value"] for k, v in trace.nodes.items() if v["type"] == "sample"}
        expected.append(functional_call(model.net, weights, (x,)).softmax(-1))
    torch.testing.assert_close(got.probs, torch.stack(expected), rtol=0, atol=0)
    assert not got.probs.requires_grad
    assert not torch.equal(_predict(model, x, guide, seed=6, num_samples=4).probs, got.probs)
    torch.testing.assert_close(_predict(model, x, guide, num_samples=4).probs, got.probs)


def test_draws_are_the_same_however_x_and_the_draws_are_cut():
    model, guide = _mlp()
    x, y = torch.randn(37, 4), torch.randint(0, 3, (37,))
    expected = _predict(model, x, guide, num_samples=6).probs
    loader = DataLoader(  # a generator of its own: no seed taken from torch's stream
        TensorDataset(x, y), batch_size=5, generator=torch.Generator().manual_seed(0)
    )
    for source, kwargs in [
        (x, {"batch_size": 7}),
        (x, {"parallel": False}),
        (x, {"max_draw_bytes": 1}),  # one draw per pass over x
        (x, {"max_draw_bytes": 200, "batch_size": 4}),
        ([x[:10], x[10:]], {}),
        (loader, {"max_draw_bytes": 1}),
    ]:
        got = _predict(model, source, guide, num_samples=6, **kwargs)  # (a batch of one row
        torch.testing.assert_close(got.probs, expected, rtol=0, atol=1e-6)  # rounds apart)
    assert torch.equal(got.targets, y)


@pytest.mark.parametrize("draws", [2, 5])
def test_rank1_predictions_are_draw_major_as_a_hand_loop_gives_them(draws):
    torch.manual_seed(0)
    model = rank1(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), 3)
    guide = mean_field_guide(model)
    x = torch.randn(9, 4)
    got = _predict(model, x, guide, num_samples=draws).probs
    torch.manual_seed(5)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(draws)]
    expected = []
    for trace in traces:  # each draw k gives (M, N, C): s = k * M + m
        replayed = poutine.trace(poutine.replay(model, trace=trace)).get_trace(x)
        expected.append(replayed.nodes["logits"]["value"].softmax(-1))
    assert got.shape == (draws * 3, 9, 3)
    torch.testing.assert_close(got, torch.stack(expected).flatten(0, 1), rtol=0, atol=0)
    chunked = _predict(model, x, guide, num_samples=draws, max_draw_bytes=1, batch_size=4)
    torch.testing.assert_close(chunked.probs, got, rtol=0, atol=1e-6)


@pytest.mark.parametrize("scale", [0.3, "learned", "heteroscedastic", "prior"])
def test_gaussian_predictions_are_the_hand_means_and_scales(scale):
    torch.manual_seed(0)
    width = 2 if scale == "heteroscedastic" else 1
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, width))
    model = bayesian(net, likelihood=Gaussian(dist.HalfNormal(1.0) if scale == "prior" else scale))
    guide = mean_field_guide(model)
    x = torch.randn(13, 3)
    got = _predict(model, x, guide, num_samples=5)
    torch.manual_seed(5)
    draws = _one_after_another(guide, 5)
    out = torch.stack(
        [
            functional_call(model.net, {k: v[s] for k, v in draws.items() if k != "sigma"}, (x,))
            for s in range(5)
        ]
    )
    if scale == "heteroscedastic":
        loc, sd = out[..., :1], 1e-3 + F.softplus(out[..., 1:])
    elif scale == "learned":
        loc, sd = out, F.softplus(model.likelihood.raw_scale).expand_as(out)
    elif scale == "prior":
        loc, sd = out, draws["sigma"].reshape(5, 1, 1).expand_as(out)
    else:
        loc, sd = out, torch.full_like(out, 0.3)
    torch.testing.assert_close(got.loc, loc, rtol=0, atol=0)
    torch.testing.assert_close(got.scale, sd, rtol=0, atol=0)
    chunked = _predict(model, x, guide, num_samples=5, max_draw_bytes=1, batch_size=4)
    torch.testing.assert_close(chunked.loc, loc, rtol=0, atol=1e-6)
    torch.testing.assert_close(chunked.scale, sd, rtol=0, atol=1e-6)


def test_batchnorm_data_gives_each_draw_the_statistics_of_a_hand_loop():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    model = bayesian(net)
    guide = mean_field_guide(model, init_scale=0.3)
    x, train = torch.randn(10, 3), torch.randn(23, 3) * 2 + 1
    norm = model.net[1]
    norm.running_mean.fill_(0.5)
    norm.running_var.fill_(2.0)
    model.train()
    norm.eval()  # a BatchNorm the user keeps in eval mode stays there
    kwargs = {"num_samples": 3, "batchnorm_data": train, "batchnorm_batches": 2, "batch_size": 8}
    got = _predict(model, x, guide, **kwargs).probs
    assert model.training and not norm.training
    assert bool((norm.running_mean == 0.5).all()) and bool((norm.running_var == 2.0).all())
    torch.manual_seed(5)
    draws = _one_after_another(guide, 3)
    hand = copy.deepcopy(model.net).eval()
    expected = []
    for s in range(3):
        weights = {k: v[s] for k, v in draws.items()}
        hand[1].reset_running_stats()
        hand[1].momentum = None  # the average over the batches
        hand[1].train()
        for batch in (train[:8], train[8:16]):
            functional_call(hand, weights, (batch,))
        hand[1].eval()
        expected.append(functional_call(hand, weights, (x,)).softmax(-1))
    # to float32's rounding: the statistics' average is summed in another order than torch's
    # cumulative one (bit-equal on an AMD EPYC, an ulp or two off on an Intel Xeon)
    torch.testing.assert_close(got, torch.stack(expected), rtol=1e-6, atol=1e-7)
    kwargs["max_draw_bytes"] = 1
    torch.testing.assert_close(_predict(model, x, guide, **kwargs).probs, got, rtol=0, atol=0)


def test_a_fit_result_in_the_model_or_guide_place_is_refused_naming_the_fix():
    # `model = fit(...)` then predict(model, ...): Pyro said "FitResult(...) is not callable"
    model, guide = _mlp()
    x, y = torch.randn(9, 4), torch.randint(0, 3, (9,))
    result = fit(model, guide, [(x, y)], epochs=1, num_data=9, progress=False)
    for args in [(result, x, guide), (result, x), (model, x, result)]:
        where = "model" if args[0] is result else "guide"
        with pytest.raises(TypeError, match=rf"got a FitResult as the {where}: fit\(\) returns "):
            predict(*args, progress=False)
    with pytest.raises(TypeError, match=r"then predict\(model, x, guide\)\.$"):
        predict(result, x, guide, progress=False)


def test_draws_inputs_or_a_guide_in_the_wrong_place_are_named():
    model, guide = _mlp()
    x = torch.randn(6, 4)
    draws = {site: torch.randn(2, *shape) for site, shape in model.latent_sites().items()}
    with pytest.raises(TypeError, match=r"posterior draws \(a dict\) as the guide: pass them by "
                       r"name, predict\(model, x, posterior_samples=draws\)"):  # fmt: skip
        predict(model, x, draws, progress=False)
    with pytest.raises(TypeError, match=r"a guide \(MeanFieldGuide\) as the model: the model "):
        predict(guide, x, model, progress=False)
    with pytest.raises(TypeError, match=r"got a Tensor\. The model comes first: predict\(model"):
        predict(x, model, progress=False)
    with pytest.raises(TypeError, match=r"expects the model to be callable .*, got a NoneType"):
        predict(None, x, progress=False)


@pytest.mark.parametrize("flag", ["parallel", "progress"])
def test_flags_that_are_not_true_or_false_are_refused(flag):
    model, guide = _mlp()
    with pytest.raises(TypeError, match=rf"Expected {flag} to be True or False, got 'no'"):
        predict(model, torch.randn(3, 4), guide, num_samples=2, **{flag: "no"})


def _own_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
    logits = x @ w
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_inputs_of_another_dtype_take_the_guides_for_a_model_without_parameters(dtype):
    # numpy's float64 inputs met the autoguide's float32 draws in the model's matmul:
    # "expected m1 and m2 to have the same dtype, but got: double != float"
    torch.manual_seed(0)
    x, y = torch.randn(11, 4), torch.randint(0, 3, (11,))
    guide = AutoNormal(_own_model)
    guide(x, y)
    expected = _predict(_own_model, x, guide, num_samples=3)
    got = _predict(_own_model, x.to(dtype), guide, num_samples=3)
    assert got.probs.dtype == torch.float32
    torch.testing.assert_close(
        got.probs, expected.probs, atol=2e-3 if dtype is torch.float16 else 0, rtol=0
    )
