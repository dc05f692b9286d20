"""Temperature scaling and conformal prediction on trained networks (`make test-slow`; a few
minutes; the Fashion-MNIST train split of ../shared/data).

* an over-confident plain LeNet (15 epochs on Fashion-MNIST): ECE after temperature scaling at
  most half of before and at most 1.5 %, accuracy unchanged; a Bayesian LeNet on MNIST: the
  scaled NLL no higher than the unscaled;
* conformal sets over 20 random calibration/test splits (5,000 / 5,000): the Bayesian LeNet at
  alpha = 0.01 covers 0.987-0.994 on average (LAC, APS, RAPS), the plain LeNet at alpha = 0.1
  covers 0.895-0.915;
* conformal intervals of a heteroscedastic Bayesian MLP over 20 splits of 2,000 fresh points at
  alpha = 0.1: 0.88-0.92 for both scores.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pyrouq import (
    ArrayLoader,
    BayesianLeNet,
    Gaussian,
    GaussianPredictions,
    LeNet,
    Predictions,
    bayesian,
    conformal,
    coverage,
    fit,
    load_fashion_mnist,
    load_mnist,
    mean_field_guide,
    mean_set_size,
    predict,
    temperature_scale,
)
from pyrouq.metrics import ece, nll

pytestmark = pytest.mark.slow


def _halves(n, seed):
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[: n // 2], order[n // 2 :]


def _part(preds, index, labels):
    return Predictions(preds.probs[:, index], labels[index])


@pytest.fixture(scope="module")
def fashion_lenet(shared_data):
    train, test = load_fashion_mnist(root=shared_data, seed=0)
    torch.manual_seed(0)  # the initial weights: fit(seed=) seeds the data order and draws only
    net = LeNet()
    fit(net, None, train, epochs=15, progress=False, seed=0)
    return predict(net, test.transform(test.images)), test.labels


@pytest.fixture(scope="module")
def mnist_bayesian_lenet():
    train, test = load_mnist(seed=0)
    torch.manual_seed(0)
    model = BayesianLeNet()
    guide = mean_field_guide(model)
    fit(model, guide, train, epochs=2, progress=False, seed=0)
    return predict(model, test.transform(test.images), guide), test.labels


def test_temperature_scaling_fixes_an_overconfident_lenet(fashion_lenet, mnist_bayesian_lenet):
    preds, labels = fashion_lenet
    val, held = _halves(len(labels), 0)
    scaler = temperature_scale(_part(preds, val, labels))
    before, after = _part(preds, held, labels), scaler(_part(preds, held, labels))
    y = labels[held]
    ece_before, ece_after = ece(before.mean_probs, y), ece(after.mean_probs, y)
    print(f"\n[Fashion-MNIST LeNet, 15 epochs] T = {scaler.temperature:.3f}, ECE "
          f"{ece_before:.4f} -> {ece_after:.4f}, NLL {nll(before.mean_probs, y):.4f} -> "
          f"{nll(after.mean_probs, y):.4f}")  # fmt: skip
    assert torch.equal(after.predicted, before.predicted)
    assert ece_after <= 0.5 * ece_before and ece_after <= 0.015
    bayes, mnist_labels = mnist_bayesian_lenet
    val, held = _halves(len(mnist_labels), 0)
    scaler = temperature_scale(_part(bayes, val, mnist_labels))
    y = mnist_labels[held]
    raw = nll(_part(bayes, held, mnist_labels).mean_probs, y)
    scaled = nll(scaler(_part(bayes, held, mnist_labels)).mean_probs, y)
    print(f"[MNIST Bayesian LeNet] T = {scaler.temperature:.3f}, NLL {raw:.4f} -> {scaled:.4f}")
    assert scaled <= raw


@pytest.mark.parametrize(
    ("which", "alpha", "low", "high"),
    [("mnist", 0.01, 0.987, 0.994), ("fashion", 0.1, 0.895, 0.915)],
)
def test_conformal_sets_cover_over_20_splits(which, alpha, low, high, request):
    preds, labels = request.getfixturevalue(
        "mnist_bayesian_lenet" if which == "mnist" else "fashion_lenet"
    )
    for score in ("lac", "aps", "raps"):
        coverages, sizes = [], []
        for split in range(20):
            cal, test = _halves(len(labels), split)
            predictor = conformal(_part(preds, cal, labels), alpha=alpha, score=score, seed=split)
            sets = predictor.predict_sets(_part(preds, test, labels))
            coverages.append(coverage(sets, labels[test]))
            sizes.append(mean_set_size(sets))
        mean = sum(coverages) / len(coverages)
        print(f"\n[{which}, alpha {alpha}, {score}] mean coverage {mean:.4f}, mean set size "
              f"{sum(sizes) / len(sizes):.3f}")  # fmt: skip
        assert low <= mean <= high, (score, mean)


def test_conformal_intervals_cover_over_20_splits():
    def toy(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.rand(n, 1, generator=g) * 8 - 4
        return x, torch.sin(x[:, 0]) + (0.1 + 0.5 * x[:, 0].abs()) * torch.randn(n, generator=g)

    torch.manual_seed(0)
    x, y = toy(2000, 0)
    net = nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 2))
    model = bayesian(net, likelihood=Gaussian("heteroscedastic"))
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, 128, seed=0), epochs=60, progress=False, seed=0)
    fresh_x, fresh_y = toy(2000, 1)
    preds = predict(model, fresh_x, guide)
    for score in ("abs", "cqr"):
        coverages = []
        for split in range(20):
            cal, test = _halves(2000, split)
            cal_preds = GaussianPredictions(preds.loc[:, cal], preds.scale[:, cal], fresh_y[cal])
            predictor = conformal(cal_preds, alpha=0.1, score=score)
            test_preds = GaussianPredictions(preds.loc[:, test], preds.scale[:, test])
            coverages.append(coverage(predictor.intervals(test_preds), fresh_y[test]))
        mean = sum(coverages) / len(coverages)
        print(f"\n[heteroscedastic toy, {score}] mean coverage {mean:.4f}")
        assert 0.88 <= mean <= 0.92, (score, mean)
