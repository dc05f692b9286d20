"""pyrouq under settings a notebook, a cluster job or a container may bring: a default device
other than the CPU for the loaders, the metrics and the plots; a process without stderr
(``python train.py 2>&-``, a daemon, ``pythonw``); a Pyro trace, plate or effect handler
around fit() and mcmc(); a pickle that torch.save did not write given to load(); and the
command's tables under a C locale, whose stdout encodes ASCII and escapes file names' bytes."""

from __future__ import annotations

import io
import os
import pickle
import sys
import warnings

import pyro
import pytest
import torch
from _toy import toy_data
from torch import nn

import pyrouq
from pyrouq.checkpoint import CheckpointError
from pyrouq.cli import main
from pyrouq.plotting import plot_calibration, plot_risk_coverage

QUIET = {"progress": False}


def _net() -> nn.Module:
    torch.manual_seed(0)
    with torch.device("cpu"):
        return nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))


def _under_meta_default(fn):
    """``fn()`` with torch's default device set to 'meta' (tensors without values)."""
    torch.set_default_device("meta")
    try:
        return fn()
    finally:
        torch.set_default_device(None)


# -------------------------------------------------------------------------------------------
# A default device other than the CPU
# -------------------------------------------------------------------------------------------


def test_loaders_shuffle_as_on_the_cpu_default_under_a_meta_default_device():
    """ArrayLoader's and load_mnist's orders came from a randperm on the default device:
    "Cannot copy out of meta tensor; no data!" (under 'cuda', a CPU generator there is
    refused); a loader without a seed drew it there: "Tensor.item() cannot be called on meta
    tensors"."""
    x, y = toy_data(24)

    def batches():
        seeded = list(pyrouq.ArrayLoader(x, y, batch_size=8, seed=0))
        unseeded = list(pyrouq.ArrayLoader(x, y, batch_size=8, shuffle=False))
        train, _ = pyrouq.data.load_mnist(16, train_size=32, seed=0)
        return seeded, unseeded, next(iter(train))

    expected = batches()
    seeded, unseeded, (images, labels) = _under_meta_default(batches)
    order = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    assert torch.equal(seeded[0][0], x[order[:8]]) and torch.equal(seeded[2][1], y[order[16:]])
    assert all(torch.equal(a[0], b[0]) for a, b in zip(seeded, expected[0], strict=True))
    assert torch.equal(torch.cat([b[0] for b in unseeded]), x)
    assert images.device.type == "cpu" and images.shape == (16, 1, 28, 28)
    assert torch.equal(images, expected[2][0]) and torch.equal(labels, expected[2][1])


def test_regression_metrics_and_the_plots_under_a_meta_default_device():
    """evaluate() of Gaussian predictions (and plot_calibration) made the calibration levels on
    the default device ("Cannot copy out of meta tensor"); plot_risk_coverage its counts of
    points ("Tensor on device meta is not on the expected device cpu!")."""
    g = torch.Generator().manual_seed(0)
    loc, target = torch.randn(3, 20, 1, generator=g), torch.randn(20, 1, generator=g)
    predictions = pyrouq.GaussianPredictions(loc, torch.ones(3, 20, 1))
    probs = torch.softmax(torch.randn(2, 20, 3, generator=g), -1)
    classes = torch.randint(0, 3, (20,), generator=g)

    def evaluated():
        metrics = pyrouq.evaluate(predictions, target)
        risk = plot_risk_coverage(probs, classes).axes[0].lines[0].get_ydata()
        plot_calibration(predictions, target)
        return metrics, list(risk)

    (metrics, risk), (got, got_risk) = evaluated(), _under_meta_default(evaluated)
    assert got == metrics and got_risk == risk
    # the share of targets inside the central 50% interval of the 3-component mixture, by hand
    cdf = torch.distributions.Normal(loc, 1.0).cdf(target).mean(0)
    assert got["coverage_50"] == pytest.approx(((cdf > 0.25) & (cdf < 0.75)).double().mean())


