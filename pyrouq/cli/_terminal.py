"""The command's output on a terminal or file that cannot encode every character: its tables'
box drawing as ASCII, anything else as ``?``, never a UnicodeEncodeError."""

from __future__ import annotations

import codecs
import contextlib
import io
import sys
from collections.abc import Iterator

#: The characters the command prints beyond ASCII (its tables, the rotation table's degrees),
#: each as one ASCII character, so that the columns stay aligned.
_ASCII = str.maketrans(dict.fromkeys("┌┬┐├┼┤└┴┘", "+") | {"─": "-", "│": "|", "°": " "})
_HANDLER = "pyrouq-ascii"


def _replace(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    text = err.object[err.start : err.end].translate(_ASCII)
    return "".join(c if c.isascii() else "?" for c in text), err.end


codecs.register_error(_HANDLER, _replace)


@contextlib.contextmanager
def printable_streams() -> Iterator[None]:
    """While a command runs, stdout and stderr write what their encoding cannot hold (the
    tables' box drawing under ``PYTHONIOENCODING=ascii``, a Latin-1 locale, or a Windows
    console redirected to a cp1252 file) in ASCII instead of raising: a finished training
    ended in ``pyrouq: error: 'ascii' codec can't encode characters``, its metrics and
    plots unwritten. The streams' error handlers are put back after."""
    changed: list[tuple[io.TextIOWrapper, str]] = []
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            with contextlib.suppress(Exception):  # a detached or closed stream: as it is
                stream.reconfigure(errors=_HANDLER)
                changed.append((stream, "strict"))
    try:
        yield
    finally:
        for stream, errors in changed:
            with contextlib.suppress(Exception):
                stream.reconfigure(errors=errors)
