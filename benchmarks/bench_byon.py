"""Your own network: a residual CNN with BatchNorm made Bayesian / BatchEnsemble, against the
same network trained and evaluated in plain PyTorch, in one process.

Workloads (pyrouq.ResidualCNN, 9 convolutions with BatchNorm, MNIST images, batch 256, Adam):
* plain epoch (cross-entropy, torch optimizer) - the baseline;
* ``bayesian(net)`` epoch through ``pyrouq.fit`` (1 particle, the defaults);
* ``batchensemble(net, 4)`` epoch through ``pyrouq.fit``, with a copy of the BatchNorms per
  member (the default since 2026-12) and with the BatchNorms shared by the members
  (``norms="shared"``), the latter also with the engine's shared one-channel stem switched
  off and with its channels-last layout switched off (their A/Bs; results.md before 2026-12
  names the shared one ``batchensemble(net, 4)``);
* the plain epoch again with the network and its inputs made channels-last by hand: what the
  layout alone gives plain PyTorch (the engine's CPU fast path, done by the user);
* bayesian-torch's ``dnn_to_bnn`` on the same net (its loss: mean cross-entropy + KL / B),
  when importable (``make bench`` installs it into the venv for the benchmark only);
* ``predict`` with S = 16 draws vs 16 plain forward passes of the network in eval mode.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import plain_epoch, plain_passes, ratio_rows, ratio_to, report, rounds

from pyrouq import (
    ResidualCNN,
    _engine,
    batchensemble,
    bayesian,
    fit,
    load_mnist,
    mean_field_guide,
    predict,
)
from pyrouq._engine import _cpu_paths

REPS = 3
BATCH = 256
TRAIN_SIZE = 10240  # 40 steps per epoch: the ratios, not the absolute times, are the point
PREDICT_SIZE = 2048
DRAWS = 16


def bayesian_torch_epoch(train):
    """One epoch of bayesian-torch's dnn_to_bnn(ResidualCNN()), or None when not importable."""
    try:
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss
    except Exception:  # the peer is simply not timed
        return None
    net = ResidualCNN()
    dnn_to_bnn(
        net,
        {
            "prior_mu": 0.0,
            "prior_sigma": 1.0,
            "posterior_mu_init": 0.0,
            "posterior_rho_init": -3.0,
            "type": "Reparameterization",
            "moped_enable": False,
        },
    )
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def epoch() -> None:
        net.train()
        for x, y in train:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y) + get_kl_loss(net) / x.shape[0]
            loss.backward()
            optimizer.step()

    return epoch


def stem_per_member(ensemble, train) -> None:
    """A BatchEnsemble epoch with the engine's shared-stem shortcut off: the one-channel stem
    convolution then runs once per member, as every other layer does (the shortcut's A/B)."""
    keep = _engine._single_input_feature
    _engine._single_input_feature = lambda layer: False
    try:
        fit(ensemble, None, train, epochs=1, progress=False)
    finally:
        _engine._single_input_feature = keep


def default_layout(epoch: Callable[[], None]) -> Callable[[], None]:
    """``epoch`` with the engine's channels-last layout off (its A/B): every network then runs
    in PyTorch's default (NCHW) layout."""

    def run() -> None:
        keep = _cpu_paths.CHANNELS_LAST_MIN_CHANNELS
        _cpu_paths.CHANNELS_LAST_MIN_CHANNELS = 10**9
        try:
            epoch()
        finally:
            _cpu_paths.CHANNELS_LAST_MIN_CHANNELS = keep

    return run


def plain_channels_last_epoch(train) -> Callable[[], None]:
    """The plain epoch with the network and every batch channels-last, by hand."""
    net = ResidualCNN().to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def epoch() -> None:
        net.train()
        for x, y in train:
            optimizer.zero_grad()
            out = net(x.contiguous(memory_format=torch.channels_last))
            F.cross_entropy(out, y).backward()
            optimizer.step()

    return epoch


