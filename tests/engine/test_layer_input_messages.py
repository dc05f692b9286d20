"""Review of the day's later changes (part A): refusals and messages reached through the other
public routes a user takes, each checked against what the suggested fix does when tried."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pyrouq import MLP, BayesianMLP, Gaussian, bayesian, coverage, mcmc, predict, rank1


def _batch() -> list[torch.Tensor]:
    """A DataLoader's batch, [x, y]: what a network gets from ``for batch in loader``."""
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    return next(iter(DataLoader(TensorDataset(x, y), batch_size=3)))


@pytest.mark.parametrize("net", [BayesianMLP(4, 8, 3), MLP(4, 8, 3)], ids=["bayesian", "plain"])
def test_a_loader_batch_given_to_a_network_is_told_to_pass_x_alone(net):
    """model(batch) with a loader's [x, y] batch was told 'convert it with torch.as_tensor(x)',
    which fails on that list ('only one element tensors can be converted')."""
    batch = _batch()
    with pytest.raises(ValueError, match="only one element tensors"):
        torch.as_tensor(batch)  # the advice given before
    with pytest.raises(TypeError) as info:
        net(batch)
    message = str(info.value)
    assert "as_tensor" not in message
    assert (
        "expects a torch.Tensor input, got list of tensors: for a loader's (x, y) batch, pass x "
        "alone (x, y = batch); for one tensor per input, torch.stack(...) them."
    ) in message
    assert net(batch[0]).shape[-2:] == (3, 3)  # what it says works


@pytest.mark.parametrize(
    "given, name", [(None, "NoneType"), ({"x": torch.zeros(3, 4)}, "dict")], ids=["none", "dict"]
)
def test_a_network_given_none_or_a_dict_is_not_told_to_as_tensor_it(given, name):
    """torch.as_tensor(None) and torch.as_tensor(dict) fail too: no such advice for them."""
    with pytest.raises(TypeError) as info:
        BayesianMLP(4, 8, 3)(given)
    assert str(info.value).startswith(f"BayesianMLP expects a torch.Tensor input, got {name}:")
    assert "as_tensor" not in str(info.value)


def test_a_network_given_an_array_is_still_told_to_convert_it():
    with pytest.raises(TypeError, match=r"got ndarray; convert it with torch\.as_tensor\(x\)\.$"):
        BayesianMLP(4, 8, 3)(np.zeros((2, 4), dtype=np.float32))


def test_mcmc_given_a_guide_function_is_told_it_takes_no_guide():
    """A Pyro guide is as often a function as a module: mcmc(model, guide, x) with a guide
    function was told that NUTS 'takes no minibatch loader'."""
    x = torch.randn(8, 2)
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))

    def guide(x, y=None):
        pass

    with pytest.raises(TypeError) as info:
        mcmc(model, guide, x, num_chains=1, num_samples=2, warmup_steps=2, progress=False)
    message = str(info.value)
    assert "got function for x. It takes no guide (NUTS samples the posterior itself)" in message
    assert "loader" not in message


def test_coverage_of_predictions_without_labels_says_so():
    """coverage(sets, preds.targets) of predictions made from x alone (targets None) was told
    to 'wrap them with torch.as_tensor(...)', which makes an object tensor error of None."""
    preds = predict(MLP(4, 8, 3), torch.randn(5, 4), progress=False)
    assert preds.targets is None
    sets = torch.ones(5, 3, dtype=torch.bool)
    for where, given in (("coverage()", sets), ("coverage()", (torch.zeros(5), torch.ones(5)))):
        with pytest.raises(TypeError) as info:
            coverage(given, preds.targets)
        message = str(info.value)
        assert message.startswith(f"{where}: expected the ")
        assert message.endswith(
            "as a torch.Tensor, got NoneType: pass them as a tensor (preds.targets is None "
            "when x had no labels)."
        )
    with pytest.raises(TypeError, match=r"got list; wrap them with torch\.as_tensor"):
        coverage(sets, [0, 1, 2, 0, 1])  # an array-like still told how to convert it


@pytest.mark.parametrize("scale", [1e-50, 1e40])
def test_rank1_refuses_a_prior_scale_its_dtype_cannot_hold(scale):
    """rank1(net, 2, prior_scale=1e40) built, then failed at the first forward with torch's
    'invalid logits' (1e-50: Normal(loc: 1.0, scale: 0.0))."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    with pytest.raises(ValueError, match=r"Expected prior_scale to be a positive finite torch"):
        rank1(net, 2, prior_scale=scale)


def test_a_layer_given_a_loaders_batch_is_told_to_pass_x_alone():
    from pyrouq.nn import BayesianLinear

    x = torch.randn(2, 4)
    with pytest.raises(TypeError, match=r"got list of tensors: for a loader's \(x, y\) batch"):
        BayesianLinear(4, 3)([x, torch.zeros(2)])
