"""Fourth audit of the metrics and the plots: the calibration errors against a numpy
reference, and the inputs the audit found answered badly (a total-uncertainty panel whose
AUROC split inputs of one mean, complex OOD scores, images holding NaN)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from pyrouq import metrics
from pyrouq.plotting import plot_image_grid, plot_most_uncertain, plot_uncertainty_distributions
from pyrouq.uncertainty import decompose


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _ece_reference(p: np.ndarray, y: np.ndarray, k: int, adaptive: bool) -> float:
    conf, correct = p.max(-1), (p.argmax(-1) == y).astype(float)
    if adaptive:  # equal mass: the sorted points in k groups, the larger ones first
        groups = np.array_split(np.argsort(conf, kind="stable"), k)
    else:  # equal width, left-closed, a confidence of 1 in the last bin
        b = np.minimum(np.floor(conf * k).astype(int), k - 1)
        groups = [np.flatnonzero(b == i) for i in range(k)]
    return sum(len(g) / len(y) * abs(correct[g].mean() - conf[g].mean()) for g in groups if len(g))


def test_ece_and_aece_match_a_numpy_reference_for_any_number_of_bins():
    rng = np.random.default_rng(4)
    for trial in range(120):
        n, c, k = int(rng.integers(1, 40)), int(rng.integers(1, 5)), int(rng.integers(1, 20))
        logits = rng.normal(size=(n, c)) * rng.choice([0.1, 1.0, 10.0, 100.0])
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        if trial % 4 == 0:  # quarters: confidences on bin edges and tied
            p = np.round(p * 4) / 4
            p /= p.sum(-1, keepdims=True)
        y = rng.integers(0, c, n)
        probs, targets = torch.from_numpy(p), torch.from_numpy(y)
        assert metrics.ece(probs, targets, num_bins=k) == pytest.approx(
            _ece_reference(p, y, k, adaptive=False), abs=1e-12
        )
        assert metrics.aece(probs, targets, num_bins=k) == pytest.approx(
            _ece_reference(p, y, k, adaptive=True), abs=1e-12
        )


def test_variance_total_panel_ties_inputs_of_one_mean():
    # two draws that agree and two that disagree, of one mean p̄: their Gini impurity
    # sum_c p̄_c (1 - p̄_c) is one number (AUROC 0.5), but aleatoric + epistemic rounds apart;
    # the panel said 100.00%
    a, d = 0.9163410042713318, 0.0053236224504176165
    p_in = torch.tensor([[[a, 1 - a]], [[a, 1 - a]]], dtype=torch.float64)
    p_out = torch.tensor([[[a + d, 1 - a - d]], [[a - d, 1 - a + d]]], dtype=torch.float64)
    assert torch.equal(p_in.mean(0), p_out.mean(0))
    totals = decompose(p_in, "variance").total, decompose(p_out, "variance").total
    assert float(totals[0]) != float(totals[1])  # the rounding the panel must not score
    fig = plot_uncertainty_distributions(p_in, p_out, measure="variance")
    assert fig.axes[0].get_title() == "total (variance)\nOOD AUROC 50.00%"


@pytest.mark.parametrize(("measure", "score"), [("zero_one", "max_prob"), ("entropy", "entropy")])
def test_total_panel_auroc_is_evaluates_score_of_the_mean(measure, score):
    g = torch.Generator().manual_seed(5)
    p_in = torch.softmax(2 * torch.randn(3, 20, 4, generator=g), -1)
    p_out = torch.softmax(0.3 * torch.randn(3, 9, 4, generator=g), -1)
    y = torch.zeros(20, dtype=torch.long)
    auroc = metrics.evaluate(p_in, y, ood=p_out, ood_score=score)["ood_auroc"]
    fig = plot_uncertainty_distributions(p_in, p_out, measure=measure)
    assert fig.axes[0].get_title() == f"total ({measure})\nOOD AUROC {auroc:.2%}"


def test_complex_ood_scores_are_refused_not_cast_to_their_real_part():
    # torch dropped the imaginary part with a UserWarning and the AUROC was that of .real
    scores = torch.tensor([0.1, 0.5]) * 1j
    for fn in (metrics.ood_auroc, metrics.ood_aupr, metrics.ood_fpr95):
        with pytest.raises(
            TypeError,
            match=r"^Expected real scores_in, got dtype torch\.complex64; pass real per-input "
            r"scores, e\.g\. scores_in\.abs\(\) or scores_in\.real",
        ):
            fn(scores, torch.tensor([0.9]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_images_holding_nan_or_inf_are_refused_before_a_figure_is_made(bad):
    # NaN images were drawn blank without a word (inf: told to pass uint8 pixels)
    probs = torch.full((4, 2), 0.5)
    images = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(6))
    images[2, 0, 3, 3] = bad
    before = plt.get_fignums()
    for call in (
        lambda: plot_image_grid(probs, images, rows=1, cols=2),
        lambda: plot_most_uncertain(probs, images, k=2),
    ):
        with pytest.raises(ValueError, match=r"^Expected finite images, got 1 NaN or inf pixel"):
            call()
    assert plt.get_fignums() == before
