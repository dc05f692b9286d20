"""Audit 8 of the metrics and their plots: every metric against a numpy reference (ties,
confidences on bin edges, all right / all wrong, one class), the OOD metrics on integer,
float16 and bool scores, the input refusals, and the plots' drawn data read back."""

from __future__ import annotations

import itertools
import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

import pyrouq
from pyrouq import metrics
from pyrouq.plotting import plot_reliability, plot_risk_coverage, plot_uncertainty_distributions


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ---------------------------------------------------------------------------------------------
# numpy references, from the definitions in docs/metrics.md


def _errors_over_orders(conf: np.ndarray, wrong: np.ndarray) -> np.ndarray:
    """E_k, k = 1..N, averaged over every order of the inputs (ties broken every way)."""
    n = conf.size
    total = np.zeros(n)
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        idx = np.array(order)
        ranked = idx[np.argsort(-conf[idx], kind="stable")]
        total += np.cumsum(wrong[ranked])
    return total / len(orders)


def _reference(pbar: np.ndarray, y: np.ndarray) -> dict[str, float]:
    n, c = pbar.shape
    conf, pred = pbar.max(1), pbar.argmax(1)
    right = (pred == y).astype(float)
    out = {"acc": right.mean()}
    out["nll"] = -np.log(np.maximum(pbar[np.arange(n), y], 1e-12)).mean()
    out["brier"] = ((pbar - np.eye(c)[y]) ** 2).sum(1).mean()
    # equal width, left-closed against the float edges b / 15, 1.0 in the last bin
    bins = np.clip(np.searchsorted(np.arange(16) / 15, conf, side="right") - 1, 0, 14)
    out["ece"] = sum(
        (bins == b).sum() / n * abs(right[bins == b].mean() - conf[bins == b].mean())
        for b in range(15)
        if (bins == b).any()
    )
    order = np.argsort(conf, kind="stable")
    out["aece"] = sum(
        g.size / n * abs(right[g].mean() - conf[g].mean())
        for g in np.array_split(order, 15)
        if g.size
    )
    e = _errors_over_orders(conf, 1 - right)
    k = np.arange(1, n + 1)
    out["aurc"] = (e / k).mean()
    out["augrc"] = (e / n).mean()
    ok = np.nonzero(e / k <= 0.05 + 1e-12)[0]
    out["cov_at_5_risk"] = (ok[-1] + 1) / n if ok.size else 0.0
    top = math.ceil(0.8 * n)
    out["risk_at_80_cov"] = e[top - 1] / top
    return out


