"""GaussianPredictions, its metrics and conformal() given targets on the meta device (shapes,
no values) are refused in words (torch's "nonzero" NotImplementedError before)."""

from __future__ import annotations

import pytest
import torch

import pyrouq
from pyrouq import GaussianPredictions

_META = (
    "Expected targets on a real device (cpu or cuda), got a tensor of shape (6,) on the meta "
    "device (shapes, no values): there are no targets to check."
)


@pytest.mark.parametrize(
    "call",
    [
        lambda p, y: GaussianPredictions(p.loc, p.scale, y),
        lambda p, y: p.evaluate(y),
        lambda p, y: p.crps(y),
        lambda p, y: p.log_prob(y),
        lambda p, y: p.calibration_curve(y),
        lambda p, y: pyrouq.conformal(p, y),
    ],
    ids=["constructor", "evaluate", "crps", "log_prob", "calibration_curve", "conformal"],
)
def test_regression_targets_on_the_meta_device_are_refused_in_words(call):
    predictions = GaussianPredictions(torch.zeros(3, 6, 1), torch.ones(3, 6, 1))
    with pytest.raises(ValueError, match="^" + _META.replace("(", r"\(").replace(")", r"\)")):
        call(predictions, torch.zeros(6, device="meta"))
