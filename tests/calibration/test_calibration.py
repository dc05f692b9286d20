"""Temperature scaling and split conformal prediction, on synthetic predictions whose truth is
known (labels drawn from the probabilities, Gaussian targets drawn from their Gaussians)."""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pyrouq import (
    GaussianPredictions,
    Predictions,
    TemperatureScaler,
    class_conditional_coverage,
    conformal,
    coverage,
    mean_set_size,
    temperature_scale,
)
from pyrouq.metrics import ece, nll


def _classifier_data(n, c=5, s=1, sharpen=1.0, seed=0):
    """Predictions of S draws whose tempered mean is calibrated (labels drawn from it)."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(n, c, generator=g)
    labels = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
    noise = 0.3 * torch.randn(s, n, c, generator=g) if s > 1 else torch.zeros(1, n, c)
    probs = torch.softmax((logits + noise) * sharpen, -1)
    return Predictions(probs, labels)


def test_temperature_recovers_the_overconfidence_factor():
    preds = _classifier_data(20000, sharpen=2.0)  # logits doubled: T = 2 undoes it
    scaler = temperature_scale(preds)
    assert scaler.temperature == pytest.approx(2.0, rel=0.05)
    scaled = scaler(preds)
    assert torch.equal(scaled.predicted, preds.predicted)  # accuracy unchanged
    before, after = ece(preds.mean_probs, preds.targets), ece(scaled.mean_probs, preds.targets)
    assert after < 0.5 * before and after < 0.015
    assert nll(scaled.mean_probs, preds.targets) < nll(preds.mean_probs, preds.targets)


def test_tempering_keeps_one_draws_argmax_and_may_move_a_mixtures():
    """As TemperatureScaler's docstring says: one draw keeps every argmax at any T, up to
    rounding (a near-tie tempering rounds to one value takes the lower index); of S draws,
    each tempered, the mixture's argmax can change (a confident draw outweighed at T = 0.1)."""
    one = Predictions(torch.tensor([[[0.45, 0.55], [0.99, 0.01]]]))
    for t in (0.1, 0.5, 3.0, 20.0):
        assert TemperatureScaler(t)(one).predicted.tolist() == [1, 0]
    low = torch.tensor(0.48)  # class 1 one float32 ulp above class 0: merged at T = 20
    high = torch.nextafter(low, torch.tensor(1.0))
    tie = Predictions(torch.stack([low, high, 1 - low - high])[None, None])
    assert [TemperatureScaler(t)(tie).predicted.item() for t in (0.5, 20.0)] == [1, 0]
    assert len(set(TemperatureScaler(20.0)(tie).probs[0, 0, :2].tolist())) == 1
    three = Predictions(torch.tensor([[[0.45, 0.55]], [[0.45, 0.55]], [[0.99, 0.01]]]))
    assert three.mean_probs[0, 0].item() == pytest.approx(0.63)  # class 0
    flips = [TemperatureScaler(t)(three).predicted.item() for t in (0.1, 0.5, 1.0, 3.0)]
    assert flips == [1, 0, 0, 0]
    assert TemperatureScaler(0.1)(three).mean_probs[0, 0].item() == pytest.approx(0.4123, abs=1e-4)


