"""mcmc() as a demanding user meets it: a guide or None where the data go, a half-precision
model, a chain's own exception that does not unpickle, and a parent process killed while its
chain processes run."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import torch
from _toy import MCMC_OPTIONS, regression_data, regression_model
from torch import nn

from pyrouq import Gaussian, bayesian, mcmc, mean_field_guide, predict

OPTIONS = MCMC_OPTIONS
_data, _model = regression_data, regression_model


def test_a_guide_or_none_in_place_of_the_data_is_told_what_mcmc_takes():
    """fit(model, guide, loader) and predict(model, x, guide) take a guide: mcmc(model, guide,
    loader) was told that NUTS 'takes no minibatch loader' of a guide, and so was y=None."""
    x, _ = _data()
    model = _model()
    with pytest.raises(
        TypeError,
        match=r"^mcmc\(\) needs the full data as tensors x and y, got MeanFieldGuide for x\. "
        r"It takes no guide \(NUTS samples the posterior itself\): call mcmc\(model, x, y, "
        r"num_samples=\.\.\., warmup_steps=\.\.\.\)\.$",
    ):
        mcmc(model, mean_field_guide(model), x, num_chains=1, **OPTIONS)
    with pytest.raises(
        TypeError,
        match=r"got NoneType for y\. NUTS samples the posterior given the inputs and their "
        r"targets: call mcmc\(model, x, y,",
    ):
        mcmc(model, x, None, num_chains=1, **OPTIONS)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_model_is_refused_with_the_copy_to_sample(dtype):
    """A float16 model failed in Pyro's trace with 'mat1 and mat2 must have the same dtype,
    but got Half and Float' (its priors draw float32 weights) under a dump of trace shapes."""
    x, y = _data()
    model = _model().to(dtype)
    with pytest.raises(
        TypeError,
        match=rf"^mcmc\(\) samples in float32 or float64, got a {dtype} model; .*Sample a "
        r"float32 copy, mcmc\(copy\.deepcopy\(model\)\.float\(\), x, y, \.\.\.\): predict\(\) "
        r"takes its draws for this model too\.$",
    ):
        mcmc(model, x, y, num_chains=1, **OPTIONS)
    assert model.training and model.num_data is None  # refused before anything changed
    # what the message says works
    import copy

    result = mcmc(copy.deepcopy(model).float(), x, y, num_chains=1, **OPTIONS)
    assert predict(model, x[:4], posterior_samples=result).loc.shape == (3, 4, 1)


class TwoArgumentError(Exception):
    """An exception whose __init__ takes two arguments: it pickles, and its unpickling calls
    __init__ with the message alone."""

    def __init__(self, what, where):
        super().__init__(f"{what} went wrong at step {where}")


class RaisesTwoArgumentError(nn.Linear):
    """A Linear layer that raises TwoArgumentError in a chain process (a plain Linear here)."""

    def forward(self, x):
        if multiprocessing.parent_process() is not None:
            raise TwoArgumentError("the chain's own layer", 3)
        return super().forward(x)


def test_a_chain_error_that_does_not_unpickle_reaches_the_caller_with_its_message():
    """The parent unpickled the chain's exception by calling TwoArgumentError(message), and
    raised that call's TypeError ('missing 1 required positional argument') instead."""
    x, y = _data()
    model = bayesian(RaisesTwoArgumentError(2, 1), likelihood=Gaussian(0.3))
    with pytest.raises(RuntimeError) as info:
        mcmc(model, x, y, num_chains=2, parallel=True, **OPTIONS)
    text = str(info.value)
    assert "TwoArgumentError: the chain's own layer went wrong at step 3" in text
    assert "Traceback" in text and "in forward" in text  # the chain process's traceback
    assert not multiprocessing.active_children()


_KILLED = """
import multiprocessing, os, signal, sys, threading, time
sys.path[:0] = [{tests!r}, {tests!r} + "/.."]  # its folder, and tests/
from test_mcmc import _run, bayesian, Gaussian, MisbehavesInAWorker

def chain_processes():
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{{pid}}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{{pid}}/cmdline") as f:
                spawned = "spawn_main" in f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and spawned:
            found.append(int(pid))
    return found

def kill_myself_once_chains_run():
    deadline = time.monotonic() + 60
    while len(chain_processes()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    print(*chain_processes(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer, or a kernel restarted

model = bayesian(MisbehavesInAWorker(2, 1, then="stall"), likelihood=Gaussian(0.3))
threading.Thread(target=kill_myself_once_chains_run, daemon=True).start()
_run(model, parallel=True)
"""


def _running(pid):
    """Whether process ``pid`` runs (a zombie waiting for its reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_chain_processes_end_when_their_parent_is_killed():
    """A parent killed (SIGKILL: out of memory; SIGTERM: a scheduler; a notebook kernel
    restarted) while its chains ran left the chain processes computing on as orphans, to the
    end of their chains."""
    tests = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        done = subprocess.run(
            [sys.executable, "-c", _KILLED.format(tests=tests)],
            stdout=out,
            stderr=err,
            timeout=120,
        )
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert done.returncode == -signal.SIGKILL, stderr[-4000:]
    pids = [int(p) for p in stdout.split()]
    assert len(pids) == 2, (stdout, stderr[-4000:])
    try:
        deadline = time.monotonic() + 15
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_running(p) for p in pids), "orphan chain processes left running"
    finally:
        for pid in pids:  # the chain processes this test started, if left behind
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("samples", "came"),
    [({}, "no sites"), ({"w": torch.zeros(3)}, r"a site of shape \(3,\)")],
)
def test_a_result_made_by_hand_without_chain_and_draw_dims_says_so(samples, came):
    """MCMCResult({}, ...) (or one loaded from a file that held no sites) raised a bare
    StopIteration, with no message, from num_chains, num_samples and repr() (a notebook
    displaying it), and a site without (chain, draw) dims an IndexError."""
    from pyrouq import MCMCResult

    result = MCMCResult(samples, {}, kernel="nuts", warmup_steps=0)
    told = rf"^This MCMCResult holds {came} in its samples, expected every latent site's draws"
    for read in (lambda: result.num_chains, lambda: result.num_samples):
        with pytest.raises(ValueError, match=told + r".* use the result mcmc\(\) returned\.$"):
            read()
    assert repr(result) == f"MCMCResult(kernel='nuts', no (chain, draw), sites={len(samples)})"
    whole = MCMCResult({"w": torch.zeros(2, 3, 4)}, {}, kernel="hmc", warmup_steps=1)
    assert repr(whole) == "MCMCResult(kernel='hmc', chains=2, draws=3, sites=1)"
