"""Leftovers: a guide mismatch rebuilt from its message or pickled, a Gaussian noise floor too
small to score targets with, and load(module=<a builder>) of pyrouq's own models."""

import math
import pickle
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule

import pyrouq
from pyrouq.likelihoods import Gaussian

# --------------------------------------------------------------------------------------------
# A guide mismatch rebuilt from its message alone (Pyro's trace re-raise), or pickled
# (DataLoader workers): GuideMismatch(message, problem) needed both
# --------------------------------------------------------------------------------------------


class _Linear(PyroModule):
    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        with pyro.plate("data", x.shape[0]):
            logits = torch.stack([x @ w, -(x @ w)], -1)
            pyro.deterministic("logits", logits)
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def _mismatch() -> ValueError:
    draws = {"w": torch.zeros(2, 2)}  # w is (3,) in the model
    with pytest.raises(ValueError, match=r"site 'w' has shape \(2,\) there but \(3,\)") as info:
        pyrouq.predict(_Linear(), torch.randn(5, 3), posterior_samples=draws, progress=False)
    return info.value


def test_a_guide_mismatch_is_rebuilt_from_its_message_alone():
    err = _mismatch()
    again = type(err)(str(err))  # as Pyro's trace messenger re-raises it, shapes appended
    assert type(again) is type(err) and str(again) == str(err)
    assert again.problem == str(err)  # (no problem given: the message)


def test_a_guide_mismatch_pickles_with_its_problem():
    err = _mismatch()
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert back.problem == err.problem == "site 'w' has shape (2,) there but (3,) in the model"


# --------------------------------------------------------------------------------------------
# Gaussian: a floor float32 holds but whose gradient at the floor overflows it: it trains
# while the scales stay above it; at it, fit()'s "Non-finite loss" error names the floor
# --------------------------------------------------------------------------------------------


def _regression_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, generator=g)
    return x, x.sum(-1)


def _floored(min_scale: float):
    """A Bayesian regression network whose raw scale starts at -200: softplus underflows,
    every scale is the floor (as a network that learned to shrink them gets there)."""
    net = pyrouq.MLP(3, 8, 2)
    with torch.no_grad():
        last = list(net.parameters())[-1]  # the output layer's bias: (mean, raw scale)
        last[1] = -200.0
    return pyrouq.bayesian(net, likelihood=Gaussian("heteroscedastic", min_scale=min_scale))


def test_a_float32_floor_of_1e_30_trains_and_at_the_floor_fit_names_it():
    pyro.set_rng_seed(0)
    x, y = _regression_data()
    batches = [(x[:32], y[:32]), (x[32:], y[32:])]
    # scales above the floor (a plain MLP's start): it trains, as a floor of 1e-3 does
    model = pyrouq.bayesian(
        pyrouq.MLP(3, 8, 2), likelihood=Gaussian("heteroscedastic", min_scale=1e-30)
    )
    result = pyrouq.fit(
        model, pyrouq.mean_field_guide(model), batches, epochs=2, num_data=64, progress=False
    )
    assert math.isfinite(result.history[-1].loss)
    # every scale at the floor: fit() stops on the non-finite loss and names the floor
    pyro.set_rng_seed(0)
    model = _floored(1e-30)
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(FloatingPointError) as info:
        pyrouq.fit(model, guide, batches, epochs=2, num_data=64, progress=False)
    message = str(info.value)
    assert message.startswith("Non-finite loss")
    limit = torch.finfo(torch.float32).max ** (-1 / 3)
    assert f"Gaussian(min_scale=1e-30) is below {limit:.3g}" in message
    assert "1/min_scale**3" in message
    assert f"Raise min_scale to >= {limit:.3g} (1e-3 suggested)" in message
    assert "model.double()" in message
    # a floor of 1e-6 trains on the same data, its loss finite
    pyro.set_rng_seed(0)
    model = _floored(1e-6)
    result = pyrouq.fit(
        model, pyrouq.mean_field_guide(model), batches, epochs=2, num_data=64, progress=False
    )
    assert math.isfinite(result.history[-1].loss)


def test_the_limits_of_a_floor_and_of_a_fixed_noise_where_targets_are_scored():
    outputs = torch.tensor([[0.0, -200.0]])
    # a floor below 1.43e-13 is not refused: its NLL at the floor is finite (z**2 = 1e28)
    floor = Gaussian("heteroscedastic", min_scale=1e-14)
    assert math.isfinite(floor.nll(outputs, torch.ones(1)).item())
    # float64 holds 1e-30; predictions of a float32 floor of 1e-30 are fine
    het = Gaussian("heteroscedastic", min_scale=1e-30)
    assert math.isfinite(het.nll(outputs.double(), torch.ones(1, dtype=torch.float64)).item())
    assert het.predictive(outputs)[1].item() == pytest.approx(1e-30, rel=1e-6)
    # a fixed noise: the NLL's z**2 = 1/scale**2 (5.42e-20 in float32)
    fixed = torch.finfo(torch.float32).max ** (-1 / 2)
    with pytest.raises(ValueError, match=r"Gaussian\(scale=1e-25\) is too small to score") as info:
        Gaussian(1e-25).nll(torch.zeros(2, 1), torch.ones(2))
    assert f"for any scale below {fixed:.3g}" in str(info.value)
    assert math.isfinite(Gaussian(fixed * 1.01).nll(torch.zeros(2, 1), torch.ones(2)).item())


# --------------------------------------------------------------------------------------------
# load(path, module=<the function or class that builds pyrouq's model>)
# --------------------------------------------------------------------------------------------


def _make_model():
    return pyrouq.BayesianMLP(4, 8, 3)


def test_a_builder_given_for_a_front_door_is_named_as_one_and_left_out(tmp_path):
    model = _make_model()
    path = pyrouq.save(tmp_path / "m.pt", model, pyrouq.mean_field_guide(model))
    for builder, named in [(_make_model, "the function _make_model"),
                           (pyrouq.BayesianMLP, "the class BayesianMLP")]:  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            back = pyrouq.load(path, module=builder).model
        assert type(back) is pyrouq.BayesianMLP
        (warning,) = [w for w in caught if "is not used" in str(w.message)]
        message = str(warning.message)
        assert f"module= ({named}) is not used. Leave module= out for pyrouq's own " in message
        assert "skeleton (function)" not in message and "_PyroModuleMeta" not in message
        assert "the network itself (an nn.Module instance, e.g. module=make_net())" in message


def test_a_builder_of_a_network_made_from_pyrouqs_mlp_is_told_module_can_be_left_out(tmp_path):
    def make_net():
        return pyrouq.MLP(4, 8, 3)

    model = pyrouq.bayesian(make_net())
    path = pyrouq.save(tmp_path / "m.pt", model, pyrouq.mean_field_guide(model))
    with pytest.raises(pyrouq.CheckpointError) as info:
        pyrouq.load(path, module=make_net)
    message = str(info.value)
    assert "got the function make_net, which builds one, not the network itself" in message
    assert "which load() rebuilds when module= is left out (pyrouq's MLP)" in message
    assert type(pyrouq.load(path).model) is type(model)
