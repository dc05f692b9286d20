"""Audit 11: the converters on a user's own network, checked against plain torch.

A network whose every weight is latent holds them as buffers: the dtype it computes in must be
that of its weights, not that of a constant buffer of another dtype registered before them (a
float64 scalar from numpy, which plain torch's type promotion leaves harmless).
"""

from __future__ import annotations

import copy
import pickle
import threading

import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader
from torch import nn

from pyrouq import (
    KLWeightedELBO,
    batchensemble,
    bayesian,
    fit,
    mean_field_guide,
    predict,
    rank1,
)
from pyrouq.likelihoods import Gaussian


class _Scaled(nn.Module):
    """Inputs divided by a float64 scalar constant (e.g. ``torch.tensor(np.float64(255))``)
    registered before the layers: a float32 input stays float32 in plain torch (a 0-dim
    tensor does not promote a dimensioned one)."""

    def __init__(self, outputs: int = 3):
        super().__init__()
        self.register_buffer("scale", torch.tensor(4.0, dtype=torch.float64))
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, outputs)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x / self.scale)))


def _data(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_a_fully_latent_network_with_a_float64_constant_computes_as_plain_torch_does():
    torch.manual_seed(0)
    net = _Scaled()
    x, y = _data()
    expected = net(x)
    assert expected.dtype == torch.float32  # plain torch: float32 throughout
    model = bayesian(net)
    assert list(model.latent_sites()) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    with torch.no_grad():
        out = model.eval().outputs(x, model.template())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected.detach(), rtol=0, atol=1e-6)
    # the template as one posterior draw: the plain network's class probabilities
    draws = {site: value[None] for site, value in model.template().items()}
    probs = predict(model, x, posterior_samples=draws, progress=False).probs
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs[0], expected.detach().softmax(-1), rtol=0, atol=1e-6)
    # and it trains (one epoch), as the same network without the constant does
    guide = mean_field_guide(model)
    fit(model, guide, ListLoader(x, y, 6), epochs=1, lr=1e-3, progress=False)
    assert predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 12, 3)


def test_a_noise_prior_takes_the_dtype_of_the_latent_weights_not_of_a_constant():
    torch.manual_seed(0)
    noise = dist.LogNormal(torch.tensor(-1.0), torch.tensor(0.5))
    model = bayesian(_Scaled(outputs=1), likelihood=Gaussian(scale=noise))
    held = [t for t in model.likelihood.buffers() if t.is_floating_point()]
    assert held and all(t.dtype == torch.float32 for t in held)
    x, _ = _data()
    model.num_data = 12
    out = model(x, torch.randn(12, 1))
    assert out.dtype == torch.float32


@pytest.mark.parametrize("select", [None, "last_layer"])
def test_a_float64_network_with_a_float32_constant_still_computes_in_float64(select):
    """The other way round: the weights' dtype decides (float64 here)."""

    class Held(_Scaled):
        def __init__(self):
            super().__init__()
            self.scale = torch.tensor(4.0, dtype=torch.float32)
            self.fc1.double()
            self.fc2.double()

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x / self.scale.double())))

    torch.manual_seed(0)
    net = Held()
    x, _ = _data()
    model = bayesian(net, select=select).eval()
    with torch.no_grad():
        out = model.outputs(x.float(), model.template())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, net(x.double()).detach(), rtol=0, atol=1e-12)


