"""Data-parallel fit(): one epoch of BayesianLeNet on MNIST on 1 process and on 2 processes
(gloo, spawned here; each rank gets half the cores as torch threads), against a plain-torch
LeNet epoch measured in the same run.

On a machine with C cores, 2 ranks share them: the point is that the per-step all_reduce of
the gradients costs little (a ratio near 1 for 2 ranks on the same cores), not a speed-up,
which needs more machines or cores than one process can use.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from _common import report

from pyrouq import BayesianLeNet, LeNet, fit, load_mnist, mean_field_guide

TRAIN_SIZE = 20480
BATCH = 256


def _epoch_seconds(threads: int) -> float:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    train, _ = load_mnist(batch_size=BATCH, seed=0, train_size=TRAIN_SIZE)
    model = BayesianLeNet()
    guide = mean_field_guide(model)
    fit(model, guide, train, epochs=1, progress=False, seed=0)  # warm-up
    start = time.perf_counter()
    fit(model, guide, train, epochs=1, progress=False, seed=0)
    return time.perf_counter() - start


def _rank(rank: int, world: int, init: str, out: str, threads: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        seconds = _epoch_seconds(threads)
        if rank == 0:
            with open(out, "w") as f:
                f.write(str(seconds))
    finally:
        dist.destroy_process_group()


def _plain_epoch(threads: int) -> float:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    train, _ = load_mnist(batch_size=BATCH, seed=0, train_size=TRAIN_SIZE)
    net = LeNet()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def epoch() -> None:
        for x, y in train:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()

    epoch()
    start = time.perf_counter()
    epoch()
    return time.perf_counter() - start


LINK_GBIT = 10.0  # the network of the estimate, Gb/s
LINK_LATENCY = 50e-6  # seconds per message on such a network (TCP over Ethernet, typical)


def allreduce_bytes() -> int:
    """Bytes of the one flattened buffer that ``fit()`` all-reduces per step: every gradient
    of the guide and of the model's point estimates, in their dtype, and two flags per
    parameter tensor (whether its gradient is dense, whether it is sparse: neither, none) plus
    one for the step (NaN where the loss is not finite, above 0 where a Ctrl-C came)."""
    model = BayesianLeNet()
    guide = mean_field_guide(model)
    params = [*guide.parameters(), *(p for p in model.parameters() if p.requires_grad)]
    flags = (2 * len(params) + 1) * params[0].element_size()
    return sum(p.numel() * p.element_size() for p in params) + flags


def ring_seconds(num_bytes: int, workers: int) -> float:
    """A ring all-reduce of ``num_bytes`` over ``workers`` (reduce-scatter then all-gather):
    each worker sends ``2 (R - 1) / R`` of the buffer in ``2 (R - 1)`` messages."""
    sent = 2 * (workers - 1) / workers * num_bytes
    return sent / (LINK_GBIT * 1e9 / 8) + 2 * (workers - 1) * LINK_LATENCY


def main() -> None:
    cores = os.cpu_count() or 1
    plain = _plain_epoch(cores)
    one = _epoch_seconds(cores)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "seconds")
        mp.spawn(_rank, args=(2, os.path.join(tmp, "init"), out, max(1, cores // 2)), nprocs=2)
        two = float(open(out).read())
    num_bytes = allreduce_bytes()
    steps = -(-TRAIN_SIZE // BATCH)
    step = one / steps  # one process's compute per step, the work each rank does per step
    print(
        f"BayesianLeNet epochs of {TRAIN_SIZE} MNIST images, batch {BATCH} per rank, {cores} cores:"
    )
    print(f"all-reduced per step: {num_bytes:,} bytes ({num_bytes / 2**20:.2f} MiB) in one buffer")
    for workers in (8, 64):
        comm = ring_seconds(num_bytes, workers)
        print(
            f"estimate, {workers} workers on {LINK_GBIT:g} Gb/s ({LINK_LATENCY * 1e6:.0f} us per "
            f"message): ring all-reduce {comm * 1e3:.2f} ms per step against {step * 1e3:.1f} ms "
            f"of compute: {step / (step + comm):.0%} scaling efficiency without overlap"
        )
    report(
        "data_parallel",
        [
            {
                "workload": "plain LeNet epoch (1 process)",
                "seconds": round(plain, 2),
                "ratio_vs_plain": 1.0,
            },
            {
                "workload": "fit(BayesianLeNet), 1 process",
                "seconds": round(one, 2),
                "ratio_vs_plain": round(one / plain, 2),
            },
            {
                "workload": "fit(BayesianLeNet), 2 ranks (gloo), same cores",
                "seconds": round(two, 2),
                "ratio_vs_plain": round(two / plain, 2),
            },
        ],
        {
            "bytes all-reduced per step": num_bytes,
            **{
                f"estimate: ring all-reduce per step, {w} workers, {LINK_GBIT:g} Gb/s (ms)": round(
                    ring_seconds(num_bytes, w) * 1e3, 2
                )
                for w in (8, 64)
            },
            "one process's compute per step (ms)": round(step * 1e3, 1),
        },
    )


if __name__ == "__main__":
    main()
