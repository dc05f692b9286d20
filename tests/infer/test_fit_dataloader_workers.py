"""fit() over a DataLoader with worker processes, sixth audit: a run stopped by an error (a
batch refused for NaN inputs) keeps no worker process alive while its traceback is kept (as
Jupyter keeps the last one): the epoch's iterator was held by run()'s frame."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
from torch import nn

from pyrouq import bayesian, fit, mean_field_guide


class _NaNAt5(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        x = torch.full((3,), float("nan")) if i == 5 else torch.ones(3) * i / 16
        return x, torch.tensor(i % 3)


def test_a_stopped_run_keeps_no_dataloader_workers_alive():
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)))
    guide = mean_field_guide(model)
    before = set(multiprocessing.active_children())
    loader = torch.utils.data.DataLoader(_NaNAt5(), 2, num_workers=1)
    with pytest.raises(ValueError, match="NaN") as info:
        fit(model, guide, loader, epochs=1, progress=False)
    kept = info.value.__traceback__  # noqa: F841 (what Jupyter keeps)
    left = [p for p in multiprocessing.active_children() if p not in before]
    assert left == []
