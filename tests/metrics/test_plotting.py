from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba

import pyrouq
from pyrouq import metrics
from pyrouq.data import MNIST_MEAN, MNIST_STD, mnist_arrays
from pyrouq.infer import EpochRecord, FitResult
from pyrouq.plotting import (
    MAX_BARS,
    plot_image_grid,
    plot_most_uncertain,
    plot_regression,
    plot_reliability,
    plot_risk_coverage,
    plot_rotation,
    plot_training_curves,
    plot_uncertainty_distributions,
    save_figures,
)
from pyrouq.predictive import GaussianPredictions, Predictions
from pyrouq.uncertainty import decompose

N, C = 12, 10


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _probs(s: int, n: int = N, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(s, n, C, generator=g), -1)


@pytest.fixture
def preds():
    return Predictions.from_probs(_probs(3))


@pytest.fixture
def targets():
    return torch.randint(0, C, (N,), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def raw_images():
    return mnist_arrays("test")[0][:N]  # uint8 (N, 28, 28)


@pytest.fixture
def images(raw_images):  # normalised, as the loaders serve them
    return ((raw_images.float() / 255 - MNIST_MEAN) / MNIST_STD).unsqueeze(1)


def _rows():
    return [
        {
            "angle": float(a),
            "acc": 0.99 - a / 200,
            "ece": a / 400,
            "epistemic": a / 1e3,
            "total": a / 1e2,
        }
        for a in range(0, 181, 15)
    ]


# ---------------------------------------------------------------------------------------------
# Predictions and images


def test_most_uncertain_ranks_by_the_chosen_component(preds, images, targets):
    fig = plot_most_uncertain(preds, images, targets=targets, k=4)
    assert len(fig.axes) == 8
    epistemic = preds.uncertainty("entropy").epistemic
    expected = torch.argsort(epistemic, descending=True)[:4].tolist()
    for row, i in enumerate(expected):
        ax_img, ax_p = fig.axes[2 * row], fig.axes[2 * row + 1]
        pred = int(preds.predicted[i])
        assert ax_img.get_title() == f"#{i} true {int(targets[i])} pred {pred}"
        assert ax_p.get_title() == f"epistemic entropy = {float(epistemic[i]):.4f}"
        assert len(ax_p.containers) == 3  # one bar group per member
        heights = [bar.get_height() for bar in ax_p.containers[1]]
        np.testing.assert_allclose(heights, preds.probs[1, i].numpy(), rtol=1e-6)

    total = preds.uncertainty("variance").total
    fig = plot_most_uncertain(preds, images, k=1, measure="variance", component="total")
    assert fig.axes[0].get_title().startswith(f"#{int(total.argmax())} pred")  # no targets


def test_most_uncertain_takes_the_targets_third_as_the_image_grid_does(preds, images, targets):
    # plot_image_grid(preds, x, y) is the README's call; the same three arguments to
    # plot_most_uncertain raised "takes 2 positional arguments but 3 were given"
    fig = plot_most_uncertain(preds, images, targets, k=3)
    order = torch.argsort(decompose(preds.probs.double()).epistemic, descending=True)[:3]
    assert [ax.get_title() for ax in fig.axes[::2]] == [
        f"#{i} true {int(targets[i])} pred {int(preds.predicted[i])}" for i in order.tolist()
    ]
    grid = plot_image_grid(preds, images, targets)  # its titles: the same truth
    assert [t.get_text().split("\n")[0] for t in grid.axes[0].texts[:N]] == [
        f"GT {int(t)} / P {int(p)}" for t, p in zip(targets, preds.predicted, strict=True)
    ]


def test_most_uncertain_ranks_in_float64_as_its_docstring_says():
    # two inputs of one epistemic entropy in float32 (0.43376511 both: by input order, #0
    # first) whose float64 values order #1 first; the docstring named uncertainty(), float32
    g = torch.Generator().manual_seed(0)
    for _ in range(40):  # the 40th pair of the stream: a near-tie
        a = torch.softmax(torch.randn(4, 1, 5, generator=g), -1)
        b = a + torch.randn(4, 1, 5, generator=g) * 1e-6
    p = torch.cat([a, b / b.sum(-1, keepdim=True)], 1).float()
    in32 = Predictions.from_probs(p).uncertainty().epistemic
    in64 = decompose(p.double()).epistemic
    assert float(in32[0]) == float(in32[1]) and float(in64[1]) > float(in64[0])
    fig = plot_most_uncertain(Predictions.from_probs(p), torch.rand(2, 1, 28, 28), k=2)
    assert [ax.get_title() for ax in fig.axes[::2]] == ["#1 pred 0", "#0 pred 0"]
    assert "decompose(predictions.probs.double(), measure)" in " ".join(
        plot_most_uncertain.__doc__.split()
    )


def test_most_uncertain_many_draws_one_draw_and_k_above_n(images):
    many = Predictions.from_probs(_probs(MAX_BARS + 2))
    fig = plot_most_uncertain(many, images, k=100)
    assert len(fig.axes) == 2 * N
    assert len(fig.axes[1].lines) == MAX_BARS + 2 + 1  # one line per draw, plus the mean
    fig = plot_most_uncertain(_probs(1)[0], images.flatten(1), k=2)  # (N, C) and (N, 784)
    assert len(fig.axes) == 4


@pytest.mark.parametrize(("s", "c", "bars", "ticks"), [(10, 30, 10, {30}), (4, 100, 0, {3, 11})])
def test_most_uncertain_of_many_classes_draws_lines_and_a_few_ticks(s, c, bars, ticks):
    # ImageNet's 1000 classes: every class a tick (labels merged into a black band), 4000
    # bars of 0.1 pixel per chart (19 s for k=8); up to 300 bars and 30 classes as before
    p = torch.softmax(torch.randn(s, 3, c, generator=torch.Generator().manual_seed(0)), -1)
    ax = plot_most_uncertain(p, torch.rand(3, 1, 4, 4), k=1).axes[1]
    assert (len(ax.containers), len(ax.lines)) == (bars, 1 if bars else s + 1)
    low, high = ax.get_xlim()
    shown = [t for t in ax.get_xticks() if low <= t <= high]
    assert min(ticks) <= len(shown) <= max(ticks) and all(float(t).is_integer() for t in shown)
    many = plot_most_uncertain(torch.ones(1, 1, 1000) / 1000, torch.rand(1, 4, 4)).axes[1]
    assert 3 <= len([t for t in many.get_xticks() if 0 <= t <= 999]) <= 11
    assert many.get_legend_handles_labels()[1] == ["1 draw", "mean"]
    assert (ax.lines[-1].get_marker(), many.lines[-1].get_marker()) == (
        "." if c <= 30 else "None",  # the mean: a dot per class up to 30 classes
        "None",
    )


def test_image_grid_titles_show_truth_prediction_and_std(preds, images, targets):
    fig = plot_image_grid(preds, images, targets, rows=2, cols=3)
    (ax,) = fig.axes  # one axes holds the cells
    assert len(ax.images) == len(ax.texts) == 6
    top = preds.probs.gather(-1, preds.predicted.view(1, N, 1).expand(3, N, 1))
    std = top.squeeze(-1).std(0, correction=0)
    for i, title in enumerate(ax.texts):
        pred, truth = int(preds.predicted[i]), int(targets[i])
        assert title.get_text() == f"GT {truth} / P {pred}\nσ {float(std[i]):.3f}"
        assert title.get_color() == ("tab:red" if pred != truth else "black")
    # row-major cells of 1.4 x 1.75 inches, below a 0.5 inch band for the title: image 4
    # (row 1, column 1) starts 1.4 + 0.075 inches from the left, 0.5 + 1.75 + 0.4 from the top
    left, right, bottom, top_edge = ax.images[4].get_extent()
    assert (left, top_edge) == pytest.approx((1.475, 2.65))
    assert (right - left, bottom - top_edge) == pytest.approx((1.25, 1.25))  # square pixels
    assert ax.get_xlim() == pytest.approx((0.0, 4.2)) and ax.get_ylim() == pytest.approx((4.0, 0.0))

    # more cells than inputs: the extra cells stay blank; targets come from the Predictions
    with_targets = Predictions.from_probs(preds.probs, targets)
    fig = plot_image_grid(with_targets, images, rows=4, cols=4)
    assert len(fig.axes[0].images) == len(fig.axes[0].texts) == N
    assert fig.axes[0].texts[0].get_text().startswith(f"GT {int(targets[0])} / P ")
    fig = plot_image_grid(preds, images, rows=1, cols=2)  # no targets anywhere
    assert fig.axes[0].texts[0].get_text().startswith("P ")
    assert fig.get_suptitle() == "GT, P and σ over S = 3 draws"  # the short title of a narrow grid


def test_images_are_shown_unnormalised(preds, images, raw_images):
    shown = []
    for imgs in (images, raw_images, raw_images.float() / 255, images.flatten(1).numpy()):
        fig = plot_image_grid(preds, imgs, rows=1, cols=1)
        shown.append(np.asarray(fig.axes[0].images[0].get_array()))
    for other in shown[1:]:
        np.testing.assert_allclose(other, shown[0], atol=1e-5)
    assert shown[0].min() == 0.0 and shown[0].max() == pytest.approx(1.0)
    # an explicit normalized=False shows normalised pixels as they are (clipped to [0, 1])
    fig = plot_image_grid(preds, images, rows=1, cols=1, normalized=False)
    arr = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_allclose(arr, images[0, 0].clamp(0, 1).numpy())


# ---------------------------------------------------------------------------------------------
# Calibration and selective prediction


def test_reliability_title_and_bars_agree_with_ece(preds, targets):
    ece = metrics.ece(preds, targets)
    acc = metrics.acc(preds, targets)
    fig = plot_reliability(preds, targets)
    assert len(fig.axes) == 2
    assert fig.axes[0].get_title() == f"Reliability diagram (acc {acc:.2%}, ECE {ece:.2%})"
    acc_bars, gap_bars = fig.axes[0].containers
    fractions = np.array([bar.get_height() for bar in fig.axes[1].containers[0]])
    gaps = np.array([bar.get_height() for bar in gap_bars])
    assert len(acc_bars) == metrics.NUM_BINS
    assert fractions.sum() == pytest.approx(1.0)
    assert np.nansum(fractions * np.abs(gaps)) == pytest.approx(ece, abs=1e-12)

    fig = plot_reliability(preds.mean_probs, targets, num_bins=10)  # (N, C) input
    assert len(fig.axes[0].containers[0]) == 10
    assert fig.axes[0].get_title().endswith(f"ECE {ece:.2%} (15 bins))")
    with_targets = Predictions.from_probs(preds.probs, targets)
    assert plot_reliability(with_targets).axes[0].get_title().endswith(f"ECE {ece:.2%})")


def test_risk_coverage_title_and_curve_agree_with_aurc(preds, targets):
    aurc = metrics.aurc(preds, targets)
    fig = plot_risk_coverage(preds, targets)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_title() == f"Risk-coverage curve (AURC {aurc:.2%})"
    curve = ax.lines[0]
    np.testing.assert_allclose(curve.get_xdata(), np.arange(1, N + 1) / N)
    assert np.mean(curve.get_ydata()) == pytest.approx(aurc, abs=1e-12)
    assert curve.get_ydata()[-1] == pytest.approx(1 - metrics.acc(preds, targets))
    labels = ax.get_legend_handles_labels()[1]
    assert f"Risk@80Cov {metrics.risk_at_80_cov(preds, targets):.2%}" in labels


# ---------------------------------------------------------------------------------------------
# Uncertainty, training, rotation


@pytest.mark.parametrize("kind", ["hist", "ecdf"])
def test_uncertainty_distributions_in_vs_ood(preds, targets, kind):
    ood = Predictions.from_probs(_probs(3, n=7, seed=5, scale=0.5))
    fig = plot_uncertainty_distributions(preds, ood, kind=kind)
    assert len(fig.axes) == 3
    titles = [ax.get_title() for ax in fig.axes]
    by_mi = metrics.evaluate(preds, targets, ood=ood)["ood_auroc"]
    by_entropy = metrics.evaluate(preds, targets, ood=ood, ood_score="entropy")["ood_auroc"]
    assert titles[0] == f"total (entropy)\nOOD AUROC {by_entropy:.2%}"
    assert titles[1].startswith("aleatoric (entropy)\nOOD AUROC ")
    assert titles[2] == f"epistemic (entropy)\nOOD AUROC {by_mi:.2%}"
    if kind == "ecdf":
        ys = fig.axes[0].lines[0].get_ydata()  # from 0 at the smallest value
        np.testing.assert_allclose(ys, np.arange(N + 1) / N)

    fig = plot_uncertainty_distributions(preds.probs, measure="zero_one")
    assert [ax.get_title() for ax in fig.axes] == [
        "total (zero_one)",
        "aleatoric (zero_one)",
        "epistemic (zero_one)",
    ]


def test_uncertainty_distributions_total_panel_ties_as_evaluate_does():
    # one input whose draws agree and one whose draws disagree, of the same mean p̄: H(p̄)
    # ties (AUROC 0.5); aleatoric + epistemic rounds one of them a step lower
    a, d = 0.49850263595581057, 0.1536443591117859
    p_in = torch.tensor([[[a, 1 - a]], [[a, 1 - a]]], dtype=torch.float64)
    p_out = torch.tensor([[[a + d, 1 - a - d]], [[a - d, 1 - a + d]]], dtype=torch.float64)
    assert torch.equal(p_in.mean(0), p_out.mean(0))
    parts_in, parts_out = decompose(p_in), decompose(p_out)
    assert float(parts_in.total) != float(parts_out.total)  # the rounding the panel must not see
    assert (
        metrics.evaluate(p_in, torch.tensor([1]), ood=p_out, ood_score="entropy")["ood_auroc"]
        == 0.5
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no zero-width bins for a range of one rounding step
        fig = plot_uncertainty_distributions(p_in, p_out)
    assert fig.axes[0].get_title() == "total (entropy)\nOOD AUROC 50.00%"


def test_uncertainty_distributions_across_draw_counts_warn_as_evaluate_does():
    # they were refused for all panels, where evaluate(ood_score="entropy") warns: the total
    # panel (the mean prediction's entropy) now warns in evaluate()'s words, the aleatoric
    # panel (a mean over the draws) compares, the epistemic one (refused by evaluate) draws
    # the in-distribution series alone and says why
    p_in = torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]])  # 2 draws that disagree
    with pytest.warns(UserWarning) as told:
        metrics.evaluate(p_in, torch.tensor([0]), ood=p_in[0], ood_score="entropy")
    with pytest.warns(UserWarning) as plotted:
        fig = plot_uncertainty_distributions(p_in, p_in[0])
    words = str(told[0].message).replace("ood_score='entropy'", "the total panel")
    assert [str(w.message) for w in plotted] == [words]
    assert "the total panel scores the mean prediction, which is less certain" in words
    assert [ax.get_title() for ax in fig.axes] == [
        "total (entropy)\nOOD AUROC 0.00%",  # ln 2 in distribution, H(0.9) out: the bias
        "aleatoric (entropy)\nOOD AUROC 50.00%",  # H(0.9) both
        # (it said "S = 1 vs 2", the OOD draws first, unnamed)
        "epistemic (entropy)\nOOD not drawn: S = 2 (in-distribution)\nvs 1 (OOD)",
    ]
    assert [len(ax.get_legend().get_texts()) for ax in fig.axes] == [2, 2, 1]
    plt.close(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as many draws: no warning, every panel compared
        fig = plot_uncertainty_distributions(p_in, p_in.flip(-1))
    assert fig.axes[2].get_title() == "epistemic (entropy)\nOOD AUROC 50.00%"
    plt.close(fig)


def test_training_curves():
    history = tuple(
        EpochRecord(
            epoch=e, loss=100.0 / e, nll=50.0 / e, kl=10.0 + e, train_acc=0.9 + e / 100, seconds=0.5
        )
        for e in (1, 2, 3)
    )
    result = FitResult(history=history, num_data=10, kl_weight=1.0, num_particles=1, steps=3)
    fig = plot_training_curves(result)
    assert len(fig.axes) == 3
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [100.0, 50.0, 100.0 / 3])
    np.testing.assert_allclose(fig.axes[1].lines[0].get_ydata(), [11.0, 12.0, 13.0])
    np.testing.assert_allclose(fig.axes[2].lines[0].get_ydata(), [91.0, 92.0, 93.0])
    assert fig.get_suptitle() == ("3 epochs in 1.5 s: final loss 33.333, KL 13, train acc 93.00%")
    assert len(plot_training_curves(list(history[:1])).axes) == 3  # a plain list of records
    regression = [dataclasses.replace(r, train_acc=float("nan")) for r in history]  # no accuracy
    fig = plot_training_curves(regression)
    assert len(fig.axes) == 2
    assert fig.get_suptitle() == "3 epochs in 1.5 s: final loss 33.333, KL 13"


