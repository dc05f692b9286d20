"""The metrics, decompositions and plots against independent numpy / scipy references written
here (no sklearn), on edge cases: ties, confidences on bin edges, zeros and ones, one input,
one class, and gradients through probabilities that a softmax rounded to exactly 0."""

from __future__ import annotations

import bisect
import itertools
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats

from pyrouq import GaussianPredictions, metrics
from pyrouq.plotting import (
    plot_reliability,
    plot_risk_coverage,
    plot_uncertainty_distributions,
)
from pyrouq.uncertainty import decompose, entropy

# ---------------------------------------------------------------------------------------------
# References


def _ref_binned(conf, correct, bins):
    groups: dict[int, list[int]] = {}
    for i, b in enumerate(bins):
        groups.setdefault(int(b), []).append(i)
    n = len(conf)
    return sum(len(g) / n * abs(correct[g].mean() - conf[g].mean()) for g in groups.values())


def _ref_ece(p, y, k):
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    edges = [b / k for b in range(k + 1)]  # python's correctly rounded b / k
    bins = [min(bisect.bisect_right(edges, c) - 1, k - 1) for c in conf]
    return _ref_binned(conf, correct, bins)


def _ref_aece(p, y, k):
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    order = sorted(range(len(conf)), key=lambda i: conf[i])  # stable
    q, r = divmod(len(conf), k)
    sizes = [q + 1] * r + [q] * (k - r)
    bins = np.empty(len(conf), int)
    start = 0
    for b, size in enumerate(sizes):
        bins[order[start : start + size]] = b
        start += size
    return _ref_binned(conf, correct, bins)


def _ref_selective(p, y):
    """AURC, AUGRC and Risk@80Cov averaged over every order of the tied confidences."""
    conf, wrong = p.max(1), (p.argmax(1) != y).astype(float)
    n = len(conf)
    blocks = [list(np.flatnonzero(conf == c)) for c in sorted(set(conf), reverse=True)]
    results = []
    for orders in itertools.product(*(itertools.permutations(b) for b in blocks)):
        ranked = np.concatenate([list(o) for o in orders])
        errors = np.cumsum(wrong[ranked])
        k = np.arange(1, n + 1)
        top = math.ceil(0.8 * n)
        results.append(((errors / k).mean(), (errors / n).mean(), errors[top - 1] / top))
    return np.mean(results, axis=0)


def _ref_ood(s_in, s_out):
    auroc = np.mean([(o > i) + 0.5 * (o == i) for i in s_in for o in s_out])
    scores = np.r_[s_in, s_out]
    positive = np.r_[np.zeros(len(s_in)), np.ones(len(s_out))]
    ap, recall_before, fpr95 = 0.0, 0.0, None
    for t in sorted(set(scores), reverse=True):
        tp = positive[scores >= t].sum()
        ap += (tp / len(s_out) - recall_before) * tp / (scores >= t).sum()
        recall_before = tp / len(s_out)
        if fpr95 is None and tp >= 0.95 * len(s_out):
            fpr95 = ((scores >= t) & (positive == 0)).sum() / len(s_in)
    return auroc, ap, fpr95


def _ref_entropy(p):
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(-1)


# ---------------------------------------------------------------------------------------------
# Classification metrics


def _cases():
    rng = np.random.default_rng(5)
    # confidences exactly on the edges b / 15 (float64), and 1.0
    on_edges = np.array([b / 15 for b in range(8, 16)])
    yield np.stack([on_edges, 1 - on_edges], 1), rng.integers(0, 2, 8)
    yield np.ones((1, 1)), np.zeros(1, int)  # one input, one class
    yield np.array([[0.5, 0.5]] * 4), np.array([0, 1, 1, 0])  # all identical, tied argmax
    yield np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]), np.array([1, 1, 0])  # zeros and ones
    counts = rng.integers(0, 3, (9, 3)).astype(float)
    counts[:, 0] += 1
    yield counts / counts.sum(1, keepdims=True), rng.integers(0, 3, 9)  # many ties
    yield rng.dirichlet(np.ones(4), 7), rng.integers(0, 4, 7)


