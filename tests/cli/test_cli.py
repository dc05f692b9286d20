"""The `pyrouq` command: fit / evaluate on a small training subset, and its error cases."""

from __future__ import annotations

import gc
import importlib
import json
import math
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import _factories
import pytest
import torch
from _processes import run_in_own_group

import pyrouq
from pyrouq import cli
from pyrouq.cli import main
from pyrouq.nn import BatchEnsembleNorm

PLOTS = {
    "reliability.png",
    "risk_coverage.png",
    "image_grid.png",
    "most_uncertain.png",
    "uncertainty.png",
    "training_curves.png",
}


def one_line_error(capsys, code, argv):
    assert main(argv) == code if code != "exit" else None
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ")
    assert err.count("\n") == 1, err
    return err


def run_exit(argv, capsys):
    """argparse errors leave by SystemExit(2); return the captured stderr."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ")
    assert err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def bayes_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "bayesian-mlp"
    argv = ["fit", "bayesian-mlp", "--epochs", "2", "--train-size", "4096", "--batch-size", "128"]
    argv += ["--num-samples", "4", "--out", str(out), "--no-progress", "--seed", "1"]
    assert main(argv) == 0
    return out


def test_the_run_plots_are_the_plots_a_run_writes():
    from pyrouq.cli._report import RUN_PLOTS

    assert {f"{name}.png" for name in RUN_PLOTS} == PLOTS


def test_fit_writes_the_run_folder(bayes_run, capsys):
    names = {p.name for p in bayes_run.iterdir()}
    assert {"metrics.json", "config.json", "checkpoint.pt"} | PLOTS <= names
    metrics = json.loads((bayes_run / "metrics.json").read_text())
    for key in ("acc", "nll", "ece", "aurc", "mutual_information", "ood_auroc", "ood_fpr95"):
        assert 0 <= metrics[key] < float("inf"), key
    assert metrics["acc"] > 0.85  # 4096 images, two epochs
    assert metrics["num_samples"] == 4
    config = json.loads((bayes_run / "config.json").read_text())
    assert config["model"] == "bayesian-mlp" and config["train_size"] == 4096
    assert config["versions"]["pyrouq"] == pyrouq.__version__
    assert config["command"].startswith("pyrouq fit bayesian-mlp --epochs 2 --train-size 4096")
    saved = pyrouq.load(bayes_run / "checkpoint.pt", model_class="BayesianMLP")
    assert saved.metadata["metrics"]["acc"] == metrics["acc"]
    # readable like the other files of the run (as the umask makes them: not a literal mode)
    mode = {
        name: (bayes_run / name).stat().st_mode & 0o777 for name in ("checkpoint.pt", "config.json")
    }
    assert mode["checkpoint.pt"] == mode["config.json"], mode


def test_fit_prints_the_tables(tmp_path, capsys):
    out = tmp_path / "mlp"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "512", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    for title in ("Classification", "Calibration", "Selective classification", "OOD"):
        assert title in printed
    assert "epoch 1: loss" in printed
    assert f"wrote {out}/" in printed


def test_evaluate_reloads_and_adds_rotations(bayes_run, capsys):
    fits = {name: (bayes_run / name).read_bytes() for name in PLOTS}
    code = main(["evaluate", str(bayes_run), "--num-samples", "2", "--ood", "none", "--shift",
                 "rotate", "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "Rotated MNIST" in printed
    metrics = json.loads((bayes_run / "metrics-evaluate.json").read_text())
    assert "ood_auroc" not in metrics
    assert [row["angle"] for row in metrics["rotation"]] == list(range(0, 181, 15))
    assert metrics["rotation"][0]["acc"] > metrics["rotation"][6]["acc"]  # 0 vs 90 degrees
    assert (bayes_run / "rotation-evaluate.png").stat().st_size > 0
    # fit's figures stay as fit wrote them; evaluate's go beside them
    assert (bayes_run / "reliability-evaluate.png").stat().st_size > 0
    assert all((bayes_run / name).read_bytes() == fits[name] for name in PLOTS)


def test_evaluate_calibrates_and_builds_conformal_sets(bayes_run, capsys):
    argv = ["evaluate", str(bayes_run), "--num-samples", "3", "--ood", "none"]
    # (an alpha that :g, 6 digits, told as 0.1: the header echoes it as typed)
    assert main([*argv, "--calibrate", "temperature", "--conformal", "0.1000001"]) == 0
    printed = capsys.readouterr().out
    assert "Calibration: fitted on 5000 test images (seed 1), reported on the other 5000" in printed
    assert "temperature " in printed and "Conformal sets at alpha = 0.1000001:" in printed
    calibration = json.loads((bayes_run / "metrics-evaluate.json").read_text())["calibration"]
    assert calibration["temperature"] > 0
    before, after = calibration["before"], calibration["after"]
    assert after["acc"] == before["acc"] and after["nll"] <= before["nll"] + 1e-9
    for score in ("lac", "aps", "raps"):
        row = calibration["conformal"][score]
        assert 0.85 <= row["coverage"] <= 0.95 and row["mean_set_size"] > 0
    err = run_exit([*argv, "--conformal", "1.5"], capsys)
    assert "--conformal must lie in (0, 1)" in err


def _test_split(root, n, labels):
    """A --data-root holding the first ``n`` bundled MNIST test images with ``labels(y)`` as
    their labels (IDX files, torchvision layout)."""
    from pyrouq.data import mnist_arrays

    images, y = mnist_arrays("test")
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    head = (0x803, n, 28, 28)
    (raw / "t10k-images-idx3-ubyte").write_bytes(
        b"".join(v.to_bytes(4, "big") for v in head) + images[:n].numpy().tobytes()
    )
    given = labels(y[:n]).to(torch.uint8).numpy().tobytes()
    (raw / "t10k-labels-idx1-ubyte").write_bytes(
        b"".join(v.to_bytes(4, "big") for v in (0x801, n)) + given
    )
    return root


def test_evaluate_calibrate_names_a_factory_runs_factory_for_softened_predictions(
    tmp_path, monkeypatch
):
    """A factory's network whose logits are shrunken puts T at the lower bound 0.05: the
    command's warning names the run's factory (from its config.json), which must return
    logits, where a model of pyrouq's own is told only what T does."""
    (tmp_path / "bite17_shrunk.py").write_text(
        "import torch.nn as nn\n"
        "class Shrink(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 1e-3\n"
        "def make():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.ReLU(), "
        "nn.Linear(16, 10), Shrink())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    argv = ["fit", "bite17_shrunk:make", "--method", "last-layer", "--epochs", "1",
            "--train-size", "256", "--batch-size", "64", "--num-samples", "2", "--seed", "0",
            "--device", "cpu", "--no-progress", "--out", str(run)]  # fmt: skip
    try:
        assert main(argv) == 0
        evaluate = ["evaluate", str(run), "--num-samples", "2", "--ood", "none", "--no-progress"]
        with pytest.warns(UserWarning, match="lowest at T = 0.05") as caught:
            assert main([*evaluate, "--calibrate", "temperature"]) == 0
    finally:
        sys.modules.pop("bite17_shrunk", None)
    said = [str(w.message) for w in caught if "T = 0.05" in str(w.message)]
    assert (
        len(said) == 1
        and (
            "far less confident than their accuracy. The factory 'bite17_shrunk:make' must return "
            "logits, which pyrouq turns into probabilities"
        )
        in said[0]
    ), said