def test_rotation_plot():
    rows = _rows()
    fig = plot_rotation(list(reversed(rows)))  # any order: plotted by angle
    assert len(fig.axes) == 3
    assert fig.axes[0].get_title() == "Accuracy 99.00% at 0°, 9.00% at 180°"
    np.testing.assert_allclose(fig.axes[0].lines[0].get_xdata(), np.arange(0, 181, 15))
    np.testing.assert_allclose(fig.axes[1].lines[0].get_ydata(), np.arange(0, 181, 15) / 1e3)
    np.testing.assert_allclose(fig.axes[2].lines[0].get_ydata(), np.arange(0, 181, 15) / 1e2)


@pytest.mark.parametrize(
    ("last", "by", "labelled"),
    [
        (360, 5, [0, 60, 120, 180, 240, 300, 360]),  # every 11th: 0, 55, ..., 330, no 360
        (55, 5, [0, 10, 20, 30, 40, 50, 55]),  # every 2nd: 0, 10, ..., 50, no 55
        (35, 5, [0, 10, 20, 30, 35]),
        (360, 15, [0, 60, 120, 180, 240, 300, 360]),
        (360, 30, [0, 60, 120, 180, 240, 300, 360]),
        (0, 5, [0]),  # one angle, labelled once
    ],
)
def test_rotation_plot_labels_the_last_angle(last, by, labelled):
    angles = range(0, last + 1, by)
    rows = [{"angle": a, "acc": 0.5, "ece": 0.1, "epistemic": 0.1, "total": 0.2} for a in angles]
    fig = plot_rotation(rows)
    for ax in fig.axes:
        np.testing.assert_array_equal(ax.get_xticks(), labelled)
    plt.close(fig)


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("angle", float("inf"), r"NaN or infinite values \(angle=inf"),
        ("angle", float("nan"), r"NaN or infinite values \(angle=nan"),
        ("acc", torch.tensor(float("nan")), r"NaN or infinite values \(acc=tensor\(nan\)"),
        # (10**400 is finite, no float holds it: it was called "NaN or infinite")
        ("total", 10**400, r"values past a float's range \(total=about 10\*\*400"),
    ],
    ids=["inf-angle", "nan-angle", "nan-acc", "huge-total"],
)
def test_rotation_plot_refuses_values_that_are_not_finite_before_a_figure(key, value, shown):
    # an inf or NaN angle failed inside matplotlib's tick formatter ("cannot convert float
    # infinity to integer") with the figure left open; a NaN accuracy was drawn as a gap and
    # titled "nan%"
    rows = _rows()
    rows[3] = {**rows[3], key: value}
    open_before = plt.get_fignums()
    told = rf"A rotation row holds {shown}\); expected finite numbers"
    with pytest.raises(ValueError, match=told + r".* Drop or repair that row\."):
        plot_rotation(rows)
    assert plt.get_fignums() == open_before


