"""Audit of pyrouq.metrics and pyrouq.uncertainty: the input messages fixed by the audit, and
the values it checked against brute-force references (rank formula, all tie orders, float64)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

import pyrouq
from pyrouq.metrics import augrc, aurc, ece, ood_aupr, ood_auroc, ood_fpr95
from pyrouq.predictive import Predictions
from pyrouq.regression import GaussianPredictions
from pyrouq.uncertainty import decompose, entropy

PROBS = torch.tensor([[[0.9, 0.1], [0.5, 0.5]], [[0.2, 0.8], [0.5, 0.5]]])  # S=2, N=2, C=2


# --- messages ----------------------------------------------------------------------------------


def test_decompose_of_predictions_says_to_pass_their_probs():
    # torch.as_tensor(predictions), the former hint, fails itself
    with pytest.raises(
        TypeError,
        match=r"got Predictions; pass its \(S, N, C\) tensor, probs\.probs, or call its "
        r"\.uncertainty\(measure\)\.$",
    ):
        decompose(Predictions.from_probs(PROBS))  # type: ignore[arg-type]


def test_decompose_of_gaussian_predictions_points_to_their_uncertainty():
    preds = GaussianPredictions(torch.zeros(2, 1, 1), torch.ones(2, 1, 1))
    with pytest.raises(
        TypeError,
        match=r"got GaussianPredictions; a Gaussian likelihood's predictions: split their "
        r"variance with predictions\.uncertainty\(\)\.$",
    ):
        decompose(preds)  # type: ignore[arg-type]


def test_decompose_of_an_array_still_says_as_tensor():
    with pytest.raises(TypeError, match=r"got ndarray; wrap it with torch\.as_tensor\(\.\.\.\)\.$"):
        decompose(np.full((1, 1, 2), 0.5))  # type: ignore[arg-type]


def test_one_draw_of_probabilities_gets_the_unsqueeze_hint():
    for call in (lambda: decompose(PROBS[0]), lambda: Predictions.from_probs(PROBS[0])):
        with pytest.raises(
            ValueError,
            match=r"\(S, N, C\) \(3 dims\), got shape \(2, 2\)\. Stack the draws/members on dim "
            r"0 and the classes on the last dim\. For the \(N, C\) probabilities of one draw "
            r"pass probs\.unsqueeze\(0\)\.$",
        ):
            call()


def test_a_tensor_base_is_told_to_be_a_number_not_to_exceed_one():
    # it was "Expected a logarithm base > 1, got tensor(2.) (a base below 1 ...)": but 2 > 1
    with pytest.raises(
        ValueError,
        match=r"^Expected a logarithm base > 1, got tensor\(2\.\) \(a tensor: pass a Python "
        r"number, float\(t\)\); use math\.e",
    ):
        decompose(PROBS, base=torch.tensor(2.0))  # type: ignore[arg-type]
    # several elements: float(t) raises, as int(t) does (it was told to pass them)
    with pytest.raises(ValueError, match=r"got tensor\(\[2\., 3\.\]\) \(a tensor of shape "
                       r"\(2,\): pass one Python number\); use math\.e"):  # fmt: skip
        decompose(PROBS, base=torch.tensor([2.0, 3.0]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"got nan \(NaN\); use math\.e"):
        decompose(PROBS, base=math.nan)


def test_a_huge_integer_base_is_a_base_not_an_overflow():
    # math.isfinite(10**400) raised OverflowError; the base is > 1 and finite
    got = decompose(PROBS.double(), base=10**400).total
    expected = entropy(PROBS.double().mean(0)) / math.log(10**400)
    assert torch.allclose(got, expected, rtol=1e-12, atol=0)


def test_ood_scores_as_arrays_are_told_to_become_tensors():
    with pytest.raises(TypeError, match=r"got ndarray; pass torch\.as_tensor\(scores_in\)\.$"):
        ood_auroc(np.array([0.1, 0.2]), torch.tensor([0.3]))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got list; pass torch\.as_tensor\(scores_out\)\.$"):
        ood_aupr(torch.tensor([0.1]), [0.3])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got dict; compute them with ood_scores"):
        ood_fpr95({}, torch.tensor([0.3]))  # type: ignore[arg-type]


def test_a_tensor_num_bins_gets_the_tensor_hint():
    with pytest.raises(
        ValueError,
        match=r"got tensor\(3\) \(a tensor: pass a Python integer, int\(t\)\)"
        r"\. The reported figures use 15\.",
    ):
        ece(PROBS, torch.tensor([0, 1]), num_bins=torch.tensor(3))  # type: ignore[arg-type]


# --- values against brute-force references -------------------------------------------------------


def _auroc_pairs(a: torch.Tensor, o: torch.Tensor) -> float:
    gt = (o[None, :] > a[:, None]).double()
    eq = (o[None, :] == a[:, None]).double()
    return float((gt + 0.5 * eq).mean())


def _ap_and_fpr95(a: torch.Tensor, o: torch.Tensor) -> tuple[float, float]:
    scores = torch.cat([a, o])
    ap, prev, fpr = 0.0, 0.0, None
    for t in torch.unique(scores).flip(0):
        tp, fp = float((o >= t).sum()), float((a >= t).sum())
        ap += (tp / len(o) - prev) * tp / (tp + fp)
        prev = tp / len(o)
        if fpr is None and tp >= 0.95 * len(o):
            fpr = fp / len(a)
    assert fpr is not None
    return ap, fpr


def test_ood_metrics_match_the_pairwise_and_threshold_definitions_with_ties():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        n, m = torch.randint(1, 25, (2,), generator=g).tolist()
        a = torch.randint(0, 4, (n,), generator=g).double()  # few values: many ties
        o = torch.randint(0, 5, (m,), generator=g).double()
        ap, fpr = _ap_and_fpr95(a, o)
        assert ood_auroc(a, o) == pytest.approx(_auroc_pairs(a, o), abs=1e-12)
        assert ood_aupr(a, o) == pytest.approx(ap, abs=1e-12)
        assert ood_fpr95(a, o) == pytest.approx(fpr, abs=1e-12)
    same = torch.ones(3), torch.ones(4)  # all scores equal
    assert (ood_auroc(*same), ood_aupr(*same), ood_fpr95(*same)) == (0.5, 4 / 7, 1.0)
    # float64 scores 1e-15 apart are distinct, not tied
    a = torch.tensor([1.0, 1.0 + 1e-15], dtype=torch.float64)
    assert ood_auroc(a, torch.tensor([1.0 + 2e-15], dtype=torch.float64)) == 1.0


def test_aurc_and_augrc_are_the_mean_over_all_orders_of_tied_confidences():
    g = torch.Generator().manual_seed(1)
    levels = torch.tensor([0.6, 0.7, 0.9], dtype=torch.float64)
    for _ in range(20):
        n = int(torch.randint(1, 7, (1,), generator=g))
        conf = levels[torch.randint(0, 3, (n,), generator=g)]
        probs = torch.stack([conf, 1 - conf], -1)
        y = torch.randint(0, 2, (n,), generator=g)
        wrong = (probs.argmax(-1) != y).double()
        k = torch.arange(1, n + 1, dtype=torch.float64)
        vals = []
        for order in itertools.permutations(range(n)):
            c = conf[list(order)]
            if bool((c[:-1] >= c[1:]).all()):  # an order of decreasing confidence
                e = wrong[list(order)].cumsum(0)
                vals.append(((e / k).mean().item(), (e.mean() / n).item()))
        ref = np.mean(vals, 0)
        assert aurc(probs, y) == pytest.approx(ref[0], abs=1e-12)
        assert augrc(probs, y) == pytest.approx(ref[1], abs=1e-12)


def test_decompositions_of_near_one_hot_float32_agree_with_float64():
    g = torch.Generator().manual_seed(2)
    probs = (torch.randn(8, 200, 10, generator=g, dtype=torch.float64) * 30).softmax(-1).float()
    wide = probs.double()
    direct = entropy(wide.mean(0))
    for measure in ("entropy", "variance", "zero_one"):
        d32, d64 = decompose(probs, measure), decompose(wide, measure)
        for part in ("total", "aleatoric", "epistemic"):
            assert torch.allclose(getattr(d32, part).double(), getattr(d64, part), atol=1e-6)
        assert torch.equal(d64.total, d64.aleatoric + d64.epistemic)
    assert torch.allclose(decompose(wide).total, direct, rtol=1e-12, atol=1e-15)


def test_one_draw_and_exact_zeros_decompose_exactly():
    one = torch.randn(1, 50, 7, generator=torch.Generator().manual_seed(3)).softmax(-1)
    for measure in ("entropy", "variance", "zero_one"):
        d = decompose(one, measure)
        assert bool((d.epistemic == 0).all()) and torch.equal(d.total, d.aleatoric)
    corners = torch.eye(3).unsqueeze(1)  # three one-hot draws that disagree: (3, 1, 3)
    d = decompose(corners)
    assert d.aleatoric.item() == 0.0
    assert d.epistemic.item() == pytest.approx(math.log(3), abs=1e-6)
    assert pyrouq.metrics.mutual_information(corners) == pytest.approx(math.log(3), abs=1e-15)
