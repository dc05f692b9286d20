"""Review of the loader batch size a checkpoint records and the draws the engine copies: a
loader of one's own whose ``batch_size`` is numpy's (read from a config or an array) has it
recorded and compared on resume, as a Python int's is."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _toy import ListLoader
from torch import nn

from pyrouq import bayesian, fit, mean_field_guide


class _SizedBatches(ListLoader):
    """A loader of one's own: a list of batches that tells its batch size as given."""

    def __init__(self, x, y, batch_size):
        super().__init__(x, y, int(batch_size))
        self.batch_size = batch_size


def _run(batch_size, path, **kw):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g)
    model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=16)
    loader = _SizedBatches(x, y, batch_size)
    fit(model, mean_field_guide(model), loader, progress=False, seed=0, checkpoint=path, **kw)


@pytest.mark.parametrize("kind", [np.int64, np.int32])
def test_a_numpy_batch_size_is_recorded_and_compared_on_resume(tmp_path, kind):
    # it was recorded as 0 (told none), so a resume with batches of 7 where the run took 6
    # (16 rows: 3 batches an epoch either way) went on without a word
    path = tmp_path / "run.pt"
    _run(kind(6), path, epochs=1)
    recorded = torch.load(path, weights_only=True)["training"]["batch_size"]
    assert (recorded, type(recorded)) == (6, int)
    with pytest.warns(
        UserWarning,
        match=r"continues a run of batch size 6 with a loader of batch size 7: its steps see "
        r"other batches than the run's would have",
    ):
        _run(kind(7), tmp_path / "other.pt", epochs=2, resume_from=path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run(6, tmp_path / "same.pt", epochs=2, resume_from=path)
