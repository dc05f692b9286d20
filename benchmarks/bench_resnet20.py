"""A second residual network, never used to tune pyrouq: the CIFAR-style ResNet-20 of He et
al. (2016), a 16-channel 3x3 stem and 9 basic blocks of 16/32/64 channels with BatchNorm and
1x1 projection shortcuts (ResidualCNN is the same with one block per stage), on one-channel
MNIST images, batch 256. The speed items of "bring your own network" on it, in one process:

* the plain epoch in plain PyTorch (Adam, cross-entropy) - the baseline;
* ``bayesian(net)`` and ``batchensemble(net, 4)`` epochs through ``pyrouq.fit`` (defaults);
* ``predict`` with S = 16 draws vs 16 plain forward passes of the network in eval mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import plain_epoch, ratio_rows, report, rounds
from torch import nn

from pyrouq import batchensemble, bayesian, fit, load_mnist, mean_field_guide, predict
from pyrouq.models.plain import _Block  # ResNet's basic block, as ResidualCNN uses it

REPS = 3
BATCH = 256
STEPS = 20
DRAWS = 16


class ResNet20(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 3, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        layers, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for i in range(blocks):
                layers.append(_Block(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


def main() -> None:
    torch.manual_seed(0)
    train, _ = load_mnist(batch_size=BATCH, seed=0, train_size=BATCH * STEPS)
    model = bayesian(ResNet20())
    guide = mean_field_guide(model)
    ensemble = batchensemble(ResNet20(), 4)
    times = rounds(
        {
            "plain ResNet-20": plain_epoch(ResNet20(), train),
            "bayesian(net)": lambda: fit(model, guide, train, epochs=1, progress=False),
            "batchensemble(net, 4)": lambda: fit(ensemble, None, train, epochs=1, progress=False),
        },
        reps=REPS,
    )
    rows = ratio_rows(times, "plain ResNet-20", " (epoch)")

    x = torch.cat([images for images, _ in list(train)[:4]])  # 1,024 images
    net = ResNet20().eval()

    @torch.no_grad()
    def plain_passes() -> None:
        for _ in range(DRAWS):
            net(x).softmax(-1)

    predict_times = rounds(
        {
            f"{DRAWS} plain passes": plain_passes,
            f"predict(bayesian(net)), S = {DRAWS}": lambda: predict(
                model, x, guide, num_samples=DRAWS, progress=False
            ),
        },
        reps=REPS,
    )
    rows += ratio_rows(predict_times, f"{DRAWS} plain passes", f" ({x.shape[0]} images)")
    print(
        f"ResNet-20 ({sum(p.numel() for p in net.parameters()):,} parameters), epochs of "
        f"{BATCH * STEPS} MNIST images at batch {BATCH} ({REPS} interleaved rounds after a "
        "warm-up; ratio = median of per-round ratios):"
    )
    report("resnet20", rows)


if __name__ == "__main__":
    main()