@pytest.mark.parametrize("case", range(6))
def test_classification_metrics_match_the_references(case):
    p, y = list(_cases())[case]
    probs, targets = torch.tensor(p), torch.tensor(y)
    onehot = np.eye(p.shape[1])[y]
    p_true = p[np.arange(len(y)), y]
    assert metrics.acc(probs, targets) == pytest.approx((p.argmax(1) == y).mean(), abs=1e-15)
    assert metrics.nll(probs, targets) == pytest.approx(
        -np.log(np.maximum(p_true, 1e-12)).mean(), abs=1e-12
    )
    assert metrics.brier(probs, targets) == pytest.approx(
        ((p - onehot) ** 2).sum(1).mean(), abs=1e-12
    )
    for k in (1, 2, 10, 15):
        assert metrics.ece(probs, targets, num_bins=k) == pytest.approx(
            _ref_ece(p, y, k), abs=1e-12
        )
        assert metrics.aece(probs, targets, num_bins=k) == pytest.approx(
            _ref_aece(p, y, k), abs=1e-12
        )
    aurc, augrc, risk80 = _ref_selective(p, y)
    assert metrics.aurc(probs, targets) == pytest.approx(aurc, abs=1e-12)
    assert metrics.augrc(probs, targets) == pytest.approx(augrc, abs=1e-12)
    assert metrics.risk_at_80_cov(probs, targets) == pytest.approx(risk80, abs=1e-12)


def test_a_confidence_on_an_edge_takes_the_bin_above_it():
    # 8/15 and 9/15 on their edges, each the only point of its bin: |1 - c| each
    p = torch.tensor([[8 / 15, 7 / 15], [9 / 15, 6 / 15]], dtype=torch.float64)
    y = torch.tensor([0, 0])
    assert metrics.ece(p, y) == pytest.approx((7 / 15 + 6 / 15) / 2, abs=1e-15)
    # with 2 bins both are in [1/2, 1]: |1 - 17/30|
    assert metrics.ece(p, y, num_bins=2) == pytest.approx(13 / 30, abs=1e-15)


def test_ood_metrics_match_the_pairwise_and_threshold_references_with_ties():
    rng = np.random.default_rng(2)
    s_in = rng.integers(0, 5, 23).astype(float)
    s_out = rng.integers(2, 7, 17).astype(float)
    auroc, aupr, fpr95 = _ref_ood(s_in, s_out)
    a, b = torch.tensor(s_in), torch.tensor(s_out)
    assert metrics.ood_auroc(a, b) == pytest.approx(auroc, abs=1e-14)
    assert metrics.ood_aupr(a, b) == pytest.approx(aupr, abs=1e-14)
    assert metrics.ood_fpr95(a, b) == pytest.approx(fpr95, abs=1e-14)
    # integer in-distribution scores against float OOD ones rank together
    mixed = torch.tensor([1, 2]), torch.tensor([1.5, 2.0])
    assert metrics.ood_auroc(*mixed) == pytest.approx(0.625, abs=1e-15)
    assert metrics.ood_aupr(*mixed) == pytest.approx(0.5 / 2 + 2 / 3 / 2, abs=1e-15)
    assert metrics.ood_fpr95(*mixed) == 0.5
    same = torch.full((5,), 0.3), torch.full((3,), 0.3)  # all identical: chance, every FP
    assert (metrics.ood_auroc(*same), metrics.ood_fpr95(*same)) == (0.5, 1.0)