# -------------------------------------------------------------------------------------------
# A process without stderr
# -------------------------------------------------------------------------------------------


def test_fit_and_mcmc_show_no_bars_where_the_process_has_no_stderr(monkeypatch):
    """Python sets sys.stderr to None where it has none (file descriptor 2 closed, pythonw):
    fit() and mcmc() ended at their first progress bar in AttributeError "'NoneType' object
    has no attribute 'write'"."""
    x, y = toy_data(24)

    def run(progress):
        model = pyrouq.bayesian(_net())
        guide = pyrouq.mean_field_guide(model)
        fitted = pyrouq.fit(model, guide, [(x, y)], epochs=2, num_data=24, seed=0,
                            progress=progress)  # fmt: skip
        chain = pyrouq.mcmc(pyrouq.bayesian(_net()), x, y, num_samples=2, warmup_steps=2,
                            num_chains=1, seed=0, progress=progress)  # fmt: skip
        return fitted.losses, chain.samples

    losses, samples = run(False)
    monkeypatch.setattr(sys, "stderr", None)
    got_losses, got_samples = run(True)
    monkeypatch.undo()
    assert got_losses == losses
    assert all(torch.equal(got_samples[k], v) for k, v in samples.items())


# -------------------------------------------------------------------------------------------
# Pyro effect handlers around fit() and mcmc()
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["fit", "mcmc"])
def test_a_trace_recording_sites_around_fit_or_mcmc_is_refused_in_words(call):
    """Each step records the sites again: Pyro's bare "Multiple sample sites named
    '0.weight'" (for a BatchEnsemble, at fit()'s second step: "... named 'data'")."""
    x, y = toy_data(24)
    model = pyrouq.bayesian(_net())

    def run():
        if call == "fit":
            guide = pyrouq.mean_field_guide(model)
            return pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=24, **QUIET).losses
        return pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1, **QUIET)

    with pytest.raises(ValueError) as info, pyro.poutine.trace():
        run()
    assert str(info.value) == (
        f"{call}() was called inside pyro.poutine.trace(), expected no trace around the call: "
        "each of its steps runs the model again, whose sample sites a trace records once only "
        f"(Pyro's 'Multiple sample sites named ...'). Call {call}() outside the trace; to see "
        "the model's sites, trace one run of it: pyro.poutine.trace(model).get_trace(x, y)."
    )
    with pyro.poutine.trace(param_only=True):  # records parameters alone (as SVI.step's)
        run()


def test_a_plate_around_mcmc_is_refused_as_around_fit():
    """mcmc() ended in Pyro's 'at plates "data" and "outer", collide at dim=-1' (and
    "duplicate plate 'data'") where fit() names the plate and what to do."""
    x, y = toy_data(24)
    with pytest.raises(ValueError) as info, pyro.plate("outer", 3):
        pyrouq.mcmc(pyrouq.bayesian(_net()), x, y, num_samples=2, warmup_steps=2, **QUIET)
    assert str(info.value).startswith(
        "mcmc() got BayesianNetwork called inside pyro.plate('outer', 3, dim=-1), expected no "
        "plate around the call: the model observes its targets inside a plate of its own"
    )
    # mcmc() minimises no loss: the plate would multiply the log density NUTS samples
    assert str(info.value).endswith(
        "which a plate around it duplicates, collides with or broadcasts the weights over "
        "(multiplying the log density). Call mcmc() outside the plate; to weigh the log "
        "density, put pyro.poutine.scale(scale=...) around the call instead."
    )


