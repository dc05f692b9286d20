"""Regression audit: GaussianPredictions' scores against scipy (numerical integration and root
finding), predictions that require grad in evaluate() and plot_regression(), and the bands'
half-width."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch

from pyrouq import GaussianPredictions, plot_regression


def _mixture(s=4, n=5, d=2, dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    loc = (2 * torch.randn(s, n, d, generator=g, dtype=torch.float64)).to(dtype)
    scale = (torch.rand(s, n, d, generator=g, dtype=torch.float64) + 0.2).to(dtype)
    y = (2 * torch.randn(n, d, generator=g, dtype=torch.float64)).to(dtype)
    return loc, scale, y


def test_scores_match_scipy_on_a_mixture_of_several_outputs():
    stats = pytest.importorskip("scipy.stats")
    integrate = pytest.importorskip("scipy.integrate")
    optimize = pytest.importorskip("scipy.optimize")
    loc, scale, y = _mixture()
    p = GaussianPredictions(loc, scale, y)
    m, s, t = loc.numpy(), scale.numpy(), y.numpy()
    n, d = t.shape

    def cdf(v, i, j):
        return float(np.mean(stats.norm.cdf(v, m[:, i, j], s[:, i, j])))

    def below(v, i, j):
        return cdf(v, i, j) ** 2

    def above(v, i, j):
        return (1 - cdf(v, i, j)) ** 2

    def off(v, i, j, level):
        return cdf(v, i, j) - level

    # joint NLL of the D outputs, one mixture component per draw
    joint = [np.log(np.mean(np.prod(stats.norm.pdf(t[i], m[:, i], s[:, i]), -1))) for i in range(n)]
    np.testing.assert_allclose(p.log_prob().numpy(), joint, rtol=1e-12)
    # CRPS = int F^2 below y + int (1 - F)^2 above y
    crps = np.empty((n, d))
    for i in range(n):
        for j in range(d):
            lower = integrate.quad(below, -60, t[i, j], args=(i, j), limit=200)[0]
            upper = integrate.quad(above, t[i, j], 60, args=(i, j), limit=200)[0]
            crps[i, j] = lower + upper
    np.testing.assert_allclose(p.crps().numpy(), crps.mean(-1), rtol=1e-9)
    # quantiles by root finding on the mixture's CDF
    for level in (0.02, 0.5, 0.975):
        q = [
            [optimize.brentq(off, -80, 80, args=(i, j, level), xtol=1e-13) for j in range(d)]
            for i in range(n)
        ]
        np.testing.assert_allclose(p.quantile(level).numpy(), np.array(q), atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_decomposition_is_the_mixtures_variance_in_both_dtypes(dtype):
    loc, scale, _ = _mixture(s=6, n=4, d=3, dtype=dtype)
    loc = loc + 1e4  # means far from 0, spread ~2: no cancellation in var_s mu_s
    u = GaussianPredictions(loc, scale).uncertainty()
    l64, s64 = loc.double(), scale.double()
    second_moment = (s64.square() + l64.square()).mean(0)
    # E[y^2] - E[y]^2 cancels ~1e8 in float64: compared to the spread, not to the total
    total = (second_moment - l64.mean(0).square()).sum(-1)
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(u.total.double(), total, rtol=tol, atol=1e-6)
    torch.testing.assert_close(u.total, u.aleatoric + u.epistemic)
    assert u.total.dtype == dtype


def _requires_grad():
    loc, scale, y = _mixture(s=3, n=8, d=1, dtype=torch.float32)
    return GaussianPredictions(loc.requires_grad_(), scale.requires_grad_(), y)


def test_plot_regression_draws_predictions_that_require_grad():
    # GaussianPredictions built from outputs that require grad (their CRPS is differentiable)
    # failed in numpy(): "Can't call numpy() on Tensor that requires grad"
    p = _requires_grad()
    x = torch.arange(8.0)
    fig = plot_regression(p, x)
    line = fig.axes[0].get_lines()[-1]
    np.testing.assert_allclose(line.get_ydata(), p.mean[:, 0].detach().numpy(), rtol=1e-6)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_evaluate_of_predictions_that_require_grad_builds_no_graph_and_warns_nothing():
    # each float() of a tensor that requires grad warned, "Converting a tensor with
    # requires_grad=True to a scalar may lead to unexpected behavior"
    p = _requires_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = p.evaluate()
    detached = GaussianPredictions(p.loc.detach(), p.scale.detach(), p.targets).evaluate()
    assert metrics == detached and math.isfinite(metrics["crps"])
    p.crps().sum().backward()  # the predictions themselves still differentiate
    assert p.loc.grad is not None and torch.isfinite(p.loc.grad).all()


@pytest.mark.parametrize("num_sd", [math.inf, -math.inf])
def test_plot_regression_refuses_a_half_width_that_is_not_finite_and_positive(num_sd):
    # inf was taken: bands of +-inf are drawn as nothing, under a legend "+-inf sd"
    p = GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1))
    pattern = r"Expected num_sd > 0, the bands' half-width in standard deviations, got "
    with pytest.raises(ValueError, match=pattern) as info:
        plot_regression(p, torch.arange(3.0), num_sd=num_sd)
    assert "pass a finite number, e.g. num_sd=2" in str(info.value)


def test_plot_regression_draws_its_bands_with_the_checked_half_width():
    # a Fraction passed the check but was drawn as given: its legend's f"{num_sd:g}" raised
    # "unsupported format string passed to Fraction.__format__" (Python < 3.12)
    import matplotlib.pyplot as plt

    p = GaussianPredictions(torch.zeros(2, 3, 1), torch.full((2, 3, 1), 0.5))  # aleatoric sd 0.5
    fig = plot_regression(p, torch.arange(3.0), num_sd=Fraction(3, 2))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["aleatoric (+-1.5 sd)", "epistemic (+-1.5 sd)"]
    upper = ax.collections[0].get_paths()[0].vertices[:, 1].max()
    assert upper == pytest.approx(0.75)  # 1.5 * 0.5
    plt.close(fig)


def test_carried_targets_of_one_output_are_a_column():
    # the attribute's docs said (N,) when D = 1; it is (N, 1), as the docs now say
    p = GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1), torch.arange(3.0))
    assert p.targets.shape == (3, 1)
    assert "kept as a column ``(N, 1)``" in GaussianPredictions.__doc__
