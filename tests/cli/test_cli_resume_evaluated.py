"""`pyrouq fit --resume`, twelfth audit: a run stopped while it evaluated (after training) is
finished by --resume, to the bit of the uninterrupted run (fit() refused it in Python's words:
"epochs=3"); the printed resume command finds a factory's module where the run found it, as
`pyrouq evaluate` does (it failed from another folder); a run folder whose config.json is
missing, damaged or of another pyrouq is refused in one line that says what to do (a missing
one sent the user between --resume and no --resume; an older record was "null there, null
now", telling to run the command just run); a final checkpoint without its metrics.json is
told in the command's words. The figures are checked against predict() / evaluate() in Python.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import sys

import pyro
import pytest
import torch
from _cli import one_line_error
from torch import nn

import pyrouq
from pyrouq.cli import main

FACTORY = "test_cli_resume_evaluated:make"
ARGV = ["fit", FACTORY, "--epochs", "2", "--train-size", "128", "--batch-size", "64"]
ARGV += ["--seed", "7", "--num-samples", "2", "--no-progress"]
FILES = ["checkpoint.pt", "config.json", "image_grid.png", "metrics.json",
         "most_uncertain.png", "reliability.png", "risk_coverage.png", "training_curves.png",
         "uncertainty.png"]  # fmt: skip


class StopsEvaluating(nn.Module):
    """An MNIST network that raises KeyboardInterrupt (Ctrl-C) when run in eval mode once
    trained (its weights moved) while ``armed``: the run's evaluation after training."""

    armed = False

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.ReLU(), nn.Linear(8, 10))
        self.start = self.body[1].weight.detach().clone()

    def forward(self, x):
        trained = not torch.equal(self.body[1].weight.detach(), self.start)
        if StopsEvaluating.armed and trained and not self.training:
            raise KeyboardInterrupt
        return self.body(x)


def make() -> nn.Module:  # `pyrouq fit test_cli_resume_evaluated:make`
    return StopsEvaluating()


