"""Review 11f: mcmc()'s chain processes and a network that caches a computed tensor in forward.

A network that keeps a value from a training forward (an auxiliary loss, ``if self.training:
self.last = h``) holds a tensor with a graph once it ran. Since pickling stopped detaching it
(the live model must stay as it is), starting the chain processes failed in torch's process
pickler ("Cowardly refusing to serialize non-leaf tensor which requires_grad"), on the default
route too. The processes now receive detached copies; the caller's model keeps its own.
"""

from __future__ import annotations

import collections

import pytest
import torch
from _toy import MCMC_OPTIONS, regression_data
from torch import nn

from pyrouq import Gaussian, bayesian, mcmc

Held = collections.namedtuple("Held", "h layer")


class TrainCache(nn.Module):
    """Keeps values of its training forwards, as an attribute, in a buffer and in a nested
    container that also holds one of its layers (a chain process imports it from here)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 4)
        self.fc2 = nn.Linear(4, 1)
        self.register_buffer("stat", None)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        if self.training:
            self.last = h
            self.stat = h.mean(0)  # (a buffer: torch registers the assignment there)
            self.maps = {"steps": [Held(h, self.fc1)], "count": 1}
        return self.fc2(h)


def _trained_once():
    """A Bayesian TrainCache whose network ran a training forward with gradients, and what it
    cached."""
    torch.manual_seed(0)
    x, y = regression_data()
    model = bayesian(TrainCache(), likelihood=Gaussian(0.3), select="last_layer", num_data=12)
    model(x, y)
    net = model.net
    cached = (net.last, net.stat, net.maps)
    assert all(t.grad_fn is not None for t in (net.last, net.stat, net.maps["steps"][0].h))
    return model, x, y, cached


def _untouched(model, cached):
    """The network holds the very objects it cached, with their graphs (which backpropagate)."""
    net = model.net
    last, stat, maps = cached
    assert net.last is last and net.stat is stat and net.maps is maps
    assert maps["steps"][0].h is last and maps["steps"][0].layer is net.fc1
    assert last.grad_fn is not None and stat.grad_fn is not None
    (last.sum() + stat.sum()).backward()
    assert net.fc1.weight.grad is not None


@pytest.mark.parametrize("parallel", [True, None])
def test_parallel_chains_sample_a_network_that_cached_a_tensor_with_a_graph(parallel):
    """parallel=None: 200 steps, where the default route takes processes (on 2 cores or more),
    short trees keeping it quick."""
    model, x, y, cached = _trained_once()
    options = dict(MCMC_OPTIONS)
    if parallel is None:
        options.update(num_samples=100, warmup_steps=100, max_tree_depth=2)
    here = mcmc(model, x, y, num_chains=2, parallel=False, **options)
    there = mcmc(model, x, y, num_chains=2, parallel=parallel, **options)
    assert set(there.samples) == set(here.samples)
    for site in here.samples:
        torch.testing.assert_close(there.samples[site], here.samples[site])
    _untouched(model, cached)
