"""MCMC (NUTS/HMC) on tiny models: draws and sampler statistics, predict from posterior
samples, arviz export with chains, saving, and the refusals."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import tempfile

import arviz as az
import pyro.distributions as dist
import pytest
import torch
from _toy import MisbehavesInAWorker
from pyro.infer.mcmc.util import initialize_model
from torch import nn

from pyrouq import (
    CheckpointError,
    Gaussian,
    MCMCResult,
    bayesian,
    load,
    mcmc,
    predict,
    save,
    summary,
    to_inference_data,
)


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    return x, x @ torch.tensor([1.0, -1.0]) + 0.5 + 0.3 * torch.randn(n, generator=g)


def _run(model=None, **kwargs):
    x, y = _data()
    model = model or bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    options = {"num_samples": 20, "warmup_steps": 20, "num_chains": 2, "seed": 0}
    return mcmc(model, x, y, progress=False, **{**options, **kwargs}), model, x, y


@pytest.fixture(scope="module")
def result():
    return _run()


def test_draws_and_statistics_are_shaped_by_chain(result):
    res, *_ = result
    assert isinstance(res, MCMCResult) and (res.num_chains, res.num_samples) == (2, 20)
    assert res.samples["weight"].shape == (2, 20, 1, 2) and res.samples["bias"].shape == (2, 20, 1)
    stats = res.sample_stats
    assert stats["diverging"].dtype == torch.bool and stats["diverging"].shape == (2, 20)
    assert stats["tree_depth"].dtype == torch.int64 and bool((stats["tree_depth"] >= 1).all())
    assert bool((stats["step_size"] > 0).all()) and bool(torch.isfinite(stats["energy"]).all())
    assert res.draws()["weight"].shape == (40, 1, 2)
    assert torch.equal(res.draws()["bias"][20:], res.samples["bias"][1])  # chain after chain
    assert len(res.seconds) == 2 and res.divergences == int(stats["diverging"].sum())


def test_a_seed_repeats_the_chains(result):
    res, *_ = result
    again, *_ = _run()
    for site in res.samples:
        assert torch.equal(again.samples[site], res.samples[site])
    other, *_ = _run(seed=1)
    assert not torch.equal(other.samples["bias"], res.samples["bias"])


def test_predict_takes_draws_from_anywhere(result):
    res, model, x, _ = result
    p = predict(model, x[:5], posterior_samples=res)
    assert p.loc.shape == (40, 5, 1)
    expected = x[:5] @ res.draws()["weight"][7, 0] + res.draws()["bias"][7]
    torch.testing.assert_close(p.loc[7, :, 0], expected)
    p2 = predict(model, x[:5], posterior_samples={k: v[:3] for k, v in res.draws().items()})
    assert p2.loc.shape == (3, 5, 1)
    with pytest.raises(ValueError, match="the same number S of draws"):
        predict(model, x, posterior_samples={"weight": res.draws()["weight"][:3],
                                             "bias": res.draws()["bias"][:4]})  # fmt: skip
    with pytest.raises(ValueError, match="site 'weight' has shape"):
        predict(
            model, x, posterior_samples={"weight": torch.zeros(3, 2), "bias": torch.zeros(3, 1)}
        )
    with pytest.raises(ValueError, match="Pass posterior_samples alone"):
        predict(model, x, num_samples=3, posterior_samples=res)


def test_inference_data_has_chains_and_sampler_statistics(result):
    res, *_ = result
    idata = to_inference_data(res)
    assert set(idata.groups()) >= {
        "posterior", "sample_stats", "log_likelihood", "posterior_predictive", "observed_data"
    }  # fmt: skip
    # the network is the Linear itself: its sites are named in torch's layout too
    assert idata.posterior["weight"].dims == ("chain", "draw", "out", "in")
    assert idata.posterior["bias"].dims == ("chain", "draw", "out")
    assert idata.posterior["weight"].shape[:2] == (2, 20)
    assert int(idata.sample_stats["diverging"].sum()) == res.divergences
    assert idata.log_likelihood["obs"].shape == (2, 20, 30)
    assert idata.posterior.attrs["draws"] == "2 MCMC chains (nuts)"
    table = az.summary(idata, var_names=["bias"])
    assert {"r_hat", "ess_bulk"} <= set(table.columns)
    with pytest.raises(ValueError, match=r"num_samples=5 given for an MCMCResult: its 2 x 20 "):
        to_inference_data(res, num_samples=5)
    with pytest.raises(ValueError, match=r"got 0\. Leave it out: an MCMCResult's draws are"):
        to_inference_data(res, num_samples=0)
    ours = summary(idata, var_names=["bias"])  # MCMC chains: the diagnostics too, as arviz's
    assert list(ours.columns) == list(table.columns) and ours.equals(table)
    assert list(summary(idata, var_names=["bias"], kind="stats").columns) == [
        "mean", "sd", "hdi_3%", "hdi_97%"
    ]  # fmt: skip
    assert az.bfmi(idata).shape == (2,)


def test_save_and_load_round_trip(result, tmp_path):
    res, model, x, y = result
    path = save(tmp_path / "chains.pt", res, metadata={"note": "test"})
    back = load(path)
    assert isinstance(back, MCMCResult) and back.kernel == "nuts" and back.model is None
    assert back.metadata == {"note": "test"}  # given back (it was stored and not returned)
    assert load(save(tmp_path / "again.pt", back)).metadata == {"note": "test"}  # kept
    for name in res.samples:
        assert torch.equal(back.samples[name], res.samples[name])
    for name in res.sample_stats:
        assert torch.equal(back.sample_stats[name], res.sample_stats[name])
    lacks = r"lacks result\.model, result\.x and result\.y: set result\.model = model"
    with pytest.raises(ValueError, match=lacks):
        to_inference_data(back)
    back.model, back.x, back.y = model, x, y
    assert to_inference_data(back).posterior["bias"].shape == (2, 20, 1)
    with pytest.raises(CheckpointError, match="holds an MCMC result"):
        load(path, model_class="BayesianMLP")


def test_a_latent_noise_is_sampled_too():
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(dist.HalfNormal(1.0)))
    res, _, x, y = _run(model, num_chains=1, kernel="hmc")
    assert list(res.samples) == ["weight", "bias", "sigma"]
    assert bool((res.samples["sigma"] > 0).all())
    assert bool((res.sample_stats["tree_depth"] == res.sample_stats["tree_depth"][0, 0]).all())
    # lp: the draw's log density in Pyro's unconstrained space (sigma's log-Jacobian in it)
    model.num_data = len(x)
    _, potential_fn, transforms, _ = initialize_model(model, model_args=(x, y))
    for d in range(20):
        z = {k: transforms[k](v[0, d]) for k, v in res.samples.items()}
        assert float(res.sample_stats["lp"][0, d]) == pytest.approx(-float(potential_fn(z)), 1e-6)
    # a draw HMC rejected stays where it was: its acceptance probability was below 1
    accept = res.sample_stats["acceptance_rate"][0]
    stayed = (res.samples["sigma"][0, 1:] == res.samples["sigma"][0, :-1]).flatten()
    assert bool(stayed.any()) and bool((accept[1:][stayed] < 1).all())
    assert bool(((accept >= 0) & (accept <= 1)).all())


def test_the_largest_seeds_run_every_chain_and_leave_the_global_state_alone():
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    options = {"num_chains": 2, "num_samples": 3, "warmup_steps": 3, "parallel": False}
    res, *_ = _run(model, seed=2**32 - 1, **options)
    assert res.num_chains == 2  # chain 1 is seeded with 0 (2**32 wraps), not refused by numpy
    assert torch.equal(torch.rand(3), expected)  # as if the chains ran in other processes
    wrapped, *_ = _run(model, seed=0, num_chains=1, num_samples=3, warmup_steps=3)
    assert torch.equal(wrapped.samples["bias"][0], res.samples["bias"][1])


def test_a_learned_noise_warns_that_nuts_holds_it():
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian("learned"))
    with pytest.warns(
        UserWarning,
        match=r"Gaussian\('learned'\) is a point estimate, held at "
        r"its current value \(1\) .*Gaussian\(dist.HalfNormal\(1.0\)\)",
    ) as record:
        _run(model, num_chains=1, num_samples=2, warmup_steps=2)
    # at the caller's line (_run's, here), not mcmc.py's own (stacklevel=3 fell short of it)
    assert {w.filename for w in record if "learned" in str(w.message)} == {__file__}


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: _run(bayesian(nn.Linear(200, 60))), ValueError,
         r"has 12,060 latent values, above the 10,000 that NUTS handles in reasonable time "
         r"here. Fit it by variational inference .*pass force=True"),
        (lambda: _run(num_chains=0), ValueError, r"Expected num_chains to be an integer >= 1"),
        (lambda: mcmc(bayesian(nn.Linear(2, 1)), torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(*_data())), None, num_samples=5, warmup_steps=5),
         TypeError, r"mcmc\(\) needs the full data as tensors x and y, got DataLoader for x: "
         r"NUTS evaluates the likelihood of every point at every step"),
        (lambda: mcmc(bayesian(nn.Linear(2, 1)), _data()[0], _data()[1].numpy(), num_samples=5,
                      warmup_steps=5), TypeError,
         r"needs the full data as tensors x and y, got ndarray for y\. Convert it first: "
         r"y = torch\.as_tensor\(y\)"),
        (lambda: mcmc(bayesian(nn.Linear(2, 1)), torch.tensor(1.0), _data()[1], num_samples=5,
                      warmup_steps=5), ValueError,
         r"mcmc\(\): expected x with a leading dimension of N points, got a scalar tensor\. "
         r"Pass every point: x of shape \(N, \.\.\.\)"),
        (lambda: _run(kernel="gibbs"), ValueError, r"Unknown kernel 'gibbs'"),
        (lambda: _run(seed=1.5), ValueError,
         r"mcmc\(\): expected seed to be an integer in \[0, 2\*\*32 - 1\], got 1.5"),
        (lambda: _run(parallel="no"), TypeError,
         r"Expected parallel to be True or False, got 'no'"),
        (lambda: _run(force=1), TypeError, r"Expected force to be True or False, got 1\."),
        (lambda: mcmc(nn.Linear(2, 1), *_data(), num_samples=5, warmup_steps=5), TypeError,
         r"mcmc\(\) samples a pyrouq Bayesian model .*got Linear; make a plain network "
         r"Bayesian first, pyrouq\.bayesian\(net\) \(with likelihood="),
        (lambda: predict(bayesian(nn.Linear(2, 1)), _data()[0], posterior_samples=[1]),
         TypeError, r"Expected posterior_samples to be an MCMCResult, a pyro.infer.MCMC run or"),
    ],
)  # fmt: skip
def test_mcmc_refuses_bad_input(call, error, pattern):
    with pytest.raises(error) as info:
        call()
    assert re.search(pattern, str(info.value)), str(info.value)


def test_parallel_chains_give_the_same_draws(result):
    res, *_ = result
    parallel, *_ = _run(parallel=True)
    for site in res.samples:
        torch.testing.assert_close(parallel.samples[site], res.samples[site])
    assert torch.equal(parallel.sample_stats["diverging"], res.sample_stats["diverging"])


@pytest.mark.parametrize(
    ("then", "pattern"),
    [
        ("kill", r"ended abruptly \(chain \d, killed by SIGKILL\); out of memory is the usual "
         r"cause. Run fewer chains at once, or mcmc\(..., parallel=False\)"),
        ("exit", r"ended abruptly \(chain \d, exit code 3; its own error, if any, is printed "
         r"above\).*under `if __name__ == \"__main__\":`, or pass mcmc\(..., parallel=False\)"),
    ],
)  # fmt: skip
def test_a_chain_process_that_dies_is_a_clear_error(then, pattern):
    model = bayesian(MisbehavesInAWorker(2, 1, then=then), likelihood=Gaussian(0.3))
    with pytest.raises(RuntimeError, match=pattern):
        _run(model, parallel=True)
    assert model.training  # the model's state is restored on the way out


_UNGUARDED = """
import sys
sys.path[:0] = [{tests!r}, {tests!r} + "/.."]  # its folder, and tests/
from test_mcmc import _run
print("top-level code ran", flush=True)
_run(parallel=True)
"""


def test_a_script_without_a_main_guard_is_told_to_add_one(tmp_path):
    # each spawned chain process runs the script's top-level code again
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED.format(tests=os.path.dirname(__file__)))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert "mcmc() was called while a chain process was starting" in done.stderr  # a child's
    assert re.search(r"ended abruptly \(chain \d, exit code 1; .*__main__", done.stderr)


def test_parallel_chains_of_a_class_from_main_are_refused_and_the_model_left_as_it_was():
    class Script(nn.Linear):  # as if defined in a script: spawned processes cannot import it
        pass

    Script.__module__ = "__main__"
    model = bayesian(Script(2, 1), likelihood=Gaussian(0.3))
    before = model.num_data
    with pytest.raises(ValueError, match=r"cannot import a network class defined in __main__"):
        _run(model, parallel=True)
    assert model.training and model.num_data == before


def test_a_bounded_noise_prior_is_sampled_within_its_bounds():
    # the mean-field guide refuses a Uniform prior (infinite KL); NUTS samples it
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(dist.Uniform(0.05, 2.0)))
    res, *_ = _run(model, num_chains=1, num_samples=5, warmup_steps=5, max_tree_depth=3)
    assert res.samples["sigma"].shape == (1, 5) and bool(
        ((res.samples["sigma"] > 0.05) & (res.samples["sigma"] < 2.0)).all()
    )


def test_mcmc_leaves_the_batchnorm_statistics_alone():
    net = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 1))
    model = bayesian(net, likelihood=Gaussian(0.3))
    short = {"num_chains": 1, "num_samples": 3, "warmup_steps": 3, "max_tree_depth": 3}
    first, *_ = _run(model, **short)
    assert torch.equal(model.net[1].running_mean, torch.zeros(3))
    assert int(model.net[1].num_batches_tracked) == 0 and model.training
    again, *_ = _run(model, **short)
    assert all(torch.equal(first.samples[k], again.samples[k]) for k in first.samples)
    model.net[1].eval()  # a BatchNorm the user keeps in eval mode stays so
    _run(model, **short)
    assert model.training and not model.net[1].training


def test_an_error_in_a_chain_process_is_raised_here():
    model = bayesian(MisbehavesInAWorker(2, 1, then="raise"), likelihood=Gaussian(0.3))
    with pytest.raises(ArithmeticError, match="a chain's own error"):
        _run(model, parallel=True)
    assert not multiprocessing.active_children()


_INTERRUPTED = """
import faulthandler, multiprocessing, os, signal, sys, threading, time
faulthandler.dump_traceback_later(150, exit=True)  # a hang prints every thread's stack and ends
sys.path[:0] = [{tests!r}, {tests!r} + "/.."]  # its folder, and tests/
from test_mcmc import _run, bayesian, Gaussian, MisbehavesInAWorker
# Python's Ctrl-C handler, as a Jupyter kernel's while a cell runs: a process started with
# SIGINT ignored (a background job of a non-interactive shell, as CI runners and `make test &`
# start) keeps it ignored, and so did this one, whose chains then waited until the timeout
signal.signal(signal.SIGINT, signal.default_int_handler)
model = bayesian(MisbehavesInAWorker(2, 1, then="stall"), likelihood=Gaussian(0.3))
# Ctrl-C (SIGINT to this process alone, as a Jupyter interrupt) while the chains run
threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    _run(model, parallel=True)
except KeyboardInterrupt:
    print(f"interrupted after {{time.monotonic() - start:.1f}} s, "
          f"{{len(multiprocessing.active_children())}} chain processes left", flush=True)
