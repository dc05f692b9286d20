"""Tests for pyrouq.metrics: hand-computed values for every metric, evaluate and format_table."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pyrouq import metrics
from pyrouq.metrics import (
    acc,
    accuracy,
    aece,
    augrc,
    aurc,
    brier,
    cov_at_5_risk,
    disagreement,
    ece,
    evaluate,
    expected_entropy,
    format_table,
    mutual_information,
    nll,
    ood_aupr,
    ood_auroc,
    ood_fpr95,
    ood_scores,
    risk_at_80_cov,
)

KEYS = [
    "acc",
    "nll",
    "brier",
    "ece",
    "aece",
    "aurc",
    "augrc",
    "cov_at_5_risk",
    "risk_at_80_cov",
    "disagreement",
    "expected_entropy",
    "mutual_information",
]
OOD_KEYS = ["ood_auroc", "ood_aupr", "ood_fpr95"]


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def dirichlet(s: int, n: int, c: int, concentration: float = 1.0) -> torch.Tensor:
    alpha = torch.full((c,), concentration, dtype=torch.float64)
    return torch.distributions.Dirichlet(alpha).sample((s, n))


# The 4-point case, worked out by hand:
#   point  p̄            target  pred  conf  correct  ECE bin (width 1/15)
#   0      [.95, .05]   0       0     .95   yes      14: [.9333, 1]
#   1      [.30, .70]   0       1     .70   no       10: [.6667, .7333)
#   2      [.68, .32]   0       0     .68   yes      10
#   3      [.45, .55]   1       1     .55   yes       8: [.5333, .6)
FOUR = f64([[0.95, 0.05], [0.30, 0.70], [0.68, 0.32], [0.45, 0.55]])
FOUR_Y = torch.tensor([0, 0, 0, 1])


def test_acc_four_points():
    assert acc(FOUR, FOUR_Y) == 0.75
    assert accuracy is acc


def test_nll_four_points():
    expected = -(math.log(0.95) + math.log(0.30) + math.log(0.68) + math.log(0.55)) / 4
    assert nll(FOUR, FOUR_Y) == pytest.approx(expected, abs=1e-12)


def test_nll_clamps_exact_zero():
    # p̄[target] = 0 -> -log(1e-12) = 27.631..., finite
    assert nll(f64([[1.0, 0.0]]), torch.tensor([1])) == pytest.approx(12 * math.log(10))
    # certain and right: 0.0, not -0.0 (tables printed "-0.00000")
    assert math.copysign(1.0, nll(f64([[1.0, 0.0]]), torch.tensor([0]))) == 1.0


def test_brier_four_points():
    # sum_c (p̄_c - onehot_c)^2: .05²·2 = .005, .7²·2 = .98, .32²·2 = .2048, .45²·2 = .405
    assert brier(FOUR, FOUR_Y) == pytest.approx((0.005 + 0.98 + 0.2048 + 0.405) / 4, abs=1e-12)


def test_ece_four_points():
    # bin 14: |1 - .95| · 1/4; bin 10: acc 1/2, conf .69 -> |.5 - .69| · 2/4; bin 8: |1 - .55| · 1/4
    expected = 0.05 / 4 + 0.19 * 2 / 4 + 0.45 / 4  # = .22
    assert ece(FOUR, FOUR_Y) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.22)


def test_ece_and_aece_take_other_numbers_of_bins():
    # 3 bins: [2/3, 1] holds .95 (right), .70 (wrong), .68 (right): |2 - 2.33|; [1/3, 2/3)
    # holds .55 (right): |1 - .55|. Over 4 points: (.33 + .45) / 4
    assert ece(FOUR, FOUR_Y, num_bins=3) == pytest.approx(0.78 / 4, abs=1e-12)
    assert ece(FOUR, FOUR_Y, num_bins=15) == ece(FOUR, FOUR_Y)
    # 2 equal-mass bins: {.55, .68} both right: |2 - 1.23|; {.70 wrong, .95 right}: |1 - 1.65|
    assert aece(FOUR, FOUR_Y, num_bins=2) == pytest.approx(1.42 / 4, abs=1e-12)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match=rf"num_bins to be a positive integer, got {bad!r}"):
            ece(FOUR, FOUR_Y, num_bins=bad)
        with pytest.raises(ValueError, match=r"The reported figures use 15"):
            aece(FOUR, FOUR_Y, num_bins=bad)


def test_ece_bins_are_left_closed():
    # conf .6 = 9/15 exactly is the left edge of bin 9, with .65: |1 - (.6 + .65)| / 2 = .125.
    # (right-closed bins would put .6 in bin 8: (.4 + .65) / 2 = .525)
    probs = f64([[0.6, 0.4], [0.35, 0.65]])
    assert ece(probs, torch.tensor([0, 0])) == pytest.approx(0.125, abs=1e-12)


def test_ece_confidence_one_joins_last_bin():
    # conf 1.0 (wrong) and .95 (right) share bin 14: |1 - 1.95| / 2 = .475 (not (1 + .05) / 2)
    probs = f64([[1.0, 0.0], [0.95, 0.05]])
    assert ece(probs, torch.tensor([1, 0])) == pytest.approx(0.475, abs=1e-12)


def test_ece_perfectly_calibrated_is_zero():
    # conf .75 on all 4 points, 3 correct
    probs = f64([[0.75, 0.25]] * 4)
    assert ece(probs, torch.tensor([0, 0, 0, 1])) == pytest.approx(0.0, abs=1e-12)


def test_aece_four_points_one_bin_each():
    # N = 4 < 15: one point per bin -> mean |correct - conf| = (.05 + .70 + .32 + .45) / 4 = .38
    assert aece(FOUR, FOUR_Y) == pytest.approx(0.38, abs=1e-12)


def test_aece_first_bins_take_the_extra_points():
    # N = 16 = 15 + 1: tensor_split gives the lowest-confidence bin 2 points, the others 1.
    conf = torch.linspace(0.55, 0.99, 16, dtype=torch.float64)
    probs = torch.stack([conf, 1 - conf], -1)
    y = torch.zeros(16, dtype=torch.long)
    y[1] = 1  # the 2nd lowest confidence is wrong
    correct = (y == 0).double()
    gaps = (correct - conf).abs()
    expected = (abs(1 - conf[0] - conf[1]) + gaps[2:].sum()) / 16
    assert aece(probs, y) == pytest.approx(float(expected), abs=1e-12)
    # the other convention (the last bin gets 2 points) would give a different value
    other = (gaps[:14].sum() + abs(correct[14] + correct[15] - conf[14] - conf[15])) / 16
    assert abs(float(expected) - float(other)) > 1e-3


def test_aurc_augrc_cov_risk_four_points():
    # by decreasing confidence: .95 ok, .70 wrong, .68 ok, .55 ok -> errors 0, 1, 1, 1
    # risks 0, 1/2, 1/3, 1/4 -> AURC = (0 + 1/2 + 1/3 + 1/4) / 4 = 13/48
    assert aurc(FOUR, FOUR_Y) == pytest.approx(13 / 48, abs=1e-12)
    # generalized risks errors_k / N = 0, 1/4, 1/4, 1/4 -> AUGRC = 3/16
    assert augrc(FOUR, FOUR_Y) == pytest.approx(3 / 16, abs=1e-12)
    # only coverage 1/4 has risk <= 5%
    assert cov_at_5_risk(FOUR, FOUR_Y) == 0.25
    # ceil(0.8 · 4) = 4 points: risk 1/4
    assert risk_at_80_cov(FOUR, FOUR_Y) == pytest.approx(0.25, abs=1e-12)


def test_aurc_averages_ties():
    # conf .9 (ok), then three tied at .6 with one error among them: expected errors 1/3, 2/3, 1
    # risks 0, (1/3)/2, (2/3)/3, 1/4 -> AURC = (1/6 + 2/9 + 1/4) / 4 = 23/144
    probs = f64([[0.6, 0.4], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    y = torch.tensor([1, 0, 0, 0])
    assert aurc(probs, y) == pytest.approx(23 / 144, abs=1e-12)
    # independent of where the wrong one sits among the ties
    assert aurc(probs[[1, 2, 3, 0]], y[[1, 2, 3, 0]]) == pytest.approx(23 / 144, abs=1e-12)
    # AUGRC: (0 + 1/3 + 2/3 + 1) / 4 / 4
    assert augrc(probs, y) == pytest.approx(2 / 16, abs=1e-12)


def test_cov_at_5_risk_edges():
    probs = f64([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3]])
    assert cov_at_5_risk(probs, torch.tensor([1, 1, 1])) == 0.0  # never <= 5%
    assert cov_at_5_risk(probs, torch.tensor([0, 0, 0])) == 1.0
    # exactly 5%: 20 points, the least confident wrong -> risk 1/20 at full coverage
    conf = torch.linspace(0.99, 0.6, 20, dtype=torch.float64)
    probs20 = torch.stack([conf, 1 - conf], -1)
    y = torch.zeros(20, dtype=torch.long)
    y[-1] = 1
    assert cov_at_5_risk(probs20, y) == 1.0
    y[-2] = 1  # now 2 errors in 20; 19 points hold 1 error (5.3%), 18 hold none
    assert cov_at_5_risk(probs20, y) == pytest.approx(18 / 20)


def test_risk_at_80_cov_rounds_up():
    # N = 6: ceil(4.8) = 5 most confident; errors sorted by confidence 0, 0, 0, 0, 1, 1 -> 1/5
    # (rounding down to 4 would give 0)
    conf = f64([0.95, 0.9, 0.85, 0.8, 0.75, 0.7])
    probs = torch.stack([conf, 1 - conf], -1)
    y = torch.tensor([0, 0, 0, 0, 1, 1])
    assert risk_at_80_cov(probs, y) == pytest.approx(0.2, abs=1e-12)


def test_disagreement_two_members():
    # input 0: members predict 0 and 1 (disagree); input 1: both predict 0 -> (1 + 0) / 2
    probs = f64([[[0.9, 0.1], [0.6, 0.4]], [[0.2, 0.8], [0.7, 0.3]]])
    assert disagreement(probs) == 0.5
    assert disagreement(probs, torch.tensor([0, 0])) == 0.5  # targets ignored


def test_disagreement_three_members_and_single():
    # votes 0, 0, 1: pairs (1,2) agree, (1,3) and (2,3) differ -> 2/3
    probs = f64([[[0.9, 0.1]], [[0.8, 0.2]], [[0.3, 0.7]]])
    assert disagreement(probs) == pytest.approx(2 / 3, abs=1e-12)
    assert disagreement(probs[:1]) == 0.0
    assert disagreement(probs[0]) == 0.0  # (N, C): S = 1


def test_expected_entropy_and_mutual_information():
    # members [.5, .5] and [1, 0]: expected entropy ln2 / 2; p̄ = [.75, .25]
    probs = f64([[[0.5, 0.5]], [[1.0, 0.0]]])
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert expected_entropy(probs) == pytest.approx(math.log(2) / 2, abs=1e-12)
    assert mutual_information(probs) == pytest.approx(h - math.log(2) / 2, abs=1e-12)
    assert mutual_information(probs.mean(0)) == 0.0


# --- OOD -------------------------------------------------------------------------------------

# in: .1, .4, .6    out: .4, .7, .8, .9   (a tie at .4)
S_IN = f64([0.1, 0.4, 0.6])
S_OUT = f64([0.4, 0.9, 0.7, 0.8])


def test_ood_auroc_with_tie():
    # out .4 beats .1, ties .4 (1/2), loses to .6 -> 1.5; .7, .8, .9 beat all 3 -> 9; / 12
    assert ood_auroc(S_IN, S_OUT) == pytest.approx(10.5 / 12, abs=1e-12)
    assert ood_auroc(f64([0.0, 0.1]), f64([0.5])) == 1.0
    assert ood_auroc(f64([0.5]), f64([0.0, 0.1])) == 0.0
    assert ood_auroc(f64([0.3, 0.3]), f64([0.3])) == 0.5


def test_entropy_scores_of_one_mean_tie_exactly():
    # the same mean (0.5, 0.5) from agreeing and from disagreeing draws: H(p̄) = log 2 for both
    ind = torch.tensor([[[0.5, 0.5]], [[0.5, 0.5]]], dtype=torch.float64)
    ood = torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]], dtype=torch.float64)
    assert torch.equal(ood_scores(ind, "entropy"), ood_scores(ood, "entropy"))
    assert ood_auroc(ood_scores(ind, "entropy"), ood_scores(ood, "entropy")) == 0.5


def test_ood_aupr_with_tie():
    # thresholds (decreasing): .9 P1 R1/4, .8 P1 R2/4, .7 P1 R3/4, .6 P3/4 R3/4,
    # .4 (one out, one in) P4/6 R1, .1 P4/7 R1 -> AP = 3 · 1/4 · 1 + 1/4 · 2/3 = 11/12
    assert ood_aupr(S_IN, S_OUT) == pytest.approx(11 / 12, abs=1e-12)
    assert ood_aupr(f64([0.0, 0.1]), f64([0.5, 0.6])) == 1.0


def test_ood_fpr95_with_tie():
    # TPR first reaches >= 95% at t = .4 (4/4 OOD); ID scores >= .4: .4 and .6 -> 2/3
    assert ood_fpr95(S_IN, S_OUT) == pytest.approx(2 / 3, abs=1e-12)


def test_ood_fpr95_stops_at_95_percent_recall():
    # 20 OOD scores 1..20; TPR 19/20 = 95% at t = 2; ID scores >= 2: only 10.5 -> 1/3
    # (requiring 100% recall, t = 1, would also count 1.5 -> 2/3)
    s_out = torch.arange(1, 21, dtype=torch.float64)
    assert ood_fpr95(f64([0.5, 1.5, 10.5]), s_out) == pytest.approx(1 / 3, abs=1e-12)


@pytest.mark.parametrize("fn", [ood_auroc, ood_aupr, ood_fpr95])
def test_ood_empty_scores(fn):
    with pytest.raises(ValueError, match=r"Expected scores_out of shape \(M,\) with M >= 1"):
        fn(S_IN, torch.zeros(0, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"Expected scores_in .*non-empty"):
        fn(torch.zeros(0), S_OUT)


def test_ood_scores_hand_computed():
    # input 0: members [1, 0] and [0, 1]; input 1: both [.5, .5]
    probs = f64([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]])
    ln2 = math.log(2)
    assert ood_scores(probs, "mutual_information").tolist() == pytest.approx([ln2, 0.0])
    assert ood_scores(probs, "entropy").tolist() == pytest.approx([ln2, ln2])
    assert ood_scores(probs, "max_prob").tolist() == pytest.approx([0.5, 0.5])
    assert ood_scores(probs, "variance").tolist() == pytest.approx([0.5, 0.0])  # .25 + .25
    assert ood_scores(SimpleNamespace(probs=probs), "entropy").shape == (2,)


def test_ood_scores_unknown():
    with pytest.raises(
        ValueError,
        match=r"Unknown OOD score 'energy'; expected one of 'mutual_information', 'entropy', "
        r"'max_prob', 'variance'",
    ):
        ood_scores(dirichlet(2, 3, 2), "energy")  # type: ignore[arg-type]


# --- invariances and input forms -------------------------------------------------------------

ALL = [acc, nll, brier, ece, aece, aurc, augrc, cov_at_5_risk, risk_at_80_cov]


def test_permuting_classes_changes_no_metric():
    probs = dirichlet(5, 60, 4, concentration=0.7)
    y = torch.randint(0, 4, (60,))
    perm = torch.randperm(4)
    probs_p, y_p = probs[..., perm], torch.argsort(perm)[y]
    a, b = evaluate(probs, y), evaluate(probs_p, y_p)
    assert list(a) == list(b)
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-10), key


def test_mean_probs_and_float32_inputs():
    probs = dirichlet(4, 30, 3)
    y = torch.randint(0, 3, (30,))
    for fn in ALL:
        assert fn(probs, y) == pytest.approx(fn(probs.mean(0), y), abs=1e-12), fn.__name__
        assert fn(probs.float(), y) == pytest.approx(fn(probs, y), abs=1e-5), fn.__name__


def test_targets_wrong_length():
    with pytest.raises(ValueError, match=r"Expected targets of shape \(N,\) = \(4,\).*\(3,\)"):
        acc(FOUR, torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match=r"got shape \(4, 1\)"):
        nll(FOUR, FOUR_Y[:, None])


def test_targets_out_of_range():
    with pytest.raises(ValueError, match=r"Expected targets in \[0, 2\).*got values in \[0, 5\]"):
        brier(FOUR, torch.tensor([0, 5, 1, 0]))
    with pytest.raises(ValueError, match=r"got values in \[-1, 1\]; relabel them as 0\.\.1"):
        ece(FOUR, torch.tensor([0, -1, 1, 0]))


def test_targets_wrong_type():
    with pytest.raises(TypeError, match=r"integer targets.*got dtype torch\.float32"):
        aurc(FOUR, torch.tensor([0.0, 1.0, 0.0, 1.0]))
    with pytest.raises(TypeError, match=r"torch\.Tensor of class labels, got list"):
        acc(FOUR, [0, 1, 0, 1])


TARGETED = [acc, nll, brier, ece, aece, aurc, augrc, cov_at_5_risk, risk_at_80_cov]


@pytest.mark.parametrize("fn", TARGETED, ids=lambda fn: fn.__name__)
def test_targets_none_read_those_the_predictions_carry_as_evaluate_does(fn):
    # nll(p, None) was a TypeError in words of its own, which said a Predictions' .targets was
    # None even where it carried them; evaluate(p, None) reads those, or says "No targets"
    from pyrouq import Predictions

    carried = Predictions(FOUR[None], targets=FOUR_Y)
    assert fn(carried, None) == fn(FOUR, FOUR_Y) == evaluate(carried)[fn.__name__]
    # left out, as evaluate(p)'s may be (the signatures made them required: a TypeError)
    assert fn(carried) == fn(FOUR, FOUR_Y)
    words = r"^No targets: pass targets=\(N,\) labels, or Predictions that carry them \(predict"
    for probs in (FOUR, FOUR[None], Predictions(FOUR[None])):  # mean, (S, N, C), none carried
        with pytest.raises(ValueError, match=words):
            fn(probs, None)
        with pytest.raises(ValueError, match=words):
            fn(probs)
        with pytest.raises(ValueError, match=words):
            evaluate(probs, None)


@pytest.mark.parametrize(
    "fn",
    [*TARGETED, metrics.disagreement, metrics.expected_entropy, metrics.mutual_information],
    ids=lambda fn: fn.__name__,
)
def test_the_metrics_signatures_take_the_predictions_they_read(fn):
    # probs was typed Tensor: mypy refused nll(p) for a Predictions p, the call that reads the
    # targets p carries (as evaluate(p) does), though the docs say probs may be a Predictions
    import typing

    from pyrouq import Predictions

    hints = typing.get_type_hints(fn, localns={"Predictions": Predictions})
    assert set(typing.get_args(hints["probs"])) == {torch.Tensor, Predictions}
    assert set(typing.get_args(hints["targets"])) == {torch.Tensor, type(None)}


def test_probs_not_summing_to_one_and_wrong_rank():
    with pytest.raises(ValueError, match=r"sum to 1.*tolerance 0\.001.*softmax"):
        acc(FOUR * 2, FOUR_Y)
    with pytest.raises(
        ValueError, match=r"Expected probs of shape \(S, N, C\) \(3 dims\) or \(N, C\) \(2 dims\)"
    ):
        acc(FOUR[None, None], FOUR_Y)
    with pytest.raises(TypeError, match=r"or an object with a \.probs attribute .*got str"):
        acc("probs", FOUR_Y)  # type: ignore[arg-type]


# --- evaluate and format_table ---------------------------------------------------------------


def test_evaluate_keys_and_values():
    probs = dirichlet(4, 50, 3)
    y = torch.randint(0, 3, (50,))
    m = evaluate(probs, y)
    assert list(m) == KEYS
    assert all(isinstance(v, float) for v in m.values())
    for key in KEYS:
        assert m[key] == pytest.approx(getattr(metrics, key)(probs, y), abs=1e-12), key
    for key in ("acc", "ece", "aece", "aurc", "augrc", "cov_at_5_risk", "risk_at_80_cov"):
        assert 0.0 <= m[key] <= 1.0
    assert m["mutual_information"] > 0 and m["disagreement"] > 0


def test_evaluate_with_ood_and_duck_typed_predictions():
    # in-distribution: members agree (MI 0); OOD: members disagree (MI > 0) -> perfect detection
    agree = dirichlet(1, 20, 3).expand(5, -1, -1)
    disagree = dirichlet(5, 10, 3, concentration=0.3)
    y = torch.randint(0, 3, (20,))
    m = evaluate(SimpleNamespace(probs=agree), y, ood=SimpleNamespace(probs=disagree))
    assert list(m) == KEYS + OOD_KEYS
    assert m["ood_auroc"] == 1.0 and m["ood_aupr"] == 1.0 and m["ood_fpr95"] == 0.0
    assert m["disagreement"] == 0.0
    assert m["mutual_information"] == pytest.approx(0.0, abs=1e-12)
    # a 2-d OOD tensor works as S = 1 (warned: 5 draws in distribution); with max_prob the
    # OOD metrics follow ood_scores
    with pytest.warns(UserWarning, match=r"an \(N, C\) tensor counts as one draw"):
        m2 = evaluate(agree, y, ood=disagree.mean(0), ood_score="max_prob")
    s_in, s_out = ood_scores(agree, "max_prob"), ood_scores(disagree.mean(0), "max_prob")
    assert m2["ood_auroc"] == pytest.approx(ood_auroc(s_in, s_out))


def test_evaluate_two_dimensional_input():
    pbar = dirichlet(1, 10, 3)[0]
    m = evaluate(pbar, torch.randint(0, 3, (10,)))
    assert m["disagreement"] == 0.0 and m["mutual_information"] == 0.0


def test_evaluate_empty_ood_set():
    with pytest.raises(ValueError, match=r"Expected a non-empty ood, got shape \(3, 0, 2\)"):
        evaluate(FOUR, FOUR_Y, ood=torch.zeros(3, 0, 2))


def test_evaluate_ood_class_mismatch_and_unknown_score():
    with pytest.raises(ValueError, match=r"ood with C=2 classes"):
        evaluate(FOUR, FOUR_Y, ood=dirichlet(2, 3, 5))
    with pytest.raises(ValueError, match=r"Unknown ood_score 'bald'; expected one of"):
        evaluate(FOUR, FOUR_Y, ood=FOUR, ood_score="bald")  # type: ignore[arg-type]


def test_evaluate_refuses_epistemic_ood_scores_across_draw_counts():
    # an (N, C) OOD set is one draw, whose disagreement is 0: against S draws in
    # distribution the AUROC would be 0 by construction
    many = dirichlet(4, 6, 3)
    for score in ("mutual_information", "variance"):
        with pytest.raises(ValueError) as info:
            evaluate(many, torch.zeros(6, dtype=torch.long), ood=many.mean(0), ood_score=score)
        # it said "the mutual_information of a draw's disagreement", then offered 'entropy'
        # as a way out "which takes any number of draws": the mean prediction's entropy grows
        # with the draws too (the way out is as many draws)
        assert str(info.value) == (
            f"ood holds 1 draw(s) per input and the in-distribution predictions 4: "
            f"ood_score={score!r} measures how far the draws disagree, which depends on how "
            "many there are (with one draw it is 0), so it is comparable only between "
            "predictions with as many draws. Predict the OOD inputs with the same model and "
            "num_samples (an (N, C) tensor is one draw)."
        )
    with pytest.raises(ValueError, match=r"predictions 4: the default ood_score, "
                       r"'mutual_information', measures how far"):  # fmt: skip
        evaluate(many, torch.zeros(6, dtype=torch.long), ood=many[:2])
    # scores of the mean prediction warn across draw counts (the mean of more disagreeing
    # draws is less certain), not refuse: a mean of draws scores as its draws do
    y = torch.zeros(6, dtype=torch.long)
    for score in ("entropy", "max_prob"):
        with pytest.warns(UserWarning) as told:
            one = evaluate(many, y, ood=many.mean(0), ood_score=score)["ood_auroc"]
        assert [str(w.message) for w in told] == [
            f"ood holds 1 draw(s) per input and the in-distribution predictions 4: "
            f"ood_score={score!r} scores the mean prediction, which is less certain the more "
            "draws it averages where they disagree, so the OOD metrics lean toward calling the "
            "set of more draws OOD. Predict the OOD inputs with the same model and num_samples; "
            "an (N, C) tensor counts as one draw (if it is the mean of as many draws as the "
            "other set, the scores compare and this warning can be ignored)."
        ]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # as many draws: no warning
            assert one == evaluate(many, y, ood=many, ood_score=score)["ood_auroc"]
        assert 0 <= one <= 1
    with pytest.warns(UserWarning, match=r"predictions 1: the default ood_score, 'entropy', "
                      r"scores the mean prediction"):  # fmt: skip
        evaluate(many[0], y, ood=many[:2])
    # and it matters: the entropy of the mean of 32 Dirichlet draws exceeds one draw's, so
    # the same inputs, as 32 draws against 1, look OOD (AUROC 0.5 with as many draws)
    wide = dirichlet(32, 400, 10)
    with pytest.warns(UserWarning, match="lean toward calling the set of more draws OOD"):
        assert (
            evaluate(wide[:1], torch.zeros(400, dtype=torch.long), ood=wide, ood_score="entropy")[
                "ood_auroc"
            ]
            > 0.9
        )


def test_format_table():
    m = evaluate(FOUR, FOUR_Y, ood=f64([[0.5, 0.5]]), ood_score="entropy")
    m["my_metric"] = 0.123456
    text = format_table(m)
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1  # a rectangle
    titles = ["Classification", "Calibration", "Selective classification", "Uncertainty", "OOD"]
    positions = [text.index(f"│ {t} ") for t in [*titles, "Other"]]
    assert positions == sorted(positions)
    assert "│ Acc " in text and "75.00% │" in text
    assert f"{m['nll']:.5f} │" in text
    assert "│ ECE " in text and "22.00% │" in text
    assert "│ aECE " in text and "38.00% │" in text
    for name in ("AURC", "AUGRC", "Cov@5Risk", "Risk@80Cov", "AUROC", "AUPR", "FPR95"):
        assert f"│ {name} " in text
    assert "│ my_metric " in text and "0.12346 │" in text
    # numpy's numbers and one-number tensors as Python's, as format_rotation_table takes them
    for value in (np.float32(0.98631), torch.tensor(0.98631), np.array(0.98631), 0.98631):
        assert "│ Acc            │ 98.63% │" in format_table({"acc": value})
    assert "0.12346 │" in format_table({"nll": torch.tensor([0.123456])})
    assert "OOD" not in format_table(evaluate(FOUR, FOUR_Y))
    assert format_table({}) == ""