def test_evaluate_calibrate_warns_of_a_temperature_at_its_bound_in_the_commands_words(
    bayes_run, capsys, tmp_path
):
    """Labels that are not the images' (each one class off) put T at 20: temperature_scale()
    told to check that "val_targets are the labels of val_preds", names the command's user
    cannot act on; the command's warning names its --data-root and --calibrate."""
    root = _test_split(tmp_path, 200, lambda y: (y + 1) % 10)
    argv = ["evaluate", str(bayes_run), "--num-samples", "2", "--ood", "none", "--no-progress"]
    with pytest.warns(UserWarning, match="lowest at T = 20") as caught:
        assert main([*argv, "--data-root", str(root), "--calibrate", "temperature"]) == 0
    said = [str(w.message) for w in caught if "T = 20" in str(w.message)]
    assert said == [
        "--calibrate temperature: the validation NLL is lowest at T = 20, the bound of the "
        "search [0.05, 20]: the predictions barely tell the labels apart, so the flattest T "
        f"fits best. Check that the test labels in --data-root {str(root)!r} are those of its "
        "test images, in the same order (t10k-labels-idx1-ubyte beside t10k-images-idx3-ubyte); "
        "else the run's model tells the classes apart no better than chance (its accuracy "
        "above): train it longer (pyrouq fit --epochs), or leave --calibrate out (T = 1, no "
        "change)."
    ], said
    assert not any(name in said[0] for name in ("val_targets", "val_preds", "temperature_scale"))
    assert (
        json.loads((bayes_run / "metrics-evaluate.json").read_text())["calibration"]["temperature"]
        == 20.0
    )


def test_evaluate_one_draw_names_the_draw(bayes_run, capsys):
    # S = 1 of a Bayesian run is one posterior draw (its MI is 0), not one network
    argv = ["evaluate", str(bayes_run), "--num-samples", "1", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "(OOD score: predictive entropy; one posterior draw (--num-samples 1) has no mutual "
        "information; pass --num-samples 2 or more for it)" in printed
    )
    assert "one network" not in printed
    metrics = json.loads((bayes_run / "metrics-evaluate.json").read_text())
    assert metrics["num_samples"] == 1 and metrics["ood_score"] == "entropy"


def test_evaluate_is_reproducible(bayes_run, capsys, monkeypatch):
    # each evaluate loads the run's checkpoint.pt once (it loaded it twice: read() for its
    # config, then load() for the model, each a check of every byte and a torch.load)
    loaded, load = [], torch.load
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loaded.append(str(f)) or load(f, *a, **k))
    for _ in range(2):
        assert main(["evaluate", str(bayes_run), "--num-samples", "3", "--ood", "none"]) == 0
        assert loaded == [str(bayes_run / "checkpoint.pt")] * (_ + 1)
        runs = json.loads((bayes_run / "metrics-evaluate.json").read_text())
        runs.pop("eval_seconds")
        if _ == 0:
            first = runs
    assert runs == first


def test_evaluate_holds_no_second_copy_of_the_weights_while_it_evaluates(bayes_run, monkeypatch):
    """The checkpoint.pt read once held the weights beside the loaded model's for the whole
    evaluation: load() lets them go once they are loaded."""
    from pyrouq.checkpoint import _file

    evaluate = importlib.import_module("pyrouq.cli._evaluate")  # (pyrouq.cli._evaluate: a function)
    saved, alive = [], []  # weakrefs to the file's tensors; how many live while it evaluates

    class Watched(_file.ReadFile):
        def __init__(self, path):
            super().__init__(path)
            for key in ("model", "guide"):
                saved.extend(weakref.ref(t) for t in self.payload[key].values())

    def counted(*args, **kwargs):
        gc.collect()
        alive.append(sum(ref() is not None for ref in saved))
        return real(*args, **kwargs)

    real = evaluate._evaluate
    monkeypatch.setattr(_file, "ReadFile", Watched)
    monkeypatch.setattr(evaluate, "_evaluate", counted)
    argv = ["evaluate", str(bayes_run), "--num-samples", "2", "--ood", "none", "--no-progress"]
    assert main(argv) == 0
    assert len(saved) > 4 and alive == [0]  # (all held at the old code)


def _epoch_line(record):
    """`pyrouq fit`'s line of an epoch, as README shows it, of a checkpoint's history record."""
    return (
        f"epoch {record['epoch']}: loss {record['loss']:.4g} (nll {record['nll']:.4g}, kl "
        f"{record['kl']:.4g}), train acc {100 * record['train_acc']:.2f} %, "
        f"{record['seconds']:.1f} s"
    )


def _epoch_lines(printed):
    return [line for line in printed.splitlines() if re.match(r"epoch \d+: loss ", line)]


def test_interrupted_fit_saves_the_partial_run(tmp_path, capsys, monkeypatch):
    _factories.stop_fit_after_first_epoch(monkeypatch)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "3", "--train-size", "256", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == cli.EXIT_INTERRUPTED
    printed = capsys.readouterr()
    assert f"the partial run is saved at {out / 'checkpoint.pt'}" in printed.err
    saved = pyrouq.load(out / "checkpoint.pt")
    assert saved.training["epochs_done"] == 1
    # the finished epoch's line was printed (the lines came after the whole training: none)
    first = _epoch_line(saved.training["history"][0])
    assert _epoch_lines(printed.out) == [first]
    # resumed (and stopped after its first epoch again): the earlier epoch's line, then its own
    assert main([*argv, "--no-progress", "--resume"]) == cli.EXIT_INTERRUPTED
    history = pyrouq.load(out / "checkpoint.pt").training["history"]
    assert _epoch_lines(capsys.readouterr().out) == [first, _epoch_line(history[1])]


def test_a_fit_stopped_while_it_writes_an_epochs_checkpoint_prints_that_epochs_line(
    tmp_path, capsys, monkeypatch
):
    """Ctrl-C twice while epoch 1's checkpoint is written (the second raises at once): the
    epoch is in the history, but its callback, which prints its line, never runs. The command
    prints it from the stopped run's history, once."""
    import signal

    from pyrouq import checkpoint as checkpoint_module

    real_save_run = checkpoint_module.save_run
    stopped = []

    def save_run(*args, **kwargs):
        saved = real_save_run(*args, **kwargs)
        if not stopped:  # epoch 1's checkpoint, written: Ctrl-C, then Ctrl-C again
            stopped.append(args[5]["epochs_done"])
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return saved

    monkeypatch.setattr(checkpoint_module, "save_run", save_run)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "3", "--train-size", "128", "--batch-size", "64"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == cli.EXIT_INTERRUPTED
    printed = capsys.readouterr()
    assert stopped == [1]
    # epoch 1 was whole (its 2 steps; "in epoch 1 after step 2" read as inside it)
    assert f"interrupted at the end of epoch 1; the partial run is saved at {out}" in printed.err
    history = pyrouq.load(out / "checkpoint.pt").training["history"]
    assert len(history) == 1
    assert _epoch_lines(printed.out) == [_epoch_line(history[0])]


class _Log:
    """stdout or stderr writing into one log file (``> log 2>&1``), the list ``into``: what it
    was given (``text``) and what reached the file by its last flush (``flushed``)."""

    def __init__(self, into):
        self.into, self.text, self.flushed = into, "", ""

    def write(self, text):
        self.text += text
        self.into.append(text)
        return len(text)

    def flush(self):
        self.flushed = self.text

    def isatty(self):
        return False


