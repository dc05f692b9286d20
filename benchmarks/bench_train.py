"""One training epoch: pyrouq vs plain PyTorch, measured side by side in one process.

Workloads (MNIST, batch 256 - the library's default - Adam):
* plain LeNet epoch (an nn.Sequential with nn.MaxPool2d, cross-entropy, torch optimizer) - the
  baseline;
* BayesianLeNet epoch through pyrouq.fit, 1 particle and 3 vectorised particles;
* BatchEnsembleLeNet fine-tuning epoch with M = 3 and 4 vs the backbone epoch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import ratio_rows, report, rounds
from _peers import torch_uncertainty_available, tu_train_epoch

from pyrouq import BayesianLeNet, LeNet, batchensemble, fit, load_mnist, mean_field_guide

REPS = 7
BATCH = 256


def main() -> None:
    torch.manual_seed(0)
    train, _ = load_mnist(batch_size=BATCH, seed=0)
    net = LeNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def plain_epoch() -> None:
        for x, y in train:
            optimizer.zero_grad()
            F.cross_entropy(net(x), y).backward()
            optimizer.step()

    model = BayesianLeNet()
    guide = mean_field_guide(model)

    def bayes(particles: int):
        def run() -> None:
            fit(
                model,
                guide,
                train,
                epochs=1,
                num_particles=particles,
                vectorize_particles=particles > 1,
                progress=False,
            )

        return run

    ensembles = {m: batchensemble(LeNet(), m) for m in (3, 4)}

    def ensemble(m: int):
        return lambda: fit(ensembles[m], None, train, epochs=1, lr=1e-3, progress=False)

    workloads = {
        "plain LeNet": plain_epoch,
        "BayesianLeNet, 1 particle": bayes(1),
        "BayesianLeNet, 3 vectorised particles": bayes(3),
        "BatchEnsembleLeNet M=3": ensemble(3),
        "BatchEnsembleLeNet M=4": ensemble(4),
    }
    peer = torch_uncertainty_available()
    if peer:
        workloads["torch-uncertainty bayesian_lenet, ELBO 1 sample"] = tu_train_epoch(train, 1)
        workloads["torch-uncertainty bayesian_lenet, ELBO 3 samples"] = tu_train_epoch(train, 3)
    else:
        print("(torch-uncertainty not importable: its bayesian_lenet is not timed)")
    times = rounds(workloads, reps=REPS)
    rows = ratio_rows(times, "plain LeNet")
    print(
        f"One MNIST epoch, batch {BATCH} ({REPS} interleaved rounds after a warm-up; ratio = "
        "median "
        "of the per-round ratios):"
    )
    report("train_epoch", rows)


if __name__ == "__main__":
    main()
