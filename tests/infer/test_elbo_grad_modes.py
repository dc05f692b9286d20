"""KLWeightedELBO's loss_and_grads() under torch.no_grad() and torch.inference_mode() gives
the gradients it gives outside them (it left them unset, or raised torch's "does not require
grad" / "Inference tensors cannot be saved for backward")."""

from __future__ import annotations

import pyro
import pytest
import torch
from _toy import tiny_mlp, toy_data

import pyrouq
from pyrouq.infer import KLWeightedELBO


@pytest.mark.parametrize("num_particles", [1, 2])
def test_loss_and_grads_under_no_grad_gives_the_gradients_it_gives_outside(num_particles):
    x, y = toy_data(8)
    grads = []
    for context in (torch.enable_grad, torch.no_grad):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = tiny_mlp(num_data=8)
        guide = pyrouq.MeanFieldGuide(model)
        pyro.set_rng_seed(1)
        with context():
            loss = KLWeightedELBO(num_particles=num_particles).loss_and_grads(model, guide, x, y)
        grads.append((loss, [p.grad for p in guide.parameters()]))
    (loss, expected), (loss_no_grad, got) = grads
    assert loss_no_grad == loss
    assert len(got) == len(expected) > 0
    assert all(g is not None for g in got)  # (2 particles: torch's "does not require grad")
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.parametrize("num_particles", [1, 2])
def test_loss_and_grads_under_inference_mode_gives_the_gradients_it_gives_outside(
    num_particles,
):
    x, y = toy_data(8)
    grads = []
    for context in (torch.enable_grad, torch.inference_mode):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = tiny_mlp(num_data=8)
        guide = pyrouq.MeanFieldGuide(model)
        guide(x, y)  # (its parameters made outside inference_mode, as fit() asks)
        pyro.set_rng_seed(1)
        with context():
            loss = KLWeightedELBO(num_particles=num_particles).loss_and_grads(model, guide, x, y)
        grads.append((loss, [p.grad for p in guide.parameters()]))
    (loss, expected), (got_loss, got) = grads
    # (was torch's "Inference tensors cannot be saved for backward")
    assert got_loss == loss
    assert len(got) == len(expected) > 0
    assert all(g is not None for g in got)
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