def test_each_epochs_line_is_printed_and_flushed_as_the_epoch_ends(tmp_path, monkeypatch):
    """The lines were printed after the whole training: a batch scheduler's log showed none
    while the run trained, and a run stopped (Ctrl-C, SIGTERM) none at all. Now each epoch's
    line reaches the log when its epoch ends, beside the progress bar (which is cleared for it,
    not run into), once."""
    log = []
    stdout = _Log(log)
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", _Log(log))
    at_ends = []  # what stdout had flushed at each epoch's end (a callback after the command's)
    real_fit = pyrouq.fit

    def watched(*args, callbacks=(), **kwargs):
        def watch(record):
            at_ends.append(stdout.flushed)
            if record.epoch == 2:
                raise KeyboardInterrupt  # stopped there: the tables never come

        return real_fit(*args, **kwargs, callbacks=[*callbacks, watch])

    monkeypatch.setattr(pyrouq, "fit", watched)
    out = tmp_path / "run"
    argv = ["fit", "mlp", "--epochs", "3", "--train-size", "128", "--batch-size", "64"]
    assert main([*argv, "--out", str(out)]) == cli.EXIT_INTERRUPTED  # progress bar on
    history = pyrouq.load(out / "checkpoint.pt").training["history"]
    lines = [_epoch_line(record) for record in history]
    assert len(lines) == 2 and _epoch_lines(stdout.text) == lines
    assert at_ends == [stdout.text.split(lines[1])[0], stdout.text]  # flushed, before epoch 2
    assert _epoch_lines("".join(log)) == lines
    # the bar (on stderr) was wiped off its line first (a print() ran the line into the bar),
    # then drawn again below it, at 2 of the 6 steps
    before, after = "".join(log).split(f"{lines[0]}\n")
    assert "0/6" in before and before.endswith("\r") and "2/6" in after.split(lines[1])[0]


@pytest.mark.parametrize("when", ["setup", "evaluation"])
def test_ctrl_c_outside_training_is_one_line_and_exit_code_130(when, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["fit", f"_factories:interrupted_{when}", "--method", "plain", "--epochs", "1"]
    assert main([*argv, "--train-size", "256", "--out", str(out), "--no-progress"]) == 130
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0, err  # one line, no traceback
    if when == "setup":  # before training: no run folder is left behind
        assert err.strip() == "pyrouq: interrupted" and not out.exists()
    else:  # the trained run stays, for `pyrouq evaluate`
        assert f"interrupted while evaluating; the trained run is saved at {out}" in err
        assert (out / "checkpoint.pt").is_file()


def test_evaluate_of_a_checkpoint_whose_config_is_not_a_dict_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    pyrouq.save(run / "checkpoint.pt", pyrouq.MLP(), metadata={"config": None})
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and "has damaged metadata" in err, err


# --------------------------------------------------------------------------------------------
# errors: one line on stderr, exit code 2, no traceback
# --------------------------------------------------------------------------------------------


def test_unknown_model_lists_the_valid_ones(capsys):
    err = run_exit(["fit", "resnet"], capsys)
    assert "unknown model 'resnet'; choose one of: bayesian-lenet, bayesian-mlp" in err
    assert "lenet, mlp" in err


@pytest.mark.parametrize(
    "flag, value, expected",
    [
        ("--epochs", "0", "--epochs must be a positive integer, got 0"),
        ("--epochs", "two", "--epochs must be a positive integer, got 'two'"),
        ("--batch-size", "-5", "--batch-size must be a positive integer, got -5"),
        ("--lr", "nan", "--lr must be a finite number > 0, got nan"),
    ],
)
def test_bad_numbers(capsys, flag, value, expected):
    assert expected in run_exit(["fit", "mlp", flag, value], capsys)


@pytest.mark.parametrize(
    "argv", [["fit", "mlp", "--epochs"], ["fit", "bayesian-mlp", "--num-particles"],
             ["fit", "bayesian-mlp", "--num-samples"], ["evaluate", "RUN", "--num-samples"]],
)  # fmt: skip
def test_a_count_past_int64_is_refused_before_the_command_prints_anything(capsys, tmp_path, argv):
    """--epochs 10**20 was refused by fit() after the "fitting ..." line (--num-samples after
    a whole epoch of training); the parser refuses it, in the words of fit()'s bound."""
    command, flag = argv[0], argv[-1]
    run = tmp_path / "run"
    argv = [str(run) if arg == "RUN" else arg for arg in argv]
    # each command's own arguments after the count (evaluate takes no --train-size / --out)
    rest = ["--train-size", "8", "--out", str(run)] if command == "fit" else ["--no-progress"]
    with pytest.raises(SystemExit) as info:
        main([*argv, str(10**20), *rest])
    assert info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"pyrouq: error: argument {flag}: Expected {flag} to be at most 2**63 - 1, torch's "
        f"largest int64, got {10**20}. Pass a smaller {flag} (see `pyrouq {command} --help`)\n"
    )
    # 2**63 - 1 passes (the error is the next option's), 2**63 does not
    assert f"argument {flag}: " in run_exit([*argv, str(2**63)], capsys)
    assert "argument --seed: " in run_exit([*argv, str(2**63 - 1), "--seed", "-1"], capsys)


def test_members_apply_to_ensembles_only_and_errors_name_the_right_help(capsys):
    err = one_line_error(capsys, 2, ["fit", "mlp", "--members", "3"])
    assert "--members 3 applies to a BatchEnsemble or rank-1 network" in err
    assert "leave --members out" in err
    assert run_exit(["fit", "--epochs", "0"], capsys).endswith("(see `pyrouq fit --help`)\n")
    assert run_exit(["--bogus"], capsys).endswith("(see `pyrouq --help`)\n")
    unknown = run_exit(["evaluate", "runs/x", "--bogus", "1"], capsys)
    assert unknown.endswith("unrecognized arguments: --bogus 1 (see `pyrouq evaluate --help`)\n")


@pytest.mark.parametrize(
    "argv", [["batchensemble-mlp"], ["rank1-lenet"],
             ["_factories:tiny_residual", "--method", "batchensemble"]],
)  # fmt: skip
def test_more_members_than_memory_holds_are_refused_in_the_commands_words(argv, tmp_path, capsys):
    """The layers' "Pass fewer members." reached the command's user, who passes --members."""
    out = tmp_path / "run"
    argv = ["fit", *argv, "--members", str(10**12), "--train-size", "8", "--out", str(out)]
    err = one_line_error(capsys, 2, [*argv, "--no-progress"])
    told = (
        r"of 1000000000000 members \(its factors and biases\) would hold .* it could never be "
        r"built\. Pass fewer --members \(default 4\)\.\n$"
    )
    assert re.search(told, err), err
    assert not out.exists()


def test_non_empty_out_is_refused_unless_overwrite(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("keep me")
    err = one_line_error(capsys, 2, ["fit", "mlp", "--out", str(tmp_path)])
    assert "exists and is not empty; pass --overwrite or another folder" in err
    assert (tmp_path / "old.txt").read_text() == "keep me"
    # --overwrite: an earlier run's evaluate files go (they would describe another model)
    for stale in ("metrics-evaluate.json", "reliability-evaluate.png"):
        (tmp_path / stale).write_text("stale")
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "256", "--out", str(tmp_path)]
    assert main([*argv, "--overwrite", "--no-progress"]) == 0
    assert (tmp_path / "old.txt").read_text() == "keep me"
    assert (tmp_path / "metrics.json").is_file()
    assert not any(
        (tmp_path / stale).exists()
        for stale in ("metrics-evaluate.json", "reliability-evaluate.png")
    )


