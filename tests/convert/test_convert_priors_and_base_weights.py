"""Audit of network conversion: opaque priors under casts, rank-1 factors left at a zero-centred
prior, converting a converted model's inner network, and ``use_base_weights`` checks."""

from __future__ import annotations

import math
import warnings

import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive
from torch import nn

import pyrouq
from pyrouq import batchensemble, bayesian, rank1


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _scaled_normal():
    """Normal(0, 2) as a TransformedDistribution, which pyrouq holds as is (opaque)."""
    return dist.TransformedDistribution(
        dist.Normal(0.0, 1.0), [dist.transforms.AffineTransform(0.0, 2.0)]
    )


@pytest.mark.parametrize("make", [_scaled_normal, lambda: dist.Normal(0.0, 2.0).mask(True)])
def test_an_opaque_prior_follows_a_cast_of_the_model(make):
    prior = make()
    model = bayesian(_net(), prior=prior)
    assert model.prior_of("0.weight").opaque is not None  # (held as is, not rebuilt)
    model = model.double()
    x = torch.randn(5, 3, dtype=torch.float64)
    assert model(x).dtype == torch.float64  # drew float32 weights before: a dtype mismatch
    weight = model.priors()["0.weight"]
    assert weight.sample().dtype == torch.float64
    # the values are kept: log N(0 | 0, 2) for each of the 12 entries
    expected = -12 * (math.log(2.0) + 0.5 * math.log(2 * math.pi))
    assert float(weight.log_prob(torch.zeros(4, 3, dtype=torch.float64))) == pytest.approx(expected)
    samples = Predictive(model, num_samples=2)(x)
    assert samples["0.weight"].dtype == torch.float64
    # the user's distribution is left as it was
    assert prior.sample().dtype == torch.float32


def test_an_opaque_prior_takes_the_dtype_of_a_float64_network():
    model = bayesian(_net().double(), prior=dist.Normal(0.0, 1.0).mask(True))
    out = model(torch.randn(5, 3, dtype=torch.float64))
    assert out.dtype == torch.float64
    assert {v.sample().dtype for v in model.priors().values()} == {torch.float64}


def test_a_dict_prior_that_leaves_rank1_factors_at_normal_0_1_warns():
    ensemble = batchensemble(_net(), 2)
    with pytest.warns(UserWarning, match=r"rank-1 factors '2\.r', '2\.s' a prior centred on 0"):
        model = bayesian(ensemble, prior={"0": dist.Normal(1.0, 0.1)})
    assert float(model.prior_of("2.r").loc) == 0.0  # the default it warns about
    with pytest.warns(UserWarning, match=r"'0\.r', '0\.s', '2\.r', '2\.s' a prior centred on 0"):
        bayesian(ensemble, prior=lambda name, param: 0.5)


def test_a_rank1_prior_centred_on_1_does_not_warn():
    ensemble = batchensemble(_net(), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rank1(_net(), 2)
        bayesian(ensemble, prior={"0": dist.Normal(1.0, 0.1), "2": dist.Normal(1.0, 0.2)})
        bayesian(ensemble, prior=dist.LogNormal(0.0, 0.1))  # median 1: no zero-centred prior


def test_bayesian_of_a_converted_models_net_says_what_to_pass():
    model = bayesian(_net())
    with pytest.raises(ValueError, match=r"weights are buffers.*pass model\.plain_network\(\)"):
        bayesian(model.net)
    assert list(bayesian(model.plain_network()).latent_sites()) == list(model.latent_sites())
    with pytest.raises(
        ValueError, match=r"Its layers are BatchEnsemble layers.*bayesian\(ensemble, \.\.\.\)"
    ):
        bayesian(batchensemble(_net(), 2).net)


@pytest.mark.parametrize(
    "convert",
    [
        lambda net: batchensemble(net, 2, use_base_weights="no"),
        lambda net: rank1(net, 2, use_base_weights="no"),
        lambda net: pyrouq.BatchEnsembleNetwork(net, 2, use_base_weights=0),
    ],
)
@pytest.mark.parametrize("net", [_net, lambda: pyrouq.MLP(3, 4, 2)])
def test_use_base_weights_must_be_true_or_false(convert, net):
    # "no" used to be taken as True (the base weights kept), 0 as False
    with pytest.raises(TypeError, match=r"Expected use_base_weights to be True or False, got"):
        convert(net())