# ---------------------------------------------------------------------------------------------
# Saving


def test_save_figures_writes_pngs_and_closes(tmp_path, preds, targets):
    figs = {
        "reliability": plot_reliability(preds, targets),
        "risk.png": plot_risk_coverage(preds, targets),
    }
    out = tmp_path / "new" / "plots"
    paths = save_figures(figs, out)
    assert paths == [out / "reliability.png", out / "risk.png"]
    for path in paths:
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    assert not any(plt.fignum_exists(fig.number) for fig in figs.values())
    assert plt.imread(paths[0]).shape[:2] == (600, 500)  # figsize (5, 6) at dpi 100
    again = {"risk": plt.figure(), "Risk.PNG": plt.figure()}
    with pytest.raises(ValueError, match=r"Figures 'risk' and 'Risk.PNG' would both be written "
                       r"to 'risk.png' and 'Risk.PNG', one file where names are compared "
                       r"without case .*Give them other names"):  # fmt: skip
        save_figures(again, out)


def test_save_figures_bad_input(tmp_path, preds, targets):
    fig = plot_risk_coverage(preds, targets)
    with pytest.raises(ValueError, match=r"plain file name .* got 'a/b'"):
        save_figures({"a/b": fig}, tmp_path)
    with pytest.raises(ValueError, match=r"got '\.hidden'"):
        save_figures({".hidden": fig}, tmp_path)
    with pytest.raises(TypeError, match=r"figures\['x'\] to be a matplotlib Figure, got str"):
        save_figures({"x": "not a figure"}, tmp_path)
    with pytest.raises(TypeError, match="Expected figures to be a dict of name -> Figure"):
        save_figures([fig], tmp_path)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # nothing written on bad input


