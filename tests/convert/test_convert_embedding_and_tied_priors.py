"""Review of the second audits' changes: what they refused or changed that they should not have
(an embedding model's integer inputs, equal priors of a tied site), and a check they missed (a
third name of a tied site)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyrouq import bayesian, predict


class _Bag(PyroModule):
    """Token ids -> an embedding of latent weights, averaged, -> a latent linear head: no
    floating parameter of its own (every weight a PyroSample)."""

    def __init__(self):
        super().__init__()
        self.emb = PyroModule[nn.Embedding](10, 4)
        self.emb.weight = PyroSample(dist.Normal(0.0, 1.0).expand([10, 4]).to_event(2))
        self.fc = PyroModule[nn.Linear](4, 3)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 4]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))

    def forward(self, x, y=None):
        logits = self.fc(self.emb(x).mean(1))
        pyro.deterministic("logits", logits)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_an_embedding_model_without_parameters_of_its_own_keeps_its_integer_inputs():
    # predict() took the guide's dtype for such a model, and with it the guide's refusal of
    # integer inputs: "predict() expects floating-point inputs, got a torch.int64 tensor"
    torch.manual_seed(0)
    pyro.clear_param_store()
    model = _Bag()
    x, y = torch.randint(0, 10, (8, 5)), torch.randint(0, 3, (8,))
    guide = AutoNormal(model)
    guide(x, y)
    torch.manual_seed(5)
    got = predict(model, x, guide, num_samples=3, parallel=False, progress=False).probs
    torch.manual_seed(5)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(3)]  # the draws, then the runs
    expected = []
    for drawn in traces:
        run = poutine.trace(poutine.replay(model, trace=drawn)).get_trace(x)
        expected.append(run.nodes["logits"]["value"].softmax(-1))
    torch.testing.assert_close(got, torch.stack(expected), rtol=0, atol=1e-6)


class _Tied(nn.Module):
    """One weight under the names 'enc.weight', 'dec.weight' and 'out.weight'."""

    def __init__(self):
        super().__init__()
        self.enc, self.dec, self.out = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.dec.weight = self.enc.weight
        self.out.weight = self.enc.weight

    def forward(self, x):
        return self.out(self.dec(self.enc(x).relu()).relu())


def test_equal_priors_given_apart_to_the_names_of_a_tied_site_are_one_prior():
    # two Normal(0, 0.1) built apart (or 0.1 and Normal(0, 0.1)) were refused "with other
    # priors": only the same object, or equal floats, passed
    for prior in (
        {"enc": dist.Normal(0.0, 0.1), "dec": dist.Normal(0.0, 0.1)},
        {"enc": 0.1, "dec": dist.Normal(0.0, 0.1), "out": 0.1},
    ):
        model = bayesian(_Tied(), prior=prior)
        assert str(model.prior_of("enc.weight")) == "SitePrior(Normal(loc=0, scale=0.1))"
        assert str(model.prior_of("dec.bias")) == "SitePrior(Normal(loc=0, scale=0.1))"
    laplace = {"enc": dist.Laplace(0.0, 0.1), "out": dist.Normal(0.0, 0.1)}
    with pytest.raises(ValueError, match=r"prior keys 'enc' and 'out' both match 'enc.weight'"):
        bayesian(_Tied(), prior=laplace)


@pytest.mark.parametrize(
    "prior", [{"enc": 0.2, "dec": 0.1, "out": 0.1}, {"enc": 0.1, "dec": 0.2, "out": 0.1}]
)
def test_a_tied_sites_third_name_of_another_prior_is_refused_whatever_the_keys_order(prior):
    # only the last two equally long keys were compared: a first one that differed was dropped
    with pytest.raises(ValueError, match=r"both match 'enc.weight', one tensor under the names"):
        bayesian(_Tied(), prior=prior)
