"""Regression numerics at the edges: constant columns in float32, point predictions' CRPS,
and float32 predictions rescaled by float64 statistics."""

from __future__ import annotations

import pytest
import torch

from pyrouq import GaussianPredictions, Standardizer
from pyrouq.regression import mixture_crps


def test_a_constant_column_is_only_centred_in_float32_too():
    """The mean of 1,000 float32 copies of 0.1 rounds off 0.1: the column's std came out
    7e-9, not 0, so it was kept, mapping the column to -0.9995 and 1.1 to 1.3e8."""
    x = torch.full((1000, 1), 0.1)
    y = torch.stack([torch.randn(1000, generator=torch.Generator().manual_seed(0)),
                     torch.full((1000,), 123.456)], 1)  # fmt: skip
    scaler = Standardizer.fit(x, y)
    assert scaler.x_std.item() == 1.0 and scaler.y_std[1].item() == 1.0
    assert scaler.x_mean.dtype == scaler.x_std.dtype == torch.float32
    sx, sy = scaler.transform(x, y)
    assert torch.equal(sx, torch.zeros(1000, 1)) and torch.equal(sy[:, 1], torch.zeros(1000))
    assert scaler.transform_x(torch.tensor([[1.1]])).item() == pytest.approx(1.0)
    wide = y[:, 0].double()  # the other columns: the float64 statistics, rounded once
    assert torch.equal(scaler.y_std[0], wide.std().float())
    assert torch.equal(scaler.y_mean[0], wide.mean().float())


def test_the_crps_of_point_predictions_is_the_ensemble_crps():
    """Zero scales are point masses: E|x_s - y| - E|x_s - x_t| / 2 (the closed form divided
    0 by 0, NaN); a scale near 0 gives nearly the same."""
    loc = torch.tensor([[1.0, 0.0], [2.0, 0.5], [4.0, -1.0]])  # S = 3, N = 2
    y = torch.tensor([2.5, 0.0])
    ensemble = (loc - y).abs().mean(0) - 0.5 * (loc[:, None] - loc[None]).abs().mean((0, 1))
    crps = mixture_crps(loc, torch.zeros(3, 2), y)
    torch.testing.assert_close(crps, ensemble.double())
    assert crps[0].item() == pytest.approx(0.5)  # 1.0 - 0.5 * (2 * (1 + 3 + 2) / 9)
    tiny = mixture_crps(loc, torch.full((3, 2), 1e-9), y)
    torch.testing.assert_close(tiny, crps, atol=1e-8, rtol=0)
    mixed = torch.tensor([[0.0, 0.3], [0.7, 0.0], [0.2, 0.0]])
    near = mixture_crps(loc, mixed.clamp_min(1e-12), y)
    torch.testing.assert_close(mixture_crps(loc, mixed, y), near, atol=1e-10, rtol=0)


def test_float64_statistics_rescale_float32_predictions_in_float64():
    """Targets near 123456 with a spread of 0.5: a float32 value there is only good to 0.004.
    Rescaled in float32, the RMSE of predictions good to ~3e-4 read 0.0043 against the targets
    and 0.0021 against the carried ones, which had moved off them by 0.004."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 1, generator=g)
    y = (123456.789 + 0.5 * x[:, 0] + 0.01 * torch.randn(200, generator=g)).double()
    scaler = Standardizer.fit(x, y)
    sy = scaler.transform_y(y)
    loc = sy.float()[None, :, None] + 0.001 * torch.randn(3, 200, 1, generator=g)
    preds = GaussianPredictions(loc, torch.full_like(loc, 0.02), sy)
    back = scaler.inverse(preds)
    assert back.loc.dtype == back.scale.dtype == torch.float64
    torch.testing.assert_close(back.targets[:, 0], y, atol=1e-9, rtol=0)
    exact = ((loc.double().mean(0)[:, 0] - sy) * scaler.y_std).square().mean().sqrt().item()
    assert exact < 5e-4
    assert back.evaluate()["rmse"] == pytest.approx(exact, rel=1e-6)
    assert back.evaluate(y)["rmse"] == pytest.approx(exact, rel=1e-6)
    assert preds.rescale(10.0, 2.0).loc.dtype == torch.float32  # Python numbers: no promotion


def test_the_crps_of_zero_scales_has_finite_gradients():
    """Masking the 0 / 0 of a zero scale's result alone left sqrt's infinite slope at 0 in the
    backward pass (inf times the masked 0): the scales' gradients were NaN. A zero scale's own
    gradient is 0 (a subgradient), as a scale clamped up to 1e-12 gets; the rest are the
    clamped ones, and the locations' too."""
    loc = torch.tensor([[1.0, 0.0], [2.0, 0.5], [4.0, -1.0]])
    mixed = torch.tensor([[0.0, 0.3], [0.7, 0.0], [0.2, 0.0]])
    y = torch.tensor([2.5, 0.0])

    def grads(transform):
        m, s = loc.clone().requires_grad_(), mixed.clone().requires_grad_()
        mixture_crps(m, transform(s), y).sum().backward()
        return m.grad, s.grad

    loc_grad, scale_grad = grads(lambda s: s)
    assert bool(torch.isfinite(scale_grad).all()) and bool(torch.isfinite(loc_grad).all())
    near_loc, near_scale = grads(lambda s: s.clamp_min(1e-12))
    torch.testing.assert_close(loc_grad, near_loc, atol=1e-6, rtol=0)
    torch.testing.assert_close(scale_grad, near_scale, atol=1e-6, rtol=0)
    assert scale_grad[mixed == 0].abs().max().item() == 0.0
    zero = torch.zeros(3, 2, requires_grad=True)
    mixture_crps(loc, zero, y).sum().backward()
    assert torch.equal(zero.grad, torch.zeros(3, 2))


def test_a_spread_below_the_dtypes_smallest_std_gets_std_1():
    """A float32 column of zeros and one 1.4e-45 has a float64 std of 4e-47, 0 in float32: kept
    as 0, it sent the column to inf and NaN (0 / 0)."""
    x = torch.zeros(1000, 1)
    x[0, 0] = 1.4e-45
    scaler = Standardizer.fit(x, torch.randn(1000, generator=torch.Generator().manual_seed(0)))
    assert scaler.x_std.item() == 1.0
    assert bool(torch.isfinite(scaler.transform_x(x)).all())
