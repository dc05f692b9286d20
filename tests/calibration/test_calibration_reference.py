"""Temperature scaling and split conformal prediction against independent references: scipy's
minimiser of the tempered mixture NLL, entropies by hand, exact-fraction conformal ranks, set
scores written out (ties included), closed-form Gaussian intervals, and the marginal coverage
over random splits within binomial error of its conformal bounds."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyro
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax, logsumexp
from scipy.stats import norm

import pyrouq
from pyrouq import (
    GaussianPredictions,
    Predictions,
    TemperatureScaler,
    conformal,
    coverage,
    mean_set_size,
    temperature_scale,
)


def _overconfident(seed, n=300, classes=5, draws=1):
    """Labels drawn from softmax(z); S draws of 2.5 z plus noise (over-confident members)."""
    rng = np.random.default_rng(seed)
    z = 2.0 * rng.normal(size=(n, classes))
    truth = np.exp(log_softmax(z, -1))
    y = np.array([rng.choice(classes, p=row) for row in truth])
    logits = 2.5 * z[None] + 0.7 * rng.normal(size=(draws, n, classes))
    return np.exp(log_softmax(logits, -1)), y


@pytest.mark.parametrize("draws", [1, 4])
def test_the_temperature_is_scipys_minimiser_of_the_tempered_mixture_nll(draws):
    probs, y = _overconfident(draws, draws=draws)
    logp = np.log(np.clip(probs, 1e-12, None))  # the documented clamp

    def nll(log_t):
        tempered = log_softmax(logp / math.exp(log_t), -1)
        mixture = logsumexp(tempered, 0) - math.log(draws)
        return -mixture[np.arange(len(y)), y].mean()

    bounds = (math.log(0.05), math.log(20.0))
    ref = math.exp(
        minimize_scalar(nll, bounds=bounds, method="bounded", options={"xatol": 1e-10}).x
    )
    assert 1.5 < ref < 4.0  # over-confident: T > 1, inside the search
    for dtype in (torch.float32, torch.float64):
        preds = Predictions(torch.tensor(probs, dtype=dtype), torch.tensor(y))
        assert temperature_scale(preds).temperature == pytest.approx(ref, rel=1e-4)


def _entropy(p):
    return -(p * np.log(np.clip(p, 1e-300, None))).sum(-1)


def test_tempered_predict_outputs_keep_a_decomposition_that_sums_by_hand():
    pyro.clear_param_store()
    x, y = toy_data(40)
    model = tiny_mlp()
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=3, progress=False, seed=0)
    preds = pyrouq.predict(model, x, guide, num_samples=6, progress=False, seed=0)
    probs = preds.probs.double().numpy()
    logp = np.log(np.clip(probs, 1e-12, None))
    for t in (0.5, 2.0, 20.0):
        tempered = TemperatureScaler(t)(preds)
        ref = np.exp(log_softmax(logp / t, -1))  # each draw tempered, then the mixture
        np.testing.assert_allclose(tempered.probs.numpy(), ref, atol=1e-6)
        d = tempered.uncertainty()
        total, aleatoric = _entropy(ref.mean(0)), _entropy(ref).mean(0)
        np.testing.assert_allclose(d.total.numpy(), total, atol=1e-5)
        np.testing.assert_allclose(d.aleatoric.numpy(), aleatoric, atol=1e-5)
        np.testing.assert_allclose(d.epistemic.numpy(), total - aleatoric, atol=1e-5)
        np.testing.assert_allclose((d.aleatoric + d.epistemic).numpy(), d.total.numpy(), atol=1e-6)
    # the epistemic part moves with T as documented: toward 0 as T grows
    mi = {t: TemperatureScaler(t)(preds).uncertainty().epistemic.sum().item() for t in (1, 20)}
    assert mi[20] < 0.05 * mi[1]
    # one draw: the argmax is kept
    one = Predictions(preds.probs[:1], preds.targets)
    assert torch.equal(TemperatureScaler(3.0)(one).predicted, one.predicted)


def _exact_rank(n, alpha):
    return max(1, math.ceil((n + 1) * (1 - Fraction(alpha))))


@pytest.mark.parametrize("alpha", ["0.1", "0.05", "0.2", "0.3", "0.7", "0.25", "0.5"])
def test_the_threshold_is_the_exact_conformal_rank_or_a_refusal_naming_the_least_n(alpha):
    least = next(m for m in range(1, 1000) if _exact_rank(m, alpha) <= m)
    for n in sorted({max(least - 1, 1), least, least + 1, 19, 40}):
        scores = torch.linspace(0.01, 0.99, n, dtype=torch.float64)[torch.randperm(max(n, 0))]
        cal = GaussianPredictions(torch.zeros(1, n, 1), torch.ones(1, n, 1), scores[:, None])
        if n < least:
            with pytest.raises(ValueError) as info:
                conformal(cal, alpha=float(alpha))
            assert str(info.value) == (
                f"alpha={float(alpha):g} needs at least {least} calibration points for a finite "
                f"threshold, got {n}. Hold out more data or raise alpha."
            )
            continue
        k = _exact_rank(n, alpha)
        reg = conformal(cal, alpha=float(alpha))  # abs scores |y - 0| / 1: the targets
        assert reg.threshold.item() == pytest.approx(float(scores.sort().values[k - 1]), abs=0)


def test_lac_aps_and_raps_scores_and_sets_by_hand_at_ties():
    pbar = torch.tensor(
        [[0.4, 0.4, 0.2], [0.2, 0.4, 0.4], [0.5, 0.25, 0.25], [0.34, 0.33, 0.33]],
        dtype=torch.float64,
    )
    preds = Predictions(pbar[None])
    predicted = preds.predicted
    assert predicted.tolist() == [0, 1, 0, 0]  # the first of tied top classes
    lac = conformal(Predictions(pbar[None], torch.tensor([0, 1, 0, 0])), alpha=0.5)
    assert lac.threshold == pytest.approx(0.6, abs=1e-15)  # rank ceil(5 * 0.5) = 3 of .6 .6 .5 .66
    sets = lac.predict_sets(preds)
    # LAC: 1 - p <= 0.6, i.e. p >= 0.4; tied classes are in or out together
    empty = [False, False, False]  # top probability 0.34 < 1 - 0.6
    assert sets.tolist() == [[True, True, False], [False, True, True], [True, False, False], empty]
    for score, lam, k_reg in (("aps", 0.0, 0), ("raps", 0.1, 1), ("raps", 0.05, 0)):
        predictor = pyrouq.calibration.ConformalClassifier(score, 0.1, 0.45, lam, k_reg, 0)
        got = predictor.scores(preds, seed=7)
        # recover each input's u from its top class's score, then write the others out
        order = [[0, 1, 2], [1, 2, 0], [0, 1, 2], [0, 1, 2]]  # stable: ties by index
        for i, ranking in enumerate(order):
            top = ranking[0]
            penalty_top = lam * max(0, 1 - k_reg) if score == "raps" else 0.0
            u = (got[i, top].item() - penalty_top) / pbar[i, top].item()
            assert 0 <= u <= 1
            above = 0.0
            for rank, c in enumerate(ranking, start=1):
                penalty = lam * max(0, rank - k_reg) if score == "raps" else 0.0
                want = above + u * pbar[i, c].item() + penalty
                assert got[i, c].item() == pytest.approx(want, abs=1e-12), (score, i, c)
                above += pbar[i, c].item()
        sets = predictor.predict_sets(preds, seed=7)
        assert torch.equal(sets, got <= 0.45)
        nonempty = sets.any(1)
        assert sets[nonempty].gather(1, predicted[nonempty, None]).all()  # holds the argmax
        # sets are prefixes of the ranking
        for i, ranking in enumerate(order):
            row = sets[i, ranking].tolist()
            assert row == sorted(row, reverse=True)


def test_seeds_repeat_and_the_default_test_seed_is_the_next():
    probs, y = _overconfident(3, n=60, classes=4)
    preds = Predictions(torch.tensor(probs), torch.tensor(y))
    a = conformal(preds, alpha=0.2, score="aps", seed=5)
    assert a.threshold == conformal(preds, alpha=0.2, score="aps", seed=5).threshold
    assert a.threshold != conformal(preds, alpha=0.2, score="aps", seed=6).threshold
    assert torch.equal(a.predict_sets(preds), a.predict_sets(preds, seed=6))
    assert torch.equal(a.scores(preds), a.scores(preds, seed=5))  # scores(): the predictor's
    lac = conformal(preds, alpha=0.2)  # LAC: no draw, every seed the same sets
    assert torch.equal(lac.predict_sets(preds, seed=1), lac.predict_sets(preds, seed=2))


def test_intervals_of_one_gaussian_draw_are_the_closed_form():
    g = torch.Generator().manual_seed(0)
    n, alpha = 49, 0.1
    mu = torch.randn(1, n, 2, generator=g, dtype=torch.float64)
    sd = 0.5 + torch.rand(1, n, 2, generator=g, dtype=torch.float64)
    y = mu[0] + sd[0] * 1.3 * torch.randn(n, 2, generator=g, dtype=torch.float64)
    cal = GaussianPredictions(mu, sd, y)
    k = _exact_rank(n, alpha)  # 45
    test = GaussianPredictions(mu[:, :5] + 1.0, 2.0 * sd[:, :5])
    z = norm.ppf(1 - alpha / 2)
    for score in ("abs", "cqr"):
        reg = conformal(cal, alpha=alpha, score=score)
        if score == "abs":
            s = ((y - mu[0]).abs() / sd[0]).numpy()
            half = lambda q: q * test.scale[0].double().numpy()  # noqa: E731
        else:
            s = torch.maximum(mu[0] - z * sd[0] - y, y - mu[0] - z * sd[0]).numpy()
            half = lambda q: z * test.scale[0].double().numpy() + q  # noqa: E731
        q = np.sort(s, 0)[k - 1]
        np.testing.assert_allclose(reg.threshold.numpy(), q, rtol=1e-7)
        lo, hi = reg.intervals(test)
        centre = test.loc[0].double().numpy()
        np.testing.assert_allclose(lo.numpy(), centre - half(q), rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(hi.numpy(), centre + half(q), rtol=1e-7, atol=1e-9)
        assert coverage(reg.intervals(cal), y) == pytest.approx(k / n)  # no ties: k of n in


def _split_coverage(score, n, m, alpha, splits, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(splits):
        if score in ("abs", "cqr"):
            x = torch.rand(n + m, 1, generator=g, dtype=torch.float64)
            y = x + (0.2 + x) * torch.randn(n + m, 1, generator=g, dtype=torch.float64)
            loc = torch.stack([x, 1.1 * x])
            sd = torch.full_like(loc, 0.5)
            cal = conformal(
                GaussianPredictions(loc[:, :n], sd[:, :n], y[:n]), alpha=alpha, score=score
            )
            out.append(coverage(cal.intervals(GaussianPredictions(loc[:, n:], sd[:, n:])), y[n:]))
            continue
        logits = 1.5 * torch.randn(n + m, 5, generator=g, dtype=torch.float64)
        y = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)[:, 0]
        probs = torch.softmax(2.0 * logits, -1)[None]  # over-confident
        cal = conformal(Predictions(probs[:, :n], y[:n]), alpha=alpha, score=score, seed=r, lam=0.1)
        sets = cal.predict_sets(Predictions(probs[:, n:]))
        assert 0 < mean_set_size(sets) <= 5
        out.append(coverage(sets, y[n:]))
    return np.array(out)


@pytest.mark.parametrize("score", ["lac", "aps", "raps", "abs", "cqr"])
def test_marginal_coverage_over_random_splits_is_within_the_conformal_bounds(score):
    n, m, alpha, splits = 19, 100, 0.1, 60
    cov = _split_coverage(score, n, m, alpha, splits, seed=11)
    # continuous scores: E[coverage] = k / (n + 1) = 0.9 exactly, within
    # [1 - alpha, 1 - alpha + 1 / (n + 1)]; the split's coverage is Beta(k, n + 1 - k)
    # (+ binomial noise of m points), so the mean of 60 splits has sd about 0.0085
    k = _exact_rank(n, alpha)
    sd = math.sqrt(k * (n + 1 - k) / ((n + 1) ** 2 * (n + 2)) + 0.09 / m) / math.sqrt(splits)
    assert 1 - alpha - 4 * sd <= cov.mean() <= 1 - alpha + 1 / (n + 1) + 4 * sd
    assert abs(cov.mean() - k / (n + 1)) < 4 * sd


def test_an_alpha_tensor_given_where_the_targets_go_is_named_alpha():
    # it was told "Expected integer targets (class indices), got dtype torch.float32; convert
    # them with targets.long()": labels made of the alpha
    probs, y = _overconfident(4, n=30, classes=3)
    preds = Predictions(torch.tensor(probs), torch.tensor(y))
    for alpha in (torch.tensor(0.1), torch.tensor(0.1, dtype=torch.float64)):
        with pytest.raises(TypeError) as info:
            conformal(preds, alpha)
        assert str(info.value) == (
            f"conformal(): got {alpha!r} as val_targets, the second argument; alpha is not the "
            "second: pass conformal(val_preds, alpha=0.1) (the targets default to those the "
            "predictions carry) or conformal(val_preds, val_targets, alpha, score)."
        )
    assert conformal(preds, alpha=0.1).alpha == 0.1  # the call it names works
    with pytest.raises(ValueError, match=r"expected labels of shape \(30,\)|shape"):
        conformal(preds, torch.tensor(2.0).long())  # an integer tensor: labels of a bad shape


def test_predictors_refuse_predictions_of_another_model_saying_what_to_do():
    probs, y = _overconfident(5, n=30, classes=3)
    lac = conformal(Predictions(torch.tensor(probs), torch.tensor(y)), alpha=0.2)
    four = Predictions(torch.full((1, 2, 4), 0.25))
    with pytest.raises(ValueError) as info:
        lac.predict_sets(four)
    assert str(info.value) == (
        "The predictions have 4 classes, the calibration predictions had 3: a conformal "
        "predictor applies to the model (and classes) it was calibrated on. Calibrate it on "
        "this model's predictions."
    )
    reg = conformal(
        GaussianPredictions(
            torch.zeros(1, 9, 1), torch.ones(1, 9, 1), torch.linspace(0, 1, 9)[:, None]
        ),
        alpha=0.2,
    )
    with pytest.raises(ValueError, match="The predictions have 2 outputs, the calibration "):
        reg.intervals(GaussianPredictions(torch.zeros(1, 3, 2), torch.ones(1, 3, 2)))
