"""Second audit of the decompositions, the selective and OOD metrics and the rotation sweep:
values against independent numpy references (ranks by hand, thresholds by hand, entropies in
nats, the variance law), and the inputs the audit found answered badly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyrouq.metrics import (
    augrc,
    aurc,
    cov_at_5_risk,
    format_table,
    ood_aupr,
    ood_auroc,
    ood_fpr95,
    risk_at_80_cov,
)
from pyrouq.models import MLP
from pyrouq.rotation import evaluate_rotations, rotate
from pyrouq.uncertainty import decompose

# --- independent references -----------------------------------------------------------------


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks, xs, i = np.empty(len(x)), x[order], 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _references(a: np.ndarray, o: np.ndarray) -> tuple[float, float, float]:
    """AUROC (Mann-Whitney U from average ranks), AP and FPR at 95 % TPR, OOD positive."""
    n, m = len(a), len(o)
    auroc = (_average_ranks(np.concatenate([a, o]))[n:].sum() - m * (m + 1) / 2) / (n * m)
    ap, prev, fpr = 0.0, 0.0, None
    for t in np.unique(np.concatenate([a, o]))[::-1]:
        tp, fp = float((o >= t).sum()), float((a >= t).sum())
        ap += (tp / m - prev) * tp / (tp + fp)
        prev = tp / m
        if fpr is None and tp >= 0.95 * m:
            fpr = fp / n
    assert fpr is not None
    return auroc, ap, fpr


def _entropy(p: np.ndarray) -> np.ndarray:
    safe = np.where(p > 0, p, 1.0)
    return -(p * np.log(safe)).sum(-1)


def test_ood_metrics_of_float32_and_float64_scores_match_the_numpy_references():
    rng = np.random.default_rng(0)
    for trial in range(60):
        n, m = rng.integers(1, 40, 2)
        dtype = (np.float32, np.float64)[trial % 2]
        if trial % 3 == 0:  # few levels: many ties across the two sets
            a, o = rng.integers(0, 5, n).astype(dtype), rng.integers(0, 6, m).astype(dtype)
        else:
            a, o = rng.random(n).astype(dtype), (rng.random(m) + 0.3).astype(dtype)
        ref = _references(a.astype(np.float64), o.astype(np.float64))
        got = [
            f(torch.from_numpy(a), torch.from_numpy(o)) for f in (ood_auroc, ood_aupr, ood_fpr95)
        ]
        assert got == pytest.approx(ref, abs=1e-12)
    # OOD is the positive class: higher scores out of distribution give AUROC 1, FPR95 0
    low, high = torch.tensor([0.1, 0.2]), torch.tensor([0.8, 0.9])
    assert (ood_auroc(low, high), ood_aupr(low, high), ood_fpr95(low, high)) == (1.0, 1.0, 0.0)
    assert (ood_auroc(high, low), ood_fpr95(high, low)) == (0.0, 1.0)


def test_selective_metrics_match_a_sort_by_hand_without_ties():
    rng = np.random.default_rng(1)
    for _ in range(40):
        s, n, c = rng.integers(1, 4), rng.integers(1, 60), rng.integers(2, 5)
        logits = rng.normal(size=(s, n, c)) * 3
        p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        y = rng.integers(0, c, n)
        pbar = p.mean(0)
        wrong = (pbar.argmax(-1) != y).astype(float)
        errors = np.cumsum(wrong[np.argsort(-pbar.max(-1), kind="stable")])
        k = np.arange(1, n + 1)
        risk = errors / k
        ok = k[risk <= 0.05]
        probs, targets = torch.from_numpy(p), torch.from_numpy(y)
        assert aurc(probs, targets) == pytest.approx(risk.mean(), abs=1e-12)
        assert augrc(probs, targets) == pytest.approx((errors / n).mean(), abs=1e-12)
        assert cov_at_5_risk(probs, targets) == (ok.max() / n if ok.size else 0.0)
        assert risk_at_80_cov(probs, targets) == pytest.approx(risk[math.ceil(0.8 * n) - 1])


def test_decompositions_match_numpy_in_nats_and_the_variance_law():
    rng = np.random.default_rng(2)
    for s in (1, 2, 7):
        logits = rng.normal(size=(s, 9, 4)) * 4
        p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        p[:, 0] = [1.0, 0.0, 0.0, 0.0]  # exact zeros: 0 log 0 = 0
        pbar = p.mean(0)
        d = decompose(torch.from_numpy(p))
        np.testing.assert_allclose(d.total.numpy(), _entropy(pbar), rtol=0, atol=1e-14)
        np.testing.assert_allclose(d.aleatoric.numpy(), _entropy(p).mean(0), rtol=0, atol=1e-14)
        v = decompose(torch.from_numpy(p), "variance")
        np.testing.assert_allclose(v.epistemic.numpy(), p.var(0, ddof=0).sum(-1), atol=1e-15)
        np.testing.assert_allclose(v.total.numpy(), (pbar * (1 - pbar)).sum(-1), atol=1e-15)
        if s == 1:  # one draw: no disagreement, exactly
            assert all(bool((x.epistemic == 0).all()) for x in (d, v))


# --- defects the audit fixed ------------------------------------------------------------------


def test_a_huge_angle_turns_as_its_remainder_modulo_360():
    # math.radians(1e16 + 30) lost the turn's remainder: the sample was ~0.15 off rotate(x, 310)
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    for angle in (1e16 + 30, 1e20, -1e18 - 45):
        assert torch.equal(
            rotate(x, angle, normalized=False), rotate(x, angle % 360, normalized=False)
        )


@pytest.mark.parametrize(
    ("angles", "expected"),
    [
        (
            np.array(30),
            r"got array\(30\); pass e\.g\. angles=\[30\] for one angle, or angles=range",
        ),
        (torch.tensor(30.0), r"got tensor\(30\.\); pass e\.g\. angles=\[30(\.0)?\] for one angle"),
        (
            torch.tensor([[0.0, 30.0]]),
            r"got Tensor of shape \(1, 2\); pass e\.g\. angles=angles\.flatten\(\), or angles=",
        ),
        (
            np.array([[0, 30]]),
            r"got ndarray of shape \(1, 2\); pass e\.g\. angles=angles\.flatten\(\)",
        ),
        ("30", r"got '30'; pass e\.g\. angles=\(0, 45, 90\), or angles=range\(0, 181, 15\)\.$"),
        (b"30", r"got b'30'; pass e\.g\. angles=\(0, 45, 90\)"),  # was swept at 51 and 48 degrees
        (None, r"got None; pass e\.g\. angles=\(0, 45, 90\)"),  # said angles=\[None\]
    ],
)
def test_angles_that_are_no_sequence_of_degrees_are_told_what_to_pass(angles, expected):
    with pytest.raises(
        TypeError, match=r"^Expected angles to be an iterable of degrees, " + expected
    ):
        evaluate_rotations(MLP(), torch.zeros(2, 1, 28, 28), torch.tensor([0, 1]), angles=angles)


def test_evaluate_rotations_takes_a_1d_array_of_angles():
    rows = evaluate_rotations(
        MLP(),
        torch.zeros(2, 1, 28, 28),
        torch.tensor([0, 1]),
        angles=np.array([0, 90]),
        progress=False,
    )
    assert [row["angle"] for row in rows] == [0.0, 90.0]


def test_format_table_shows_a_key_that_is_not_a_string_under_other():
    # it raised TypeError: object of type 'int' has no len()
    table = format_table({"acc": 0.5, 3: 0.25})
    assert "│ 3              │ 0.25000 │" in table.splitlines()


def test_metrics_of_probabilities_that_require_grad_give_no_torch_warning():
    import warnings

    from pyrouq import metrics

    probs = torch.tensor([[[0.7, 0.3], [0.2, 0.8]]], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "requires_grad=True to a scalar" warning
        assert metrics.nll(probs, torch.tensor([0, 1])) == pytest.approx(
            -(math.log(0.7) + math.log(0.8)) / 2
        )
        assert metrics.ece(probs, torch.tensor([0, 1])) == pytest.approx(0.25)
