"""Eleventh audit: pyrouq's models and guides in a Pyro user's script. fit() is Pyro's own
SVI loop (TraceMeanField_ELBO, pyro.optim.Adam) step for step; a model's minibatch scaling is
what a subsampling ``pyro.plate`` gives; and a ``copy.deepcopy`` of a model is a model of its
own in Pyro's param store (it used to share the original's name there: a saved store held one
of the two, loading it gave both the same point estimates, and a ``PyroParam`` of the network
became one tensor for both)."""

from __future__ import annotations

import copy
import gc

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, toy_data
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.nn import PyroModule, PyroParam
from torch import nn
from torch.distributions import constraints

import pyrouq

N = 40


def _net(out=2):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, out))


def _build(kind):
    """A model with point estimates in its network, and its guide (None: a BatchEnsemble)."""
    if kind == "batchensemble":
        model = pyrouq.batchensemble(_net(), 2)
        model.num_data = N
        return model, None
    if kind == "rank1":
        model = pyrouq.rank1(_net(), 2, num_data=N)
    else:
        model = pyrouq.bayesian(_net(), select="last_layer", num_data=N)
    return model, pyrouq.mean_field_guide(model, init_scale=0.05)


def _state(*modules):
    return {
        f"{i}.{k}": v.detach().clone()
        for i, m in enumerate(modules)
        if m is not None
        for k, v in m.state_dict().items()
    }


def _probs(model, guide, x):
    draws = None if guide is None else 3
    return pyrouq.predict(model, x, guide, num_samples=draws, seed=0, progress=False).probs


# --------------------------------------------------------------------------------------------
# fit() and Pyro's own loop
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bayesian", "rank1", "batchensemble"])
def test_fit_is_pyros_svi_loop_with_adam_step_for_step(kind):
    """fit(seed, lr_schedule="constant", kl_weight=1) trains what Pyro's SVI with
    pyro.optim.Adam of the same lr and TraceMeanField_ELBO (Trace_ELBO: no latent sites)
    trains after pyro.set_rng_seed(seed), to float rounding (fit's fused Adam). (A guide
    started at a prior's scale would not do: there the KL's gradient is 0 up to rounding,
    which the two ELBOs round apart, and Adam's first step is lr * sign(g) for any g.)"""
    x, y = toy_data(N)
    states = []
    for route in ("fit", "svi"):
        pyro.clear_param_store()
        model, guide = _build(kind)
        loader = ListLoader(x, y, 20)
        if route == "fit":
            options = {} if guide is None else {"kl_weight": 1.0}
            pyrouq.fit(model, guide, loader, epochs=2, lr=0.05, lr_schedule="constant",
                       seed=3, progress=False, **options)  # fmt: skip
        else:
            pyro.set_rng_seed(3)
            loss = Trace_ELBO() if guide is None else TraceMeanField_ELBO()
            svi = SVI(model, guide or (lambda x, y=None: None), pyro.optim.Adam({"lr": 0.05}), loss)
            for _ in range(2):
                for xb, yb in loader:
                    svi.step(xb, yb)
        states.append(_state(model, guide))
    ours, theirs = states
    assert ours.keys() == theirs.keys()
    start = _state(*_build(kind))
    for key, value in theirs.items():
        torch.testing.assert_close(ours[key], value, atol=2e-6, rtol=1e-5)
    assert sum(not torch.allclose(theirs[k], start[k]) for k in start) >= 4  # (trained)


