"""Audit of the named front doors (BayesianMLP / BayesianLeNet, MLP / LeNet) and the Bayesian
layers of pyrouq.nn: prior scales the prior's dtype cannot hold, ``sample_with``'s arguments
checked alike on both of its paths, size errors that say what to do."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import pyrouq
from pyrouq.models import MLP, BayesianLeNet, BayesianMLP, LeNet, ResidualCNN
from pyrouq.nn import BayesianConv2d, BayesianLinear

MAKERS = {
    "BayesianMLP": lambda s: BayesianMLP(6, 5, 3, prior_scale=s),
    "BayesianLeNet": lambda s: BayesianLeNet(prior_scale=s),
    "BayesianLinear": lambda s: BayesianLinear(6, 5, prior_scale=s),
    "BayesianConv2d": lambda s: BayesianConv2d(1, 2, 3, prior_scale=s),
}


@pytest.mark.parametrize("name", list(MAKERS))
@pytest.mark.parametrize(("scale", "held"), [(1e-50, "0.0"), (1e40, "inf")])
def test_a_prior_scale_float32_cannot_hold_is_refused(name, scale, held):
    """prior_scale=1e-50 passed the check (> 0, finite) and became a float32 prior of scale 0:
    the first forward failed in Pyro ("Normal(loc: 0.0, scale: 0.0) ... found invalid
    values"); 1e40 became inf, a layer's draws inf and a front door's logits NaN."""
    with pytest.raises(
        ValueError,
        match=rf"prior_scale .*got {re.escape(repr(scale))}, which torch.float32 "
        rf"holds as {held}\. The prior on every weight is Normal",
    ):
        MAKERS[name](scale)


@pytest.mark.parametrize("name", list(MAKERS))
def test_a_small_prior_scale_float32_holds_is_that_prior(name):
    model = MAKERS[name](1e-30)
    priors = model.priors() if hasattr(model, "priors") else {"w": model.prior("weight")}
    for prior in priors.values():
        assert torch.allclose(prior.base_dist.scale, torch.tensor(1e-30), rtol=1e-6, atol=0)


def _layer_and_params(kind, local):
    g = torch.Generator().manual_seed(0)
    if kind == "linear":
        layer = BayesianLinear(4, 3, local_reparameterization=local)
        x = torch.randn(5, 4, generator=g)
    else:
        layer = BayesianConv2d(2, 3, 3, local_reparameterization=local)
        x = torch.randn(5, 2, 6, 6, generator=g)
    w, b = layer.weight_shape, layer.bias_shape
    params = (
        torch.randn(w, generator=g),
        0.1 + torch.rand(w, generator=g),
        torch.randn(b, generator=g),
        0.1 + torch.rand(b, generator=g),
    )
    return layer, x, params


@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("num_draws", [0, True, 2.0, torch.tensor(3)])
def test_sample_with_refuses_a_num_draws_that_is_not_a_positive_int(kind, local, num_draws):
    """num_draws=True gave one draw by weight sampling and a TypeError from torch.randn by
    local reparameterisation; 0 an empty output there and 'cannot reshape tensor of 0
    elements' here; 2.0 torch's 'takes an iterable of int'."""
    layer, x, params = _layer_and_params(kind, local)
    with pytest.raises(ValueError, match=r"Expected num_draws to be a positive integer, got "):
        layer.sample_with(x, *params, num_draws=num_draws)


@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("local", [False, True])
def test_sample_with_gives_num_draws_draws_on_both_paths(kind, local):
    layer, x, params = _layer_and_params(kind, local)
    mean, _ = layer.moments_with(x, *params)
    assert layer.sample_with(x, *params, num_draws=3).shape == (3, *mean.shape)
    assert layer.sample_with(x, *params).shape == mean.shape


@pytest.mark.parametrize("local", [False, True])
def test_sample_with_and_moments_with_name_the_input_shape_expected(local):
    """A wrong input size came out of sample_with / moments_with as torch's 'mat1 and mat2
    shapes cannot be multiplied (5x7 and 4x3)', of forward as the layer's own message."""
    layer, _, params = _layer_and_params("linear", local)
    expected = r"BayesianLinear expects inputs of shape \(\.\.\., 4\), got shape \(5, 7\)"
    with pytest.raises(ValueError, match=expected):
        layer.sample_with(torch.randn(5, 7), *params)
    with pytest.raises(ValueError, match=expected):
        layer.moments_with(torch.randn(5, 7), *params)
    conv, _, params = _layer_and_params("conv", local)
    with pytest.raises(ValueError, match=r"BayesianConv2d expects inputs of shape \(B, 2, H, W\)"):
        conv.sample_with(torch.randn(5, 3, 6, 6), *params)
    with pytest.raises(TypeError, match=r"BayesianConv2d expects a torch\.Tensor input, got list"):
        conv.sample_with([[0.0]], *params)


@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("which", [1, 3])
@pytest.mark.parametrize("bad", [-0.5, 0.0])
def test_local_sample_with_refuses_scales_weight_sampling_refuses(kind, which, bad):
    """By local reparameterisation a negative scale was squared and drawn from silently (as
    its absolute value), where weight sampling's Normal refuses it: one method, two answers."""
    names = {1: "weight_scale", 3: "bias_scale"}
    for local in (False, True):
        layer, x, params = _layer_and_params(kind, local)
        params = list(params)
        params[which] = params[which].clone()
        params[which].view(-1)[1] = bad
        match = rf"{names[which]} > 0" if local else "scale"
        with pytest.raises(ValueError, match=match):
            layer.sample_with(x, *params)


def test_local_sample_with_takes_any_scales_with_validation_off():
    layer, x, params = _layer_and_params("linear", True)
    w_loc, w_scale, b_loc, b_scale = params
    was = torch.distributions.Distribution._validate_args
    torch.distributions.Distribution.set_default_validate_args(False)
    try:
        torch.manual_seed(0)
        out = layer.sample_with(x, w_loc, -w_scale, b_loc, b_scale)
    finally:
        torch.distributions.Distribution.set_default_validate_args(was)
    torch.manual_seed(0)
    assert torch.equal(out, layer.sample_with(x, w_loc, w_scale, b_loc, b_scale))


def test_local_sample_with_moments_are_the_hand_computation():
    """Normal(x mu^T + b_mu, x^2 (sigma^2)^T + b_sigma^2), by hand, and the conv's by F.conv2d."""
    layer, x, (w_loc, w_scale, b_loc, b_scale) = _layer_and_params("linear", True)
    mean, var = layer.moments_with(x, w_loc, w_scale, b_loc, b_scale)
    hand_mean = torch.stack(
        [
            torch.stack([sum(x[n, i] * w_loc[o, i] for i in range(4)) + b_loc[o] for o in range(3)])
            for n in range(5)
        ]
    )
    hand_var = torch.stack(
        [
            torch.stack(
                [
                    sum(x[n, i] ** 2 * w_scale[o, i] ** 2 for i in range(4)) + b_scale[o] ** 2
                    for o in range(3)
                ]
            )
            for n in range(5)
        ]
    )
    torch.testing.assert_close(mean, hand_mean)
    torch.testing.assert_close(var, hand_var)
    conv, x, (w_loc, w_scale, b_loc, b_scale) = _layer_and_params("conv", True)
    mean, var = conv.moments_with(x, w_loc, w_scale, b_loc, b_scale)
    torch.testing.assert_close(mean, F.conv2d(x, w_loc, b_loc))
    torch.testing.assert_close(var, F.conv2d(x**2, w_scale**2, b_scale**2))


@pytest.mark.parametrize(
    ("make", "name", "example"),
    [
        (lambda: MLP(hidden_features=0), "hidden_features", 256),
        (lambda: MLP(num_hidden=-1), "num_hidden", 1),
        (lambda: BayesianMLP(in_features=2.5), "in_features", 784),
        (lambda: LeNet(num_classes=True), "num_classes", 10),
        (lambda: BayesianLeNet(in_channels=0), "in_channels", 1),
        (lambda: ResidualCNN(width=-4), "width", 16),
    ],
)
def test_a_size_refused_says_what_to_pass(make, name, example):
    """'Expected hidden_features to be a positive integer, got 0.' said what was wrong, not
    what to do (the Bayesian layers' messages do: 'Pass in_features as an int such as 16.')."""
    with pytest.raises(
        ValueError,
        match=rf"Expected {name} to be .*\. Pass {name} as an int "
        rf"such as {name}={example}\.",
    ):
        make()


@pytest.mark.parametrize("scale", [1e-50, 1e40])
def test_bayesian_refuses_a_float_prior_its_dtype_cannot_hold(scale):
    """bayesian(net, prior=1e-50) built a Normal(0, 0) prior that Pyro refused at the first
    forward; 1e40 an infinite one."""
    with pytest.raises(ValueError, match=r"^Expected prior= to be a positive finite torch\.flo"):
        pyrouq.bayesian(torch.nn.Sequential(torch.nn.Linear(3, 2)), prior=scale)
    with pytest.raises(ValueError, match=r"prior scale of '0.weight' to be a positive finite"):
        pyrouq.bayesian(torch.nn.Sequential(torch.nn.Linear(3, 2)), prior={"0": scale})
    # one prior= of a network of two dtypes: the site whose dtype refuses it, not 'the
    # weights' dtype' (its first layer's are float64, which holds 1e-50 and 1e40)
    mixed = torch.nn.Sequential(torch.nn.Linear(3, 2).double(), torch.nn.Linear(2, 2))
    told = r"^Expected prior= to be a positive finite torch\.float32 \(the dtype of site '1\.we"
    with pytest.raises(ValueError, match=told):
        pyrouq.bayesian(mixed, prior=scale)


def test_a_numpy_flag_is_recorded_in_the_config_as_a_bool():
    import numpy as np

    model = BayesianMLP(6, 5, 3)
    model.local_reparameterization = np.bool_(True)
    assert model.config["local_reparameterization"] is True


def test_a_numpy_input_is_told_how_to_convert_it():
    import numpy as np

    with pytest.raises(TypeError, match=r"got ndarray; convert it with torch\.as_tensor\(x\)"):
        BayesianMLP(6, 5, 3)(np.zeros((2, 6), dtype=np.float32))


def test_a_bare_bayesian_conv_on_one_image_is_told_to_batch_it():
    """BayesianConv2d(1, 4, 3) called on one (1, 28, 28) image was told 'Check the output size
    of the layer before it', which a layer called on its own has none of."""
    conv = BayesianConv2d(1, 4, 3)
    with pytest.raises(ValueError) as info:
        conv(torch.randn(1, 28, 28))
    assert str(info.value) == (
        "BayesianConv2d expects inputs of shape (B, 1, H, W) or (S, B, 1, H, W), got shape "
        "(1, 28, 28). One example without its batch dim? Pass it as a batch of one, "
        "x.unsqueeze(0). Otherwise check the output size of the layer before it, or this "
        "layer's input size."
    )
    assert conv(torch.randn(1, 28, 28).unsqueeze(0)).shape == (1, 4, 26, 26)  # the fix
    with pytest.raises(ValueError, match=r"got shape \(2, 3, 8, 8\)\. Check the output size of"):
        conv(torch.randn(2, 3, 8, 8))  # (a batch of other channels: as before)


def test_a_bare_bayesian_conv_on_images_without_their_channel_dim_is_told_to_add_it():
    """BayesianConv2d(1, 4, 3) called on (64, 28, 28) images was told 'Check the output size of
    the layer before it', which a layer called on its own has none of."""
    conv = BayesianConv2d(1, 4, 3)
    images = torch.randn(64, 28, 28)
    with pytest.raises(ValueError) as info:
        conv(images)
    assert str(info.value) == (
        "BayesianConv2d expects inputs of shape (B, 1, H, W) or (S, B, 1, H, W), got shape "
        "(64, 28, 28). A batch of one-channel images without their channel dim? Pass "
        "x.unsqueeze(1), of shape (64, 1, 28, 28). Otherwise check the output size of the "
        "layer before it, or this layer's input size."
    )
    assert conv(images.unsqueeze(1)).shape == (64, 4, 26, 26)  # the fix
    with pytest.raises(ValueError, match=r"got shape \(64, 28, 28\)\. Check the output size"):
        BayesianConv2d(3, 4, 3)(images)  # (three channels: no such guess)
