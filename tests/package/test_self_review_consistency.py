"""The day's self-review: one fault told alike across entry points, and the shared wording
helpers (pyrouq._words) that replaced copies written by different commits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pyrouq import batchensemble, fit, predict
from pyrouq._words import CASE, JOINS, SPACES, article, name_slip
from pyrouq.regression import GaussianPredictions


def _gaussian() -> GaussianPredictions:
    torch.manual_seed(0)
    loc, scale = torch.randn(3, 5, 1), torch.rand(3, 5, 1) + 0.1
    return GaussianPredictions(loc, scale, torch.randn(5, 1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_gaussian_predictions_to_refuses_a_dtype_the_metrics_cannot_read(dtype):
    # Predictions.to(torch.float16) was refused; GaussianPredictions.to(torch.float16) rounded
    # the targets to float16 without a word (the moments were widened back to float32)
    with pytest.raises(TypeError) as info:
        _gaussian().to(dtype)
    assert str(info.value) == (
        "GaussianPredictions.to() takes torch.float32 or torch.float64 for the moments and "
        f"targets, got {dtype}: the moments are computed in float32 or float64 (in half "
        "precision a variance above 65504 is inf) and the targets would be rounded. Pass "
        "torch.float32, torch.float64, or a device."
    )
    with pytest.raises(TypeError, match=r"got a tensor of dtype torch\.float16: "):
        _gaussian().to(torch.zeros(1, dtype=torch.float16))


def test_gaussian_predictions_to_still_moves_and_widens():
    preds = _gaussian()
    wide = preds.to(torch.float64)
    assert wide.loc.dtype == wide.scale.dtype == wide.targets.dtype == torch.float64
    torch.testing.assert_close(wide.loc, preds.loc.double(), rtol=0, atol=0)
    moved = preds.to("cpu")
    assert moved.loc.dtype == torch.float32 and torch.equal(moved.targets, preds.targets)


def test_a_batch_that_is_an_ndarray_is_told_with_an_not_a():
    # fit() and predict() said "is a ndarray" (the article of _util.describe_batch), while
    # predict()'s own refusals said "an ndarray"
    batches = [np.zeros((4, 4), dtype=np.float32)]
    with pytest.raises(TypeError) as info:
        fit(batchensemble(nn.Linear(4, 3), 2), None, batches, epochs=1, num_data=8, progress=False)
    assert str(info.value) == (
        "train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is an ndarray."
    )
    with pytest.raises(TypeError, match=r"a batch was an ndarray\. Make them tensors"):
        predict(batchensemble(nn.Linear(4, 3), 2), batches, progress=False)


@pytest.mark.parametrize(
    "word, said",
    [("int", "an"), ("dict", "a"), ("ndarray", "an"), ("UserDict", "a"), ("uint8", "a"),
     ("OrderedDict", "an")],
)  # fmt: skip
def test_article(word, said):
    assert article(word) == said


def test_name_slip_tells_the_name_and_each_slip_in_order():
    assert name_slip("nuts", ("nuts", "hmc")) is None  # exact: no slip
    assert name_slip("gibbs", ("nuts", "hmc")) is None
    assert name_slip(" HMC", ("nuts", "hmc")) == ("hmc", [CASE, SPACES])
    assert name_slip("warmup-cosine", ("warmup_cosine",)) is None  # joins only when asked
    assert name_slip(" Warmup cosine", ("warmup_cosine",), joins=True) == (
        "warmup_cosine",
        [CASE, SPACES, JOINS],
    )
