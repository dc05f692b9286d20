"""Seventh audit of the converters: a network holding PyroSample attributes is refused by
bayesian(), batchensemble() and rank1(); batchensemble() of a BatchEnsemble's own network says
so."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch
from _toy import sampled_linear
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq
from pyrouq import batchensemble, bayesian, rank1

# -- a network holding PyroSample attributes ----------------------------------------------------


def _sampled_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), sampled_linear(5, 3, bias_scale=1.0))


def test_bayesian_refuses_a_network_holding_pyro_sample_attributes():
    """The sampled weight was no latent site (latent sites '0.weight', '0.bias' only): the
    guide missed it, and every forward drew it from its prior again."""
    with pytest.raises(ValueError) as err:
        bayesian(_sampled_net())
    message = str(err.value)
    assert "bayesian() got a Sequential holding Pyro modules with sampled attributes" in message
    assert "'2' (PyroLinear): weight, bias" in message
    assert "no latent site" in message
    assert "plain nn.Linear" in message and "select= and prior=" in message
    assert "with its own guide" in message
    with pytest.raises(ValueError, match=r"the network itself \(PyroLinear\): weight\. "):
        bayesian(sampled_linear(4, 3))


@pytest.mark.parametrize("convert", ["batchensemble", "rank1"])
def test_batchensemble_and_rank1_refuse_a_network_holding_pyro_sample_attributes(convert):
    """A converted layer kept one prior draw as its shared weight; a sampled module left as it
    was (a LayerNorm's weight) drew anew at every run: the 'deterministic' ensemble gave other
    outputs on every call, and rank1() made only the factors latent."""
    layer_norm = PyroModule[nn.LayerNorm](5)
    layer_norm.weight = PyroSample(dist.Normal(1.0, 1.0).expand([5]).to_event(1))
    for net, held in (
        (_sampled_net(), "'2' (PyroLinear): weight, bias"),
        (
            nn.Sequential(nn.Linear(4, 5), layer_norm, nn.Linear(5, 3)),
            "'1' (PyroLayerNorm): weight",
        ),
    ):
        with pytest.raises(ValueError) as err:
            getattr(pyrouq, convert)(net, 2)
        message = str(err.value)
        assert f"{convert}() got a Sequential holding Pyro modules with sampled" in message
        assert held in message
        assert "one draw from it as its shared weight" in message
        assert "plain nn.Linear" in message and "convert that network" in message


def test_pyro_modules_without_sampled_attributes_are_still_converted():
    net = nn.Sequential(PyroModule[nn.Linear](4, 5), nn.ReLU(), nn.Linear(5, 3))
    assert list(bayesian(net).latent_sites()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert list(rank1(net, 2).latent_sites()) == ["0.r", "0.s", "2.r", "2.s"]
    assert batchensemble(net, 2)(torch.randn(3, 4)).shape == (2, 3, 3)


# -- batchensemble() of a BatchEnsemble's network -----------------------------------------------


def test_batchensemble_of_an_ensembles_network_says_its_layers_are_batchensemble_layers():
    """It said only that the network 'has no nn.Linear or convolution layer'."""
    ensemble = batchensemble(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)), 2)
    for convert in (batchensemble, rank1):
        with pytest.raises(ValueError) as err:
            convert(ensemble.net, 2)
        message = str(err.value)
        assert "its layers '0', '2' are BatchEnsemble layers already" in message
        assert "Pass the original plain network the ensemble was made from" in message
        assert "pyrouq.bayesian(ensemble)" in message
    with pytest.raises(ValueError, match="it is a BatchEnsemble layer itself"):
        batchensemble(ensemble.net[0], 2)
    with pytest.raises(ValueError, match=r"has no nn.Linear or convolution layer to turn into"):
        batchensemble(nn.Sequential(nn.ReLU()), 2)  # a plain network without one: as before


# -- a network holding a pyrouq model -----------------------------------------------------------


class _Holder(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.head = nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.inner(x))


def test_a_network_holding_a_pyrouq_model_is_refused_naming_it():
    """bayesian() of a network holding a Bayesian model made only the outer layers latent
    ('head.weight', 'head.bias'): the inner model drew its own sites from their priors at every
    run, outside the guide, so fit() trained nothing there and predict() under one set of
    draws gave other outputs on every call, silently. A BatchEnsemble inside failed at the
    first run on its (M, B, D) outputs, in words about per-pixel outputs."""
    inner = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    for held, convert in (
        (bayesian(inner), bayesian),
        (bayesian(inner), lambda net: batchensemble(net, 2)),
        (batchensemble(inner, 2), bayesian),
        (pyrouq.BayesianMLP(4, 5, 3), lambda net: rank1(net, 2)),
    ):
        with pytest.raises(ValueError) as err:
            convert(_Holder(held))
        message = str(err.value)
        assert f"got a _Holder holding pyrouq models: 'inner' ({type(held).__name__})" in message
        assert "draws its latent sites from their priors at every run" in message
        assert "model.plain_network()" in message
    # a model holding a model (put there by hand): the outermost one is named, once
    nested = bayesian(inner)
    nested.net.extra = batchensemble(nn.Sequential(nn.Linear(3, 3)), 2)
    with pytest.raises(ValueError, match=r"holding pyrouq models: 'inner' \(BayesianNetwork\)\. "):
        bayesian(_Holder(nested))
    # held as its plain network, every layer is the converted model's
    model = bayesian(_Holder(bayesian(inner).plain_network()))
    assert list(model.latent_sites()) == [
        "inner.0.weight", "inner.0.bias", "inner.2.weight", "inner.2.bias",
        "head.weight", "head.bias",
    ]  # fmt: skip
