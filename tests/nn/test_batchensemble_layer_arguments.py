"""Audit 6 of the ready-made models and layers: the BatchEnsemble layers' constructor
arguments, their printed settings, ``effective_weight``'s member and the Bayesian layers'
``prior`` kind."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyrouq.nn import (
    BatchEnsembleConv1d,
    BatchEnsembleConv2d,
    BatchEnsembleConvTranspose2d,
    BatchEnsembleLinear,
    BayesianConv2d,
    BayesianLinear,
)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 3, 2), "Expected BatchEnsembleLinear's in_features to be a positive integer, got 0"),
        ((True, 3, 2), "in_features to be a positive integer, got True"),
        ((4.0, 3, 2), "in_features to be a positive integer, got 4.0"),
        ((4, -1, 2), "Expected BatchEnsembleLinear's out_features to be a positive integer"),
    ],
)
def test_batchensemble_linear_sizes_are_checked(args, message):
    # torch's nn.Linear took 0 and True (a layer of 0 inputs; in_features printed as True)
    # and failed on -1 and 4.0 in its own words
    with pytest.raises(ValueError, match=re.escape(message) + r".*Pass \w+ as an int"):
        BatchEnsembleLinear(*args)


def test_batchensemble_linear_keeps_base_sizes_as_ints():
    layer = BatchEnsembleLinear(True, 3, 2, base=nn.Linear(1, 3))  # True == 1: base agrees
    assert type(layer.in_features) is int and layer.in_features == 1
    assert repr(layer) == "BatchEnsembleLinear(1, 3, num_members=2)"


@pytest.mark.parametrize(
    ("cls", "args", "kwargs", "message"),
    [
        (BatchEnsembleConv2d, (0, 6, 3, 2), {}, "Conv2d's in_channels to be a positive integer"),
        (BatchEnsembleConv2d, (4, 6, 0, 2), {}, "kernel_size to be an int >= 1 or a tuple of 2"),
        (BatchEnsembleConv2d, (4, 6, (3, 3, 3), 2), {}, "got (3, 3, 3)"),
        (BatchEnsembleConv2d, (4, 6, 3, 2), {"stride": 0}, "stride to be an int >= 1"),
        (BatchEnsembleConv2d, (4, 6, 3, 2), {"dilation": [1, 0]}, "dilation to be an int >= 1"),
        (BatchEnsembleConv2d, (4, 6, 3, 2), {"padding": -1}, "padding to be an int >= 0"),
        (BatchEnsembleConv2d, (4, 6, 3, 2), {"groups": 3}, "groups=3 for 4 input and 6 output"),
        (BatchEnsembleConv1d, (4, 6, 3, 2), {"stride": (1, 1)}, "stride to be an int >= 1 or a"),
        (BatchEnsembleConvTranspose2d, (4, 6, 3, 2), {"padding": "same"}, "got 'same'"),
        (BatchEnsembleConvTranspose2d, (4, 6, 3, 2), {"output_padding": -1}, "output_padding"),
        (BatchEnsembleConvTranspose2d, (4, 6, 3, 2), {"stride": 0}, "stride to be an int >= 1"),
    ],
)
def test_batchensemble_conv_arguments_are_checked(cls, args, kwargs, message):
    # torch's layers took most of these (a stride of 0 failed at the first forward, "same"
    # padding of a transposed convolution was kept as ('s', 'a', 'm', 'e'))
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(*args, **kwargs)


def test_batchensemble_conv_built_with_settings_is_m_hand_made_convolutions():
    torch.manual_seed(0)
    layer = BatchEnsembleConv2d(4, 6, 3, 3, stride=2, padding=(2, 1), dilation=2, groups=2)
    x = torch.randn(2, 4, 9, 8)
    out = layer(x.repeat(3, 1, 1, 1))
    for m in range(3):  # diag(s_m) W diag(r_m), r_m on each group's input channels
        r = layer.r[m].reshape(2, 1, 2).expand(2, 3, 2).reshape(6, 2)
        weight = layer.s[m].reshape(6, 1, 1, 1) * layer.weight * r.reshape(6, 2, 1, 1)
        expected = F.conv2d(x, weight, layer.bias[m], 2, (2, 1), 2, 2)
        torch.testing.assert_close(out[2 * m : 2 * m + 2], expected)


@pytest.mark.parametrize(
    "torch_layer",
    [
        nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2, padding_mode="reflect"),
        nn.Conv2d(4, 4, 3, groups=4, bias=True),
        nn.Conv1d(4, 6, 3, padding="same"),
        nn.ConvTranspose2d(4, 6, 3, stride=2, output_padding=1),
        nn.Conv2d(4, 6, 3),
    ],
)
def test_batchensemble_conv_prints_its_settings_as_torch_does(torch_layer):
    # groups, padding, dilation, output_padding and padding_mode were left out: a depthwise
    # convolution printed as a dense one
    kind = type(torch_layer)  # the BatchEnsemble counterpart's name follows torch's
    ensemble = {
        nn.Conv1d: BatchEnsembleConv1d,
        nn.Conv2d: BatchEnsembleConv2d,
        nn.ConvTranspose2d: BatchEnsembleConvTranspose2d,
    }[kind].from_module(torch_layer, 2)
    expected = f"BatchEnsemble{repr(torch_layer)[:-1]}, num_members=2)"
    assert repr(ensemble) == expected


def test_effective_weight_refuses_a_member_it_does_not_have():
    layer = BatchEnsembleLinear(3, 2, 2)
    torch.testing.assert_close(layer.effective_weight(-1), layer.effective_weight(1))
    torch.testing.assert_close(layer.effective_weight(torch.tensor(1)), layer.effective_weight(1))
    for member in (True, 2, -3, 1.0):  # True indexed a (1, M, out, in) stack
        with pytest.raises(ValueError, match=r"Expected member to be an int in \[-2, 2\) "):
            layer.effective_weight(member)


def test_a_subclass_of_torchs_convolution_and_numpy_sizes_build_a_batchensemble_layer():
    import numpy as np

    class StandardisedConv(nn.Conv2d):
        pass

    class Ensemble(BatchEnsembleConv2d):
        _base_type = StandardisedConv

    # its dims were read off the class name ('n' of "StandardisedConv"), and numpy ints met
    # numpy's "truth value of an array is ambiguous"
    assert Ensemble(2, 4, 3, 2, padding=1)(torch.randn(4, 2, 5, 5)).shape == (4, 4, 5, 5)
    layer = BatchEnsembleConv2d(2, 4, np.int64(3), 2)
    assert layer(torch.randn(4, 2, 5, 5)).shape == (4, 4, 3, 3)


@pytest.mark.parametrize("layer", [BayesianLinear(3, 2), BayesianConv2d(2, 3, 3)])
def test_bayesian_layer_prior_refuses_another_kind(layer):
    # "Weight" gave the bias's prior
    assert layer.prior("weight").event_shape == layer.weight_shape
    with pytest.raises(ValueError, match=r"Expected kind 'weight' or 'bias'.*got 'Weight'"):
        layer.prior("Weight")
