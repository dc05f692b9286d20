"""The chains of :func:`pyrouq.mcmc`: one chain's NUTS (or HMC) run with its sampler statistics,
and the processes that run several chains in parallel (private)."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import pickle
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from multiprocessing.connection import wait
from typing import Any

import numpy as np
import pyro
import torch
from pyro.infer.mcmc import HMC, NUTS
from torch import Tensor

from pyrouq._engine import repeatable
from pyrouq._util import module_device, module_dtype, seed_generators
from pyrouq.convert._copying import computed_detached

__all__ = ["chain_job", "parallel_chains", "spawn_problem"]


def parallel_chains(jobs: list[tuple[Any, ...]], workers: int) -> list[Any]:
    """The chains' jobs in ``workers`` new (spawned) processes, worker k running chains k,
    k + workers, ... A process that ends without its results (killed for memory, a crash in a
    native library) is a clear error, never a wait without end; an interrupt (Ctrl-C, a
    Jupyter interrupt) stops every chain process at once.

    Processes of our own rather than a ``ProcessPoolExecutor``, whose shutdown can deadlock
    while its workers are being terminated (CPython gh-125451: its manager thread and its
    queue's feeder thread both take the shutdown lock; fixed for 3.12 and 3.13 only), which is
    what an interrupt does, and what hung two CI runs."""
    context = multiprocessing.get_context("spawn")
    results: dict[int, Any] = {}
    running: dict[Any, tuple[list[int], Any]] = {}  # result pipe -> (chains owed, process)
    try:
        # Ctrl-C held back until every process is started and recorded: one raised inside
        # start(), after the spawn, would leave a chain process running that no one stops.
        # The models sent (pickled by start()) with detached copies of the tensors a forward
        # with gradients cached in them, which torch's process pickler refuses; the caller's
        # own tensors, graphs and all, are theirs again once every process has started
        with _interrupts_held(), contextlib.ExitStack() as models:
            for model in {id(job[0]): job[0] for job in jobs}.values():
                models.enter_context(computed_detached(model))
            for k in range(workers):
                share = [(index, jobs[index]) for index in range(k, len(jobs), workers)]
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(target=_chain_process, args=(share, writer), daemon=True)
                try:
                    process.start()
                finally:
                    writer.close()  # the child holds the only writer: its end is the EOF
                running[reader] = ([index for index, _ in share], process)
        while running:
            # with a timeout: a Ctrl-C whose signal landed on another thread is only handled
            # once this thread runs Python again, which a wait without end could never do
            ready: list[Any] = wait(list(running), timeout=0.5)
            for reader in ready:
                owed, process = running[reader]
                try:
                    index, ok, value = pickle.loads(reader.recv_bytes())
                except EOFError:
                    del running[reader]
                    reader.close()
                    process.join()
                    if owed:
                        raise RuntimeError(_ended_abruptly(owed[0], process.exitcode)) from None
                    continue
                if not ok:
                    raise value
                owed.remove(index)
                results[index] = value
    finally:
        with _interrupts_held():  # a second Ctrl-C stops no cleanup half way
            for _, process in running.values():  # interrupted, or a chain failed
                if process.is_alive():
                    process.terminate()
            for reader, (_, process) in running.items():
                process.join(5)
                if process.is_alive():
                    process.kill()
                    process.join()
                reader.close()
    return [results[index] for index in range(len(jobs))]


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT held back while the block runs, then handled as it would have been (Python's
    KeyboardInterrupt, or a handler of the caller's own): what must not stop half way, as a
    chain process spawned but not yet recorded, runs to its end. Only in the main thread, the
    one Python runs signal handlers in, and only for a Python handler (an ignored SIGINT, or a
    C handler of an embedding application, is left as it is)."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    caught: list[Any] = []

    def hold(signum: int, frame: Any) -> None:
        caught.append(frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            previous(signal.SIGINT, caught[0])


def _ended_abruptly(chain: int, code: int | None) -> str:
    """What to say of a chain process that ended without its results, by its exit code."""
    start = f"mcmc(): a process running chains ended abruptly (chain {chain}"
    if code is not None and code < 0:  # killed by a signal
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        cause = "; out of memory is the usual cause" if -code == signal.SIGKILL else ""
        return (
            f"{start}, killed by {name}){cause}. Run fewer chains at once, or "
            "mcmc(..., parallel=False) to run them one after another in this process."
        )
    return (
        f"{start}, exit code {code}; its own error, if any, is printed above). A chain process "
        "starts by running the script's top-level code again: in a script, put the code that "
        'calls mcmc() under `if __name__ == "__main__":`, or pass mcmc(..., parallel=False) to '
        "run the chains one after another in this process."
    )


def _chain_process(share: list[tuple[int, tuple[Any, ...]]], writer: Any) -> None:
    """A chain process's body: run its jobs one after another, sending back ``(index, True,
    result)`` or ``(index, False, exception)`` for each as plain pickled bytes (tensors travel
    in the message, not by shared memory, so this process may end at once). Ctrl-C is left to
    the parent, which stops every chain; a parent that ends without stopping them (killed,
    a notebook kernel restarted) ends this process too, never an orphan computing on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with_parent, daemon=True).start()
    for index, job in share:
        failed = False
        try:
            message = pickle.dumps((index, True, chain_job(job)))
        except Exception as err:
            message, failed = _pickled_failure(index, err), True
        writer.send_bytes(message)
        if failed:
            break  # the parent raises it and stops the other chains
    writer.close()


