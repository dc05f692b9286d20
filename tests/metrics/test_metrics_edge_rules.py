"""ECE's equal-width bins on confidences that sit exactly on a float edge ``b / K`` whose
product ``(b / K) * K`` rounds below ``b`` (``15 / 22``, ``13 / 23``, ``15 / 26``, ``31 / 39``):
``floor(conf * K)`` alone puts them a bin low; the documented rule (left-closed bins against the
correctly rounded float edges ``b / K``) puts them in bin ``b``."""

from __future__ import annotations

import bisect

import numpy as np
import pytest
import torch

from pyrouq.metrics import ece

# (K, b): the float edge b / K times K rounds to just below b in float64
_ROUNDS_LOW = [(22, 15), (23, 13), (26, 15), (39, 31)]


def _reference_ece(conf: list[float], right: list[bool], k: int) -> float:
    """ECE by its definition: bin b holds the confidences in [b / K, (b + 1) / K) with the
    float edges b / K of Python's division, 1.0 in the last bin."""
    edges = [b / k for b in range(k + 1)]
    bins = [min(max(bisect.bisect_right(edges, c) - 1, 0), k - 1) for c in conf]
    total = 0.0
    for b in set(bins):
        members = [i for i, j in enumerate(bins) if j == b]
        gap = sum(float(right[i]) - conf[i] for i in members)
        total += abs(gap)
    return total / len(conf)


def test_a_confidence_on_the_edge_15_of_22_is_in_bin_15_by_hand():
    # K = 22: 0.66 (right) in bin 14 ([14/22, 15/22) = [0.636, 0.682)); 15/22 (right) and
    # 0.70 (wrong) in bin 15 ([0.682, 0.727)).
    # bin 14: |1 - 0.66| = 0.34; bin 15: |(1 - 15/22) + (0 - 0.70)| = 0.70 - 7/22
    # ECE = (0.34 + 0.70 - 7/22) / 3 = 0.2406...; with 15/22 a bin low it would be
    # (0.34 + 7/22 + 0.70) / 3 = 0.4527...
    c = 15 / 22
    probs = torch.tensor([[c, 1 - c], [0.66, 0.34], [0.70, 0.30]], dtype=torch.float64)
    targets = torch.tensor([0, 0, 1])
    expected = (0.34 + 0.70 - 7 / 22) / 3
    assert ece(probs, targets, num_bins=22) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.240606060606, abs=1e-9)


@pytest.mark.parametrize(("k", "b"), _ROUNDS_LOW)
def test_ece_on_edges_that_round_low_matches_the_definition(k, b):
    assert np.floor((b / k) * k) == b - 1  # the premise: floor() alone puts b / K a bin low
    # every edge of [0.5, 1] and points in the bins on both sides of edge b, right and wrong
    g = np.random.default_rng(k)
    conf = [j / k for j in range(k + 1) if j / k >= 0.5]
    lo, mid, hi = (b - 1) / k, b / k, (b + 1) / k
    conf += list(g.uniform(lo, mid, 5)) + list(g.uniform(mid, hi, 5)) + list(g.uniform(0.5, 1, 20))
    right = [bool(r) for r in g.integers(0, 2, len(conf))]
    # bin b - 1 all right, bin b all wrong but the edge point: its bin then changes the sum
    # of the two bins' gaps by 2 (1 - b / K), whichever way the other bins' points fall
    for i, c in enumerate(conf):
        if lo <= c < hi:
            right[i] = c <= mid
    probs = torch.tensor([[c, 1 - c] for c in conf], dtype=torch.float64)
    # argmax is class 0 (0.5 ties go to it): right means target 0
    targets = torch.tensor([0 if r else 1 for r in right])
    assert ece(probs, targets, num_bins=k) == pytest.approx(
        _reference_ece(conf, right, k), abs=1e-12
    )
