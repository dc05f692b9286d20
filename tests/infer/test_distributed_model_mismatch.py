"""Ranks whose models differ beyond their parameters, and the rank-1 local-reparameterisation
setter (eighth audit).

fit() on 2 processes (gloo, CPU) compared the ranks' parameters, loaders, arguments and
optimizers, but not what else defines the objective: ranks built with another likelihood scale,
prior family, ``local_reparameterization`` or guide trained a mix of their objectives without a
word. They are now refused on every rank, the error naming what differs; a rank whose model
pyrouq cannot describe still takes part (no hang), and ranks alike train as before.

``rank1(net, M)`` followed by ``model.local_reparameterization = True`` was taken, though the
constructor refuses local reparameterisation on a rank-1 network: the setter now refuses it
with the constructor's words; on plain ``bayesian()`` models it still sets the training path.
"""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq
from pyrouq import ArrayLoader, Gaussian, batchensemble, bayesian, fit, mean_field_guide, rank1

WORLD = 2
N = 16
FIX = (
    "Build the same model and guide on every rank (the same likelihood, priors, "
    "local_reparameterization, network and guide): the ranks average their gradients into one "
    "model, and ranks whose objectives differ would train a mix of them without a word."
)


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, generator=g), torch.randn(N, generator=g)


class _OwnGaussian(Gaussian):
    """A likelihood of one's own (a subclass): pyrouq cannot describe a model holding it."""


class _OwnRegression(pyro.nn.PyroModule):
    """A Pyro model of one's own, which pyrouq cannot describe."""

    def __init__(self):
        super().__init__()
        self.linear = pyro.nn.PyroModule[nn.Linear](3, 1)
        self.linear.weight = pyro.nn.PyroSample(
            pyro.distributions.Normal(0.0, 1.0).expand([1, 3]).to_event(2)
        )

    def forward(self, x, y=None):
        mean = self.linear(x).squeeze(-1)
        with pyro.plate("data", self.num_data, subsample_size=len(x)):
            pyro.sample("obs", pyro.distributions.Normal(mean, 1.0), obs=y)


def _function_guide(family):
    """A guide written as a function: one pyro.param per site, alike on every rank."""

    def guide(x=None, y=None):
        for site, shape in (("weight", (1, 3)), ("bias", (1,))):
            loc = pyro.param(f"loc_{site}", torch.zeros(shape))
            pyro.sample(site, family(loc, 0.1).to_event(len(shape)))

    guide.__qualname__ = f"guide_{family.__name__}"
    return guide


def _model(scale=1.0, local=False, likelihood=Gaussian, prior=None):
    torch.manual_seed(0)  # the same initial parameters on every rank
    kwargs = {} if prior is None else {"prior": prior}
    return bayesian(nn.Linear(3, 1), likelihood=likelihood(scale),
                    local_reparameterization=local, **kwargs)  # fmt: skip


