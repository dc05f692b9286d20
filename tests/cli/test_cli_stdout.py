"""The command's stdout and stderr: a caller's own stream, none at all (``>&-``), a pipe whose
reader has gone on either (``pyrouq fit MODEL 2>&1 | head -1``)."""

from __future__ import annotations

import io
import os
import sys

from pyrouq.cli import main


class _Tee:
    """A caller's own sys.stdout, as many are written: its write returns None."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def test_a_stdout_of_ones_own_whose_write_returns_none_takes_the_printing(monkeypatch):
    tee = _Tee()
    monkeypatch.setattr(sys, "stdout", tee)
    assert main([]) == 0  # (was TypeError "int() argument must be ... not 'NoneType'")
    assert tee.text.startswith("usage: pyrouq ")


def test_no_stdout_at_all_prints_nothing_and_runs(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", None)  # `pyrouq >&-`, a daemon, Windows' pythonw
    assert main([]) == 0  # (was AttributeError "'NoneType' object has no attribute 'write'")
    assert sys.stdout is None
    assert capsys.readouterr().err.startswith("usage: pyrouq ")  # argparse's own fallback


def test_a_closed_stderr_of_ones_own_is_left_as_it_is(monkeypatch, tmp_path, capsys):
    closed = (tmp_path / "err.txt").open("w")
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    assert main([]) == 0  # (as before stderr was looked after: no ValueError at its end)
    assert sys.stderr is closed
    assert capsys.readouterr().out.startswith("usage: pyrouq ")


class _Pipe(io.TextIOBase):
    """Both ends of `2>&1 | head -1`: the first line is read, then the reader is gone."""

    encoding = "utf-8"

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.broken = False

    def write(self, text: str) -> int:
        if self.broken:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines.append(text)
        self.broken = "\n" in text
        return len(text)

    def isatty(self) -> bool:
        return False


def test_fit_with_its_stderr_piped_into_head_writes_its_run(monkeypatch, tmp_path):
    pipe = _Pipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    monkeypatch.setattr(sys, "stderr", pipe)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(out)]
    # progress bars on: they write to stderr (they raised BrokenPipeError, and the run's
    # folder was never written)
    assert main(argv) == 141
    assert pipe.lines[0].startswith("pyrouq ")
    assert sys.stdout is pipe and sys.stderr is pipe  # put back
    names = set(os.listdir(out))
    assert {"metrics.json", "config.json", "checkpoint.pt", "reliability.png"} <= names
