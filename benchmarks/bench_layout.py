"""The engine's channels-last layout on CPU and its upper bound, on a network wider than
pyrouq's own: torchvision's resnet18 (up to 512 channels) with a one-channel 3x3 stem, on MNIST
test images (28 px, so its widest convolutions see 4x4 and 2x2 maps).

Workloads, in one process:
* ``DRAWS`` plain forward passes of the network in eval mode - the baseline;
* ``predict(bayesian(net))`` with S = ``DRAWS``, as shipped: the network reads more than
  ``CHANNELS_LAST_MAX_CHANNELS`` channels, so it runs in the default layout;
* the same with the bound lifted, so that it runs channels-last (the A/B that keeps the bound).

A second table trains a network with depthwise convolutions, torchvision's mobilenet_v2 (up to
1,280 channels, a one-channel stem), on ``STEPS`` MNIST batches of 256: the plain epoch in
plain PyTorch (the baseline), then ``bayesian(net)`` and ``batchensemble(net, 4)`` through
``fit()`` as shipped (channels-last: a depthwise convolution lifts the bound) and in the
default layout (the A/B that keeps the depthwise rule).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from _common import patched, plain_epoch, ratio_rows, ratio_to, report, rounds
from torch import nn
from torchvision.models import mobilenet_v2, resnet18

from pyrouq import batchensemble, bayesian, fit, load_mnist, mean_field_guide, predict
from pyrouq._engine import _cpu_paths

DRAWS = 8
IMAGES = 1024
REPS = 3
STEPS = 10


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = resnet18(num_classes=10)
    net.conv1 = nn.Conv2d(1, 64, 3, 1, 1, bias=False)
    return net.eval()


def main() -> None:
    _, test = load_mnist()
    x = test.transform(test.images[:IMAGES])
    net = _net()
    model = bayesian(net)
    guide = mean_field_guide(model, init_from=net)
    model.eval()

    @torch.no_grad()
    def plain() -> None:
        for _ in range(DRAWS):
            for chunk in x.split(512):
                net(chunk).softmax(-1)

    def shipped() -> None:
        predict(model, x, guide, num_samples=DRAWS, progress=False)

    def channels_last() -> None:
        bound = _cpu_paths.CHANNELS_LAST_MAX_CHANNELS
        _cpu_paths.CHANNELS_LAST_MAX_CHANNELS = 10**9
        try:
            predict(model, x, guide, num_samples=DRAWS, progress=False)
        finally:
            _cpu_paths.CHANNELS_LAST_MAX_CHANNELS = bound

    times = rounds({"plain": plain, "shipped": shipped, "cl": channels_last}, reps=REPS)
    ratios = ratio_to(times, "plain")
    names = {
        "plain": f"{DRAWS} plain passes (eval)",
        "shipped": f"predict(bayesian(net)), S = {DRAWS}, default layout (as shipped)",
        "cl": f"predict(bayesian(net)), S = {DRAWS}, channels-last (bound lifted)",
    }
    rows = [
        {
            "workload": label,
            "seconds": round(statistics.median(times[key]), 3),
            "ratio_vs_plain": round(ratios[key], 2),
        }
        for key, label in names.items()
    ]
    print(
        f"resnet18 with a one-channel stem ({sum(p.numel() for p in net.parameters()):,} "
        f"parameters) on {IMAGES} MNIST test images ({REPS} interleaved rounds after a warm-up; "
        "ratio = median of per-round ratios):"
    )
    report("channels_last_bound", rows)
    depthwise()


def _mobilenet() -> nn.Module:
    torch.manual_seed(0)
    net = mobilenet_v2(num_classes=10)
    net.features[0][0] = nn.Conv2d(1, 32, 3, 2, 1, bias=False)
    return net


def depthwise() -> None:
    train, _ = load_mnist(batch_size=256, seed=0, train_size=256 * STEPS)
    model = bayesian(_mobilenet())
    guide = mean_field_guide(model)
    ensemble = batchensemble(_mobilenet(), 4)

    def default_layout(run: Callable[[], object]) -> Callable:
        return patched(_cpu_paths, "_channels_last_pays", lambda net: False, run)

    def bayes() -> None:
        fit(model, guide, train, epochs=1, progress=False)

    def members() -> None:
        fit(ensemble, None, train, epochs=1, progress=False)

    workloads = {
        "plain mobilenet_v2 (torch loop)": plain_epoch(_mobilenet(), train),
        "bayesian(net), channels-last (as shipped)": bayes,
        "bayesian(net), default layout": default_layout(bayes),
        "batchensemble(net, 4), channels-last (as shipped)": members,
        "batchensemble(net, 4), default layout": default_layout(members),
    }
    times = rounds(workloads, reps=REPS)
    print(
        f"mobilenet_v2 with a one-channel stem, {STEPS} MNIST batches of 256 ({REPS} "
        "interleaved rounds after a warm-up; ratio = median of per-round ratios):"
    )
    report(
        "depthwise_channels_last", ratio_rows(times, "plain mobilenet_v2 (torch loop)", " (epoch)")
    )


if __name__ == "__main__":
    main()
