"""Plots drawn into a given Axes (``ax=``), the leftovers of save_figures and
plot_training_curves, and the metrics and decompositions against numpy references."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from pyrouq import metrics
from pyrouq.infer import EpochRecord
from pyrouq.plotting import (
    plot_calibration,
    plot_regression,
    plot_reliability,
    plot_risk_coverage,
    plot_training_curves,
    save_figures,
)
from pyrouq.predictive import GaussianPredictions
from pyrouq.uncertainty import decompose

PROBS = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
TARGETS = torch.tensor([0, 0, 1, 1])


def _gaussian() -> tuple[GaussianPredictions, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    loc = torch.randn(3, 6, 1, generator=gen)
    return GaussianPredictions(loc, torch.ones(3, 6, 1)), torch.arange(6.0), torch.zeros(6)


# ---------------------------------------------------------------------------------------------
# ax=


def _one_axes_plots():
    gauss, x, y = _gaussian()
    return {
        "plot_reliability": lambda **kw: plot_reliability(PROBS, TARGETS, **kw),
        "plot_risk_coverage": lambda **kw: plot_risk_coverage(PROBS, TARGETS, **kw),
        "plot_regression": lambda **kw: plot_regression(gauss, x, **kw),
        "plot_calibration": lambda **kw: plot_calibration(gauss, y, **kw),
    }


@pytest.mark.parametrize("name", list(_one_axes_plots()))
def test_ax_draws_into_the_given_axes_and_makes_no_figure(name):
    draw = _one_axes_plots()[name]
    own = draw()  # ax=None: a figure of its own, as before
    title = own.axes[0].get_title()
    plt.close(own)
    fig, axes = plt.subplots(1, 2)
    try:
        before = plt.get_fignums()
        out = draw(ax=axes[1])
        assert plt.get_fignums() == before  # no figure made
        assert out is fig
        assert fig.axes == list(axes)  # nothing added, e.g. no histogram below the diagram
        assert axes[1].get_title() == title
        assert not axes[0].lines and not axes[0].patches and axes[0].get_title() == ""
    finally:
        plt.close(fig)


def test_reliability_default_keeps_both_axes_and_ax_draws_the_diagram_alone():
    own = plot_reliability(PROBS, TARGETS)
    assert len(own.axes) == 2  # diagram and histogram, as before
    plt.close(own)
    fig, ax = plt.subplots()
    try:
        assert plot_reliability(PROBS, TARGETS, ax=ax) is fig
        assert ax.get_title() == "Reliability diagram (acc 75.00%, ECE 30.00%)"
        assert ax.get_xlabel() == "confidence (max. mean probability)"
    finally:
        plt.close(fig)


def test_ax_of_a_subfigure_returns_the_top_level_figure():
    fig = plt.figure()
    try:
        ax = fig.subfigures(1, 2)[1].add_subplot()
        assert plot_risk_coverage(PROBS, TARGETS, ax=ax) is fig
        assert ax.get_title().startswith("Risk-coverage curve (AURC ")
    finally:
        plt.close(fig)


def test_a_wrong_ax_is_refused_in_house_style():
    fig, axes = plt.subplots(1, 2)
    grid_fig, grid = plt.subplots(2, 2)
    try:
        before = plt.get_fignums()
        cases = [
            (axes, "got a numpy array of shape (2,); pass one Axes, such as axes[0], or leave"),
            (grid, "got a numpy array of shape (2, 2); pass one Axes, such as axes[0, 0]"),
            (fig, "got a Figure; pass one of its Axes, such as fig.axes[0] or fig.add_subplot()"),
            (list(axes), "got a list of 2; pass one Axes, such as axes[0]"),
            ("left", "got str; pass one Axes, such as the ax of fig, ax = plt.subplots()"),
        ]
        for bad, message in cases:
            for draw in _one_axes_plots().values():
                with pytest.raises(TypeError) as info:
                    draw(ax=bad)
                assert str(info.value).startswith(
                    "Expected ax to be one matplotlib Axes to draw into, "
                )
                assert message in str(info.value)
                assert str(info.value).endswith("or leave ax=None for a figure of its own.")
        assert plt.get_fignums() == before
    finally:
        plt.close(fig)
        plt.close(grid_fig)


# ---------------------------------------------------------------------------------------------
# save_figures and plot_training_curves


def test_save_figures_closes_every_figure_when_a_write_fails(tmp_path):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    first, second = plt.figure(), plt.figure()
    first.savefig = broken  # type: ignore[method-assign]
    with pytest.raises(OSError, match="disk full"):
        save_figures({"a": first, "b": second}, tmp_path)
    assert first.number not in plt.get_fignums()
    assert second.number not in plt.get_fignums()  # the unwritten one too
    # creating out_dir fails (its parent is a file): closed too, the error re-raised
    (tmp_path / "file").write_text("x")
    third = plt.figure()
    with pytest.raises((FileExistsError, NotADirectoryError)):
        save_figures({"c": third}, tmp_path / "file" / "sub")
    assert third.number not in plt.get_fignums()
    # a refused argument leaves the figures open, to be saved again
    fourth = plt.figure()
    with pytest.raises(ValueError, match="plain file name"):
        save_figures({"a/b": fourth}, tmp_path)
    assert fourth.number in plt.get_fignums()
    assert save_figures({"d": fourth}, tmp_path) == [tmp_path / "d.png"]
    assert fourth.number not in plt.get_fignums()


def test_training_curves_title_gives_the_last_finite_accuracy():
    history = [
        EpochRecord(1, 3.0, 2.0, 10.0, 0.5, 0.5),
        EpochRecord(2, 2.0, 1.5, 8.0, 0.93, 0.5),
        EpochRecord(3, 1.0, 0.5, 5.0, math.nan, 0.5),
    ]
    fig = plot_training_curves(history)
    try:
        assert fig.get_suptitle() == (
            "3 epochs in 1.5 s: final loss 1, KL 5, train acc 93.00% (epoch 2)"
        )
    finally:
        plt.close(fig)
    history[2] = EpochRecord(3, 1.0, 0.5, 5.0, 0.97, 0.5)  # the last finite: no epoch named
    fig = plot_training_curves(history)
    try:
        assert fig.get_suptitle().endswith("train acc 97.00%")
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Metrics against numpy


def _np_binned(conf, correct, bins):
    return sum(
        (bins == b).sum() / conf.size * abs(correct[bins == b].mean() - conf[bins == b].mean())
        for b in np.unique(bins)
    )


def _np_ece(p, y, k):
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    edges = np.arange(k + 1) / k  # each b / k correctly rounded
    bins = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, k - 1)
    return _np_binned(conf, correct, bins)


def _np_aece(p, y, k):
    conf, correct = p.max(1), (p.argmax(1) == y).astype(float)
    order = np.argsort(conf, kind="stable")
    bins = np.empty(conf.size, int)
    for b, group in enumerate(np.array_split(order, k)):
        bins[group] = b
    return _np_binned(conf, correct, bins)


def _np_expected_errors(p, y):
    """Errors among the k most confident, k = 1..N, averaged over the orders of tied inputs."""
    conf, wrong = p.max(1), (p.argmax(1) != y).astype(float)
    out = []
    for k in range(1, conf.size + 1):
        above = (conf[:, None] < conf[None, :]).sum(1)  # inputs strictly more confident
        tied = (conf[:, None] == conf[None, :]).sum(1)
        out.append((wrong * np.clip(k - above, 0, tied) / tied).sum())
    return np.array(out)


def _np_auroc(s_in, s_out):
    diff = s_out[None, :] - s_in[:, None]
    return ((diff > 0) + 0.5 * (diff == 0)).mean()


def _np_aupr(s_in, s_out):
    scores = np.r_[s_in, s_out]
    positive = np.r_[np.zeros(s_in.size), np.ones(s_out.size)]
    ap, recall_before = 0.0, 0.0
    for t in np.unique(scores)[::-1]:
        tp = positive[scores >= t].sum()
        ap += (tp / s_out.size - recall_before) * tp / (scores >= t).sum()
        recall_before = tp / s_out.size
    return ap


def _cases():
    rng = np.random.default_rng(10)
    yield np.array([[0.7, 0.3], [0.3, 0.7], [0.6, 0.4], [0.4, 0.6]]), np.array([0, 0, 1, 1])
    yield np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), np.array([0, 2, 2])
    yield np.ones((3, 1)), np.zeros(3, int)  # a single class
    yield np.array([[0.25, 0.75]]), np.array([0])  # a single example
    for n, c in ((7, 3), (20, 4), (11, 2)):
        counts = rng.integers(0, 5, (n, c)).astype(float)
        counts[:, 0] += 1  # no empty row
        yield counts / counts.sum(1, keepdims=True), rng.integers(0, c, n)  # many ties
        yield rng.dirichlet(np.ones(c), n), rng.integers(0, c, n)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_metrics_match_numpy(dtype):
    for p, y in _cases():
        probs, targets = torch.tensor(p, dtype=dtype), torch.tensor(y)
        p = probs.double().numpy()  # float32 inputs: the numbers pyrouq sees, in float64
        n = y.size
        for k in (15, 10, 3):
            assert metrics.ece(probs, targets, num_bins=k) == pytest.approx(_np_ece(p, y, k))
            assert metrics.aece(probs, targets, num_bins=k) == pytest.approx(_np_aece(p, y, k))
        onehot = np.eye(p.shape[1])[y]
        assert metrics.brier(probs, targets) == pytest.approx(((p - onehot) ** 2).sum(1).mean())
        p_true = np.maximum(p[np.arange(n), y], 1e-12)
        assert metrics.nll(probs, targets) == pytest.approx(-np.log(p_true).mean())
        assert metrics.acc(probs, targets) == pytest.approx((p.argmax(1) == y).mean())
        errors, cover = _np_expected_errors(p, y), np.arange(1, n + 1)
        assert metrics.aurc(probs, targets) == pytest.approx((errors / cover).mean())
        assert metrics.augrc(probs, targets) == pytest.approx((errors / n).mean())
        k80 = math.ceil(0.8 * n)
        assert metrics.risk_at_80_cov(probs, targets) == pytest.approx(errors[k80 - 1] / k80)
        ok = cover[errors / cover <= 0.05 + 1e-12]
        assert metrics.cov_at_5_risk(probs, targets) == pytest.approx(
            ok.max() / n if ok.size else 0.0
        )
        fig, ax = plt.subplots()
        try:  # the drawn curve: the selective risk, 1 - the accuracy at each coverage
            plot_risk_coverage(probs, targets, ax=ax)
            np.testing.assert_allclose(ax.lines[0].get_xdata(), cover / n)
            np.testing.assert_allclose(ax.lines[0].get_ydata(), errors / cover, atol=1e-12)
        finally:
            plt.close(fig)


def test_ece_bins_a_confidence_on_an_edge_into_the_bin_it_opens():
    # 0.3 is float(3/10), the edge of [0.3, 0.4) with 10 bins (torch.linspace's edge is
    # 0.30000000000000004, which would put it alone in [0.2, 0.3): ECE 0.525)
    probs = torch.tensor([[0.3, 0.25, 0.25, 0.2], [0.35, 0.3, 0.2, 0.15]], dtype=torch.float64)
    targets = torch.tensor([0, 3])  # right at 0.3, wrong at 0.35: |1/2 - 0.325| in one bin
    assert metrics.ece(probs, targets, num_bins=10) == pytest.approx(0.175)
    assert metrics.ece(probs, targets, num_bins=10) == pytest.approx(
        _np_ece(probs.numpy(), targets.numpy(), 10)
    )


def test_ood_auroc_and_aupr_with_ties_match_numpy():
    rng = np.random.default_rng(3)
    pairs = [(np.array([1.0, 2.0, 2.0, 3.0]), np.array([2.0, 3.0, 5.5]))]
    pairs += [(rng.integers(0, 4, 9) / 4, rng.integers(0, 4, 6) / 4) for _ in range(5)]
    pairs += [(np.array([0.5]), np.array([0.5])), (np.zeros(3), np.ones(1))]
    for s_in, s_out in pairs:
        for to in (torch.float64, torch.float32):
            a, b = torch.tensor(s_in, dtype=to), torch.tensor(s_out, dtype=to)
            assert metrics.ood_auroc(a, b) == pytest.approx(_np_auroc(s_in, s_out))
            assert metrics.ood_aupr(a, b) == pytest.approx(_np_aupr(s_in, s_out))
    # the worked example, by hand: AUROC 9.5 / 12, AP 1/3 + 1/3 * 2/3 + 1/3 * 1/2
    a, b = torch.tensor([1, 2, 2, 3]), torch.tensor([2.0, 3.0, 5.5])
    assert metrics.ood_auroc(a, b) == pytest.approx(9.5 / 12)
    assert metrics.ood_aupr(a, b) == pytest.approx(1 / 3 + 2 / 9 + 1 / 6)
    assert metrics.ood_fpr95(a, b) == 0.75


def _np_entropy(q):
    return -np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decompositions_match_numpy(dtype):
    rng = np.random.default_rng(5)
    tensors = [
        np.array([[[1.0, 0.0]], [[0.0, 1.0]]]),  # confident draws that disagree: log 2
        np.array([[[1.0, 0.0, 0.0]], [[1.0, 0.0, 0.0]]]),  # exact 0 and 1, agreeing
        np.ones((4, 3, 1)),  # a single class
        np.array([[[0.2, 0.8]]]),  # one draw, one example
        rng.dirichlet(np.ones(4), (5, 6)),
        np.eye(3)[rng.integers(0, 3, (4, 5))],
    ]
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    for p in tensors:
        probs = torch.tensor(p, dtype=dtype)
        p = probs.double().numpy()
        mean = p.mean(0)
        refs = {
            "entropy": (_np_entropy(mean), _np_entropy(p).mean(0)),
            "variance": ((mean * (1 - mean)).sum(-1), (p * (1 - p)).sum(-1).mean(0)),
            "zero_one": (1 - mean.max(-1), (1 - p.max(-1)).mean(0)),
        }
        for measure, (total, aleatoric) in refs.items():
            d = decompose(probs, measure)
            assert d.total.dtype == dtype
            assert torch.equal(d.total, d.aleatoric + d.epistemic)
            np.testing.assert_allclose(d.total.double().numpy(), total, atol=tol, rtol=0)
            np.testing.assert_allclose(d.aleatoric.double().numpy(), aleatoric, atol=tol, rtol=0)
            np.testing.assert_allclose(
                d.epistemic.double().numpy(), total - aleatoric, atol=tol, rtol=0
            )
        # the variance form's epistemic part is the population variance over draws
        np.testing.assert_allclose(
            decompose(probs, "variance").epistemic.double().numpy(),
            p.var(0).sum(-1),
            atol=tol,
            rtol=0,
        )
    d = decompose(torch.tensor(tensors[0]), "entropy", base=2)
    assert d.total.tolist() == [1.0] and d.epistemic.tolist() == [1.0]
    assert metrics.mutual_information(torch.tensor(tensors[0])) == pytest.approx(math.log(2))