def test_temperature_at_a_bound_of_the_search_warns():
    confident = torch.softmax(torch.tensor([[4.0, 0.0]]).repeat(8, 1), -1)[None]
    shuffled = Predictions(confident, torch.tensor([0, 1] * 4))  # labels it cannot tell apart
    with pytest.warns(
        UserWarning, match=r"lowest at T = 20, the bound .*barely tell the labels"
    ) as w:
        assert temperature_scale(shuffled).temperature == pytest.approx(20.0, rel=1e-3)
    assert {r.filename for r in w if "lowest at" in str(r.message)} == {__file__}  # here
    timid = torch.softmax(torch.tensor([[0.01, 0.0]]).repeat(8, 1), -1)[None]
    with pytest.warns(UserWarning, match=r"lowest at T = 0.05, .*far less confident"):
        temperature_scale(Predictions(timid, torch.zeros(8, dtype=torch.long)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        temperature_scale(_classifier_data(500, sharpen=1.5))  # an inner optimum: silent


def test_temperature_tempers_each_draw_and_keeps_the_mixture():
    preds = _classifier_data(500, s=4, sharpen=1.5, seed=1)
    scaler = temperature_scale(preds)
    scaled = scaler(preds)
    expected = torch.softmax(preds.probs.double().log() / scaler.temperature, -1)
    torch.testing.assert_close(scaled.probs.double(), expected, rtol=1e-6, atol=1e-7)
    assert scaled.num_samples == 4 and torch.equal(scaled.targets, preds.targets)
    # the fitted T minimises the mixture NLL: nudging it either way does not help
    from pyrouq._tempered_nll import tempered_nll as _tempered_nll

    logp = preds.probs.double().log()
    best = _tempered_nll(logp, preds.targets, scaler.temperature)
    for factor in (0.98, 1.02):
        assert best <= _tempered_nll(logp, preds.targets, scaler.temperature * factor)


@pytest.mark.parametrize("score", ["lac", "aps", "raps"])
def test_conformal_sets_cover_at_the_stated_rate(score):
    coverages, sizes = [], []
    data = _classifier_data(20000, c=10, s=3, sharpen=1.3, seed=2)
    for split in range(40):
        order = torch.randperm(20000, generator=torch.Generator().manual_seed(split))
        cal, test = order[:500], order[500:1500]
        cal_preds = Predictions(data.probs[:, cal], data.targets[cal])
        test_preds = Predictions(data.probs[:, test], data.targets[test])
        predictor = conformal(cal_preds, alpha=0.1, score=score, seed=split)
        sets = predictor.predict_sets(test_preds)
        coverages.append(coverage(sets, test_preds.targets))
        sizes.append(mean_set_size(sets))
        nonempty = sets.any(1)
        top = test_preds.predicted
        assert sets[nonempty].gather(1, top[nonempty, None]).all()  # the predicted class
    mean = sum(coverages) / len(coverages)
    # exchangeable: E[coverage] is in [1 - alpha, 1 - alpha + 1/(n + 1)]; 40 splits of 1000
    assert 0.89 <= mean <= 0.915, (score, mean)
    assert 1.0 < sum(sizes) / len(sizes) < 10.0


def test_thresholds_and_sets_by_hand():
    pbar = torch.tensor([[0.5, 0.3, 0.2]] * 4)
    preds = Predictions(pbar[None], torch.tensor([0, 1, 0, 2]))
    lac = conformal(preds, alpha=0.2, score="lac")
    # scores 1 - p_y: 0.5, 0.7, 0.5, 0.8; k = ceil(5 * 0.8) = 4: the largest, 0.8
    assert lac.threshold == pytest.approx(0.8)
    assert lac.predict_sets(Predictions(pbar[:1][None])).tolist() == [[True, True, True]]
    aps = conformal(preds, alpha=0.2, score="aps", seed=3)
    u = torch.rand(4, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)[:, 0]
    before = torch.tensor([0.0, 0.5, 0.0, 0.8], dtype=torch.float64)
    p_true = torch.tensor([0.5, 0.3, 0.5, 0.2], dtype=torch.float64)
    assert aps.threshold == pytest.approx((before + u * p_true).max().item())
    raps = conformal(preds, alpha=0.2, score="raps", seed=3, lam=0.5, k_reg=1)
    penalty = 0.5 * torch.tensor([0.0, 1.0, 0.0, 2.0], dtype=torch.float64)
    assert raps.threshold == pytest.approx((before + u * p_true + penalty).max().item())


def test_the_threshold_rank_is_exact_where_the_float_product_rounds_up():
    # (9 + 1) * (1 - 0.7) is 3.0000000000000004 in floating point: k = 3, not 4
    probs = torch.linspace(0.1, 0.9, 9, dtype=torch.float64)
    preds = Predictions(torch.stack([probs, 1 - probs], -1)[None], torch.zeros(9).long())
    scores = (1 - probs).sort().values  # LAC: 1 - p_y
    assert conformal(preds, alpha=0.7, score="lac").threshold == pytest.approx(scores[2].item())
    # a genuine fraction above 3 is not rounded away: (9 + 1) * 0.30000000001 -> k = 4
    assert conformal(preds, alpha=0.69999999999, score="lac").threshold == pytest.approx(
        scores[3].item()
    )
    # alpha = 1/3 (a little below it in binary), n = 5: (5 + 1) * (2 / 3) = 4 exactly
    five = Predictions(torch.stack([probs[:5], 1 - probs[:5]], -1)[None], torch.zeros(5).long())
    five_scores = (1 - probs[:5]).sort().values
    assert conformal(five, alpha=1 / 3, score="lac").threshold == pytest.approx(
        five_scores[3].item()
    )
    # the fewest points an alpha needs, named as the rank decides it: 1/49 takes 48
    many = Predictions(torch.full((1, 47, 2), 0.5, dtype=torch.float64), torch.zeros(47).long())
    with pytest.raises(ValueError, match=r"alpha=0.0204082 needs at least 48 calibration points"):
        conformal(many, alpha=1 / 49)
    # an alpha just below 1: k = 1, the smallest score (not k = 0, which read the largest)
    assert conformal(preds, alpha=1 - 1e-11, score="lac").threshold == pytest.approx(
        scores[0].item()
    )


def test_set_metrics_by_hand():
    sets = torch.tensor([[True, False, False], [True, True, False], [False, False, False]])
    targets = torch.tensor([0, 2, 1])
    assert coverage(sets, targets) == pytest.approx(1 / 3)
    assert mean_set_size(sets) == pytest.approx(1.0)
    per_class = class_conditional_coverage(sets, targets)
    assert per_class[0] == 1.0 and per_class[1] == 0.0 and per_class[2] == 0.0
    assert math.isnan(class_conditional_coverage(sets, torch.tensor([0, 0, 1]))[2])


@pytest.mark.parametrize("score", ["abs", "cqr"])
def test_conformal_intervals_cover_at_the_stated_rate(score):
    g = torch.Generator().manual_seed(0)
    n = 4000
    x = torch.rand(n, generator=g) * 8 - 4
    noise = 0.1 + 0.5 * x.abs()
    y = torch.sin(x) + noise * torch.randn(n, generator=g)
    # a miscalibrated model: right mean, noise under-estimated by 30 %, 3 draws
    loc = torch.sin(x)[None, :, None] + 0.05 * torch.randn(3, n, 1, generator=g)
    scale = (0.7 * noise)[None, :, None].expand(3, n, 1)
    preds = GaussianPredictions(loc, scale.contiguous())
    coverages = []
    for split in range(20):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(split))
        cal, test = order[:1000], order[1000:]
        cal_preds = GaussianPredictions(preds.loc[:, cal], preds.scale[:, cal], y[cal])
        predictor = conformal(cal_preds, alpha=0.1, score=score)
        lo, hi = predictor.intervals(GaussianPredictions(preds.loc[:, test], preds.scale[:, test]))
        assert lo.shape == (3000, 1) and bool((lo < hi).all())
        coverages.append(coverage((lo, hi), y[test]))
    mean = sum(coverages) / len(coverages)
    raw = preds.evaluate(y)["coverage_90"]  # the uncorrected model under-covers
    assert raw < 0.85 and 0.88 <= mean <= 0.92, (score, raw, mean)


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: conformal(_classifier_data(50), alpha=1.5), ValueError,
         r"Expected alpha in \(0, 1\), the allowed miscoverage"),
        (lambda: conformal(_classifier_data(50), alpha=0.01), ValueError,
         r"alpha=0.01 needs at least 99 calibration points for a finite threshold, got 50"),
        (lambda: conformal(_classifier_data(50), score="abs"), ValueError,
         r"Unknown score 'abs' for classification: expected 'lac', 'aps' or 'raps'"),
        (lambda: conformal(GaussianPredictions(torch.zeros(1, 50, 1), torch.ones(1, 50, 1),
                                               torch.zeros(50)), score="lac"), ValueError,
         r"Unknown score 'lac' for regression: expected 'abs'"),
        (lambda: conformal(_classifier_data(50), score="raps", lam=-1.0), ValueError,
         r"Expected lam >= 0, the RAPS penalty per rank, got -1.0"),
        (lambda: conformal(_classifier_data(50), score="raps", lam="0"), ValueError,
         r"got '0' \(a string: pass a float, lam=0\.0\): pass a finite number"),  # (0 is taken)
        (lambda: conformal(Predictions(torch.full((1, 50, 5), 0.2))), ValueError,
         r"No val_targets: pass the \(N,\) labels of the held-out split"),
        # the labels' refusals name the argument (they said "targets", "targets.long()")
        (lambda: temperature_scale(_classifier_data(50), torch.zeros(50)), TypeError,
         r"^Expected integer val_targets \(class indices\), got dtype torch\.float32; convert "
         r"them with val_targets\.long\(\)"),
        (lambda: conformal(_classifier_data(50), torch.zeros(4).long()), ValueError,
         r"^Expected val_targets of shape \(N,\) = \(50,\), one label per input of val_preds, "
         r"got shape \(4,\)"),  # (it said "per input of probs", an argument it has not)
        (lambda: temperature_scale(_classifier_data(50), torch.zeros(50, 1).long()), ValueError,
         r"one label per input of val_preds, got shape \(50, 1\); labels in a column"),
        (lambda: conformal(_classifier_data(50), [0] * 50), TypeError,
         r"^Expected val_targets to be a torch\.Tensor of class labels, got list"),
        (lambda: temperature_scale(torch.full((1, 5, 2), 0.5)), TypeError,
         r"Expected val_preds to be Predictions \(class probabilities"),
        (lambda: TemperatureScaler(0.0), ValueError,
         r"Expected a temperature > 0 \(finite\), got 0.0: T > 1 softens"),
        (lambda: TemperatureScaler(-1.0), ValueError, r"Expected a temperature > 0"),
        (lambda: TemperatureScaler("1.5"), ValueError,  # (it said "got '1.5': T > 1 ...")
         r"got '1.5' \(a string: pass a float, temperature=1.5\): T > 1 softens"),
        (lambda: TemperatureScaler("-1.5"), ValueError,
         r"got '-1.5' \(a string: pass a float > 0\):"),
        (lambda: coverage(torch.ones(3, 2), torch.zeros(3)), TypeError,
         r"Expected prediction sets as an \(N, C\) boolean tensor"),
        (lambda: coverage(torch.ones(3, 2, dtype=torch.bool), torch.zeros(4).long()), ValueError,
         r"coverage\(\): expected labels of shape \(3,\), one per prediction set, got \(4,\)"),
        (lambda: coverage(torch.ones(3, 2, dtype=torch.bool), torch.tensor([0, 2, 1])),
         ValueError, r"expected integer class labels in \[0, 1\] for sets over 2 classes, got "
         r"dtype torch.int64 and values in \[0, 2\]"),
        (lambda: coverage(torch.ones(3, 2, dtype=torch.bool), torch.zeros(3)), ValueError,
         r"expected integer class labels .* got dtype torch.float32"),
        (lambda: class_conditional_coverage(torch.ones(3, 2, dtype=torch.bool),
                                            torch.tensor([0, -1, 1])), ValueError,
         r"class_conditional_coverage\(\): expected integer class labels in \[0, 1\]"),
        (lambda: class_conditional_coverage(torch.ones(3, 2, dtype=torch.bool),
                                            torch.tensor([True, False, True])), ValueError,
         r"expected integer class labels in \[0, 1\] for sets over 2 classes, got dtype "
         r"torch.bool"),
        (lambda: coverage((torch.zeros(5, 2), torch.ones(5, 2)), torch.zeros(2, 5)), ValueError,
         r"coverage\(\): expected targets of shape \(5, 2\), as the intervals, got \(2, 5\)\. "
         r"Pass targets\.T: they hold an input per column, the intervals one per row \(5 "
         r"inputs, 2 outputs\)\.$"),  # (it said "Pass the targets of the inputs ...")
        (lambda: coverage((torch.zeros(5, 2), torch.ones(5, 2)), torch.zeros(5)), ValueError,
         r"expected targets of shape \(5, 2\), as the intervals, got \(5,\)"),
        (lambda: coverage((torch.zeros(5), torch.ones(5)), torch.zeros(5, 1)), ValueError,
         r"expected targets of shape \(5,\), as the intervals, got \(5, 1\)\. Pass "
         r"targets\[:, 0\]: the intervals are of one output, one value per input\.$"),
        (lambda: coverage((torch.zeros(5), torch.ones(5)), torch.zeros(4)), ValueError,
         r"got \(4,\)\. Pass the targets of the inputs the intervals were made for, one per "
         r"interval \(and per output\)\.$"),
        (lambda: coverage((torch.zeros(3, 1), torch.tensor([1.0, 2.0, 3.0])), torch.zeros(3, 1)),
         ValueError, r"coverage\(\): expected lo and hi of one shape, got \(3, 1\) and \(3,\)"),
        (lambda: coverage([torch.zeros(3), torch.ones(3)], torch.zeros(3)), TypeError,
         r"got list; for intervals pass the tuple \(lo, hi\) that intervals\(\) returns"),
        (lambda: coverage((torch.zeros(3),), torch.zeros(3)), TypeError,
         r"expected intervals as a tuple \(lo, hi\) of two tensors .*got a tuple of 1"),
        (lambda: coverage((torch.zeros(3), torch.ones(3)), torch.tensor([0.5, math.nan, 0.5])),
         ValueError, r"coverage\(\): the targets hold 1 NaN values; drop those rows"),
        (lambda: coverage((torch.tensor([0.0, math.nan]), torch.ones(2)), torch.zeros(2)),
         ValueError, r"coverage\(\): lo holds 1 NaN values; an interval needs both bounds"),
        (lambda: coverage(torch.ones(3, dtype=torch.bool), torch.zeros(3).long()), ValueError,
         r"Expected prediction sets as an \(N, C\) boolean tensor, one row per input .*got "
         r"shape \(3,\)"),
        (lambda: conformal(_classifier_data(50), alpha=torch.tensor(0.2)), ValueError,
         r"got tensor\(0.2000\) \(a tensor: pass a Python number, float\(t\)\)"),
        (lambda: __import__("pyrouq").ConformalClassifier("LAC", 0.1, 0.5, 0.0, 0, 0),
         ValueError, r"ConformalClassifier: unknown score 'LAC' \(did you mean 'lac'\? the names "
         r"are lower case\), expected one of 'lac', 'aps', 'raps'\. conformal\(\) builds"),
        (lambda: __import__("pyrouq").ConformalRegressor("ABS", 0.1, torch.ones(1)), ValueError,
         r"ConformalRegressor: unknown score 'ABS' \(did you mean 'abs'\? the names are lower "
         r"case\), expected one of 'abs', 'cqr'\. conformal"),
        (lambda: conformal(_classifier_data(50), alpha=5e-324), ValueError,
         r"alpha=4.94066e-324 needs at least 2.02e\+323 calibration points for a finite "
         r"threshold, got 50. Hold out more data or raise alpha"),
        (lambda: __import__("pyrouq").ConformalRegressor("abs", 0.1, 1.5), ValueError,
         r"ConformalRegressor: expected threshold as a floating \(D,\) tensor, one per output "
         r"\(conformal\(\) makes it\), got float; for one output pass torch.tensor\(\[t\]\)"),
        (lambda: __import__("pyrouq").ConformalRegressor("abs", 0.1, torch.tensor(1.5)),
         ValueError, r"expected threshold as a floating \(D,\) tensor.*got shape \(\), dtype "
         r"torch.float32"),
        (lambda: __import__("pyrouq").ConformalRegressor("cqr", 1.5, torch.ones(1)), ValueError,
         r"ConformalRegressor: expected alpha in \(0, 1\), the allowed miscoverage, got 1.5"),
        (lambda: __import__("pyrouq").ConformalClassifier("lac", "0.1", 0.5, 0.0, 0, 0),
         ValueError, r"ConformalClassifier: expected alpha in \(0, 1\), the allowed "
         r"miscoverage, got '0.1' \(a string: pass a float, alpha=0.1\)\. conformal\(\)"),
        (lambda: __import__("pyrouq").ConformalClassifier("lac", 0.1, math.nan, 0.0, 0, 0),
         ValueError, r"ConformalClassifier: expected threshold to be a real number \(the "
         r"largest score a set admits; inf admits every class\), got nan"),
        (lambda: __import__("pyrouq").ConformalClassifier("lac", 0.1, "0.5", 0.0, 0, 0),
         ValueError, r"expected threshold to be a real number .*got '0\.5' \(a string: pass a "
         r"float, threshold=0\.5\)\.$"),  # (its neighbours alpha and lam said so; it did not)
        (lambda: __import__("pyrouq").ConformalClassifier("lac", 0.1, "inf", 0.0, 0, 0),
         ValueError, r"got 'inf' \(a string: pass a float, threshold=float\('inf'\)\)\.$"),
        # (inf is a threshold allowed, admitting every class: it was told nothing)
        (lambda: __import__("pyrouq").ConformalClassifier("raps", 0.1, 0.5, 0.1, -1, 0),
         ValueError, r"ConformalClassifier: expected k_reg, the ranks free of penalty, an "
         r"integer >= 0, got -1"),
    ],
)  # fmt: skip
def test_calibration_refuses_bad_input(call, error, pattern):
    with pytest.raises(error) as info:
        call()
    assert re.search(pattern, str(info.value)), str(info.value)


