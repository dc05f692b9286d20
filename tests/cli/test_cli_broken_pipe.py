"""`pyrouq fit MODEL | head -1` still writes its run (it exited 141 before writing its metrics
and plots), then exits quietly with 141."""

from __future__ import annotations

import os
import subprocess
import sys

_RUN_FILES = ("metrics.json", "config.json", "checkpoint.pt", "reliability.png")


def test_fit_piped_into_head_writes_its_run_and_exits_quietly(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64"]
    child = subprocess.Popen(
        [sys.executable, "-m", "pyrouq", *argv, "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None and child.stderr is not None
    first = child.stdout.readline()  # as `| head -1`: one line read, then the reader is gone
    child.stdout.close()
    err = child.stderr.read().decode()
    code = child.wait(timeout=120)
    assert first.startswith(b"pyrouq "), first
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code == 141  # as before, and as README's exit codes say: the output was cut
    assert all((out / name).is_file() for name in _RUN_FILES), sorted(os.listdir(out))
