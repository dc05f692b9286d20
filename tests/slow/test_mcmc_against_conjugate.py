"""NUTS against the exact posterior of a conjugate Bayesian linear regression (known noise):
4 chains x 500 draws; means within 0.1 posterior sd, sds within 10 %, every site R-hat < 1.01
and bulk ESS > 400 (`make test-slow`; about a minute)."""

from __future__ import annotations

import arviz as az
import pytest
import torch
from torch import nn

from pyrouq import Gaussian, bayesian, mcmc, to_inference_data

pytestmark = pytest.mark.slow


def test_nuts_matches_the_conjugate_posterior():
    torch.manual_seed(0)
    n, sigma, alpha = 100, 0.5, 1.0
    x = torch.randn(n, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 + sigma * torch.randn(n)
    model = bayesian(nn.Linear(3, 1), prior=alpha, likelihood=Gaussian(sigma))
    result = mcmc(model, x, y, num_samples=500, warmup_steps=500, num_chains=4, seed=0,
                  progress=False)  # fmt: skip
    phi = torch.cat([x, torch.ones(n, 1)], 1).double()
    precision = torch.eye(4, dtype=torch.float64) / alpha**2 + phi.T @ phi / sigma**2
    cov = torch.linalg.inv(precision)
    mean = cov @ phi.T @ y.double() / sigma**2
    sd = cov.diagonal().sqrt()
    draws = result.draws()
    got = torch.cat([draws["weight"].flatten(1), draws["bias"]], 1).double()
    mean_error = ((got.mean(0) - mean) / sd).abs().max().item()
    sd_error = ((got.std(0) - sd) / sd).abs().max().item()
    idata = to_inference_data(result)
    rhat = az.rhat(idata, var_names=["weight", "bias"])
    ess = az.ess(idata, var_names=["weight", "bias"], method="bulk")
    worst_rhat = max(float(rhat[v].max()) for v in ("weight", "bias"))
    least_ess = min(float(ess[v].min()) for v in ("weight", "bias"))
    print(f"\n[NUTS, conjugate regression] mean error {mean_error:.3f} sd, sd error "
          f"{sd_error:.2%}, max R-hat {worst_rhat:.4f}, min bulk ESS {least_ess:.0f}, "
          f"divergences {result.divergences}, {sum(result.seconds):.1f} s")  # fmt: skip
    assert mean_error < 0.1
    assert sd_error < 0.10
    assert worst_rhat < 1.01
    assert least_ess > 400