class _Caching(nn.Module):
    """Keeps its hidden activations for a plot, as attention maps often are: after a forward
    with gradients they are non-leaf tensors, which copy.deepcopy refuses."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.out = nn.Linear(6, 3)
        self.last = None
        self.maps: list[torch.Tensor] = []

    def forward(self, x):
        h = torch.tanh(self.fc(x))
        self.last = h
        self.maps[:] = [h]
        return self.out(h)


def test_a_network_holding_a_computed_tensor_is_refused_naming_it():
    net = _Caching()
    net(torch.randn(2, 4))  # a forward with gradients: net.last and net.maps hold h
    for convert in (bayesian, lambda n: batchensemble(n, 2)):
        with pytest.raises(ValueError) as caught:
            convert(net)
        message = str(caught.value)
        assert "cannot be copied" in message
        assert "'last', 'maps' hold tensors computed from others with gradients" in message
        assert "Hold such a value detached (self.cache = value.detach()), compute it" in message
        assert "prune" not in message  # (no hook of prune or weight_norm: not their advice)
    net.last, net.maps = net.last.detach(), []
    assert list(bayesian(net).latent_sites())[:1] == ["fc.weight"]  # as told: it converts


class _Drawing(nn.Module):
    """Holds a generator object (``self.noise``) beside a torch.Generator (``self.gen``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.gen = torch.Generator().manual_seed(0)
        self.noise = (0.1 * i for i in range(3))

    def forward(self, x):
        return self.fc(x)


def test_a_network_holding_a_generator_object_is_refused_naming_it():
    # rank1() / batchensemble() / bayesian() failed with torch's bare "cannot pickle
    # 'generator' object", naming neither the attribute nor a fix
    net = _Drawing()
    for convert in (lambda n: rank1(n, 2), lambda n: batchensemble(n, 2), bayesian):
        with pytest.raises(TypeError) as caught:
            convert(net)
        message = str(caught.value)
        assert message.startswith("_Drawing cannot be copied, so pyrouq cannot ")
        assert (
            "(it converts a copy and leaves your network as it is): 'noise' holds a generator "
            "object, which copy.deepcopy refuses (cannot pickle 'generator' object). Make such a "
            "value in forward, or delete it before converting (del net.noise), or hold it in a "
            "form that copies (a generator's values as a list, list(gen))."
        ) in message
    net.noise = list(net.noise)  # as told (the torch.Generator copies as it is)
    assert rank1(net, 2).num_members == 2 and batchensemble(net, 2).num_members == 2
    # in a Sequential, told 'del net.0.noise', which is no Python: now net[0].noise
    held = nn.Sequential(_Drawing(), nn.ReLU())
    with pytest.raises(
        TypeError, match=r"'0\.noise' holds a generator object, .*\(del net\[0\]\.noise\)"
    ):
        bayesian(held)
    net = held  # the name the advice uses
    del net[0].noise  # as told
    assert list(bayesian(held).latent_sites())[:1] == ["0.fc.weight"]
    two = _Drawing()
    two.lock = threading.Lock()  # (named after 'noise': the kinds go as the names do)
    with pytest.raises(TypeError, match=r"'noise', 'lock' hold generator / lock objects, "):
        bayesian(two)
    # a ModuleDict's key '0' was told 'del net[0].noise' (KeyError: 0), an attribute named
    # 'a-b' 'del net['a-b']' (a module takes no index): each now as Python reaches it
    for net, told, first in [
        (nn.ModuleDict({"0": _Drawing()}), "del net['0'].noise", "0.fc.weight"),
        (nn.Sequential(nn.ModuleDict({"x": _Drawing()})), "del net[0]['x'].noise", "0.x.fc.weight"),
        (_Drawing(), "delattr(net.fc, 'a-b')", "fc.weight"),
    ]:
        if told.startswith("delattr"):
            del net.noise
            setattr(net.fc, "a-b", (0.1 * i for i in range(3)))
        with pytest.raises(TypeError) as caught:
            bayesian(net)
        assert f"delete it before converting ({told}), or hold" in str(caught.value)
        exec(told)  # as told
        assert next(iter(bayesian(net).latent_sites())) == first


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
def test_a_fitted_model_that_caches_activations_copies_pickles_and_gives_its_network(kind):
    torch.manual_seed(0)
    x, y = _data()
    model = {
        "bayesian": lambda: bayesian(_Caching()),
        "batchensemble": lambda: batchensemble(_Caching(), 2),
        "rank1": lambda: rank1(_Caching(), 2),
    }[kind]()
    guide = None if kind == "batchensemble" else mean_field_guide(model)
    fit(model, guide, ListLoader(x, y, 6), epochs=1, lr=1e-3, progress=False)
    model.train()
    model.num_data = 12
    if guide is None:  # a training step's forward, its graph left to backward
        loss = (model(x) ** 2).sum()
    else:
        loss = KLWeightedELBO().differentiable_loss(model, guide, x, y)
    copied = copy.deepcopy(model)
    loaded = pickle.loads(pickle.dumps(model))
    loss.backward()  # the graph built before the copy is untouched
    model.eval()
    copied.eval()
    loaded.eval()
    with torch.no_grad():
        if guide is None:
            expected = model(x)
            got = [copied(x), loaded(x)]
        else:
            means = guide.means()
            expected = model.outputs(x, means)
            got = [copied.outputs(x, means), loaded.outputs(x, means)]
    for out in got:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    if kind == "bayesian":  # the plain network: the template as its weights
        plain = model.plain_network().eval()
        with torch.no_grad():
            torch.testing.assert_close(plain(x), model.outputs(x, model.template()), rtol=0, atol=0)
