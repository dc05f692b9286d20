"""Training a network whose weights outweigh its activations: torchvision's resnet18 (11.2M
parameters, a one-channel stem) on MNIST, batch 256. At 28 px its deep layers see 2x2 and 1x1
maps, so what a method does per weight (draw, KL, Adam, the members' weight copies) weighs as
much as the convolutions themselves.

Workloads, in one process (one epoch of ``STEPS`` batches each):
* the plain epoch in plain PyTorch (Adam, cross-entropy) - the baseline;
* the plain network through ``pyrouq.fit`` (what fit itself adds: its Adam, the per-epoch
  running accuracy, read off the steps' own outputs);
* ``bayesian(net)`` through ``fit`` as shipped; with each weight's draw and its KL taken
  apart (the A/B of the fused draw); with the KL of its Normal priors, apart, differentiated
  by autograd through the elementwise closed form (the A/B of the three-sum KL); and with
  Adam in torch's multi-tensor ops instead of its fused CPU kernel (that A/B); and with the
  stem's 3x3 max-pooling in torch's NCHW kernel instead of channels-last (that A/B);
* ``batchensemble(net, 4)`` through ``fit`` as shipped, and with every layer given each
  member's copy of the weights, even where scaling the member's activations is cheaper (the
  A/B of the engine's per-layer choice on CPU), and with the NCHW max-pooling;
* ``batchensemble(net, 4, norms="shared")``, whose BatchNorm statistics span the members, so
  that they run as one folded batch (as ``rank1()``'s do), as shipped and with every layer
  given the members' weight copies (the same A/B on the folded path);
* ``predict`` of the trained ``bayesian(net)`` with S = 16 draws over 1,024 MNIST test images
  vs 16 plain forward passes of the network in eval mode: the 16 draws of 11.2M weights
  weigh here as on no small network.
"""

from __future__ import annotations

import statistics

import torch
from _common import (
    patched,
    plain_epoch,
    plain_passes,
    ratio_rows,
    ratio_to,
    report,
    rounds,
)
from torch import nn
from torchvision.models import resnet18

import pyrouq.infer.elbo
from pyrouq import _engine, batchensemble, bayesian, fit, load_mnist, mean_field_guide, predict
from pyrouq._engine import _cpu_paths

BATCH = 256
STEPS = 20
REPS = 3
DRAWS = 16
PREDICT_SIZE = 1024


def _net() -> nn.Module:
    net = resnet18(num_classes=10)
    net.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return net


def _closed_form_kl(loc, scale, prior_loc, prior_scale):
    var_ratio = (scale / prior_scale).pow(2)
    t1 = ((loc - prior_loc) / prior_scale).pow(2)
    return (0.5 * (var_ratio + t1 - 1 - var_ratio.log())).sum()


def main() -> None:
    torch.manual_seed(0)
    train, test = load_mnist(batch_size=BATCH, seed=0, train_size=BATCH * STEPS)
    model = bayesian(_net())
    guide = mean_field_guide(model)
    ensemble = batchensemble(_net(), 4)
    fitted = _net()

    def bayes() -> None:
        fit(model, guide, train, epochs=1, progress=False)

    def members() -> None:
        fit(ensemble, None, train, epochs=1, progress=False)

    folded = batchensemble(_net(), 4, norms="shared")

    def folded_members() -> None:
        fit(folded, None, train, epochs=1, progress=False)

    workloads = {
        "plain resnet18 (torch loop)": plain_epoch(_net(), train),
        "plain resnet18 through fit()": lambda: fit(fitted, None, train, epochs=1, progress=False),
        "bayesian(net), 1 particle": bayes,
        "bayesian(net), draw and KL apart": patched(
            pyrouq.infer.elbo, "_scalar_normal_sites", lambda model, positive: {}, bayes
        ),
        "bayesian(net), KL by autograd": patched(
            pyrouq.infer.elbo,
            "_scalar_normal_sites",
            lambda model, positive: {},
            patched(pyrouq.infer.elbo, "normal_kl", _closed_form_kl, bayes),
        ),
        "bayesian(net), Adam in multi-tensor ops": patched(_cpu_paths, "_FUSED_ADAM", None, bayes),
        "bayesian(net), NCHW max-pooling": patched(
            _cpu_paths.MaxPool2dChannelsLast, "forward", nn.MaxPool2d.forward, bayes
        ),
        "batchensemble(net, 4)": members,
        "batchensemble(net, 4), weight copies in every layer": patched(
            _engine, "_scales_activations", lambda layer, x: False, members
        ),
        "batchensemble(net, 4), NCHW max-pooling": patched(
            _cpu_paths.MaxPool2dChannelsLast, "forward", nn.MaxPool2d.forward, members
        ),
        "batchensemble(net, 4, norms='shared')": folded_members,
        "batchensemble(net, 4, norms='shared'), weight copies in every layer": patched(
            _engine, "_scales_activations", lambda layer, x: False, folded_members
        ),
    }
    times = rounds(workloads, reps=REPS)
    rows = ratio_rows(times, "plain resnet18 (torch loop)", " (epoch)")

    x = test.transform(test.images[:PREDICT_SIZE])
    predict_times = rounds(
        {
            "plain": plain_passes(_net(), x, DRAWS),
            "predict": lambda: predict(model, x, guide, num_samples=DRAWS, progress=False),
        },
        reps=REPS,
    )
    rows.append(
        {
            "workload": f"predict(bayesian(net)), S = {DRAWS}, {PREDICT_SIZE} images, vs "
            f"{DRAWS} plain passes",
            "seconds": round(statistics.median(predict_times["predict"]), 3),
            "ratio_vs_plain": round(ratio_to(predict_times, "plain")["predict"], 2),
        }
    )
    print(
        f"resnet18, one-channel stem ({sum(p.numel() for p in _net().parameters()):,} "
        f"parameters), {STEPS} MNIST batches of {BATCH} ({REPS} interleaved rounds after a "
        "warm-up; ratio = median of per-round ratios):"
    )
    report("weights_outweigh_activations", rows)


if __name__ == "__main__":
    main()