def test_coverage_of_transposed_targets_is_what_targets_t_gives():
    # the fix the refusal of (D, N) targets names: targets.T, 2 of its 3 inputs inside
    lo, hi = torch.zeros(3, 2), torch.ones(3, 2)
    turned = torch.tensor([[0.5, 2.0, 0.1], [0.5, 0.5, 0.9]])
    assert coverage((lo, hi), turned.T) == pytest.approx(5 / 6)


def test_conformal_takes_numpy_alphas_and_the_largest_seed():
    preds = _classifier_data(200)
    for alpha in (np.float32(0.1), np.float64(0.1)):
        assert conformal(preds, alpha=alpha).alpha == pytest.approx(0.1)
    last = conformal(preds, alpha=0.1, score="aps", seed=2**32 - 1)
    assert torch.equal(last.predict_sets(preds), last.predict_sets(preds, seed=0))  # wraps


def test_numpy_numbers_are_taken_as_the_python_numbers_they_equal():
    preds = _classifier_data(200)
    kw = dict(alpha=0.2, score="raps", seed=3)
    ours = conformal(preds, lam=np.float32(0.25), k_reg=np.int64(2), **kw)
    plain = conformal(preds, lam=0.25, k_reg=2, **kw)
    assert (ours.threshold, ours.k_reg) == (plain.threshold, 2)
    assert type(ours.k_reg) is int
    scaler = TemperatureScaler(np.float32(1.5))
    assert scaler.temperature == 1.5 and type(scaler.temperature) is float
    assert ece(preds.probs, preds.targets, num_bins=np.int64(10)) == ece(
        preds.probs, preds.targets, num_bins=10
    )


