"""`pyrouq fit ... --resume`: an interrupted run of the command is continued by the command it
prints (it told the user to go to Python before), and ends where the uninterrupted run ends,
to the bit; --resume of another run, of a finished one or without a folder is refused."""

from __future__ import annotations

import gc
import json
import shlex
import weakref

import pytest
import torch
from _cli import CtrlCAt, one_line_error

import pyrouq
from pyrouq import cli
from pyrouq.cli import main

FACTORY = "_cli:ctrl_c_net"
ARGV = ["fit", FACTORY, "--epochs", "2", "--train-size", "256", "--batch-size", "64"]
ARGV += ["--seed", "5", "--num-samples", "2", "--no-progress"]


@pytest.fixture
def interrupted(tmp_path, capsys, monkeypatch):
    """An uninterrupted run in full/ and the same run stopped by Ctrl-C in epoch 1 in part/:
    (tmp_path, the command the interrupted run printed to resume it)."""
    monkeypatch.setattr(CtrlCAt, "at", 0)
    assert main([*ARGV, "--out", str(tmp_path / "full")]) == 0
    monkeypatch.setattr(CtrlCAt, "at", 3)  # inside epoch 1 (of 4 steps)
    assert main([*ARGV, "--out", str(tmp_path / "part")]) == 130
    err = capsys.readouterr().err
    assert "interrupted in epoch 1 after step 3; the partial run is saved" in err
    printed = err.split("(resume it: ")[1].rsplit(")", 1)[0]
    monkeypatch.setattr(CtrlCAt, "at", 0)
    return tmp_path, printed


def test_the_printed_command_resumes_to_the_uninterrupted_run(interrupted, capsys):
    tmp_path, printed = interrupted
    part = tmp_path / "part"
    assert printed == shlex.join(["pyrouq", *ARGV, "--out", str(part), "--resume"])
    config_before = (part / "config.json").read_text()
    assert main(shlex.split(printed)[1:]) == 0
    assert "wrote" in capsys.readouterr().out
    full = pyrouq.load(tmp_path / "full" / "checkpoint.pt", module=CtrlCAt())
    resumed = pyrouq.load(part / "checkpoint.pt", module=CtrlCAt())
    for want, got in ((full.model, resumed.model), (full.guide, resumed.guide)):
        want, got = want.state_dict(), got.state_dict()
        assert want.keys() == got.keys()
        assert [k for k in want if not torch.equal(want[k], got[k])] == []
    fitted = json.loads((tmp_path / "full" / "metrics.json").read_text())
    again = json.loads((part / "metrics.json").read_text())
    for key in ("acc", "nll", "ece", "mutual_information"):
        assert again[key] == fitted[key], key
    # config.json is the run's as started; the checkpoint records the same command
    assert (part / "config.json").read_text() == config_before
    assert resumed.metadata["config"]["command"] == json.loads(config_before)["command"]
    # and the finished run is not resumed again
    err = one_line_error(capsys, [*ARGV, "--out", str(part), "--resume"])
    assert f"--resume: the run in {str(part)!r} finished (it wrote metrics.json)" in err
    assert "pyrouq evaluate" in err


def test_resume_loads_the_runs_checkpoint_once_and_ends_as_the_uninterrupted_run(
    interrupted, monkeypatch
):
    """--resume loaded checkpoint.pt four times (torch.load, after a check of every byte):
    for the factory's latent sites, whether it trained in full, its earlier epochs and fit()'s
    resume_from. Now once, and the run still ends where the uninterrupted one does. The file
    read once held its weights for the whole run, a second copy beside the model's: fit()'s
    restore lets them go once they are loaded, so none is alive while the run trains."""
    tmp_path, printed = interrupted
    part = tmp_path / "part"
    loaded, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loaded.append(str(f)) or load(f, *a, **k))
    files, saved, alive = [], [], []  # the file read, weakrefs to its tensors, those alive

    def read_run(path):
        file = real_read_run(path)
        files.append(file)
        for key in ("model", "guide"):
            saved.extend(weakref.ref(t) for t in file.payload[key].values())
        return file

    def fit(*args, callbacks=(), **kwargs):
        def count(record):  # at each epoch's end, while the run trains
            gc.collect()
            alive.append(sum(ref() is not None for ref in saved))

        return real_fit(*args, **kwargs, callbacks=[*callbacks, count])

    real_read_run, real_fit = cli.read_run, pyrouq.fit
    monkeypatch.setattr(cli, "read_run", read_run)
    monkeypatch.setattr(pyrouq, "fit", fit)
    assert main(shlex.split(printed)[1:]) == 0
    assert loaded == [str(part / "checkpoint.pt")]
    assert len(saved) > 4 and alive == [0, 0]  # (epochs 1 and 2: all held at the old code)
    assert files[0].payload is None  # what a later read() reads again from the file
    monkeypatch.setattr(torch, "load", load)
    full = pyrouq.load(tmp_path / "full" / "checkpoint.pt", module=CtrlCAt())
    resumed = pyrouq.load(part / "checkpoint.pt", module=CtrlCAt())
    for want, got in ((full.model, resumed.model), (full.guide, resumed.guide)):
        want, got = want.state_dict(), got.state_dict()
        assert [k for k in want if not torch.equal(want[k], got[k])] == []


