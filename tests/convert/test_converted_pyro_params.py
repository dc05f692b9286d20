"""A parameter a converted network creates with ``pyro.param`` in its forward: fit() trains it
as Pyro's SVI does (step for step, against SVI with the same SGD), predict() reads the trained
value, and save() / fit(checkpoint=...) refuse the model (a file holds no param store) rather
than lose it; a ``PyroParam`` attribute of a PyroModule inside the network is trained and
saved."""

from __future__ import annotations

import pyro
import pytest
import torch
from _toy import ListLoader, toy_data
from pyro.infer import SVI, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroParam
from torch import nn
from torch.distributions import constraints

import pyrouq

N = 40
LR = 0.002


class TemperedNet(nn.Module):
    """Logits divided by a positive temperature created with pyro.param."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        t = pyro.param("temperature", torch.tensor(1.0), constraint=constraints.positive)
        return self.fc(x) / t


class TemperedPyroNet(TemperedNet, PyroModule):
    """The reviewer's form: the network itself a PyroModule calling pyro.param."""


class Scale(PyroModule):
    def __init__(self):
        super().__init__()
        self.t = PyroParam(torch.tensor(1.0), constraints.positive)

    def forward(self, h):
        return h / self.t


class ScaledNet(nn.Module):
    """The temperature a PyroParam attribute of a PyroModule inside the network."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.scale = Scale()

    def forward(self, x):
        return self.scale(self.fc(x))


def _build(kind, cls=TemperedNet):
    torch.manual_seed(0)
    net = cls()
    if kind == "bayesian":
        model = pyrouq.bayesian(net)
    elif kind == "batchensemble":
        return pyrouq.batchensemble(net, 2), None
    else:
        model = pyrouq.rank1(net, 2)
    return model, pyrouq.mean_field_guide(model, init_scale=0.05)


def _svi_value(kind, cls, read):
    """The parameter after 2 epochs of Pyro's SVI (SGD, the exact ELBO) on batches of 20."""
    pyro.clear_param_store()
    model, guide = _build(kind, cls)
    model.num_data = N
    x, y = toy_data(N)
    loss = TraceMeanField_ELBO() if guide is not None else Trace_ELBO()
    svi = SVI(model, guide or (lambda x, y: None), pyro.optim.SGD({"lr": LR}), loss)
    pyro.set_rng_seed(3)
    for _ in range(2):
        for i in range(0, N, 20):
            svi.step(x[i : i + 20], y[i : i + 20])
    return read(model)


def _fit(model, guide, **kw):
    x, y = toy_data(N)
    options = dict(lr_schedule="constant", seed=3, progress=False)
    if guide is not None:
        options["kl_weight"] = 1.0
    return pyrouq.fit(
        model,
        guide,
        ListLoader(x, y, 20),
        epochs=2,
        optim=lambda p: torch.optim.SGD(p, lr=LR),
        **options,
        **kw,
    )


def _temperature(model):
    return pyro.param("temperature").item()


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("bayesian", TemperedNet),
        ("bayesian", TemperedPyroNet),
        ("batchensemble", TemperedNet),
        ("rank1", TemperedNet),
    ],
)
def test_fit_trains_a_pyro_param_of_the_network_as_pyros_svi_does(kind, cls):
    reference = _svi_value(kind, cls, _temperature)
    assert abs(reference - 1.0) > 0.05  # SVI moves it
    pyro.clear_param_store()
    model, guide = _build(kind, cls)
    _fit(model, guide)
    assert _temperature(model) == pytest.approx(reference, abs=1e-6)


def test_fit_trains_it_when_the_model_states_its_number_of_classes():
    """(fit() then needs no look at the outputs to count the classes.)"""
    reference = _svi_value("bayesian", TemperedNet, _temperature)
    pyro.clear_param_store()
    model, guide = _build("bayesian")
    model.num_classes = 2
    _fit(model, guide)
    assert _temperature(model) == pytest.approx(reference, abs=1e-6)


def test_a_pyroparam_attribute_is_trained_as_svi_does_and_saved(tmp_path):
    reference = _svi_value("bayesian", ScaledNet, lambda m: m.net.scale.t.item())
    assert abs(reference - 1.0) > 0.05
    pyro.clear_param_store()
    model, guide = _build("bayesian", ScaledNet)
    _fit(model, guide)
    assert model.net.scale.t.item() == pytest.approx(reference, abs=1e-6)
    path = pyrouq.save(tmp_path / "scaled.pt", model, guide)
    pyro.clear_param_store()
    loaded = pyrouq.load(path, module=ScaledNet())
    assert loaded.model.net.scale.t.item() == pytest.approx(reference, abs=1e-6)


def test_predict_reads_the_trained_value():
    """The members' log-odds are (l1 - l0) / t: times the trained t, those at t = 1."""
    model, _ = _build("batchensemble")
    _fit(model, None)
    trained = _temperature(model)
    assert abs(trained - 1.0) > 0.05
    x, _ = toy_data(N)
    probs = pyrouq.predict(model, x, progress=False).probs
    pyro.get_param_store()["temperature"] = torch.tensor(1.0)
    plain = pyrouq.predict(model, x, progress=False).probs

    def log_odds(p):
        return (p[..., 1] / p[..., 0]).log()

    torch.testing.assert_close(log_odds(probs) * trained, log_odds(plain), atol=1e-4, rtol=1e-4)


def test_save_refuses_a_network_pyro_param_naming_it_and_the_way_out(tmp_path):
    model, guide = _build("bayesian")
    _fit(model, guide)
    with pytest.raises(pyrouq.CheckpointError) as err:
        pyrouq.save(tmp_path / "model.pt", model, guide)
    message = str(err.value)
    assert (
        "save() cannot store the parameter(s) 'temperature' that the network of "
        "BayesianNetwork creates with pyro.param in its forward (fit() trains them)"
    ) in message
    assert "Make each an nn.Parameter of its module" in message
    assert not (tmp_path / "model.pt").exists()


def test_fit_with_a_checkpoint_refuses_it_before_training(tmp_path):
    model, guide = _build("bayesian")
    path = tmp_path / "run.pt"
    with pytest.raises(pyrouq.CheckpointError) as err:
        _fit(model, guide, checkpoint=path)
    assert str(err.value).startswith(
        "fit(checkpoint=...) saves with pyrouq.save(), which refuses this run: save() cannot "
        "store the parameter(s) 'temperature'"
    )
    assert str(err.value).endswith("Or leave checkpoint= out.")
    assert _temperature(model) == 1.0  # nothing trained
    assert not path.exists()


def test_fit_trains_it_beside_an_autoguides_parameters():
    """With Pyro's AutoNormal (its parameters made on fit()'s first look at the data). Its
    draws come in another order than under SVI: at a guide scale of 1e-5 they move the
    result by ~1e-6, against a move of ~1e-2."""
    values = []
    for run in ("svi", "fit"):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = pyrouq.bayesian(TemperedNet())
        guide = AutoNormal(model, init_scale=1e-5)
        if run == "fit":
            _fit(model, guide)
        else:
            model.num_data = N
            x, y = toy_data(N)
            svi = SVI(model, guide, pyro.optim.SGD({"lr": LR}), TraceMeanField_ELBO())
            pyro.set_rng_seed(3)
            for _ in range(2):
                for i in range(0, N, 20):
                    svi.step(x[i : i + 20], y[i : i + 20])
        values.append(_temperature(model))
    reference, trained = values
    assert abs(reference - 1.0) > 5e-3
    assert trained == pytest.approx(reference, abs=1e-5)
