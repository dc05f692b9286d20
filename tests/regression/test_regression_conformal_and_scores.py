"""Audit 2 of regression and recalibration: the mixture's scores against scipy, targets of
every accepted shape, multi-output conformal intervals, and the noise of half-precision
networks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import norm

from pyrouq.calibration import conformal, coverage
from pyrouq.likelihoods import Gaussian
from pyrouq.regression import GaussianPredictions, mixture_crps
from pyrouq.tabular import Standardizer


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_noise_of_a_half_precision_network_is_made_in_float32(dtype):
    outputs = torch.zeros(2, 3, 1, dtype=dtype)
    for value in (0.3, 1e-8, 1e5):  # bfloat16 held 0.30078; float16 made 1e-8 zero, 1e5 inf
        _, scale = Gaussian(value).predictive(outputs)
        assert scale.dtype == torch.float32
        assert torch.equal(scale, torch.full((2, 3, 1), value, dtype=torch.float32))
    raw = torch.tensor([[[0.25, 3.0]]], dtype=dtype)  # one mean, one raw scale
    loc, scale = Gaussian("heteroscedastic").predictive(raw)
    expected = 1e-3 + math.log1p(math.exp(float(raw[0, 0, 1])))  # the raw value is exact
    assert loc.item() == 0.25 and abs(scale.item() - expected) < 1e-6  # bf16: 3e-3 off


def test_the_crps_of_one_output_refuses_targets_that_only_have_n_values():
    loc, scale = torch.randn(4, 6), torch.rand(4, 6) + 0.1
    y = torch.randn(6)
    torch.testing.assert_close(mixture_crps(loc, scale, y[:, None]), mixture_crps(loc, scale, y))
    for wrong in (y[None], y.reshape(3, 2), y.reshape(2, 3, 1)):  # a row, pairs: not (N,)
        with pytest.raises(ValueError, match=r"expected y of shape \(6,\) \(or \(6, 1\)\)"):
            mixture_crps(loc, scale, wrong)


def test_the_mixture_nll_of_a_thousand_float32_draws_with_tiny_scales_matches_scipy():
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(1000, 20, 3, generator=g)
    scale = torch.rand(1000, 20, 3, generator=g) * 1e-6 + 1e-8
    y = loc[0] + 1e-7 * torch.randn(20, 3, generator=g)  # near one draw, far from the rest
    ours = GaussianPredictions(loc, scale).log_prob(y).numpy()
    lp = norm.logpdf(y.double().numpy()[None], loc.double().numpy(), scale.double().numpy())
    reference = logsumexp(lp.sum(-1), axis=0) - math.log(1000)
    np.testing.assert_allclose(ours, reference, rtol=1e-12)


def test_targets_of_one_output_give_one_result_in_every_shape():
    g = torch.Generator().manual_seed(1)
    p = GaussianPredictions(torch.randn(5, 30, 1, generator=g), torch.rand(5, 30, 1) + 0.2)
    y = torch.randn(30, generator=g)
    assert p.evaluate(y) == p.evaluate(y[:, None])
    a, b = conformal(p, y, score="cqr"), conformal(p, y[:, None], score="cqr")
    assert a == b and coverage(a.intervals(p), y) == coverage(a.intervals(p), y[:, None])


def test_multi_output_conformal_thresholds_are_per_output_ranks_by_hand():
    g = torch.Generator().manual_seed(2)
    loc, scale = torch.randn(3, 40, 2, generator=g), torch.rand(3, 40, 2, generator=g) + 0.2
    y = 2 * torch.randn(40, 2, generator=g)
    p = GaussianPredictions(loc, scale)
    k = math.ceil(41 * 0.9)  # 37th smallest of 40, per output
    mean = loc.double().mean(0)
    sd = (scale.double().square().mean(0) + loc.double().var(0, unbiased=False)).sqrt()
    by_hand = ((y - mean).abs() / sd).sort(0).values[k - 1]
    torch.testing.assert_close(conformal(p, y).threshold, by_hand, rtol=1e-12, atol=0)
    lo, hi = conformal(p, y).intervals(p)
    inside = ((y >= lo) & (y <= hi)).double().mean(0)
    assert inside.tolist() == [k / 40, k / 40]


def test_float64_statistics_rescale_every_score_as_by_hand():
    g = torch.Generator().manual_seed(3)
    y = torch.stack(
        [123456 + 10 * torch.randn(60, generator=g, dtype=torch.float64),
         1e-3 * torch.randn(60, generator=g, dtype=torch.float64)], -1,
    )  # fmt: skip
    scaler = Standardizer.fit(torch.randn(60, 2, generator=g), y)
    z = scaler.transform_y(y)
    loc = (z[None] + 0.3 * torch.randn(4, 60, 2, generator=g, dtype=torch.float64)).float()
    p = GaussianPredictions(loc, torch.rand(4, 60, 2, generator=g) + 0.5, z.float())
    r = scaler.inverse(p)
    std = scaler.y_std
    torch.testing.assert_close(r.epistemic_variance, p.epistemic_variance.double() * std**2)
    torch.testing.assert_close(r.aleatoric_variance, p.aleatoric_variance.double() * std**2)
    before, after = p.evaluate(), r.evaluate()
    assert after["nll"] == pytest.approx(before["nll"] + float(std.log().sum()), abs=1e-9)
    assert after["calibration_error"] == before["calibration_error"]
    cqr, cqr_units = conformal(p, score="cqr"), conformal(r, score="cqr")
    torch.testing.assert_close(cqr_units.threshold, cqr.threshold * std, rtol=1e-6, atol=0)


def test_targets_whose_score_is_the_threshold_are_inside_their_interval():
    # N(0.1, 0.6^2) in float32; counts 0 and 3: every 3 scores |3 - 0.1| / 0.6, the threshold,
    # and 0.1 + threshold * 0.6 rounds to 2.9999999999999996: the ten tied 3s fell out together
    preds = GaussianPredictions(torch.full((1, 19, 1), 0.1), torch.full((1, 19, 1), 0.6))
    y = torch.tensor([0.0] * 9 + [3.0] * 10)
    predictor = conformal(preds, y, alpha=0.1)  # the 18th smallest score: a 3's
    lo, hi = predictor.intervals(preds)
    assert coverage((lo, hi), y) == 1.0  # was 9 / 19
    width = 2 * (3 - float(torch.tensor(0.1)))  # only ulps wider than 2 * threshold * sd
    assert (hi - lo).max().item() == pytest.approx(width, rel=1e-14)
    cqr = conformal(preds, y, alpha=0.1, score="cqr")
    assert coverage(cqr.intervals(preds), y) == 1.0


@pytest.mark.parametrize("score", ["abs", "cqr"])
@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_a_target_is_inside_its_interval_exactly_when_its_score_says_so(score, offset):
    from pyrouq._conformal_scores import _regression_scores

    g = torch.Generator().manual_seed(4)
    loc = offset + torch.randn(3, 200, 2, generator=g, dtype=torch.float64)
    preds = GaussianPredictions(loc, torch.rand(3, 200, 2, generator=g, dtype=torch.float64) + 0.1)
    y = loc[0] + torch.randn(200, 2, generator=g, dtype=torch.float64)
    predictor = conformal(preds, y, alpha=0.2, score=score)
    lo, hi = predictor.intervals(preds)
    up, down = torch.full_like(hi, math.inf), torch.full_like(lo, -math.inf)
    for bound in (lo, hi):  # the floats next to each bound, 3 ulps either way
        below = above = bound
        for _ in range(3):
            below, above = torch.nextafter(below, down), torch.nextafter(above, up)
            for t in (below, above, bound):
                scores = _regression_scores(preds, t, score, predictor.alpha)
                assert torch.equal((t >= lo) & (t <= hi), scores <= predictor.threshold)


def test_conformal_names_val_targets_and_says_what_to_do_with_their_shape():
    """conformal(val_preds, val_targets) of a regression refused bad targets as 'targets'
    (the classifiers' refusals name val_targets) and said nothing of what to do: targets of
    the inputs transposed, or a row of one output's, are told .T."""
    two = GaussianPredictions(torch.zeros(1, 5, 2), torch.ones(1, 5, 2))
    with pytest.raises(ValueError, match=r"^Expected val_targets of shape \(5, 2\), one per "
                       r"input and output, got shape \(2, 5\)\. They hold an input per column: "
                       r"pass val_targets\.T "):  # fmt: skip
        conformal(two, torch.randn(2, 5), alpha=0.2)
    one = GaussianPredictions(torch.zeros(1, 5, 1), torch.ones(1, 5, 1))
    with pytest.raises(ValueError, match=r"got shape \(1, 5\)\. .*pass val_targets\.T "):
        conformal(one, torch.randn(1, 5), alpha=0.2)
    with pytest.raises(TypeError, match=r"^Expected real val_targets .* use val_targets\.float"):
        conformal(one, torch.arange(5), alpha=0.2)
    with pytest.raises(ValueError, match=r"got shape \(2, 5\)\. .*pass targets\.T "):
        two.evaluate(torch.randn(2, 5))  # (evaluate's argument is targets)
    with pytest.raises(ValueError, match=r"got shape \(7,\)\. Pass the targets of exactly the "
                       r"inputs predicted, one row per input\.$"):  # fmt: skip
        one.crps(torch.randn(7))
    assert conformal(two, torch.randn(2, 5).T, alpha=0.2).threshold.shape == (2,)  # as told


def test_targets_of_each_input_but_not_its_outputs_are_told_of_the_outputs():
    """Targets with a row per input whose values are not the predictions' outputs were told
    to 'pass the targets of exactly the inputs predicted, one row per input', which they
    were already: they are told the outputs instead, or a reshape where the values are there
    in more dims."""
    two = GaussianPredictions(torch.zeros(1, 5, 2), torch.ones(1, 5, 2))
    one = GaussianPredictions(torch.zeros(1, 5, 1), torch.ones(1, 5, 1))
    outputs = r"pass the targets of the outputs the model predicts, one column per output\.$"
    with pytest.raises(ValueError, match=rf"\(5,\)\. They hold 1 value per input, the "
                       rf"predictions 2 outputs: {outputs}"):  # fmt: skip
        two.evaluate(torch.randn(5))
    with pytest.raises(ValueError, match=rf"\(5, 2\)\. They hold 2 values per input, the "
                       rf"predictions 1 output: {outputs}"):  # fmt: skip
        conformal(one, torch.randn(5, 2), alpha=0.2)
    with pytest.raises(ValueError, match=r"got shape \(5, 2, 1\)\. Pass them as one row per "
                       r"input, val_targets\.reshape\(5, 2\)\.$"):  # fmt: skip
        conformal(two, torch.randn(5, 2, 1), alpha=0.2)
    y = torch.randn(5, 2, 1)
    assert torch.equal(two.crps(y.reshape(5, 2)), two.crps(y[..., 0]))  # the reshape told works
    # a reshape is told only where it gives the shape: not for 3 values per input where the
    # predictions have 2 outputs, nor for one target where there are 5 inputs
    for preds, y in ((two, torch.randn(5, 3, 1)), (one, torch.tensor(0.5))):
        with pytest.raises(ValueError) as info:
            preds.crps(y)
        assert str(info.value).endswith(". Pass the targets of exactly the inputs predicted, "
                                        "one row per input.")  # fmt: skip