def make_ensemble() -> nn.Module:  # `pyrouq fit test_cli_resume_evaluated:make_ensemble`
    return pyrouq.batchensemble(StopsEvaluating(), 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run in full/ and the same run stopped while it evaluated in part/:
    (folder, what the interruption printed on stderr)."""
    folder = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYROUQ_DATA", raising=False)
        assert main([*ARGV, "--out", str(folder / "full")]) == 0
        patch.setattr(StopsEvaluating, "armed", True)
        err = io.StringIO()  # (capsys is the tests')
        with contextlib.redirect_stderr(err):
            code = main([*ARGV, "--out", str(folder / "part")])
    assert code == 130, err.getvalue()
    shutil.copytree(folder / "part", folder / "stopped")  # as stopped (the test of part ends it)
    return folder, err.getvalue()


def _states(path):
    saved = pyrouq.load(path, module=make())
    return saved, {**saved.model.state_dict(), **{"guide." + k: v for k, v in
                                                  saved.guide.state_dict().items()}}  # fmt: skip


def test_a_run_stopped_while_it_evaluated_is_finished_by_resume_as_the_uninterrupted_run(
    runs, capsys, monkeypatch
):
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    folder, err = runs
    part, full = folder / "part", folder / "full"
    assert sorted(os.listdir(part)) == ["checkpoint.pt", "config.json"]
    printed = err.split("without training: ")[1].rsplit(")", 1)[0]
    assert printed == shlex.join(["pyrouq", *ARGV, "--out", str(part), "--resume"])
    config_before = (part / "config.json").read_text()
    loaded, load = [], torch.load  # (read three times before: now once)
    monkeypatch.setattr(torch, "load", lambda f, *a, **k: loaded.append(str(f)) or load(f, *a, **k))
    assert main(shlex.split(printed)[1:]) == 0  # fit() refused it: "e.g. epochs=3"
    monkeypatch.setattr(torch, "load", load)
    assert loaded == [str(part / "checkpoint.pt")]
    out = capsys.readouterr().out
    assert sorted(os.listdir(part)) == FILES == sorted(os.listdir(full))
    # the epochs' lines, the final checkpoint and metrics are the uninterrupted run's
    epochs = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and epochs[1].startswith("epoch 2: loss ")
    _, want_states = _states(full / "checkpoint.pt")
    got, got_states = _states(part / "checkpoint.pt")
    assert want_states.keys() == got_states.keys()
    assert [k for k in want_states if not torch.equal(want_states[k], got_states[k])] == []
    assert got.training is None  # the final checkpoint: weights and metrics
    fitted = json.loads((full / "metrics.json").read_text())
    again = json.loads((part / "metrics.json").read_text())
    timings = ("eval_seconds", "train_seconds")
    assert {k: v for k, v in again.items() if k not in timings} == {
        k: v for k, v in fitted.items() if k not in timings
    }
    assert again["train_seconds"] > 0
    assert got.metadata["metrics"] == again
    assert (part / "config.json").read_text() == config_before
    # the figures, recomputed in Python from the checkpoint: the test split, drawn after
    # seeding with --seed as the command does
    _, test = pyrouq.load_mnist(64, seed=7, train_size=128)
    pyro.set_rng_seed(7)
    preds = pyrouq.predict(got.model, test.transform(test.images), got.guide, num_samples=2,
                           progress=False)  # fmt: skip
    probs = preds.probs.mean(0)
    labels = test.labels
    assert preds.probs.shape == (2, 10000, 10)
    acc = (probs.argmax(-1) == labels).double().mean().item()
    nll = -probs[torch.arange(len(labels)), labels].double().log().mean().item()
    assert again["acc"] == pytest.approx(acc, abs=1e-9)
    assert again["nll"] == pytest.approx(nll, rel=1e-5)
    assert 0.1 < again["acc"] < 0.9  # a run that learnt something, not all of it
    # and the finished run is not resumed again
    err = one_line_error(capsys, [*ARGV, "--out", str(part), "--resume"])
    assert f"--resume: the run in {str(part)!r} finished (it wrote metrics.json)" in err


def test_a_final_checkpoint_without_its_metrics_is_told_in_the_commands_words(
    runs, tmp_path, capsys, monkeypatch
):
    """Stopped between writing the final checkpoint and metrics.json: fit()'s refusal said to
    start a new fit() from pyrouq.load(path) (Python's words)."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    for name in ("checkpoint.pt", "config.json"):
        (run / name).write_bytes((runs[0] / "full" / name).read_bytes())
    err = one_line_error(capsys, [*ARGV, "--out", str(run), "--resume"])
    assert err == (
        f"pyrouq: error: --resume: the run in {str(run)!r} trained and was evaluated (its "
        "checkpoint.pt is the final one, without the training state), but was stopped before "
        f"it wrote metrics.json; evaluate it with `pyrouq evaluate {run}`, or start it anew "
        "there with --overwrite\n"
    )


def test_a_run_trained_in_full_whose_history_was_edited_is_refused_in_the_commands_words(
    runs, tmp_path, capsys, monkeypatch
):
    """--resume of a run stopped while it evaluated built its fit() result as
    EpochRecord(**record) from the training state's history, without the check fit() makes
    of it: a hand-edited record failed as 'EpochRecord.__init__() got an unexpected keyword
    argument 'acc''. It is refused as fit() refuses a training state it did not write, in the
    command's words: fit()'s advice, a new fit() from pyrouq.load(path), is Python's, and
    load(path) takes no factory's network without its skeleton."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run = tmp_path / "run"
    shutil.copytree(runs[0] / "stopped", run)
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    first = payload["training"]["history"][0]
    edited = {**payload["training"], "history": [{**first, "acc": 0.5}]}
    torch.save({**payload, "training": edited}, run / "checkpoint.pt")
    err = one_line_error(capsys, [*ARGV, "--out", str(run), "--resume"])
    told = (
        f"pyrouq: error: --resume: the run in {str(run)!r} has a checkpoint.pt whose training "
        "state pyrouq fit did not write ('history' record 1 has the keys ['epoch', 'loss', "
        "'nll', 'kl', 'train_acc', 'seconds', 'acc'], where an epoch record has ['epoch', "
        "'loss', 'nll', 'kl', 'train_acc', 'seconds']): the file was edited. Start the run "
        "anew there with --overwrite.\n"
    )
    assert err == told, err
    assert sorted(os.listdir(run)) == ["checkpoint.pt", "config.json"]  # nothing written
    # fit() refuses it in the same words where the run was stopped before its last epoch
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    torch.save({**payload, "training": {**payload["training"], "epochs_done": 1}},
               run / "checkpoint.pt")  # fmt: skip
    assert one_line_error(capsys, [*ARGV, "--out", str(run), "--resume"]) == told
    # the advice, followed, trains the run anew
    with contextlib.redirect_stderr(io.StringIO()):
        assert main([*ARGV, "--out", str(run), "--overwrite"]) == 0
    assert "metrics.json" in os.listdir(run)


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("num_data", "128", "'num_data' is '128', not a count from 1"),
        ("num_data", 0, "'num_data' is 0, not a count from 1"),
        ("num_particles", 1.5, "'num_particles' is 1.5, not a count from 1"),
        ("world", 0, "'world' is 0, not a count from 1"),
        ("kl_weight", "x", "'kl_weight' is 'x', not a weight of 0 or more"),
        ("kl_weight", None, "'kl_weight' is None, not a weight of 0 or more"),
        ("kl_weight", -1.0, "'kl_weight' is -1.0, not a weight of 0 or more"),
    ],
)
def test_a_run_trained_in_full_whose_settings_were_edited_is_refused_in_the_commands_words(
    runs, tmp_path, capsys, monkeypatch, key, value, said
):
    """--resume of a run stopped while it evaluated read num_data, kl_weight and
    num_particles with bare int() / float(): a hand-edited value failed in Python's words
    ("invalid literal for int() with base 10: 'x'", "float() argument must be a string or a
    real number, not 'NoneType'") or went into the run's result (num_data=0). Refused as a
    training state pyrouq fit did not write, in the command's words (fit(resume_from=) refuses
    it too, in its own)."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run = tmp_path / "run"
    shutil.copytree(runs[0] / "stopped", run)
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    torch.save({**payload, "training": {**payload["training"], key: value}}, run / "checkpoint.pt")
    err = one_line_error(capsys, [*ARGV, "--out", str(run), "--resume"])
    assert err.strip() == (
        f"pyrouq: error: --resume: the run in {str(run)!r} has a checkpoint.pt whose training "
        f"state pyrouq fit did not write ({said}): the file was edited. Start the run anew "
        "there with --overwrite."
    ), err
    assert sorted(os.listdir(run)) == ["checkpoint.pt", "config.json"]  # nothing written


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        (("num_data",), "'num_data'"),
        (("kl_weight",), "'kl_weight'"),
        (("num_particles", "num_data", "kl_weight"), "'num_data', 'kl_weight', 'num_particles'"),
    ],
)
def test_a_run_trained_in_full_before_its_settings_were_saved_is_refused_in_the_commands_words(
    runs, tmp_path, capsys, monkeypatch, keys, named
):
    """A checkpoint.pt of a pyrouq whose fit() did not record num_data, kl_weight and
    num_particles in the training state (2026-11-30 to 2026-12-04): --resume of such a run
    trained in full read them with a bare index, a KeyError traceback ('num_data'). Refused
    in the command's words, naming the settings it lacks; its advice was only to start anew
    with --overwrite, throwing the trained run away, where `pyrouq evaluate RUN`, which needs
    none of them, evaluates it: that is said first, and followed it gives the figures of the
    uninterrupted run."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run = tmp_path / "run"
    shutil.copytree(runs[0] / "stopped", run)
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    older = {k: v for k, v in payload["training"].items() if k not in keys}
    torch.save({**payload, "training": older}, run / "checkpoint.pt")
    err = one_line_error(capsys, [*ARGV, "--out", str(run), "--resume"])
    assert err.strip() == (
        f"pyrouq: error: --resume: the run in {str(run)!r} trained in full, but its "
        f"checkpoint.pt, written by an earlier pyrouq, records no {named} among its training "
        "settings, which --resume reads to finish the run; evaluate the trained run with "
        f"`pyrouq evaluate {run}` (metrics-evaluate.json and its plots), or start the run anew "
        "there with --overwrite to train it again"
    ), err
    assert sorted(os.listdir(run)) == ["checkpoint.pt", "config.json"]  # nothing written
    # the advice, followed: the trained run evaluated, its figures the uninterrupted run's
    command = err.split("evaluate the trained run with `")[1].split("`")[0]
    assert main([*shlex.split(command)[1:], "--no-progress"]) == 0
    assert sorted(os.listdir(run)) == [
        "checkpoint.pt", "config.json", "image_grid-evaluate.png", "metrics-evaluate.json",
        "most_uncertain-evaluate.png", "reliability-evaluate.png", "risk_coverage-evaluate.png",
        "uncertainty-evaluate.png",
    ]  # fmt: skip
    fitted = json.loads((runs[0] / "full" / "metrics.json").read_text())
    again = json.loads((run / "metrics-evaluate.json").read_text())
    timings = ("eval_seconds", "train_seconds")
    assert {k: v for k, v in again.items() if k not in timings} == {
        k: v for k, v in fitted.items() if k not in timings
    }
    assert 0.1 < again["acc"] < 0.9 and again["seed"] == 7 and again["num_samples"] == 2


NETS = """import os, signal
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(784, {width}), nn.ReLU(),
                                  nn.Linear({width}, 10))
        self.passes = 0

    def forward(self, x):
        if self.training:
            self.passes += 1
            if self.passes == int(os.environ.get("A12_CTRL_C_AT", "0")):
                os.kill(os.getpid(), signal.SIGINT)
        return self.body(x)