# ---------------------------------------------------------------------------------------------
# Input checks


def test_bad_inputs(preds, images, targets):
    with pytest.raises(ValueError, match=r"Expected images with N=12 entries, .* got shape \(5, "):
        plot_most_uncertain(preds, images[:5])
    with pytest.raises(
        ValueError, match=r"\(N, 3, H, W\) \(grey or RGB\).*\(12, 2, 28, 28\); 2 channels are not"
    ):
        plot_image_grid(preds, images.expand(N, 2, 28, 28))
    with pytest.raises(TypeError, match=r"Expected images to be a torch.Tensor .* got list"):
        plot_image_grid(preds, [0] * N)
    with pytest.raises(ValueError, match="Expected k to be a positive integer, got 0"):
        plot_most_uncertain(preds, images, k=0)
    with pytest.raises(ValueError, match="Unknown component 'mutual'; expected one of 'total'"):
        plot_most_uncertain(preds, images, component="mutual")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown measure 'gini'"):
        plot_most_uncertain(preds, images, measure="gini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown kind 'kde'; expected one of 'hist', 'ecdf'"):
        plot_uncertainty_distributions(preds, kind="kde")  # type: ignore[arg-type]
    # the complementary CDF, no typo of 'ecdf' (its complement): it was asked "did you mean
    # 'ecdf'?"; the allowed kinds' own slips still are asked
    for kind, hint in [("ccdf", ""), ("CCDF", ""), ("cdf", " (did you mean 'ecdf'?)"),
                       ("Hist", " (did you mean 'hist'? the names are lower case)")]:  # fmt: skip
        told = f"Unknown kind {kind!r}{hint}; expected one of 'hist', 'ecdf'."
        with pytest.raises(ValueError, match=f"^{re.escape(told)}$"):
            plot_uncertainty_distributions(preds, kind=kind)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Expected ood with C=10 classes like in_dist"):
        plot_uncertainty_distributions(preds, torch.full((2, 4), 0.25))
    inputs = r"inputs\? plot_uncertainty_distributions\(\) scores predictions, not inputs"
    with pytest.raises(ValueError, match=r"got a tensor of shape \(2, 784\) .*the " + inputs):
        plot_uncertainty_distributions(preds, images[:2].reshape(2, -1))  # was: a softmax
    with pytest.raises(TypeError, match=r"got TensorLoader, a loader or batches of " + inputs):
        plot_uncertainty_distributions(preds, pyrouq.ood_loader(4))  # was: no .probs
    # a dict of sets was told to call evaluate() on each; a name, 'got str, a loader?'
    told = r"\{name: plot_uncertainty_distributions\(in_dist, ood=p\) for name, p in ood\.it"
    with pytest.raises(TypeError, match=r"got a dict \(keys 'svhn', 'noise'\)\. .*" + told):
        plot_uncertainty_distributions(preds, {"svhn": preds, "noise": preds})
    named = r"the string 'svhn' \(a file or a data set's name\?\)\. plot_uncertainty_distrib"
    with pytest.raises(TypeError, match=named + r"utions\(\) scores predictions, not inputs"):
        plot_uncertainty_distributions(preds, "svhn")
    with pytest.raises(
        TypeError,
        match=r"Expected predictions_or_probs to be an .* got list; "
        r"pass torch\.as_tensor\(predictions_or_probs\)\.",
    ):
        plot_reliability([[0.5, 0.5]], targets)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="No targets: pass targets="):
        plot_risk_coverage(preds)
    with pytest.raises(ValueError, match=r"Expected targets of shape \(N,\) = \(12,\)"):
        plot_reliability(preds, targets[:3])
    with pytest.raises(ValueError, match=r"Expected targets of shape \(N,\) = \(12,\)"):
        plot_most_uncertain(preds, images, targets=targets[:3])
    with pytest.raises(ValueError, match="Expected rows to be a positive integer, got -1"):
        plot_image_grid(preds, images, rows=-1)
    with pytest.raises(ValueError, match="Expected num_bins to be a positive integer, got 0"):
        plot_reliability(preds, targets, num_bins=0)
    with pytest.raises(ValueError, match="empty history"):
        plot_training_curves(())
    with pytest.raises(TypeError, match=r"Expected fit_result to be a FitResult .* got int"):
        plot_training_curves(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Expected EpochRecord entries"):
        plot_training_curves([{"loss": 1.0}])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"lacks the key\(s\) \['ece'\]"):
        plot_rotation([{"angle": 0.0, "acc": 1.0, "epistemic": 0.0, "total": 0.0}])
    with pytest.raises(ValueError, match="Expected at least one row"):
        plot_rotation([])
    # values checked before a figure is made: none is left open by a refusal
    open_before = len(plt.get_fignums())
    with pytest.raises(TypeError, match=r"A rotation row holds non-numbers \{'acc': None\}"):
        plot_rotation([{"angle": 0, "acc": None, "ece": 0.1, "epistemic": 0.1, "total": 0.1}])
    with pytest.raises(
        TypeError,
        match=r"Expected EpochRecord fields \['loss'\] to be numbers, "
        r"got None \(epoch 1\)",
    ):
        plot_training_curves([EpochRecord(1, None, 1.0, 1.0, 0.5, 1.0)])  # type: ignore[arg-type]
    gaussian = GaussianPredictions(torch.randn(2, 5, 1), torch.ones(2, 5, 1))
    x = torch.arange(5.0)
    three_targets = (
        r"Expected train_y of shape \(5, 1\) or \(5,\), one row of the 1 output\(s\) per point "
        r"of train_x, got shape \(3,\)\."
    )
    with pytest.raises(ValueError, match=three_targets):
        plot_regression(gaussian, x, train_x=x, train_y=x[:3])  # (5,) inputs, 3 targets
    assert len(plt.get_fignums()) == open_before


