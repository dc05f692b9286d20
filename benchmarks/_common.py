"""Timing helpers shared by the benchmark scripts (not part of the package)."""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).with_name("results.json")
MARKDOWN = Path(__file__).with_name("results.md")


def plain_epoch(net: torch.nn.Module, train: Any, lr: float = 1e-3) -> Callable[[], None]:
    """One epoch of ``net`` in plain PyTorch (Adam, cross-entropy): the baseline workload."""
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)

    def epoch() -> None:
        net.train()
        for x, y in train:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()

    return epoch


def plain_passes(net: torch.nn.Module, x: torch.Tensor, passes: int) -> Callable[[], None]:
    """``passes`` forward passes of ``net`` in eval mode over ``x`` (batches of 1,024, softmax):
    the baseline of ``predict`` with S = ``passes`` draws."""

    @torch.no_grad()
    def run() -> None:
        net.eval()
        for _ in range(passes):
            for start in range(0, x.shape[0], 1024):
                net(x[start : start + 1024]).softmax(-1)

    return run


def patched(module: object, name: str, value: object, run: Callable[[], object]) -> Callable:
    """``run`` with ``module.name`` replaced by ``value`` while it runs (an A/B workload)."""

    def call() -> None:
        saved = getattr(module, name)
        setattr(module, name, value)
        try:
            run()
        finally:
            setattr(module, name, saved)

    return call


def interleaved(workloads: dict[str, Callable[[], object]], reps: int = 3) -> dict[str, float]:
    """Median seconds of each workload; one warm-up each, then ``reps`` interleaved rounds."""
    return {name: statistics.median(ts) for name, ts in rounds(workloads, reps).items()}


def rounds(workloads: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    """Seconds of each workload in each of ``reps`` interleaved rounds, after a warm-up."""
    for fn in workloads.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in workloads}
    for _ in range(reps):
        for name, fn in workloads.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def ratio_to(times: dict[str, list[float]], base: str) -> dict[str, float]:
    """Median over rounds of each workload's time over the baseline's time in that round
    (robust to the machine's speed drifting between rounds)."""
    return {
        name: statistics.median(t / b for t, b in zip(ts, times[base], strict=True))
        for name, ts in times.items()
    }


def ratio_rows(
    times: dict[str, list[float]], base: str, suffix: str = ""
) -> list[dict[str, object]]:
    """One row per workload: its median seconds and :func:`ratio_to` ``base`` (the workload
    named with ``suffix`` appended)."""
    ratios = ratio_to(times, base)
    return [
        {
            "workload": f"{name}{suffix}",
            "seconds": round(statistics.median(ts), 3),
            "ratio_vs_plain": round(ratios[name], 2),
        }
        for name, ts in times.items()
    ]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


def report(
    section: str, rows: list[dict[str, object]], facts: dict | None = None, own_rss: bool = True
) -> None:
    """Print rows and merge them into results.json under ``section``. ``facts`` are figures
    that are not timings (bytes, estimates, each with its unit in its label), shown under the
    table; with ``own_rss`` this process's peak resident memory is one of them (leave it out
    where the timed work ran in child processes, which report their own)."""
    facts = dict(facts or {})
    if own_rss:
        facts["peak RSS (MB)"] = round(peak_rss_mb(), 1)
    for row in rows:
        print("  " + ", ".join(f"{k}: {v}" for k, v in row.items()))
    for label, value in facts.items():
        print(f"  {label}: {value}")
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data[section] = {"machine": machine(), "rows": rows, "facts": facts}
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
    MARKDOWN.write_text(render(data))


def render(data: dict) -> str:
    """results.json as markdown tables, one per section, each followed by its facts."""
    lines = [
        "# Benchmark results",
        "",
        "Regenerated by `make bench`; every ratio is against a plain-PyTorch baseline measured in",
        "the same process (median of repetitions after a warm-up).",
        "",
    ]
    for section, content in data.items():
        rows = content["rows"]
        keys: list[str] = []
        for row in rows:
            keys += [k for k in row if k not in keys]
        lines += [f"## {section}", "", f"Machine: {content['machine']}", ""]
        lines.append("| " + " | ".join(keys) + " |")
        lines.append("|" + "---|" * len(keys))
        for row in rows:
            lines.append("| " + " | ".join(str(row.get(k, "")) for k in keys) + " |")
        lines.append("")
        facts = content.get("facts", {})
        lines += [f"- {label}: {value}" for label, value in facts.items()]
        lines += [""] * bool(facts)
    return "\n".join(lines)
