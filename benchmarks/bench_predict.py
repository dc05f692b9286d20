"""Prediction: pyrouq.predict with S draws vs S plain LeNet forward passes over 10k images."""

from __future__ import annotations

import torch
from _common import interleaved, report
from _peers import torch_uncertainty_available, tu_predict

from pyrouq import BayesianLeNet, LeNet, load_mnist, mean_field_guide, predict
from pyrouq._engine import MaxPool2x2


def main() -> None:
    torch.manual_seed(0)
    _, test = load_mnist(batch_size=1024)
    x = test.transform(test.images)
    net = LeNet().eval()  # as a user writes it: nn.MaxPool2d, batches of 1024
    tuned = LeNet().eval()  # the same network with pyrouq's CPU schedule (fast pool, 512)
    tuned.pool1, tuned.pool2 = MaxPool2x2(), MaxPool2x2()
    model = BayesianLeNet()
    guide = mean_field_guide(model)
    rows = []
    peer = torch_uncertainty_available()
    for s in (16, 64):

        @torch.no_grad()
        def plain(s: int = s) -> None:
            for _ in range(s):
                for start in range(0, x.shape[0], 1024):
                    net(x[start : start + 1024]).softmax(-1)

        @torch.no_grad()
        def plain_tuned(s: int = s) -> None:
            for _ in range(s):
                for start in range(0, x.shape[0], 512):
                    tuned(x[start : start + 512]).softmax(-1)

        def ours(s: int = s) -> None:
            predict(model, x, guide, num_samples=s, batch_size=1024, progress=False)

        workloads = {"plain": plain, "plain_tuned": plain_tuned, "pyrouq": ours}
        if peer:
            workloads["torch-uncertainty"] = tu_predict(x, s, 1024)
        times = interleaved(workloads)
        row = {
            "S": s,
            "plain_seconds": round(times["plain"], 3),
            "predict_seconds": round(times["pyrouq"], 3),
            "ratio": round(times["pyrouq"] / times["plain"], 2),
            "plain_tuned_seconds": round(times["plain_tuned"], 3),
            "ratio_vs_tuned": round(times["pyrouq"] / times["plain_tuned"], 2),
        }
        if peer:
            row["torch_uncertainty_seconds"] = round(times["torch-uncertainty"], 3)
            row["torch_uncertainty_ratio"] = round(times["torch-uncertainty"] / times["plain"], 2)
        rows.append(row)
    print(
        "predict() over the 10k MNIST test images vs S plain LeNet forward passes (plain: "
        "nn.MaxPool2d, batches of 1024; plain_tuned: pyrouq's exact fast pool, batches of 512):"
    )
    if not peer:
        print("  (torch-uncertainty not importable: its bayesian_lenet is not timed)")
    report("predict", rows)


if __name__ == "__main__":
    main()
