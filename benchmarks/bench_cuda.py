"""pyrouq on a CUDA GPU against plain PyTorch on the same GPU, in one process (skipped, with a
line saying so, where torch sees no GPU; ``make bench`` runs on the CPU and does not call it).

Workloads (MNIST on the GPU, batch 256, Adam; every workload ends with a device sync):
* LeNet: a plain ``nn.Sequential`` LeNet epoch (the baseline), ``BayesianLeNet`` and
  ``BatchEnsembleLeNet`` epochs through ``pyrouq.fit``;
* ResidualCNN (9 convolutions with BatchNorm): a plain epoch (the baseline),
  ``bayesian(net)``, ``batchensemble(net, 4)`` and ``rank1(net, 4)`` epochs through ``fit``;
* ``predict`` with S = 16 draws against 16 plain forward passes, for both networks;
* the Bayesian epochs again with ``seed=0``, which keeps cuDNN to its deterministic kernels
  (the cost of a run that repeats exactly on a GPU).

TF32 stays at torch's defaults (what a user gets). Run: ``python benchmarks/bench_cuda.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from _common import plain_epoch, plain_passes, ratio_rows, ratio_to, report, rounds

from pyrouq import (
    BatchEnsembleLeNet,
    BayesianLeNet,
    LeNet,
    ResidualCNN,
    batchensemble,
    bayesian,
    fit,
    load_mnist,
    mean_field_guide,
    predict,
    rank1,
)

REPS = 3
BATCH = 256
TRAIN_SIZE = 10240  # 40 steps per epoch
PREDICT_SIZE = 4096
DRAWS = 16


def synced(run: Callable[[], object]) -> Callable[[], None]:
    """``run``, then wait for the GPU: its wall time is then the work's, not the launches'."""

    def call() -> None:
        run()
        torch.cuda.synchronize()

    return call


def epoch_of(model, guide, train, seed: int | None = None) -> Callable[[], None]:
    """One epoch through ``fit`` (with ``seed``: seeded, so cuDNN's deterministic kernels)."""
    return synced(lambda: fit(model, guide, train, epochs=1, progress=False, seed=seed))


def predict_rows(name: str, plain_net, model, guide, x) -> list[dict[str, object]]:
    plain_net.eval()
    times = rounds(
        {
            "plain": synced(plain_passes(plain_net, x, DRAWS)),
            "predict": synced(lambda: predict(model, x, guide, num_samples=DRAWS, progress=False)),
        },
        reps=REPS,
    )
    return [
        {
            "workload": f"predict({name}), S = {DRAWS}, vs {DRAWS} plain passes",
            "seconds": round(statistics.median(times["predict"]), 4),
            "ratio_vs_plain": round(ratio_to(times, "plain")["predict"], 2),
        }
    ]


def main() -> None:
    if not torch.cuda.is_available():
        print("bench_cuda: torch sees no CUDA device here; nothing timed")
        return
    device = torch.device("cuda")
    torch.manual_seed(0)
    train, test = load_mnist(batch_size=BATCH, seed=0, train_size=TRAIN_SIZE, device=device)
    x = test.transform(test.images[:PREDICT_SIZE])

    lenet = LeNet().to(device)
    bayes_lenet = BayesianLeNet().to(device)
    lenet_guide = mean_field_guide(bayes_lenet)
    be_lenet = BatchEnsembleLeNet().to(device)
    times = rounds(
        {
            "plain LeNet": synced(plain_epoch(lenet, train)),
            "BayesianLeNet": epoch_of(bayes_lenet, lenet_guide, train),
            "BayesianLeNet, seed=0 (deterministic cuDNN)": epoch_of(
                bayes_lenet, lenet_guide, train, seed=0
            ),
            "BatchEnsembleLeNet (M = 4)": epoch_of(be_lenet, None, train),
        },
        reps=REPS,
    )
    rows = ratio_rows(times, "plain LeNet", " (epoch)")
    rows += predict_rows("BayesianLeNet", lenet, bayes_lenet, lenet_guide, x)

    net = ResidualCNN().to(device)
    bayes_net = bayesian(ResidualCNN()).to(device)
    net_guide = mean_field_guide(bayes_net)
    ensemble = batchensemble(ResidualCNN(), 4).to(device)
    rank_one = rank1(ResidualCNN(), 4).to(device)
    rank_one_guide = mean_field_guide(rank_one)
    times = rounds(
        {
            "plain ResidualCNN": synced(plain_epoch(net, train)),
            "bayesian(net)": epoch_of(bayes_net, net_guide, train),
            "bayesian(net), seed=0 (deterministic cuDNN)": epoch_of(
                bayes_net, net_guide, train, seed=0
            ),
            "batchensemble(net, 4)": epoch_of(ensemble, None, train),
            "rank1(net, 4)": epoch_of(rank_one, rank_one_guide, train),
        },
        reps=REPS,
    )
    rows += ratio_rows(times, "plain ResidualCNN", " (epoch)")
    rows += predict_rows("bayesian(ResidualCNN)", net, bayes_net, net_guide, x)
    facts = {
        "GPU": torch.cuda.get_device_name(device),
        "peak GPU memory (MB)": round(torch.cuda.max_memory_allocated(device) / 2**20, 1),
    }
    report("CUDA (bench_cuda.py)", rows, facts)


if __name__ == "__main__":
    main()
