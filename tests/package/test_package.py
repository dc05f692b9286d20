from __future__ import annotations

import subprocess
import sys

import pytest

import pyrouq
from pyrouq.cli import main


def test_public_names_resolve():
    for name in pyrouq.__all__:
        assert getattr(pyrouq, name) is not None, name


def test_import_does_not_load_arviz_or_matplotlib():
    code = (
        "import sys, pyrouq; print(sorted(m for m in ('arviz', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyrouq {pyrouq.__version__}"


def test_data_command_prints_summary(capsys):
    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert "MNIST: train 60000 / test 10000 images" in out
    assert "mean raw pixel 33.318/255" in out


def test_console_script_flushes_runs_atexit_and_returns_the_exit_code(tmp_path):
    # the console entry ends the process with os._exit: what main printed (to a pipe, so
    # block-buffered) and what atexit handlers print must still come out, with main's code
    code = (
        "import atexit, sys; atexit.register(lambda: print('atexit ran')); "
        "from pyrouq.cli import console; console()"
    )
    ok = subprocess.run(
        [sys.executable, "-c", code, "data"], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0, ok.stderr
    assert "MNIST: train 60000 / test 10000 images" in ok.stdout
    assert ok.stdout.rstrip().endswith("atexit ran")
    bad = subprocess.run(
        [sys.executable, "-m", "pyrouq", "data", "--data-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("pyrouq: error: MNIST train file not found")
