"""The `pyrouq` command, sixth audit: SIGTERM (a cluster's preemption) handled as Ctrl-C, a
killed run's temporary checkpoint removed by --overwrite, the data folder recorded as found,
evaluate recording its seed, and library errors (no parameters, select=, a prior scale the
dtype cannot hold) told in the command's option names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq.cli import main


def one_line_error(capsys, argv):
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "mlp"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--seed", "3", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    return out


# factories of these tests (`pyrouq fit test_cli_sigterm_and_config:...`)


def no_parameters() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.AdaptiveAvgPool1d(10))


class _OwnWeight(nn.Module):
    """A network with a parameter of its own and no nn.Linear or convolution layer."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(784, 10))

    def forward(self, x):
        return x.flatten(1) @ self.w


def own_weight() -> nn.Module:
    return _OwnWeight()


def two_dtypes() -> nn.Module:
    """A first layer in float64, which holds 1e-50, and a second in float32, which does not."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 8).double(), nn.Linear(8, 10))


_SIGTERM_NETS = """
import os, signal
from torch import nn

class TermInStep(nn.Module):
    # sends this process SIGTERM in its `at`-th training step, as a scheduler preempting it
    def __init__(self, at):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.at, self.steps = at, 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            if self.steps == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return self.fc(x.flatten(1))

def term_in_step_3():
    return TermInStep(3)

def term_when_built():
    os.kill(os.getpid(), signal.SIGTERM)
    return TermInStep(0)
"""


@pytest.mark.parametrize("factory", ["term_in_step_3", "term_when_built"])
def test_sigterm_is_handled_as_ctrl_c_and_exits_with_143(factory, tmp_path):
    """SIGTERM killed the process at once: nothing saved of a preempted run, no message."""
    (tmp_path / "sigterm_nets.py").write_text(textwrap.dedent(_SIGTERM_NETS))
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "pyrouq", "fit", f"sigterm_nets:{factory}", "--method"]
    argv += ["plain", "--epochs", "2", "--train-size", "256", "--batch-size", "64"]
    argv += ["--out", str(out), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 143, done.stderr
    if factory == "term_when_built":  # before training: as Ctrl-C, no run folder left behind
        assert done.stderr.strip() == "pyrouq: terminated (SIGTERM)"
        assert not out.exists()
        return
    # as a first Ctrl-C: the step finishes, the partial run is saved and can be resumed
    assert "pyrouq: interrupted in epoch 1 after step 3; the partial run is saved" in done.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        import sigterm_nets  # type: ignore[import-not-found]

        saved = pyrouq.load(out / "checkpoint.pt", module=sigterm_nets.TermInStep(0))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("sigterm_nets", None)
    assert (saved.training["epochs_done"], saved.training["steps"]) == (0, 3)


def test_overwrite_removes_the_temporary_checkpoint_of_a_killed_run(tmp_path, capsys):
    """A `.checkpoint.pt.*.tmp` left by a run killed while it saved stayed beside the new run."""
    out = tmp_path / "run"
    out.mkdir()
    leftover = out / ".checkpoint.pt.k2j4x9.tmp"
    leftover.write_bytes(b"half a checkpoint")
    (out / "notes.txt").write_text("mine")
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(out)]
    assert main([*argv, "--overwrite", "--no-progress"]) == 0
    assert not leftover.exists()
    assert (out / "notes.txt").read_text() == "mine"  # the user's own file stays
    assert sorted(p.name for p in out.glob(".*")) == []


def test_config_records_the_data_folder_as_found(tmp_path, capsys, monkeypatch, shared_data):
    """config.json had data_root null when $PYROUQ_DATA chose the data, and a relative
    --data-root as typed (another folder reads it as another place)."""
    monkeypatch.setenv("PYROUQ_DATA", str(shared_data))
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--no-progress", "--out"]
    assert main([*argv, str(tmp_path / "env")]) == 0
    config = json.loads((tmp_path / "env" / "config.json").read_text())
    assert config["data_root"] == str(shared_data)
    monkeypatch.delenv("PYROUQ_DATA")
    monkeypatch.chdir(shared_data.parent)
    assert main([*argv, str(tmp_path / "rel"), "--data-root", shared_data.name]) == 0
    config = json.loads((tmp_path / "rel" / "config.json").read_text())
    recorded = Path(config["data_root"])  # (the working folder as the system gives it:
    assert recorded.is_absolute() and recorded.resolve() == shared_data.resolve()  # no links)
    assert config["command"].endswith(f"--data-root {shared_data.name}")  # runs as written
    assert main([*argv, str(tmp_path / "bundled")]) == 0
    assert json.loads((tmp_path / "bundled" / "config.json").read_text())["data_root"] is None


def test_evaluate_records_the_seed_of_its_draws_and_split(plain_run, capsys):
    """metrics-evaluate.json did not say which --seed drew its figures."""
    assert json.loads((plain_run / "metrics.json").read_text())["seed"] == 3  # fit's, alike
    argv = ["evaluate", str(plain_run), "--ood", "none", "--no-progress"]
    assert main(argv) == 0
    assert json.loads((plain_run / "metrics-evaluate.json").read_text())["seed"] == 3  # the run's
    assert main([*argv, "--seed", "11", "--conformal", "0.2"]) == 0
    metrics = json.loads((plain_run / "metrics-evaluate.json").read_text())
    assert metrics["seed"] == 11


@pytest.mark.parametrize("method", ["plain", "rank1"])
def test_a_factory_without_parameters_is_told_in_the_commands_words(method, tmp_path, capsys):
    """--method plain got fit()'s 'Nothing to train: Sequential and the guide have no
    parameters' (the command takes no guide); rank1 spoke of BatchEnsemble layers."""
    argv = ["fit", "test_cli_sigterm_and_config:no_parameters", "--method", method, "--epochs", "1"]
    err = one_line_error(capsys, [*argv, "--train-size", "64", "--out", str(tmp_path / "r")])
    assert (
        f"factory 'test_cli_sigterm_and_config:no_parameters' builds Sequential, a network without "
        f"parameters: nothing for --method {method} to train; make it return a network with "
        "weights" in err
    )
    assert "guide" not in err and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "method, expected",
    [
        ("last-layer", "--method last-layer needs an nn.Linear, and _OwnWeight has none; "),
        ("bayesian", "layer, so --method bayesian picks nothing; "),
    ],
)
def test_conversion_errors_name_the_method_not_select(method, expected, tmp_path, capsys):
    """bayesian()'s 'Pass select= the names of the layers' reached users of the command,
    which has no select=."""
    argv = ["fit", "test_cli_sigterm_and_config:own_weight", "--method", method, "--epochs", "1"]
    err = one_line_error(capsys, [*argv, "--train-size", "64", "--out", str(tmp_path / "r")])
    assert expected in err
    assert f"make the network fit --method {method}, pick another --method" in err
    assert "Pass select=" not in err and "select=None" not in err