def test_train_size_beyond_the_split_and_fashion_mnist_under_a_wrong_pyrouq_data(
    tmp_path, capsys, monkeypatch
):
    out = ["--out", str(tmp_path / "o")]
    err = one_line_error(capsys, 2, ["fit", "mlp", "--train-size", "70000", *out])
    assert err.endswith(
        "Expected --train-size to be an integer in [1, 60000], got 70000. Leave --train-size "
        "out for the whole training split\n"
    )
    monkeypatch.setenv("PYROUQ_DATA", str(tmp_path / "nowhere"))
    err = one_line_error(capsys, 2, ["fit", "mlp", "--dataset", "fashion-mnist", *out])
    assert f"(looked under $PYROUQ_DATA: {tmp_path / 'nowhere'})" in err
    assert "To fix: point $PYROUQ_DATA (or --data-root) at a folder in torchvision layout" in err


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, capsys, monkeypatch):
    """Two runs named by the same second shared one folder: each wrote its config.json and
    checkpoint.pt over the other's."""
    from datetime import datetime

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 12, 4, 22, 38, 35)

    monkeypatch.setattr(cli._run_dir, "datetime", Frozen)  # where the run folder is named
    monkeypatch.chdir(tmp_path)
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "256", "--no-progress", "--seed"]
    assert main([*argv, "1"]) == 0
    assert main([*argv, "2"]) == 0
    first, second = (
        tmp_path / "runs" / "mlp-20261204-223835",
        tmp_path / "runs" / "mlp-20261204-223835-2",
    )
    assert json.loads((first / "config.json").read_text())["seed"] == 1
    assert json.loads((second / "config.json").read_text())["seed"] == 2
    assert "wrote runs/mlp-20261204-223835-2/: metrics.json" in capsys.readouterr().out


def test_data_root_without_the_files(tmp_path, capsys):
    err = one_line_error(capsys, 2, ["fit", "mlp", "--data-root", str(tmp_path), "--out",
                                     str(tmp_path / "o")])  # fmt: skip
    assert "MNIST train file not found" in err
    assert "To fix: pass a --data-root in torchvision layout (DIR/MNIST/raw/...) or leave" in err
    err = one_line_error(capsys, 2, ["data", "--data-root", str(tmp_path)])
    assert "(looked under --data-root " in err and "leave --data-root out to use the bundled" in err


def test_a_missing_pyrouq_data_folder_is_named_as_the_cause(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYROUQ_DATA", str(tmp_path))
    err = one_line_error(capsys, 2, ["data"])
    assert "To fix: point $PYROUQ_DATA (or --data-root) at a folder in torchvision layout" in err
    assert "or unset $PYROUQ_DATA to use the bundled copy" in err


def test_evaluate_errors(tmp_path, bayes_run, capsys):
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path / "missing")])
    assert "is not a folder" in err
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path)])
    assert "has no checkpoint.pt" in err
    (tmp_path / "checkpoint.pt").write_bytes(b"garbage" * 10)
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path)])
    assert "is not a pyrouq checkpoint: it be" in err
    assert "weights_only" not in err
    payload = torch.load(bayes_run / "checkpoint.pt", weights_only=True)
    payload["metadata"] = '{"config": '  # cut short
    torch.save(payload, tmp_path / "checkpoint.pt")
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path)])
    assert "checkpoint.pt' has damaged metadata (not the JSON `pyrouq fit` writes)" in err
    err = one_line_error(capsys, 2, ["evaluate", str(bayes_run), "--ood", "mnist"])
    assert "--ood mnist is the run's own data set, which cannot be out of distribution; " in err
    assert "pass --ood fashion-mnist (what auto picks) or none" in err


def test_console_script_and_module_entry_point(tmp_path):
    script = Path(sys.executable).parent / "pyrouq"  # installed beside the interpreter
    assert script.is_file(), f"no console script at {script}; install pyrouq (pip install -e .)"
    for cmd in ([str(script)], [sys.executable, "-m", "pyrouq"]):
        done = subprocess.run([*cmd, "fit", "nope"], capture_output=True, text=True)
        assert done.returncode == 2
        assert "Traceback" not in done.stderr
        assert done.stderr.startswith("pyrouq: error: argument MODEL: unknown model 'nope'")


