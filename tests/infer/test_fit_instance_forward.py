"""A forward set on a BayesianNetwork instance is the model's forward for fit() as it is for
predict() and mcmc(): the objective traces it rather than running the network alone."""

from __future__ import annotations

import types

import pyro
import pytest
import torch
from _toy import ListLoader, toy_data

from pyrouq import BayesianNetwork, KLWeightedELBO, bayesian, fit, mean_field_guide


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _doubling(model: BayesianNetwork) -> BayesianNetwork:
    def forward(self, x, y=None):  # the network on 2 x
        return BayesianNetwork.forward(self, 2 * x, y)

    model.forward = types.MethodType(forward, model)
    return model


def _loss(model, x, y) -> float:
    model.num_data = len(x)
    pyro.clear_param_store()
    guide = mean_field_guide(model, init_scale=1e-6)  # draws at the locations
    pyro.set_rng_seed(0)
    return float(KLWeightedELBO(kl_weight=0.5).loss(model, guide, x, y))


def test_the_objective_runs_a_forward_set_on_the_instance():
    x, y = toy_data(16)
    patched = _loss(_doubling(bayesian(_net())), x, y)
    doubled = _loss(bayesian(_net()), 2 * x, y)
    plain = _loss(bayesian(_net()), x, y)
    assert patched == pytest.approx(doubled, abs=1e-3)  # (the KL, ~400, is alike in all three)
    assert abs(patched - plain) > 0.1  # (the network alone scores x: 0.39 apart)


def test_fit_trains_the_forward_set_on_the_instance():
    x, y = toy_data(16)
    losses = []
    for model, inputs in ((_doubling(bayesian(_net())), x), (bayesian(_net()), 2 * x)):
        pyro.clear_param_store()
        guide = mean_field_guide(model, init_scale=1e-6)
        history = fit(model, guide, ListLoader(inputs, y, 8), epochs=2, progress=False, seed=0)
        losses.append(history)
    first, second = (torch.tensor([float(v) for v in h.losses]) for h in losses)
    assert torch.allclose(first, second, rtol=1e-4)