@pytest.mark.parametrize(
    "model, scale, expected",
    [
        ("bayesian-mlp", "1e-50", "--prior-scale 1e-50 is 0 in torch.float32, the precision of "
         "the network's weights"),
        ("rank1-lenet", "1e300", "--prior-scale 1e+300 is inf in torch.float32, the precision of "
         "the rank-1 factors"),
    ],
)  # fmt: skip
def test_a_prior_scale_the_weights_cannot_hold_names_the_option(
    model, scale, expected, tmp_path, capsys
):
    """The error said prior_scale=1.0 (Python's keyword) to users of --prior-scale."""
    argv = ["fit", model, "--prior-scale", scale, "--epochs", "1", "--train-size", "64"]
    err = one_line_error(capsys, [*argv, "--out", str(tmp_path / "r")])
    default = "0.1" if model.startswith("rank1") else "1"
    assert f"{expected} (at most 3.4e+38)" in err
    assert err.rstrip().endswith(f"pass a --prior-scale it holds, e.g. the default {default}")
    assert "prior_scale" not in err


def test_a_prior_scale_a_factorys_weights_cannot_hold_names_the_option(tmp_path, capsys):
    """--method bayesian passes --prior-scale as bayesian()'s one prior=, whose refusal names
    prior= (since it stopped naming the first site's prior): still told as the option, naming
    the site whose dtype refused it, as the API does (it said "the network's weights", of a
    network whose float64 first layer holds 1e-50)."""
    argv = ["fit", "pyrouq.models:MLP", "--method", "bayesian", "--prior-scale", "1e-50"]
    err = one_line_error(capsys, [*argv, "--epochs", "1", "--train-size", "64", "--out",
                                  str(tmp_path / "r")])  # fmt: skip
    assert err.startswith(
        "pyrouq: error: --prior-scale 1e-50 is 0 in torch.float32, the precision of site "
        "'fc1.weight' (at most 3.4e+38); pass a --prior-scale it holds, e.g. the default 1"
    ), err
    for method, where in (("bayesian", "site '2.weight'"), ("rank1", "the rank-1 factors")):
        argv = ["fit", "test_cli_sigterm_and_config:two_dtypes", "--method", method,
                "--prior-scale", "1e-50", "--epochs", "1", "--train-size", "64"]  # fmt: skip
        err = one_line_error(capsys, [*argv, "--out", str(tmp_path / method)])
        assert f"1e-50 is 0 in torch.float32, the precision of {where} (at most 3.4e+38)" in err
        assert "network's weights" not in err


def test_an_empty_world_size_is_one_process(capsys, monkeypatch):
    # `WORLD_SIZE= pyrouq data` said "invalid literal for int() with base 10: ''"
    monkeypatch.setenv("WORLD_SIZE", "")
    assert main(["data"]) == 0
    assert "invalid literal" not in capsys.readouterr().err