def test_disagreement_and_entropy_metrics_match_numpy():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(3) * 0.3, (5, 6))  # (S, N, C)
    p[0, 0] = [1.0, 0.0, 0.0]
    probs = torch.tensor(p)
    preds = p.argmax(-1)
    pairs = [(i, j) for i in range(5) for j in range(i + 1, 5)]
    want = np.mean([np.mean([preds[i, n] != preds[j, n] for i, j in pairs]) for n in range(6)])
    assert metrics.disagreement(probs) == pytest.approx(want, abs=1e-15)
    aleatoric = _ref_entropy(p).mean(0)
    total = _ref_entropy(p.mean(0))
    assert metrics.expected_entropy(probs) == pytest.approx(aleatoric.mean(), abs=1e-13)
    assert metrics.mutual_information(probs) == pytest.approx((total - aleatoric).mean(), 1e-12)


# ---------------------------------------------------------------------------------------------
# Decompositions


def test_decompositions_match_numpy_at_zeros_and_ones_and_minus_inf_logits():
    logits = torch.tensor(
        [[[0.0, -math.inf, 1.0], [5.0, 5.0, 5.0]], [[200.0, 0.0, 0.0], [-math.inf, 0.0, 3.0]]]
    )
    for dtype in (torch.float32, torch.float64):
        probs = torch.softmax(logits.to(dtype), -1)
        p = probs.double().numpy()
        pbar = p.mean(0)
        want = {
            "entropy": (_ref_entropy(pbar), _ref_entropy(p).mean(0)),
            "variance": ((pbar * (1 - pbar)).sum(-1), (p * (1 - p)).sum(-1).mean(0)),
            "zero_one": (1 - pbar.max(-1), (1 - p.max(-1)).mean(0)),
        }
        tol = 1e-6 if dtype == torch.float32 else 1e-13
        for measure, (total, aleatoric) in want.items():
            d = decompose(probs, measure)
            assert d.total.dtype == dtype
            np.testing.assert_allclose(d.total.double().numpy(), total, atol=tol)
            np.testing.assert_allclose(d.aleatoric.double().numpy(), aleatoric, atol=tol)
            np.testing.assert_allclose(
                d.epistemic.double().numpy(), total - aleatoric, atol=2 * tol
            )
            assert torch.equal(d.total, d.aleatoric + d.epistemic)
            assert bool((d.epistemic >= 0).all())


def test_the_gradient_through_probabilities_rounded_to_zero_is_finite_and_exact():
    # a softmax that rounds a class to exactly 0 (a -inf logit, a saturated one): the entropy's
    # gradient is the limit p log p -> 0, not NaN (torch.xlogy's gradient at 0)
    logits = torch.tensor(
        [[[0.0, -math.inf, 1.0]], [[200.0, 0.0, 0.0]]], dtype=torch.float64, requires_grad=True
    )
    probs = torch.softmax(logits, -1)
    d = decompose(probs)
    (grad_total,) = torch.autograd.grad(d.total.sum(), logits, retain_graph=True)
    (grad_aleatoric,) = torch.autograd.grad(d.aleatoric.sum(), logits, retain_graph=True)
    (grad_h,) = torch.autograd.grad(entropy(probs[0]).sum(), logits)
    # reference: dH(q)/dz = J(z)^T (-(log q + 1)) with J = diag(p) - p p^T, zero where p = 0
    p = probs.detach().numpy()[:, 0]
    pbar = p.mean(0)

    def chain(ps, g):
        return (np.diag(ps) - np.outer(ps, ps)) @ np.where(ps > 0, g, 0.0)

    with np.errstate(divide="ignore"):
        g_total = -(np.log(pbar) + 1)
        g_own = [-(np.log(ps) + 1) for ps in p]
    for s in range(2):
        np.testing.assert_allclose(grad_total[s, 0].numpy(), chain(p[s], g_total) / 2, atol=1e-12)
        np.testing.assert_allclose(
            grad_aleatoric[s, 0].numpy(), chain(p[s], g_own[s]) / 2, atol=1e-12
        )
    np.testing.assert_allclose(grad_h[0, 0].numpy(), chain(p[0], g_own[0]), atol=1e-12)
    np.testing.assert_allclose(grad_h[1, 0].numpy(), 0.0, atol=0)


