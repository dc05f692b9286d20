"""A Pyro user's own model and guide through pyrouq, checked against Pyro itself: Predictive's
draws and a guide traced by hand (draw by draw), the param store after pyrouq's calls, the
pointwise log-likelihood of a subsampling model, and a guide of per-input latent sites."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from pyro.nn import PyroModule, PyroSample
from torch.distributions import constraints

import pyrouq

SITES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


class Net(PyroModule):
    """A Pyro user's BNN: PyroSample priors, a subsampling plate, logits returned."""

    def __init__(self, num_data=40):
        super().__init__()
        self.fc1 = PyroModule[torch.nn.Linear](3, 6)
        self.fc1.weight = PyroSample(dist.Normal(0.0, 1.0).expand([6, 3]).to_event(2))
        self.fc1.bias = PyroSample(dist.Normal(0.0, 1.0).expand([6]).to_event(1))
        self.fc2 = PyroModule[torch.nn.Linear](6, 3)
        self.fc2.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 6]).to_event(2))
        self.fc2.bias = PyroSample(dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        self.num_data = num_data

    def forward(self, x, y=None):
        logits = self.fc2(torch.relu(self.fc1(x)))
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def _hand_guide(x, y=None):  # param names with slashes and dots, constrained scales
    for site, shape in (("fc1.weight", (6, 3)), ("fc1.bias", (6,))):
        loc = pyro.param(f"my/guide.{site}.loc", torch.zeros(shape))
        scale = pyro.param(f"my/guide.{site}.scale", torch.full(shape, 0.1), constraints.positive)
        pyro.sample(site, dist.Normal(loc, scale).to_event(len(shape)))
    for site, shape in (("fc2.weight", (3, 6)), ("fc2.bias", (3,))):
        loc = pyro.param(f"my/guide.{site}.loc", torch.zeros(shape))
        pyro.sample(site, dist.Normal(loc, 0.2).to_event(len(shape)))


def _data(n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 1).long()
    return x, y


def _trained(make_guide):
    x, y = _data()
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = Net()
    guide = make_guide(model) if make_guide is not None else _hand_guide
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    for _ in range(15):
        svi.step(x, y)
    return model, guide, x, y


GUIDES = [AutoNormal, AutoDiagonalNormal, AutoLowRankMultivariateNormal, AutoDelta, None]


@pytest.mark.parametrize("make_guide", GUIDES)
def test_predict_is_pyros_own_computation_draw_by_draw_and_leaves_the_store_alone(make_guide):
    model, guide, x, _ = _trained(make_guide)
    store = pyro.get_param_store()
    before = {name: value.detach().clone() for name, value in store.items()}
    # Predictive's draws as posterior_samples: its own logits, to the bit, draw by draw
    pyro.set_rng_seed(1)
    out = Predictive(model, guide=guide, num_samples=5, return_sites=[*SITES, "_RETURN"])(x)
    draws = {site: out[site] for site in SITES}
    given = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    torch.testing.assert_close(given.probs, out["_RETURN"].softmax(-1), rtol=0, atol=0)
    # the guide's draws under seed=: those of the guide traced by hand after set_rng_seed
    ours = pyrouq.predict(model, x, guide, num_samples=4, progress=False, seed=5)
    pyro.set_rng_seed(5)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(4)]
    reference = torch.stack(
        [
            poutine.condition(model, data={s: t.nodes[s]["value"] for s in SITES})(x).softmax(-1)
            for t in traces
        ]
    ).detach()
    torch.testing.assert_close(ours.probs, reference, rtol=0, atol=0)
    # larger than the training set: num_data made room for, and given back
    assert pyrouq.predict(model, torch.randn(90, 3), guide, 2, progress=False).probs.shape == (
        2,
        90,
        3,
    )
    assert model.num_data == 40
    # nothing of the user's store clobbered, nothing added by predict()
    assert set(store.keys()) == set(before)
    for name, value in before.items():
        assert torch.equal(store[name].detach(), value), name


