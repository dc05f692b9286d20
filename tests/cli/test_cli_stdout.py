"""The command's stdout and stderr: a caller's own stream, none at all (``>&-``), a pipe whose
reader has gone on either (``pyrouq fit MODEL 2>&1 | head -1``), one on a full disk
(``> /dev/full``)."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys

import pytest

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


def test_no_stderr_at_all_keeps_the_error_line_off_stdout(monkeypatch, capsys, tmp_path):
    # `pyrouq data --data-root MISSING 2>&-`: print(file=sys.stderr) with sys.stderr None
    # writes on stdout, and the error line went into the command's output there
    monkeypatch.setattr(sys, "stderr", None)
    assert main(["data", "--data-root", str(tmp_path / "missing")]) == 2  # the exit code kept
    assert sys.stderr is None  # put back
    assert capsys.readouterr().out == ""


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


class _Full(io.TextIOBase):
    """A stdout redirected to a full disk (`> /dev/full`): every write fails."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_stdout_on_a_full_disk_is_one_line_not_a_traceback(monkeypatch, tmp_path, capsys):
    # `pyrouq fit ... > /dev/full` ended in "OSError: [Errno 28] No space left on device"'s
    # traceback (exit 1) at the first line it printed, before its run folder was made
    monkeypatch.setattr(sys, "stdout", _Full())
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "pyrouq: error: cannot write to stdout (No space left on device); free space on the "
        "disk stdout is redirected to, or send it elsewhere (> another file, or > /dev/null).\n"
    )
    assert not out.exists()  # stopped at its first line, before the run folder
    assert isinstance(sys.stdout, _Full)  # put back
    assert main([]) == 2  # the help too: "cannot write to stdout"
    assert capsys.readouterr().err.startswith("pyrouq: error: cannot write to stdout (No space")


def test_a_stderr_on_a_full_disk_is_dropped_and_the_run_written(monkeypatch, tmp_path):
    # a stderr that cannot be written (`2> /dev/full`: progress bars, warnings) does not stop
    # the run: its files are written, and the exit code (2) says output was lost
    monkeypatch.setattr(sys, "stderr", _Full())
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(out)]
    assert main(argv) == 2  # progress bars on: the first write to stderr fails
    names = set(os.listdir(out))
    assert {"metrics.json", "config.json", "checkpoint.pt", "reliability.png"} <= names
    assert isinstance(sys.stderr, _Full)  # put back


class _FillsUp(io.TextIOBase):
    """A stdout whose disk fills up once the first epoch's line is written: at once (the run
    stops in training), or, with ``whole_line``, once that line has ended (the run trained,
    and stops while it is evaluated)."""

    encoding = "utf-8"

    def __init__(self, whole_line: bool = False) -> None:
        self.text = ""
        self.whole_line = whole_line

    def write(self, text: str) -> int:
        if "epoch 1:" in self.text and (not self.whole_line or self.text.endswith("\n")):
            raise OSError(errno.ENOSPC, "No space left on device")
        self.text += text
        return len(text)


def test_a_stdout_that_fills_up_mid_run_says_what_the_run_left_and_how_to_resume_it(
    monkeypatch, tmp_path, capsys
):
    # the line said only to free space or send stdout elsewhere: the run, stopped after its
    # first epoch, left its checkpoint, which the same command then refused ("holds an
    # interrupted run") until given --resume
    full = _FillsUp()
    monkeypatch.setattr(sys, "stdout", full)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "3", "--train-size", "64", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "epoch 1:" in full.text and "epoch 2:" not in full.text
    assert err.startswith(
        f"pyrouq: error: cannot write to stdout (No space left on device); the run stopped: "
        f"{out / 'checkpoint.pt'} holds it after its last saved epoch (resume it: pyrouq fit "
    )
    assert f"--out {out} --resume); free space on the disk stdout" in err
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert main([*argv, "--out", str(out), "--resume"]) == 0  # the advice, followed
    assert (out / "metrics.json").exists()


class _FullAtFlush(io.TextIOBase):
    """A stdout whose writes are buffered and whose flush fails, as a redirected stdout's
    short output reaches a full disk only when flushed."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_stdout_that_fails_only_when_flushed_is_one_line_not_a_traceback(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _FullAtFlush())
    assert main([]) == 2  # (a flush's OSError left out: the OSError from main)
    assert capsys.readouterr().err.startswith(
        "pyrouq: error: cannot write to stdout (No space left on device); free space"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="Linux's /dev/full")
def test_a_real_full_disk_leaves_no_buffered_text_to_fail_again(monkeypatch, capsys):
    # `> /dev/full` with a real descriptor: the text left in the buffer failed again at the
    # interpreter's last flush (Python's "Exception ignored ... OSError"); the command points
    # the descriptor at the null device, so that flush writes it there
    full = open("/dev/full", "w", encoding="utf-8")  # (closed below)
    try:
        monkeypatch.setattr(sys, "stdout", full)
        assert main([]) == 2
        assert "cannot write to stdout (No space left on device)" in capsys.readouterr().err
        full.write("left in the buffer\n")
        full.flush()  # (was OSError: [Errno 28] No space left on device)
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            full.close()


def test_a_stdout_that_fills_up_while_the_run_is_evaluated_says_how_to_finish_it(
    monkeypatch, tmp_path, capsys
):
    full = _FillsUp(whole_line=True)
    monkeypatch.setattr(sys, "stdout", full)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "epoch 1:" in full.text and not (out / "metrics.json").exists()
    # (trained in full, the run was said to be held "after its last saved epoch", as if
    # --resume trained on: it only evaluates it)
    assert err.startswith(
        f"pyrouq: error: cannot write to stdout (No space left on device); the run stopped: "
        f"{out / 'checkpoint.pt'} holds the trained run (resume it to evaluate: pyrouq fit "
    )
    assert f"--out {out} --resume); free space on the disk stdout" in err
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert main([*argv, "--out", str(out), "--resume"]) == 0  # the advice, followed
    assert (out / "metrics.json").exists()
