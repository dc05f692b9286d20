"""Audit regressions of pyrouq.diagnostics: PSIS of a guide on a large data set, masked
observations and non-finite log-likelihoods in to_inference_data."""

from __future__ import annotations

import math
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyrouq.diagnostics import psis_diagnostic, to_inference_data

az = pytest.importorskip("arviz")

F64 = torch.float64


def _normal_mean(n: int = 1000, likelihood_dtype: torch.dtype = F64):
    """y_i ~ Normal(mu, 1), mu ~ Normal(0, 10) (float64): a conjugate model of n points, its
    likelihood evaluated in ``likelihood_dtype``."""
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(n, 1, dtype=F64)
    y = torch.randn(n, generator=g, dtype=F64) + 0.3

    def model(x, y):
        mu = pyro.sample("mu", dist.Normal(torch.tensor(0.0, dtype=F64), 10.0))
        with pyro.plate("data", len(y)):
            pyro.sample(
                "obs",
                dist.Normal(mu.to(likelihood_dtype), 1.0),
                obs=y.to(likelihood_dtype),
            )

    return model, x, y


def _guide(loc: float, scale: float):
    def guide(x, y):
        pyro.sample("mu", dist.Normal(torch.tensor(loc, dtype=F64), scale))

    return guide


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_psis_reads_a_narrow_guide_of_a_large_data_set_as_heavy_tailed(dtype):
    """1000 points standing for M = 1e6 (num_data): the log joint is about -1.4e6 nats. A guide
    at half the posterior's sd has ratios exp(0.375 u^2), u ~ N(0, 1), whose tail has
    k = 0.75; their log spreads over ~5 nats, which is not 'constant to numerical precision'
    (pyrouq took spreads up to 1e-5 of the size, 14 nats here, as constant: k-hat -inf)."""
    model, x, y = _normal_mean(likelihood_dtype=dtype)
    m = 1_000_000
    precision = 1 / 100 + m
    mean, sd = (m / len(y)) * float(y.sum()) / precision, precision**-0.5
    pyro.set_rng_seed(0)
    narrow = psis_diagnostic(model, _guide(mean, 0.5 * sd), x, y, num_samples=1000, num_data=m)
    lw = narrow.log_weights
    assert float(lw.abs().max()) > 1e6 and 2.0 < float(lw.max() - lw.min()) < 20.0
    _, k = az.psislw(lw.numpy().copy(), reff=1.0)
    assert math.isfinite(narrow.k_hat) and narrow.k_hat == pytest.approx(float(k), abs=1e-9)
    assert narrow.k_hat > 0.5 and narrow.interpretation.split()[0] in ("ok", "bad")
    # the exact posterior as guide still reads good: constant in float64, rounding in float32
    pyro.set_rng_seed(0)
    exact = psis_diagnostic(model, _guide(mean, sd), x, y, num_samples=300, num_data=m)
    assert exact.k_hat < 0.5 and exact.interpretation.startswith("good")
    if dtype == torch.float64:
        assert exact.k_hat == -math.inf
    assert math.isclose(float(torch.logsumexp(exact.smoothed_log_weights, 0)), 0.0, abs_tol=1e-9)


def test_psis_constant_weights_are_still_minus_inf_at_every_size():
    """A float64 exact guide: spreads of rounding size (<= 1e-9 of the size) stay k-hat -inf,
    where az.psislw itself would return inf or NaN weights."""
    model, x, y = _normal_mean(n=50)
    precision = 1 / 100 + 50
    mean, sd = float(y.sum()) / precision, precision**-0.5
    pyro.set_rng_seed(0)
    result = psis_diagnostic(model, _guide(mean, sd), x, y, num_samples=100)
    assert result.k_hat == -math.inf and result.reliable
    torch.testing.assert_close(
        result.smoothed_log_weights, torch.full((100,), -math.log(100), dtype=F64)
    )


def _masked_models():
    keep = torch.tensor([True, True, False, True, True, False])

    def poutine_masked(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)), poutine.mask(mask=keep):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=torch.nan_to_num(y))

    def distribution_masked(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0).mask(keep), obs=torch.nan_to_num(y))

    return keep, {"poutine.mask": poutine_masked, ".mask()": distribution_masked}


