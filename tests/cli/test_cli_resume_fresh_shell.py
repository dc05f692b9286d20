"""`pyrouq fit --resume`'s leftovers: the command an interrupted run prints (and `pyrouq
evaluate` of it) works pasted into a fresh shell in another folder: it names the data folder
that $PYROUQ_DATA gave, absolute paths for a relative --out / --data-root and each shortened
option once, in full; a run started on a default device that this machine lacks is refused
naming --device, which moves it; --num-samples (the evaluation's draws only) may differ."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from _cli import CtrlCAt, one_line_error

import pyrouq
from pyrouq.cli import main

FACTORY = "_cli:ctrl_c_net"
ARGV = ["fit", FACTORY, "--epochs", "2", "--train-size", "128", "--batch-size", "64"]
ARGV += ["--seed", "5", "--no-progress"]
DRAWS = ["--num-samples", "2"]
#: a folder in torchvision layout holding MNIST (the bundled copy's)
DATA = Path(pyrouq.__file__).resolve().parent / "_data"


@pytest.fixture(autouse=True)
def _no_data_variable(monkeypatch):
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    monkeypatch.setattr(CtrlCAt, "at", 0)


def _interrupted(monkeypatch, capsys, argv):
    """The run of argv stopped by Ctrl-C in epoch 2 (its 3rd step): the command it printed."""
    monkeypatch.setattr(CtrlCAt, "at", 3)
    assert main(argv) == 130
    err = capsys.readouterr().err
    monkeypatch.setattr(CtrlCAt, "at", 0)
    assert "interrupted in epoch 2 after step 1" in err
    return err.split("(resume it: ")[1].rsplit(")", 1)[0]


def _finished(run):
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["seed"] == 5
    return metrics


def test_a_run_whose_data_came_from_pyrouq_data_resumes_in_a_fresh_shell(
    tmp_path, monkeypatch, capsys
):
    part = tmp_path / "part"
    monkeypatch.setenv("PYROUQ_DATA", str(DATA))
    printed = _interrupted(monkeypatch, capsys, [*ARGV, *DRAWS, "--out", str(part)])
    want = ["pyrouq", *ARGV, *DRAWS, "--out", str(part), "--data-root", str(DATA), "--resume"]
    assert printed == shlex.join(want)
    # a fresh shell: no variable; the command typed again is refused, naming the printed one
    monkeypatch.delenv("PYROUQ_DATA")
    err = one_line_error(capsys, [*ARGV, *DRAWS, "--out", str(part), "--resume"])
    assert f"(data_root {json.dumps(str(DATA))} there, null now); run the recorded" in err
    assert err.endswith(f"--resume: {printed}\n")
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(printed)[1:]) == 0
    _finished(part)
    assert json.loads((part / "config.json").read_text())["data_root"] == str(DATA)


def test_a_bundled_run_resumed_under_pyrouq_data_is_told_to_unset_it(tmp_path, monkeypatch, capsys):
    part = tmp_path / "part"
    printed = _interrupted(monkeypatch, capsys, [*ARGV, *DRAWS, "--out", str(part)])
    monkeypatch.setenv("PYROUQ_DATA", str(DATA))
    err = one_line_error(capsys, shlex.split(printed)[1:])
    assert (
        f"(data_root null there, {json.dumps(str(DATA))} now) (the run read the bundled copy; "
        "$PYROUQ_DATA names a folder now: unset it); run the recorded command" in err
    )


def test_the_command_evaluate_prints_works_from_another_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "data").symlink_to(DATA)
    monkeypatch.chdir(tmp_path)
    relative = [*ARGV, *DRAWS, "--out", "part", "--data-root", "data"]
    printed = _interrupted(monkeypatch, capsys, relative)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["evaluate", "../part", "--no-progress"]) == 0
    out = capsys.readouterr().out
    said = out.split("resume the training: ")[1].split(")\n")[0]
    part, data = str(tmp_path / "part"), str(tmp_path / "data")
    assert said == shlex.join(["pyrouq", *ARGV, *DRAWS, "--out", part, "--data-root", data,
                               "--resume"])  # fmt: skip
    assert printed == said  # fit's own message names them so too
    assert main(shlex.split(said)[1:]) == 0
    _finished(tmp_path / "part")


def test_shortened_options_are_written_in_full_and_once(tmp_path, monkeypatch, capsys):
    part = tmp_path / "part"
    argv = [*ARGV, "--num-s", "2", "--ou", str(part), "--data-r=" + str(DATA), "--overw"]
    printed = _interrupted(monkeypatch, capsys, argv)
    want = [*ARGV, "--num-samples", "2", "--out", str(part), "--data-root=" + str(DATA)]
    assert printed == shlex.join(["pyrouq", *want, "--resume"])
    assert main([*shlex.split(printed)[1:]]) == 0
    _finished(part)


def test_a_default_device_that_differs_is_refused_naming_device_which_moves_the_run(
    tmp_path, monkeypatch, capsys
):
    part = tmp_path / "part"
    printed = _interrupted(monkeypatch, capsys, [*ARGV, *DRAWS, "--out", str(part)])
    # as a run started on a GPU by default records itself (this machine has none)
    config = json.loads((part / "config.json").read_text())
    assert config["device"] == "cpu"
    (part / "config.json").write_text(json.dumps({**config, "device": "cuda"}))
    err = one_line_error(capsys, shlex.split(printed)[1:])
    assert err == (
        f"pyrouq: error: --resume: the run in {str(part)!r} trained on cuda, but this command "
        "(no --device) would train it on cpu, this machine's default; resume it where cuda is "
        "available, or pass --device cpu to go on on cpu (the weights and training state load "
        "on any device, but the later steps then differ from the uninterrupted run's)\n"
    )
    # --device moves it; --num-samples left out is the run's own
    no_draws = [*ARGV, "--out", str(part), "--resume", "--device", "cpu"]
    assert main(no_draws) == 0
    config = json.loads((part / "config.json").read_text())
    assert (config["device"], config["num_samples"]) == ("cpu", 2)
    assert config["command"] == shlex.join(["pyrouq", *ARGV, *DRAWS, "--out", str(part),
                                            "--device", "cpu"])  # fmt: skip
    saved = pyrouq.load(part / "checkpoint.pt", module=CtrlCAt())
    assert saved.metadata["config"] == config | {"versions": saved.metadata["config"]["versions"]}


def test_another_num_samples_is_taken_on_resume_and_evaluate_repeats_it(
    tmp_path, monkeypatch, capsys
):
    part = tmp_path / "part"
    printed = _interrupted(monkeypatch, capsys, [*ARGV, *DRAWS, "--out", str(part)])
    words = shlex.split(printed)[1:]
    words[words.index("--num-samples") + 1] = "3"
    assert main(words) == 0
    config = json.loads((part / "config.json").read_text())
    assert config["num_samples"] == 3
    assert config["command"] == shlex.join(["pyrouq", *ARGV, "--num-samples", "3", "--out",
                                            str(part)])  # fmt: skip
    fitted = _finished(part)
    capsys.readouterr()
    # evaluate with the run's own draws (config.json's) and with 3 given: fit's figures
    for extra in ([], ["--num-samples", "3"]):
        assert main(["evaluate", str(part), "--no-progress", *extra]) == 0
        again = json.loads((part / "metrics-evaluate.json").read_text())
        for key in ("acc", "nll", "ece", "mutual_information"):
            assert again[key] == fitted[key], (extra, key)
    assert main(["evaluate", str(part), "--no-progress", "--num-samples", "2"]) == 0
    other = json.loads((part / "metrics-evaluate.json").read_text())
    assert other["mutual_information"] != fitted["mutual_information"]
