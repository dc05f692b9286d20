"""Audit 4 of regression, recalibration and tabular helpers: the temperature of an all-correct
validation split, the gradient of the mixture's quantiles, the CRPS of no draws or inputs."""

from __future__ import annotations

import math

import pytest
import torch

from pyrouq import GaussianPredictions, Predictions, temperature_scale
from pyrouq.regression import mixture_crps


def test_an_all_correct_split_gets_the_lower_bound_and_its_warning():
    # every input right by >= 2.5 nats: the NLL underflows to 0 at every T near 0.05, so the
    # minimum is the bound (the golden-section search drifted to T = 0.0539, silently)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(60, 10, generator=g)
    labels = logits.argmax(1)
    logits[torch.arange(60), labels] += 2.5
    preds = Predictions(torch.softmax(logits, -1)[None].repeat(2, 1, 1), labels)
    with pytest.warns(UserWarning, match=r"lowest at T = 0.05, the bound .*far less confident"):
        scaler = temperature_scale(preds)
    assert scaler.temperature == pytest.approx(0.05, rel=1e-12)


def _pdf(t: float, loc: list[float], scale: list[float]) -> list[float]:
    return [math.exp(-0.5 * ((t - m) / s) ** 2) / s for m, s in zip(loc, scale, strict=True)]


def test_the_quantiles_gradient_is_the_implicit_one():
    loc = torch.tensor([[[0.0]], [[3.0]]], dtype=torch.float64, requires_grad=True)
    scale = torch.tensor([[[1.0]], [[0.5]]], dtype=torch.float64, requires_grad=True)
    q = GaussianPredictions(loc, scale).quantile(0.7)
    q.sum().backward()
    t = float(q.detach())
    dens = _pdf(t, [0.0, 3.0], [1.0, 0.5])  # F(q) = level: dq = -dF / f, by hand
    want_loc = [d / sum(dens) for d in dens]  # [0.0082, 0.9918]; it was [1, 0]
    want_scale = [
        d * (t - m) / s / sum(dens) for d, m, s in zip(dens, [0.0, 3.0], [1.0, 0.5], strict=True)
    ]
    torch.testing.assert_close(loc.grad.flatten().tolist(), want_loc, rtol=1e-9, atol=0)
    torch.testing.assert_close(scale.grad.flatten().tolist(), want_scale, rtol=1e-9, atol=0)

    g = torch.Generator().manual_seed(0)
    loc = torch.randn(4, 3, 2, generator=g, dtype=torch.float64)
    scale = torch.rand(4, 3, 2, generator=g, dtype=torch.float64) + 0.2

    def upper(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return GaussianPredictions(m, s).interval(0.8)[1]

    assert torch.autograd.gradcheck(upper, (loc.requires_grad_(), scale.requires_grad_()))
    plain = GaussianPredictions(loc.detach(), scale.detach()).quantile(0.9)
    assert torch.equal(GaussianPredictions(loc, scale).quantile(0.9).detach(), plain)


def test_the_crps_of_no_draws_is_refused_and_of_no_inputs_is_empty():
    with pytest.raises(ValueError, match=r"at least one draw, got loc of shape \(0, 3, 1\)"):
        mixture_crps(torch.zeros(0, 3, 1), torch.zeros(0, 3, 1), torch.zeros(3, 1))
    out = mixture_crps(torch.zeros(2, 0, 2), torch.ones(2, 0, 2), torch.zeros(0, 2))
    assert out.shape == (0, 2)


def test_the_quantiles_gradient_survives_a_density_that_underflows():
    """Two components 1000 apart of scale 1e-20: the density at the 0.25 quantile underflows
    to 0, and the implicit gradient, divided by it, was 0 (a shift of every loc moves the
    quantile as much: the gradients in loc sum to 1)."""
    loc = torch.tensor([[[0.0]], [[1000.0]]], dtype=torch.float64, requires_grad=True)
    scale = torch.full((2, 1, 1), 1e-20, dtype=torch.float64)
    (grad,) = torch.autograd.grad(GaussianPredictions(loc, scale).quantile(0.25).sum(), loc)
    assert grad.flatten().tolist() == [1.0, 0.0]
