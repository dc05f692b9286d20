"""Review of 6e4ca11 (fit()'s set-up pass in a fork of the streams with its buffers put back; a
BatchEnsemble layer's refusal naming its path found on the call stack). Each test fails on
6e4ca11."""

from __future__ import annotations

import gc
import weakref
from unittest import mock

import pyro
import pytest
import torch
from _toy import ListLoader, toy_data
from pyro.infer.autoguide import AutoNormal, init_to_sample
from torch import nn

import pyrouq

# -- the set-up pass in a fork of the random streams -----------------------------------------


class _Recording(AutoNormal):
    """An AutoNormal keeping each call's draws."""

    def forward(self, *args, **kwargs):
        draws = super().forward(*args, **kwargs)
        self.draws.append({name: value.detach().clone() for name, value in draws.items()})
        return draws


@pytest.mark.parametrize("seed", [None, 0])
def test_the_first_steps_draws_are_not_the_set_up_passs_draws_replayed(seed):
    """The autoguide's initial values are drawn in the set-up pass, in a fork of torch's stream
    that is then put back: the first training step draws the very same numbers again. With
    init_to_sample the first step's eps equals the initial loc (correlation 1.0; 0.07 at the
    parent for an unseeded run), so the first sample is loc * (1 + scale), not a draw from q.
    (seed=0: fit() reseeds with the same seed after the pass, which did this before too.)"""
    pyro.clear_param_store()
    x, y = toy_data(40)
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(in_features=3, hidden_features=20, out_features=2)
    guide = _Recording(model, init_loc_fn=init_to_sample, init_scale=0.1)
    guide.draws = []
    torch.manual_seed(3)
    pyrouq.fit(model, guide, ListLoader(x, y, 40), epochs=1, lr=1e-9, lr_schedule="constant",
               progress=False, seed=seed)  # fmt: skip
    assert len(guide.draws) == 2  # the set-up pass's call, then the one training step's
    loc = guide.locs.fc1.weight.detach()
    eps = (guide.draws[1]["fc1.weight"] - loc) / 0.1
    corr = torch.corrcoef(torch.stack([loc.flatten(), eps.flatten()]))[0, 1].item()
    assert abs(corr) < 0.5, corr


# -- buffers_kept undoes half of a first-call initialisation ---------------------------------


class FirstCallShift(nn.Module):
    """A data-dependent initialisation on the first call (ActNorm-like): a buffer set from the
    data, and a Python flag saying it was."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 2)
        self.register_buffer("shift", torch.zeros(3))
        self.initialised = False

    def forward(self, x):
        if not self.initialised:
            self.shift.copy_(-x.mean(0))
            self.initialised = True
        return self.a(x + self.shift)


def test_a_first_call_initialisation_is_not_left_half_undone():
    """The set-up pass initialises the layer; buffers_kept puts the buffer back to zeros but
    the flag stays set, so the layer never initialises again: it trains and predicts with a
    shift of 0 while saying it is initialised (the parent kept the initialisation)."""
    x, y = toy_data(40)
    x = x + 3.0
    torch.manual_seed(0)
    model = pyrouq.bayesian(FirstCallShift())
    pyrouq.fit(model, pyrouq.mean_field_guide(model), ListLoader(x, y, 20), epochs=1, seed=0,
               progress=False)  # fmt: skip
    net = model.net
    assert net.initialised
    assert not torch.equal(net.shift, torch.zeros(3)), "flag set, buffer undone"


# -- a BatchEnsemble layer's refusal naming its path --------------------------------------


def _ensemble():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Sequential(nn.Conv2d(5, 4, 3)),
                        nn.Flatten(), nn.Linear(4, 2))  # fmt: skip
    return pyrouq.batchensemble(net, 2).eval()


_BAD = (3, 3, 6, 6)  # the inner conv gets 4 channels, not 5


class _RaisingNamedModules(nn.Module):
    def named_modules(self, *args, **kwargs):
        raise RuntimeError("named_modules of my own")


class _HalfBuilt(nn.Module):
    """Runs a network before nn.Module.__init__ (sizes worked out first)."""

    def __init__(self, net):
        net(torch.randn(*_BAD))
        super().__init__()


def _with_mock():
    helper = mock.Mock(spec=nn.Module)  # noqa: F841 (a caller's local)
    return _ensemble()(torch.randn(*_BAD))


def _with_dead_proxy():
    class Thing:
        pass

    thing = Thing()
    handle = weakref.proxy(thing)  # noqa: F841 (a caller's local, dead below)
    del thing
    gc.collect()
    return _ensemble()(torch.randn(*_BAD))


def _with_raising_module():
    odd = _RaisingNamedModules()  # noqa: F841 (a caller's local)
    return _ensemble()(torch.randn(*_BAD))


def _inside_half_built():
    return _HalfBuilt(_ensemble())


@pytest.mark.parametrize(
    "call", [_with_mock, _with_dead_proxy, _with_raising_module, _inside_half_built],
    ids=["mock-module", "dead-weakref-proxy", "named_modules-raises", "half-built-module"],
)  # fmt: skip
def test_the_layers_refusal_is_not_hidden_by_a_callers_local_variables(call):
    """Naming the layer walks every caller's locals and calls isinstance() and named_modules()
    on them: a TypeError ('Mock' object is not iterable), a ReferenceError, the user's own
    RuntimeError or an AttributeError ('_modules') replaced the layer's ValueError."""
    with pytest.raises(ValueError, match=r"Conv2d.* expects inputs of shape \("):
        call()


def test_the_refusal_does_not_keep_a_callers_deleted_tensor_alive():
    """Reading frame.f_locals (Python < 3.13) stores a snapshot dict of the caller's locals on
    its frame: a tensor the caller deletes after catching the refusal stays alive as long as
    the caller runs (a training loop's batch, a GPU buffer)."""

    def caller():
        big = torch.zeros(1000)
        ref = weakref.ref(big)
        model = _ensemble()
        try:
            model(torch.randn(*_BAD))
        except ValueError:
            pass
        del big
        gc.collect()
        return ref() is None

    assert caller()


def test_a_layer_shared_at_two_paths_is_named_at_every_path():
    """named_modules() drops repeated modules: a layer at 'head' and 'body.1' that failed
    running as 'body.1' was named 'head' alone, a path whose input was never wrong. The
    converted network's run names the layer at each of its paths (which one ran is not looked
    up: no stack walking). (Amended from the review's hand-built network: a layer outside a
    converted network is named by its class and settings alone, with no path.)"""
    torch.manual_seed(0)
    first, second = nn.Linear(3, 4), nn.Linear(5, 2)

    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = second
            self.body = nn.Sequential(first, second)

        def forward(self, x):
            return self.body(x)

    model = pyrouq.batchensemble(Two(), 2)
    with pytest.raises(ValueError) as info:
        model(torch.randn(4, 3))
    message = str(info.value)
    assert message.startswith(
        "BatchEnsembleLinear(5, 2, num_members=2) at 'net.head' and 'net.body.1' of the model "
        "expects inputs of shape (B, ..., 5)"
    ), message
    hand_built = nn.Sequential(
        pyrouq.BatchEnsembleLinear(3, 4, 2), pyrouq.BatchEnsembleLinear(5, 2, 2)
    )
    with pytest.raises(ValueError) as info:
        hand_built(torch.randn(4, 3))
    assert str(info.value).startswith(
        "BatchEnsembleLinear(5, 2, num_members=2) expects inputs of shape (M * B, ..., 5), "
        "got shape (4, 4)."
    ), str(info.value)