"""


def test_an_interrupted_parallel_run_stops_its_chain_processes():
    # in a process of its own, so that a hang fails this test (after 2.5 minutes, with every
    # thread's stack in the message) instead of stalling the suite; the chains would sleep for
    # 10 minutes
    tests = os.path.dirname(os.path.abspath(__file__))
    # output to files, not pipes: chain processes left behind by a hang would hold a pipe open
    # and keep the wait going after the process itself has ended with its stacks
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        done = subprocess.run(
            [sys.executable, "-c", _INTERRUPTED.format(tests=tests)],
            stdout=out,
            stderr=err,
            text=True,
            timeout=180,
        )
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert done.returncode == 0, stderr[-6000:]
    seconds, left = re.fullmatch(
        r"interrupted after ([\d.]+) s, (\d+) chain processes left\n", stdout
    ).groups()
    assert 8.0 <= float(seconds) < 60 and left == "0"


@pytest.mark.parametrize("process", [0, 1])
def test_an_interrupt_inside_a_chain_process_start_stops_it_too(monkeypatch, process):
    """Ctrl-C landing inside start(), just after the spawn: start() never returned, so that
    process was neither recorded nor reachable (no Process held it), and it ran on, its chain
    to the end, after the KeyboardInterrupt; now the interrupt waits for the starts."""
    import signal
    import time
    from multiprocessing.context import SpawnProcess

    spawned = []
    launch = SpawnProcess._Popen

    def interrupted(process_obj):
        popen = launch(process_obj)
        spawned.append(popen)
        if len(spawned) == process + 1:
            os.kill(os.getpid(), signal.SIGINT)  # handled before _Popen returns, unheld
        return popen

    monkeypatch.setattr(SpawnProcess, "_Popen", staticmethod(interrupted))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # not an inherited SIG_IGN
    model = bayesian(MisbehavesInAWorker(2, 1, then="stall"), likelihood=Gaussian(0.3))
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            _run(model, parallel=True)
        seconds = time.monotonic() - start
        running = [popen.pid for popen in spawned if popen.poll() is None]
    finally:
        signal.signal(signal.SIGINT, previous)
        for popen in spawned:  # what a failure leaves, stopped
            if popen.poll() is None:
                popen.kill()
                popen.wait()
    assert not running and seconds < 30 and not multiprocessing.active_children()


def test_float64_targets_and_numpy_counts_give_the_draws_of_float32_ones(result):
    """Targets from ``torch.from_numpy`` are float64: they are cast to the model's dtype, as
    the inputs are (a float64 y turned NUTS's weights float64, and the network refused them)."""
    import numpy as np

    ours, model, x, y = result
    again = mcmc(model, x, y.double(), num_samples=np.int64(20), warmup_steps=20, num_chains=2,
                 seed=np.int64(0), progress=False)  # fmt: skip
    assert all(torch.equal(again.samples[k], ours.samples[k]) for k in ours.samples)
    assert again.samples["weight"].dtype == torch.float32


def test_a_model_that_does_not_pickle_runs_its_chains_here_or_is_refused(monkeypatch):
    """A network class defined in a function does not pickle, so no chain process can receive
    it: by default the chains run here (they used to fail with pickle's "Can't pickle local
    object" where parallel processes would have paid), and parallel=True says why it cannot."""

    class Local(nn.Linear):  # a class of a function: pickle cannot find it by name
        pass

    workers = sys.modules["pyrouq.mcmc"]
    monkeypatch.setattr(workers, "PARALLEL_MIN_STEPS", 2)  # parallel would pay by default
    monkeypatch.setattr(workers, "_cores", lambda: 2, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    torch.manual_seed(0)
    model = bayesian(Local(2, 1), likelihood=Gaussian(0.3))
    short = {"num_chains": 2, "num_samples": 3, "warmup_steps": 3, "max_tree_depth": 3}
    auto, *_ = _run(model, **short)
    here, *_ = _run(model, parallel=False, **short)
    assert all(torch.equal(auto.samples[k], here.samples[k]) for k in here.samples)
    with pytest.raises(ValueError) as info:
        _run(model, parallel=True, **short)
    assert re.search(
        r"mcmc\(parallel=True\) runs the chains in new processes, which cannot receive the "
        r"model: it does not pickle \(AttributeError: .*Local.*\)\. Define its classes at "
        r"the top level of a module, .*or pass parallel=False\.",
        str(info.value),
    ), str(info.value)
    assert model.training and not multiprocessing.active_children()


def test_chains_run_here_reseed_no_cuda_generator(monkeypatch):
    """Chains run one after another leave the caller's generators as they were, CUDA's
    included: they used to call torch.manual_seed, which seeds (or, before CUDA starts,
    queues a seed for) every CUDA device, so the caller's GPU draws changed after mcmc()."""
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seeded.append)
    torch.manual_seed(3)
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    seeded.clear()
    before = torch.get_rng_state()
    options = {"num_chains": 2, "num_samples": 3, "warmup_steps": 3, "parallel": False}
    res, *_ = _run(model, seed=11, max_tree_depth=3, **options)
    assert seeded == [] and torch.equal(torch.get_rng_state(), before)
    single, *_ = _run(model, seed=12, num_chains=1, num_samples=3, warmup_steps=3,
                      max_tree_depth=3)  # fmt: skip
    assert torch.equal(single.samples["weight"][0], res.samples["weight"][1])  # seed + c


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_data_on_the_cpu_go_to_a_cuda_model_and_its_generator_is_left_alone():
    x, y = _data()
    torch.manual_seed(0)
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3)).cuda()
    state = torch.cuda.get_rng_state()
    res = mcmc(model, x, y, num_samples=3, warmup_steps=3, num_chains=2, seed=0,
               progress=False, parallel=False, max_tree_depth=3)  # fmt: skip
    assert res.samples["weight"].device.type == "cuda" and res.x.device.type == "cuda"
    assert torch.equal(torch.cuda.get_rng_state(), state)


