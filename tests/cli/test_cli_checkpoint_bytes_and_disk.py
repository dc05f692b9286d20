"""The `pyrouq` command and checkpoint files, fourth audit: the same model saved twice gives
the same bytes, a checkpoint saved again keeps its permissions, resuming the final checkpoint
of `pyrouq fit` says what it is, a second Ctrl-C inside a step and a full disk during `fit`
name what the run folder keeps, and a GPU index torch does not see is told as such."""

from __future__ import annotations

import errno
import os
import stat
import zipfile

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq.checkpoint import _file
from pyrouq.cli import main


def one_line_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "mlp"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    return out


# a factory of these tests (`pyrouq fit test_cli_checkpoint_bytes_and_disk:ctrl_c_in_step_3`)


class _CtrlCInStep(nn.Module):
    """Raises KeyboardInterrupt inside its ``at``-th training step, as a second Ctrl-C that
    lands in a step does (fit() then saves nothing of that step)."""

    def __init__(self, at: int):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.at, self.steps = at, 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            if self.steps == self.at:
                raise KeyboardInterrupt
        return self.fc(x.flatten(1))


def ctrl_c_in_step_3() -> nn.Module:
    return _CtrlCInStep(3)


def test_saving_the_same_model_twice_writes_the_same_bytes(tmp_path):
    """torch named the archive's folder after the random temporary file (`.a.pt.x1y2z3/`):
    two saves of one model differed in bytes (a hash, a dedup, a diff of runs)."""
    model = pyrouq.MLP(in_features=4, hidden_features=3, out_features=2)
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    pyrouq.save(first, model)
    pyrouq.save(second, model)
    assert first.read_bytes() == second.read_bytes()
    names = zipfile.ZipFile(first).namelist()
    assert all(name.startswith("archive/") for name in names), names
    assert isinstance(pyrouq.load(first).model, pyrouq.MLP)


def test_a_checkpoint_saved_again_keeps_its_permissions(tmp_path):
    """The rename put a file of mode 0o666 & ~umask in place of the one saved before: a
    checkpoint made private (chmod 600) became readable by all at the next save (each epoch of
    fit(checkpoint=)); torch.save keeps the mode of the file it overwrites."""
    model = pyrouq.MLP(in_features=4, hidden_features=3, out_features=2)
    path = tmp_path / "run.pt"
    pyrouq.save(path, model)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # a new file: the usual mode
    path.chmod(0o600)
    pyrouq.save(path, model)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_resuming_the_final_checkpoint_of_pyrouq_fit_says_what_it_is(plain_run):
    """It said the file 'was written by save(), not by fit(checkpoint=...)' and to load it
    to evaluate it: the user ran `pyrouq fit` and wants to train on."""
    train, _ = pyrouq.load_mnist(batch_size=64, train_size=64)
    with pytest.raises(pyrouq.CheckpointError) as info:
        pyrouq.fit(pyrouq.MLP(), None, train, epochs=2, resume_from=plain_run / "checkpoint.pt")
    message = str(info.value)
    assert "the final checkpoint of a finished `pyrouq fit` run" in message
    assert "start a new fit() from ckpt = pyrouq.load(path)" in message
    assert "written by save()" not in message


