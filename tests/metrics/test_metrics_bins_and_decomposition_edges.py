"""Sixth audit of the metrics, the decompositions and the plots: a number of bins the ECE
allocated, the order of evaluate()'s input errors, the epistemic part of draws that agree, and
the plots of one draw (S = 1), whose epistemic part is 0 for every input."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from pyrouq import metrics
from pyrouq.plotting import (
    plot_image_grid,
    plot_most_uncertain,
    plot_reliability,
    plot_uncertainty_distributions,
)
from pyrouq.uncertainty import decompose


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _probs(s: int, n: int, c: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(s, n, c, generator=g), -1)


# --- the calibration errors' bins ----------------------------------------------------------------


def test_ece_of_any_number_of_bins_stores_only_the_occupied_ones():
    # num_bins=10**12 tried to allocate 8 TB of bin edges (and 10**9 8 GB)
    p = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.55, 0.45], [0.8, 0.2]], dtype=torch.float64)
    y = torch.tensor([0, 0, 0, 1])
    conf = p.max(-1).values.numpy()
    correct = (p.argmax(-1) == y).double().numpy()
    every_point_alone = float(np.abs(correct - conf).mean())  # distinct confidences
    for k in (10**6 + 3, 10**12, 2**53):
        assert metrics.ece(p, y, num_bins=k) == pytest.approx(every_point_alone, abs=1e-15)
        assert metrics.aece(p, y, num_bins=k) == metrics.aece(p, y, num_bins=4)
    assert metrics.aece(p, y, num_bins=4) == pytest.approx(every_point_alone, abs=1e-15)
    # the bins still are bucketize's on the float64 edges b / K, ties and edges included
    g = torch.Generator().manual_seed(0)
    k = 1000
    edges = torch.arange(k + 1, dtype=torch.float64) / k
    conf_t = torch.cat([edges[500:], torch.rand(200, generator=g, dtype=torch.float64) / 2 + 0.5])
    p2 = torch.stack([conf_t, 1 - conf_t], -1)
    y2 = torch.randint(0, 2, (conf_t.numel(),), generator=g)
    bins = (torch.bucketize(conf_t, edges, right=True) - 1).clamp(0, k - 1)
    right = (y2 == 0).double()  # argmax is class 0 (ties at 0.5 go to it too)
    sums = torch.zeros(k, dtype=torch.float64)
    gap = sums.index_add(0, bins, right) - sums.index_add(0, bins, conf_t)
    assert metrics.ece(p2, y2, num_bins=k) == pytest.approx(
        float(gap.abs().sum() / conf_t.numel()), abs=1e-14
    )


def test_more_bins_than_float64_edges_are_refused():
    p, y = torch.tensor([[0.9, 0.1]]), torch.tensor([0])
    for fn in (metrics.ece, metrics.aece):
        with pytest.raises(
            ValueError,
            match=r"^Expected num_bins <= 2\*\*53 \(above it, the bins' numbers b and K are not "
            r"exact in float64\), got 9007199254740993\. The reported figures use 15\.$",
        ):
            fn(p, y, num_bins=2**53 + 1)


def test_reliability_diagram_refuses_bars_thinner_than_a_pixel():
    # num_bins=20000 drew for 28 s; 10**9 allocated 8 GB of edges before drawing
    p, y = _probs(1, 10, 3, seed=1)[0], torch.zeros(10, dtype=torch.long)
    before = plt.get_fignums()
    with pytest.raises(
        ValueError,
        match=r"^Expected num_bins <= 1000 for a reliability diagram \(one bar per bin; more "
        r"are thinner than a pixel\), got 1001\. For the ECE of that many bins call "
        r"pyrouq\.metrics\.ece\(probs, targets, num_bins=\.\.\.\)\.$",
    ):
        plot_reliability(p, y, num_bins=1001)
    assert plt.get_fignums() == before


# --- evaluate()'s input errors -------------------------------------------------------------------


@pytest.mark.parametrize("bad", [[[0.9, 0.1]], np.array([[0.9, 0.1]]), "probs", None])
def test_evaluate_names_a_wrong_predictions_type_before_missing_targets(bad):
    # without targets it said "No targets: ..." although the predictions were no tensor at all
    with pytest.raises(TypeError, match=r"^Expected predictions to be an \(S, N, C\) or \(N, C\) "):
        metrics.evaluate(bad)
    with pytest.raises(ValueError, match=r"^No targets: pass targets="):  # a tensor: as before
        metrics.evaluate(torch.tensor([[0.9, 0.1]]))


# --- the epistemic part of draws that agree ------------------------------------------------------


@pytest.mark.parametrize("measure", ["entropy", "variance", "zero_one"])
def test_float32_draws_that_agree_have_an_epistemic_part_of_exactly_zero(measure):
    # S equal float32 draws gave up to 3e-7 (entropy) and 1.8e-7 (zero_one): mean(0) of S
    # equal values rounds an ulp off them
    worst = 0.0
    for s in (2, 3, 7, 10, 30):
        for c in (2, 10, 100, 1000):
            one = _probs(1, 50, c, seed=s * c)
            d = decompose(one.expand(s, -1, -1).contiguous(), measure)
            worst = max(worst, float(d.epistemic.abs().max()))
            assert torch.equal(d.total, d.aleatoric + d.epistemic)
    assert worst == 0.0


def test_the_decomposition_of_draws_that_disagree_is_unchanged():
    p = _probs(5, 40, 7, seed=3, scale=3.0)
    q = p.double().numpy()
    pbar = q.mean(0)
    h = lambda x: -(x * np.log(x)).sum(-1)  # noqa: E731 (no zeros after a softmax)
    refs = {
        "entropy": (h(pbar), h(q).mean(0)),
        "variance": ((pbar * (1 - pbar)).sum(-1), (q * (1 - q)).sum(-1).mean(0)),
        "zero_one": (1 - pbar.max(-1), (1 - q.max(-1)).mean(0)),
    }
    for measure, (total, aleatoric) in refs.items():
        for x, tol in ((p, 1e-6), (p.double(), 1e-14)):
            d = decompose(x, measure)
            np.testing.assert_allclose(d.total.double().numpy(), total, atol=tol, rtol=0)
            np.testing.assert_allclose(d.aleatoric.double().numpy(), aleatoric, atol=tol, rtol=0)
            np.testing.assert_allclose(
                d.epistemic.double().numpy(), total - aleatoric, atol=tol, rtol=0
            )


# --- plots of one draw ---------------------------------------------------------------------------


def test_uncertainty_distributions_of_one_draw_do_not_draw_an_all_zero_epistemic_part():
    # a plain network's epistemic panel was one bar at 0 titled "OOD AUROC 50.00%"
    p_in, p_out = _probs(1, 30, 4, seed=4)[0], _probs(1, 12, 4, seed=5, scale=0.5)[0]
    fig = plot_uncertainty_distributions(p_in, p_out)
    ax_total, ax_aleatoric, ax_epistemic = fig.axes
    assert ax_epistemic.get_title() == "epistemic (entropy)\nnot drawn for S = 1"
    assert not ax_epistemic.patches and not ax_epistemic.lines
    assert [t.get_text() for t in ax_epistemic.texts] == [
        "0 for every input:\none draw (S = 1) has\nno disagreement"
    ]
    y = torch.zeros(30, dtype=torch.long)
    auroc = metrics.evaluate(p_in, y, ood=p_out)["ood_auroc"]  # the entropy, for S = 1
    assert ax_total.get_title() == f"total (entropy)\nOOD AUROC {auroc:.2%}"
    assert ax_aleatoric.get_title() == f"aleatoric (entropy)\nOOD AUROC {auroc:.2%}"
    # two draws still draw it
    fig = plot_uncertainty_distributions(_probs(2, 30, 4, seed=4), measure="variance")
    assert fig.axes[2].get_title() == "epistemic (variance)" and fig.axes[2].patches


def test_most_uncertain_of_one_draw_says_its_rows_are_the_first_inputs():
    p = _probs(1, 6, 3, seed=6)[0]
    images = torch.rand(6, 5, 5, generator=torch.Generator().manual_seed(0))
    fig = plot_most_uncertain(p, images, k=3)
    assert fig.get_suptitle() == (
        "The first 3 of 6 inputs: one draw (S = 1) has no epistemic part, use component='total'"
    )
    assert [fig.axes[2 * r].get_title() for r in range(3)] == [
        f"#{i} pred {int(p[i].argmax())}" for i in range(3)
    ]
    fig = plot_most_uncertain(p, images, k=3, component="total")
    assert fig.get_suptitle() == (
        "The 3 most uncertain of 6 inputs by total uncertainty (entropy), S = 1"
    )


def test_nan_images_are_named_in_the_refusal():
    probs = torch.full((10, 2), 0.5)
    images = torch.rand(10, 1, 6, 6, generator=torch.Generator().manual_seed(7))
    images[2, 0, 1, 1] = float("nan")
    images[7, 0, :2, 0] = float("inf")
    with pytest.raises(
        ValueError,
        match=r"^Expected finite images, got 3 NaN or inf pixel\(s\) in image\(s\) \[2, 7\] "
        r"\(2 of 10\); check how the images were made \(e\.g\. a normalisation by a zero "
        r"std\), or drop those images and their predictions\.$",
    ):
        plot_image_grid(probs, images, rows=1, cols=2)


def test_the_gradient_through_agreeing_draws_is_shared_by_the_draws():
    # the exact mean of agreeing draws sent the whole gradient to the first draw
    logits = torch.tensor([[[2.0, 0.5, -1.0]]]).repeat(3, 1, 1).requires_grad_(True)
    decompose(torch.softmax(logits, -1), "zero_one").total.sum().backward()
    per_draw = logits.grad.abs().sum((1, 2))
    torch.testing.assert_close(per_draw, per_draw[:1].expand(3))
    assert float(per_draw[0]) > 0
