"""Checkpoint files and runs: the mode save() gives a new file (without touching the process
umask), and resuming a run whose likelihood has a setting it does not use (a fixed-noise
Gaussian's min_scale)."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from _toy import StopAfter
from torch import nn

import pyrouq
from pyrouq import (
    ArrayLoader,
    Gaussian,
    TrainingInterrupted,
    bayesian,
    fit,
    mean_field_guide,
)
from pyrouq.checkpoint import CheckpointError


@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
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


def _run(tmp_path, scale, min_scale, epochs, **kwargs):
    torch.manual_seed(0)
    x = torch.randn(24, 2)
    y = x @ torch.tensor([[1.5], [-0.5]]) + 0.2 * torch.randn(24, 1)
    out = 2 if scale == "heteroscedastic" else 1
    model = bayesian(nn.Linear(2, out), likelihood=Gaussian(scale, min_scale=min_scale))
    guide = mean_field_guide(model)
    loader = ArrayLoader(x, y, batch_size=8, seed=0)
    return fit(model, guide, loader, epochs=epochs, progress=False, seed=0, **kwargs)


def test_resume_ignores_the_min_scale_of_a_fixed_noise_gaussian(tmp_path):
    full = _run(tmp_path, 0.3, 1e-3, epochs=3)
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted, match="interrupted at the end of epoch 2"):
        _run(tmp_path, 0.3, 1e-3, epochs=3, checkpoint=path, callbacks=[StopAfter(2)])
    # min_scale floors heteroscedastic scales only: another one leaves this run the same
    resumed = _run(tmp_path, 0.3, 1e-2, epochs=3, resume_from=path)
    assert [h.loss for h in resumed.history] == [h.loss for h in full.history]
    assert resumed.steps == full.steps == 9


def test_resume_still_compares_the_min_scale_of_a_heteroscedastic_gaussian(tmp_path):
    path = tmp_path / "run.pt"
    _run(tmp_path, "heteroscedastic", 1e-3, epochs=1, checkpoint=path)
    with pytest.raises(
        CheckpointError,
        match=r"of another config: config\['likelihood'\]\['min_scale'\] is 0\.001 there and "
        r"0\.01 in the model\. Rebuild the model with the saved arguments\.",
    ):
        _run(tmp_path, "heteroscedastic", 1e-2, epochs=2, resume_from=path)
    fixed = tmp_path / "fixed.pt"  # a fixed noise's own scale is compared too
    _run(tmp_path, 0.3, 1e-3, epochs=1, checkpoint=fixed)
    with pytest.raises(CheckpointError, match=r"\['scale'\] is 0\.3 there and 0\.4 in the model"):
        _run(tmp_path, 0.4, 1e-2, epochs=2, resume_from=fixed)
