"""Refusals in pyrouq's words: predict() on a Pyro model of the user's own whose data plate,
of a size written into the model, is smaller than a batch of inputs (Pyro's "subsample_size
does not match len(subsample)" came raw); the plain networks' refusal of an input that is not
a tensor; fit() on 2 processes (gloo, CPU) telling a checkpoint saved before the first step
as such (it was "the end of epoch 0")."""

from __future__ import annotations

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.distributed as dist_
from _processes import exit_quietly, spawn_ranks
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq
from pyrouq import ArrayLoader, TrainingInterrupted, bayesian, fit, mean_field_guide

# --------------------------------------------------------------------------------------------
# predict(): a plate of a literal size, smaller than the batch
# --------------------------------------------------------------------------------------------


def hundred_plate(x, y=None):
    """A model function whose data plate holds 100 examples, written into it."""
    w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
    logits = pyro.deterministic("logits", x @ w)
    with pyro.plate("data", 100, subsample_size=len(x)):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def _fitted_guide():
    guide = AutoNormal(hundred_plate)
    guide(torch.randn(50, 3), torch.zeros(50, dtype=torch.long))
    return guide


_PLATE_WORDS = (
    'predict(): hundred_plate\'s plate "data" has size 100, and predict() ran a batch of 150 '
    "inputs, more than the plate holds (Pyro: subsample_size does not match len(subsample), "
    "150 vs 100). Pass predict(..., batch_size=100) or less, or give the plate the data set's "
    'size through an attribute num_data, pyro.plate("data", hundred_plate.num_data, '
    "subsample_size=len(x)), which predict() raises for its batches"
)


def _pyro_cause(err: BaseException) -> BaseException | None:
    seen = err.__cause__
    while seen is not None and "subsample_size does not match" not in str(seen):
        seen = seen.__cause__
    return seen


@pytest.mark.parametrize("drawn", ["guide", "prior"])
def test_predict_tells_a_batch_larger_than_a_literal_plate_in_house_words(drawn):
    # (it was Pyro's raw "subsample_size does not match len(subsample), 150 vs 100")
    guide = _fitted_guide() if drawn == "guide" else None
    with pytest.raises(ValueError) as refused:
        pyrouq.predict(hundred_plate, torch.randn(150, 3), guide, num_samples=3, progress=False)
    assert str(refused.value).startswith(_PLATE_WORDS), str(refused.value)
    cause = _pyro_cause(refused.value)
    assert cause is not None and "150 vs 100" in str(cause)


def test_predict_runs_such_a_model_at_the_batch_size_it_names():
    out = pyrouq.predict(
        hundred_plate, torch.randn(150, 3), _fitted_guide(), 3, batch_size=100, progress=False
    )
    assert out.probs.shape == (3, 150, 2)


def test_a_model_under_pyros_handlers_is_told_and_given_room_as_itself():
    # poutine.condition(model, data=...) is a partial of Pyro's: the advice wrote its name into
    # code, pyro.plate("data", hundred_plate (under poutine.condition).num_data, ...), and a
    # module's num_data, which predict() raises for a larger batch, was not raised through it
    wrapped = pyro.poutine.condition(hundred_plate, data={})
    with pytest.raises(ValueError) as refused:
        pyrouq.predict(wrapped, torch.randn(150, 3), num_samples=2, progress=False)
    message = str(refused.value)
    assert message.startswith("predict(): hundred_plate (under poutine.condition)'s plate ")
    assert 'pyro.plate("data", hundred_plate.num_data, subsample_size=len(x))' in message

    class Plated(pyro.nn.PyroModule):
        def __init__(self):
            super().__init__()
            self.num_data = 100

        def forward(self, x, y=None):
            w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
            logits = pyro.deterministic("logits", x @ w)
            with pyro.plate("data", self.num_data, subsample_size=len(x)):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    model = Plated()
    wrapped = pyro.poutine.condition(model, data={"w": torch.ones(3, 2)})
    out = pyrouq.predict(wrapped, torch.randn(150, 3), num_samples=2, progress=False)
    assert out.probs.shape == (2, 150, 2) and model.num_data == 100