def test_a_world_size_without_torchruns_other_variables_is_refused_in_words(
    capsys, monkeypatch, tmp_path
):
    # a WORLD_SIZE left in the shell, the command run without torchrun: torch's "Error
    # initializing torch.distributed using env:// rendezvous: environment variable RANK
    # expected, but not set", which said neither why a process group nor what to do
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(tmp_path / "r")]
    err = one_line_error(capsys, argv)
    assert "$WORLD_SIZE is 2 in the environment" in err
    assert "$RANK, $MASTER_ADDR, $MASTER_PORT are not set (torchrun sets them all)" in err
    assert "torchrun --standalone --nproc_per_node 2 -m pyrouq fit" in err
    assert "unset WORLD_SIZE to train in one process" in err
    assert "rendezvous" not in err


@pytest.mark.parametrize("value", ["two", "-1", "1.5", "0", "\u00b2"])
def test_a_world_size_that_is_no_count_is_refused_in_words(value, capsys, monkeypatch, tmp_path):
    # it was read as 1: the command trained in one process without a word
    monkeypatch.setenv("WORLD_SIZE", value)
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--out", str(tmp_path / "r")]
    err = one_line_error(capsys, argv)
    assert err.strip() == (
        f"pyrouq: error: $WORLD_SIZE is {value!r} in the environment, but torchrun sets it to "
        "the number of training processes, a count from 1. Start the command with torchrun, "
        "or unset WORLD_SIZE to train in one process."
    ), err
    assert not (tmp_path / "r" / "checkpoint.pt").exists()


@pytest.mark.parametrize("value", ["two", " 2 "])
def test_a_world_size_is_not_read_where_the_caller_made_the_process_group(
    value, monkeypatch, gloo_group
):
    # the refusal of a WORLD_SIZE that is no count came before the look for the caller's
    # group, whose size holds: main() in a group made with init_method= was refused
    from pyrouq.cli._torchrun import _process_group

    monkeypatch.setenv("WORLD_SIZE", value)
    with _process_group(torch.device("cpu")) as (rank, world):
        assert (rank, world) == (0, 1)


@pytest.mark.parametrize("value", ["", "x", "-1"])
def test_a_local_rank_that_is_no_index_is_refused_in_words(value, monkeypatch):
    # on CUDA under WORLD_SIZE > 1, int(os.environ["LOCAL_RANK"]) said "invalid literal for
    # int() with base 10: ''" (the variable unnamed); -1 went on to torch.device("cuda", -1)
    from pyrouq.cli._build import CommandError
    from pyrouq.cli._torchrun import _rank_gpu

    monkeypatch.setenv("LOCAL_RANK", value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # (no GPU needed to choose)
    with pytest.raises(CommandError) as told:
        _rank_gpu()
    assert str(told.value) == (
        f"$LOCAL_RANK is {value!r} in the environment, but a training process under torchrun "
        "takes it as its index on the node (0, 1, ...: its GPU). Start the command with "
        "torchrun, which sets it, or set LOCAL_RANK to a whole number from 0 (or unset it: 0)."
    )
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _rank_gpu() == torch.device("cuda", 1)
    # a launcher that shows each rank its one GPU: LOCAL_RANK is not read (-1 took cuda:0
    # before the refusal, which refused it)
    monkeypatch.setenv("LOCAL_RANK", value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _rank_gpu() == torch.device("cuda", 0)


def test_run_files_are_written_and_read_without_the_locales_encoding(tmp_path):
    # config.json and metrics.json were opened without encoding=: under Python's
    # `-X warn_default_encoding -W error` (PEP 597) the command died writing config.json
    script = textwrap.dedent(
        """
        import argparse, json, sys
        from pathlib import Path
        from pyrouq.cli._report import _write_metrics
        from pyrouq.cli._run_dir import _rewrite, check_same_run, claim, recorded_factory_root

        out = Path(sys.argv[1])
        args = argparse.Namespace(resume=False, out=str(out), overwrite=False)
        folder, made = claim(out, args, {"factory_root": "/data/\\u00e9t\\u00e9"})
        root = recorded_factory_root(folder)
        _rewrite(folder / "config.json", {"factory_root": root, "seed": 1}, ["seed"])
        _write_metrics(folder, {"acc": 0.5})
        again = {"factory_root": root, "seed": 1}
        check_same_run(folder, again, argparse.Namespace(device=None, num_samples=None))
        print(made == [out], root, json.loads((folder / "config.json").read_bytes())["seed"])
        """
    )
    argv = [sys.executable, "-X", "warn_default_encoding", "-W", "error::EncodingWarning"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*argv, "-c", script, str(tmp_path / "run")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "/data/\u00e9t\u00e9", "1"]


def test_the_command_draws_its_plots_whatever_backend_the_environment_names(plain_run):
    # the command shows no figure, but pyplot took $MPLBACKEND: one of another environment
    # (a terminal's module://..., not installed here) ended the run in a traceback at its
    # first plot, after training and evaluating, its metrics and plots unwritten
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "module://no_such_backend"}
    argv = [sys.executable, "-m", "pyrouq", "evaluate", str(plain_run), "--ood", "none"]
    (plain_run / "reliability-evaluate.png").unlink(missing_ok=True)  # (another test's)
    done = subprocess.run([*argv, "--no-progress"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (plain_run / "reliability-evaluate.png").read_bytes()[:4] == b"\x89PNG"