def test_a_probability_that_underflowed_to_zero_does_not_swing_the_temperature():
    """One confidently wrong input among 1000 calibrated ones: its float32 probability of the
    label is 4e-45 at a logit gap of 100 and underflows to 0 at 110. The fitted T moves little
    between the two (a zero taken as 1e-300 gave T = 1.67 at 110 against 1.08 at 100, and an
    ECE of 16 %), nor with the dtype."""
    g = torch.Generator().manual_seed(0)
    base = 2.0 * torch.randn(1000, 5, generator=g)
    y = torch.multinomial(torch.softmax(base, -1), 1, generator=g)[:, 0]

    def fitted(gap):
        logits = base.clone()
        logits[0] = 0.0
        logits[0, y[0]] = -gap
        probs = torch.softmax(logits, -1)
        return temperature_scale(Predictions(probs[None], y)).temperature, float(probs[0, y[0]])

    (t100, p100), (t110, p110) = fitted(100.0), fitted(110.0)
    assert p100 > 0 and p110 == 0
    assert t110 == pytest.approx(t100, abs=0.01) and t110 < 1.15
    logits = base.clone()
    logits[0] = 0.0
    logits[0, y[0]] = -110.0
    double = temperature_scale(Predictions(torch.softmax(logits.double(), -1)[None], y))
    assert double.temperature == pytest.approx(t110, abs=1e-6)  # float64 keeps 1e-48: the same T


