"""The `pyrouq` command: a re-runnable recorded command, a closed stdout, a finished run's
evaluation, a too small --conformal alpha, fit()'s BatchNorm advice in the command's words and
evaluate repeating fit's figures."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from pyrouq import cli
from pyrouq.cli import main
from pyrouq.cli._evaluate import _check_conformal
from pyrouq.cli._parser import EXIT_BROKEN_PIPE


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "mlp"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "256", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    return out


def test_the_recorded_command_runs_again_as_written(tmp_path, capsys):
    out = tmp_path / "my run's folder"  # a space and a quote
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    command = json.loads((out / "config.json").read_text())["command"]
    assert shlex.split(command) == ["pyrouq", *argv, "--no-progress"]


class _ClosedStdout:
    """stdout whose reader has gone, as under `pyrouq evaluate RUN | head -1`."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_ends_the_command_quietly(plain_run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", _ClosedStdout())
    code = main(["evaluate", str(plain_run), "--ood", "none", "--no-progress"])
    assert code == EXIT_BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


def test_a_closed_stdout_under_the_console_script_has_no_traceback(plain_run):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "pyrouq", "evaluate", str(plain_run), "--ood", "none"]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        done = subprocess.run(
            [*argv, "--no-progress"], stdout=write, stderr=subprocess.PIPE, text=True, env=env
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 141


def test_evaluate_of_a_finished_run_says_nothing_of_an_interruption(plain_run, capsys):
    assert main(["evaluate", str(plain_run), "--ood", "none", "--no-progress"]) == 0
    assert "interrupted" not in capsys.readouterr().out
    assert "interrupted_run" not in json.loads((plain_run / "metrics-evaluate.json").read_text())


def test_a_conformal_alpha_too_small_for_the_split_is_refused_before_evaluating(plain_run, capsys):
    assert main(["evaluate", str(plain_run), "--conformal", "0.0001", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before any table
    assert captured.err == (
        "pyrouq: error: --conformal 0.0001 is too small for the 5000 test images it calibrates "
        "on (half the test split), whose conformal threshold would be infinite; pass "
        "--conformal 0.0002 or more\n"
    )
    _check_conformal(0.0002, 5000)  # the alpha it names is enough: (5001)(1 - a) <= 5000
    with pytest.raises(cli.CommandError, match=r"pass --conformal 0\.0002 or more"):
        _check_conformal(0.00019, 5000)
    # the alpha as typed, as fff0d71 tells the other options (:g kept 6 digits: 0.000123457)
    with pytest.raises(cli.CommandError, match=r"^--conformal 0\.000123456789 is too small"):
        _check_conformal(0.000123456789, 5000)


def test_a_last_batch_of_one_for_batchnorm_is_told_in_the_commands_words(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ["fit", "_factories:batchnorm_mlp", "--method", "plain", "--epochs", "1"]
    argv += ["--train-size", "201", "--batch-size", "100", "--out", "run", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "drop_last" not in err  # a DataLoader option the command does not have
    assert err.endswith(
        "That is the last batch of the epoch: pick a --batch-size (or --train-size) that "
        "leaves no remainder of 1.\n"
    )


def test_a_run_that_fails_in_an_empty_out_leaves_it_empty_for_the_fixed_command(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()  # made beforehand, empty: not this run's to remove
    diverging = ["fit", "mlp", "--lr", "1e30", "--train-size", "1024", "--no-progress"]
    assert main([*diverging, "--out", str(out)]) == 2
    assert "Non-finite loss" in capsys.readouterr().err
    assert out.is_dir() and list(out.iterdir()) == []
    fixed = ["fit", "mlp", "--epochs", "1", "--train-size", "256", "--no-progress"]
    assert main([*fixed, "--out", str(out)]) == 0  # not refused as a non-empty --out


def test_evaluate_repeats_the_figures_fit_printed_for_a_bayesian_run(tmp_path, capsys):
    """fit's evaluation drew its posterior draws from wherever training left the random
    state, evaluate's from --seed: the same run read 0.392 / 0.390. Both seed now, evaluate
    with the run's own --seed unless given another (it took 0: 0.4198 against 0.4172)."""
    out = tmp_path / "bayes"
    argv = ["fit", "bayesian-mlp", "--epochs", "1", "--train-size", "256", "--out", str(out)]
    assert main([*argv, "--num-samples", "4", "--seed", "3", "--no-progress"]) == 0
    assert main(["evaluate", str(out), "--no-progress"]) == 0
    fitted = json.loads((out / "metrics.json").read_text())
    evaluated = json.loads((out / "metrics-evaluate.json").read_text())
    timings = {"train_seconds", "eval_seconds"}
    assert {k: v for k, v in fitted.items() if k not in timings} == {
        k: v for k, v in evaluated.items() if k not in timings
    }
    assert fitted["nll"] > 0 and fitted["mutual_information"] > 0  # draws that differ
