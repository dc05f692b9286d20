"""What a review of a day's audit fixes found: the temperature scaler applies the transform
its fit minimised, a prior holding an inverse transform survives conversion and casts, and
low-precision logits are not taken for class probabilities."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import sampled_linear
from pyro.nn import PyroModule
from torch import nn
from torch.distributions.transforms import AffineTransform, SigmoidTransform

import pyrouq
from pyrouq import Predictions, TemperatureScaler, temperature_scale
from pyrouq.metrics import nll


def _overconfident(dtype):
    """Validation predictions of a network ~10 % wrong with logit gaps of 60 to 140: many
    probabilities below 1e-12, float32's underflowing to 0."""
    g = torch.Generator().manual_seed(0)
    n, c = 600, 10
    y = torch.randint(0, c, (n,), generator=g)
    wrong = torch.rand(n, generator=g) < 0.1
    pred = torch.where(wrong, (y + 1 + torch.randint(0, c - 1, (n,), generator=g)) % c, y)
    logits = 3 * torch.randn(n, c, generator=g, dtype=torch.float64)
    logits[torch.arange(n), pred] += 60 + 80 * torch.rand(n, generator=g, dtype=torch.float64)
    return Predictions(logits.softmax(-1).to(dtype)[None], y)


def test_the_temperature_scaler_applies_the_transform_its_fit_minimised():
    """The fit counts p < 1e-12 as 1e-12; a scaler tempering such probabilities exactly
    applied another transform: on the very validation split the fit's T gave an NLL of about
    1.4 (float32) and 1.7 (float64) where the fitted transform's was 0.57, and the same
    predictions in float32 and float64 (an underflowed 0) came out apart."""
    scaled = {}
    for dtype in (torch.float32, torch.float64):
        val = _overconfident(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (T may or may not sit near a bound)
            scaler = temperature_scale(val)
        t = scaler.temperature
        out = scaler(val)
        fitted = nll(out.probs.mean(0), val.targets)
        for other in (t * 0.9, t * 1.1, 1.0):  # T is the minimiser of what is applied
            assert fitted <= nll(TemperatureScaler(other)(val).probs.mean(0), val.targets)
        clamped = torch.softmax(val.probs.double().clamp_min(1e-12).log() / t, -1)
        torch.testing.assert_close(out.probs.double(), clamped, rtol=1e-5, atol=1e-7)
        scaled[dtype] = out.probs.double()
    assert bool((_overconfident(torch.float32).probs == 0).any())  # (the case that differed)
    torch.testing.assert_close(scaled[torch.float32], scaled[torch.float64], rtol=1e-4, atol=1e-6)
    hard = [
        TemperatureScaler(20.0)(Predictions(torch.tensor([[[1.0, 0.0, 0.0]]], dtype=dt))).probs
        for dt in (torch.float32, torch.float64)
    ]
    torch.testing.assert_close(hard[0].double(), hard[1], rtol=1e-6, atol=0)
    assert hard[1][0, 0, 1].item() == pytest.approx(0.167194, abs=1e-6)  # 1e-12^(1/20) tempered


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-308, 1.53e-307])
def test_a_temperature_whose_tempering_overflows_is_refused_when_made(temperature):
    """A subnormal T (1 / T is inf) and a T just above (1 / T finite, but log(1e-12) / T is
    not) were taken, and applied to uniform predictions over 10 classes made every tempered
    log-probability -inf: the NaNs were refused as the model's ("Expected finite probs ...
    check the model outputs"). Refused now, at the smallest T that does not overflow."""
    with pytest.raises(ValueError) as caught:
        TemperatureScaler(temperature)(Predictions(torch.full((1, 2, 10), 0.1)))
    assert str(caught.value).startswith(
        f"Expected a temperature of at least 1.54e-307, got {temperature!r}: the "
        "log-probabilities (down to log 1e-12 = -27.6) divided by it overflow float64 to -inf"
    )
    assert "Pass a larger T" in str(caught.value)
    assert "model outputs" not in str(caught.value)
    # the smallest T that passes tempers as T -> 0 does: one-hot on the top class, ties shared
    for dtype in (torch.float32, torch.float64):
        preds = Predictions(torch.tensor([[[0.1] * 10, [0.7] + [0.3 / 9] * 9]], dtype=dtype))
        probs = TemperatureScaler(1.54e-307)(preds).probs[0]
        assert probs[0].tolist() == pytest.approx([0.1] * 10)
        assert probs[1].tolist() == [1.0] + [0.0] * 9


def _logistic():
    """A Logistic(0, 0.5) prior the way torch's docs build one: a Uniform through the
    inverse of a sigmoid (an inverse transform holds the transform it inverts)."""
    return dist.TransformedDistribution(
        dist.Uniform(0.0, 1.0), [SigmoidTransform().inv, AffineTransform(0.0, 0.5)]
    )


@pytest.mark.parametrize("cast", ["none", "float64 network", "double() after"])
def test_a_prior_holding_an_inverse_transform_survives_conversion_and_casts(cast):
    """The opaque prior's copy set every transform's _inv to None, the strong reference of
    SigmoidTransform().inv to its transform included: bayesian(net, prior=...) then failed
    with "'NoneType' object has no attribute 'forward_shape'" (it worked before the copy)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 2))
    if cast == "float64 network":
        net = net.double()
    model = pyrouq.bayesian(net, prior=_logistic(), num_data=16)
    if cast == "double() after":
        model = model.double()
    dtype = torch.float32 if cast == "none" else torch.float64
    prior = next(m for m in model.modules() if isinstance(m, pyrouq.convert.SitePrior))
    value = torch.full(tuple(prior.shape), 0.3, dtype=dtype)
    got = prior.distribution().log_prob(value)
    expected = _logistic().log_prob(torch.tensor(0.3)).item() * value.numel()
    assert got.dtype == dtype
    assert got.item() == pytest.approx(expected, rel=1e-5)  # -0.7818 per entry
    x, y = torch.randn(16, 3, dtype=dtype), torch.arange(16) % 2
    guide = pyrouq.mean_field_guide(model)
    result = pyrouq.fit(model, guide, [(x, y)], epochs=2, num_data=16, progress=False)
    assert len(result.history) == 2


class _LowPrecision(PyroModule):
    """A 10-class classifier of one's own computing in a half dtype: its logits are small ReLU
    scores (rows summing to far less than 1), or, with ``probs``, the softmax."""

    def __init__(self, dtype, probs=False):
        super().__init__()
        self.fc = sampled_linear(4, 10, bias_scale=1.0)
        self.dtype, self.probs, self.num_data = dtype, probs, 40

    def forward(self, x, y=None):
        scores = self.fc(x)
        out = scores.softmax(-1) if self.probs else torch.relu(scores) * 0.05
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=scores), obs=y)
        return out.to(self.dtype)


def test_bfloat16_logits_are_not_taken_for_class_probabilities():
    """The refusal's tolerance on a row's sum was 16 C eps of the logits' dtype: 1.25 for
    bfloat16 and C = 10, so ReLU scores summing to ~0.3 were refused as 'class probabilities
    ... sums to 1'."""
    dtype = torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(40, 4)
    model = _LowPrecision(dtype)
    with torch.no_grad():
        sums = model(x).double().sum(-1)
    assert float((sums - 1).abs().min()) > 0.05  # nothing like probabilities
    preds = pyrouq.predict(model, x, num_samples=4, progress=False)
    assert preds.probs.shape == (4, 40, 10)
    with pytest.raises(ValueError, match=r"returned class probabilities, not logits"):
        pyrouq.predict(_LowPrecision(dtype, probs=True), x, num_samples=2, progress=False)
