"""The command's output on a terminal or file that cannot encode every character: its tables'
box drawing as ASCII, a file name's undecodable bytes as they were, anything else as ``?``,
never a UnicodeEncodeError."""

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
