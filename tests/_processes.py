"""Running processes from a test (not a test module): a command line (torchrun and its
ranks), or a function on the ranks of a process group spawned by ``torch.multiprocessing``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

TIMEOUT = 120  # seconds for a spawned group of ranks (they take a few seconds)


def spawn_ranks(worker, args, world: int = 2) -> None:
    """Run ``worker(rank, *args)`` on ``world`` processes; after TIMEOUT seconds, kill them
    all and fail (a rank stuck in a collective never hangs the suite)."""
    import torch.multiprocessing as mp

    context = mp.spawn(worker, args=args, nprocs=world, join=False)
    deadline = time.monotonic() + TIMEOUT
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
            pytest.fail(f"the {world} ranks did not finish within {TIMEOUT} s; killed them")


def exit_quietly() -> None:
    """End a rank that succeeded without the interpreter's teardown, as ``pyrouq``'s console
    script does: with torch 2.14, a spawned gloo rank could still abort there ("terminate
    called without an active exception", SIGABRT; once in CI, 2026-12-03) after its group was
    destroyed and its results saved. A rank that raises is left to ``mp.spawn``'s report."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_in_own_group(
    command: list[str], env: dict[str, str] | None, timeout: float, merge_stderr: bool = False
) -> subprocess.CompletedProcess:
    """Run ``command`` in a process group of its own and return what it printed; past
    ``timeout`` seconds kill the whole group (torchrun and every rank it started) and fail."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"{' '.join(command)} did not finish within {timeout} s; killed it")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
