"""Running a command line (torchrun and its ranks) from a test (not a test module)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest


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