def test_regression_metrics_match_scipy_and_the_law_of_total_variance():
    rng = np.random.default_rng(0)
    s, n = 3, 4
    loc, scale = rng.normal(size=(s, n, 1)) * 2, rng.uniform(0.3, 1.5, (s, n, 1))
    y = rng.normal(size=n) * 2
    got = GaussianPredictions(torch.tensor(loc), torch.tensor(scale), torch.tensor(y)).evaluate()
    mu, sd, ns = loc[..., 0], scale[..., 0], range(n)

    def cdf(t, i):
        return stats.norm.cdf(t, mu[:, i], sd[:, i]).mean()

    want = {
        "rmse": np.sqrt(((mu.mean(0) - y) ** 2).mean()),
        "mae": np.abs(mu.mean(0) - y).mean(),
        "nll": -np.mean([np.log(stats.norm.pdf(y[i], mu[:, i], sd[:, i]).mean()) for i in ns]),
        "crps": np.mean([
            integrate.quad(lambda t, i=i: (cdf(t, i) - (t >= y[i])) ** 2, -40, 40, points=[y[i]])[0]
            for i in range(n)
        ]),
    }  # fmt: skip
    for level in (0.5, 0.9, 0.95):
        lo, hi = (
            np.array([
                optimize.brentq(lambda t, i=i, q=q: cdf(t, i) - q, -50, 50, xtol=1e-13)
                for i in range(n)
            ])
            for q in ((1 - level) / 2, (1 + level) / 2)
        )  # fmt: skip
        want[f"coverage_{round(100 * level)}"] = ((lo <= y) & (y <= hi)).mean()
        want[f"width_{round(100 * level)}"] = (hi - lo).mean()
    pit = np.array([cdf(y[i], i) for i in range(n)])
    want["calibration_error"] = np.mean(
        [((pit <= q).mean() - q) ** 2 for q in np.arange(1, 20) / 20]
    )
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    parts = GaussianPredictions(torch.tensor(loc), torch.tensor(scale)).uncertainty()
    np.testing.assert_allclose(parts.total.numpy(), (sd**2).mean(0) + mu.var(0), rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# Plots


def test_plots_of_one_input_of_one_class_draw_into_the_given_axes():
    probs, y = torch.ones(1, 1), torch.zeros(1, dtype=torch.long)
    for plot, title, xlabel in (
        (plot_reliability, "Reliability diagram (acc 100.00%, ECE 0.00%)", "confidence"),
        (plot_risk_coverage, "Risk-coverage curve (AURC 0.00%)", "coverage"),
    ):
        fig, ax = plt.subplots()
        try:
            assert plot(probs, y, ax=ax) is fig
            assert len(fig.axes) == 1 and ax.get_title() == title
            assert ax.get_xlabel().startswith(xlabel)
        finally:
            plt.close(fig)
    fig = plot_uncertainty_distributions(torch.full((2, 3, 2), 0.5), torch.full((2, 1, 2), 0.5))
    try:  # every value tied in and out of distribution: chance
        assert [ax.get_title().splitlines()[1] for ax in fig.axes] == ["OOD AUROC 50.00%"] * 3
    finally:
        plt.close(fig)


def test_uncertainty_histograms_refuse_bins_thinner_than_a_pixel_and_ecdfs_ignore_them():
    probs = torch.softmax(torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0)), -1)
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"Expected bins <= 1000 for the histograms .* got 1001"):
        plot_uncertainty_distributions(probs, bins=1001)
    assert plt.get_fignums() == before
    # the ECDFs have no bins: no edges are made for them (10**12 of them would not fit)
    fig = plot_uncertainty_distributions(probs, probs, kind="ecdf", bins=10**12)
    try:
        assert [ax.get_ylabel() for ax in fig.axes] == ["fraction of inputs ≤ x"] * 3
    finally:
        plt.close(fig)
