"""Audit 11 of recalibration: temperature scaling and split conformal prediction against
independent references (scipy, numpy by hand), and the inputs they refuse."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import norm

from pyrouq import (
    GaussianPredictions,
    Predictions,
    class_conditional_coverage,
    conformal,
    coverage,
    temperature_scale,
)
from pyrouq._metric_inputs import WIDE_UNSIGNED
from pyrouq.metrics import nll


def _mixture_nll(logp: np.ndarray, y: np.ndarray, t: float) -> float:
    """The NLL of the mixture of the S tempered draws, written out in numpy."""
    z = logp / t
    z = z - z.max(-1, keepdims=True)
    logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
    mixture = np.log(np.exp(logq).mean(0))
    return float(-mixture[np.arange(len(y)), y].mean())


@pytest.mark.parametrize("draws", [1, 5])
def test_the_temperature_is_scipys_minimiser_and_lowers_the_validation_nll(draws):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(300, 4, generator=g) * 2
    y = torch.distributions.Categorical(logits=base / 2.5).sample()
    probs = torch.softmax(base[None] + 0.5 * torch.randn(draws, 300, 4, generator=g), -1)
    scaler = temperature_scale(Predictions(probs, y))
    logp = np.log(np.clip(probs.double().numpy(), 1e-12, None))
    best = minimize_scalar(
        lambda s: _mixture_nll(logp, y.numpy(), math.exp(s)),
        bounds=(math.log(0.05), math.log(20)),
        method="bounded",
        options={"xatol": 1e-10},
    )
    assert scaler.temperature == pytest.approx(math.exp(best.x), rel=1e-5)
    assert 1.5 < scaler.temperature < 4  # over-confident by construction: T ~ 2.5
    before, after = nll(Predictions(probs, y), y), nll(scaler(Predictions(probs, y)), y)
    assert after < before - 0.01


@pytest.mark.parametrize("n", [1, 2, 3, 9, 10, 24])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.25, 0.5, 0.9])
def test_the_threshold_is_the_ceil_rank_of_tied_scores_or_a_refusal(n, alpha):
    g = torch.Generator().manual_seed(n)
    rows = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4], [0.6, 0.2, 0.2]])
    probs = rows[torch.randint(0, 4, (n,), generator=g)]  # four rows: many scores tie
    y = torch.randint(0, 3, (n,), generator=g)
    k = math.ceil(round((n + 1) * (1 - alpha), 9))
    if k > n:
        with pytest.raises(
            ValueError,
            match=rf"needs at least \d+ calibration points for a "
            rf"finite threshold, got {n}\. Hold out more data or raise alpha",
        ):
            conformal(Predictions(probs[None], y), alpha=alpha)
        return
    predictor = conformal(Predictions(probs[None], y), alpha=alpha)
    p = probs.double().numpy()
    scores = np.sort(1 - p[np.arange(n), y.numpy()])
    assert predictor.threshold == scores[k - 1]
    sets = predictor.predict_sets(Predictions(probs[None]))
    assert torch.equal(sets, torch.from_numpy(1 - p <= scores[k - 1]))


@pytest.mark.parametrize("score", ["lac", "aps"])
def test_coverage_over_random_splits_is_k_over_n_plus_one(score):
    # n = 24, alpha = 0.1: k = ceil(22.5) = 23, so the coverage of continuous scores is
    # 23 / 25 = 0.92 exactly on average, within [1 - alpha, 1 - alpha + 1 / (n + 1)]
    g = torch.Generator().manual_seed(0)
    n, test, reps = 24, 100, 300
    logits = torch.randn(reps, n + test, 5, generator=g) * 2
    probs = torch.softmax(logits, -1)
    y = torch.distributions.Categorical(logits=0.7 * logits).sample()
    hits = []
    for r in range(reps):
        cal = Predictions(probs[r, None, :n], y[r, :n])
        predictor = conformal(cal, alpha=0.1, score=score, seed=r)
        sets = predictor.predict_sets(Predictions(probs[r, None, n:]), seed=r + 7919)
        hits.append(coverage(sets, y[r, n:]))
    mean, se = float(np.mean(hits)), float(np.std(hits)) / math.sqrt(reps)
    assert abs(mean - 23 / 25) < 4 * se
    assert 0.9 - 3 * se <= mean <= 0.9 + 1 / 25 + 3 * se


def test_aps_and_raps_thresholds_follow_their_definitions():
    g = torch.Generator().manual_seed(3)
    n, c = 15, 5
    probs = torch.softmax(torch.randn(1, n, c, generator=g) * 1.5, -1)
    y = torch.randint(0, c, (n,), generator=g)
    u = torch.rand(n, 1, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    p = probs[0].double().numpy()
    for score, lam, k_reg in [("aps", 0.0, 0), ("raps", 0.1, 1), ("raps", 0.3, 2)]:
        predictor = conformal(
            Predictions(probs, y), alpha=0.3, score=score, seed=4, lam=lam, k_reg=k_reg
        )
        by_hand = []
        for i in range(n):  # Romano et al. (2020); Angelopoulos et al. (2021), rank from 1
            order = list(np.argsort(-p[i], kind="stable"))
            rank = order.index(int(y[i])) + 1
            value = p[i][order[: rank - 1]].sum() + float(u[i, 0]) * p[i, int(y[i])]
            by_hand.append(value + (lam * max(0, rank - k_reg) if score == "raps" else 0.0))
        k = math.ceil((n + 1) * 0.7)
        assert predictor.threshold == pytest.approx(np.sort(by_hand)[k - 1], abs=1e-12)


def test_abs_and_cqr_intervals_against_scipys_mixture_quantiles():
    g = torch.Generator().manual_seed(5)
    s, n, d, alpha = 3, 11, 2, 0.2
    loc = torch.randn(s, n, d, generator=g, dtype=torch.float64)
    scale = torch.rand(s, n, d, generator=g, dtype=torch.float64) + 0.2
    y = torch.randn(n, d, generator=g, dtype=torch.float64)
    k = math.ceil((n + 1) * (1 - alpha))  # 10
    big_l, big_s, big_y = loc.numpy(), scale.numpy(), y.numpy()
    mean = big_l.mean(0)
    sd = np.sqrt((big_s**2).mean(0) + big_l.var(0))  # the law of total variance
    q_abs = np.sort(np.abs(big_y - mean) / sd, 0)[k - 1]

    def quantile(i, j, level):
        cdf = lambda t: norm.cdf((t - big_l[:, i, j]) / big_s[:, i, j]).mean() - level  # noqa: E731
        return brentq(cdf, -50, 50, xtol=1e-14)

    lo = np.array([[quantile(i, j, alpha / 2) for j in range(d)] for i in range(n)])
    hi = np.array([[quantile(i, j, 1 - alpha / 2) for j in range(d)] for i in range(n)])
    q_cqr = np.sort(np.maximum(lo - big_y, big_y - hi), 0)[k - 1]
    preds = GaussianPredictions(loc, scale, y)
    by_abs, by_cqr = conformal(preds, alpha=alpha), conformal(preds, alpha=alpha, score="cqr")
    np.testing.assert_allclose(by_abs.threshold.numpy(), q_abs, rtol=1e-12)
    np.testing.assert_allclose(by_cqr.threshold.numpy(), q_cqr, rtol=1e-9)
    a, b = by_cqr.intervals(GaussianPredictions(loc, scale))
    np.testing.assert_allclose(a.numpy(), lo - q_cqr, atol=1e-12)
    np.testing.assert_allclose(b.numpy(), hi + q_cqr, atol=1e-12)
    a, b = by_abs.intervals(GaussianPredictions(loc, scale))
    np.testing.assert_allclose(b.numpy(), mean + q_abs * sd, atol=1e-12)
    assert coverage((a, b), y) == pytest.approx(k / n, abs=0.5 / n)  # 10 of 11 per output


_FIT_ON_GRAPH = """
import warnings
import torch
import pyrouq
warnings.filterwarnings("error", message=".*requires_grad=True to a scalar")
logits = torch.randn(1, 20, 3, requires_grad=True)
preds = pyrouq.Predictions(torch.softmax(3 * logits, -1), torch.randint(0, 3, (20,)))
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="temperature_scale")
    print({call})