def test_a_seeded_predict_repeats_and_keeps_the_users_streams():
    model, guide, x, _ = _trained(AutoNormal)
    pyro.set_rng_seed(3)
    torch_state = torch.get_rng_state()
    a = pyrouq.predict(model, x, guide, num_samples=3, progress=False, seed=11).probs
    assert torch.equal(torch.get_rng_state(), torch_state)
    torch.rand(7)  # whatever runs between two calls
    b = pyrouq.predict(model, x, guide, num_samples=3, progress=False, seed=11).probs
    assert torch.equal(a, b) and not torch.equal(a[0], a[1])


def test_the_log_likelihood_of_a_subsampling_function_model_is_unscaled_per_point():
    x, y = _data()

    def model(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3, 3]).to_event(2))
        b = pyro.sample("b", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        logits = x @ w + b
        with pyro.plate("data", 100, subsample_size=x.shape[0]):  # scale 100/40 in the ELBO
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    guide = AutoNormal(model)
    guide(x, y)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=4, seed=0)
    w = torch.as_tensor(idata.posterior["w"].values[0])
    b = torch.as_tensor(idata.posterior["b"].values[0])
    reference = torch.stack(
        [dist.Categorical(logits=x @ w[s] + b[s]).log_prob(y) for s in range(4)]
    )
    got = torch.as_tensor(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, reference.to(got.dtype), rtol=1e-5, atol=1e-5)


class Local(PyroModule):
    """Global weights and a per-input latent offset z."""

    def __init__(self):
        super().__init__()
        self.fc = PyroModule[torch.nn.Linear](3, 2)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([2]).to_event(1))

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", len(x)):
            z = pyro.sample("z", dist.Normal(0.0, 3.0))
            logits = logits + z[:, None] * torch.tensor([1.0, -1.0])
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_an_amortised_guides_per_input_draws_are_warned_of_not_silently_replaced():
    """The guide draws z from the inputs (q(z | x)); Predictive runs the model on them, and
    predict() draws z from the prior for each input: that difference is now told."""
    x, y = _data()
    pyro.clear_param_store()
    model = Local()
    encoder = torch.nn.Linear(3, 1)

    def guide(x, y=None):
        pyro.module("encoder", encoder)
        loc = pyro.param("w/loc", torch.zeros(2, 3))
        pyro.sample("fc.weight", dist.Normal(loc, 0.1).to_event(2))
        pyro.sample("fc.bias", dist.Normal(torch.zeros(2), 0.1).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("z", dist.Normal(5.0 * encoder(x).squeeze(-1), 0.01))

    with pytest.warns(UserWarning) as caught:
        pyrouq.predict(model, x, guide, num_samples=3, progress=False, seed=0)
    message = "\n".join(str(w.message) for w in caught)
    assert "the guide draws Local's latent site(s) ['z'], which hold a value per input" in message
    assert "the model draws ['z'] from its prior for each input" in message
    assert "use pyro.infer.Predictive(model, guide=guide, num_samples=S)" in message
    # global sites only: no warning
    weights_only = AutoNormal(poutine.block(model, hide=["z"]))
    weights_only(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pyrouq.predict(model, x, weights_only, num_samples=3, progress=False, seed=0)


def test_a_weight_conditioned_by_poutine_is_used_and_not_called_a_per_input_draw():
    """poutine.condition(bayesian(net), data={"2.weight": W, "2.bias": b}) with the model's
    guide: predict() runs the conditioned values (softmax(5, -5) for every input), but warned
    that the guide's draws of those sites 'hold a value per input' and that the model draws
    them from its prior, pointing to pyro.infer.Predictive, which would use the guide's."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = pyrouq.bayesian(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(),
                                                torch.nn.Linear(3, 2)))  # fmt: skip
    guide = pyrouq.mean_field_guide(model)
    bias = torch.tensor([5.0, -5.0])
    conditioned = poutine.condition(model, data={"2.weight": torch.zeros(2, 3), "2.bias": bias})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = pyrouq.predict(conditioned, torch.randn(4, 2), guide, num_samples=3).probs
    assert torch.allclose(probs, bias.softmax(-1).expand(3, 4, 2))