# ---------------------------------------------------------------------------------------------
# Lazy import and backend


def test_matplotlib_is_imported_lazily_with_agg_when_headless():
    code = (
        "import sys\n"
        "import pyrouq.plotting as P\n"
        "before = 'matplotlib' in sys.modules\n"
        "rows = [{'angle': 0.0, 'acc': 1.0, 'ece': 0.0, 'epistemic': 0.0, 'total': 0.0}]\n"
        "fig = P.plot_rotation(rows)\n"
        "import matplotlib\n"
        "print(before, 'matplotlib' in sys.modules, matplotlib.get_backend().lower())\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MPLBACKEND")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["False", "True", "agg"]


# ---------------------------------------------------------------------------------------------
# A user's style and settings


def test_what_was_black_takes_the_style_text_colour(preds, images):
    # hard-coded black vanished on plt.style.use("dark_background"): the image grid's titles
    # of right predictions, the diagonal, the Risk@80Cov point, the mean line, training points
    right = preds.probs.mean(0).argmax(-1)  # every title a right prediction's
    gauss = GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1))
    x = torch.arange(3.0)
    white = (1.0, 1.0, 1.0, 1.0)
    with plt.style.context("dark_background"):
        grid = plot_image_grid(preds, images, right, rows=1, cols=3)
        assert {to_rgba(t.get_color()) for t in grid.axes[0].texts} == {white}
        diagonal = plot_reliability(preds, right).axes[0].lines[0]
        assert diagonal.get_label() == "perfect calibration"
        at_80 = plot_risk_coverage(preds, right).axes[0].lines[-1]
        assert at_80.get_label().startswith("Risk@80Cov")
        mean = plot_most_uncertain(preds, images, k=1).axes[1].lines[-1]
        assert mean.get_label() == "mean"
        assert {to_rgba(line.get_color()) for line in (diagonal, at_80, mean)} == {white}
        scatter = plot_regression(gauss, x, train_x=x, train_y=x).axes[0].collections[-1]
        assert [tuple(c) for c in scatter.get_facecolor()] == [white]
    grid = plot_image_grid(preds, images, right, rows=1, cols=3)  # the default style: black
    assert {to_rgba(t.get_color()) for t in grid.axes[0].texts} == {(0.0, 0.0, 0.0, 1.0)}


