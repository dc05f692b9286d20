"""pyrouq's progress bars: tqdm's, drawn on stderr, and off where the process has none; and a
line printed on stdout beside them."""

from __future__ import annotations

import sys
from typing import Any


def tqdm(*args: Any, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled where ``sys.stderr`` is None (a script run
    with its stderr closed, ``python train.py 2>&-``, a daemon, Windows' ``pythonw``) or a
    closed or detached stream: tqdm writes there, and fit() and mcmc() ended in
    AttributeError "'NoneType' object has no attribute 'write'" (ValueError "I/O operation
    on closed file") at their first bar.

    Where ``sys.stderr`` is no terminal (a Jupyter notebook without ipywidgets, a log file),
    a bar given no ``position`` is drawn on the first line (``position=0``), redrawn there in
    place: tqdm puts a bar opened while another is shown (a predict() in a fit() callback, a
    fit() inside one's own tqdm loop) on the line below, reached by a cursor move (ESC [A)
    that a notebook does not follow, so each of its redraws would be a new line in the cell. On a
    terminal tqdm places it as it does."""
    from tqdm.auto import tqdm as bar

    if kwargs.get("file") is None:
        if not _writable(sys.stderr):
            kwargs["disable"] = True
        elif kwargs.get("position") is None and not _terminal(sys.stderr):
            kwargs["position"] = 0
    return bar(*args, **kwargs)


def _terminal(stream: Any) -> bool:
    """Whether ``stream`` (a writable one) is a terminal; a stream of the user's own without
    ``isatty`` is taken as none."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _writable(stream: Any) -> bool:
    """Whether ``stream`` can take a bar: not None, nor closed (a stream without ``closed``,
    of the user's own, is taken as open)."""
    try:
        return stream is not None and not getattr(stream, "closed", False)
    except ValueError:  # a detached TextIOWrapper: "underlying buffer has been detached"
        return False


def write(line: str) -> None:
    """Print ``line`` on ``sys.stdout`` beside pyrouq's bars, which stay intact: tqdm's own
    write clears a bar drawn on the same terminal, prints the line and draws the bar again
    below it (a print() would break the bar's line in two); then stdout is flushed, so a log
    file or a pipe gets the line at once, not when its buffer fills. Nothing where the process
    has no stdout (``>&-``: print() drops it too)."""
    from tqdm.auto import tqdm as bar

    if sys.stdout is None:
        return
    bar.write(line, file=sys.stdout)
    sys.stdout.flush()
