"""The BatchEnsemble front doors' factor options survive a checkpoint, and files written before
they were recorded (or before the ``norms`` option) still load and resume."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pyrouq
from pyrouq import BatchEnsembleLeNet, BatchEnsembleMLP, fit, load, mean_field_guide, save

FACTORS = ("use_base_weights", "init", "r_mean", "r_std", "s_mean", "s_std")
OPTIONS = dict(init="random_sign", r_mean=0.5, r_std=0.1, s_mean=2.0, s_std=0.25,
               use_base_weights=False)  # fmt: skip


def mlp(**options):
    return BatchEnsembleMLP(6, 5, 3, num_members=2, **options)


def lenet(**options):
    return BatchEnsembleLeNet(num_classes=3, num_members=2, **options)


DOORS = {"mlp": (mlp, (4, 6)), "lenet": (lenet, (4, 1, 28, 28))}


def loader_of(shape):
    torch.manual_seed(1)
    x, y = torch.randn(16, *shape[1:]), torch.randint(0, 3, (16,))
    return DataLoader(TensorDataset(x, y), batch_size=8)


def forget_keys(path, keys, where=lambda config: config):
    """The file at ``path`` as an older pyrouq wrote it: ``keys`` absent from its config."""
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    for key in keys:
        del where(description["model"]["config"])[key]
    payload["description"] = json.dumps(description)
    torch.save(payload, path)


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_front_door_checkpoint_keeps_its_factor_options_and_predictions(door, tmp_path):
    build, shape = DOORS[door]
    torch.manual_seed(0)
    model = build(**OPTIONS).eval()
    for key, value in OPTIONS.items():
        assert model.config[key] == value
    back = load(save(tmp_path / "m.pt", model)).model
    assert back.config == model.config
    assert back.options == model.options
    assert {k: back.options[k] for k in OPTIONS} == OPTIONS  # not the defaults
    saved = json.loads(torch.load(tmp_path / "m.pt", weights_only=True)["description"])
    assert {k: saved["model"]["config"][k] for k in OPTIONS} == OPTIONS
    x = torch.randn(shape)
    assert torch.equal(back(x), model(x))


@pytest.mark.parametrize("door", sorted(DOORS))
def test_the_defaults_give_the_config_of_before_with_the_factor_options_added(door):
    build, _ = DOORS[door]
    config = build().config
    before = {"mlp": dict(in_features=6, hidden_features=5, out_features=3, num_hidden=1),
              "lenet": dict(in_channels=1, num_classes=3)}[door]  # fmt: skip
    assert config == {**before, "use_base_weights": True, "init": "normal", "r_mean": 1.0,
                      "r_std": 0.5, "s_mean": 1.0, "s_std": 0.5}  # fmt: skip
    assert build(**{**OPTIONS, "r_std": 1}).config["r_std"] == 1.0  # JSON's float


def test_the_converted_path_keeps_its_options_through_a_checkpoint(tmp_path):
    """batchensemble(MLP(), M, ...) is the front door: module= is not needed, nor used."""
    torch.manual_seed(0)
    model = pyrouq.batchensemble(pyrouq.MLP(6, 5, 3), 2, init="random_sign", r_std=0.2).eval()
    path = save(tmp_path / "m.pt", model)
    with pytest.warns(UserWarning, match="module= skeleton .* is not used"):
        back = load(path, module=pyrouq.MLP(6, 5, 3)).model
    assert (back.options["init"], back.options["r_std"]) == ("random_sign", 0.2)
    assert back.config == model.config
    x = torch.randn(4, 6)
    assert torch.equal(back(x), model(x))


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_checkpoint_from_before_the_factor_options_loads_and_resumes(door, tmp_path):
    """A file written before the front doors recorded their factor options loads with the
    defaults of then, and resumes with no complaint about its configuration, whatever options
    the resuming model was built with (the file does not say which the run had)."""
    build, shape = DOORS[door]
    path = tmp_path / "run.pt"
    torch.manual_seed(0)
    model = build(r_std=0.1)
    fit(model, None, loader_of(shape), epochs=1, progress=False, seed=0, checkpoint=path)
    forget_keys(path, FACTORS)
    back = load(path).model
    assert {k: back.config[k] for k in FACTORS} == {"use_base_weights": True, "init": "normal",
        "r_mean": 1.0, "r_std": 0.5, "s_mean": 1.0, "s_std": 0.5}  # fmt: skip
    x = torch.randn(shape)
    assert torch.equal(back(x), model.eval()(x))
    for options in ({}, {"r_std": 0.1}):
        resumed = build(**options)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fit(resumed, None, loader_of(shape), epochs=2, progress=False, resume_from=path)
        assert resumed.options["r_std"] == options.get("r_std", 0.5)
        loaded = build()  # a Checkpoint from load() resumes as its file does
        fit(loaded, None, loader_of(shape), epochs=2, progress=False, resume_from=load(path))


def test_a_new_checkpoint_refuses_a_resume_with_other_factor_options(tmp_path):
    path = tmp_path / "run.pt"
    _, shape = DOORS["mlp"]
    fit(mlp(r_std=0.1), None, loader_of(shape), epochs=1, progress=False, checkpoint=path)
    with pytest.raises(pyrouq.CheckpointError, match=r"config\['r_std'\] is 0.1 there and 0.5"):
        fit(mlp(), None, loader_of(shape), epochs=2, progress=False, resume_from=path)
    fit(mlp(r_std=0.1), None, loader_of(shape), epochs=2, progress=False, resume_from=path)


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.ReLU(), nn.Linear(5, 3))


@pytest.mark.parametrize("kind", ["batchensemble", "rank1"])
def test_a_checkpoint_from_before_the_norms_option_resumes(kind, tmp_path):
    """Such a file loads with shared norms (as its pyrouq built it); resuming it was refused
    with "config['norms'] is absent there and "shared" in the model", which no model fixes."""

    def build():
        if kind == "batchensemble":
            return pyrouq.batchensemble(net(), 2, norms="shared"), None
        model = pyrouq.rank1(net(), 2)
        return model, mean_field_guide(model)

    path = tmp_path / "run.pt"
    model, guide = build()
    fit(model, guide, loader_of((4, 6)), epochs=1, progress=False, seed=0, checkpoint=path)
    forget_keys(
        path, ["norms"], (lambda c: c) if kind == "batchensemble" else lambda c: c["ensemble"]
    )
    model, guide = build()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(model, guide, loader_of((4, 6)), epochs=2, progress=False, resume_from=path)
    per_member = pyrouq.batchensemble(net(), 2) if kind == "batchensemble" else None
    if per_member is not None:  # the members did share them: per-member norms are refused
        with pytest.raises(pyrouq.CheckpointError, match=r"config\['norms'\] is \"shared\""):
            fit(per_member, None, loader_of((4, 6)), epochs=2, progress=False, resume_from=path)
