"""The docstrings' Raises / Warns lists and the README's words on the refusals and settings of
2026-12-07, pinned beside what the calls do: fit() and mcmc() inside a trace or a plate,
mcmc(parallel=True) under a Pyro handler (its chains kept in this process), save()'s training
state, load() of a plain pickle, a distribution class as a prior, bytes as train_loader, the
converters' 10,000 items per attribute, a BatchEnsemble forward's side effects once per member
on CPU, and calibration under a non-CPU default device."""

from __future__ import annotations

import importlib
import inspect
import pickle
import warnings
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, toy_data
from torch import nn

import pyrouq
from pyrouq.checkpoint import CheckpointError

MCMC_MODULE = importlib.import_module("pyrouq.mcmc")  # (pyrouq.mcmc: the function)

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
QUIET = {"progress": False}


def _flat(text: str | None) -> str:
    return " ".join((text or "").split())


def _doc(fn) -> str:
    return _flat(inspect.getdoc(fn))


def _model():
    torch.manual_seed(0)
    return pyrouq.bayesian(nn.Linear(3, 2))


# -------------------------------------------------------------------------------------------
# fit() and mcmc() inside a trace or a plate; mcmc's chains under a handler
# -------------------------------------------------------------------------------------------


def test_fit_lists_a_trace_around_the_call_among_its_refusals_and_refuses_it():
    assert "a ``pyro.poutine.trace()`` recording sample sites around the call" in _doc(pyrouq.fit)
    x, y = toy_data(8)
    model = _model()
    guide = pyrouq.mean_field_guide(model)
    with pyro.poutine.trace(), pytest.raises(ValueError) as caught:
        pyrouq.fit(model, guide, ListLoader(x, y, 4), epochs=1, **QUIET)
    assert "fit() was called inside pyro.poutine.trace(), expected no trace around the call" in (
        str(caught.value)
    )


def test_mcmc_lists_a_plate_and_a_trace_around_the_call_and_refuses_both():
    doc = _doc(pyrouq.mcmc)
    assert (
        "a vectorised ``pyro.plate`` or a ``pyro.poutine.trace()`` recording sample sites "
        "around the call (call mcmc() outside it)"
    ) in doc
    x, y = toy_data(8)
    model = _model()
    run = {"num_samples": 2, "warmup_steps": 2, "num_chains": 1, "seed": 0, **QUIET}
    with pyro.plate("outer", 3, dim=-2), pytest.raises(ValueError) as plate:
        pyrouq.mcmc(model, x, y, **run)
    assert "mcmc() got BayesianNetwork called inside pyro.plate('outer', 3, dim=-2)" in str(
        plate.value
    )
    with pyro.poutine.trace(), pytest.raises(ValueError) as trace:
        pyrouq.mcmc(model, x, y, **run)
    assert "mcmc() was called inside pyro.poutine.trace()" in str(trace.value)


def test_the_docs_say_mcmc_keeps_its_chains_here_under_a_handler_and_parallel_true_is_refused():
    """README, the module's docstring and mcmc()'s parameter and Raises say it; mcmc(parallel=
    True) under a poutine.scale is refused before any chain runs, saying why."""
    readme = _flat(README)
    assert (
        "no Pyro effect handler such as `poutine.scale` around the call, which those "
        "processes would not see: there the chains run in this process"
    ) in readme
    assert (
        "under a Pyro effect handler (``poutine.scale``), which those processes would not see, "
        "in this one"
    ) in _flat(MCMC_MODULE.__doc__)
    doc = _doc(pyrouq.mcmc)
    assert "no Pyro effect handler is active around the call (``poutine.scale``" in doc
    assert "``parallel=True`` where the chain processes could not run the model as here" in doc
    x, y = toy_data(8)
    model = _model()
    with pyro.poutine.scale(scale=2.0), pytest.raises(ValueError) as caught:
        pyrouq.mcmc(
            model, x, y, num_samples=2, warmup_steps=2, num_chains=2, parallel=True, **QUIET
        )
    assert str(caught.value).startswith(
        "mcmc(parallel=True) runs the chains in new processes, which would not see the Pyro "
        "effect handler around the call"
    )
    assert str(caught.value).endswith("or pass parallel=False.")


# -------------------------------------------------------------------------------------------
# save(training=), load() of a plain pickle, resume_from
# -------------------------------------------------------------------------------------------


def test_save_lists_a_training_state_it_refuses(tmp_path):
    assert (
        "or a ``training`` state that is not a dict or holds what load() would refuse to unpickle"
    ) in _doc(pyrouq.save)
    model = _model()
    with pytest.raises(CheckpointError) as caught:
        pyrouq.save(tmp_path / "run.pt", model, pyrouq.mean_field_guide(model), training="x")
    assert str(caught.value).startswith(
        "Expected save(training=...) to be the dict of resume state that fit() writes, got str."
    )
    assert not (tmp_path / "run.pt").exists()


def test_load_lists_a_file_torch_save_did_not_write_and_names_a_plain_pickle(tmp_path):
    assert "one that ``torch.save()`` did not write (a plain ``pickle.dump``'s" in _doc(pyrouq.load)
    path = tmp_path / "plain.pkl"
    path.write_bytes(pickle.dumps({"weights": [1.0, 2.0]}))
    with pytest.raises(CheckpointError) as caught:
        pyrouq.load(path)
    assert "is not a pyrouq checkpoint: it is a Python pickle (written by pickle.dump)" in str(
        caught.value
    )


