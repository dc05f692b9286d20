"""The `pyrouq` command, second audit: a factory that takes arguments, an empty --out,
RUN_DIR or --data-root, the default run folder's error, one batch smaller than --batch-size, a
non-finite loss told in the command's words (at the first step, and with the checkpoint a
diverged run keeps) and a same-named module in the folder one evaluates from."""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch
from torch import nn

from pyrouq import cli
from pyrouq.cli import main
from pyrouq.infer._nonfinite import KLOverflowError, kl_overflow, loss_fix


def one_line_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    return err


# factories of these tests (`pyrouq fit test_cli_misuse:...`)


def needs_width(width):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, 10))


def make_wide(width):  # a factory whose name starts as the hint's does
    return needs_width(width)


def make(width):  # the hint's own name for a factory
    return needs_width(width)


class _NanAfter(nn.Module):
    """Gives NaN outputs in training mode after ``after`` training steps."""

    def __init__(self, after: int):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.after = after
        self.calls = 0

    def forward(self, x):
        out = self.fc(x.flatten(1))
        if self.training:
            self.calls += 1
            if self.calls > self.after:
                out = out * float("nan")
        return out


def nan_in_epoch_2():
    return _NanAfter(2)  # two batches of 64 per epoch


def half_mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10)).half()


def infinite_mlp():
    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    with torch.no_grad():
        net[1].weight.fill_(1e38)  # every logit inf at the first step
    return net


def test_a_factory_that_takes_arguments_is_told_how_the_command_calls_it(tmp_path, capsys):
    """It said only 'raised TypeError: needs_width() missing 1 required positional argument'
    and to call it in Python, not that the command calls a factory without arguments."""
    argv = ["fit", "test_cli_misuse:needs_width", "--out", str(tmp_path / "o")]
    err = one_line_error(capsys, argv)
    assert "factory 'test_cli_misuse:needs_width' takes arguments (width); pyrouq calls it " in err
    assert "give them defaults, or name a factory without arguments that calls it" in err
    assert "(def make(): return needs_width(...), given as test_cli_misuse:make)" in err
    assert not (tmp_path / "o").exists()


def test_a_factory_written_as_a_call_is_told_to_keep_its_arguments(tmp_path, capsys):
    """`nets:needs_width(16)` was asked 'did you mean nets:needs_width?': as told, the command
    then refused it for its argument, and a factory with a default would drop the 16."""
    out = str(tmp_path / "o")
    err = one_line_error(capsys, ["fit", "test_cli_misuse:needs_width(16)", "--out", out])
    assert err.endswith(
        "(factory 'test_cli_misuse:needs_width(16)'); MODEL names a factory, which pyrouq calls "
        "without arguments, not a call: name one that calls it with yours (def make(): return "
        "needs_width(16), given as test_cli_misuse:make)\n"
    ), err
    # arguments with a dot were split from the name, and told to name a function of the module
    err = one_line_error(capsys, ["fit", "test_cli_misuse:nn.Dropout(p=0.1)", "--out", out])
    assert err.endswith("(def make(): return nn.Dropout(p=0.1), given as test_cli_misuse:make)\n")
    err = one_line_error(capsys, ["fit", "test_cli_misuse:needs_width()", "--out", out])
    assert err.endswith("(did you mean 'test_cli_misuse:needs_width'?)\n"), err  # as before


def test_the_hint_for_a_factory_named_make_does_not_define_make_again(tmp_path, capsys):
    """For `nets:make` it said 'def make(): return make(...)', which calls itself for ever."""
    err = one_line_error(capsys, ["fit", "test_cli_misuse:make", "--out", str(tmp_path / "o")])
    assert "(def make_net(): return make(...), given as test_cli_misuse:make_net)" in err
    err = one_line_error(capsys, ["fit", "test_cli_misuse:make_wide", "--out", str(tmp_path / "o")])
    assert "(def make(): return make_wide(...), given as test_cli_misuse:make)" in err  # as before