def test_device_errors(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    err = one_line_error(capsys, 2, ["fit", "mlp", "--device", "cuda"])
    assert "torch sees no GPU" in err
    err = one_line_error(capsys, 2, ["fit", "mlp", "--device", "meta"])
    assert "--device meta holds no data (a meta device); use cpu or cuda" in err
    if not torch.backends.mps.is_available():
        err = one_line_error(capsys, 2, ["fit", "mlp", "--device", "mps"])
        assert "--device mps: this torch build cannot use mps devices here; use cpu" in err
    assert "--seed must be in [0, 2**32 - 1], got -1" in run_exit(["fit", "--seed", "-1"], capsys)


# --------------------------------------------------------------------------------------------
# your own network: package.module:factory
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["bayesian", "last-layer", "batchensemble", "rank1", "plain"])
def test_factory_fit_and_evaluate(method, tmp_path, capsys):
    out = tmp_path / method
    argv = ["fit", "_factories:tiny_residual", "--method", method, "--epochs", "1"]
    # 2048 images (64 steps): after 1024 the accuracy was 0.15 to 0.40 by the seed and moved
    # with the machine's float rounding (bayesian 0.35 with 2 threads, 0.29 with 1; plain and
    # batchensemble alike), some under 0.18; after 2048, 0.29 to 0.63 over 40 seeds
    argv += ["--train-size", "2048", "--batch-size", "32", "--out", str(out), "--no-progress"]
    if method in ("batchensemble", "plain"):  # no posterior draws to set: refused
        err = one_line_error(capsys, 2, [*argv, "--num-samples", "2"])
        assert "--num-samples 2 applies to a Bayesian model (a bayesian or rank1 model" in err
        assert not out.exists() or not any(out.iterdir())
    else:
        argv += ["--num-samples", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"fitting _factories:tiny_residual ({method})" in printed
    config = json.loads((out / "config.json").read_text())
    assert (config["factory"], config["method"], config["dataset"]) == (
        "_factories:tiny_residual",
        method,
        "mnist",
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["acc"] > 0.18  # 2048 images, one epoch of a width-4 net: above chance (0.1)
    # rank-1: 2 draws of the factors, each running the 4 members
    expected = {"bayesian": 2, "last-layer": 2, "batchensemble": 4, "rank1": 8}
    assert metrics["num_samples"] == expected.get(method, 1)
    assert metrics["members"] == (4 if method in ("batchensemble", "rank1") else None)
    # one network's draws cannot disagree: its OOD score is the entropy, not the MI (always 0)
    assert metrics["ood_score"] == ("entropy" if method == "plain" else "mutual_information")
    if method == "plain":
        assert "(OOD score: predictive entropy; one network has no mutual information)" in printed
    assert metrics["ood_auroc"] != 0.5
    # evaluate rebuilds the skeleton by calling the recorded factory
    assert main(["evaluate", str(out), "--ood", "none"]) == 0
    again = json.loads((out / "metrics-evaluate.json").read_text())
    # evaluate seeds with the run's --seed, so its posterior draws (if any) are fit's again
    assert again["acc"] == metrics["acc"] and again["nll"] == metrics["nll"]
    if method not in ("batchensemble", "plain"):
        assert again["num_samples"] == expected[method]


@pytest.mark.parametrize(
    ("flags", "norms"),
    [([], "per_member"), (["--norms", "shared"], "shared")],  # a BatchEnsemble's default
)
def test_factory_batchensemble_norms(flags, norms, tmp_path, capsys):
    out = tmp_path / "own"
    argv = ["fit", "_factories:tiny_residual", "--method", "batchensemble", *flags]
    argv += ["--epochs", "1", "--train-size", "512", "--batch-size", "64"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert json.loads((out / "config.json").read_text())["norms"] == norms
    saved = pyrouq.load(out / "checkpoint.pt", module=_factories.tiny_residual())
    assert saved.model.options["norms"] == norms
    copies = any(isinstance(m, BatchEnsembleNorm) for m in saved.model.modules())
    assert copies == (norms == "per_member")
    metrics = json.loads((out / "metrics.json").read_text())
    assert main(["evaluate", str(out), "--ood", "none"]) == 0  # rebuilt with its own norms
    assert json.loads((out / "metrics-evaluate.json").read_text())["acc"] == metrics["acc"]
    # --num-samples names the model as fit was given it, its --method too
    capsys.readouterr()
    err = one_line_error(capsys, 2, ["evaluate", str(out), "--num-samples", "2"])
    assert (
        "the run's model, _factories:tiny_residual --method batchensemble, has fixed members"
    ) in err


def test_rank1_lenet_fits_with_the_batchensemble_recipe(tmp_path, capsys):
    out = tmp_path / "rank1"
    argv = ["fit", "rank1-lenet", "--epochs", "1", "--train-size", "2048", "--out", str(out)]
    assert main([*argv, "--batch-size", "128", "--no-progress"]) == 0
    assert "fitting Rank1LeNet" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    # the BatchEnsemble LeNet's recipe, M = 4, Normal(1, 0.1) factors, the exact ELBO
    assert (config["epochs"], config["lr"], config["members"]) == (1, 2e-2, 4)
    assert (config["prior_scale"], config["num_samples"], config["kl_weight"]) == (0.1, 4, 1.0)
    assert (
        cli.MODELS["rank1-lenet"]["batch_size"] == cli.MODELS["batchensemble-lenet"]["batch_size"]
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_samples"] == 16 and metrics["acc"] > 0.5
    # S counts draws x members, --num-samples draws: members says how to pass it back
    assert metrics["members"] == 4 and metrics["num_samples"] // 4 == config["num_samples"]
    saved = pyrouq.load(out / "checkpoint.pt")  # a LeNet skeleton: no factory needed
    assert saved.model.num_members == 4


def test_factory_on_fashion_mnist_uses_mnist_as_ood(tmp_path, capsys, shared_data):
    out = tmp_path / "fashion"
    root = tmp_path / "fashion-only"  # no MNIST here: the OOD set comes from the bundled copy
    root.mkdir()
    (root / "FashionMNIST").symlink_to(shared_data / "FashionMNIST")
    argv = ["fit", "pyrouq.models:ResidualCNN", "--dataset", "fashion-mnist", "--epochs", "1"]
    argv += ["--data-root", str(root), "--train-size", "256", "--num-samples", "2"]
    assert main([*argv, "--method", "last-layer", "--out", str(out), "--no-progress"]) == 0
    assert "on 256 Fashion-MNIST images" in capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["ood_auroc"] <= 1
    saved = pyrouq.load(out / "checkpoint.pt", module=pyrouq.ResidualCNN())
    assert list(saved.model.latent_sites()) == ["fc.weight", "fc.bias"]
    # evaluating needs the test split alone, which is bundled: no --data-root
    assert main(["evaluate", str(out), "--no-progress"]) == 0
    again = json.loads((out / "metrics-evaluate.json").read_text())
    assert abs(again["acc"] - metrics["acc"]) < 0.03  # Fashion-MNIST's test split, not MNIST's
    assert 0 <= again["ood_auroc"] <= 1
    err = one_line_error(capsys, 2, ["evaluate", str(out), "--data-root", str(tmp_path / "no")])
    assert "FashionMNIST test file not found: expected" in err
    assert "pass a --data-root in torchvision layout (DIR/FashionMNIST/raw/...) or leave" in err


def test_factory_errors(tmp_path, capsys):
    out = ["--out", str(tmp_path / "o")]
    err = one_line_error(capsys, 2, ["fit", "no_such_module:net", *out])
    assert "cannot import 'no_such_module' for the factory 'no_such_module:net'" in err
    err = one_line_error(capsys, 2, ["fit", "_factories:missing", *out])
    assert "'_factories' has no attribute 'missing'" in err
    err = one_line_error(capsys, 2, ["fit", "_factories:needs_weights", *out])
    assert "factory '_factories:needs_weights' raised FileNotFoundError: weights.pt (call" in err
    err = one_line_error(capsys, 2, ["fit", "_factories:not_a_module", *out])
    assert "factory '_factories:not_a_module' returned an object of type str; it must" in err
    err = one_line_error(capsys, 2, ["fit", "_factories:NOT_CALLABLE", *out])
    assert "factory '_factories:NOT_CALLABLE' is an object of type int, not a callable" in err
    # SystemExit ended pyrouq with the factory's code and no message
    err = one_line_error(capsys, 2, ["fit", "_factories:exits", *out])
    assert "factory '_factories:exits' raised SystemExit: 3 (call it in Python" in err
    # the targets cannot be fixed on the command line (fit() said "Fix the targets")
    err = one_line_error(capsys, 2, ["fit", "_factories:five_classes", *out])
    assert (
        "factory '_factories:five_classes' builds a network with 5 outputs per image; MNIST "
        "and Fashion-MNIST have 10 classes: make it output 10 logits" in err
    )
    err = one_line_error(capsys, 2, ["fit", "mlp", "--kl-weight", "5", *out])
    assert "--kl-weight 5 applies to a Bayesian model" in err and "mlp has none" in err  # as typed
    err = one_line_error(capsys, 2, ["fit", "mlp", "--kl-weight", "-0", *out])  # (was "-0")
    assert "--kl-weight 0 applies to a Bayesian model" in err
    err = one_line_error(capsys, 2, ["fit", "batchensemble-lenet", "--prior-scale", "0.5", *out])
    assert "--prior-scale 0.5 applies to a Bayesian model" in err
    err = one_line_error(capsys, 2, ["fit", "mlp", "--method", "bayesian", *out])
    assert "--method applies to a factory" in err
    assert "--method" in run_exit(["fit", "_factories:tiny_residual", "--method", "deep"], capsys)
    err = one_line_error(capsys, 2, ["fit", "mlp", "--dataset", "fashion-mnist", *out])
    assert "which pyrouq does not bundle; pass --data-root" in err
    # both splits: a folder of train-* alone (as once told) was refused next for its test split
    assert "holding FashionMNIST/raw/train-* and t10k-* (both splits: the run is" in err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_factories_from_the_current_folder_and_modules_that_fail(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)  # the console script does not put it on sys.path itself
    (tmp_path / "here_nets.py").write_text(  # its forward imports a sibling as it trains
        "from torch import nn\n\nclass Flat(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fc = nn.Linear(784, 10)\n\n"
        "    def forward(self, x):\n        from here_helpers import flat\n\n"
        "        return self.fc(flat(x))\n\ndef flat():\n    return Flat()\n"
    )
    (tmp_path / "here_helpers.py").write_text("def flat(x):\n    return x.flatten(1)\n")
    (tmp_path / "broken_nets.py").write_text("raise RuntimeError('boom')\n")
    (tmp_path / "typo_nets.py").write_text("def net(:\n")
    (tmp_path / "dep_nets.py").write_text("import not_installed_xyz\n")
    (tmp_path / "typo_pkg").mkdir()
    (tmp_path / "typo_pkg" / "__init__.py").write_text("")
    (tmp_path / "typo_pkg" / "nets.py").write_text("import typo_pkg.helperz\n")
    argv = ["fit", "here_nets:flat", "--method", "plain", "--epochs", "1", "--train-size", "256"]
    assert main([*argv, "--out", "o", "--no-progress"]) == 0
    assert str(tmp_path) not in sys.path  # found there while it ran, not left on the path
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["factory_root"] == str(tmp_path.resolve())
    # evaluate from another folder finds the factory where the run found it
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    for name in ("here_nets", "here_helpers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert main(["evaluate", str(tmp_path / "o"), "--ood", "none", "--no-progress"]) == 0
    assert str(tmp_path.resolve()) not in sys.path  # and it does not stay on the path
    capsys.readouterr()
    (tmp_path / "here_nets.py").rename(tmp_path / "moved_nets.py")
    monkeypatch.delitem(sys.modules, "here_nets")
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path / "o"), "--ood", "none"])
    assert "cannot import 'here_nets' for the factory 'here_nets:flat' (No module named" in err
    assert f"(nor from {str(tmp_path.resolve())!r}, where the run found it)" in err
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, 2, ["fit", "broken_nets:net", "--out", "b"])
    assert (
        "importing 'broken_nets' for the factory 'broken_nets:net' raised RuntimeError: boom" in err
    )
    err = one_line_error(capsys, 2, ["fit", "typo_nets:net", "--out", "b"])
    assert "importing 'typo_nets' for the factory 'typo_nets:net' raised SyntaxError" in err
    err = one_line_error(capsys, 2, ["fit", "dep_nets:net", "--out", "b"])
    assert (
        "importing 'dep_nets' for the factory 'dep_nets:net' failed: No module named "
        "'not_installed_xyz', a module it imports; install 'not_installed_xyz'" in err
    )
    err = one_line_error(capsys, 2, ["fit", "typo_pkg.nets:net", "--out", "b"])
    assert "'typo_pkg.helperz', a module it imports; check that import (a typo, or a file" in err


def test_evaluate_of_a_file_of_a_class_made_in_a_function_names_that_class(tmp_path, capsys):
    """The command read the class load() names out of its message up to the first character
    that is no letter, digit or dot, so a class made in a function (qualified
    'test_cli.<fn>.<locals>.Net') was said to be 'a test_cli.<fn>', the function's name."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(784, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.flatten(1))

    pyrouq.save(tmp_path / "checkpoint.pt", Net())
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path)])
    assert f"holds a plain network, a {Net.__module__}.{Net.__qualname__}, written by" in err
    assert ".<locals>.Net, written by" in err


def test_evaluate_of_a_converted_network_that_save_wrote_says_to_evaluate_it_in_python(
    tmp_path, capsys, gloo_group
):
    model = pyrouq.batchensemble(
        torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)), 2
    )
    pyrouq.save(tmp_path / "checkpoint.pt", model)
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path)])
    assert (
        "holds a network converted from a torch.nn.modules.container.Sequential, written by "
        "pyrouq.save(), not `pyrouq fit`" in err
    )
    assert "evaluate it in Python: pyrouq.load(path, module=make_net()), then" in err
    # a plain network was called "a converted network" too: it says what came now
    pyrouq.save(tmp_path / "checkpoint.pt", torch.nn.Linear(784, 10))
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path)])
    assert (
        "holds a plain network, a torch.nn.modules.linear.Linear, written by pyrouq.save()" in err
    )
    # a file of an earlier pyrouq holding the DataParallel or DDP wrapper ('module.' names):
    # the advice left the wrapper out, which load(path, module=make_net()) then refused; DDP's
    # process group was said inside load()'s parentheses (not Python)
    from pyrouq.convert import module_record

    def make_net():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))

    ddp = "torch.nn.parallel.DistributedDataParallel"
    for wrap, name, where in [
        (torch.nn.DataParallel, "torch.nn.DataParallel", ""),
        (torch.nn.parallel.DistributedDataParallel, ddp,
         " in a process group (one of one process will do)"),
    ]:  # fmt: skip
        net = make_net()
        path = pyrouq.save(tmp_path / "checkpoint.pt", net)
        payload = torch.load(path, weights_only=True)
        description = json.loads(payload["description"])
        description["model"]["module"] = module_record(wrap(net))
        payload["description"] = json.dumps(description)
        payload["model"] = {f"module.{k}": v for k, v in payload["model"].items()}
        torch.save(payload, path)
        err = one_line_error(capsys, 2, ["evaluate", str(tmp_path)])
        assert err.rstrip("\n").endswith(
            f"evaluate it in Python: pyrouq.load(path, module={name}(make_net())){where}, "
            f"then pyrouq.predict (the file holds its {name} wrapper, saved by an earlier "
            "pyrouq)"
        ), err
        # the advice, followed (here, in a process group), loads the file
        loaded = pyrouq.load(path, module=wrap(make_net())).model
        assert torch.equal(loaded.module[1].weight, net[1].weight)


def test_a_file_load_refuses_for_another_reason_is_told_in_loads_words(tmp_path, capsys):
    """The command tells two of load()'s refusals in its own words (a skeleton the factory
    no longer builds, a file of pyrouq.save() without a skeleton), read from the error's
    attributes; another refusal (a description edited by hand) is load()'s own, with the
    factory's skeleton (no 'now builds another network') and without one alike."""
    from pyrouq.cli._run_dir import load_run

    def edited(path, model):
        pyrouq.save(path, model, pyrouq.mean_field_guide(model))
        payload = torch.load(path, weights_only=True)
        description = json.loads(payload["description"])
        description["guide"] = "x"
        payload["description"] = json.dumps(description)
        torch.save(payload, path)
        return path

    def make_net():
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))

    words = "cannot be rebuilt from its description or metadata (ValueError: "
    path = edited(tmp_path / "run" / "checkpoint.pt", pyrouq.BayesianMLP(784, 8, 10))
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path / "run"), "--no-progress"])
    assert err.startswith(f"pyrouq: error: {str(path)!r} {words}"), err
    path = edited(tmp_path / "b.pt", pyrouq.bayesian(make_net()))
    with pytest.raises(pyrouq.CheckpointError, match=re.escape(f"{str(path)!r} {words}")):
        load_run(path, make_net(), {"factory": "_factories:flat_mlp"}, None)