@pytest.mark.parametrize("score", ["lac", "aps", "raps"])
def test_sets_keep_the_predicted_class_at_a_float32_near_tie(score):
    """Classes 0 and 1 tie in the float64 mean (predicted: 0), but the float32 mean puts 1 a
    hair above 0; calibrated on label 1, the sets held class 1 alone, not the predicted 0."""
    probs = torch.tensor(
        [
            [0.4926582872867584, 0.49265867471694946, 0.014683067798614502],
            [0.4105505049228668, 0.4105500280857086, 0.17889949679374695],
            [0.45217904448509216, 0.4521791338920593, 0.09564179182052612],
        ]
    )[:, None]  # (S=3, N=1, C=3), float32
    test = Predictions(probs)
    assert test.mean_probs[0, 1] > test.mean_probs[0, 0] and test.predicted.item() == 0
    cal = Predictions(probs.expand(3, 20, 3).contiguous(), torch.ones(20, dtype=torch.long))
    predictor = conformal(cal, alpha=0.1, score=score, lam=0.0)
    sets = predictor.predict_sets(test, seed=1)  # APS: u = 0.76, a set of both classes
    assert sets.tolist() == [[True, True, False]], sets.tolist()  # was [[False, True, False]]
    if score == "lac":
        assert predictor.threshold == pytest.approx(1 - float(probs.double().mean(0)[0, 1]))