def _end_with_parent() -> None:
    """End this chain process as soon as its parent has ended (its sentinel is ready)."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        parent.join()
        os._exit(1)


def _pickled_failure(index: int, err: Exception) -> bytes:
    """``(index, False, err)`` pickled, with the chain process's traceback as a note (or, for
    an exception that does not pickle, or not back (an ``__init__`` of several arguments),
    a RuntimeError holding that traceback)."""
    text = traceback.format_exc()
    if hasattr(err, "add_note"):  # Python >= 3.11
        err.add_note(f"(raised in the process of chain {index})\n{text}")
    try:
        message = pickle.dumps((index, False, err))
        pickle.loads(message)  # else the parent would raise the unpickling's TypeError instead
        return message
    except Exception:
        return pickle.dumps((index, False, RuntimeError(text)))


def chain_job(job: tuple[Any, ...]) -> tuple[dict[str, Tensor], dict[str, Tensor], float]:
    """One chain (in this process or in a worker): ``_run_chain`` on a packed job, with
    cuDNN's deterministic kernels on a GPU (as a seeded fit(): its default convolution
    gradients add in a varying order, and seeded chains would drift in the last bits)."""
    *args, threads = job
    if threads is not None:
        torch.set_num_threads(threads)
    with repeatable(module_device(args[0]), True), _default_dtype_of(args[0]):
        return _run_chain(*args, line=_bar_line(args[7], parallel=threads is not None))


def _bar_line(chain: int, parallel: bool) -> int | None:
    """The line of chain ``chain``'s progress bar (tqdm's ``position``): its own, below the
    others', for chains running at once (in their processes) on a terminal; else none, the
    bar redrawn in place on one line. Chains run one after another share one line (each bar
    is gone before the next starts), and where stderr is no terminal (a Jupyter notebook, to
    which the kernel forwards the chain processes' output, or a log file) tqdm's moves
    between lines are not followed: each redraw of a bar below the first was a new line
    there, hundreds in a notebook's cell for a long run."""
    if not parallel:
        return None
    try:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a stream of the user's own, or a closed one
        terminal = False
    return chain if terminal else None


@contextlib.contextmanager
def _default_dtype_of(model: Any) -> Iterator[None]:
    """torch's default dtype set to the model's (float32 or float64) while its chain runs, then
    put back. Pyro makes some zeros in the default dtype (a plate's subsample site's log-density,
    a ``pyro.deterministic`` site's): under ``torch.set_default_dtype(torch.float64)`` a float32
    model's potential energy came out float64, NUTS's momenta and steps with it, and the
    network met float64 weights ("mat1 and mat2 must have the same dtype"). A chain process
    starts with torch's float32 default; a float64 model samples the same either way."""
    dtype, before = module_dtype(model), torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64) or dtype == before:
        yield
        return
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _run_chain(
    model: Any,
    x: Tensor,
    y: Tensor,
    kind: str,
    warmup_steps: int,
    num_samples: int,
    seed: int,
    chain: int,
    progress: bool,
    max_tree_depth: int,
    *,
    line: int | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor], float]:
    seed_chain(seed, module_device(model))
    start = time.perf_counter()
    if kind == "nuts":
        sampler: Any = NUTS(model, max_tree_depth=max_tree_depth, jit_compile=False)
    else:
        sampler = HMC(model, jit_compile=False)
    bar = None
    if progress:
        from pyrouq._progress import tqdm

        bar = tqdm(
            total=warmup_steps + num_samples,
            desc=f"chain {chain} {'warmup' if warmup_steps else 'sample'}",
            leave=False,
            position=line,
        )
    kept: dict[str, list[Tensor]] = {}
    stats: dict[str, list[Any]] = {
        k: [] for k in ("diverging", "step_size", "tree_depth", "energy", "lp", "acceptance_rate")
    }
    seen: dict[str, Any] = {}
    _record(sampler, seen)
    with pyro.validation_enabled(False):
        try:  # the progress bar closed however this ends, a failed start included
            try:
                sampler.setup(warmup_steps, x, y)
            except ValueError as err:  # Pyro's "Model specification seems incorrect - ..."
                if "valid initial params" not in str(err):
                    raise
                message = _NO_START.format(chain=chain, err=str(err).rstrip("."))
                raise ValueError(message) from err
            params = sampler.initial_params
            for step in range(warmup_steps + num_samples):
                divergences = len(sampler._divergences)
                potential = sampler._potential_energy_last
                mean_accept = sampler._mean_accept_prob
                seen.clear()
                params = sampler.sample(params)
                if bar is not None:
                    bar.update(1)
                    if step + 1 == warmup_steps:
                        bar.set_description(f"chain {chain} sample")
                if step < warmup_steps:
                    continue
                for name, value in params.items():
                    kept.setdefault(name, []).append(sampler.transforms[name].inv(value).detach())
                kinetic = float(sampler._kinetic_energy(seen["momentum"])) if seen else math.nan
                stats["diverging"].append(len(sampler._divergences) > divergences)
                stats["step_size"].append(float(sampler.step_size))
                if kind == "nuts":
                    stats["tree_depth"].append(seen.get("depth", -1) + 1)
                else:
                    stats["tree_depth"].append(int(sampler.num_steps))
                energy = float(potential) + kinetic if potential is not None else math.nan
                stats["energy"].append(energy)
                # the draw's potential energy, cached by the kernel: -log density (unconstrained)
                drawn = sampler._potential_energy_last
                stats["lp"].append(-float(drawn) if drawn is not None else math.nan)
                stats["acceptance_rate"].append(
                    _accept_prob(mean_accept, sampler._mean_accept_prob, step + 1 - warmup_steps)
                )
        finally:
            sampler.cleanup()
            if bar is not None:
                bar.close()
    samples = {name: torch.stack(values) for name, values in kept.items()}
    out_stats = {
        "diverging": torch.tensor(stats["diverging"], dtype=torch.bool),
        "step_size": torch.tensor(stats["step_size"], dtype=torch.float64),
        "tree_depth": torch.tensor(stats["tree_depth"], dtype=torch.int64),
        "energy": torch.tensor(stats["energy"], dtype=torch.float64),
        "lp": torch.tensor(stats["lp"], dtype=torch.float64),
        "acceptance_rate": torch.tensor(stats["acceptance_rate"], dtype=torch.float64),
    }
    return samples, out_stats, time.perf_counter() - start


