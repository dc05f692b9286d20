"""Review 11c: a converted model whose network caches a computed tensor in forward.

Pickling (``torch.save``, ``pickle``) leaves the live model as it is: its cached value keeps
its graph, so a loss read from it after a checkpoint still backpropagates. ``copy.deepcopy``
and ``plain_network()`` give the copy detached values wherever the cached tensor sits (a
namedtuple, a set, a list nested four deep, a list holding itself), the original untouched.
"""

from __future__ import annotations

import collections
import copy
import io
import pickle

import pytest
import torch
from torch import nn

from pyrouq import KLWeightedELBO, batchensemble, bayesian, mean_field_guide, rank1

Out = collections.namedtuple("Out", "h")


class _Caching(nn.Module):
    """Keeps its hidden activations after forward, in the container ``holder`` names."""

    def __init__(self, holder: str):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.out = nn.Linear(4, 2)
        self.holder = holder

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        if self.holder == "aux":  # an auxiliary penalty, read after forward
            self.aux = h.pow(2).mean()
        elif self.holder == "namedtuple":
            self.last = Out(h)
        elif self.holder == "set":
            self.last = {h}
        elif self.holder == "deep":
            self.last = [[[[h]]]]
        elif self.holder == "dict":
            self.last = {"maps": [(h, {"deep": [h]})]}
        elif self.holder == "cycle":
            self.last = [h]
            self.last.append(self.last)
        return self.out(h)


def _held(net: nn.Module) -> torch.Tensor:
    """The tensor ``net`` cached."""
    if net.holder == "aux":
        return net.aux
    value = net.last
    if net.holder == "namedtuple":
        return value.h
    if net.holder == "set":
        return next(iter(value))
    if net.holder == "deep":
        return value[0][0][0][0]
    if net.holder == "dict":
        return value["maps"][0][1]["deep"][0]
    return value[0]


def _ran_with_gradients(kind: str, holder: str):
    """A model of ``kind`` whose network ran a training step's forward (its graph left to
    backward), and that step's loss."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    if kind == "batchensemble":
        model = batchensemble(_Caching(holder), 2).train()
        return model, (model(x) ** 2).sum(), x
    model = (bayesian if kind == "bayesian" else lambda n: rank1(n, 2))(_Caching(holder))
    model.num_data = 8
    loss = KLWeightedELBO().differentiable_loss(model, mean_field_guide(model), x, y)
    return model, loss, x


def _outputs(model, x):
    model.eval()
    with torch.no_grad():
        if hasattr(model, "template"):
            return model.outputs(x, model.template())
        return model(x)


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
@pytest.mark.parametrize("save", ["torch.save", "pickle"])
def test_pickling_leaves_the_live_models_cached_tensor_and_its_graph(kind, save):
    model, _, x = _ran_with_gradients(kind, "aux")
    aux = model.net.aux
    assert aux.grad_fn is not None
    if save == "torch.save":
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
    else:
        loaded = pickle.loads(pickle.dumps(model))
    assert model.net.aux is aux and aux.grad_fn is not None  # not detached by the save
    aux.backward()  # a penalty read after the checkpoint still reaches the weights
    torch.testing.assert_close(loaded.net.aux.detach(), aux.detach(), rtol=0, atol=0)
    torch.testing.assert_close(_outputs(loaded, x), _outputs(model, x), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
@pytest.mark.parametrize("holder", ["namedtuple", "set", "deep", "dict", "cycle"])
def test_a_model_caching_a_tensor_in_any_container_deep_copies_untouched(kind, holder):
    model, loss, x = _ran_with_gradients(kind, holder)
    held = _held(model.net)
    assert held.grad_fn is not None
    copied = copy.deepcopy(model)
    plain = None if kind == "batchensemble" else model.plain_network()
    assert _held(model.net) is held and held.grad_fn is not None  # the original untouched
    loss.backward()  # the graph built before the copy is untouched
    for net in [copied.net] + ([] if plain is None else [plain]):
        value = _held(net)
        assert value.grad_fn is None and not value.requires_grad
        assert value.data_ptr() != held.data_ptr()  # its own memory, not the original's
        torch.testing.assert_close(value, held.detach(), rtol=0, atol=0)
    if holder == "cycle":
        assert copied.net.last[1] is copied.net.last  # the copy holds itself, as the original
    expected = _outputs(model, x)
    torch.testing.assert_close(_outputs(copied, x), expected, rtol=0, atol=0)
    if kind == "bayesian":  # the plain network: the template as its weights
        plain.eval()
        with torch.no_grad():
            torch.testing.assert_close(plain(x), expected, rtol=0, atol=0)