def test_hand_made_predictors_are_checked_and_normalised():
    from pyrouq import ConformalClassifier, ConformalRegressor

    reg = ConformalRegressor("abs", np.float32(0.25), [1.5, 2.0])
    assert reg.alpha == 0.25 and type(reg.alpha) is float
    assert reg.threshold.dtype == torch.float64 and reg.threshold.tolist() == [1.5, 2.0]
    preds = GaussianPredictions(torch.zeros(1, 2, 2), torch.ones(1, 2, 2))
    lo, hi = reg.intervals(preds)
    assert hi[0].tolist() == [1.5, 2.0] and lo[1].tolist() == [-1.5, -2.0]
    cls = ConformalClassifier("raps", 0.1, np.float64(0.5), np.float32(0.25), np.int64(1), 0, 3)
    assert (type(cls.threshold), type(cls.lam), type(cls.k_reg)) == (float, float, int)
    assert repr(cls) == (
        "ConformalClassifier(score='raps', alpha=0.1, threshold=0.500000, lam=0.25, k_reg=1, "
        "seed=0)"
    )  # what the sets depend on: lam and k_reg (RAPS), the seed of the draws (APS, RAPS)
    lac = ConformalClassifier("lac", 0.1, 0.5, 0.0, 0, 0)
    assert repr(lac) == "ConformalClassifier(score='lac', alpha=0.1, threshold=0.500000)"