def test_fit_lists_a_training_state_fit_did_not_write_among_resume_refusals(tmp_path):
    assert (
        "a ``resume_from`` that does not fit the model or holds a training state fit() did not "
        "write (``CheckpointError``)"
    ) in _doc(pyrouq.fit)
    model = _model()
    guide = pyrouq.mean_field_guide(model)
    path = pyrouq.save(tmp_path / "hand.pt", model, guide, training={"epochs_done": 1})
    x, y = toy_data(8)
    with pytest.raises(CheckpointError) as caught:
        pyrouq.fit(model, guide, ListLoader(x, y, 4), epochs=2, resume_from=path, **QUIET)
    assert "holds a training state that fit() did not write (no 'steps'" in str(caught.value)


# -------------------------------------------------------------------------------------------
# Arguments the docstrings name: a prior class, bytes as train_loader
# -------------------------------------------------------------------------------------------


def test_bayesian_says_a_distribution_class_as_prior_is_refused_and_it_is():
    assert "(a distribution class itself, ``dist.Normal``, is refused: pass an instance)" in (
        _doc(pyrouq.bayesian)
    )
    with pytest.raises(TypeError) as caught:
        pyrouq.bayesian(nn.Linear(3, 2), prior=dist.Normal)
    assert str(caught.value).endswith(
        "got the class Normal itself; pass an instance, e.g. dist.Normal(0.0, 1.0)."
    )


def test_fit_says_bytes_as_train_loader_iterate_ints_and_refuses_them():
    assert "a str, bytes or dict, which iterate characters, ints and keys" in _doc(pyrouq.fit)
    model = _model()
    with pytest.raises(TypeError) as caught:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), b"xy", epochs=1, **QUIET)
    assert "got bytes b'xy': iterated, it gives one byte (an int) at a time" in str(caught.value)


# -------------------------------------------------------------------------------------------
# The converters' bound: 10,000 items of an attribute's containers
# -------------------------------------------------------------------------------------------


class _HeldAfter(nn.Module):
    """A network holding an unregistered layer in a plain list after ``k`` numbers."""

    def __init__(self, k: int):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.held = [0] * k + [nn.Linear(3, 3)]

    def forward(self, x):
        return self.fc(x)


def _warned(convert, k: int) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert(_HeldAfter(k))
    return any("plain Python containers" in str(w.message) for w in caught)


@pytest.mark.parametrize(
    "convert", [pyrouq.bayesian, pyrouq.batchensemble, pyrouq.rank1], ids=lambda f: f.__name__
)
def test_each_converter_says_it_reads_10_000_items_of_an_attribute_and_does(convert):
    """The list counts as the first item read: a layer after 9,998 numbers is item 10,000."""
    assert "in the first 10,000 items of each attribute's containers" in _doc(convert)
    two = convert if convert is pyrouq.bayesian else (lambda m: convert(m, 2))
    assert _warned(two, 9_998)
    assert not _warned(two, 9_999)


# -------------------------------------------------------------------------------------------
# README: a BatchEnsemble forward's side effects; calibration under another default device
# -------------------------------------------------------------------------------------------


def test_readme_says_a_forwards_side_effects_run_once_per_member_on_cpu():
    assert (
        "what your forward does besides computing (a counter it updates, a forward hook on one "
        "of its layers) then happens M times a call on CPU, on B inputs each"
    ) in _flat(README)

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            self.calls += 1
            return self.fc(x)

    ensemble = pyrouq.batchensemble(Counting(), 3)
    seen = []
    ensemble.net.fc.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    ensemble(torch.randn(5, 3))
    assert ensemble.net.calls == 3
    assert seen == [(5, 3)] * 3


def test_readme_says_temperature_scaling_and_conformal_sets_run_under_a_meta_default():
    assert (
        "`train_test_split`, the metrics, temperature scaling, conformal prediction and the "
        "plots make their tensors on the CPU or the data's device, whatever the default"
    ) in _flat(README)
    g = torch.Generator().manual_seed(0)  # draws that agree, right on about 80 % (T ~ 0.87)
    logits = 2 * torch.randn(40, 3, generator=g) + 0.5 * torch.randn(4, 40, 3, generator=g)
    probs = torch.softmax(logits, -1)
    targets = probs.mean(0).argmax(-1)
    targets[:10] = torch.randint(0, 3, (10,), generator=g)
    preds = pyrouq.Predictions.from_probs(probs)

    def calibrate():
        scaler = pyrouq.temperature_scale(preds, targets)
        sets = pyrouq.conformal(preds, targets, alpha=0.2, score="raps").predict_sets(preds)
        return float(scaler.temperature), sets

    on_cpu = calibrate()
    torch.set_default_device("meta")
    try:
        under_meta = calibrate()
    finally:
        torch.set_default_device(None)
    assert under_meta[0] == on_cpu[0]
    assert under_meta[1].device.type == "cpu"
    assert torch.equal(under_meta[1], on_cpu[1])
