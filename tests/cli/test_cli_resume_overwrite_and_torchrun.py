"""Review of 91b10d8..a5f1a3e: predict(posterior_samples=) read Predictive's non-finite
"logits" (a site it ignores) as NaN draws and refused them; labels whose shape per input differs
between batches crashed predict() in torch.cat; `pyrouq fit --resume` printed a command with a
shortened --overwrite it then refused, named no torchrun for a run of several ranks, and under
torchrun the ranks other than 0 read an --out=~/... unexpanded."""

from __future__ import annotations

import json
import os
import shlex
import sys
import warnings
from pathlib import Path

import pyro
import pytest
import torch
from _cli import CtrlCAt
from _processes import run_in_own_group
from _toy import tiny_mlp, toy_data
from pyro.infer import Predictive
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq
from pyrouq.cli import main

# --------------------------------------------------------------------------------------------
# predict(posterior_samples=Predictive's output)
# --------------------------------------------------------------------------------------------


def test_predictives_output_with_infinite_logits_is_read_for_its_weights_alone():
    """Predictive's output holds "logits" (and "obs") beside the weights; predict() reads the
    weights only, so a network's -inf logits there (a masked class) are no NaN draws."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = toy_data(10)
    model = tiny_mlp(num_data=10)
    guide = AutoNormal(model)
    guide(x, y)
    out = Predictive(model, guide=guide, num_samples=4)(x)
    out["logits"][..., 1] = -float("inf")
    probs = pyrouq.predict(model, x, posterior_samples=out, progress=False).probs
    # by hand: fc2(relu(fc1(x))) under each draw, then softmax
    w1, b1 = out["fc1.weight"][:, 0], out["fc1.bias"][:, 0]
    w2, b2 = out["fc2.weight"][:, 0], out["fc2.bias"][:, 0]
    hidden = torch.relu(torch.einsum("nf,shf->snh", x, w1) + b1[:, None])
    want = torch.softmax(torch.einsum("snh,sch->snc", hidden, w2) + b2[:, None], -1)
    assert probs.shape == (4, 10, 2)
    torch.testing.assert_close(probs, want, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# predict()'s labels of a loader
# --------------------------------------------------------------------------------------------


def test_labels_whose_shape_per_input_differs_between_batches_are_dropped_with_a_warning():
    pyro.clear_param_store()
    torch.manual_seed(0)
    x, y = torch.randn(10, 2), torch.randn(10, 1)
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=pyrouq.Gaussian(0.5), num_data=10)
    guide = AutoNormal(model)
    guide(x, y)
    loader = [(x[:1], y[0]), (x[1:], y[1:])]  # labels (1,), then (9, 1): torch.cat failed
    with pytest.warns(UserWarning) as caught:
        p = pyrouq.predict(model, loader, guide, num_samples=3, progress=False)
    assert p.targets is None
    message = str(caught[0].message)
    assert message.startswith("predict(): the targets x yields cannot be the predictions' targets")
    assert (
        "batch 2 of x holds targets of shape (9, 1) and an earlier batch targets of shape (1,): "
        "their shapes per input differ); the predictions carry none." in message
    )
    assert p.loc.shape == (3, 10, 1)
    # the aligned labels of the same loader stay the targets, in order
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = pyrouq.predict(model, [(x[:1], y[:1]), (x[1:], y[1:])], guide, progress=False)
    assert torch.equal(kept.targets, y)


# --------------------------------------------------------------------------------------------
# pyrouq fit --resume
# --------------------------------------------------------------------------------------------

FACTORY = "_cli:ctrl_c_net"
ARGV = ["fit", FACTORY, "--epochs", "2", "--train-size", "256", "--batch-size", "64"]
ARGV += ["--seed", "5", "--num-samples", "2", "--no-progress", "--device", "cpu"]


def _interrupted(monkeypatch, capsys, extra):
    """The run of ARGV + extra stopped by Ctrl-C in epoch 1: the command it printed."""
    monkeypatch.setattr(CtrlCAt, "at", 3)
    assert main([*ARGV, *extra]) == 130
    err = capsys.readouterr().err
    monkeypatch.setattr(CtrlCAt, "at", 0)
    return err.split("(resume it: ")[1].rsplit(")", 1)[0]


def test_a_shortened_overwrite_is_left_out_of_the_printed_resume_command(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    printed = _interrupted(monkeypatch, capsys, ["--out", str(out), "--overw"])
    # argparse took --overw for --overwrite; kept, the printed command was refused
    assert printed == shlex.join(["pyrouq", *ARGV, "--out", str(out), "--resume"])
    assert main(shlex.split(printed)[1:]) == 0
    assert json.loads((out / "metrics.json").read_text())["seed"] == 5


def test_a_run_of_two_ranks_resumes_under_torchrun_with_a_tilde_out(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    _interrupted(monkeypatch, capsys, ["--out=~/t"])
    run = home / "t"
    # as a run started on 2 ranks records itself (it trained on 1 here, which resumes alike)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "world_size": 2}))
    assert main([*ARGV, "--out=~/t", "--resume"]) == 2
    err = capsys.readouterr().err
    command = shlex.join(["pyrouq", *ARGV, "--out=~/t", "--resume"])
    assert err.endswith(
        "(world_size 2 there, 1 now); run the recorded command with --resume: torchrun "
        f"--standalone --nproc_per_node 2 -m {command}\n"
    ), err
    # that command: rank 1 reads the checkpoint from the expanded --out too
    words = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    words += ["2", "-m", "pyrouq", *ARGV, "--out=~/t", "--resume"]
    here = str(Path(__file__).parents[1])  # tests/: the factory, _cli:ctrl_c_net
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": here, "HOME": str(home)}
    env.pop("WORLD_SIZE", None)
    done = run_in_own_group(words, env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f"wrote {run}/: metrics.json") == 1
    assert "checkpoint.pt" not in done.stderr
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["seed"] == 5 and 0.0 <= metrics["acc"] <= 1.0


def test_a_ctrl_c_under_torchrun_is_told_by_rank_0_alone(tmp_path):
    # every rank stops after the same step; rank 1 printed a bare "pyrouq: interrupted" of
    # its own above rank 0's line, which says where the run stopped and how to resume it
    words = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    words += ["2", "-m", "pyrouq", "fit", "_cli:ctrl_c_net_at_3", "--epochs", "1"]
    words += ["--train-size", "256", "--batch-size", "32", "--no-progress", "--device", "cpu"]
    words += ["--out", str(tmp_path / "run")]
    here = str(Path(__file__).parents[1])  # tests/: the factory
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": here}
    env.pop("WORLD_SIZE", None)
    done = run_in_own_group(words, env, timeout=240)
    assert done.returncode != 0
    assert done.stderr.count("pyrouq: interrupted") == 1, done.stderr[-3000:]
    assert "pyrouq: interrupted in epoch 1 after step " in done.stderr, done.stderr[-3000:]
