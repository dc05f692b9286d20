"""Which Pyro effect handlers around a call count as changing the model's sites: a
``poutine.block()`` alone hides sites from the handlers outside it and changes none, so mcmc()'s
chains may run in new processes under it (they sample the posterior they sample without it);
a handler outside a block that lets sites through still keeps them in this process."""

from __future__ import annotations

import pyro
import pytest
import torch
from _toy import toy_data
from torch import nn

import pyrouq

OPTIONS = {"num_samples": 3, "warmup_steps": 3, "num_chains": 2, "seed": 0, "progress": False}


def _model() -> pyrouq.BayesianNetwork:
    torch.manual_seed(0)
    return pyrouq.bayesian(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))


def test_chains_under_a_block_alone_run_in_new_processes_as_without_it():
    """A block hiding the sample sites from handlers outside it, with none outside: new
    processes sample what this one does (it was refused as "a poutine.scale, condition or
    mask" the new processes would not see)."""
    x, y = toy_data(24)
    model = _model()
    here = pyrouq.mcmc(model, x, y, parallel=False, **OPTIONS).samples
    with pyro.poutine.block(hide_types=["sample", "observe"]):
        apart = pyrouq.mcmc(model, x, y, parallel=True, **OPTIONS).samples
    assert set(apart) == set(here)
    for site, draws in here.items():
        torch.testing.assert_close(apart[site], draws)


@pytest.mark.parametrize("block", [{"hide": ["obs"]}, {"hide_types": ["param"]}])
def test_a_scale_outside_a_block_that_lets_sites_through_keeps_the_chains_here(block):
    """The poutine.scale outside a block that lets the latent draws through tempers them: the
    block does not hide it, and new processes would not see it."""
    x, y = toy_data(24)
    with pyro.poutine.scale(scale=4.0), pyro.poutine.block(**block):
        with pytest.raises(ValueError) as info:
            pyrouq.mcmc(_model(), x, y, parallel=True, **OPTIONS)
    assert str(info.value) == (
        "mcmc(parallel=True) runs the chains in new processes, which would not see the Pyro "
        "effect handler around the call (a poutine.scale, condition or mask, which applies in "
        "this process alone). Call mcmc() outside it, or pass parallel=False."
    )