def test_predict_leaves_pyros_other_subsample_refusals_as_they_came():
    def own_subsample(x, y=None):  # a subsample of 5 where 7 are asked: not predict()'s batch
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        with pyro.plate("data", 100, subsample_size=7, subsample=torch.arange(5)):
            pass
        return pyro.deterministic("logits", x @ w)

    with pytest.raises(ValueError) as refused:
        pyrouq.predict(own_subsample, torch.randn(150, 3), num_samples=2, progress=False)
    assert str(refused.value).startswith("subsample_size does not match len(subsample), 7 vs 5."), (
        str(refused.value)
    )


# --------------------------------------------------------------------------------------------
# the plain networks: an input that is not a tensor
# --------------------------------------------------------------------------------------------

_NOT_A_TENSOR = {
    "dict": "expects a torch.Tensor input, got dict: pyrouq runs networks of one tensor input",
    "None": (
        "expects a torch.Tensor input, got NoneType: pass the batch of inputs, one tensor of "
        "shape (B, ...), not None."
    ),
    "array": "expects a torch.Tensor input, got ndarray; convert it with torch.as_tensor(x).",
}
_INPUTS = {"dict": {"x": torch.zeros(2, 784)}, "None": None, "array": np.zeros((2, 784))}


@pytest.mark.parametrize("kind", sorted(_INPUTS))
@pytest.mark.parametrize(
    "build",
    [
        pyrouq.MLP,
        pyrouq.LeNet,
        lambda: pyrouq.BayesianMLP(num_data=10),
        lambda: pyrouq.BatchEnsembleLeNet(num_members=2),
    ],
    ids=["MLP", "LeNet", "BayesianMLP", "BatchEnsembleLeNet"],
)
def test_the_networks_refuse_an_input_that_is_not_a_tensor_saying_what_to_do(build, kind):
    net = build()
    with pytest.raises(TypeError) as refused:
        net(_INPUTS[kind])
    assert str(refused.value).startswith(f"{type(net).__name__} {_NOT_A_TENSOR[kind]}")


@pytest.mark.parametrize("kind", sorted(_INPUTS))
def test_the_networks_shape_checks_speak_the_same_words(kind):
    # the shape checks the models share refused bare ("expects a torch.Tensor input, got X.")
    from pyrouq.models.plain import _check_lenet_input, _check_mlp_input

    for check, size in ((_check_mlp_input, 784), (_check_lenet_input, 1)):
        with pytest.raises(TypeError) as refused:
            check("Net", _INPUTS[kind], size)
        assert str(refused.value).startswith(f"Net {_NOT_A_TENSOR[kind]}")


# --------------------------------------------------------------------------------------------
# fit(resume_from=...) on 2 ranks: a checkpoint saved before the first step
# --------------------------------------------------------------------------------------------

N = 24  # batches of 8: 3 steps an epoch


def _data():
    x = torch.randn(N, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long()


class _StopAtFirstFetch(ArrayLoader):
    """Ctrl-C in its first fetch: the run stops before its first step."""

    def __iter__(self):
        raise KeyboardInterrupt
        yield from super().__iter__()


def _run(loader, **kw):
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 2)))
    return fit(model, mean_field_guide(model), loader, progress=False, seed=0, **kw)


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist_.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        path = f"{out}/{('zero.pt', 'end.pt')[rank]}"
        try:
            _run(ArrayLoader(*_data(), 8, seed=0), epochs=2, resume_from=path)
            outcome = "trained"
        except ValueError as err:
            outcome = str(err)
        torch.save(outcome, f"{out}/rank{rank}.pt")
    finally:
        dist_.destroy_process_group()
    exit_quietly()


def test_a_checkpoint_saved_before_the_first_step_is_told_so(tmp_path):
    # (rank 0 had "a checkpoint after 0 steps (the end of epoch 0)")
    with pytest.raises(TrainingInterrupted):
        _run(_StopAtFirstFetch(*_data(), 8, seed=0), epochs=2, checkpoint=tmp_path / "zero.pt")
    _run(ArrayLoader(*_data(), 8, seed=0), epochs=1, checkpoint=tmp_path / "end.pt")
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)), world=2)
    messages = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert "(rank 0 has a checkpoint after 0 steps (before the first step))" in messages[0]
    assert "(rank 1 has a checkpoint after 3 steps (the end of epoch 1))" in messages[1]
    assert "epoch 0" not in messages[0]
