"""Calls of :func:`pyrouq.predict`, :func:`pyrouq.to_inference_data`,
:func:`pyrouq.psis_diagnostic` and :func:`pyrouq.evaluate_rotations` from several threads run
one at a time: each call sets what the whole process shares while it runs (the model's and its
layers' ``training`` flags, Pyro's validation flags, and with ``seed=`` torch's global random
streams, seeded and forked) and puts it back after. Two threads predicting at once took each
other's values for their own: the first to finish put back what the second had set, leaving
the model in eval mode and Pyro's validation off for good, and a seeded call drew from a stream
the other call was seeding or advancing, its predictions no longer those of the seed."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])

_lock = threading.RLock()  # reentrant: predict(seed=) calls predict, to_inference_data too


def _new_lock() -> None:
    """In a forked child, a lock that no thread holds: a thread of the parent's that was
    predicting when it forked does not exist in the child, and would never release it."""
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_new_lock)


def one_at_a_time(fn: _F) -> _F:
    """``fn`` run under the process's lock: a second thread's call waits for the first's end
    (a call made inside a call, on the same thread, runs at once)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]
