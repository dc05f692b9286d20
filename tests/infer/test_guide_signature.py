"""Self-review of the ninth day's change: the guide load() builds without start values no
longer shows its private switch in ``MeanFieldGuide``'s public signature (it was a ``_values``
argument), and leaves nothing of it on the guide."""

from __future__ import annotations

import inspect

import torch

from pyrouq import BayesianMLP, MeanFieldGuide, load, mean_field_guide, save


def test_the_guide_signature_shows_its_public_arguments_only():
    names = list(inspect.signature(MeanFieldGuide).parameters)
    assert names == ["model", "init_scale", "init_from", "init_scale_relative"]


def test_a_loaded_guide_keeps_no_flag_and_holds_the_saved_state(tmp_path):
    model = BayesianMLP(4, 8, 3)
    guide = mean_field_guide(model)
    save(tmp_path / "run.pt", model, guide)
    loaded = load(tmp_path / "run.pt").guide
    assert type(loaded) is MeanFieldGuide
    assert not [key for key in vars(loaded) if "load_fills" in key]
    saved, got = guide.state_dict(), loaded.state_dict()
    assert saved.keys() == got.keys()
    assert all(torch.equal(saved[k], got[k]) for k in saved)
    built = MeanFieldGuide(model)  # a guide built afterwards has its start values
    assert torch.equal(built.site_loc("fc1.weight"), model.template()["fc1.weight"])