def _mean_probs(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


_EDGES = _mean_probs([[b / 15, 1 - b / 15] for b in (8, 9, 12, 14, 15)] + [[0.5, 0.5]])
_CASES = {
    # ties of confidence across right and wrong inputs, three draws in float32
    "ties_float32_draws": (
        torch.tensor(
            [
                [[0.7, 0.2, 0.1], [0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]],
                [[0.5, 0.4, 0.1], [0.5, 0.4, 0.1], [0.2, 0.5, 0.3], [0.3, 0.1, 0.6]],
                [[0.6, 0.3, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.2, 0.1, 0.7]],
            ]
        ),
        torch.tensor([0, 1, 2, 2]),
    ),
    # confidences exactly on the 15 bins' edges b / 15, 1.0 and 0.5
    "bin_edges": (_EDGES, torch.tensor([0, 1, 0, 0, 0, 1])),
    "all_right": (_EDGES, torch.tensor([0, 0, 0, 0, 0, 0])),
    "all_wrong": (_EDGES[:5], torch.tensor([1, 1, 1, 1, 1])),
    "one_class": (torch.ones(2, 5, 1), torch.zeros(5, dtype=torch.long)),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_every_metric_matches_its_numpy_definition(case):
    probs, y = _CASES[case]
    pbar = probs.double().mean(0).numpy() if probs.dim() == 3 else probs.numpy()
    expected = _reference(pbar, y.numpy())
    got = metrics.evaluate(probs, y)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
        assert getattr(metrics, key)(probs, y) == got[key], key


def test_extremes_take_their_textbook_values():
    right = metrics.evaluate(_EDGES[:5], torch.zeros(5, dtype=torch.long))
    wrong = metrics.evaluate(_EDGES[:5], torch.ones(5, dtype=torch.long))
    assert (right["acc"], right["aurc"], right["cov_at_5_risk"]) == (1.0, 0.0, 1.0)
    assert (wrong["acc"], wrong["aurc"], wrong["augrc"]) == (0.0, 1.0, pytest.approx(0.6))
    assert (wrong["cov_at_5_risk"], wrong["risk_at_80_cov"]) == (0.0, 1.0)
    # a confident wrong answer costs -log(1e-12): the last row has p̄[1] = 0
    assert wrong["nll"] == pytest.approx(
        -np.mean(np.log([7 / 15, 6 / 15, 3 / 15, 1 / 15, 1e-12])), rel=1e-12
    )
    one = metrics.evaluate(torch.ones(4, 1), torch.zeros(4, dtype=torch.long))
    assert (one["acc"], one["nll"], one["brier"], one["ece"], one["aurc"]) == (1, 0, 0, 0, 0)


def test_ece_puts_a_confidence_on_an_edge_into_the_bin_above_it():
    # confidences 1/4, 1/2, 3/4 and 1 with 4 bins: bins 1, 2, 3 and 3 (1.0 joins the last)
    probs = _mean_probs(
        [[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0, 0], [0.75, 0.25, 0, 0], [1, 0, 0, 0]]
    )
    y = torch.tensor([0, 1, 1, 0])  # right, wrong, wrong, right
    # (|1 - 1/4| + |0 - 1/2| + |(0 + 1) - (3/4 + 1)|) / 4
    assert metrics.ece(probs, y, num_bins=4) == 0.5
    assert metrics.ece(probs, y, num_bins=2) == pytest.approx((0.75 + 0.5 + 0.75) / 4)
    assert metrics.ece(probs, y, num_bins=1) == pytest.approx(abs(2 - 2.5) / 4)

    fig = plot_reliability(probs, y, num_bins=4)
    ax, ax_n = fig.axes
    heights = [bar.get_height() for bar in ax.containers[0]]
    gaps = [bar.get_height() for bar in ax.containers[1]]
    assert np.isnan(heights[0]) and heights[1:] == [1.0, 0.0, 0.5]
    assert gaps[1:] == [-0.75, 0.5, 0.375]  # mean confidence minus accuracy
    assert [bar.get_height() for bar in ax_n.containers[0]] == [0.0, 0.25, 0.25, 0.5]
    assert [bar.get_x() + bar.get_width() / 2 for bar in ax_n.containers[0]] == [
        0.125,
        0.375,
        0.625,
        0.875,
    ]
    assert ax.get_title() == "Reliability diagram (acc 50.00%, ECE 50.00% (15 bins))"
    assert (ax.get_ylabel(), ax_n.get_xlabel(), ax_n.get_ylabel()) == (
        "accuracy",
        "confidence (max. mean probability)",
        "fraction",
    )


# ---------------------------------------------------------------------------------------------
# OOD metrics


def _pairwise_auroc(a: np.ndarray, o: np.ndarray) -> float:
    return float(np.mean([(x > w) + 0.5 * (x == w) for x in o for w in a]))


def test_ood_auroc_is_the_mann_whitney_value_with_half_credit_for_ties():
    rng = np.random.default_rng(8)
    a, o = rng.integers(0, 4, 9).astype(float), rng.integers(1, 5, 7).astype(float)
    assert len(set(a) & set(o)) > 1  # ties across the two sets
    expected = _pairwise_auroc(a, o)
    assert metrics.ood_auroc(torch.tensor(a), torch.tensor(o)) == pytest.approx(expected)
    # one tie only: half credit
    one = torch.tensor([1.0])
    assert (metrics.ood_auroc(one, one), metrics.ood_aupr(one, one)) == (0.5, 0.5)
    assert metrics.ood_fpr95(one, one) == 1.0


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float16])
def test_ood_metrics_of_integer_and_half_scores_equal_those_of_float64(dtype):
    s_in, s_out = torch.tensor([0, 3, 3, 7, 1]), torch.tensor([3, 9, 7, 7])
    fns = (metrics.ood_auroc, metrics.ood_aupr, metrics.ood_fpr95)
    exact = [fn(s_in.double(), s_out.double()) for fn in fns]
    assert [fn(s_in.to(dtype), s_out.to(dtype)) for fn in fns] == exact
    assert [fn(s_in.to(dtype), s_out.double()) for fn in fns] == exact  # mixed dtypes
    # AUROC by hand: 3 beats 0, 1 and ties two 3s; 9 beats all; each 7 beats 0, 3, 3, 1, ties 7
    assert exact[0] == pytest.approx((2 + 1 + 5 + 4.5 + 4.5) / 20)
    assert metrics.ood_auroc(torch.tensor([False, True]), torch.tensor([True])) == 0.75


