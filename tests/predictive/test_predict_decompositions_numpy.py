"""Audit 7 of predict() and the uncertainty decompositions: references computed independently
(float64 numpy from predict's own draws, the plain torch network) and a message."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pytest
import torch
from torch import nn

from pyrouq import bayesian, mean_field_guide, predict
from pyrouq.predictive import Predictions


def _reference(p: np.ndarray, measure: str, base: float) -> tuple[np.ndarray, ...]:
    """(total, aleatoric, epistemic) of (S, N, C) probabilities by the textbook formulas."""
    mean = p.mean(0)
    if measure == "entropy":

        def h(q: np.ndarray) -> np.ndarray:
            return -np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0).sum(-1)

        total, aleatoric = h(mean) / math.log(base), h(p).mean(0) / math.log(base)
        return total, aleatoric, total - aleatoric
    if measure == "variance":
        total = (mean * (1 - mean)).sum(-1)
        return total, (p * (1 - p)).sum(-1).mean(0), p.var(0).sum(-1)
    total = 1 - mean.max(-1)
    aleatoric = (1 - p.max(-1)).mean(0)
    return total, aleatoric, total - aleatoric


@pytest.mark.parametrize("measure", ["entropy", "variance", "zero_one"])
@pytest.mark.parametrize("base", [math.e, 2])
def test_decompositions_of_predicts_own_draws_match_float64_numpy(measure, base):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))
    model = bayesian(net)
    guide = mean_field_guide(model, init_scale=0.5)
    x = torch.randn(9, 3) * 3
    pyro.set_rng_seed(1)
    preds = predict(model, x, guide, num_samples=6, batch_size=4, progress=False)
    zeros = torch.tensor([[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]], [[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]])
    for p in (preds, Predictions.from_probs(preds.probs[:1]), Predictions.from_probs(zeros)):
        for dtype in (torch.float32, torch.float64):
            d = p.to(dtype).uncertainty(measure, base)
            expected = _reference(p.probs.double().numpy(), measure, base)
            tol = 1e-6 if dtype == torch.float32 else 1e-12
            for got, want in zip((d.total, d.aleatoric, d.epistemic), expected, strict=True):
                assert got.dtype == dtype
                np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=tol)
            assert torch.equal(d.total, d.aleatoric + d.epistemic)
            assert bool((d.epistemic >= 0).all())
            if p.num_samples == 1:
                assert bool((d.epistemic == 0).all())


def test_a_guide_of_zero_scale_predicts_as_the_plain_network():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 4))
    model = bayesian(net)
    guide = mean_field_guide(model, init_from=net)
    with torch.no_grad():
        for rho in guide.rho.values():
            rho.fill_(-200.0)  # softplus(-200) is 0 in float32: every draw is the mean
    x = torch.randn(11, 3)
    expected = net(x).softmax(-1).detach()
    preds = predict(model, x, guide, num_samples=3, batch_size=4, progress=False)
    torch.testing.assert_close(preds.probs, expected.expand(3, 11, 4), rtol=0, atol=1e-7)
    plain = predict(net, x, progress=False)
    torch.testing.assert_close(plain.probs, expected.unsqueeze(0), rtol=0, atol=0)
    assert bool((preds.uncertainty().epistemic == 0).all())


def test_batchnorm_data_of_only_empty_batches_is_told_it_is_empty():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model = bayesian(net)
    guide = mean_field_guide(model)
    x = torch.randn(5, 3)
    for empty in ([x[:0]], [x[:0], x[:0]]):  # batches with no input: not "one input each"
        with pytest.raises(ValueError, match="batchnorm_data that holds no inputs: it is empty"):
            predict(model, x, guide, num_samples=2, batchnorm_data=empty, progress=False)
    with pytest.raises(ValueError, match="batches hold one input each"):  # one, and none
        predict(model, x, guide, num_samples=2, batchnorm_data=[x[:0], x[:1]], progress=False)
