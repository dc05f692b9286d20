"""Review of the day's Pyro-interop changes: mcmc()'s check of the sites a network samples
itself hides what forward() hides (a network recording the model's names more than once was
refused by a bare Pyro error, though NUTS never sees those sites); the model passed as its own
guide is told the guide that fits it (a BatchEnsemble: none; a Pyro model of one's own: an
autoguide), not mean_field_guide(), which refuses both."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import toy_data
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq

QUIET = {"progress": False}


class _Records(PyroModule):
    """A network of one's own recording Pyro sites under the converted model's names more
    than once (``how``): ``"logits"`` after each pass of a shared block, or two plates
    ``"data"``; ``None`` records nothing (the reference)."""

    def __init__(self, how=None):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 3), nn.Linear(3, 2)
        self.how = how

    def forward(self, x):
        for i in range(2):  # a shared block, run twice
            x = torch.tanh(self.fc1(x))
            if self.how == "logits":
                pyro.deterministic("logits", x)
            elif self.how == "data":
                with pyro.plate("data", x.shape[0]):
                    pyro.deterministic(f"act{i}", x.sum(-1))
        return self.fc2(x)


@pytest.mark.parametrize("how", ["logits", "data"])
def test_mcmc_samples_a_network_recording_the_models_names_twice_as_forward_hides_them(how):
    # before: RuntimeError: Multiple sample sites named 'logits' (or 'data'), from the check
    # of the network's own sites, where forward() (and so NUTS) hides them
    x, y = toy_data(12)
    torch.manual_seed(0)
    plain = pyrouq.bayesian(_Records(), select=["fc2"])
    torch.manual_seed(0)
    recording = pyrouq.bayesian(_Records(how), select=["fc2"])
    result = pyrouq.mcmc(recording, x, y, 3, 3, 1, seed=0, **QUIET)
    reference = pyrouq.mcmc(plain, x, y, 3, 3, 1, seed=0, **QUIET)
    assert set(result.samples) == {"fc2.weight", "fc2.bias"}
    for site, value in reference.samples.items():
        assert torch.equal(result.samples[site], value)


class _Samples(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x) / pyro.sample("temperature", dist.LogNormal(0.0, 1.0))


def test_mcmc_still_refuses_a_network_sampling_a_site_of_its_own():
    x, y = toy_data(12)
    model = pyrouq.bayesian(_Samples(), select=["fc"])
    with pytest.raises(ValueError, match=r"^mcmc\(\): the network of BayesianNetwork samples "
                       r"\['temperature'\] itself \(pyro.sample in its forward\)"):  # fmt: skip
        pyrouq.mcmc(model, x, y, 3, 3, 1, seed=0, **QUIET)


ENSEMBLE_CALLS = {
    "to_inference_data()": lambda m, x, y: pyrouq.to_inference_data(m, m, x, y),
    "psis_diagnostic()": lambda m, x, y: pyrouq.psis_diagnostic(m, m, x, y, num_samples=30),
}


@pytest.mark.parametrize("caller", ENSEMBLE_CALLS)
def test_a_batchensemble_as_its_own_guide_is_told_to_pass_none(caller):
    # before: "... Pass the guide built for it, guide = mean_field_guide(model)", which
    # refuses a BatchEnsemble (it takes no guide)
    x, y = toy_data(8)
    model = pyrouq.batchensemble(nn.Linear(3, 2), 3)
    model.num_data = 8
    with pytest.raises(ValueError) as err:
        ENSEMBLE_CALLS[caller](model, x, y)
    assert str(err.value) == (
        f"{caller} got a guide for a BatchEnsemble (BatchEnsembleNetwork), whose members are "
        "the draws. Leave it out (guide=None); to draw weights, make the network Bayesian "
        "first: pyrouq.bayesian(net), or pyrouq.rank1(net, M) for an ensemble."
    )


class _Own(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](3, 2)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def _own_function(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)
    return x @ w


def test_a_pyro_model_of_ones_own_as_its_own_guide_is_told_of_an_autoguide():
    # before: told guide = mean_field_guide(model), which refuses a model of one's own
    x, y = toy_data(8)
    model = _Own()
    with pytest.raises(ValueError) as err:
        pyrouq.fit(model, model, [(x, y)], epochs=1, num_data=8, **QUIET)
    assert str(err.value) == (
        "fit(): the model (_Own) was passed as its own guide, which would draw the weights "
        "from the prior, not from a posterior. Pass the guide built for it, guide = "
        "pyro.infer.autoguide.AutoNormal(model), fitted with fit(model, guide, data)."
    )
    with pytest.raises(ValueError, match=r"guide = pyro.infer.autoguide.AutoNormal\(model\), "
                       r"fitted with Pyro's SVI\.$"):  # fmt: skip
        pyrouq.predict(_own_function, x, _own_function, num_samples=2, **QUIET)
    pyro.clear_param_store()
    guide = AutoNormal(model)  # the advice works
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=8, **QUIET)
    assert tuple(pyrouq.predict(model, x, guide, num_samples=2, **QUIET).probs.shape) == (2, 8, 2)