def test_a_second_ctrl_c_inside_a_step_names_the_checkpoint_the_run_keeps(tmp_path, capsys):
    """It printed 'pyrouq: interrupted' alone, as before training, though the run folder
    keeps the checkpoint of the last finished epoch (README), to evaluate or resume."""
    out = tmp_path / "run"
    argv = ["fit", "test_cli_checkpoint_bytes_and_disk:ctrl_c_in_step_3", "--method", "plain"]
    argv += ["--epochs", "2", "--train-size", "128", "--batch-size", "64", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0, err
    assert (
        f"pyrouq: interrupted inside a training step, which is not saved; "
        f"{out / 'checkpoint.pt'} holds the run after its last finished epoch (resume" in err
    )
    saved = pyrouq.load(out / "checkpoint.pt", module=ctrl_c_in_step_3())
    assert saved.training["epochs_done"] == 1


@pytest.mark.parametrize("failing", [1, 2, 3])  # epoch 1's, epoch 2's, the final checkpoint
def test_a_full_disk_during_fit_is_one_line_naming_what_the_run_keeps(
    failing, tmp_path, capsys, monkeypatch
):
    """A write that failed in fit (each epoch's checkpoint, the final one) was a traceback of
    OSError (of RuntimeError 'unexpected pos' from torch's own writer before)."""
    saves, real = [], torch.save

    def save(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) >= failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(_file.torch, "save", save)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "2", "--train-size", "64", "--out", str(out)]
    err = one_line_error(capsys, [*argv, "--no-progress"])
    # (the file named: a write the disk refuses at the flush or close has no name of its own)
    assert f"cannot write the run into {str(out)!r} (No space left on device: {out}" in err
    assert err.endswith("; free space on its disk (or make it writable), or pass --out "
                        "another folder\n")  # fmt: skip
    if failing == 1:  # nothing saved: no folder left behind
        assert not out.exists() and "holds the run" not in err
    else:
        assert f"{out / 'checkpoint.pt'} holds the run after its last saved epoch" in err
        monkeypatch.undo()
        assert pyrouq.load(out / "checkpoint.pt").training["epochs_done"] == failing - 1
        assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory", "/elsewhere/x.bin"),
        FileNotFoundError(errno.ENOENT, "No such file or directory", b"/elsewhere/x.bin"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        OSError(errno.EBADF, "Bad file descriptor", 7),
    ],
    ids=["str", "bytes", "no file", "descriptor"],
)
def test_an_os_error_of_a_file_outside_the_run_is_not_called_a_failed_write(
    error, tmp_path, capsys, monkeypatch
):
    """An OSError naming a file outside the run folder (a data set's, a factory's; its name a
    str or bytes), or of no file and not one a write meets, is the error as it came (one
    line), not "cannot write the run"."""

    def save(obj, f, *args, **kwargs):
        raise error

    monkeypatch.setattr(_file.torch, "save", save)
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(tmp_path / "r")]
    if isinstance(error.filename, int):  # a descriptor's (os.stat(fd) in the save): the run's
        err = one_line_error(capsys, [*argv, "--no-progress"])
        assert err.startswith("pyrouq: error: cannot write the run into ")
        assert "(Bad file descriptor: 7)" in err
    elif error.filename is None:  # (the command's own handling: a traceback, as from fit())
        with pytest.raises(ConnectionResetError):
            main([*argv, "--no-progress"])
    else:
        err = one_line_error(capsys, [*argv, "--no-progress"])
        assert err == f"pyrouq: error: {error}\n"


def test_a_gpu_index_torch_does_not_see_is_told_as_such(plain_run, tmp_path, capsys, monkeypatch):
    """--device cuda:1 on a one-GPU machine said 'this torch build cannot use cuda devices
    here; use cpu or cuda' (torch's invalid device ordinal taken for a build without CUDA)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    argv = ["fit", "mlp", "--device", "cuda:1", "--out", str(tmp_path / "run")]
    err = one_line_error(capsys, argv)
    assert err == (
        "pyrouq: error: --device cuda:1: torch sees 1 GPU here (cuda:0); pass one of them, "
        "or cuda\n"
    )
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    err = one_line_error(capsys, ["evaluate", str(plain_run), "--device", "cuda:2"])
    assert "torch sees 2 GPUs here (cuda:0 to cuda:1)" in err


def test_evaluate_names_the_runs_model_as_fit_was_given_it(plain_run, capsys):
    """evaluate --num-samples of a run without draws named the class ('MLP has fixed members'),
    where fit's refusal of it names the model it was given (mlp, a factory), and the value."""
    err = one_line_error(capsys, ["evaluate", str(plain_run), "--num-samples", "2"])
    assert err == (
        "pyrouq: error: --num-samples 2 applies to a Bayesian model, which has posterior draws; "
        "the run's model, mlp, has fixed members (or is one network). Leave --num-samples out\n"
    )
