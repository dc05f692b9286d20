"""Freed memory kept for reuse under glibc while pyrouq trains or predicts on CPU
(:func:`reuse_freed_memory`, one of the engine's CPU fast paths: see :mod:`pyrouq._engine`),
kept while ``benchmarks/`` shows that it pays."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
from collections.abc import Iterator
from typing import Any

import torch

from pyrouq._util import warn_caller

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_GLIBC_MMAP_MAX = 65536  # glibc's default
_GLIBC_STATIC_THRESHOLD = 128 * 1024  # glibc's mmap and trim thresholds, as they start
# A mallopt of the mmap maximum or threshold, the trim threshold or the top pad (even to glibc's
# own value) turns glibc's dynamic mmap threshold off for the rest of the process (it grows with
# the mmapped blocks freed, up to 32 MiB on 64-bit, the trim threshold with it to twice that): on
# exit those ceilings are set, not its start (128 KiB, static from then on: every block over it
# mmapped and faulted in anew, a 4 MiB torch.ones 1.6-3.6 ms against 46-91 us on an AMD EPYC).
_GLIBC_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)
_GLIBC_TRIM_THRESHOLD = 2 * _GLIBC_MMAP_THRESHOLD_MAX
# What a user may set glibc's malloc with before the process starts: an environment variable
# (glibc's alias) or its tunable in GLIBC_TUNABLES; any of them turns the dynamic threshold off.
_USER_SETTINGS = {
    "trim": ("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
    "mmap_threshold": ("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    "mmap_max": ("MALLOC_MMAP_MAX_", "glibc.malloc.mmap_max"),
    "top_pad": ("MALLOC_TOP_PAD_", "glibc.malloc.top_pad"),
}
_OFF = ("0", "false", "no", "off")
"""The values of ``PYROUQ_REUSE_MEMORY`` that turn the reuse off (any case, spaces around)."""
_ON = ("", "1", "true", "yes", "on")
"""The values that leave it on, as it is unset; any other is warned of (and leaves it on)."""
_reusing = 0


@functools.cache
def _glibc() -> Any:
    """The C library when it is glibc (looked up once: ``libc_ver`` reads the interpreter's
    binary), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:  # pragma: no cover - no C library handle
        return None


def _set_by_user() -> set[str]:
    """The malloc settings of :data:`_USER_SETTINGS` that the environment gives glibc, which
    reads them as the process starts (a variable given at all, even empty, is read)."""
    tunables = os.environ.get("GLIBC_TUNABLES", "").split(":")
    given = {entry.partition("=")[0].strip() for entry in tunables if "=" in entry}
    return {
        name
        for name, (variable, tunable) in _USER_SETTINGS.items()
        if variable in os.environ or tunable in given
    }


def reuse_turned_off() -> bool:
    """Whether ``PYROUQ_REUSE_MEMORY`` turns the reuse off: ``0``, ``false``, ``no`` or
    ``off``, in any case. ``1``, ``true``, ``yes``, ``on`` or empty leave it on, as unset does;
    any other value is warned of (a typo of ``off`` would keep it on unseen) and leaves it on."""
    given = os.environ.get("PYROUQ_REUSE_MEMORY", "")
    value = given.strip().lower()
    if value not in _OFF + _ON:
        warn_caller(
            f"PYROUQ_REUSE_MEMORY={given!r} is not a value pyrouq knows, so freed memory is "
            "kept for reuse as when it is unset. Expected 0, false, no or off (any case) to turn "
            "the reuse off, or 1, true, yes or on to keep it on: set one of these, or unset it."
        )
    return value in _OFF


@contextlib.contextmanager
def reuse_freed_memory(device: torch.device | None) -> Iterator[None]:
    """While inside, glibc keeps freed memory for reuse: no ``mmap`` for large blocks, no
    trimming of the heap until 1 GiB is free at its top. Large tensors then stop paying page
    faults at every step (``benchmarks/bench_byon.py``: a BatchEnsemble epoch of a residual CNN
    on CPU, see ``benchmarks/results.md``). On exit mmap is allowed again, the free memory is
    returned to the system (``malloc_trim``) and the mmap and trim thresholds are set to the
    ceilings glibc's own dynamic adjustment grows them to (32 MiB and 64 MiB on 64-bit). They
    stay there: the ``mallopt`` calls turn that adjustment off for the rest of the process, so
    glibc's thresholds do not come back as they were (128 KiB at the start, grown as mmapped
    blocks are freed); blocks of up to 32 MiB stay in the heap from the first call on. Only on
    CPU under glibc; ``PYROUQ_REUSE_MEMORY=0`` (or ``false``, ``no``, ``off``) in the
    environment turns it off, ``1`` (or ``true``, ``yes``, ``on``) leaves it on, and another
    value is warned of and leaves it on.

    Settings a user gave glibc in the environment (``MALLOC_TRIM_THRESHOLD_``,
    ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_MMAP_MAX_``, ``MALLOC_TOP_PAD_``, or their
    ``GLIBC_TUNABLES``) are kept, inside and after: with a trim threshold of theirs the heap is
    trimmed as they set it, with an mmap threshold or maximum large blocks are mmapped as they
    set it. Any of them (the top pad too) turned glibc's dynamic adjustment off as the process
    started, its thresholds a static 128 KiB where not set: what pyrouq changes besides them
    comes back on exit as glibc had it (128 KiB)."""
    global _reusing
    libc = _glibc()
    if libc is None or (device is not None and device.type != "cpu") or reuse_turned_off():
        yield
        return
    users = _set_by_user()
    trim = "trim" not in users
    mmap = not users & {"mmap_threshold", "mmap_max"}
    if _reusing == 0:
        if mmap:
            libc.mallopt(_M_MMAP_MAX, 0)
        if trim:
            libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    _reusing += 1
    try:
        yield
    finally:
        _reusing -= 1
        if _reusing == 0:
            dynamic = not users  # glibc's adjustment was on: its grown thresholds, else 128 KiB
            if mmap:
                libc.mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
                threshold = _GLIBC_MMAP_THRESHOLD_MAX if dynamic else _GLIBC_STATIC_THRESHOLD
                libc.mallopt(_M_MMAP_THRESHOLD, threshold)
            if trim:
                threshold = _GLIBC_TRIM_THRESHOLD if dynamic else _GLIBC_STATIC_THRESHOLD
                libc.mallopt(_M_TRIM_THRESHOLD, threshold)
                libc.malloc_trim(0)
