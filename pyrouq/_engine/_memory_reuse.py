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

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_GLIBC_MMAP_MAX = 65536  # glibc's default
# Any mallopt turns glibc's dynamic mmap threshold off for good (it grows with the blocks freed
# up to 32 MiB on 64-bit, the trim threshold twice that): on exit those are set, not its start
# (128 KiB: every block over it mmapped from then on, 4 MiB tensors allocated 6x slower).
_GLIBC_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 * ctypes.sizeof(ctypes.c_long)
_GLIBC_TRIM_THRESHOLD = 2 * _GLIBC_MMAP_THRESHOLD_MAX
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


@contextlib.contextmanager
def reuse_freed_memory(device: torch.device | None) -> Iterator[None]:
    """While inside, glibc keeps freed memory for reuse: no ``mmap`` for large blocks, no
    trimming of the heap; on exit the thresholds glibc's own adjustment grows to come back
    (32 MiB for mmap on 64-bit; setting any turns that adjustment off) and the free memory is
    returned to the system (``malloc_trim``). Large tensors then stop paying page faults at
    every step (``benchmarks/bench_byon.py``: a BatchEnsemble epoch of a residual CNN on CPU, see
    ``benchmarks/results.md``). Only on CPU under glibc; ``PYROUQ_REUSE_MEMORY=0`` in the
    environment turns it off."""
    global _reusing
    libc = _glibc()
    off = os.environ.get("PYROUQ_REUSE_MEMORY", "1") == "0"
    if libc is None or off or (device is not None and device.type != "cpu"):
        yield
        return
    if _reusing == 0:
        libc.mallopt(_M_MMAP_MAX, 0)
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    _reusing += 1
    try:
        yield
    finally:
        _reusing -= 1
        if _reusing == 0:
            libc.mallopt(_M_MMAP_MAX, _GLIBC_MMAP_MAX)
            libc.mallopt(_M_MMAP_THRESHOLD, _GLIBC_MMAP_THRESHOLD_MAX)
            libc.mallopt(_M_TRIM_THRESHOLD, _GLIBC_TRIM_THRESHOLD)
            libc.malloc_trim(0)
