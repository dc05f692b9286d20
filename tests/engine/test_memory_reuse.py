"""glibc's freed memory kept for reuse while pyrouq trains or predicts on CPU
(``pyrouq._engine._memory_reuse``): ``PYROUQ_REUSE_MEMORY`` turns it off in the usual words,
and the malloc settings a user gave glibc in the environment are kept, inside and after."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from pyrouq._engine import _memory_reuse
from pyrouq._engine._memory_reuse import reuse_freed_memory

CPU = torch.device("cpu")
KIB_128 = 128 * 1024
MAX = 4 * 1024 * 1024 * 8  # glibc's grown mmap threshold on 64-bit (32 MiB)
TRIM, MMAP_THRESHOLD, MMAP_MAX = -1, -3, -4  # mallopt's parameters (malloc.h)


class _Libc:
    """A stand-in for glibc that records what is asked of it."""

    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))

    def malloc_trim(self, pad):
        self.calls.append(("trim", pad))


@pytest.fixture
def libc(monkeypatch):
    fake = _Libc()
    monkeypatch.setattr(_memory_reuse, "_glibc", lambda: fake)
    for name in ("PYROUQ_REUSE_MEMORY", "GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_",
                 "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TOP_PAD_"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    return fake


def _calls(libc):
    with reuse_freed_memory(CPU):
        inside = list(libc.calls)
    return inside, libc.calls[len(inside) :]


@pytest.mark.parametrize("value", ["0", "false", "No", " OFF "])
def test_the_usual_words_turn_the_reuse_off(value, libc, monkeypatch):
    # only "0" did: "false", "no", "off" kept it on
    monkeypatch.setenv("PYROUQ_REUSE_MEMORY", value)
    assert _calls(libc) == ([], [])


ON = (
    [(MMAP_MAX, 0), (TRIM, 1 << 30)],
    [(MMAP_MAX, 65536), (MMAP_THRESHOLD, MAX), (TRIM, 2 * MAX), ("trim", 0)],
)


@pytest.mark.parametrize("value", [None, "", "1", "on", " True ", "YES"])
def test_the_reuse_is_on_by_default_and_given_the_words_for_on(value, libc, monkeypatch):
    if value is not None:
        monkeypatch.setenv("PYROUQ_REUSE_MEMORY", value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _calls(libc) == ON


@pytest.mark.parametrize("value", ["flase", "2", "disable"])
def test_an_unknown_value_is_warned_of_and_leaves_the_reuse_on(value, libc, monkeypatch):
    # it left the reuse on unseen: a typo of "off" kept it on without a word
    monkeypatch.setenv("PYROUQ_REUSE_MEMORY", value)
    with pytest.warns(UserWarning, match=f"PYROUQ_REUSE_MEMORY='{value}' is not a value") as got:
        assert _calls(libc) == ON
    assert "0, false, no or off (any case) to turn the reuse off" in str(got[0].message)
    assert got[0].filename == __file__


def test_an_unknown_value_is_not_warned_of_where_no_reuse_is_made(libc, monkeypatch):
    monkeypatch.setenv("PYROUQ_REUSE_MEMORY", "flase")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with reuse_freed_memory(torch.device("meta")):
            pass
    assert libc.calls == []


@pytest.mark.parametrize(
    "variable, inside, after",
    [
        # the user's mmap threshold or maximum: mmap left alone; trim's static 128 KiB back
        ("MALLOC_MMAP_THRESHOLD_=4194304", [(TRIM, 1 << 30)], [(TRIM, KIB_128), ("trim", 0)]),
        ("MALLOC_MMAP_MAX_=0", [(TRIM, 1 << 30)], [(TRIM, KIB_128), ("trim", 0)]),
        ("GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304", [(TRIM, 1 << 30)],
         [(TRIM, KIB_128), ("trim", 0)]),
        # given empty, glibc still reads it (MALLOC_MMAP_THRESHOLD_= mmaps every block)
        ("MALLOC_MMAP_THRESHOLD_=", [(TRIM, 1 << 30)], [(TRIM, KIB_128), ("trim", 0)]),
        # the user's trim threshold: the heap trimmed as they set it, no malloc_trim
        ("MALLOC_TRIM_THRESHOLD_=131072", [(MMAP_MAX, 0)],
         [(MMAP_MAX, 65536), (MMAP_THRESHOLD, KIB_128)]),
        # a tunable after another one in GLIBC_TUNABLES (they are ':'-separated)
        ("GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=131072",
         [(MMAP_MAX, 0)], [(MMAP_MAX, 65536), (MMAP_THRESHOLD, KIB_128)]),
        # a top pad of theirs: both changed, and given back as glibc had them (no dynamic
        # threshold: 128 KiB, not the grown 32 MiB)
        ("MALLOC_TOP_PAD_=131072", [(MMAP_MAX, 0), (TRIM, 1 << 30)],
         [(MMAP_MAX, 65536), (MMAP_THRESHOLD, KIB_128), (TRIM, KIB_128), ("trim", 0)]),
    ],
)  # fmt: skip
def test_malloc_settings_of_the_users_environment_are_kept(
    variable, inside, after, libc, monkeypatch
):
    # on exit glibc's grown defaults were written back over them (32 MiB, 64 MiB)
    name, _, value = variable.partition("=")
    monkeypatch.setenv(name, value)
    assert _calls(libc) == (inside, after)


@pytest.mark.skipif(_memory_reuse._glibc() is None, reason="glibc's malloc only")
def test_an_mmap_threshold_set_in_the_environment_is_kept_by_glibc_inside_and_after():
    # glibc itself: with MALLOC_MMAP_THRESHOLD_=4 MiB an 8 MiB block is mmapped before,
    # inside and after; mmap was turned off inside, and 32 MiB written back on exit
    script = textwrap.dedent(
        """
        import ctypes
        import torch
        from pyrouq._engine._memory_reuse import reuse_freed_memory

        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]

        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd "
                        "usmblks fsmblks uordblks fordblks keepcost".split()]

        libc.mallinfo2.restype = Info

        def mmapped(size):
            before = libc.mallinfo2().hblks
            block = libc.malloc(size)
            taken = libc.mallinfo2().hblks > before
            libc.free(block)
            return taken

        print(mmapped(8 << 20), end=" ")
        with reuse_freed_memory(torch.device("cpu")):
            print(mmapped(8 << 20), end=" ")
        print(mmapped(8 << 20))
        """
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(4 << 20), "OMP_NUM_THREADS": "1"}
    env.pop("PYROUQ_REUSE_MEMORY", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    if "mallinfo2" in done.stderr:  # glibc before 2.33
        pytest.skip("no mallinfo2 in this glibc")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"], done.stdout
