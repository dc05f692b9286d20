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
    ood = ood_loader(1024, dataset="mnist")  # MNIST test: the OOD set of Fashion-MNIST
    results = {}
    ways = {
        "plain": lambda net: (net, None),
        "bayesian": lambda net: (lambda m: (m, mean_field_guide(m)))(bayesian(net)),
        "batchensemble": lambda net: (batchensemble(net, 4), None),
    }
    for name, build in ways.items():
        # a fresh loader for each way: each one sees the batches a first run would
        train, test = load_fashion_mnist(root=shared_data, seed=0)
        torch.manual_seed(0)
        model, guide = build(ResidualCNN())
        start = time.perf_counter()
        fit(model, guide, train, epochs=EPOCHS, progress=False, seed=0)
        seconds = time.perf_counter() - start
        results[name] = {**_evaluate(model, guide, test, ood), "train_seconds": seconds}
        shown = ", ".join(f"{k}={v:.4f}" for k, v in results[name].items())
        print(f"\n[ResidualCNN on Fashion-MNIST, {name}, {EPOCHS} epochs] {shown}")
    plain = results["plain"]
    # Measured by this test (seed 0): plain 91.03 %, NLL 0.2489, ECE 0.63 %; bayesian (fit's
    # default kl_weight 0.02) 91.42 %, 0.2433, 0.78 %; batchensemble with shared norms (the
    # default before 2026-12) 91.12 %, 0.2485, 0.80 %, a margin (0.0004) far inside the seed
    # spread (NLL moves by about 0.005 from seed to seed). The same steps at seed 1, in a
    # one-off script: plain 91.58 %, 0.2393, 0.70 %; bayesian 91.29 %, 0.2381, 0.80 %;
    # batchensemble with per-member norms (today's default) 91.41 %, 0.2376, 0.49 %. Per-member
    # norms at seed 0 (an earlier session, the loader after the other two runs): 91.67 %,
    # 0.2356, 0.39 %. This test on 2026-12-02, on a CPU that rounds differently (1,015 s):
    # plain 91.05 %, 0.2457, 0.64 %; bayesian 91.06 %, 0.2453, 0.55 % (MI OOD AUROC 0.727);
    # batchensemble, per-member norms, 91.55 %, 0.2346, 0.63 % (0.844). On 2026-12-03 (Intel
    # Xeon, 602 s, the KL's gradient rounded differently by the fused draw): plain 91.12 %,
    # 0.2407, 0.72 %; bayesian 90.88 %, 0.2526, 0.55 % (0.738), which fails issue 14(b);
    # batchensemble 91.71 %, 0.2339, 0.71 % (0.871). Later that day (809 s, the stem's output
    # channels-last too): plain the same; bayesian 91.37 %, 0.2435, 0.97 % (0.784), failing
    # 14(b) by less; batchensemble 91.52 %, 0.2374, 0.41 % (0.858). Re-run on 2026-12-04 (945 s):
    # the same figures to the digit.
    for name in ("bayesian", "batchensemble"):
        r = results[name]
        assert r["acc"] >= plain["acc"] - 0.01, name
        assert r["ece"] <= max(plain["ece"], 0.01), name
        assert r["nll"] < plain["nll"], name