def _accept_prob(before: float, after: float, n: int) -> float:
    """The kernel's acceptance probability of the n-th draw after warm-up (NUTS's mean over the
    trajectory's states, HMC's Metropolis one), which Pyro keeps only in a running mean,
    ``after = before + (p - before) / n``: p recovered from it (to ~n * 1e-16)."""
    return min(max(before + n * (after - before), 0.0), 1.0)


_NO_START = (
    "mcmc(): chain {chain} found no starting point where the model's log density is finite "
    "(Pyro drew the latent sites 100 times, uniformly in [-2, 2] in the unconstrained space; "
    "it says: {err}). The network's outputs, or the likelihood of y given them, are NaN or "
    "infinite at those weights: check model.outputs(x, model.template()) for NaN or inf, "
    "standardise large inputs and targets (pyrouq.Standardizer), and check the likelihood's "
    "scale."
)


def _record(sampler: Any, seen: dict[str, Any]) -> None:
    """Wrap the kernel's momentum draw and tree building on this instance, to read each
    transition's momentum (for the energy) and its number of trajectory doublings."""
    draw_momentum = sampler._sample_r

    def sample_r(name: str) -> Any:
        r, r_unscaled = draw_momentum(name)
        seen["momentum"] = r_unscaled
        return r, r_unscaled

    sampler._sample_r = sample_r
    build = getattr(sampler, "_build_tree", None)
    if build is not None:

        def build_tree(*args: Any, **kwargs: Any) -> Any:
            depth = args[5] if len(args) > 5 else kwargs.get("tree_depth", 0)
            seen["depth"] = max(seen.get("depth", -1), int(depth))
            return build(*args, **kwargs)

        sampler._build_tree = build_tree