def test_integer_scores_above_2_to_the_53_rank_exactly():
    big = 2**53
    s_in = torch.tensor([big + 1, big + 3])
    s_out = torch.tensor([big + 2, big + 4])
    # as float64 these would be 2**53, 2**53 + 4 vs 2**53 + 2, 2**53 + 4: a false tie (0.625)
    assert metrics.ood_auroc(s_in, s_out) == 0.75
    # thresholds +4 (P 1, R 1/2), +3, +2 (P 2/3, R 1): AP = 1/2 + 1/3
    assert metrics.ood_aupr(s_in, s_out) == pytest.approx(1 / 2 + 1 / 3)
    assert metrics.ood_fpr95(s_in, s_out) == 0.5  # TPR reaches 1 at +2, above it: +3


# ---------------------------------------------------------------------------------------------
# Inputs: predictions objects, numpy, dtypes, refusals


def test_predictions_objects_and_raw_tensors_give_the_same_numbers():
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(4, 11, 3, generator=g), -1)
    y = torch.randint(0, 3, (11,), generator=g)
    ood = torch.softmax(3 * torch.randn(4, 6, 3, generator=g), -1)
    raw = metrics.evaluate(probs, y, ood)
    preds = pyrouq.Predictions.from_probs(probs, y)
    assert preds.evaluate(ood=pyrouq.Predictions.from_probs(ood)) == raw
    assert metrics.evaluate(preds, ood=ood) == raw
    # (N, C) mean probabilities: the metrics of p̄ agree, those of the draws are 0
    mean = metrics.evaluate(probs.double().mean(0), y)
    for key in ("acc", "nll", "brier", "ece", "aece", "aurc", "augrc", "risk_at_80_cov"):
        assert mean[key] == pytest.approx(raw[key], abs=1e-15), key
    assert (mean["disagreement"], mean["mutual_information"]) == (0.0, 0.0)


def test_numpy_half_and_empty_probabilities_are_refused_with_what_to_do():
    p = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    y = torch.tensor([0, 1])
    with pytest.raises(TypeError, match=r"got ndarray; pass torch\.as_tensor\(probs\)"):
        metrics.ece(p.numpy(), y)
    with pytest.raises(TypeError, match=r"got ndarray; pass torch\.as_tensor\(predictions\)"):
        metrics.evaluate(p.numpy(), y)
    with pytest.raises(TypeError, match=r"targets to be a torch\.Tensor .* got ndarray"):
        metrics.acc(p, y.numpy())
    with pytest.raises(TypeError, match=r"float32 or torch\.float64, got torch\.float16.*double"):
        metrics.brier(p.half(), y)
    with pytest.raises(ValueError, match=r"non-empty probs, got shape \(0, 2\)"):
        metrics.nll(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"finite probs, got 1 NaN or inf entries"):
        metrics.aurc(torch.tensor([[math.nan, 0.5], [0.5, 0.5]]), y)
    with pytest.raises(ValueError, match=r"finite scores_out, got NaN or inf"):
        metrics.ood_auroc(torch.ones(2), torch.tensor([1.0, math.inf]))
    with pytest.raises(ValueError, match=r"scores_in of shape \(M,\) with M >= 1.*shape \(0,\)"):
        metrics.ood_aupr(torch.ones(0), torch.ones(2))


