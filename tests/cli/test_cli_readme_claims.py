"""Audit 9 of the docs: claims of the README checked against the code they describe.

* "The objective": N is ``fit()``'s ``num_data=`` where given, else the size of the loader's
  dataset, else the N the model was built with (the README had the first two the other way
  round);
* "Command line": the command an interrupted run prints to continue it is the one that
  started it with ``--resume`` and, for a run in the default folder, ``--out`` naming it;
  ``pyrouq`` with no subcommand prints its help and exits 0 (the README said only that bad
  input exits 2).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import torch
from _cli import CtrlCAt
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pyrouq
from pyrouq.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _fit_n(num_data_of_model, loader, **kwargs):
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(4, 3), num_data=num_data_of_model)
    guide = pyrouq.mean_field_guide(model)
    result = pyrouq.fit(model, guide, loader, epochs=1, progress=False, seed=0, **kwargs)
    return result.num_data, model.num_data


def test_num_data_given_to_fit_comes_first_then_the_dataset_then_the_models():
    x, y = torch.randn(32, 4), torch.arange(32) % 3
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    assert _fit_n(100, loader, num_data=1000) == (1000, 1000)  # fit's num_data= first
    assert _fit_n(100, loader) == (32, 32)  # then the loader's dataset, over the model's 100
    assert _fit_n(100, [(x[:8], y[:8])]) == (100, 100)  # a list of batches: the model's N


def test_an_interrupted_run_in_the_default_folder_prints_its_out_with_resume(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    argv = ["fit", "_cli:ctrl_c_net", "--epochs", "2", "--train-size"]
    argv += ["128", "--batch-size", "64", "--num-samples", "2", "--no-progress"]
    monkeypatch.setattr(CtrlCAt, "at", 3)  # inside epoch 2 (of 2 steps each)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted in epoch 2 after step 1; the partial run is saved" in err, err
    printed = err.split("(resume it: ")[1].rsplit(")", 1)[0]
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("_cli-ctrl_c_net-")
    out = str(run)  # absolute: the command works pasted in any folder
    assert printed == shlex.join(["pyrouq", *argv, "--out", out, "--resume"])
    monkeypatch.setattr(CtrlCAt, "at", 0)
    assert main(shlex.split(printed)[1:]) == 0  # the printed command finishes the run there
    assert json.loads((run / "metrics.json").read_text())["seed"] == 0
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [run.name]


def test_no_subcommand_prints_the_help_and_exits_0_as_the_readme_says(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: pyrouq ") and "{data,fit,evaluate}" in out and err == ""
    text = " ".join(README.read_text().split())
    assert (
        "`pyrouq` with no subcommand is no error: it prints its help on stdout and exits 0" in text
    )


def test_the_readme_says_what_the_calibrate_temperature_warnings_name(monkeypatch):
    # `--calibrate temperature`'s warnings name the command's options, not Python's names:
    # the README sentence saying so, checked against the words the command gives
    from dataclasses import astuple

    from pyrouq.cli._temperature_words import in_command_words

    text = " ".join(README.read_text().split())
    assert (
        "are worded in its own terms, not Python's (`val_targets`, `val_preds`): they name what "
        "its user can change, the test labels in `--data-root` (or `$PYROUQ_DATA`) they came "
        "from, `pyrouq fit --epochs`, a factory run's factory, or leaving `--calibrate` out."
    ) in text
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    words = " ".join(astuple(in_command_words("/data", "nets:f")))
    for name in ("--data-root '/data'", "pyrouq fit --epochs", "'nets:f'", "--calibrate out"):
        assert name in words, name
    assert "val_targets" not in words and "val_preds" not in words
    monkeypatch.setenv("PYROUQ_DATA", "/data")
    assert "test labels in $PYROUQ_DATA" in in_command_words(None, None).labels
