"""Review of the likelihoods' nll() refusals (commit 67dc4e9): the out-of-range message for
labels of every integer dtype, and the fast path left as it was for labels it takes."""

from __future__ import annotations

import math

import pytest
import torch

from pyrouq import Categorical


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_out_of_range_labels_of_wide_unsigned_dtypes_are_named(dtype):
    # torch has no min() of these dtypes: the refusal met NotImplementedError "min_all" instead
    logits = torch.zeros(2, 3, 2)  # S = 2 draws
    y = torch.tensor([0, 5, 1]).to(dtype)
    with pytest.raises(ValueError) as info:
        Categorical().nll(logits, y)
    assert str(info.value) == (
        "Categorical.nll(): labels in [0, 5], expected class indices in [0, 1] for a model "
        "with 2 classes. Check the targets or the model's number of classes."
    )
    in_range = Categorical().nll(logits, torch.tensor([0, 1, 1]).to(dtype))
    assert in_range.item() == pytest.approx(6 * math.log(2), rel=1e-6)  # 6 uniform 2-way terms


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_taken_labels_are_scored_without_the_checks(dtype, half, monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 3, generator=g).to(half)
    y = torch.tensor([0, 2, 1, 2, 0])
    lik = Categorical()
    monkeypatch.setattr(lik, "check_targets", lambda *a: pytest.fail("checked on the hot path"))
    ref = -torch.distributions.Categorical(logits=logits.float()).log_prob(y).sum()
    got = lik.nll(logits, y.to(dtype))
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)