def test_chains_under_a_pyro_handler_run_here_where_they_see_it(monkeypatch):
    """Chains run in new processes do not see a poutine.scale around mcmc() (the chains run
    here do): the same call sampled the tempered posterior on one core and the untempered one
    where several cores made the chains parallel by default."""
    x, y = toy_data(24)
    workers = sys.modules["pyrouq.mcmc"]
    monkeypatch.setattr(workers, "PARALLEL_MIN_STEPS", 2)  # parallel would pay by default
    monkeypatch.setattr(workers, "_cores", lambda: 2)
    options = {"num_samples": 3, "warmup_steps": 3, "num_chains": 2, "seed": 0, **QUIET}
    model = pyrouq.bayesian(_net())
    plain = pyrouq.mcmc(model, x, y, parallel=False, **options).samples
    with pyro.poutine.scale(scale=4.0):
        here = pyrouq.mcmc(model, x, y, parallel=False, **options).samples
        auto = pyrouq.mcmc(model, x, y, **options).samples
        with pytest.raises(ValueError) as info:
            pyrouq.mcmc(model, x, y, parallel=True, **options)
    assert all(torch.equal(auto[k], v) for k, v in here.items())
    assert not torch.equal(here["0.weight"], plain["0.weight"])  # (tempered: another chain)
    assert str(info.value) == (
        "mcmc(parallel=True) runs the chains in new processes, which would not see the Pyro "
        "effect handler around the call (a poutine.scale, condition or mask, which applies in "
        "this process alone). Call mcmc() outside it, or pass parallel=False."
    )


# -------------------------------------------------------------------------------------------
# A checkpoint path holding a pickle of another kind
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_plain_pickle_is_told_as_such_not_as_a_damaged_checkpoint(tmp_path, protocol):
    """A pickle.dump() of plain values was "truncated or corrupted (Unsupported operand 149)"
    (or "(Invalid magic number; corrupt file?)"), after torch's warning "Detected pickle
    protocol 4 in the checkpoint"; one of torch.save's format before torch 1.6 is still read."""
    path = tmp_path / "values.pt"
    with open(path, "wb") as f:
        pickle.dump({"epochs": [1, 2, 3]}, f, protocol=protocol)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(CheckpointError) as info:
            pyrouq.load(path)
    assert str(info.value) == (
        f"{str(path)!r} is not a pyrouq checkpoint: it is a Python pickle (written by "
        "pickle.dump), not a file torch.save() writes. Pass the file that pyrouq.save() or "
        "`pyrouq fit --out DIR` wrote (DIR/checkpoint.pt)."
    )
    legacy = tmp_path / "legacy.pt"
    torch.save({"epochs": 3}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"got a dict with format=None\. Write checkpoints"):
        pyrouq.load(legacy)


# -------------------------------------------------------------------------------------------
# The command under a C locale
# -------------------------------------------------------------------------------------------


def test_the_command_prints_its_tables_under_a_c_locales_stdout(tmp_path, monkeypatch):
    """In a C (POSIX) locale with Python's UTF-8 mode off (PYTHONUTF8=0; on, it encodes UTF-8)
    stdout encodes ASCII with errors="surrogateescape" (not "strict", which alone was
    handled): a finished run ended in "pyrouq: error: 'ascii' codec can't encode characters
    in position 0-37", its metrics and plots unwritten. A file name's undecodable bytes
    (surrogate escapes) are written back as they were."""
    buffer = io.BytesIO()
    stdout = io.TextIOWrapper(buffer, encoding="ascii", errors="surrogateescape")
    monkeypatch.setattr(sys, "stdout", stdout)
    out = tmp_path / os.fsdecode(b"run\xff")
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--seed", "0", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    assert stdout.errors == "surrogateescape"  # put back
    stdout.flush()
    printed = buffer.getvalue()
    lines = printed.decode("ascii", "replace").splitlines()
    head = lines.index("| Classification           |   Value |")
    assert lines[head - 1] == lines[head + 1] == "+--------------------------+---------+"
    assert os.fsencode(out) + b"/: metrics.json" in printed
    assert (out / "metrics.json").is_file() and (out / "uncertainty.png").is_file()