"""


@pytest.mark.parametrize(
    "call", ["pyrouq.temperature_scale(preds)", "pyrouq.conformal(preds, score='aps')"]
)
def test_fitting_on_predictions_that_require_grad_leaks_no_torch_warning(call):
    # Predictions.from_probs(softmax(net(x))[None]) outside no_grad: the fits turned tensors
    # of the graph into floats, and torch warned "Converting a tensor with requires_grad=True
    # to a scalar may lead to unexpected behavior" (once per process: a fresh one here)
    code = textwrap.dedent(_FIT_ON_GRAPH).format(call=call)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "requires_grad" not in done.stderr


def test_labels_of_the_wrong_dtype_or_range_are_refused_saying_what_to_do():
    sets = torch.ones(3, 2, dtype=torch.bool)
    complex_labels = torch.zeros(3, dtype=torch.complex64)
    for call in (coverage, class_conditional_coverage):  # torch's NotImplementedError came
        with pytest.raises(
            ValueError,
            match=r"got dtype torch.complex64; pass integer class "
            r"indices \(labels.long\(\) for whole-number floats\)\.",
        ):
            call(sets, complex_labels)
    with pytest.raises(
        ValueError,
        match=r"got dtype torch.int64 and values in \[0, 2\]; "
        "pass the labels of the inputs the sets were made for",
    ):
        coverage(sets, torch.tensor([0, 2, 1]))


@pytest.mark.parametrize("dtype", WIDE_UNSIGNED, ids=str)
def test_wide_unsigned_labels_are_refused_as_the_metrics_refuse_them(dtype):
    # uint16 / uint32 / uint64 labels (torch.as_tensor of a numpy uint16 array) met torch's
    # NotImplementedError '"min_all" not implemented for 'UInt16''; the metrics refuse them
    sets = torch.tensor([[True, False], [True, True], [False, True]])
    labels = torch.tensor([0, 1, 1], dtype=dtype)
    for call in (coverage, class_conditional_coverage):
        with pytest.raises(
            ValueError,
            match=rf"{call.__name__}\(\): expected int64 class labels, got dtype {dtype}, which "
            r"torch can neither take the minimum of .*convert them with labels.long\(\)\.",
        ):
            call(sets, labels)
    assert coverage(sets, labels.long()) == 1.0  # the advice followed
    assert class_conditional_coverage(sets, labels.long()).tolist() == [1.0, 1.0]


def test_complex_interval_targets_are_refused_not_cast_to_their_real_part():
    lo, hi = torch.zeros(3, 1), torch.ones(3, 1)
    targets = torch.full((3, 1), 0.5, dtype=torch.complex64) + 2j  # covered 1.0, with a warning
    with pytest.raises(
        ValueError,
        match=r"coverage\(\): expected real targets, got dtype "
        r"torch.complex64; pass their real values",
    ):
        coverage((lo, hi), targets)
    assert coverage((lo, hi), torch.tensor([0.5, 2.0, 1.0])) == pytest.approx(2 / 3)


def test_a_fitted_predictor_pickles_and_refuses_another_class_count():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 30, 4, generator=g), -1)
    y = torch.randint(0, 4, (30,), generator=g)
    predictor = conformal(Predictions(probs, y), alpha=0.2, score="raps", seed=3)
    again = pickle.loads(pickle.dumps(predictor))
    assert again == predictor
    test = Predictions(probs[:, :10])
    assert torch.equal(again.predict_sets(test), predictor.predict_sets(test))
    other = Predictions(torch.softmax(torch.randn(1, 5, 3, generator=g), -1))
    with pytest.raises(
        ValueError, match="The predictions have 3 classes, the calibration predictions had 4"
    ):
        predictor.predict_sets(other)
    for alpha in (0, 1, -0.1, math.nan):
        with pytest.raises(
            ValueError,
            match=r"Expected alpha in \(0, 1\), the allowed "
            rf"miscoverage \(0.1: 90 % coverage\), got {alpha!r}",
        ):
            conformal(Predictions(probs, y), alpha=alpha)
