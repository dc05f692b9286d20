"""A BatchEnsemble or rank-1 network with a forward of its own (its class's or one set on the
instance) is trained with it (fit() traces it) but its predictions are its members' outputs
(``outputs()``): predict() and the export refuse it rather than leave out what it adds.
pyrouq's own ensemble classes, and a forward that only compiles the built-in one, are not
refused."""

from __future__ import annotations

import copy
import types

import pyro
import pytest
import torch
from _toy import toy_data

from pyrouq import (
    BatchEnsembleNetwork,
    BayesianNetwork,
    batchensemble,
    mean_field_guide,
    predict,
    rank1,
    to_inference_data,
)
from pyrouq.models import BatchEnsembleLeNet, BatchEnsembleMLP


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _scaled(model):  # a forward of its own: the network on 100 x
    def forward(self, x, y=None):
        return type(self).forward(self, 100 * x, y)

    model.forward = types.MethodType(forward, model)
    return model


class _OwnEnsemble(BatchEnsembleNetwork):
    def forward(self, x, y=None):
        return super().forward(100 * x, y)


class _OwnRank1(BayesianNetwork):
    def forward(self, x, y=None):
        return super().forward(100 * x, y)


def _subclassed(model):
    model = copy.deepcopy(model)
    model.__class__ = _OwnRank1 if isinstance(model, BayesianNetwork) else _OwnEnsemble
    return model


_OWN = {"instance": _scaled, "subclass": _subclassed}


def _refused(kind: str, caller: str) -> str:
    return (
        rf"{caller} got {kind} \(\w+\) with a forward of its own \(its class's or one set on the "
        rf"instance\)\. Its predictions are its members' outputs.*Put what the forward adds "
        r"into the network: a module wrapping net that does it"
    )


@pytest.mark.parametrize("how", sorted(_OWN))
def test_a_batchensembles_own_forward_is_refused_by_predict_and_the_export(how):
    x, y = toy_data(8)
    model = _OWN[how](batchensemble(_net(), 2))
    with pytest.raises(ValueError, match=_refused("a BatchEnsemble", r"predict\(\)")):
        predict(model, x, progress=False)  # was the members' outputs of x, not of 100 x
    with pytest.raises(ValueError, match=_refused("a BatchEnsemble", r"to_inference_data\(\)")):
        to_inference_data(model, None, x, y)
    assert "batchensemble(net, M)" in _message(lambda: predict(model, x, progress=False))


@pytest.mark.parametrize("how", sorted(_OWN))
def test_a_rank1_networks_own_forward_is_refused_by_predict_and_the_export(how):
    x, y = toy_data(8)
    model = _OWN[how](rank1(_net(), 2))
    model.num_data = len(x)
    pyro.clear_param_store()
    guide = mean_field_guide(model)
    with pytest.raises(ValueError, match=_refused("a rank-1 network", r"predict\(\)")):
        predict(model, x, guide, num_samples=2, progress=False)
    with pytest.raises(ValueError, match=_refused("a rank-1 network", r"to_inference_data\(\)")):
        to_inference_data(model, guide, x, y, num_samples=2)
    assert "rank1(net, M)" in _message(lambda: predict(model, x, guide, progress=False))


def _message(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


def _compiled(model):
    model.forward = torch.compile(model.forward)  # the built-in one: not the user's own
    return model


def test_pyrouqs_own_ensembles_and_a_compiled_forward_are_not_refused():
    x, y = toy_data(8)
    for model in (
        batchensemble(_net(), 2),
        BatchEnsembleMLP(in_features=3, hidden_features=8, out_features=2, num_members=2),
    ):
        expected = predict(model, x, progress=False).probs
        assert torch.equal(predict(_compiled(model), x, progress=False).probs, expected)
        to_inference_data(model, None, x, y)
    lenet = BatchEnsembleLeNet(num_members=2)
    assert predict(lenet, torch.randn(2, 1, 28, 28), progress=False).probs.shape == (2, 2, 10)
    model = rank1(_net(), 2)
    model.num_data = len(x)
    pyro.clear_param_store()
    guide = mean_field_guide(model)
    pyro.set_rng_seed(0)
    expected = predict(model, x, guide, num_samples=2, progress=False).probs
    pyro.set_rng_seed(0)
    compiled = predict(_compiled(model), x, guide, num_samples=2, progress=False).probs
    assert torch.equal(compiled, expected) and expected.shape == (4, 8, 2)
    to_inference_data(model, guide, x, y, num_samples=2)