def main() -> None:
    torch.manual_seed(0)
    train, test = load_mnist(batch_size=BATCH, seed=0, train_size=TRAIN_SIZE)
    net = ResidualCNN()
    model = bayesian(ResidualCNN())
    guide = mean_field_guide(model)
    ensemble = batchensemble(ResidualCNN(), 4, norms="shared")
    own_norms = batchensemble(ResidualCNN(), 4)  # a copy of the norms per member
    workloads = {
        "plain ResidualCNN": plain_epoch(net, train),
        "bayesian(net), 1 particle": lambda: fit(model, guide, train, epochs=1, progress=False),
        "batchensemble(net, 4, norms='shared')": lambda: fit(
            ensemble, None, train, epochs=1, progress=False
        ),
        "batchensemble(net, 4), per-member norms": lambda: fit(
            own_norms, None, train, epochs=1, progress=False
        ),
        "batchensemble(net, 4, norms='shared'), stem per member": lambda: stem_per_member(
            ensemble, train
        ),
        "batchensemble(net, 4, norms='shared'), default layout": default_layout(
            lambda: fit(ensemble, None, train, epochs=1, progress=False)
        ),
        "plain ResidualCNN, channels-last by hand": plain_channels_last_epoch(train),
    }
    peer = bayesian_torch_epoch(train)
    if peer is not None:
        workloads["bayesian-torch dnn_to_bnn, 1 sample"] = peer
    else:
        print("(bayesian-torch not importable: its dnn_to_bnn is not timed)")
    times = rounds(workloads, reps=REPS)
    rows = ratio_rows(times, "plain ResidualCNN", " (epoch)")

    x = test.transform(test.images[:PREDICT_SIZE])
    net.eval()

    net_cl = ResidualCNN().to(memory_format=torch.channels_last).eval()
    net_cl.load_state_dict(net.state_dict())
    x_cl = x.contiguous(memory_format=torch.channels_last)

    @torch.no_grad()
    def plain_passes_channels_last() -> None:
        for _ in range(DRAWS):
            for start in range(0, x.shape[0], 1024):
                net_cl(x_cl[start : start + 1024]).softmax(-1)

    def ours() -> None:
        predict(model, x, guide, num_samples=DRAWS, progress=False)

    def ours_ensemble() -> None:
        predict(ensemble, x, progress=False)

    predict_times = rounds(
        {
            "plain": plain_passes(net, x, DRAWS),
            "plain channels-last": plain_passes_channels_last,
            "predict": ours,
            "ensemble": ours_ensemble,
        },
        reps=REPS,
    )
    predict_ratios = ratio_to(predict_times, "plain")
    rows.append(
        {
            "workload": f"predict(bayesian(net)), S = {DRAWS}, vs {DRAWS} plain passes",
            "seconds": round(statistics.median(predict_times["predict"]), 3),
            "ratio_vs_plain": round(predict_ratios["predict"], 2),
        }
    )
    rows.append(
        {
            "workload": f"{DRAWS} plain passes, channels-last by hand",
            "seconds": round(statistics.median(predict_times["plain channels-last"]), 3),
            "ratio_vs_plain": round(predict_ratios["plain channels-last"], 2),
        }
    )
    rows.append(
        {  # the ensemble's 4 members against 4 plain passes: a quarter of the 16 timed
            "workload": "predict(batchensemble(net, 4, norms='shared')) vs 4 plain passes",
            "seconds": round(statistics.median(predict_times["ensemble"]), 3),
            "ratio_vs_plain": round(predict_ratios["ensemble"] * DRAWS / 4, 2),
        }
    )
    print(
        f"ResidualCNN ({sum(p.numel() for p in net.parameters()):,} parameters), epochs of "
        f"{TRAIN_SIZE} MNIST images at batch {BATCH}; predict over {PREDICT_SIZE} images "
        f"({REPS} interleaved rounds after a warm-up; ratio = median of per-round ratios):"
    )
    report("bring_your_own_network", rows)


if __name__ == "__main__":
    main()
