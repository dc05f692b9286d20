"""batchensemble() of a network that records Pyro sites under the model's names (its own
"logits", or "obs" in plate "data"): a Pyro trace of the ensemble failed with "Multiple sample
sites named 'logits'" (or 'data'), as bayesian()'s did before; the sites are hidden now, and the
ensemble is the one of the network without them."""

import pyro
import pytest
import torch
from _toy import toy_data
from test_mcmc_own_models_audit9 import _Recording

import pyrouq


@pytest.mark.parametrize("name", ["logits", "obs"])
def test_a_batchensemble_of_a_network_recording_the_models_sites_traces(name):
    x, y = toy_data(20)
    torch.manual_seed(0)
    plain = pyrouq.batchensemble(_Recording(), 2)
    torch.manual_seed(0)
    recording = pyrouq.batchensemble(_Recording(name), 2)
    plain.num_data = recording.num_data = 20
    trace = pyro.poutine.trace(recording).get_trace(x, y)
    assert trace.nodes["obs"]["is_observed"]
    assert torch.equal(trace.nodes["obs"]["value"], y)
    reference = pyro.poutine.trace(plain).get_trace(x, y)
    assert torch.equal(trace.nodes["logits"]["value"], reference.nodes["logits"]["value"])
    assert torch.equal(trace.log_prob_sum(), reference.log_prob_sum())
