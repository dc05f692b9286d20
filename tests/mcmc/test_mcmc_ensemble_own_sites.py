"""batchensemble() of a network that records Pyro sites under the model's names (its own
"logits", or "obs" in plate "data"): a Pyro trace of the ensemble failed with "Multiple sample
sites named 'logits'" (or 'data'), as bayesian()'s did before; the sites are hidden now, and the
ensemble is the one of the network without them."""

import pyro
import pytest
import torch
from _toy import toy_data
from test_mcmc_against_pyro_nuts import _Recording

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


class _OwnNoise(_Recording):
    """A network drawing its own noise site, ``pyro.sample("eps", ...)`` in its forward."""

    def forward(self, x, y=None):
        eps = pyro.sample("eps", pyro.distributions.Normal(0.0, 1.0))
        return self.fc2(torch.tanh(self.fc1(x)) + eps)


def test_mcmc_refuses_a_network_sampling_its_own_site():
    """NUTS sampled 'eps' as a latent variable and mcmc() dropped its draws from the result
    silently (predict() on them then drew it from its prior)."""
    x, y = toy_data(20)
    model = pyrouq.bayesian(_OwnNoise(), num_data=20)
    with pytest.raises(ValueError) as err:
        pyrouq.mcmc(model, x, y, 5, 5, 1, seed=0, progress=False)
    assert str(err.value).startswith(
        "mcmc(): the network of BayesianNetwork samples ['eps'] itself (pyro.sample in its "
        "forward): NUTS would infer it as a latent variable, which the result does not keep"
    )
    # the sites the model hides (its own "logits", "obs") are no such site
    result = pyrouq.mcmc(pyrouq.bayesian(_Recording("obs"), num_data=20), x, y, 3, 3, 1,
                         seed=0, progress=False)  # fmt: skip
    assert set(result.samples) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
