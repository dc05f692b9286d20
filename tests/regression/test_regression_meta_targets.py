"""GaussianPredictions, its metrics and conformal() given targets on the meta device (shapes,
no values) are refused in words (torch's "nonzero" NotImplementedError before); so are its
loc and scale, cdf()'s values and rescale()'s statistics there (torch's ".item() cannot be
called on meta tensors" and "Cannot copy out of meta tensor; no data!" before), and
quantile()'s and interval()'s level there (".item()" too), as a classifier's Predictions refuses
its probabilities there."""

from __future__ import annotations

import re

import pytest
import torch

import pyrouq
from pyrouq import GaussianPredictions

_META = (
    "Expected {0} on a real device (cpu or cuda), got a tensor of shape (6,) on the meta "
    "device (shapes, no values): there are no {0} to check."
)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda p, y: GaussianPredictions(p.loc, p.scale, y), "targets"),
        (lambda p, y: p.evaluate(y), "targets"),
        (lambda p, y: p.crps(y), "targets"),
        (lambda p, y: p.log_prob(y), "targets"),
        (lambda p, y: p.calibration_curve(y), "targets"),
        (lambda p, y: pyrouq.conformal(p, y), "val_targets"),  # (its argument's name)
    ],
    ids=["constructor", "evaluate", "crps", "log_prob", "calibration_curve", "conformal"],
)
def test_regression_targets_on_the_meta_device_are_refused_in_words(call, name):
    predictions = GaussianPredictions(torch.zeros(3, 6, 1), torch.ones(3, 6, 1))
    words = _META.format(name).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match="^" + words):
        call(predictions, torch.zeros(6, device="meta"))


_GIVEN = torch.zeros(3, 6, 1)
# (it said "on the cpu", but rescale() takes them on any device, to the predictions')
_RESCALE = (
    "statistics to rescale with. Pass a Standardizer's y_mean and y_std, on any real device "
    "(they are moved to the predictions')."
)
_ON_META = torch.zeros(3, 6, 1, device="meta")


@pytest.mark.parametrize(
    ("call", "name", "shape", "why"),
    [
        (lambda p, m: GaussianPredictions(m, m + 1), "loc", (3, 6, 1), "predictions to check"),
        (lambda p, m: GaussianPredictions(_GIVEN, m), "scale", (3, 6, 1), "predictions to check"),
        (lambda p, m: p.cdf(m[0]), "cdf's value", (6, 1), "values to evaluate the CDF at"),
        (lambda p, m: p.cdf(m[0, :, 0]), "cdf's value", (6,), "values to evaluate the CDF at"),
        (lambda p, m: p.rescale(m[0, 0], 1.0), "rescale's mean", (1,), _RESCALE),
        (lambda p, m: p.rescale(0.0, m[0, 0]), "rescale's std", (1,), _RESCALE),
    ],
    ids=["loc", "scale", "cdf", "cdf of (N,)", "rescale mean", "rescale std"],
)
def test_moments_and_values_on_the_meta_device_are_refused_in_words(call, name, shape, why):
    predictions = GaussianPredictions(_GIVEN, torch.ones(3, 6, 1))
    said = (
        f"Expected {name} on a real device (cpu or cuda), got a tensor of shape {shape} on the "
        f"meta device (shapes, no values): there are no {why}"
    )
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        call(predictions, _ON_META)


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda p, level: p.quantile(level), "a quantile level"),
        (lambda p, level: p.interval(level), "an interval level"),
    ],
    ids=["quantile", "interval"],
)
def test_a_level_on_the_meta_device_is_refused_in_words(call, what):
    """torch's "Tensor.item() cannot be called on meta tensors" before."""
    predictions = GaussianPredictions(_GIVEN, torch.ones(3, 6, 1))
    said = (
        f"Expected {what} on a real device (cpu or cuda), got a tensor of shape () on the meta "
        "device (shapes, no values): there is no level to read. Pass it as a number, e.g. 0.9."
    )
    with pytest.raises(ValueError, match="^" + re.escape(said) + "$"):
        call(predictions, torch.tensor(0.9, device="meta"))
