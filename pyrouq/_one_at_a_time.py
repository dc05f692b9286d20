"""Calls of :func:`pyrouq.predict`, :func:`pyrouq.to_inference_data`,
:func:`pyrouq.psis_diagnostic` and :func:`pyrouq.evaluate_rotations` from several threads run
one at a time: each call sets what the whole process shares while it runs (the model's and its
layers' ``training`` flags, Pyro's validation flags, and with ``seed=`` torch's global random
streams, seeded and forked) and puts it back after. Two threads predicting at once took each
other's values for their own: the first to finish put back what the second had set, leaving
the model in eval mode and Pyro's validation off for good, and a seeded call drew from a stream
the other call was seeding or advancing, its predictions no longer those of the seed.

A call that another thread's call waits on never ends (a loader passed to predict() that
makes its batches with predict() on a thread of its own, prefetching a teacher's labels): a
call kept waiting :data:`PATIENCE` seconds warns, saying so, then goes on waiting."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyrouq._util import warn_caller

_F = TypeVar("_F", bound=Callable[..., Any])

_lock = threading.RLock()  # reentrant: predict(seed=) calls predict, to_inference_data too

PATIENCE = 60.0
"""Seconds a call waits for another thread's before it warns that it is waiting."""


def _new_lock() -> None:
    """In a forked child, a lock that no thread holds: a thread of the parent's that was
    predicting when it forked does not exist in the child, and would never release it."""
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_new_lock)


def _warn_waiting(name: str) -> None:
    warn_caller(
        f"{name}() has waited {PATIENCE:g} s for a call of predict(), to_inference_data(), "
        "psis_diagnostic() or evaluate_rotations() on another thread to end: these run one "
        "at a time in a process. If that call waits on this thread (its loader makes its "
        "batches with predict() on a thread of its own), neither ends: make those predictions "
        "on the thread of the call that reads them (a call inside a call runs at once), or "
        "before it.",
        RuntimeWarning,
    )


def one_at_a_time(fn: _F) -> _F:
    """``fn`` run under the process's lock: a second thread's call waits for the first's end
    (a call made inside a call, on the same thread, runs at once)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        lock = _lock  # (the one released below, were a fork to renew it meanwhile)
        if not lock.acquire(timeout=PATIENCE):
            _warn_waiting(fn.__name__)
            lock.acquire()
        try:
            return fn(*args, **kwargs)
        finally:
            lock.release()

    return call  # type: ignore[return-value]
