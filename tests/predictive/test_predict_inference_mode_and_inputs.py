"""predict() on inputs and in contexts the audit of the predictive API found mishandled:
torch.inference_mode(), empty batches of a loader, arrays and data sets given as x."""

from __future__ import annotations

import copy

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import _engine, batchensemble, mean_field_guide, predict, rank1


def _conv_net():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 4),
    )  # fmt: skip
    return net.eval()


@pytest.mark.parametrize("kind", ["ensemble on the folded batch", "rank1 with batchnorm_data"])
def test_members_on_a_folded_batch_predict_under_inference_mode(kind):
    # the folded batch (an accelerator's schedule, or a shared BatchNorm taking batch
    # statistics) was marked with its version counter, which an inference tensor has not:
    # "Inference tensors do not track version counter"
    x, train = torch.randn(5, 1, 8, 8), torch.randn(12, 1, 8, 8)
    if kind.startswith("ensemble"):
        model, guide, kwargs = batchensemble(_conv_net(), 3), None, {}
        schedule = "accelerator"
    else:
        model = rank1(_conv_net(), 3)
        guide, kwargs, schedule = mean_field_guide(model), {"num_samples": 2}, "cpu"
        kwargs["batchnorm_data"] = train
    with _engine.schedule(schedule):
        torch.manual_seed(1)
        expected = predict(model, x, guide, progress=False, **kwargs).probs
        torch.manual_seed(1)
        with torch.inference_mode():
            got = predict(model, x.clone(), guide, progress=False, **kwargs).probs
    torch.testing.assert_close(got, expected)


def test_a_batchensemble_with_a_grayscale_stem_runs_under_inference_mode():
    ensemble = batchensemble(_conv_net(), 2)
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad(), _engine.schedule("accelerator"):
        expected = ensemble(x)
        with torch.inference_mode():
            got = ensemble(x.clone())
    torch.testing.assert_close(got, expected)


def _pyro_model(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
    logits = x @ w
    with pyro.plate("data", x.shape[0]):  # a plate of 0 inputs: Pyro raises
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


@pytest.mark.parametrize("source", ["posterior_samples", "prior", "guide"])
def test_an_empty_batch_of_a_loader_is_skipped(source):
    torch.manual_seed(0)
    x = torch.randn(7, 4)
    kwargs: dict = {"progress": False}
    if source == "posterior_samples":
        kwargs["posterior_samples"] = {"w": torch.randn(5, 4, 3)}
    elif source == "prior":
        kwargs["num_samples"] = 5
    else:
        pyro.clear_param_store()
        guide = pyro.infer.autoguide.AutoNormal(_pyro_model)
        guide(x, torch.zeros(7, dtype=torch.long))
        kwargs.update(guide=guide, num_samples=5)
    torch.manual_seed(3)
    expected = predict(_pyro_model, x, **kwargs).probs
    torch.manual_seed(3)
    got = predict(_pyro_model, [x[:0], x[:4], x[4:4], x[4:]], **kwargs).probs
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match=r"predict\(\) got no inputs: x is empty"):
        predict(_pyro_model, [x[:0]], **kwargs)


def test_an_array_or_a_data_set_given_as_x_is_refused_with_the_fix():
    net = nn.Linear(4, 3)
    x = np.zeros((6, 4), dtype=np.float32)
    with pytest.raises(TypeError, match=r"got an ndarray of shape \(6, 4\)\. Convert an array "):
        predict(net, x, progress=False)
    with pytest.raises(TypeError, match=r"a batch was an ndarray\. Make them tensors"):
        predict(net, [x], progress=False)
    data = torch.utils.data.TensorDataset(torch.zeros(6, 4), torch.zeros(6, dtype=torch.long))
    with pytest.raises(TypeError, match=r"got a TensorDataset, whose items are single examples"):
        predict(net, data, progress=False)
    with pytest.raises(TypeError, match=r"Pass a loader of it: DataLoader\(batchnorm_data"):
        model = rank1(copy.deepcopy(_conv_net()), 2)
        predict(model, torch.zeros(2, 1, 8, 8), mean_field_guide(model), batchnorm_data=data)


def test_a_0d_batch_of_a_loader_is_refused_with_the_fix():
    # the empty-batch check read its dim 0: a bare IndexError "tuple index out of range"
    net = nn.Linear(1, 3)
    for x in ([torch.tensor(1.0)], [(torch.tensor(1.0), torch.tensor(0))]):
        with pytest.raises(ValueError, match=r"a batch was a 0-d tensor \(1\.0\)\. One example "
                           r"of one feature is batch\.reshape\(1, 1\)\.$"):  # fmt: skip
            predict(net, x, progress=False)


def test_a_1d_x_is_told_both_ways_to_add_its_missing_dimension():
    """A 1-d x is one example or N examples of one feature (a regression toy): the note
    names both fixes (it named unsqueeze(0) alone, the wrong one for a toy)."""
    net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    model = pyrouq.bayesian(net, likelihood=pyrouq.likelihoods.Gaussian(scale=0.5), num_data=10)
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(RuntimeError) as info:
        pyrouq.predict(model, torch.linspace(-1, 1, 10), guide, num_samples=2, progress=False)
    assert info.value.__notes__ == [
        "predict(): x's batches have shape (10,): if x is one example, give it a batch "
        "dimension, x.unsqueeze(0); if it is N examples of one feature, x.unsqueeze(-1)."
    ]
    p = pyrouq.predict(
        model, torch.linspace(-1, 1, 10).unsqueeze(-1), guide, num_samples=2, progress=False
    )
    assert p.mean.shape == (10, 1)
