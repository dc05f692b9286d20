"""Audit 5 of recalibration, on classifiers: APS / RAPS sets checked to be prefixes of the
ranking (the rounded scores could fall by an ulp from one rank to the next), and the messages
of RAPS knobs refused."""

from __future__ import annotations

import pytest
import torch

from pyrouq import ConformalClassifier, Predictions, conformal


def _raw_scores(pbar: torch.Tensor, seed: int, lam: float | None, k_reg: int) -> torch.Tensor:
    """APS / RAPS scores in rank order, as the formula reads, rounded as written: the mass of
    the classes ranked above (a cumulative sum less the class's own), plus ``u * p``, plus the
    RAPS penalty; u drawn per input from ``seed``, as the predictor documents."""
    sorted_p = pbar.sort(dim=1, descending=True, stable=True).values
    u = torch.rand(
        pbar.shape[0], 1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    out = sorted_p.cumsum(1) - sorted_p + u * sorted_p
    if lam is not None:
        ranks = torch.arange(1, pbar.shape[1] + 1).expand_as(out)
        out = out + lam * (ranks - k_reg).clamp_min(0).double()
    return out


@pytest.mark.parametrize("score, k_reg", [("aps", 1), ("raps", 10)])  # RAPS: ranks 1-10 free
def test_adaptive_sets_are_prefixes_of_the_ranking_where_rounding_breaks_the_order(score, k_reg):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4000, 10, generator=gen, dtype=torch.float64)
    pbar = torch.softmax(logits * 30 * torch.rand(4000, 1, generator=gen, dtype=torch.float64), -1)
    lam = 0.01 if score == "raps" else None
    raw = _raw_scores(pbar, 7, lam, k_reg)
    rows, ranks = torch.nonzero(raw[:, 1:] < raw[:, :-1], as_tuple=True)
    assert rows.numel() > 0  # the data hold inputs whose rounded scores fall along the ranks
    order = pbar.argsort(dim=1, descending=True, stable=True)
    preds = Predictions(pbar[None])
    for i, r in zip(rows[:3].tolist(), ranks[:3].tolist(), strict=True):
        # a threshold at the score of rank r + 2 (1-based): below rank r + 1's rounded score
        threshold = float(raw[i, r + 1])
        predictor = ConformalClassifier(score, 0.1, threshold, 0.01, k_reg, 6)  # sets: seed 7
        in_rank_order = predictor.predict_sets(preds)[i, order[i]]
        # a set holds every class ranked above one it holds (it held rank r + 2, not r + 1)
        assert in_rank_order.tolist() == sorted(in_rank_order.tolist(), reverse=True)
        scores = predictor.scores(preds, seed=7)[i, order[i]]
        assert bool((scores[1:] >= scores[:-1]).all())  # "the scores grow with the rank"
        # elsewhere the scores are the formula's, to the bit
        assert torch.equal(scores[: r + 1], raw[i, : r + 1])


def test_an_infinite_raps_penalty_is_refused_saying_it_must_be_finite():
    preds = Predictions(torch.full((1, 20, 3), 1 / 3), torch.zeros(20, dtype=torch.long))
    with pytest.raises(ValueError, match=r"lam >= 0, .*got inf: pass a finite number"):
        conformal(preds, score="raps", lam=float("inf"))