def test_tempered_nll_in_one_buffer_is_torchs_formula_to_the_bit():
    """temperature_scale() reads the mixture NLL at ~110 temperatures in one (S, N, C) buffer
    (three fresh float64 copies per temperature before: 6.3x float32 probabilities at the
    peak, 4.1x now): the same values to the bit as torch's log_softmax and logsumexp, one T
    after another, and float64 probabilities given to the fit or the scaler are left as they
    came (log p is taken in place, in a copy of its own)."""
    import math

    from pyrouq._tempered_nll import TemperedNLL, log_probs

    torch.manual_seed(0)
    probs = torch.softmax(3 * torch.randn(7, 33, 9, dtype=torch.float64), -1)
    probs[0, 0] = torch.eye(9, dtype=torch.float64)[2]  # zeros: clamped at 1e-12
    y = torch.randint(0, 9, (33,))
    kept = probs.clone()
    logp = log_probs(probs)
    assert torch.equal(logp, probs.clamp_min(1e-12).log())
    nll = TemperedNLL(logp, y)
    for t in (0.05, 0.7, 1.0, 3.3, 20.0, 0.7, 1e-308):  # (1e-308: -inf maxes, as torch masks)
        mixture = torch.logsumexp(torch.log_softmax(logp / t, -1), 0) - math.log(7)
        assert nll(t) == float(-mixture.gather(1, y[:, None]).mean())
    preds = Predictions(probs, y)
    with pytest.warns(UserWarning, match="the bound of the search"):  # (random labels)
        scaler = temperature_scale(preds)
    scaled = scaler(preds).probs
    assert torch.equal(scaled, torch.softmax(logp / scaler.temperature, -1))
    assert torch.equal(probs, kept)