def test_resume_of_another_run_names_what_differs_and_the_command_to_run(interrupted, capsys):
    tmp_path, printed = interrupted
    part = tmp_path / "part"
    other = [a if a != "5" else "6" for a in ARGV]  # --seed 6
    err = one_line_error(capsys, [*other, "--out", str(part), "--resume"])
    assert (
        f"--resume continues the run in {str(part)!r} as it was started, but this command "
        "trains another (seed 5 there, 6 now); run the recorded command with --resume: "
        f"{printed}\n"
    ) in err
    assert pyrouq.load(part / "checkpoint.pt", module=CtrlCAt()).training["steps"] == 3
    # the same command without --resume is told of it
    err = one_line_error(capsys, [*ARGV, "--out", str(part)])
    assert f"--out {str(part)!r} holds an interrupted run (a checkpoint.pt, no metrics" in err
    assert "pass --resume to continue it, --overwrite to start anew, or another folder" in err


def test_resume_refusals_without_a_run_to_continue(tmp_path, capsys):
    err = one_line_error(capsys, [*ARGV, "--resume"])
    assert "--resume continues the interrupted run in --out, but no --out was given" in err
    err = one_line_error(capsys, [*ARGV, "--out", str(tmp_path), "--resume", "--overwrite"])
    assert "--resume continues the run in --out and --overwrite removes it" in err
    err = one_line_error(capsys, [*ARGV, "--out", str(tmp_path / "none"), "--resume"])
    assert f"--resume: {str(tmp_path / 'none')!r} holds no config.json" in err
    (tmp_path / "config.json").write_text("{}")
    err = one_line_error(capsys, [*ARGV, "--out", str(tmp_path), "--resume"])
    assert f"--resume: {str(tmp_path)!r} holds no checkpoint.pt to continue from" in err


def test_a_refused_resume_prints_none_of_the_runs_earlier_epochs(tmp_path, capsys, monkeypatch):
    """--resume printed the finished epochs' lines, then fit() refused the run (here: the
    factory now builds a network of other sizes): the lines read as if training had gone on.
    They are printed once fit() has taken the run, before its next epoch's line."""
    part = tmp_path / "part"
    monkeypatch.setattr(CtrlCAt, "at", 6)  # inside epoch 2 (of 4 steps): epoch 1 finished
    assert main([*ARGV, "--out", str(part)]) == 130
    assert capsys.readouterr().out.count("\nepoch 1: loss ") == 1
    monkeypatch.setattr(CtrlCAt, "at", 0)
    monkeypatch.setattr(CtrlCAt, "width", 12)
    assert main([*ARGV, "--out", str(part), "--resume"]) == 2
    refused = capsys.readouterr()
    assert "holds a BayesianNetwork of another module" in refused.err
    assert "epoch 1:" not in refused.out and refused.out.count("\n") == 1  # "fitting ..."
    monkeypatch.setattr(CtrlCAt, "width", 16)
    assert main([*ARGV, "--out", str(part), "--resume"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1", "epoch 2"]


def test_a_resumed_run_whose_first_write_fails_prints_its_earlier_epochs(
    tmp_path, capsys, monkeypatch
):
    """The earlier epochs' lines, held until fit() takes the run, were lost where it took it
    and then the first epoch's checkpoint could not be written (a full disk): the run trained
    on, and the log showed none of the epochs checkpoint.pt holds."""
    import errno

    from pyrouq.checkpoint import _file

    part = tmp_path / "part"
    monkeypatch.setattr(CtrlCAt, "at", 6)  # inside epoch 2 (of 4 steps): epoch 1 finished
    assert main([*ARGV, "--out", str(part)]) == 130
    capsys.readouterr()
    monkeypatch.setattr(CtrlCAt, "at", 0)

    def save(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_file.torch, "save", save)
    assert main([*ARGV, "--out", str(part), "--resume"]) == 2
    told = capsys.readouterr()
    assert f"cannot write the run into {str(part)!r} (No space left on device" in told.err
    lines = [line for line in told.out.splitlines() if line.startswith("epoch")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1"]


@pytest.mark.parametrize("stop", ["nan_at", "raise_at"])
def test_a_resumed_run_stopped_before_its_next_epoch_ends_prints_its_earlier_epochs(
    stop, tmp_path, capsys, monkeypatch
):
    """--resume holds the finished epochs' lines until fit() takes the run; a resumed run that
    stops inside its first step (a non-finite loss, a second Ctrl-C in the step) has been
    taken: its earlier epochs are printed before the error, as a run stopped there unresumed
    prints the epochs it finished."""
    part = tmp_path / "part"
    monkeypatch.setattr(CtrlCAt, "at", 6)  # inside epoch 2 (of 4 steps): epoch 1 finished
    assert main([*ARGV, "--out", str(part)]) == 130
    assert capsys.readouterr().out.count("\nepoch 1: loss ") == 1
    monkeypatch.setattr(CtrlCAt, "at", 0)
    monkeypatch.setattr(CtrlCAt, stop, 1)  # the resumed run's first pass
    assert main([*ARGV, "--out", str(part), "--resume"]) == (2 if stop == "nan_at" else 130)
    stopped = capsys.readouterr()
    lines = [line for line in stopped.out.splitlines() if line.startswith("epoch")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1"]
    said = "Non-finite loss (nan) at epoch 2, step " if stop == "nan_at" else "inside a training"
    assert said in stopped.err
