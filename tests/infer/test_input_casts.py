"""Whose dtype fit() casts a batch's inputs to, and what it says where they cannot be cast.

A Pyro model of one's own that holds a float32 parameter of its own (an ``nn.Linear``) and draws
a latent site from a float64 prior fails in torch on any inputs: fit() casts them to the
model's float32 whatever they came as. fit() told such a model's user that "train_loader's
inputs are torch.float32" (also of float64 inputs) and to "Serve the inputs in torch.float64",
which changes nothing: its words are for a model and guide without parameters, whose inputs are
not cast. Torch's own error comes through again. And the inputs are cast to the model's dtype at
every step, as before, the model's dtype read once a step (not twice)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import sampled_linear, tiny_mlp, toy_data
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule

import pyrouq


class _OwnLinearFloat64Prior(PyroModule):
    """A float32 ``nn.Linear`` of its own, then a latent float64 (3, 2) matrix."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x, y=None):
        prior = dist.Normal(torch.zeros(3, 2, dtype=torch.float64), 1.0).to_event(2)
        logits = self.fc(x) @ pyro.sample("w", prior)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_model_with_parameters_of_its_own_is_not_told_to_serve_its_priors_dtype(dtype):
    x, y = toy_data(8)
    pyro.clear_param_store()
    model = _OwnLinearFloat64Prior()
    with pytest.raises(TypeError) as info:
        pyrouq.fit(model, AutoNormal(model), [(x.to(dtype), y)], epochs=1, num_data=8,
                   progress=False)  # fmt: skip
    message = str(info.value)
    assert "its priors draw its latent sites ('w') in torch.float64" in message
    assert "(RuntimeError: expected m1 and m2 to have the same dtype" in message
    assert "Serve the inputs" not in message


class _Float32Priors(PyroModule):
    """A latent first layer drawn from priors of Python numbers (float32) and a head of its own:
    ``model.double()`` converts the head, not the priors."""

    def __init__(self):
        super().__init__()
        self.fc = sampled_linear(3, 4, bias_scale=1.0)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x, y=None):
        logits = self.head(torch.tanh(self.fc(x)))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_a_model_converted_by_to_is_told_its_priors_stay_in_their_dtype():
    """model.double() leaves a PyroSample's float32 prior as it is: predict() told the user to
    give the model one dtype, model.to(torch.float64), which it had (and fit() gave torch's
    words alone). Both now name the priors' dtype; the fix they give works."""
    x, y = toy_data(8)
    pyro.clear_param_store()
    model = _Float32Priors().double()
    said = r"its priors draw its latent sites \('fc.weight', 'fc.bias'\) in torch.float32"
    with pytest.raises(TypeError, match=said) as info:
        pyrouq.fit(model, AutoNormal(model), [(x.double(), y)], epochs=1, num_data=8,
                   progress=False)  # fmt: skip
    assert "parameters are torch.float64" in str(info.value)
    assert "model.to(torch.float32)" in str(info.value)
    with pytest.raises(TypeError, match=said):
        pyrouq.predict(model, x.double(), num_samples=2)
    model.to(torch.float32)  # (as told)
    result = pyrouq.fit(model, AutoNormal(model), [(x.double(), y)], epochs=1, num_data=8,
                        progress=False)  # fmt: skip
    assert len(result.history) == 1


def test_a_model_converted_after_fitting_is_told_its_guide_draws_in_the_old_dtype():
    x, y = toy_data(8)
    pyro.clear_param_store()
    model = _Float32Priors()
    guide = AutoNormal(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False)
    model.double()
    said = r"its guide draws its latent sites \('fc.weight', 'fc.bias'\) in torch.float32"
    with pytest.raises(TypeError, match=said):
        pyrouq.predict(model, x.double(), guide=guide, num_samples=2)
    with pytest.raises(TypeError, match=said):
        pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False)
    model.to(torch.float32)  # (as told)
    assert pyrouq.predict(model, x.double(), guide=guide, num_samples=2).probs.shape == (2, 8, 2)


def test_float64_inputs_of_a_converted_model_train_as_their_float32_values_at_every_step():
    x, y = toy_data(12)
    runs = []
    for inputs in (x, x.double()):
        pyro.clear_param_store()
        torch.manual_seed(0)
        model = tiny_mlp()
        guide = pyrouq.mean_field_guide(model)
        batches = [(inputs[:4], y[:4]), (inputs[4:8], y[4:8]), (inputs[8:], y[8:])]
        result = pyrouq.fit(model, guide, batches, epochs=2, num_data=12, progress=False, seed=0)
        runs.append(([r.loss for r in result.history], [p.detach() for p in guide.parameters()]))
    assert runs[1][0] == runs[0][0]
    for got, expected in zip(runs[1][1], runs[0][1], strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_converted_model_cast_after_its_autoguide_was_fitted_is_told_the_guides_dtype():
    """A converted model's priors move with model.double(), an AutoNormal fitted before does
    not: predict() told the user to give the model one dtype, model.to(torch.float64), which it
    had, and fit() failed at its first step in torch's words alone."""
    x, y = toy_data(8)
    pyro.clear_param_store()
    model = pyrouq.bayesian(torch.nn.Linear(3, 2), num_data=8)
    guide = AutoNormal(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, progress=False)
    model.double()
    said = r"its guide draws its latent sites \('weight', 'bias'\) in torch.float32"
    with pytest.raises(TypeError, match=said):
        pyrouq.predict(model, x, guide=guide, num_samples=2)
    with pytest.raises(TypeError, match=said + r".*model.to\(torch.float32\)\). Nothing was"):
        pyrouq.fit(model, guide, [(x, y)], epochs=1, progress=False)
    model.to(torch.float32)  # (as told)
    assert pyrouq.predict(model, x, guide=guide, num_samples=2).probs.shape == (2, 8, 2)


class _AllDrawn(PyroModule):
    """A Pyro model whose one layer is drawn whole (PyroSample weight and bias): no floating
    parameter of its own; it counts its runs."""

    def __init__(self):
        super().__init__()
        self.fc = sampled_linear(3, 2, bias_scale=1.0)
        self.runs = 0

    def forward(self, x, y=None):
        self.runs += 1
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_the_guides_dtype_check_makes_no_pass_for_a_model_without_parameters():
    """fit()'s look at the first batch replays the model on its guide's draws where the guide
    holds parameters of another dtype than the model's (refuse_guide_of_another_dtype, said
    to make no extra pass otherwise); a model without floating parameters has no dtype, None,
    which no guide's equals: the pass ran at every fit() of such a model (Pyro's Bayesian
    regression), where there is nothing to tell. It makes none now; fit() trains it."""
    from pyrouq._input_cast import refuse_guide_of_another_dtype

    x, y = toy_data(8)
    pyro.clear_param_store()
    model = _AllDrawn()
    guide = AutoNormal(model)
    guide(x, y)  # (built: its parameters float32)
    before = model.runs
    refuse_guide_of_another_dtype(model, guide, x, y)
    assert model.runs == before
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False)
