"""The command's output on a terminal or file that cannot encode every character: its tables'
box drawing as ASCII, a file name's undecodable bytes as they were, anything else as ``?``,
never a UnicodeEncodeError; on a stdout or stderr whose reader has gone (``| head -1``),
nothing, never a BrokenPipeError that stops the command before it writes its files; and on one
that cannot be written (``> /dev/full``, a full disk), one line, not an OSError's traceback."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any

#: The characters the command prints beyond ASCII (its tables, the rotation table's degrees),
#: each as one ASCII character, so that the columns stay aligned.
_ASCII = str.maketrans(dict.fromkeys("┌┬┐├┼┤└┴┘", "+") | {"─": "-", "│": "|", "°": " "})
_HANDLER = "pyrouq-ascii"


def _replace(err: UnicodeError) -> tuple[str | bytes, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    text = err.object[err.start : err.end]
    if all("\udc80" <= c <= "\udcff" for c in text):  # a file name's undecodable bytes
        return codecs.lookup_error("surrogateescape")(err)  # (written back as they were)
    return "".join(c if c.isascii() else "?" for c in text.translate(_ASCII)), err.end


codecs.register_error(_HANDLER, _replace)


@contextlib.contextmanager
def printable_streams() -> Iterator[None]:
    """While a command runs, stdout and stderr write what their encoding cannot hold (the
    tables' box drawing under ``PYTHONIOENCODING=ascii``, a Latin-1 locale or a C one with
    ``PYTHONUTF8=0``, or a Windows console redirected to a cp1252 file) in ASCII instead of
    raising: a finished training ended in ``pyrouq: error: 'ascii' codec can't encode
    characters``, its metrics and plots unwritten. The streams' error handlers are put back
    after."""
    changed: list[tuple[io.TextIOWrapper, str]] = []
    for stream in (sys.stdout, sys.stderr):
        errors = getattr(stream, "errors", None)  # surrogateescape: stdout in a C locale
        if isinstance(stream, io.TextIOWrapper) and errors in ("strict", "surrogateescape"):
            with contextlib.suppress(Exception):  # a detached or closed stream: as it is
                stream.reconfigure(errors=_HANDLER)
                changed.append((stream, errors))
    try:
        yield
    finally:
        for stream, errors in changed:
            with contextlib.suppress(Exception):
                stream.reconfigure(errors=errors)


class OutputFailed(Exception):
    """A write to stdout or stderr failed other than by a reader gone (``> /dev/full``): the
    command stops, and :func:`pyrouq.cli.main` says so in one line (:func:`output_failure`).
    Not an OSError, which the run folder's writes report as theirs. ``kept`` says what the
    stopped run left (set by ``pyrouq fit``: its checkpoint and the command resuming it)."""

    kept: str = ""


class _Closable:
    """``sys.stdout`` or ``sys.stderr`` while a command runs: once the reader of its pipe has
    gone (``pyrouq fit MODEL 2>&1 | head -1``), what is printed is dropped instead of raising
    :class:`BrokenPipeError`, so that the command goes on and writes its run's files; the
    stream's descriptor is pointed at the null device, as Python's "Note on SIGPIPE" does, so
    that the text left in its buffer is not an error at the last flush either. What the
    stream's ``write`` returns is passed on as it is (a caller's own stream may return None)."""

    def __init__(self, stream: Any, name: str = "stdout") -> None:
        self._stream = stream
        self.name = name
        self.reader_gone = False
        self.failed: OSError | None = None  # a write that failed otherwise (a full disk)

    def write(self, text: str) -> Any:
        if not self.reader_gone and self.failed is None:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
            except OSError as err:
                self._fail(err)
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone and self.failed is None:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()
            except OSError as err:
                self._fail(err)

    def _fail(self, err: OSError) -> None:
        """Drop what follows (and the text left in the buffer); a stdout stops the command, a
        stderr (progress bars, warnings: Python drops a warning it cannot write) does not, and
        the command, its files written, exits with 2."""
        self.failed = err
        self._to_null()
        if self.name == "stdout":
            raise OutputFailed(self.name) from err

    def _gone(self) -> None:
        self.reader_gone = True
        self._to_null()

    def _to_null(self) -> None:
        with contextlib.suppress(Exception):  # a stream without a descriptor: dropped as is
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno, ...: the stream's
        return getattr(self._stream, name)


class _NoStderr:
    """``sys.stderr`` while a command runs in a process without one (``2>&-``): what is
    written is dropped, and it reads as closed, so that no progress bar is drawn on it."""

    closed = True

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def closable_streams() -> Iterator[list[_Closable]]:
    """While a command runs, a closed stdout or stderr (its reader gone) silences what the
    command prints there instead of stopping it; the ``reader_gone`` of what it yields (one
    per stream: none where the process has no such stream, ``>&-``) says whether that
    happened (checked at a last flush). Where the process has no stderr (``2>&-``, so
    ``sys.stderr`` is None), what the command prints there is dropped (:class:`_NoStderr`):
    ``print(..., file=None)`` would write its error lines on stdout, into the run's output.
    The streams are put back after."""
    wrapped: list[tuple[str, Any, _Closable]] = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None:
            wrapped.append((name, stream, _Closable(stream, name)))
            setattr(sys, name, wrapped[-1][2])
    none = sys.stderr is None  # (no stdout: print() itself drops what goes there)
    if none:
        sys.stderr = _NoStderr()
    try:
        yield [closable for _, _, closable in wrapped]
    finally:
        if none and isinstance(sys.stderr, _NoStderr):
            sys.stderr = None
        for name, stream, closable in wrapped:
            with contextlib.suppress(ValueError, OutputFailed):  # closed by its owner: as it
                closable.flush()  # is; failed: its .failed says so
            if getattr(sys, name) is closable:
                setattr(sys, name, stream)


def output_failure(streams: list[_Closable], kept: str = "") -> str | None:
    """The one line that says a write to stdout or stderr failed (``> /dev/full``: "No space
    left on device"), with ``kept`` (what a run stopped by it left), or None where none did."""
    failed = [stream for stream in streams if stream.failed is not None]
    if not failed:
        return None
    stream = failed[0]
    why = stream.failed.strerror if stream.failed is not None else None
    return (
        f"pyrouq: error: cannot write to {stream.name} ({why or stream.failed}); "
        f"{kept + '; ' if kept else ''}free space "
        f"on the disk {stream.name} is redirected to, or send it elsewhere (> another file, "
        "or > /dev/null)."
    )
