"""End to end: `pyrouq fit bayesian-lenet --epochs 2` as a user runs it, vs `pyrouq fit lenet`.

Each run is a fresh process. Wall time is measured from the process start to the moment the
last metric table is printed (training, prediction on 10k test + 10k OOD images, metrics), and
to its exit (plots and files written too); peak RSS is that process's maximum resident memory.
The baseline is the same command with the plain LeNet (no Pyro, S = 1), at the Bayesian
LeNet's batch size (256; the plain preset's is 512), so that both take the same steps. Runs are
interleaved; the figures are medians over the rounds. The child's output is unbuffered, so the
tables are timed when printed, not at exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import report

LAST_TABLE_LINE = "FPR95"  # the OOD table closes the printed metrics

#: What each run passes after `pyrouq fit MODEL --epochs 2`: the demo as it is, and the plain
#: LeNet at the demo's batch size.
FLAGS = {"bayesian-lenet": [], "lenet": ["--batch-size", "256"]}


def run(model: str, out: Path) -> dict[str, float]:
    """One `pyrouq fit MODEL --epochs 2` process: seconds to tables / exit, peak RSS, metrics."""
    cmd = [sys.executable, "-m", "pyrouq", "fit", model, "--epochs", "2", *FLAGS[model]]
    cmd += ["--out", str(out), "--no-progress", "--overwrite"]
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # lines arrive as printed
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    tables = float("nan")
    assert proc.stdout is not None
    for line in proc.stdout:
        if LAST_TABLE_LINE in line and tables != tables:
            tables = time.perf_counter() - start
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
    proc.returncode = os.waitstatus_to_exitcode(status)
    total = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {proc.returncode}")
    metrics = json.loads((out / "metrics.json").read_text())
    return {
        "to_tables": tables,
        "to_exit": total,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "acc": metrics["acc"],
        "ece": metrics["ece"],
        "ood_auroc": metrics["ood_auroc"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pyrouq-e2e-"))
    results: dict[str, list[dict[str, float]]] = {"bayesian-lenet": [], "lenet": []}
    try:
        for _ in range(args.rounds):
            for model in results:
                results[model].append(run(model, work / model))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for model, runs in results.items():
        rows.append(
            {
                "command": " ".join(["pyrouq fit", model, "--epochs 2", *FLAGS[model]]),
                "seconds_to_tables": round(statistics.median(r["to_tables"] for r in runs), 1),
                "seconds_to_exit": round(statistics.median(r["to_exit"] for r in runs), 1),
                "ratio_vs_lenet": round(
                    statistics.median(
                        r["to_tables"] / b["to_tables"]
                        for r, b in zip(runs, results["lenet"], strict=True)
                    ),
                    2,
                ),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs)),
                "acc": round(statistics.median(r["acc"] for r in runs), 4),
                "ece": round(statistics.median(r["ece"] for r in runs), 4),
                "ood_auroc_mi": round(statistics.median(r["ood_auroc"] for r in runs), 4),
            }
        )
    print(f"End to end, fresh process per run, {args.rounds} interleaved rounds:")
    report("end_to_end", rows, own_rss=False)


if __name__ == "__main__":
    main()
