"""A user's residual CNN (BatchNorm, skip connections) on Fashion-MNIST, trained three ways:
plain, ``bayesian(net)`` with the library defaults, ``batchensemble(net, 4)`` from scratch
(minutes; `make test-slow`; needs the Fashion-MNIST train split of ../shared/data).

Prints the figures it measured (accuracy, NLL, ECE, MI OOD AUROC with MNIST as OOD).
"""

from __future__ import annotations

import time

import pytest
import torch

from pyrouq import (
    ResidualCNN,
    batchensemble,
    bayesian,
    fit,
    load_fashion_mnist,
    mean_field_guide,
    ood_loader,
    predict,
)

pytestmark = pytest.mark.slow

EPOCHS = 3


def _evaluate(model, guide, test, ood):
    start = time.perf_counter()
    preds = predict(model, test, guide)
    ood_preds = predict(model, ood, guide)
    figures = preds.evaluate(ood=ood_preds)
    figures["eval_seconds"] = time.perf_counter() - start
    return figures


def test_residual_cnn_plain_bayesian_batchensemble(shared_data):
    train, test = load_fashion_mnist(root=shared_data, seed=0)
    ood = ood_loader(1024, dataset="mnist")  # MNIST test: the OOD set of Fashion-MNIST
    results = {}
    torch.manual_seed(0)
    ways = {
        "plain": lambda net: (net, None),
        "bayesian": lambda net: (lambda m: (m, mean_field_guide(m)))(bayesian(net)),
        "batchensemble": lambda net: (batchensemble(net, 4), None),
    }
    for name, build in ways.items():
        torch.manual_seed(0)
        model, guide = build(ResidualCNN())
        start = time.perf_counter()
        fit(model, guide, train, epochs=EPOCHS, progress=False, seed=0)
        seconds = time.perf_counter() - start
        results[name] = {**_evaluate(model, guide, test, ood), "train_seconds": seconds}
        shown = ", ".join(f"{k}={v:.4f}" for k, v in results[name].items())
        print(f"\n[ResidualCNN on Fashion-MNIST, {name}, {EPOCHS} epochs] {shown}")
    plain = results["plain"]
    # Measured (seed 0) with the engine's channels-last layout on CPU: bayesian ECE 1.04 %
    # (> 1 %) and batchensemble NLL 0.2490 (plain 0.2489), so this test fails there by those
    # margins; in the default layout the same recipe gave 0.86 % and 0.2429 (an open item:
    # the criteria sit within the seed-to-seed spread).
    for name in ("bayesian", "batchensemble"):
        r = results[name]
        assert r["acc"] >= plain["acc"] - 0.01, name
        assert r["ece"] <= max(plain["ece"], 0.01), name
    assert results["batchensemble"]["nll"] < plain["nll"]
    # The mean-field network's NLL is the plain network's within the spread of seeds (0.2460
    # and 0.2553 against 0.2477 in two runs): it is held to that spread, not to "lower".
    assert results["bayesian"]["nll"] < plain["nll"] + 0.015
