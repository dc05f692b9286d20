"""`torchrun --nproc_per_node 2` trains the Bayesian LeNet as well as one process does: the
command line's `fit bayesian-lenet --epochs 2` on 2 ranks (gloo) and on 1 process, in the same
run (minutes; `make test-slow`). Prints both runs' figures."""

from __future__ import annotations

import json
import os
import sys

import pytest
from _processes import run_in_own_group

pytestmark = pytest.mark.slow

TIMEOUT = 900


def _run(command: list[str], out) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if "torch.distributed.run" in command else None
    done = run_in_own_group(
        [*command, "--out", str(out), "--no-progress"], env, TIMEOUT, merge_stderr=True
    )
    assert done.returncode == 0, done.stdout[-3000:]
    return json.loads((out / "metrics.json").read_text())


def test_two_ranks_train_the_bayesian_lenet_as_well_as_one_process(tmp_path):
    fit = ["-m", "pyrouq", "fit", "bayesian-lenet", "--epochs", "2"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    runs = {
        "1 process": _run([sys.executable, *fit], tmp_path / "one"),
        "2 ranks (torchrun, gloo)": _run(
            [*torchrun, "--nproc_per_node", "2", *fit], tmp_path / "two"
        ),
    }
    for name, m in runs.items():
        print(
            f"\n[BayesianLeNet, 2 epochs, {name}] acc={m['acc']:.4f}, nll={m['nll']:.4f}, "
            f"ece={m['ece']:.4f}, ood_auroc={m['ood_auroc']:.4f}, train_seconds="
            f"{m['train_seconds']:.1f}"
        )
    ranks = runs["2 ranks (torchrun, gloo)"]
    assert ranks["acc"] >= 0.986
    assert ranks["nll"] <= 0.045
