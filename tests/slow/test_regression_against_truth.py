"""Regression against exact answers and known truths (`make test-slow`; about a minute).

* a Bayesian linear regression with known noise: the guide's means within 0.15 posterior sd
  of the exact posterior means, its scales within 10 % of the mean-field optimum;
* a learned noise scale ends within 10 % of the true one;
* the cubic toy of Hernandez-Lobato & Adams (2015): epistemic sd at x = +-6 at least 3x that
  at x = 0, and the 90 % interval covers 0.80-0.98 of fresh points;
* heteroscedastic data: the learned aleatoric sd tracks the true one (correlation >= 0.9).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyrouq import (
    ArrayLoader,
    Gaussian,
    Standardizer,
    batchensemble,
    bayesian,
    fit,
    mean_field_guide,
    predict,
)

pytestmark = pytest.mark.slow


def test_linear_regression_matches_the_exact_posterior():
    torch.manual_seed(0)
    n, sigma, alpha = 200, 0.5, 1.0
    x = torch.randn(n, 5)
    y = x @ torch.randn(5) + 0.3 + sigma * torch.randn(n)
    model = bayesian(nn.Linear(5, 1), prior=alpha, likelihood=Gaussian(scale=sigma))
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, n, seed=0), epochs=3000, progress=False, seed=0)
    phi = torch.cat([x, torch.ones(n, 1)], 1).double()
    precision = torch.eye(6, dtype=torch.float64) / alpha**2 + phi.T @ phi / sigma**2
    cov = torch.linalg.inv(precision)
    mean = cov @ phi.T @ y.double() / sigma**2
    means, scales = guide.means(), guide.scales()
    got_mean = torch.cat([means["weight"].flatten(), means["bias"]]).double()
    got_scale = torch.cat([scales["weight"].flatten(), scales["bias"]]).double()
    mean_error = ((got_mean - mean) / cov.diagonal().sqrt()).abs().max().item()
    optimum = 1 / precision.diagonal().sqrt()  # the mean-field optimum, not the marginal sd
    scale_error = ((got_scale - optimum) / optimum).abs().max().item()
    print(f"\n[linear regression] mean error {mean_error:.3f} sd, scale error {scale_error:.3%}")
    assert mean_error < 0.15
    assert scale_error < 0.10


def test_a_learned_noise_scale_finds_the_true_one():
    torch.manual_seed(0)
    n, sigma = 2000, 0.5
    x = torch.randn(n, 5)
    y = x @ torch.randn(5) + 0.3 + sigma * torch.randn(n)
    model = bayesian(nn.Linear(5, 1), likelihood=Gaussian(scale="learned"))
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, 256, seed=0), epochs=400, progress=False, seed=0)
    learned = F.softplus(model.likelihood.raw_scale).item()
    print(f"\n[learned noise] {learned:.4f} (true {sigma})")
    assert abs(learned - sigma) < 0.1 * sigma


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cubic_toy_epistemic_band_widens_away_from_the_data(seed):
    torch.manual_seed(seed)
    x = torch.rand(20, 1) * 8 - 4
    y = x.pow(3) + 3 * torch.randn_like(x)
    scaler = Standardizer.fit(x, y)
    net = nn.Sequential(nn.Linear(1, 100), nn.ReLU(), nn.Linear(100, 1))
    model = bayesian(net, likelihood=Gaussian(3.0 / float(scaler.y_std)))  # the known noise
    guide = mean_field_guide(model)
    loader = ArrayLoader(*scaler.transform(x, y), batch_size=20, seed=seed)
    fit(model, guide, loader, epochs=5000, progress=False, seed=seed)
    points = torch.tensor([[-6.0], [0.0], [6.0]])
    p = scaler.inverse(predict(model, scaler.transform_x(points), guide, num_samples=200))
    sd = p.epistemic_variance.sqrt()[:, 0]
    fresh_x = torch.rand(1000, 1) * 8 - 4
    fresh_y = fresh_x.pow(3) + 3 * torch.randn_like(fresh_x)
    fresh = scaler.inverse(predict(model, scaler.transform_x(fresh_x), guide, num_samples=200))
    coverage = fresh.evaluate(fresh_y)["coverage_90"]
    print(
        f"\n[cubic toy, seed {seed}] epistemic sd at -6, 0, 6: {sd.tolist()}, coverage {coverage}"
    )
    assert sd[0] >= 3 * sd[1] and sd[2] >= 3 * sd[1]
    assert 0.80 <= coverage <= 0.98


@pytest.mark.parametrize("method", ["bayesian", "batchensemble"])
def test_heteroscedastic_noise_is_tracked(method):
    torch.manual_seed(0)
    x = torch.rand(2000, 1) * 8 - 4
    y = torch.sin(x) + (0.1 + 0.5 * x.abs()) * torch.randn_like(x)
    net = nn.Sequential(nn.Linear(1, 64), nn.ReLU(), nn.Linear(64, 2))
    if method == "bayesian":
        model = bayesian(net, likelihood=Gaussian("heteroscedastic"))
        guide = mean_field_guide(model)
    else:
        model, guide = batchensemble(net, 4, likelihood=Gaussian("heteroscedastic")), None
    fit(model, guide, ArrayLoader(x, y, 128, seed=0), epochs=60, progress=False, seed=0)
    grid = torch.linspace(-4, 4, 200).unsqueeze(1)
    p = predict(model, grid, guide)
    learned = p.aleatoric_variance.sqrt()[:, 0]
    truth = 0.1 + 0.5 * grid[:, 0].abs()
    correlation = torch.corrcoef(torch.stack([learned, truth]))[0, 1].item()
    print(f"\n[heteroscedastic, {method}] correlation {correlation:.4f}")
    assert correlation >= 0.9