def test_one_chain_asked_to_run_in_parallel_keeps_the_callers_threads(monkeypatch):
    """One chain runs in this process even with parallel=True, and used to set torch's thread
    count there to every core (what a chain process gets), for good."""
    monkeypatch.setattr(sys.modules["pyrouq.mcmc"], "_cores", lambda: 4, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        res, *_ = _run(num_chains=1, num_samples=2, warmup_steps=2, parallel=True)
        assert torch.get_num_threads() == 1 and res.num_chains == 1
    finally:
        torch.set_num_threads(threads)


def test_the_check_that_a_model_pickles_copies_none_of_its_weights():
    """Whether a chain process can receive the model is decided by its classes and attributes:
    the check used to pickle every weight too (a frozen backbone under a Bayesian last layer
    copied whole, a GPU model's weights copied to the CPU), which a process receives through
    shared memory anyway."""
    import tracemalloc

    from pyrouq._mcmc_workers import spawn_problem

    net = nn.Sequential(nn.Linear(2, 256), nn.ReLU(), nn.Linear(256, 1024), nn.ReLU(),
                        nn.Linear(1024, 1))  # fmt: skip
    model = bayesian(net, select="last_layer", likelihood=Gaussian(0.3))
    # 1 MiB: the pickler's own bookkeeping of the model's structure (about 50 KiB) is far
    # below an eighth of it
    frozen = sum(t.numel() * t.element_size() for t in net[2].parameters())
    tracemalloc.start()
    try:
        assert spawn_problem(model) is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < frozen / 8, (peak, frozen)

    class LocalParameter(nn.Parameter):  # a tensor class a chain process cannot import
        pass

    model.net[0].bias = LocalParameter(model.net[0].bias.detach())
    problem = str(spawn_problem(model))
    assert "does not pickle" in problem and "LocalParameter" in problem, problem
    model.net[0].bias = nn.Parameter(model.net[0].bias.detach())
    model.net[1].hook = lambda: None  # an attribute that does not pickle is still found
    problem = spawn_problem(model)
    assert problem is not None and problem.startswith("cannot receive the model: it does not")


def test_chains_on_an_mps_model_leave_its_generator_as_it_was(monkeypatch):
    """A chain seeds the generator of the model's device; on Apple's MPS it reseeded it (through
    torch.manual_seed) without putting it back, so the caller's MPS draws changed after
    mcmc() (the CPU's, CUDA's, numpy's and Python's were put back)."""
    from pyrouq import _mcmc_workers as workers
    from pyrouq._util import global_streams_kept

    generator = {"state": torch.tensor([7], dtype=torch.uint8)}

    def manual_seed(seed):
        generator["state"] = torch.tensor([seed % 256], dtype=torch.uint8)

    monkeypatch.setattr(torch.mps, "manual_seed", manual_seed)
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda *_, **__: generator["state"].clone())
    monkeypatch.setattr(torch.mps, "set_rng_state",
                        lambda state, *_, **__: generator.update(state=state.clone()))  # fmt: skip
    mps, cpu = torch.device("mps"), torch.get_rng_state()
    with global_streams_kept(mps):  # as mcmc() runs chains here
        workers.seed_chain(3, mps)
        assert generator["state"].tolist() == [3]  # the chain's draws on the device are seeded
    assert generator["state"].tolist() == [7] and torch.equal(torch.get_rng_state(), cpu)