def make():
    return Net()
"""


def _interrupted_in_training(tmp_path, monkeypatch, capsys, name="a12_nets"):
    """A factory run of the module ``name`` in tmp_path/project, started there, stopped by
    Ctrl-C in epoch 2: (the run folder, the resume command it printed, the command's words)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / f"{name}.py").write_text(NETS.format(width=8))
    monkeypatch.chdir(project)
    monkeypatch.setenv("A12_CTRL_C_AT", "3")
    argv = ["fit", f"{name}:make", *ARGV[2:]]
    assert main([*argv, "--out", "run"]) == 130
    err = capsys.readouterr().err
    assert "interrupted in epoch 2 after step 1" in err
    monkeypatch.delenv("A12_CTRL_C_AT")
    monkeypatch.delitem(sys.modules, name)  # a fresh process: nothing imported
    return project / "run", err.split("(resume it: ")[1].rsplit(")", 1)[0], argv


def test_the_printed_resume_command_finds_the_factory_where_the_run_found_it(
    tmp_path, monkeypatch, capsys
):
    """README: the command "works pasted into a fresh shell in any folder"; for a factory found
    in the folder the run started in, it failed with "cannot import 'a12_nets'"."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run, printed, argv = _interrupted_in_training(tmp_path, monkeypatch, capsys)
    assert printed == shlex.join(["pyrouq", *argv, "--out", str(run), "--resume"])
    # another module of that name where one resumes: refused, naming the run's folder
    other = tmp_path / "other"
    other.mkdir()
    (other / "a12_nets.py").write_text(NETS.format(width=8))
    monkeypatch.chdir(other)
    err = one_line_error(capsys, shlex.split(printed)[1:])
    project = str(tmp_path / "project")
    assert (
        f'(factory_root "{project}" there, "{other}" now) (a module \'a12_nets\' is imported '
        f"from another folder here: resume from {project!r}, the run's, or put it first on "
        "PYTHONPATH); run the recorded command with --resume:"
    ) in err
    sys.modules.pop("a12_nets", None)
    # from a folder without it: the run's folder is where it is found
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    paths = list(sys.path)
    assert main(shlex.split(printed)[1:]) == 0, capsys.readouterr().err
    assert sys.path == paths  # the folder is taken off the path again
    assert sorted(os.listdir(run)) == FILES
    config = json.loads((run / "config.json").read_text())
    assert config["factory_root"] == project
    capsys.readouterr()
    sys.modules.pop("a12_nets", None)
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    fitted = json.loads((run / "metrics.json").read_text())
    again = json.loads((run / "metrics-evaluate.json").read_text())
    assert (again["acc"], again["nll"]) == (fitted["acc"], fitted["nll"])


def test_a_run_folder_whose_record_is_missing_damaged_or_of_another_pyrouq(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    run, printed, _ = _interrupted_in_training(tmp_path, monkeypatch, capsys, "a12_nets_b")
    words = shlex.split(printed)[1:]
    plain = [w for w in words if w != "--resume"]
    record = (run / "config.json").read_text()
    config = json.loads(record)
    # no config.json beside the checkpoint: each refusal sent the user to the other
    (run / "config.json").unlink()
    err = one_line_error(capsys, words)
    assert err == (
        f"pyrouq: error: --resume: {str(run)!r} holds a checkpoint.pt but no config.json, the "
        "record of the run that --resume checks this command against; start the run anew there "
        "with --overwrite, or pass another --out\n"
    )
    err = one_line_error(capsys, plain)
    assert err == (
        f"pyrouq: error: --out {str(run)!r} exists and is not empty; pass --overwrite or "
        "another folder\n"
    )
    # a damaged one: what to do
    (run / "config.json").write_text(record[:40])
    err = one_line_error(capsys, words)
    assert err.startswith(f"pyrouq: error: --resume: cannot read {str(run / 'config.json')!r} (")
    assert err.endswith(
        "), the record of the run that --resume checks this command against; start the run "
        "anew there with --overwrite\n"
    )
    # a later pyrouq's record, with an entry this one does not know
    later = {**config, "schedule": "cosine", "versions": {**config["versions"], "pyrouq": "9.0"}}
    (run / "config.json").write_text(json.dumps(later))
    err = one_line_error(capsys, words)
    assert err == (
        f"pyrouq: error: --resume: {str(run / 'config.json')!r} records schedule, which this "
        f"pyrouq ({pyrouq.__version__}) does not know: resume it with pyrouq 9.0, which "
        "started it, or start it anew there with --overwrite\n"
    )
    # an earlier pyrouq's, without entries this one records ("norms null there, null now")
    earlier = {k: v for k, v in config.items() if k not in ("norms", "world_size")}
    earlier["versions"] = {**config["versions"], "pyrouq": "0.0.1"}
    (run / "config.json").write_text(json.dumps(earlier))
    err = one_line_error(capsys, words)
    assert err == (
        f"pyrouq: error: --resume: {str(run / 'config.json')!r} does not record norms, "
        f"world_size, which this pyrouq ({pyrouq.__version__}) records: resume it with pyrouq "
        "0.0.1, which started it, or start it anew there with --overwrite\n"
    )
    # the same pyrouq's without them: an edited record
    (run / "config.json").write_text(json.dumps({**earlier, "versions": config["versions"]}))
    err = one_line_error(capsys, words)
    assert err.endswith(
        "records: not the record this pyrouq's `pyrouq fit` writes (edited, or of an earlier "
        "build); start the run anew there with --overwrite\n"
    )
    # its record put back, the run resumes (the refusals left the run as it was)
    (run / "config.json").write_text(record)
    assert main(words) == 0
    assert json.loads((run / "metrics.json").read_text())["seed"] == 7


class FixedBackbone(nn.Module):
    """A backbone kept fixed the torch way, under no_grad in the forward."""

    def __init__(self):
        super().__init__()
        self.back = nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.ReLU())
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        with torch.no_grad():
            h = self.back(x)
        return self.head(h)


def make_fixed() -> nn.Module:  # `pyrouq fit test_cli_resume_evaluated:make_fixed`
    return FixedBackbone()


def test_a_factory_running_latent_layers_under_no_grad_is_refused_by_the_command(tmp_path, capsys):
    # fit() warns (a staged fine-tuning may unfreeze them later); the command never does, so
    # the warning is its refusal, in its words, and no run folder is left
    argv = ["fit", "test_cli_resume_evaluated:make_fixed", *ARGV[2:], "--out", str(tmp_path / "r")]
    err = one_line_error(capsys, argv).strip()
    assert err.startswith(
        "pyrouq: error: factory 'test_cli_resume_evaluated:make_fixed', --method bayesian: "
        "FixedBackbone's forward ran the layer 'back.1', which holds latent weights, only "
        "under torch.no_grad()"
    )
    assert err.endswith(
        "To keep them fixed, freeze them in the factory (layer.requires_grad_(False)) or pick "
        "--method last-layer; to make them Bayesian, run them with gradients."
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.filterwarnings("ignore:factory .* prior .* on the rank-1 factors")
@pytest.mark.parametrize("method", ["bayesian", "plain"])
def test_a_run_of_a_factorys_batchensemble_is_evaluated_and_resumed(
    method, tmp_path, capsys, monkeypatch
):
    """A factory returning batchensemble(net, 2), trained with --method bayesian (its factors
    latent, as the command suggests for such a factory) or --method plain: `pyrouq evaluate`
    of the run, and --resume of it stopped while it evaluated, exited 2 with load()'s Python
    advice ('module= got a BatchEnsembleNetwork, a pyrouq model, but it takes the plain
    network ...'). load() takes the ensemble as the skeleton: evaluate's figures are fit's."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    argv = ["fit", "test_cli_resume_evaluated:make_ensemble", "--method", method, "--epochs"]
    argv += ["1", "--train-size", "128", "--batch-size", "64", "--seed", "7", "--no-progress"]
    argv += ["--num-samples", "2"] if method == "bayesian" else []
    run = tmp_path / "run"
    if method == "bayesian":  # stopped while it evaluated, then finished by --resume
        monkeypatch.setattr(StopsEvaluating, "armed", True)
        assert main([*argv, "--out", str(run)]) == 130
        monkeypatch.setattr(StopsEvaluating, "armed", False)
        argv.append("--resume")
    capsys.readouterr()
    assert main([*argv, "--out", str(run)]) == 0, capsys.readouterr().err
    assert main(["evaluate", str(run), "--no-progress"]) == 0, capsys.readouterr().err
    fitted, again = (json.loads((run / name).read_text()) for name in
                     ("metrics.json", "metrics-evaluate.json"))  # fmt: skip
    timings = ("eval_seconds", "train_seconds")
    assert {k: v for k, v in again.items() if k not in timings} == {
        k: v for k, v in fitted.items() if k not in timings
    }
    # predictions of 2 members (2 draws each for the rank-1 network)
    assert 0 < fitted["acc"] < 1 and fitted["num_samples"] == (4 if method == "bayesian" else 2)