def test_a_lazy_factory_fits_and_evaluate_clears_an_earlier_evaluates_rotation_plot(
    tmp_path, capsys
):
    """A lazy layer failed --method plain in the command's parameter count (torch's message
    on uninitialised parameters), and evaluating its run in the skeleton's load."""
    out = tmp_path / "o"
    argv = ["fit", "_factories:lazy", "--method", "plain", "--epochs", "1", "--train-size", "256"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "fitting _factories:lazy (plain) (7,850 parameters)" in printed
    assert "MNIST images, 1 epoch of 1 batch of 256, device cpu" in printed  # (not "1 batches")
    (out / "rotation-evaluate.png").write_text("an earlier evaluate --shift rotate's")
    assert main(["evaluate", str(out), "--ood", "none", "--no-progress"]) == 0
    assert not (out / "rotation-evaluate.png").exists()
    assert (out / "reliability-evaluate.png").is_file()


def test_the_check_of_a_factorys_outputs_leaves_its_network_as_it_was(tmp_path, capsys):
    """A network that sets itself up on its first input saw the check's blank image first
    (a scale of 0, training ruined) when the check ran on the network itself."""
    out = tmp_path / "o"
    argv = ["fit", "_factories:first_input_scale", "--method", "plain", "--epochs", "1"]
    assert main([*argv, "--train-size", "256", "--out", str(out), "--no-progress"]) == 0
    saved = pyrouq.load(out / "checkpoint.pt", module=_factories.first_input_scale())
    assert float(saved.model[0].scale) > 0.5  # a training batch's spread, not the blank's 0


def test_a_factory_module_reached_by_a_link_is_found_where_it_was_imported(
    tmp_path, capsys, monkeypatch
):
    """factory_root followed the link to the file's folder, where evaluate then looked in
    vain (and said the run had found it there)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "proj").mkdir()
    (tmp_path / "src" / "real_nets.py").write_text(
        "from torch import nn\n\ndef small():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))\n"
    )
    (tmp_path / "proj" / "linked_nets.py").symlink_to(tmp_path / "src" / "real_nets.py")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "proj"), *sys.path])
    out = tmp_path / "o"
    argv = ["fit", "linked_nets:small", "--method", "plain", "--epochs", "1"]
    assert main([*argv, "--train-size", "256", "--out", str(out), "--no-progress"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["factory_root"] == str(tmp_path / "proj")
    monkeypatch.setattr(sys, "path", sys.path[1:])
    monkeypatch.delitem(sys.modules, "linked_nets")
    assert main(["evaluate", str(out), "--ood", "none", "--no-progress"]) == 0


def test_an_unwritable_out_and_a_diverging_run_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    err = one_line_error(capsys, 2, ["fit", "mlp", "--train-size", "256", "--out",
                                     str(tmp_path / "file" / "run")])  # fmt: skip
    assert "cannot write the run folder --out" in err and "pass a folder you can write to" in err
    argv = ["fit", "mlp", "--lr", "1e30", "--train-size", "1024", "--epochs", "2", "--out"]
    err = one_line_error(capsys, 2, [*argv, str(tmp_path / "nan"), "--no-progress"])
    assert "Non-finite loss (nan) at epoch 1" in err and err.endswith(" Lower --lr.\n")


def test_a_refused_run_leaves_none_of_the_folders_it_made(tmp_path, capsys):
    # `--out new/<300 characters>` was refused (ENAMETOOLONG) after mkdir(parents=True) had
    # made new/, and a run refused before it trained removed its folder but not new/deeper/
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("")
    argv = ["fit", "mlp", "--train-size", "256", "--no-progress", "--out"]
    for out in (tmp_path / "new" / ("a" * 300), tmp_path / "kept" / "new" / ("a" * 300)):
        err = one_line_error(capsys, 2, [*argv, str(out)])
        assert "cannot write the run folder --out" in err and ": File name too long; " in err
    argv = ["fit", "mlp", "--lr", "1e30", "--train-size", "1024", "--epochs", "2"]
    err = one_line_error(capsys, 2, [*argv, "--no-progress", "--out", str(tmp_path / "n/d/r")])
    assert "Non-finite loss (nan) at epoch 1, step 2; training stopped. Lower" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["kept", "mine.txt"]


def test_overwrite_keeps_nothing_of_the_earlier_run_and_only_once_the_new_one_is_built(
    tmp_path, capsys
):
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "256", "--no-progress", "--out"]
    assert main([*argv, str(tmp_path)]) == 0
    capsys.readouterr()
    (tmp_path / "metrics-evaluate.json").write_text("{}")
    (tmp_path / "my_diagram.png").write_text("the user's")  # not the run's: kept
    before = sorted(p.name for p in tmp_path.iterdir())
    one_line_error(capsys, 2, ["fit", "no_such_module:net", "--out", str(tmp_path), "--overwrite"])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # refused: nothing removed
    diverging = ["fit", "mlp", "--lr", "1e30", "--train-size", "1024", "--no-progress"]
    err = one_line_error(capsys, 2, [*diverging, "--out", str(tmp_path), "--overwrite"])
    assert "Non-finite loss" in err
    # the new run failed: its config stays, none of the earlier run's files beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "my_diagram.png"]
    assert '"lr": 1e+30' in (tmp_path / "config.json").read_text()


def test_a_factory_given_as_a_file_path_is_told_its_import_name(tmp_path, capsys, monkeypatch):
    """A file path (fp_nets.py:make, fp_pkg/fp_nets.py:make, ./fp_nets:make) failed with Python's
    import error (a relative import needing 'package', "'nets' is not a package")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fp_pkg").mkdir()
    (tmp_path / "fp_pkg" / "fp_nets.py").write_text("from torch import nn\n")
    (tmp_path / "fp_nets.py").write_text("from torch import nn\n")
    out = ["--out", "o"]
    err = one_line_error(capsys, 2, ["fit", "fp_nets.py:make", *out])
    assert (
        "the factory 'fp_nets.py:make' names a file, not a module: give the module's dotted "
        "import name, 'fp_nets:make' from the folder holding it\n" in err
    )
    err = one_line_error(capsys, 2, ["fit", "fp_pkg/fp_nets.py:make", *out])
    assert (
        "import name, 'fp_pkg.fp_nets:make' from this folder, or 'fp_nets:make' with its folder on "
        "PYTHONPATH\n" in err
    )
    err = one_line_error(capsys, 2, ["fit", "./fp_nets:make", *out])
    assert "'./fp_nets:make' names a file, not a module" in err and "'fp_nets:make' from the" in err
    # a drive's ':' is not the factory's (was "cannot import 'C'"); an absolute path has no
    # dotted name from this folder (was 'tmp.….fp_pkg.fp_nets:make')
    for path in ("C:\\fp_pkg\\fp_nets.py", "C:/fp_pkg/fp_nets.py", f"{tmp_path}/fp_pkg/fp_nets.py"):
        err = one_line_error(capsys, 2, ["fit", f"{path}:make", *out])
        assert err.endswith(
            f"the factory {path + ':make'!r} names a file, not a module: give the module's "
            "dotted import name, 'fp_nets:make' with its folder on PYTHONPATH\n"
        ), err
    assert not (tmp_path / "o").exists()
    sys.modules.pop("fp_nets", None)  # imported by the first attempt


def test_a_lazy_factory_that_fails_on_the_images_is_refused_with_the_networks_error(
    tmp_path, capsys, monkeypatch
):
    """The command ran the blank image, the network failed on it, and the error then said
    torch's "Attempted to use an uninitialized parameter" (plain) or "run one batch through
    the network first" (converted), which the command had done."""
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    (tmp_path / "rgb_nets.py").write_text(
        "from torch import nn\n\ndef lazy_rgb():\n    return nn.Sequential(nn.Conv2d(3, 4, 3), "
        "nn.Flatten(), nn.LazyLinear(10))\n"
    )
    for method in ("plain", "bayesian"):
        argv = ["fit", "rgb_nets:lazy_rgb", "--method", method, "--out", str(tmp_path / "o")]
        err = one_line_error(capsys, 2, argv)
        assert (
            "factory 'rgb_nets:lazy_rgb' builds a network whose lazy layers could not take their "
            "shapes: it fails on a (1, 1, 28, 28) MNIST image with RuntimeError: " in err
        )
        assert "to have 3 channels, but got 1" in err and err.endswith("(B, 1, 28, 28) images\n")


def test_plain_method_on_a_factory_of_a_bayesian_model_says_what_to_return(tmp_path, capsys):
    """fit() asked for guide=mean_field_guide(model), which the command cannot take."""
    argv = ["fit", "pyrouq.models:BayesianMLP", "--method", "plain", "--out", str(tmp_path / "o")]
    err = one_line_error(capsys, 2, argv)
    assert (
        "factory 'pyrouq.models:BayesianMLP' returned BayesianMLP, a Bayesian pyrouq model (it "
        "has latent sites), which --method plain trains without a guide; make the factory "
        "return the plain network and pick the --method\n" in err
    )
    assert "guide=" not in err


@pytest.mark.parametrize("kind", ["folder", "read-only"])
def test_evaluate_that_cannot_write_into_the_run_folder_is_one_line(
    kind, bayes_run, tmp_path, capsys, monkeypatch
):
    """A run folder evaluate cannot write into (read-only, or a folder where a file goes) was
    a traceback, after the whole evaluation; then a read-only earlier metrics-evaluate.json
    (the folder writable) was refused after it, saying to evaluate a copy (which keeps it)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bayes_run, run)
    target = run / "metrics-evaluate.json"
    target.unlink(missing_ok=True)
    if kind == "folder":
        target.mkdir()
    else:
        target.write_text("{}\n")
        target.chmod(0o444)
        access = os.access  # root may write a read-only file: as a user may not
        monkeypatch.setattr(
            os, "access", lambda p, mode: access(p, mode) and not (Path(p) == target and mode)
        )
    evaluate = importlib.import_module("pyrouq.cli._evaluate")  # (pyrouq.cli._evaluate: a function)
    monkeypatch.setattr(evaluate, "_evaluate_run", None)  # refused before it
    err = one_line_error(capsys, 2, ["evaluate", str(run), "--num-samples", "2", "--ood", "none",
                                     "--no-progress"])  # fmt: skip
    why = "a folder; remove it" if kind == "folder" else "read-only; make it writable or remove it"
    assert (
        f"cannot write the evaluation into RUN_DIR {str(run)!r}: metrics-evaluate.json there is "
        f"{why} (evaluate writes it) and evaluate again\n" in err
    )


def test_evaluate_whose_write_fails_is_one_line(bayes_run, tmp_path, capsys, monkeypatch):
    """A write that fails once the evaluation is done (a full disk) is one line too."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bayes_run, run)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(run / "metrics-evaluate.json"))

    monkeypatch.setattr(importlib.import_module("pyrouq.cli._evaluate"), "_write_metrics", full)
    err = one_line_error(capsys, 2, ["evaluate", str(run), "--num-samples", "2", "--ood", "none",
                                     "--no-progress"])  # fmt: skip
    assert (
        f"cannot write the evaluation into RUN_DIR {str(run)!r} (No space left on device: " in err
    )
    assert err.endswith("evaluate a copy of the run folder in a folder you can write to\n")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("dataset", "cifar", "its config's 'dataset' is 'cifar', where `pyrouq fit` writes mnist "
         "or fashion-mnist"),
        ("factory", 5, "its config's 'factory' is 5, where `pyrouq fit` writes "
         "package.module:factory or null"),
        ("batch_size", "x", "its config's 'batch_size' is 'x', where `pyrouq fit` writes a "
         "positive integer"),
    ],
)  # fmt: skip
def test_evaluate_refuses_a_damaged_config_value(key, value, expected, bayes_run, tmp_path, capsys):
    """A damaged config evaluated another data set silently ('cifar': Fashion-MNIST's test
    split), or failed with a traceback (a factory that is no text) or with fit()'s words."""
    payload = torch.load(bayes_run / "checkpoint.pt", weights_only=True)
    metadata = json.loads(payload["metadata"])
    metadata["config"][key] = value
    payload["metadata"] = json.dumps(metadata)
    torch.save(payload, tmp_path / "checkpoint.pt")
    err = one_line_error(capsys, 2, ["evaluate", str(tmp_path), "--ood", "none"])
    assert f"'{tmp_path / 'checkpoint.pt'}' has damaged metadata: {expected}; run" in err
    assert not (tmp_path / "metrics-evaluate.json").exists()


