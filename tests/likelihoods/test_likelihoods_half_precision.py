"""Third audit of the likelihoods and the decompositions: half-precision outputs scored in
float32 (a float16 classifier's N/B-scaled log-likelihood overflowed to -inf, a bfloat16 one
kept 3 digits), a one-logit classifier refused before it trains on a log-likelihood of 0,
targets on another device than the outputs told as such, and a differentiable decompose()
read without torch's warning."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import pytest
import scipy.stats
import torch
import torch.nn.functional as F
from torch import nn

import pyrouq
from pyrouq.likelihoods import Categorical, Gaussian
from pyrouq.uncertainty import decompose

N, B = 60_000, 128  # MNIST's size, a usual batch: N/B * a batch's NLL passes float16's 65,504


def _trace_log_prob(likelihood, outputs, y) -> float:
    trace = pyro.poutine.trace(lambda: likelihood.observe(outputs, y, N, "M")).get_trace()
    return float(trace.log_prob_sum().detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_are_scored_in_float32(dtype):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, 10, generator=g).to(dtype)
    y = torch.randint(0, 10, (B,), generator=g)
    want = N / B * float(F.cross_entropy(logits.double(), y, reduction="sum"))  # ~ 166,000
    lik = Categorical()
    fast = lik.nll(logits, y) * (N / B)  # what fit() back-propagates
    # float16 gave inf (the scaled sum overflowed), bfloat16 160,768 for 159,885
    assert fast.dtype == torch.float32
    assert float(fast) == pytest.approx(want, rel=1e-6)
    # the obs site, as pyro's own ELBOs read it: -inf in float16, 159,744 in bfloat16
    assert _trace_log_prob(lik, logits, y) == pytest.approx(-want, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["fixed", "learned", "heteroscedastic"])
def test_half_precision_gaussian_is_scored_in_float32(dtype, mode):
    g = torch.Generator().manual_seed(1)
    width = 2 if mode == "heteroscedastic" else 1
    outputs = torch.randn(B, width, generator=g).to(dtype)
    y = torch.randn(B, generator=g)
    wide = outputs.double()
    if mode == "fixed":
        lik, loc, scale = Gaussian(0.3), wide, torch.tensor(0.3, dtype=torch.float64)
    elif mode == "learned":
        lik, loc, scale = Gaussian("learned"), wide, torch.tensor(1.0, dtype=torch.float64)
    else:
        lik = Gaussian("heteroscedastic")
        loc, scale = wide[:, :1], 1e-3 + F.softplus(wide[:, 1:])
    got = float(lik.nll(outputs, y).detach()) * N / B
    if mode == "learned":  # softplus of the raw scale as stored (in the network's dtype)
        scale = F.softplus(lik.raw_scale.detach().double())
    want = N / B * float(torch.distributions.Normal(loc, scale).log_prob(y.double()[:, None]).sum())
    # a fixed 0.3 was 0.30078 in bfloat16 (0.2998 in float16): 0.5 % off, 3,000 nats here
    assert got == pytest.approx(-want, rel=2e-6)
    assert _trace_log_prob(lik, outputs, y) == pytest.approx(want, rel=2e-6)
    if mode == "learned":  # the learned noise itself is still made in the network's dtype
        assert lik.raw_scale.dtype == dtype


def test_float64_outputs_stay_float64():
    logits = torch.randn(5, 3, dtype=torch.float64)
    y = torch.tensor([0, 2, 1, 1, 0])
    assert Categorical().nll(logits, y).dtype == torch.float64
    assert Gaussian(0.5).nll(logits[:, :1], logits[:, 0]).dtype == torch.float64


def test_the_categorical_obs_site_is_the_scaled_log_softmax_at_the_labels():
    logits = torch.randn(4, 6, 3, dtype=torch.float64)  # S = 4 members
    y = torch.tensor([0, 2, 1, 1, 0, 2])
    trace = pyro.poutine.trace(
        lambda: Categorical().observe(logits, y, 30, "M", members=4)
    ).get_trace()
    want = 30 / 6 * F.log_softmax(logits, -1)[:, torch.arange(6), y].sum()
    assert float(trace.log_prob_sum()) == pytest.approx(float(want), rel=1e-12)
    assert float(Categorical().nll(logits, y)) == pytest.approx(-float(want) * 6 / 30, rel=1e-12)


def test_a_classifier_with_one_logit_is_refused_even_when_every_label_is_0():
    # labels all 0 passed the range check: fit() trained on an NLL of exactly 0 (the prior
    # alone) and predict() refused the model afterwards
    message = r"M: got logits of one class \(outputs of shape \(4, 1\)\).*C >= 2 logits"
    with pytest.raises(ValueError, match=message):
        Categorical().observe(torch.randn(4, 1), torch.zeros(4, dtype=torch.long), 4, "M")
    x, y = torch.randn(8, 3), torch.zeros(8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"got logits of one class.*give the last layer 2"):
        pyrouq.fit(nn.Linear(3, 1), None, [(x, y)], epochs=1, num_data=8, progress=False)


@pytest.mark.parametrize(
    ("likelihood", "width", "y"),
    [(Categorical(), 3, torch.tensor([0, 1, 2])), (Gaussian(0.5), 1, torch.randn(3))],
)
def test_targets_on_another_device_are_told_as_such(likelihood, width, y):
    # torch's "Expected all tensors to be on the same device ... wrapper_CUDA_gather" before
    outputs = torch.randn(3, width, device="meta")
    message = (
        r"^M: the targets y are on cpu, the outputs on meta; expected both on one device: "
        r"move the targets with y.to\('meta'\).$"
    )
    with pytest.raises(ValueError, match=message):
        likelihood.observe(outputs, y, 3, "M")


def _probs(zeros: bool = True) -> torch.Tensor:
    p = torch.softmax(2 * torch.randn(5, 7, 4, dtype=torch.float64), -1)
    if zeros:
        p[0, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
        p[:, 1] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    return p


@pytest.mark.parametrize("base", [2, math.e, 10])
def test_entropy_decomposition_against_scipy(base):
    p = _probs()
    d = decompose(p, "entropy", base)
    total = scipy.stats.entropy(p.mean(0).numpy(), base=base, axis=-1)
    aleatoric = scipy.stats.entropy(p.numpy(), base=base, axis=-1).mean(0)
    np.testing.assert_allclose(d.total.numpy(), total, rtol=0, atol=1e-12)
    np.testing.assert_allclose(d.aleatoric.numpy(), aleatoric, rtol=0, atol=1e-12)
    np.testing.assert_allclose(d.epistemic.numpy(), total - aleatoric, rtol=0, atol=1e-12)


def test_decompose_of_probabilities_that_require_grad_reads_no_scalar_off_the_graph():
    # _clamp_roundoff read float(epistemic.min()) off the graph: torch's "Converting a tensor
    # with requires_grad=True to a scalar" warning, for every measure
    p = _probs(zeros=False).requires_grad_(True)
    always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)  # torch warns once a process: an earlier test may have
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for measure in ("entropy", "variance", "zero_one"):
                d = decompose(p, measure)
                d.epistemic.sum().backward()
    finally:
        torch.set_warn_always(always)
    assert bool(torch.isfinite(p.grad).all())
