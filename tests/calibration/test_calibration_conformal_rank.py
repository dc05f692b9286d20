"""Calibration against independent references: the conformal rank against a sorted numpy
array, coverage at a small calibration split against its exact value k / (n + 1), and the
temperature scaler's output against the tempered softmax; plus what an audit found (the
scaler's clamp, a flat NLL, regressors' equality)."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest
import torch

from pyrouq import (
    ConformalRegressor,
    GaussianPredictions,
    Predictions,
    TemperatureScaler,
    conformal,
    coverage,
    temperature_scale,
)


def test_the_threshold_is_the_ceil_n_plus_one_rank_of_the_sorted_scores():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        n, alpha = int(rng.integers(1, 200)), float(rng.uniform(0.005, 0.995))
        k = math.ceil((n + 1) * (1 - alpha))
        if k > n or abs((n + 1) * (1 - alpha) - round((n + 1) * (1 - alpha))) < 1e-9:
            continue
        p = rng.uniform(0.01, 0.99, n)
        probs = torch.tensor(np.stack([p, 1 - p], -1))[None]
        got = conformal(Predictions(probs, torch.zeros(n).long()), alpha=alpha).threshold
        assert got == np.sort(1 - p)[k - 1], (n, alpha)
        checked += 1
    assert checked > 150


@pytest.mark.parametrize("score", ["lac", "aps", "raps"])
def test_coverage_at_a_small_split_is_k_over_n_plus_one(score):
    """n = 24, alpha = 0.1: k = ceil(22.5) = 23 and, with continuous scores, the expected
    coverage is exactly 23 / 25 = 0.92 (not merely >= 0.9)."""
    g = torch.Generator().manual_seed(1)
    big = 100000
    probs = torch.softmax(1.5 * torch.randn(big, 6, generator=g), -1)
    y = torch.multinomial(probs, 1, generator=g)[:, 0]
    covs = []
    for r in range(800):
        idx = torch.randint(0, big, (224,), generator=g)
        cal = Predictions(probs[idx[:24]][None], y[idx[:24]])
        test = Predictions(probs[idx[24:]][None], y[idx[24:]])
        predictor = conformal(cal, alpha=0.1, score=score, seed=r, lam=0.1, k_reg=1)
        covs.append(coverage(predictor.predict_sets(test), test.targets))
    assert 0.91 < float(np.mean(covs)) < 0.93, np.mean(covs)


def test_the_scaler_tempers_probabilities_clamped_at_1e_12_as_its_fit_does():
    """The scaler applies the transform whose NLL the fit minimised: p < 1e-12 counts as
    1e-12 in both (tempering them exactly applied another transform than the one fitted; see
    test_temperature_transform), so 1e-30 at T = 3 comes out as 1e-12 does, and float32 and float64
    agree on an underflowed 0."""
    logits = torch.tensor([[0.0, -69.0, -40.0]], dtype=torch.float64)
    probs = torch.softmax(logits, -1)
    scaled = TemperatureScaler(3.0)(Predictions(probs[None])).probs[0]
    expected = torch.softmax(probs.clamp_min(1e-12).log() / 3, -1)
    torch.testing.assert_close(scaled, expected, rtol=1e-9, atol=0)
    assert scaled[0, 1] == scaled[0, 2]  # both below the clamp
    ten = torch.tensor([[0.0] + [-20.0] * 9])  # float32, p = 2e-9 each: above the clamp
    scaled = TemperatureScaler(2.0)(Predictions(torch.softmax(ten, -1)[None])).probs[0]
    torch.testing.assert_close(scaled, torch.softmax(ten / 2, -1), rtol=1e-5, atol=0)
    one_hot = [
        TemperatureScaler(2.0)(Predictions(torch.tensor([[[1.0, 0.0]]], dtype=dt))).probs
        for dt in (torch.float32, torch.float64)
    ]
    tempered = 1e-6 / (1 + 1e-6)  # (1e-12)^(1/2), renormalised
    assert one_hot[0][0, 0, 1].item() == pytest.approx(tempered, rel=1e-6, abs=0)
    assert one_hot[1][0, 0, 1].item() == pytest.approx(tempered, rel=1e-12, abs=0)


@pytest.mark.parametrize("probs", [torch.full((1, 40, 4), 0.25), torch.ones(2, 40, 1)])
def test_a_flat_nll_gives_the_identity_temperature_and_says_why(probs):
    preds = Predictions(probs, torch.randint(0, probs.shape[-1], (40,)))
    with pytest.warns(UserWarning, match=r"the validation NLL is the same at every T .*T = 1") as w:
        scaler = temperature_scale(preds)
    assert {r.filename for r in w if "every T" in str(r.message)} == {__file__}  # here
    assert scaler.temperature == 1.0  # was 0.0539, silently: an arbitrary end of the grid
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        temperature_scale(Predictions(torch.tensor([[[0.6, 0.4]] * 3]), torch.tensor([0, 0, 1])))


def test_conformal_regressors_compare_and_hash_by_value():
    a = ConformalRegressor("abs", 0.1, torch.tensor([1.0, 2.0]))
    b = ConformalRegressor("abs", 0.1, torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1  # == raised a RuntimeError
    assert a != ConformalRegressor("abs", 0.1, torch.tensor([1.0, 2.5]))
    assert a != ConformalRegressor("cqr", 0.1, torch.tensor([1.0, 2.0]))
    assert a.threshold.dtype == torch.float64  # as documented; a float32 tensor stayed float32
    g = torch.Generator().manual_seed(0)
    y = torch.randn(200, 2, generator=g)
    preds = GaussianPredictions(torch.zeros(1, 200, 2), torch.ones(1, 200, 2), y)
    fitted = conformal(preds, alpha=0.2, score="cqr")
    again = pickle.loads(pickle.dumps(fitted))
    assert again == fitted and torch.equal(again.intervals(preds)[0], fitted.intervals(preds)[0])
