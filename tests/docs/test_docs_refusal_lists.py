"""The docstrings' Raises / Warns lists and the README's words on refusals and settings: fit()
and mcmc() inside a trace or a plate, mcmc(parallel=True) under a Pyro handler (its chains kept
in this process), save()'s training state, a model on the meta device (save(),
mean_field_guide(), to_inference_data()), load() of a plain pickle, a distribution class as a
prior, bytes as train_loader, the converters' 10,000 items per attribute (pinned beside what the
converters do), a BatchEnsemble forward's side effects once per member on CPU, and calibration
under a non-CPU default device (pinned beside what it does). The refusals themselves are pinned,
message and all, by the tests the comments name."""

from __future__ import annotations

import importlib
import inspect
import warnings
from pathlib import Path

import pyro
import pytest
import torch
from _toy import toy_data
from torch import nn

import pyrouq

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
# The docstrings' Raises lists; the calls' refusals are pinned, message and all, beside the
# code they test: tests/package/test_package_environment_settings.py (a trace around fit() and
# mcmc(), mcmc(parallel=True) under a handler, a plain pickle to load()),
# tests/package/test_public_arguments_fitting.py (save(training=), resume_from, a distribution
# class as prior, bytes as train_loader), tests/engine/test_cpu_default_device.py (a model on
# the meta device to save(), mean_field_guide(), to_inference_data())
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (pyrouq.fit, "a ``pyro.poutine.trace()`` recording sample sites around the call"),
        (pyrouq.mcmc, "a vectorised ``pyro.plate``, a ``pyro.poutine.trace()`` recording "
         "sample sites or a ``pyro.poutine.condition()`` fixing latent sites (whose draws the "
         "result would lack) or giving them None, or a ``pyro.poutine.do()`` intervening on "
         "them (drawn from their prior), around the call (call mcmc() outside it)"),
        (pyrouq.fit, "a ``pyro.poutine.condition()`` fixing a latent site of a pyrouq model"),
        (pyrouq.mcmc, "no Pyro effect handler is active around the call (``poutine.scale``"),
        (pyrouq.mcmc, "``parallel=True`` where the chain processes could not run the model as "
         "here"),
        (pyrouq.save, "or a ``training`` state that is not a dict or holds what load() would "
         "refuse to unpickle"),
        (pyrouq.load, "one that ``torch.save()`` did not write (a plain ``pickle.dump``'s"),
        (pyrouq.fit, "a ``resume_from`` that does not fit the model or holds a training state "
         "fit() did not write (``CheckpointError``)"),
        (pyrouq.bayesian, "(a distribution class itself, ``dist.Normal``, is refused: pass an "
         "instance)"),
        (pyrouq.fit, "a str, bytes or dict, which iterate characters, ints and keys"),
        (pyrouq.save, "also a model on the meta device (shapes, no values: nothing is written)"),
        (pyrouq.mean_field_guide, "A model on the meta device (shapes, no values"),
        (pyrouq.to_inference_data, "a model on the meta device (shapes, no values)"),
        (pyrouq.psis_diagnostic, "labels outside ``[0, C)`` (or observed values outside their "
         "distribution's support)"),
        (pyrouq.psis_diagnostic, "a vectorised ``pyro.plate`` or a ``pyro.poutine.condition()`` "
         "or ``pyro.poutine.do()`` fixing one of its latent sites (or a condition() giving one "
         "None)"),
        (pyrouq.psis_diagnostic, "a point mass (``AutoDelta``) or one whose parameters hold NaN "
         "or inf"),
        (pyrouq.save, "Warns ----- UserWarning A model with latent sites saved without its "
         "guide"),  # (55a1f79's warning: test_checkpoint_writing_and_paths.py)
    ],
    ids=["fit-trace", "mcmc-plate-trace", "fit-condition", "mcmc-handler", "mcmc-parallel",
         "save-training", "load-pickle", "fit-resume", "bayesian-class", "fit-bytes",
         "save-meta", "guide-meta", "idata-meta", "psis-labels", "psis-handlers", "psis-guide",
         "save-guide-warns"],
)  # fmt: skip
def test_the_docstrings_list_the_refusals(fn, words):
    assert words in _doc(fn)


def test_the_docs_say_mcmc_keeps_its_chains_here_under_a_handler():
    assert (
        "no Pyro effect handler such as `poutine.scale` around the call, which those "
        "processes would not see: there the chains run in this process"
    ) in _flat(README)
    assert (
        "under a Pyro effect handler (``poutine.scale``), which those processes would not see, "
        "in this one"
    ) in _flat(MCMC_MODULE.__doc__)


def test_a_plate_around_mcmc_off_the_data_dim_is_refused_too():
    """A plate at dim=-2 collides with no dim of the model's own plate: refused all the same
    (it would broadcast the weights and multiply the log density)."""
    x, y = toy_data(8)
    run = {"num_samples": 2, "warmup_steps": 2, "num_chains": 1, "seed": 0, **QUIET}
    with pyro.plate("outer", 3, dim=-2), pytest.raises(ValueError) as plate:
        pyrouq.mcmc(_model(), x, y, **run)
    assert "mcmc() got BayesianNetwork called inside pyro.plate('outer', 3, dim=-2)" in str(
        plate.value
    )


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
    # what the calls do: tests/convert/test_batchensemble_rank1_fitting_reference.py
    assert (
        "what your forward does besides computing (a counter it updates, a forward hook on one "
        "of its layers) then happens M times a call on CPU, on B inputs each"
    ) in _flat(README)


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
