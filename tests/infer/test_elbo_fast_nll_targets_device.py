"""Review of the audits of likelihoods, data, BatchEnsemble and bring-your-own-network: the
fixes reached through the other public routes (KLWeightedELBO's fast NLL, a rank-1 network's
member passes)."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from _toy import NextParam
from torch import nn

import pyrouq
from pyrouq import _engine


@pytest.mark.parametrize(
    ("likelihood", "width", "y"),
    [("categorical", 3, torch.tensor([0, 1, 2, 1])), ("gaussian", 1, torch.randn(4))],
)
def test_targets_on_another_device_are_told_through_the_fast_nll(likelihood, width, y):
    # Trace_ELBO (through observe) told it; KLWeightedELBO's fast NLL read the labels first:
    # 'Tensor.item() cannot be called on meta tensors' (torch's device error on a GPU)
    pyro.clear_param_store()
    model = pyrouq.bayesian(nn.Linear(5, width), likelihood=likelihood, num_data=4)
    guide = pyrouq.mean_field_guide(model)
    x = torch.randn(4, 5)
    message = (
        r"^BayesianNetwork: the targets y are on meta, the outputs on cpu; expected both on "
        r"one device: move the targets with y.to\('cpu'\).$"
    )
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), pyrouq.KLWeightedELBO())
    with pytest.raises(ValueError, match=message):
        svi.step(x, y.to("meta"))  # "meta" stands in for a GPU
    assert math.isfinite(svi.step(x, y))  # on one device it trains


@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_a_rank1_network_with_every_parameter_latent_tells_why_next_parameters_fails(kind):
    # a Bayesian network's draws were told; a BatchEnsemble's (members run through another
    # functional_call) raised a bare StopIteration: ''
    pyro.clear_param_store()
    ensemble = pyrouq.batchensemble(NextParam(), 2)
    with pytest.warns(UserWarning):  # factors under a prior centred on 0: said, and meant
        model = pyrouq.bayesian(ensemble, select=lambda name, p: True, num_data=6)
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    message = r"^NextParam\.forward raised StopIteration\. If it reads next\(self\.parameters"
    with _engine.schedule(kind):
        with pytest.raises(RuntimeError, match=message):
            pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        with pytest.raises(RuntimeError, match=message):
            pyrouq.KLWeightedELBO().terms(model, guide, x, y)
    # with W left a parameter (rank1's default selection) the same network runs
    model = pyrouq.rank1(NextParam(), 2)
    probs = pyrouq.predict(model, x, pyrouq.mean_field_guide(model), num_samples=2, progress=False)
    assert probs.probs.shape == (4, 6, 3)