@pytest.mark.parametrize("kind", ["poutine.mask", ".mask()"])
def test_a_masked_obs_site_is_refused_not_exported_with_made_up_points(kind):
    """The masked points are not observed; pyrouq exported log p(filler | w) for them (or 0
    for .mask()), which az.loo then summed as if they were data."""
    keep, models = _masked_models()
    x = torch.randn(6, 1)
    y = torch.randn(6).masked_fill(~keep, math.nan)

    def guide(x, y):
        pyro.sample("w", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"a mask \(poutine.mask or .mask\(\)\) leaves points"):
        to_inference_data(models[kind], guide, x, y, num_samples=3)

    # the observed points alone export, one log-likelihood per point
    def unmasked(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", len(y)), poutine.mask(mask=torch.ones(len(y), dtype=torch.bool)):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=y)

    idata = to_inference_data(unmasked, guide, x[keep], y[keep], num_samples=3)
    assert idata.log_likelihood["obs"].shape == (1, 3, 4)


def test_a_nan_log_likelihood_warns_and_says_where():
    """Draws whose likelihood is NaN were exported silently; az.loo then gave NaN."""
    x, y = torch.ones(5, 1), torch.zeros(5)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        loc = torch.where(w > 0, torch.tensor(math.nan), w) * x[:, 0]
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(loc, 1.0), obs=y)

    def guide(x, y):
        pyro.sample("w", dist.Normal(-0.5, 1.0))

    pyro.set_rng_seed(0)
    with (
        pyro.validation_enabled(False),
        pytest.warns(RuntimeWarning, match=r"NaN or \+inf at \d+ of 100 entries, in draws \["),
    ):
        idata = to_inference_data(model, guide, x, y, num_samples=20)
    nan_draws = torch.isnan(torch.as_tensor(idata.log_likelihood["obs"].values[0])).any(1)
    assert 0 < int(nan_draws.sum()) < 20
    pyro.set_rng_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)

        def finite_guide(x, y):
            pyro.sample("w", dist.Normal(-5.0, 0.1))

        to_inference_data(model, finite_guide, x, y, num_samples=20)


def test_a_mask_or_scale_around_psis_is_refused_not_read_as_a_perfect_guide():
    """Under poutine.mask(False) every log density, the guide's too, was 0: k-hat -inf, "the
    guide equals the posterior"; a scale around the call weighed the ratios to another power."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 1, generator=g, dtype=F64)
    y = 2.0 * x[:, 0] + torch.randn(20, generator=g, dtype=F64)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.tensor(0.0, dtype=F64), 1.0))
        with pyro.plate("data", len(y)):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=y)

    def guide(x, y):  # too narrow, off the posterior's mean: a heavy tail of ratios
        pyro.sample("w", dist.Normal(torch.tensor(1.5, dtype=F64), 0.02))

    k_hat = psis_diagnostic(model, guide, x, y, num_samples=100, seed=0).k_hat
    assert k_hat > 0.7
    masks = [
        (False, r"\(mask=False\)"),
        (torch.tensor(False), r"\(mask=False\)"),
        (torch.ones(20, dtype=torch.bool), r"\(\) of a mask of shape \(20,\)"),  # 20 * log q
    ]
    for mask, shown in masks:
        with (
            poutine.mask(mask=mask),
            pytest.raises(
                ValueError,
                match=rf"psis_diagnostic\(\) was called inside pyro.poutine.mask{shown}, "
                r"expected no mask around the call: it masks the latent sites of the model and of "
                r"the guide alike .* \(under mask=False all 0, which reads as k-hat -inf, a guide "
                r"equal to the posterior\)\. Call psis_diagnostic\(\) outside the mask",
            ),
        ):
            psis_diagnostic(model, guide, x, y, num_samples=100, seed=0)
    with (
        poutine.scale(scale=0.5),
        pytest.raises(
            ValueError,
            match=r"inside pyro.poutine.scale\(scale=0.5\), expected no scale around the call: .* "
            r"Call psis_diagnostic\(\) outside it; to weigh the likelihood as that of a data "
            r"set of M points, pass num_data=M\.",
        ),
    ):
        psis_diagnostic(model, guide, x, y, num_samples=100, seed=0)
    # a mask of True and a scale of 1 change nothing: let through, the same k-hat
    with poutine.mask(mask=torch.tensor(True)), poutine.scale(scale=1.0):
        assert psis_diagnostic(model, guide, x, y, num_samples=100, seed=0).k_hat == k_hat