def test_the_minibatch_scale_is_a_subsampling_plates():
    """The model's "obs" under fixed weights scores what Pyro's idiom scores, a hand-written
    model observing inside pyro.plate("data", N, subsample_size=B): N/B times the batch's
    log-likelihood (none at B = N)."""
    x, y = toy_data(N)
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(3, 2), num_data=N)

    def by_hand(xb, yb=None):
        w = pyro.sample("weight", dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
        b = pyro.sample("bias", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pyro.plate("data", N, subsample_size=len(xb)):
            pyro.sample("obs", dist.Categorical(logits=xb @ w.T + b), obs=yb)

    weights = {"weight": torch.randn(2, 3), "bias": torch.randn(2)}
    for size in (10, N):
        scores = []
        for f in (model, by_hand):
            trace = poutine.trace(poutine.condition(f, data=weights)).get_trace(x[:size], y[:size])
            trace.compute_log_prob()
            scores.append(trace.nodes["obs"]["log_prob_sum"].item())
            assert trace.nodes["obs"]["scale"] == pytest.approx(N / size)
        assert scores[0] == pytest.approx(scores[1], rel=1e-6)


# --------------------------------------------------------------------------------------------
# copy.deepcopy: a model of its own in Pyro's param store
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bayesian", "rank1", "batchensemble"])
def test_a_deep_copy_keeps_its_point_estimates_under_a_name_of_its_own(kind, tmp_path):
    """Two fits, the original and its deep copy: the param store holds both models' point
    estimates (each the model's own tensor), a store saved and loaded gives each model its
    own values back (not both the copy's), and a copy garbage-collected takes its entries."""
    x, y = toy_data(N)
    original, guide = _build(kind)
    pyrouq.fit(original, guide, ListLoader(x, y, 20), epochs=1, seed=0, progress=False)
    copied, copied_guide = copy.deepcopy(original), copy.deepcopy(guide)
    pyrouq.fit(copied, copied_guide, ListLoader(x, y, 20), epochs=2, lr=0.1, seed=1,
               progress=False)  # fmt: skip
    store = pyro.get_param_store()
    keys = [k for k in store.keys() if k.endswith("net$$$0.weight")]
    assert len(keys) == 2
    assert {id(store[k]) for k in keys} == {id(original.net[0].weight), id(copied.net[0].weight)}

    saved = [_probs(original, guide, x), _probs(copied, copied_guide, x)]
    assert not torch.allclose(saved[0], saved[1], atol=1e-4)  # (two fits: two models)
    path = str(tmp_path / "store.pt")
    store.save(path)
    with torch.no_grad():
        for p in [*original.net.parameters(), *copied.net.parameters()]:
            p.add_(0.5)
    store.load(path)
    torch.testing.assert_close(_probs(original, guide, x), saved[0])
    torch.testing.assert_close(_probs(copied, copied_guide, x), saved[1])

    del copied, copied_guide, p
    gc.collect()
    names = [k for k in store.keys() if "net$$$" in k]
    own = {id(p) for p in original.parameters()}
    assert names and all(id(store[k]) in own for k in names)


class _Tempered(PyroModule):
    """A network that is a PyroModule with a PyroParam: logits over a learned temperature."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.t = PyroParam(torch.tensor(1.0), constraints.positive)

    def forward(self, x):
        return self.fc(x) / self.t


def test_fitting_a_deep_copy_leaves_the_originals_pyro_param_alone():
    """The copy's PyroParam is its own: training it moves the copy's temperature, and the
    original predicts as before (it used to take the copy's trained value, one tensor for
    both, from the param store entry the two shared)."""
    x, y = toy_data(N)
    torch.manual_seed(0)
    original = pyrouq.bayesian(_Tempered(), select=["fc.weight"], num_data=N)
    guide = pyrouq.mean_field_guide(original, init_scale=0.1)
    before = _probs(original, guide, x)
    copied = copy.deepcopy(original)
    pyrouq.fit(copied, copy.deepcopy(guide), ListLoader(x, y, 20), epochs=3, lr=0.2, seed=0,
               progress=False)  # fmt: skip
    copied(x[:2], y[:2])  # (the trained value, read as Pyro reads it)
    assert abs(copied.net.t.item() - 1.0) > 0.05
    torch.testing.assert_close(_probs(original, guide, x), before)
    original(x[:2], y[:2])
    assert original.net.t.item() == pytest.approx(1.0)