def test_a_text_colour_given_as_a_tuple_is_drawn_as_that_colour(preds, images):
    # rcParams["text.color"] may hold an RGB tuple; its str(), "(0.9, 0.9, 0.9)", is no colour:
    # every plot drawing in the text's colour refused it ("is not a valid value for color")
    right = preds.probs.mean(0).argmax(-1)
    grey = (0.9, 0.9, 0.9)
    with plt.rc_context({"text.color": grey}):
        grid = plot_image_grid(preds, images, right, rows=1, cols=3)
        diagonal = plot_reliability(preds, right).axes[0].lines[0]
    assert {to_rgba(t.get_color()) for t in grid.axes[0].texts} == {(*grey, 1.0)}
    assert to_rgba(diagonal.get_color()) == (*grey, 1.0)


def test_a_plot_that_fails_while_drawing_closes_its_own_figure(preds, targets):
    # text.usetex without LaTeX fails in tight_layout or a title, after the figure was made: it
    # was left open in pyplot, with no handle to close it (a given ax's figure is the caller's)
    from matplotlib.axes import Axes

    def no_latex(*args, **kwargs):
        raise RuntimeError("Failed to process string with tex because latex could not be found")

    _, ax = plt.subplots()  # the caller's figure, open before and after
    open_before = plt.get_fignums()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Axes, "set_title", no_latex)
        for draw in (
            lambda: plot_reliability(preds, targets),
            lambda: plot_uncertainty_distributions(preds),
            lambda: plot_rotation(_rows()),
            lambda: plot_risk_coverage(preds, targets, ax=ax),
        ):
            with pytest.raises(RuntimeError, match="latex could not be found"):
                draw()
            assert plt.get_fignums() == open_before