def _state(model, guide):
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    if isinstance(guide, nn.Module):
        state.update({f"guide.{k}": v.detach().clone() for k, v in guide.state_dict().items()})
    return state


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    outcomes: dict = {}
    try:
        x, y = _data()
        normal, laplace = pyro.distributions.Normal(0.0, 1.0), pyro.distributions.Laplace(0.0, 1.0)
        attempts = {
            "scale": lambda: _model(scale=(1.0, 2.0)[rank]),
            "local": lambda: _model(local=bool(rank)),
            "both": lambda: _model(scale=(1.0, 2.0)[rank], local=bool(rank)),
            "prior": lambda: _model(prior=(normal, laplace)[rank]),  # parameters alike
            "own likelihood on rank 1": lambda: _model(likelihood=(Gaussian, _OwnGaussian)[rank]),
            "alike": lambda: _model(),
        }
        for name, build in attempts.items():
            pyro.clear_param_store()
            model = build()
            guide = mean_field_guide(model)
            try:
                fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=2, progress=False, seed=0)
                outcomes[name] = "trained"
                outcomes[f"{name} state"] = _state(model, guide)
            except ValueError as err:
                outcomes[name] = str(err)
        # guides written as functions whose parameters are alike, but not the family they draw
        pyro.clear_param_store()
        model = _model()
        guide = _function_guide((pyro.distributions.Normal, pyro.distributions.Laplace)[rank])
        try:
            fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False, seed=0)
            outcomes["guide"] = "trained"
        except ValueError as err:
            outcomes["guide"] = str(err)
        # a Pyro model of one's own on every rank (not described: its kind compared) trains
        pyro.clear_param_store()
        torch.manual_seed(0)
        own = _OwnRegression()
        try:
            fit(own, AutoNormal(own), ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False,
                seed=0)  # fmt: skip
            outcomes["own model"] = "trained"
        except ValueError as err:
            outcomes["own model"] = str(err)
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_ranks_whose_models_differ_are_refused_on_every_rank(tmp_path):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    gaussian = '{"min_scale": 0.001, "name": "gaussian", "scale": %s}'
    for r in ranks:  # the same refusal on both ranks (trained silently before)
        assert r["scale"] == (
            "fit(): the ranks' models differ in their likelihood: likelihood: "
            f"{gaussian % '1.0'} on rank 0 vs {gaussian % '2.0'} on rank 1. {FIX}"
        ), r["scale"]
        assert r["local"] == (
            "fit(): the ranks' models differ in their local_reparameterization: "
            f"local_reparameterization: false on rank 0 vs true on rank 1. {FIX}"
        ), r["local"]
        assert r["both"].startswith(
            "fit(): the ranks' models differ in their likelihood, local_reparameterization: "
            f"likelihood: {gaussian % '1.0'} on rank 0 vs {gaussian % '2.0'} on rank 1; "
            "local_reparameterization: false on rank 0 vs true on rank 1. "
        ), r["both"]
        assert r["prior"].startswith("fit(): the ranks' models differ in their priors: "), r[
            "prior"
        ]
        assert '"family": "Normal"' in r["prior"] and '"family": "Laplace"' in r["prior"]
        # rank 1 cannot describe its model: it still takes part, and the error names it
        own = r["own likelihood on rank 1"]
        assert own.startswith(
            "fit(): the ranks' models differ in their likelihood, module, priors, sites: "
            f"likelihood: {gaussian % '1.0'} on rank 0 vs "
            '"test_distributed_model_mismatch._OwnGaussian" on rank 1; module: {"buffers": {}, '
        ), own
        assert "on rank 0 vs (not described) on rank 1; ... (1 more)." in own, own
        assert own.endswith(FIX)
        assert r["guide"].startswith(
            "fit(): the ranks' models differ in their guide: guide: "
            '"test_distributed_model_mismatch.guide_Normal" on rank 0 vs '
            '"test_distributed_model_mismatch.guide_Laplace" on rank 1.'
        ), r["guide"]
        assert r["alike"] == "trained"
        assert r["own model"] == "trained"
    moved = False
    start = _state(_model(), None)
    for key, value in ranks[0]["alike state"].items():  # ranks alike stay alike, bit for bit
        assert torch.equal(value, ranks[1]["alike state"][key]), key
        moved |= key in start and not torch.equal(value, start[key])
    assert moved or any(k.startswith("guide.") for k in ranks[0]["alike state"])


# ---------------------------------------------------------------------------------------------
# The local_reparameterization setter
# ---------------------------------------------------------------------------------------------


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))


def test_the_setter_refuses_local_reparameterization_on_a_rank1_network():
    with pytest.raises(ValueError) as built:
        bayesian(batchensemble(_net(), 2), local_reparameterization=True)
    model = rank1(_net(), 2)
    with pytest.raises(ValueError) as set_:
        model.local_reparameterization = True
    assert (
        str(set_.value)
        == str(built.value)
        == (
            "local_reparameterization applies to nn.Linear / convolution layers with latent "
            "weights; a BatchEnsemble's layers draw their rank-1 factors instead. Leave "
            "local_reparameterization=False."
        )
    )
    assert model.local_reparameterization is False  # unchanged by the refusal
    model.local_reparameterization = False  # (allowed: what it is)
    x, y = torch.randn(8, 3), torch.arange(8) % 3
    result = fit(model, mean_field_guide(model), [(x, y)], epochs=1, num_data=8, progress=False)
    assert len(result.history) == 1


def _trained(model):
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
    y = torch.arange(16) % 3
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=2, progress=False, seed=0)
    return {k: v.detach().clone() for k, v in guide.state_dict().items()}


@pytest.mark.parametrize("value", [True, False])
def test_the_setter_sets_the_training_path_of_a_bayesian_network(value):
    model = bayesian(_net(), local_reparameterization=not value)
    model.local_reparameterization = value
    assert model.local_reparameterization is value
    set_ = _trained(model)
    built = _trained(bayesian(_net(), local_reparameterization=value))
    other = _trained(bayesian(_net(), local_reparameterization=not value))
    for key, tensor in built.items():  # trained as a model built with it, bit for bit
        assert torch.equal(set_[key], tensor), key
    assert any(not torch.equal(set_[k], other[k]) for k in built)  # the other path differs


def test_the_setter_keeps_a_front_doors_description_true(tmp_path):
    model = pyrouq.BayesianMLP(in_features=3, hidden_features=8, out_features=3)
    model.local_reparameterization = True
    pyrouq.save(tmp_path / "m.pt", model, mean_field_guide(model))
    assert pyrouq.load(tmp_path / "m.pt").model.local_reparameterization is True
    with pytest.raises(TypeError, match="Expected local_reparameterization to be True or Fa"):
        model.local_reparameterization = "yes"
    assert model.local_reparameterization is True
