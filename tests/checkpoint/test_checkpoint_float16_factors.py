"""Checkpoint audit 5: a float16 BatchEnsemble (or rank-1) saved with factor options that
today's construction check refuses for float16 still loads from a float16 skeleton, bit for
bit, and its saved options survive a second save."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pyrouq import batchensemble, load, rank1, save


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_float16_batchensemble_with_large_r_std_loads(tmp_path):
    torch.manual_seed(5)
    model = batchensemble(net(), 4, r_std=11000.0, s_mean=0.5).to(torch.float16).eval()
    save(tmp_path / "m.pt", model)
    back = load(tmp_path / "m.pt", module=net().half())
    saved, got = model.state_dict(), back.model.state_dict()
    assert saved.keys() == got.keys()
    assert all(torch.equal(saved[k], got[k]) and saved[k].dtype == got[k].dtype for k in saved)
    assert back.model.options == model.options
    save(tmp_path / "again.pt", back.model)
    assert (
        load(tmp_path / "again.pt", module=net()).description["model"]["config"]["r_std"] == 11000.0
    )


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_float16_rank1_with_large_r_std_loads(tmp_path):
    torch.manual_seed(5)
    model = rank1(net(), 4, r_std=11000.0) if "r_std" in rank1.__code__.co_varnames else None
    if model is None:
        model = rank1(net(), 4)
        model.ensemble_options["r_std"] = 11000.0
    model = model.to(torch.float16)
    save(tmp_path / "r.pt", model)
    back = load(tmp_path / "r.pt", module=net().half())
    assert back.model.ensemble_options == model.ensemble_options
    saved, got = model.state_dict(), back.model.state_dict()
    assert all(torch.equal(saved[k], got[k]) for k in saved)
