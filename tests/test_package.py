from __future__ import annotations

import subprocess
import sys

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
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert capsys.readouterr().out.strip() == f"pyrouq {pyrouq.__version__}"


def test_data_command_prints_summary(capsys):
    assert main(["data"]) == 0
    out = capsys.readouterr().out
    assert "MNIST: train 60000 / test 10000 images" in out
    assert "mean raw pixel 33.318/255" in out


def test_data_command_bad_root_is_a_one_line_error(tmp_path, capsys):
    assert main(["data", "--data-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: MNIST train file not found")
    assert err.count("\n") == 1
