"""Timing helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import json
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

RESULTS = Path(__file__).with_name("results.json")


def interleaved(workloads: dict[str, Callable[[], object]], reps: int = 3) -> dict[str, float]:
    """Median seconds of each workload; one warm-up each, then ``reps`` interleaved rounds."""
    for fn in workloads.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in workloads}
    for _ in range(reps):
        for name, fn in workloads.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    return (
        f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


def report(section: str, rows: list[dict[str, object]]) -> None:
    """Print rows and merge them into results.json under ``section``."""
    for row in rows:
        print("  " + ", ".join(f"{k}: {v}" for k, v in row.items()))
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[section] = {"machine": machine(), "rows": rows}
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
