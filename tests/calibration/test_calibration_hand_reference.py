"""Audit 3 of recalibration: temperature scaling and conformal sets / intervals checked against
references written here (scipy, numpy, by hand), and the messages of inputs refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, logsumexp

from pyrouq import (
    ConformalClassifier,
    ConformalRegressor,
    TemperatureScaler,
    class_conditional_coverage,
    conformal,
    coverage,
    temperature_scale,
)
from pyrouq.predictive import Predictions
from pyrouq.regression import GaussianPredictions


def _scipy_temperature(probs: torch.Tensor, y: torch.Tensor) -> float:
    """The T of the NLL of the mixture of the S tempered draws, by scipy in float64."""
    logp = np.log(np.clip(probs.double().numpy(), 1e-12, None))

    def nll(log_t: float) -> float:
        mixture = logsumexp(log_softmax(logp / np.exp(log_t), axis=-1), axis=0)
        return float(-(mixture[np.arange(len(y)), y.numpy()] - np.log(len(logp))).mean())

    bounds = (math.log(0.05), math.log(20.0))
    fit = minimize_scalar(nll, bounds=bounds, method="bounded", options={"xatol": 1e-10})
    return float(np.exp(fit.x))


@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.0])
def test_the_temperature_of_an_ensemble_is_scipys_and_recovers_the_miscalibration(true_t):
    g = torch.Generator().manual_seed(0)
    logits = 2 * torch.randn(3000, 5, generator=g)
    y = torch.multinomial(torch.softmax(logits / true_t, -1), 1, generator=g)[:, 0]
    draws = logits + 0.5 * torch.randn(4, 3000, 5, generator=g)  # members that disagree
    preds = Predictions(torch.softmax(draws, -1), y)
    t = temperature_scale(preds).temperature
    assert t == pytest.approx(_scipy_temperature(preds.probs, y), rel=1e-5)
    # over-confident data (labels from logits / 2) need T > 1, under-confident T < 1
    assert {0.5: t < 0.7, 1.0: 0.85 < t < 1.15, 2.0: t > 1.6}[true_t]


@pytest.mark.parametrize("n", [5, 19, 20, 99])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.5])
def test_the_threshold_is_the_ceil_rank_of_tied_scores_by_hand(n, alpha):
    g = torch.Generator().manual_seed(n)
    rows = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.6, 0.2, 0.2]])
    probs = rows[torch.randint(0, 3, (n,), generator=g)]  # scores with many ties
    y = torch.randint(0, 3, (n,), generator=g)
    k = math.ceil(round((n + 1) * (1 - alpha), 9))
    if k > n:
        with pytest.raises(ValueError, match=rf"needs at least \d+ calibration points.*got {n}"):
            conformal(Predictions(probs[None], y), alpha=alpha)
        return
    cal = conformal(Predictions(probs[None], y), alpha=alpha)
    scores = np.sort(1.0 - probs.double().numpy()[np.arange(n), y.numpy()])
    assert cal.threshold == scores[k - 1]
    assert cal.num_calibration == n


@pytest.mark.parametrize("score", ["lac", "aps", "raps"])
def test_marginal_coverage_over_200_splits_is_within_the_conformal_bounds(score):
    g = torch.Generator().manual_seed(2)
    n, alpha, covered = 99, 0.1, []
    for rep in range(200):
        logits = 1.5 * torch.randn(600, 6, generator=g)
        y = torch.multinomial(torch.softmax(0.7 * logits, -1), 1, generator=g)[:, 0]
        probs = torch.softmax(logits, -1)[None]
        cal = conformal(Predictions(probs[:, :n], y[:n]), alpha=alpha, score=score, seed=rep)
        covered.append(coverage(cal.predict_sets(Predictions(probs[:, n:])), y[n:]))
    # 1 - alpha <= E[coverage] <= 1 - alpha + 1 / (n + 1), give or take 3 standard errors
    se = float(np.std(covered)) / math.sqrt(len(covered))
    assert 1 - alpha - 3 * se <= float(np.mean(covered)) <= 1 - alpha + 1 / (n + 1) + 3 * se


def test_coverage_refuses_targets_that_are_not_tensors_by_their_type():
    # a list or an array has a shape too: it was refused as of the wrong shape, "expected
    # labels of shape (3,), ..., got (3,)"
    sets = torch.ones(3, 2, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"coverage\(\): expected the labels as a torch.Tensor, "
                       r"got ndarray; wrap them with torch.as_tensor"):  # fmt: skip
        coverage(sets, np.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError, match=r"expected the labels as a torch.Tensor, got list"):
        class_conditional_coverage(sets, [0, 1, 0])
    intervals = (torch.zeros(3, 1), torch.ones(3, 1))
    for targets in (np.zeros(3), np.zeros((3, 1)), [0.5, 0.5, 0.5]):
        with pytest.raises(TypeError, match=r"coverage\(\): expected the targets as a "
                           r"torch.Tensor, got (ndarray|list)"):  # fmt: skip
            coverage(intervals, targets)
    assert coverage(intervals, torch.as_tensor(np.full(3, 0.5))) == 1.0


def test_numbers_given_as_tensors_are_told_to_be_python_numbers():
    # "Expected a temperature > 0 (finite), got tensor(2.)" said nothing a user could act on
    hint = r" \(a tensor: pass a Python number, float\(t\)\)"  # (was "e.g. float(t) or int(t)")
    with pytest.raises(ValueError, match=rf"got tensor\(2\.\){hint}"):
        TemperatureScaler(torch.tensor(2.0))
    preds = Predictions(torch.softmax(torch.randn(1, 30, 3), -1), torch.randint(0, 3, (30,)))
    with pytest.raises(ValueError, match=rf"RAPS penalty per rank, got tensor.*{hint}"):
        conformal(preds, score="raps", lam=torch.tensor(0.1))
    with pytest.raises(ValueError, match=rf"got tensor\(0\.1000\){hint}") as alpha:
        conformal(preds, alpha=torch.tensor(0.1))  # int(t) would pass 0: never a fit
    assert "int(t)" not in str(alpha.value)
    integer = r" \(a tensor: pass a Python integer, int\(t\)\)"  # (1.0 is refused as well)
    with pytest.raises(ValueError, match=rf"free of penalty, .*got tensor\(1\){integer}"):
        conformal(preds, score="raps", k_reg=torch.tensor(1))
    with pytest.raises(
        ValueError, match=rf"the number of calibration inputs, .*got tensor\(5\){integer}"
    ):
        ConformalRegressor("abs", 0.1, torch.tensor([1.0]), num_calibration=torch.tensor(5))
    with pytest.raises(ValueError, match=rf"free of penalty, .*got tensor\(1\){integer}"):
        ConformalClassifier("raps", 0.1, 0.5, 0.1, torch.tensor(1), 0)


def test_fitted_predictors_tell_their_calibration_count():
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(2, 19, 4, generator=g), -1)
    cal = conformal(Predictions(probs, torch.randint(0, 4, (19,), generator=g)), score="aps")
    assert cal.num_calibration == 19 and type(cal.num_calibration) is int
    assert repr(cal).endswith(", seed=0, num_calibration=19)")
    loc, scale = torch.randn(3, 40, 2, generator=g), torch.ones(3, 40, 2)
    reg = conformal(GaussianPredictions(loc, scale, torch.randn(40, 2, generator=g)), alpha=0.2)
    assert reg.num_calibration == 40 and repr(reg).endswith(", num_calibration=40)")
    assert reg == ConformalRegressor(reg.score, reg.alpha, reg.threshold)  # as documented
    hand = ConformalClassifier("lac", 0.1, 0.5, 0.0, 0, 0)
    assert hand.num_calibration is None and "num_calibration" not in repr(hand)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=r"ConformalRegressor: expected num_calibration"):
            ConformalRegressor("abs", 0.1, [1.0], bad)


def test_a_conformal_regressor_of_many_outputs_has_a_short_repr():
    """A notebook cell ending in conformal(...) printed every output's threshold: 4,074
    characters for 500 outputs (an image's pixels: tens of thousands). A few outputs keep
    theirs; more are told by their count and range."""
    few = ConformalRegressor("abs", 0.1, [1.5, 2.25])
    assert repr(few) == "ConformalRegressor(score='abs', alpha=0.1, threshold=[1.5000, 2.2500])"
    eight = repr(ConformalRegressor("abs", 0.1, [1.0] * 8))  # up to 8: each one's own
    assert eight.endswith("threshold=[" + ", ".join(["1.0000"] * 8) + "])")
    nine = repr(ConformalRegressor("abs", 0.1, [1.0] * 8 + [2.0]))
    assert nine.endswith("threshold=<9 outputs, 1.0000 to 2.0000>)")
    thresholds = torch.linspace(0.5, 3.0, 500, dtype=torch.float64).flip(0)
    many = ConformalRegressor("cqr", 0.2, thresholds, num_calibration=40)
    assert repr(many) == (
        "ConformalRegressor(score='cqr', alpha=0.2, threshold=<500 outputs, 0.5000 to "
        "3.0000>, num_calibration=40)"
    )


def test_the_mixtures_lower_tail_keeps_its_precision():
    """0.5 * (1 + erf(z / sqrt 2)) cancels in the lower tail: cdf(-9) read 0 and the 1e-15
    quantile -7.9380 where scipy's norm.ppf gives -7.9413."""
    one = GaussianPredictions(torch.zeros(1, 1, 1), torch.ones(1, 1, 1))
    assert float(one.cdf(-9.0)) == pytest.approx(1.1285884059538e-19, rel=1e-9)
    assert float(one.quantile(1e-15)) == pytest.approx(-7.941345326170997, rel=1e-9)
    assert float(one.quantile(1e-12)) == pytest.approx(-7.034483825301131, rel=1e-9)