@pytest.mark.parametrize(("chunk", "step"), [(3 * 33 * 9 + 5, 3), (33 * 9 - 1, 1)])
def test_tempered_nll_in_chunks_of_draws_is_torchs_formula_to_the_bit(monkeypatch, chunk, step):
    """The draws are tempered a few at a time (as many as make _CHUNK values; one at a time
    where a draw holds more): with S = 7 draws of N * C = 297 values, in chunks of 3, 3 and 1
    draws, or one by one, every T's NLL is still torch's formula on all draws at once."""
    import math

    from pyrouq import _tempered_nll
    from pyrouq._tempered_nll import TemperedNLL, log_probs

    monkeypatch.setattr(_tempered_nll, "_CHUNK", chunk)
    assert max(1, chunk // (33 * 9)) == step
    torch.manual_seed(1)
    logp = log_probs(torch.softmax(3 * torch.randn(7, 33, 9, dtype=torch.float64), -1))
    y = torch.randint(0, 9, (33,))
    nll = TemperedNLL(logp, y)
    for t in (0.05, 0.7, 3.3, 1e-308, 20.0):
        mixture = torch.logsumexp(torch.log_softmax(logp / t, -1), 0) - math.log(7)
        assert nll(t) == float(-mixture.gather(1, y[:, None]).mean()), t


def test_the_documented_save_and_load_gives_equal_recalibrators_without_pickle(tmp_path):
    """Each recalibrator's docstring says how to save it (its fields, read back with
    weights_only=True): those very expressions round-trip a fitted one to an equal predictor
    with equal outputs, and the pickled object itself is what weights_only=True refuses."""
    import dataclasses
    import pickle

    import pyrouq.calibration as calibration
    from pyrouq import ConformalClassifier, ConformalRegressor

    classes = _classifier_data(60, c=4, s=3, seed=1)
    g = torch.Generator().manual_seed(2)
    loc, y = torch.randn(2, 40, 2, generator=g), torch.randn(40, 2, generator=g)
    gaussian = GaussianPredictions(loc, 0.5 + torch.rand(2, 40, 2, generator=g), y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a T at a bound of the search: not the point here)
        fitted = {
            "scaler": temperature_scale(classes),
            "sets": conformal(classes, alpha=0.2, score="raps", seed=7),
            "reg": conformal(gaussian, alpha=0.2, score="cqr"),
        }
    outputs = {
        "scaler": lambda r: r(classes).probs,
        "sets": lambda r: r.predict_sets(classes),
        "reg": lambda r: torch.stack(r.intervals(gaussian)),
    }
    assert "load such a file only if you trust where it came from" in " ".join(
        calibration.__doc__.split()
    )
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    readme = " ".join(readme.split())  # the README gives TemperatureScaler's, run below
    assert "`torch.save(dataclasses.asdict(scaler), path)`" in readme
    assert "`TemperatureScaler(**torch.load(path, weights_only=True))` (no pickled code" in readme
    for cls in (TemperatureScaler, ConformalClassifier, ConformalRegressor):
        doc = " ".join(cls.__doc__.split())
        save = re.search(r"``(torch\.save\(dataclasses\.asdict\((\w+)\), path\))``", doc)
        load = re.search(
            rf"``({cls.__name__}\(\*\*torch\.load\(path, weights_only=True\)\))``", doc
        )
        assert save and load, cls.__name__
        name, path = save[2], tmp_path / f"{cls.__name__}.pt"
        scope = {"torch": torch, "dataclasses": dataclasses, "path": path, cls.__name__: cls}
        exec(save[1], {**scope, name: fitted[name]})
        again = eval(load[1], scope)
        assert again == fitted[name] and repr(again) == repr(fitted[name])
        assert torch.equal(outputs[name](again), outputs[name](fitted[name]))
        torch.save(fitted[name], path)  # the object pickled: refused by weights_only=True
        with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
            torch.load(path, weights_only=True)
