"""pyrouq's progress bars: tqdm's, drawn on stderr, and off where the process has none."""

from __future__ import annotations

import sys
from typing import Any


def tqdm(*args: Any, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)``, disabled where ``sys.stderr`` is None (a script run
    with its stderr closed, ``python train.py 2>&-``, a daemon, Windows' ``pythonw``): tqdm
    writes there, and fit() and mcmc() ended in AttributeError "'NoneType' object has no
    attribute 'write'" at their first bar."""
    from tqdm.auto import tqdm as bar

    if sys.stderr is None and kwargs.get("file") is None:
        kwargs["disable"] = True
    return bar(*args, **kwargs)
