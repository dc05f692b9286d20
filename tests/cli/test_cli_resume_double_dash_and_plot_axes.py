"""Review of today's commits 93419dd, 02f2bb6 and 7b83904: each test pins a problem found in
them (each fails on the code as reviewed)."""

from __future__ import annotations

import argparse
import io
import json
import shlex
from pathlib import Path

import pytest
import torch
from test_cli_resume_fresh_shell import ARGV, DRAWS, FACTORY, _interrupted

from pyrouq.cli import main

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# 93419dd: ax= of a 3-D or polar Axes


@pytest.mark.parametrize("projection", ["3d", "polar"])
def test_reliability_into_a_3d_or_polar_axes_is_refused_or_draws(projection):
    """plot_reliability(ax=<3-D or polar Axes>) returns a figure that cannot be drawn: its
    savefig (or Jupyter's display) raises matplotlib's ValueError far from the call. A wrong ax
    is to be refused at the call in house style ("Expected ax ..."), or drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pyrouq.plotting import plot_reliability

    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    fig = plt.figure()
    ax = fig.add_subplot(projection=projection)
    try:
        try:
            out = plot_reliability(probs, torch.tensor([0, 0, 1, 1]), ax=ax)
        except (TypeError, ValueError) as err:
            assert str(err).startswith("Expected ax"), err
            return
        out.savefig(io.BytesIO(), format="png")  # raises on the code as reviewed
    finally:
        plt.close(fig)


def test_regression_into_a_3d_axes_is_refused_in_house_style():
    """plot_regression(ax=<3-D Axes>) fails inside matplotlib (Axes3D.fill_between() missing
    3 required positional arguments), not with pyrouq's refusal of a wrong ax."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pyrouq.plotting import plot_regression
    from pyrouq.predictive import GaussianPredictions

    loc = torch.randn(3, 6, 1, generator=torch.Generator().manual_seed(0))
    preds = GaussianPredictions(loc, torch.ones(3, 6, 1))
    fig = plt.figure()
    try:
        with pytest.raises((TypeError, ValueError), match=r"^Expected ax"):
            plot_regression(preds, torch.arange(6.0), ax=fig.add_subplot(projection="3d"))
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# 93419dd: ece's docstring on torchmetrics' edges


def test_ece_docs_say_torchmetrics_edges_can_be_below_too_in_float32():
    """The docs say torchmetrics' linspace edges "can be an ulp above" (a confidence on an edge
    falls a bin lower there), with 0.3 at K = 10 as the example. torchmetrics builds them in the
    confidences' dtype: in float32 (the usual one) 0.3 is binned as pyrouq bins it, and at the
    default K = 15 edges 8, 9 and 10 are an ulp *below*, so torchmetrics bins such a confidence
    a bin higher than pyrouq."""
    from pyrouq.metrics import ece, equal_width_bins

    edges = torch.linspace(0, 1, 16)  # torchmetrics' edges of float32 confidences, K = 15
    conf = edges[8:9]
    theirs = int(torch.bucketize(conf, edges, right=True) - 1)
    ours = int(equal_width_bins(conf, 15)[1])
    assert theirs == ours + 1  # the fact: a bin *higher* in torchmetrics
    c = torch.tensor([0.3])  # the docs' example, in float32
    tm10 = torch.linspace(0, 1, 11, dtype=c.dtype)
    assert int(torch.bucketize(c, tm10, right=True) - 1) == int(equal_width_bins(c, 10)[1])
    texts = {
        "ece.__doc__": " ".join((ece.__doc__ or "").split()),
        "docs/metrics.md": " ".join((ROOT / "docs" / "metrics.md").read_text().split()),
    }
    for where, text in texts.items():
        claim = text[text.index("edges can be an ulp") - 40 :][:190]
        assert "below" in claim or "float64" in claim, (where, claim)


# ---------------------------------------------------------------------------------------------
# 02f2bb6: the Gaussian's refusal of a tiny scale


def test_a_tiny_scale_of_float64_outputs_is_not_told_to_use_float64():
    """With float64 outputs the refusal still says "or use float64 outputs (model.double())":
    they already are."""
    from pyrouq.likelihoods import Gaussian

    with pytest.raises(ValueError, match="smallest normal float64") as info:
        Gaussian(1e-310).loc_scale(torch.zeros(2, 1, dtype=torch.float64))
    assert "model.double()" not in str(info.value), str(info.value)


# ---------------------------------------------------------------------------------------------
# 7b83904: pyrouq fit --resume (the runs of test_cli_resume_fresh_shell)


def test_a_cpu_run_on_a_machine_whose_default_is_cuda_is_told_to_pass_device_cpu(tmp_path):
    """A run that trained on the CPU (started where there was no GPU), resumed where the
    default is cuda, was told "resume it where cpu is available, or pass --device cuda": cpu is
    available everywhere, and the fix that keeps the run repeating the uninterrupted one,
    --device cpu, was not named. (The comparison itself: this machine has no GPU to make cuda
    the default of a public run, whose data would then be pinned for it.)"""
    from pyrouq.cli._build import CommandError
    from pyrouq.cli._run_dir import check_same_run

    saved = {"model": "mlp", "seed": 0, "device": "cpu", "command": "pyrouq fit mlp --out r"}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = {**saved, "device": "cuda", "command": "pyrouq fit mlp --out r --resume"}
    given = {"device": None, "data_root": None, "num_samples": None, "typed_num_samples": None}
    with pytest.raises(CommandError) as info:
        check_same_run(tmp_path, config, argparse.Namespace(**given))
    assert "pass --device cpu to go on on cpu as the run started" in str(info.value)
    assert "or --device cuda to go on on cuda" in str(info.value)


def test_the_resume_command_of_a_command_with_a_double_dash_parses(tmp_path, monkeypatch, capsys):
    """`pyrouq fit [options] -- FACTORY` runs; the command printed to resume it appended
    --resume after the `--`, where it is a positional argument: argparse refused it
    ("unrecognized arguments: --resume")."""
    part = tmp_path / "part"
    options = [word for word in ARGV[1:] if word != FACTORY]
    printed = _interrupted(
        monkeypatch, capsys, ["fit", *options, *DRAWS, "--out", str(part), "--", FACTORY]
    )
    assert printed.endswith(f"--resume -- {FACTORY}"), printed
    assert main(shlex.split(printed)[1:]) == 0
    assert json.loads((part / "metrics.json").read_text())["seed"] == 5
