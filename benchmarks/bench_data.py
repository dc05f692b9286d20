"""One pass of the MNIST training loader (batch 512): pyrouq's in-memory TensorLoader vs the
usual torchvision pipeline (``datasets.MNIST`` + ``ToTensor``/``Normalize`` + ``DataLoader``)
reading the same files, when ``../shared/data`` (torchvision layout) is present."""

from __future__ import annotations

from pathlib import Path

from _common import interleaved, report

from pyrouq import load_mnist

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> None:
    train, _ = load_mnist(batch_size=512, seed=0)
    workloads = {"pyrouq TensorLoader": lambda: sum(1 for _ in train)}
    if (SHARED / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file():
        import torch
        from torchvision import datasets, transforms

        dataset = datasets.MNIST(
            str(SHARED),
            train=True,
            download=False,
            transform=transforms.Compose(
                [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
            ),
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size=512, shuffle=True)
        workloads["torchvision DataLoader"] = lambda: sum(1 for _ in loader)
    times = interleaved(workloads, reps=2)
    base = times.get("torchvision DataLoader")
    rows = [
        {
            "workload": k,
            "seconds": round(v, 4),
            "ratio_vs_torchvision": round(v / base, 4) if base else None,
        }
        for k, v in times.items()
    ]
    print("One pass over the 60k MNIST training images:")
    report("data", rows)


if __name__ == "__main__":
    main()