def test_an_empty_out_or_run_dir_is_refused_not_taken_for_the_current_folder(
    tmp_path, capsys, monkeypatch
):
    """`--out "$RUN"` with RUN unset was the current folder (with --overwrite, the command
    removed the run files there and wrote its own); RUN_DIR '' evaluated it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics.json").write_text("{}")  # a run of the user's own, here
    err = one_line_error(capsys, ["fit", "mlp", "--out", "", "--overwrite"])
    assert "--out is '', an empty name; pass a folder, or leave --out out" in err
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]
    err = one_line_error(capsys, ["evaluate", ""])
    assert "RUN_DIR is '', an empty name; pass a folder of `pyrouq fit`" in err
    # a name of spaces is no unset variable's: worded as blank (as the loaders word root=' ')
    err = one_line_error(capsys, ["fit", "mlp", "--out", " ", "--overwrite"])
    assert "--out is ' ', a blank name (whitespace only); pass a folder, or leave --out out" in err
    err = one_line_error(capsys, ["evaluate", "\t"])  # (a tab was called "spaces only")
    assert "RUN_DIR is '\\t', a blank name (whitespace only); pass a folder of `pyrouq fit`" in err
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


@pytest.mark.parametrize("command", [["data"], ["fit", "mlp"], ["evaluate", "run"]])
def test_an_empty_data_root_is_refused_not_taken_for_the_current_folder(
    command, tmp_path, capsys, monkeypatch
):
    """`--data-root "$DATA"` with DATA unset read the current folder: `pyrouq data` loaded the
    MNIST there (exit 0), and a folder without it was named as the --data-root given."""
    from pyrouq._idx import _BUNDLED_ROOT

    monkeypatch.chdir(tmp_path)
    (tmp_path / "MNIST").symlink_to(_BUNDLED_ROOT / "MNIST")  # data in the current folder
    for root in ("", " "):
        with pytest.raises(SystemExit) as stop:  # the parser's refusal
            main([*command, "--data-root", root])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("pyrouq: error: argument --data-root: ") and err.count("\n") == 1
        what = "an empty name" if not root else "a blank name (whitespace only)"
        assert f"--data-root is {root!r}, {what}; pass a folder in torchvision " in err
        assert "or leave --data-root out for $PYROUQ_DATA or the bundled copy" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MNIST"]  # no run folder made


def test_the_default_run_folder_error_names_no_out_that_was_not_given(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("")  # a file where the runs folder goes
    err = one_line_error(capsys, ["fit", "mlp", "--epochs", "1", "--train-size", "64"])
    assert "cannot write the run folder 'runs/mlp-" in err and "(the default): " in err
    assert "--out 'runs/" not in err
    assert err.endswith("pass --out a folder you can write to\n")


def test_a_loss_infinite_before_any_update_does_not_blame_the_learning_rate(tmp_path, capsys):
    """A loss infinite at the first step (a huge --kl-weight, a network whose outputs are
    not finite) said 'Lower --lr.', which cannot help: no update had been made."""
    argv = ["fit", "bayesian-mlp", "--epochs", "1", "--train-size", "64", "--no-progress"]
    err = one_line_error(capsys, [*argv, "--kl-weight", "1e300", "--out", str(tmp_path / "a")])
    # fit() names the KL term times kl_weight (d40a7c1); the command's rewrite dropped it and
    # sent the user to --prior-scale: it keeps fit()'s figures, in the command's words
    assert "Non-finite loss (inf) at epoch 1, step 1, before any update: the KL term" in err
    assert re.search(
        r"overflowed it: --kl-weight \* KL = 1e\+300 \* [\d.]+ = [\d.]+e\+30\d, beside an NLL "
        r"of [\d.]+, in float32 \(largest 3.4e\+38\)\. Pass a smaller --kl-weight \(1 is the "
        r"exact ELBO\)\n$",
        err,
    ), err
    assert "Lower --lr" not in err and "are kept" not in err and "prior-scale" not in err
    # and at a later step, after the training stopped there
    figures = (float("inf"), 500.0, 1e5, 1e36, torch.float32)
    later = (
        "Non-finite loss (inf) at epoch 2, step 3; training stopped and the parameters and "
        f"normalisation statistics of the last finite step are kept. {loss_fix(*figures)}"
    )
    # the figures are read from the error's overflow attribute, not its words (a regular
    # expression read them back from the message)
    error = KLOverflowError(later, kl_overflow(*figures))
    assert cli._non_finite(error, tmp_path / "a", True, None) == (
        "Non-finite loss (inf) at epoch 2, step 3; training stopped: the KL term overflowed "
        "it: --kl-weight * KL = 1e+36 * 100000 = 1e+41, beside an NLL of 500, in float32 "
        "(largest 3.4e+38). Pass a smaller --kl-weight (1 is the exact ELBO)"
    )
    argv = ["fit", "test_cli_misuse:infinite_mlp", "--epochs", "1", "--train-size", "64"]
    err = one_line_error(capsys, [*argv, "--out", str(tmp_path / "b"), "--no-progress"])
    assert (
        "before any update (--lr is not the cause); try a smaller --kl-weight or a larger " in err
    )
    assert "or a network that gives finite outputs on the images" in err
    assert "Lower --lr" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_float16_network_of_ones_own_trains_from_the_command(tmp_path, capsys):
    """Its KL overflowed float16 at the first step (inf); the KL is now taken in float32."""
    out = tmp_path / "half"
    argv = ["fit", "test_cli_misuse:half_mlp", "--epochs", "1", "--train-size", "64"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    assert "epoch 1: loss " in capsys.readouterr().out


def test_a_run_diverging_after_an_epoch_says_what_its_checkpoint_holds(tmp_path, capsys):
    """It said the parameters of the last finite step 'are kept': the command drops them;
    the run folder keeps the checkpoint of the last finished epoch, which it did not name."""
    out = tmp_path / "diverged"
    argv = ["fit", "test_cli_misuse:nan_in_epoch_2", "--method", "plain", "--epochs", "3"]
    argv += ["--train-size", "128", "--batch-size", "64", "--no-progress", "--out", str(out)]
    err = one_line_error(capsys, argv)
    assert "Non-finite loss (nan) at epoch 2, step 1; training stopped (" in err
    assert f"{out / 'checkpoint.pt'} holds its weights after its last finished epoch: " in err
    assert f"pyrouq evaluate {out})" in err and err.endswith(". Lower --lr.\n")
    assert "are kept" not in err
    assert (out / "checkpoint.pt").is_file()
    assert main(["evaluate", str(out), "--ood", "none", "--no-progress"]) == 0
    assert "its weights after 1 of 3 epochs and 2 steps" in capsys.readouterr().out


def test_a_same_named_module_where_one_evaluates_is_named(tmp_path, capsys, monkeypatch):
    """Evaluating from a folder holding another module of the factory's name said the factory
    now builds another network and to make it build the old one; it had not changed."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    source = "from torch import nn\n\ndef net():\n    return nn.Sequential(nn.Flatten(), {})\n"
    for folder, layer in (("train", "nn.Linear(784, 10)"), ("other", "nn.Linear(784, 10, False)")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "audit2_shadowed.py").write_text(source.format(layer))
    monkeypatch.chdir(tmp_path / "train")
    argv = ["fit", "audit2_shadowed:net", "--method", "plain", "--epochs", "1"]
    assert main([*argv, "--train-size", "64", "--out", "../o", "--no-progress"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path / "other")
    monkeypatch.delitem(sys.modules, "audit2_shadowed")
    err = one_line_error(capsys, ["evaluate", "../o", "--ood", "none", "--no-progress"])
    assert "now builds another network: " in err
    here, there = str((tmp_path / "other").resolve()), str((tmp_path / "train").resolve())
    assert f"it was imported from {here!r}, the run found it in {there!r}: evaluate " in err
    monkeypatch.chdir(tmp_path / "train")
    monkeypatch.delitem(sys.modules, "audit2_shadowed")
    assert main(["evaluate", "../o", "--ood", "none", "--no-progress"]) == 0


def test_one_batch_smaller_than_the_batch_size_is_told_as_it_is(tmp_path, capsys):
    """100 images at the default batch size of 512 printed '1 batch of 512'."""
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "100", "--device", "cpu", "--out"]
    assert main([*argv, str(tmp_path / "o"), "--no-progress"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("on 100 MNIST images, 1 epoch of 1 batch of 100, device cpu")
    assert '"batch_size": 512' in (tmp_path / "o" / "config.json").read_text()  # as asked


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


A_NETWORK = nn.Linear(784, 10)


def test_a_network_instead_of_a_factory_is_told_as_such(tmp_path, capsys):
    """A network built at import (not a factory) was called as one: 'raised TypeError:
    Linear.forward() missing 1 required positional argument: 'input''."""
    err = one_line_error(capsys, ["fit", "test_cli_misuse:A_NETWORK", "--out", str(tmp_path)])
    assert "'test_cli_misuse:A_NETWORK' is a network (Linear), not a factory: name a " in err


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["fit", "mlp", "--out", "{long}"], "--out"),
        (["fit", "mlp", "--out", "{long}", "--resume"], "--out"),
        (["evaluate", "{long}"], "RUN_DIR"),
        (["data", "--data-root", "{long}"], "--data-root"),
        (["fit", "mlp", "--data-root", "{long}/data"], "--data-root"),
    ],
)
def test_a_folder_name_too_long_to_look_up_is_one_line(argv, option, tmp_path, capsys):
    # pathlib's exists() / is_file() raised the system's OSError (File name too long): a
    # traceback with exit code 1 instead of the command's one-line refusal
    long = str(tmp_path / ("a" * 256))  # (more than the 255 bytes a name may hold)
    given = [a.format(long=long) for a in argv]
    quiet = [] if given[0] == "data" else ["--no-progress"]  # (pyrouq data has no such option)
    with pytest.raises(SystemExit) as stop:  # the parser's refusal
        main([*given, *quiet])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyrouq: error: argument {option}: ") and err.count("\n") == 1, err
    path = next(a for a in given if a.startswith(long))
    assert f"{option} {path!r} cannot be looked up (File name too long); pass a shorter path" in err
    assert not any(tmp_path.iterdir())  # no run folder made


