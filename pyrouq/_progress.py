"""pyrouq's progress bars: tqdm's, drawn on stderr, and off where the process has none."""

from __future__ import annotations

import sys
from typing import Any


def tqdm(*args: Any, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled where ``sys.stderr`` is None (a script run
    with its stderr closed, ``python train.py 2>&-``, a daemon, Windows' ``pythonw``) or a
    closed or detached stream: tqdm writes there, and fit() and mcmc() ended in
    AttributeError "'NoneType' object has no attribute 'write'" (ValueError "I/O operation
    on closed file") at their first bar."""
    from tqdm.auto import tqdm as bar

    if kwargs.get("file") is None and not _writable(sys.stderr):
        kwargs["disable"] = True
    return bar(*args, **kwargs)


def _writable(stream: Any) -> bool:
    """Whether ``stream`` can take a bar: not None, nor closed (a stream without ``closed``,
    of the user's own, is taken as open)."""
    try:
        return stream is not None and not getattr(stream, "closed", False)
    except ValueError:  # a detached TextIOWrapper: "underlying buffer has been detached"
        return False
