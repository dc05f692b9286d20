"""Labels and probabilities on the meta device (shapes, no values) are refused in words by
temperature_scale(), the metrics and Predictions (they gave torch's ".item() cannot be called
on meta tensors")."""

from __future__ import annotations

import pytest
import torch

import pyrouq
from pyrouq import Predictions


def test_temperature_scale_refuses_meta_labels_and_probabilities_in_words():
    probs = torch.softmax(torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(0)), -1)
    labels = torch.tensor([0, 1, 2, 0, 1, 2], device="meta")
    with pytest.raises(
        ValueError,
        match=r"Expected val_targets on a real device \(cpu or cuda\), got a tensor of shape "
        r"\(6,\) on the meta device \(shapes, no values\): there are no labels to check\. Pass the "
        r"labels themselves",
    ):
        pyrouq.temperature_scale(Predictions(probs), labels)
    with pytest.raises(ValueError, match=r"Expected targets on a real device .* meta device"):
        Predictions(probs, labels)
    with pytest.raises(
        ValueError,
        match=r"Expected probs on a real device \(cpu or cuda\), got them on the meta device "
        r"\(shapes, no values\)",
    ):
        Predictions(probs.to("meta"))