def test_an_out_linked_to_a_missing_folder_is_told_as_such(tmp_path, capsys):
    # mkdir met the link (FileExistsError), which the command told as "claimed by another
    # run while this one started (it holds a config.json now)"
    link = tmp_path / "latest"
    link.symlink_to(tmp_path / "gone" / "run")
    err = one_line_error(capsys, ["fit", "mlp", "--out", str(link), "--no-progress"])
    assert err == (
        f"pyrouq: error: --out {str(link)!r} is a symbolic link to "
        f"{str(tmp_path / 'gone' / 'run')!r}, which does not exist; make that folder first, or "
        "pass another --out\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_an_out_linked_relatively_to_a_missing_folder_names_it_whole(tmp_path, capsys, monkeypatch):
    # the advice showed the link's own words, '../gone/run', which the link reads from its
    # folder (runs/), not from the working folder the command was run in: the folder to make
    # is told as an absolute path
    (tmp_path / "runs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "runs" / "latest"
    link.symlink_to(os.path.join("..", "gone", "run"))
    monkeypatch.chdir(tmp_path / "elsewhere")
    err = one_line_error(capsys, ["fit", "mlp", "--out", "../runs/latest", "--no-progress"])
    made = os.path.realpath(tmp_path / "gone" / "run")
    assert err == (
        f"pyrouq: error: --out '../runs/latest' is a symbolic link to {made!r}, which does not "
        "exist; make that folder first, or pass another --out\n"
    )
    assert not (tmp_path / "gone").exists()