class _Nowhere:
    """A file that keeps nothing: what :func:`spawn_problem` pickles into."""

    def write(self, data: Any) -> int:
        return len(data)


class _ClassesOnly(pickle.Pickler):
    """Pickles every object but tensors, which it leaves as references to their class (as
    torch's process pickler sends a tensor: its class, its storage through shared memory):
    what decides whether a model pickles (its classes, its attributes), without copying its
    weights, nor a GPU's weights to the CPU."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, (Tensor, torch.UntypedStorage)):
            return id(obj), type(obj)  # a tensor class defined in a function does not pickle
        return None


def spawn_problem(model: Any) -> str | None:
    """Why a new (spawned) process could not run ``model`` as here, or None: a Pyro effect
    handler around the call (which it would not see: its chain would sample another
    posterior), a class of the network defined in ``__main__`` (the new process cannot import
    it), or a part that does not pickle (a class defined inside a function, a lambda held as
    an attribute), or a main program that is no file (``python - < script.py``): a spawned
    process runs it again."""
    from pyrouq.infer._elbo_checks import handlers_active  # (lazy: infer imports mcmc)

    if handlers_active():  # (the chains run in this process see it)
        return (
            "would not see the Pyro effect handler around the call (a poutine.scale, "
            "condition or mask, which applies in this process alone). Call mcmc() outside it"
        )
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main is not None and not os.path.exists(main):
        return (
            f"cannot run the main program again: it is no file on disk ({main!r}: read from "
            "standard input or a pipe). Run it from a file"
        )
    if any(type(m).__module__ == "__main__" for m in model.modules()):
        return (
            "cannot import a network class defined in __main__ (a script's or a notebook's "
            "own cell). Move the class into a module"
        )
    try:
        _ClassesOnly(_Nowhere(), protocol=pickle.HIGHEST_PROTOCOL).dump(model)
    except Exception as err:  # PicklingError, AttributeError, TypeError: all say the same
        return (
            f"cannot receive the model: it does not pickle ({type(err).__name__}: {err}). "
            "Define its classes at the top level of a module, without lambdas held as "
            "attributes"
        )
    return None


def seed_chain(seed: int, device: torch.device | None) -> None:
    """Seed what a chain draws from: Python's, numpy's and torch's CPU generators and, for a
    model on an accelerator, that device's."""
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the legacy global state, as pyro.set_rng_seed
    seed_generators(device, seed)