def test_one_hot_integer_targets_are_told_to_take_the_argmax():
    p = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    onehot = torch.tensor([[1, 0], [0, 1], [0, 1]])
    with pytest.raises(ValueError, match=r"got shape \(3, 2\); one-hot .*targets\.argmax\(-1\)"):
        metrics.acc(p, onehot)
    with pytest.raises(ValueError, match=r"targets\.argmax\(-1\)"):
        pyrouq.Predictions.from_probs(p[None], onehot)
    with pytest.raises(ValueError, match=r"got shape \(2,\); pass the labels of exactly"):
        metrics.acc(p, torch.tensor([0, 1]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_one_hot_bool_or_float_targets_are_told_an_argmax_that_runs(dtype):
    # bool one-hot labels were told "targets.argmax(-1)" (coverage()) or "argmax one-hot
    # targets over the last dim" (the metrics), which torch refuses: "argmax(): does not
    # support bool input". The advice, taken as written, now gives the labels.
    p = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    labels = torch.tensor([0, 1, 1])
    onehot = torch.nn.functional.one_hot(labels, 2).to(dtype)
    sets = torch.tensor([[True, False], [False, True], [True, False]])
    for call, name in (
        (lambda y: metrics.acc(p, y), "targets"),
        (lambda y: pyrouq.Predictions.from_probs(p[None], y), "targets"),
        (lambda y: pyrouq.coverage(sets, y), "labels"),
    ):
        with pytest.raises((TypeError, ValueError)) as err:
            call(onehot)
        advice = re.search(
            rf"one-hot targets\? pass their class indices, ({name}\S*)\.$", str(err.value)
        )
        assert advice is not None, str(err.value)
        assert torch.equal(eval(advice.group(1), {name: onehot}), labels)  # as written
    assert metrics.acc(p, labels) == pytest.approx(2 / 3)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_one_hot_rows_of_another_width_are_told_an_argmax_that_runs(dtype):
    # one-hot bool rows narrower than the classes (labels 0..1 of 3 classes) were told
    # "argmax one-hot targets over the last dim", which torch refuses for bools
    p = torch.tensor([[0.9, 0.05, 0.05], [0.2, 0.7, 0.1], [0.5, 0.3, 0.2]])
    labels = torch.tensor([0, 1, 1])
    onehot = torch.nn.functional.one_hot(labels, 2).to(dtype)
    with pytest.raises(TypeError) as err:
        metrics.acc(p, onehot)
    advice = re.search(r"for one-hot rows, (targets\S*)\)\.$", str(err.value))
    assert advice is not None, str(err.value)
    assert torch.equal(eval(advice.group(1), {"targets": onehot}), labels)  # as written
    assert metrics.acc(p, eval(advice.group(1), {"targets": onehot})) == pytest.approx(2 / 3)


def test_an_ood_class_mismatch_names_the_shape_that_was_passed():
    p = torch.full((2, 4, 2), 0.5)
    y = torch.zeros(4, dtype=torch.long)
    ood = torch.full((3, 3), 1 / 3)  # (M, C): one draw of three classes
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"C=2 classes .*got shape \(3, 3\); score both"):
        metrics.evaluate(p[0], y, ood)
    with pytest.raises(ValueError, match=r"C=2 classes like in_dist, got shape \(3, 3\);"):
        plot_uncertainty_distributions(p[0], ood)
    with pytest.raises(ValueError, match=r"got shape \(1, 3, 3\)"):  # a Predictions: its probs
        metrics.evaluate(p, y, pyrouq.Predictions.from_probs(ood[None]), "entropy")
    assert plt.get_fignums() == before  # refused before any figure is made


# ---------------------------------------------------------------------------------------------
# Plots: the drawn data are the metrics' numbers


def test_risk_coverage_draws_the_tie_averaged_curve_by_hand():
    # confidences 0.9, 0.9 (one right, one wrong) and 0.6 (right)
    probs = _mean_probs([[0.9, 0.1], [0.9, 0.1], [0.4, 0.6]])
    y = torch.tensor([0, 1, 1])
    for given in (probs, pyrouq.Predictions.from_probs(probs[None], y)):
        fig = plot_risk_coverage(given, None if given is not probs else y)
        ax = fig.axes[0]
        model, best, random, point = ax.lines
        np.testing.assert_allclose(model.get_xdata(), [1 / 3, 2 / 3, 1])
        np.testing.assert_allclose(model.get_ydata(), [0.5, 0.5, 1 / 3])  # E_1 = 1/2, E_2 = 1
        np.testing.assert_allclose(best.get_ydata(), [0, 0, 1 / 3])
        np.testing.assert_allclose(random.get_ydata(), [1 / 3, 1 / 3])
        assert (list(point.get_xdata()), list(point.get_ydata())) == ([1.0], [1 / 3])
        assert metrics.aurc(probs, y) == pytest.approx(4 / 9)
        assert ax.get_title() == "Risk-coverage curve (AURC 44.44%)"
        assert model.get_label() == "model (AURC 44.44%)"
        assert best.get_label() == "optimal (AURC 11.11%)"
        assert point.get_label() == "Risk@80Cov 33.33%"
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("coverage", "selective risk (error rate)")
        plt.close(fig)


def test_uncertainty_ecdfs_are_the_decompositions_and_titles_the_evaluated_aurocs():
    g = torch.Generator().manual_seed(5)
    p_in = torch.softmax(2 * torch.randn(3, 9, 4, generator=g), -1)
    p_out = torch.softmax(0.5 * torch.randn(3, 6, 4, generator=g), -1)
    fig = plot_uncertainty_distributions(p_in, p_out, kind="ecdf")
    parts_in = pyrouq.decompose(p_in.double())
    parts_out = pyrouq.decompose(p_out.double())
    y = torch.zeros(9, dtype=torch.long)
    scores = {"total": "entropy", "epistemic": "mutual_information"}
    for ax, name in zip(fig.axes, ("total", "aleatoric", "epistemic"), strict=True):
        line_in, line_out = ax.lines
        for line, parts in ((line_in, parts_in), (line_out, parts_out)):
            values = np.sort(getattr(parts, name).numpy())
            xs = np.concatenate([values[:1], values])  # the jump from 0 at the first too
            np.testing.assert_allclose(line.get_xdata(), xs, rtol=1e-12, atol=1e-15)
            n = values.size
            np.testing.assert_allclose(line.get_ydata(), np.arange(n + 1) / n)
        assert (line_in.get_label(), line_out.get_label()) == ("in-distribution", "OOD")
        assert ax.get_ylabel() == "fraction of inputs ≤ x"
        assert ax.get_xlabel() == f"{name} uncertainty"
        if name in scores:
            auroc = metrics.evaluate(p_in, y, p_out, scores[name])["ood_auroc"]
            assert ax.get_title() == f"{name} (entropy)\nOOD AUROC {auroc:.2%}"
    fig = plot_uncertainty_distributions(p_in, p_out)
    assert {ax.get_ylabel() for ax in fig.axes} == {"density"}


def test_uncertainty_ecdfs_start_from_0_as_matplotlibs_ecdf_draws_them():
    # the step began at 1/N at the smallest value: one input drew a lone point, nothing at all
    p = torch.tensor([[[0.3, 0.7], [0.5, 0.5], [0.9, 0.1]], [[0.6, 0.4], [0.5, 0.5], [0.8, 0.2]]])
    for n in (1, 3):
        fig = plot_uncertainty_distributions(p[:, :n], kind="ecdf")
        for ax, name in zip(fig.axes[:2], ("total", "aleatoric"), strict=True):
            (line,) = ax.lines
            values = getattr(pyrouq.decompose(p[:, :n].double()), name).numpy()
            _, ref = plt.subplots()
            want = ref.ecdf(values)  # matplotlib's own ECDF of the same values
            np.testing.assert_allclose(line.get_xdata(), want.get_xdata(), rtol=1e-12)
            np.testing.assert_allclose(line.get_ydata(), want.get_ydata())
            assert line.get_drawstyle() == want.get_drawstyle() == "steps-post"
            assert line.get_ydata()[0] == 0.0 and line.get_ydata()[-1] == 1.0
            plt.close(ref.figure)
        plt.close(fig)


def test_refused_plots_leave_no_figure_open():
    probs = _mean_probs([[0.9, 0.1], [0.3, 0.7]])
    y = torch.tensor([0, 0])
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"num_bins <= 1000"):
        plot_reliability(probs, y, num_bins=1001)
    with pytest.raises(ValueError, match=r"targets in \[0, 2\)"):
        plot_risk_coverage(probs, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"No targets"):
        plot_reliability(pyrouq.Predictions.from_probs(probs[None]))
    with pytest.raises(ValueError, match=r"bins to be a positive integer, got 0"):
        plot_uncertainty_distributions(probs, bins=0)
    assert plt.get_fignums() == before
