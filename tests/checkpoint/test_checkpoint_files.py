"""Checkpoint files: the mode save() gives a new file, without touching the process umask."""

from __future__ import annotations

import os
import stat

import pytest
from torch import nn

import pyrouq
from pyrouq import Gaussian, bayesian


@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o077, 0o600)])
def test_save_gives_a_new_file_the_umask_mode_without_touching_the_umask(
    tmp_path, monkeypatch, umask, expected
):
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
    real_umask = os.umask

    def no_umask(mask):  # reading the umask sets it: for an instant 0 for every thread
        raise AssertionError(f"save() called os.umask({mask:#o})")

    before = real_umask(umask)
    try:
        monkeypatch.setattr(os, "umask", no_umask)
        path = pyrouq.save(tmp_path / "new.pt", model)
        assert stat.S_IMODE(os.stat(path).st_mode) == expected
        os.chmod(path, 0o640)  # a file replaced keeps its own mode
        pyrouq.save(path, model)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
        assert [p.name for p in tmp_path.iterdir()] == ["new.pt"]  # no temporary file left
    finally:
        monkeypatch.undo()
        real_umask(before)