def test_evaluate_when_the_factory_builds_another_network_names_the_factory(
    tmp_path, capsys, monkeypatch
):
    """The error spoke of a "skeleton" the user never built and said to build it exactly as
    the saved one, not which factory built it."""
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    module = tmp_path / "changing_nets.py"
    module.write_text("from torch import nn\n\ndef net():\n"
                      "    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))\n")  # fmt: skip
    out = tmp_path / "o"
    argv = ["fit", "changing_nets:net", "--method", "plain", "--epochs", "1", "--train-size"]
    assert main([*argv, "64", "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    module.write_text(module.read_text().replace("10)", "10, bias=False)"))
    monkeypatch.delitem(sys.modules, "changing_nets")
    err = one_line_error(capsys, 2, ["evaluate", str(out), "--ood", "none", "--no-progress"])
    assert (
        "the factory 'changing_nets:net', called to rebuild the run's network, now builds "
        "another network: " in err
    )
    assert "parameter '1.bias' is shape (10,) in the checkpoint and absent in the skeleton; " in err
    assert err.endswith("make the factory build what it built when the run trained, or fit "
                        "the run again\n")  # fmt: skip


def test_torchrun_fits_on_two_ranks_and_rank_0_writes(tmp_path):
    out = tmp_path / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "pyrouq", "fit", "bayesian-mlp", "--epochs", "1",
               "--train-size", "1025", "--out", str(out), "--no-progress"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_in_own_group(command, env, timeout=300)
    # a rank's own traceback comes first, torchrun's summary of the failure after it
    assert done.returncode == 0, done.stderr[:3000] + "\n...\n" + done.stderr[-1500:]
    assert done.stdout.count("pyrouq 0.1.0: fitting BayesianMLP") == 1  # rank 0 alone prints
    assert done.stdout.count("\nepoch 1: loss ") == 1  # (as its epoch ended: rank 0's callback)
    # 1,025 images: shards padded to 513 each, so that both ranks take as many steps
    banner = re.search(r"1 epoch of (\d+) batches of (\d+) on each of 2 ranks", done.stdout)
    assert banner is not None, done.stdout
    assert int(banner[1]) == math.ceil(513 / int(banner[2]))
    config = json.loads((out / "config.json").read_text())
    assert config["world_size"] == 2
    assert {"metrics.json", "checkpoint.pt"} <= {p.name for p in out.iterdir()}
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.15 < metrics["acc"] <= 1.0  # 4 steps per rank: above chance, no more


def test_evaluate_under_torchrun_is_left_to_rank_0(bayes_run, monkeypatch, capsys):
    # `torchrun --nproc_per_node 2 -m pyrouq evaluate RUN` evaluated the run on every rank:
    # the tables printed twice, each rank writing the same metrics-evaluate.json and plots
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    argv = ["evaluate", str(bayes_run), "--num-samples", "2", "--ood", "none", "--no-progress"]
    before = {p.name: p.stat().st_mtime_ns for p in bayes_run.iterdir()}
    assert main(argv) == 0
    assert capsys.readouterr() == ("", "")
    assert {p.name: p.stat().st_mtime_ns for p in bayes_run.iterdir()} == before  # no writes
