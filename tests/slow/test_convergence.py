"""Convergence, accuracy, calibration and OOD checks on real MNIST (minutes; `make test-slow`).

Each test prints the figures it measured, so `make test-slow` doubles as the report of the
acceptance numbers.
"""

from __future__ import annotations

import pytest
import torch

from pyrouq import metrics
from pyrouq.data import load_mnist, ood_loader
from pyrouq.infer import fit, mean_field_guide
from pyrouq.models import (
    MLP,
    BatchEnsembleLeNet,
    BayesianLeNet,
    BayesianMLP,
    batchensemble,
)
from pyrouq.predictive import predict

pytestmark = pytest.mark.slow


def _report(name: str, values: dict[str, float]) -> None:
    shown = ", ".join(f"{k}={v:.4f}" for k, v in values.items())
    print(f"\n[{name}] {shown}")


def _evaluate(model, guide, test, flatten=False, num_samples=None):
    preds = predict(model, test, guide, num_samples=num_samples)
    ood = predict(model, ood_loader(1024, flatten=flatten), guide, num_samples=num_samples)
    results = preds.evaluate(ood=ood)
    results["ood_auroc_entropy"] = metrics.ood_auroc(
        metrics.ood_scores(preds.probs, "entropy"), metrics.ood_scores(ood.probs, "entropy")
    )
    return results


# The Bayesian LeNet recipe: 2 epochs at batch 256 (470 steps). At batch 512 (236 steps) the
# MI-based OOD AUROC was 0.947-0.962 over seeds 0-3; at 256 it is 0.965-0.970, with accuracy
# 98.84-98.94 % and ECE 0.31-0.51 % (seeds 0-3, S = 32; this file measured 0.960-0.967 MI AUROC).
RECIPE_BATCH_SIZE = 256


def test_bayesian_lenet_two_epochs():
    torch.manual_seed(0)
    train, test = load_mnist(batch_size=RECIPE_BATCH_SIZE, seed=0)
    model = BayesianLeNet()
    guide = mean_field_guide(model)
    result = fit(model, guide, train, epochs=2, progress=False, seed=0)
    m = _evaluate(model, guide, test, num_samples=32)
    scales = {site: s.mean().item() for site, s in guide.scales().items()}
    _report("BayesianLeNet 2 epochs", {**m, "train_seconds": result.seconds})
    _report("BayesianLeNet 2 epochs, mean guide scale per site", scales)
    assert m["acc"] >= 0.986
    assert m["nll"] <= 0.045
    assert m["ece"] <= 0.005
    assert m["mutual_information"] > 0
    # the scales grew from init_scale=0.01 under the exact ELBO: a posterior, not a point
    assert max(scales.values()) > 0.03
    assert m["ood_auroc_entropy"] >= 0.95
    assert m["ood_auroc"] >= 0.95  # mutual information, issue 5


def test_bayesian_lenet_three_vectorised_particles():
    # fit(num_particles=3, vectorize_particles=True) once counted the likelihood three times;
    # its per-epoch NLL must match one particle's, and it must train as well
    train, test = load_mnist(batch_size=512, seed=0)
    runs = {}
    for particles in (1, 3):
        torch.manual_seed(0)
        model = BayesianLeNet()
        guide = mean_field_guide(model)
        result = fit(
            model,
            guide,
            train,
            epochs=1,
            num_particles=particles,
            vectorize_particles=particles > 1,
            progress=False,
            seed=0,
        )
        acc = predict(model, test, guide, num_samples=16).evaluate()["acc"]
        runs[particles] = (result.history[-1].nll, acc, result.seconds)
    _report(
        "BayesianLeNet 1 epoch, batch 512, 1 vs 3 vectorised particles",
        {
            "nll_1": runs[1][0],
            "nll_3": runs[3][0],
            "acc_1": runs[1][1],
            "acc_3": runs[3][1],
            "seconds_1": runs[1][2],
            "seconds_3": runs[3][2],
        },
    )
    assert 0.8 < runs[3][0] / runs[1][0] < 1.25
    assert runs[1][1] >= 0.97 and runs[3][1] >= 0.97  # one epoch at batch 512: 97.6 / 98.1 %


def test_bayesian_lenet_ood_mutual_information_across_seeds():
    """MNIST -> Fashion-MNIST AUROC with mutual information, over three training seeds.

    Issue 5 asks for >= 0.95; every seed must reach it (measured 0.965-0.970, S = 32).
    """
    aurocs = []
    for seed in range(3):
        torch.manual_seed(seed)
        train, test = load_mnist(batch_size=RECIPE_BATCH_SIZE, seed=seed)
        model = BayesianLeNet()
        guide = mean_field_guide(model)
        fit(model, guide, train, epochs=2, progress=False, seed=seed)
        preds = predict(model, test, guide, num_samples=32)
        ood = predict(model, ood_loader(1024), guide, num_samples=32)
        aurocs.append(preds.evaluate(ood=ood)["ood_auroc"])
    _report("BayesianLeNet MI OOD AUROC, seeds 0-2", dict(enumerate(map(float, aurocs))))
    assert min(aurocs) >= 0.95


def test_bayesian_mlp_three_epochs():
    torch.manual_seed(0)
    train, test = load_mnist(batch_size=512, seed=0, flatten=True)
    model = BayesianMLP()
    guide = mean_field_guide(model)
    fit(model, guide, train, epochs=3, progress=False, seed=0)
    m = _evaluate(model, guide, test, flatten=True, num_samples=32)
    _report("BayesianMLP 3 epochs", m)
    assert m["acc"] >= 0.975


def test_batchensemble_seed_recipe():
    """Pre-train MLP 784-256-10, convert to 3 members, fine-tune (the seed tutorial)."""
    torch.manual_seed(0)
    train, test = load_mnist(batch_size=256, seed=0, flatten=True)
    net = MLP()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(5):
        for x, y in train:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
    ensemble = batchensemble(net, 3, r_mean=1.0, r_std=0.5, s_mean=1.0, s_std=0.5)
    fit(ensemble, None, train, epochs=5, lr=3e-3, progress=False, seed=0)
    m = _evaluate(ensemble, None, test, flatten=True)
    _report("BatchEnsemble MLP seed recipe", m)
    assert m["acc"] >= 0.980
    assert m["ece"] <= 0.010
    assert m["disagreement"] > 0


def test_batchensemble_lenet_from_scratch():
    torch.manual_seed(0)
    train, test = load_mnist(batch_size=512, seed=0)
    model = BatchEnsembleLeNet(num_members=4)
    fit(model, None, train, epochs=3, progress=False, seed=0)
    m = _evaluate(model, None, test)
    _report("BatchEnsembleLeNet 4 members 3 epochs", m)
    assert m["acc"] >= 0.988
    assert max(m["ood_auroc"], m["ood_auroc_entropy"]) >= 0.95
