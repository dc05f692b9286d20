"""Audit 9: recalibration, likelihoods and data against independent references.

Temperature scaling against a brute-force NLL grid over log T (computed here by hand), the
conformal thresholds and sets against the rank ``ceil((n + 1)(1 - alpha))`` and the scores
written out here, their coverage over many random splits of one pool (whose expectation is
exactly ``k / (n + 1)``), every likelihood against ``torch.distributions``, the decompositions
by hand, and the bundled MNIST / Fashion-MNIST against the raw IDX files of ../shared/data.
"""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pyrouq
from pyrouq import GaussianPredictions, Predictions
from pyrouq.calibration import (
    TemperatureScaler,
    conformal,
    coverage,
    mean_set_size,
    temperature_scale,
)
from pyrouq.likelihoods import Categorical, Gaussian

# --------------------------------------------------------------------------------------------
# Temperature scaling: a brute-force grid over log T
# --------------------------------------------------------------------------------------------


def _grid_nll(logp: torch.Tensor, y: torch.Tensor, log_t: torch.Tensor, mean_first: bool):
    """The validation NLL at every log T of ``log_t``, by hand: each draw's log-probabilities
    divided by T and renormalised, then the draws' probabilities averaged (or, with
    ``mean_first``, the mean's log-probabilities tempered: the other recipe)."""
    if mean_first:
        logp = logp.exp().mean(0, keepdim=True).log()
    t = log_t.exp()[:, None, None, None]  # (K, 1, 1, 1)
    z = logp[None] / t  # (K, S, N, C)
    q = z - z.logsumexp(-1, keepdim=True)
    mix = q.exp().mean(1)  # (K, N, C)
    return -mix.gather(2, y[None, :, None].expand(len(log_t), -1, 1)).log().mean((1, 2))


def _brute_force_t(logp, y, mean_first=False):
    lo, hi = math.log(0.05), math.log(20.0)
    coarse = torch.linspace(lo, hi, 2001, dtype=torch.float64)
    best = coarse[_grid_nll(logp, y, coarse, mean_first).argmin()]
    step = float(coarse[1] - coarse[0])
    fine = torch.linspace(float(best) - step, float(best) + step, 2001, dtype=torch.float64)
    return float(fine[_grid_nll(logp, y, fine, mean_first).argmin()].exp())


def _logits_and_labels(draws: int, seed: int, n: int = 300, c: int = 5):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, n, c, generator=g, dtype=torch.float64)
    logits = 3 * torch.randn(draws, n, c, generator=g, dtype=torch.float64) + shared
    truth = torch.distributions.Categorical(logits=logits.mean(0) / 2.5)
    torch.manual_seed(seed)
    return logits, truth.sample()


@pytest.mark.parametrize("draws", [1, 4])
def test_the_temperature_is_the_minimiser_of_the_mixture_nll_on_a_brute_force_grid(draws):
    logits, y = _logits_and_labels(draws, seed=draws)
    probs = torch.softmax(logits, -1)
    fitted = temperature_scale(Predictions(probs, y)).temperature
    logp = probs.log()  # no probability here is below the 1e-12 clamp
    assert float(probs.min()) > 1e-12
    reference = _brute_force_t(logp, y)
    # the fine grid's step is 2e-6 in log T; the search stops within 1e-6 in log T
    assert abs(math.log(fitted) - math.log(reference)) < 1e-5
    assert 1.3 < fitted < 5  # over-confident logits: T well above 1 (the grid's answer)
    if draws > 1:  # tempering the mean instead would have fitted another T
        assert abs(_brute_force_t(logp, y, mean_first=True) - fitted) > 0.05
    # float32 probabilities give the same temperature
    assert temperature_scale(Predictions(probs.float(), y)).temperature == pytest.approx(
        fitted, rel=1e-4
    )


def test_the_scaler_tempers_each_draw_and_averages_the_probabilities():
    logits, y = _logits_and_labels(3, seed=7, n=20)
    probs = torch.softmax(logits, -1)
    scaled = TemperatureScaler(2.5)(Predictions(probs, y))
    by_hand = torch.softmax(probs.log() / 2.5, -1)  # each draw: p_s^(1/T), renormalised
    torch.testing.assert_close(scaled.probs, by_hand, rtol=0, atol=1e-12)
    torch.testing.assert_close(scaled.mean_probs, by_hand.mean(0), rtol=0, atol=1e-12)
    assert torch.equal(scaled.targets, y)


# --------------------------------------------------------------------------------------------
# Conformal classification
# --------------------------------------------------------------------------------------------


def _pool(n: int = 1200, c: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(n, c, generator=g, dtype=torch.float64)
    u = torch.rand(n, 1, generator=g, dtype=torch.float64)
    cum = torch.softmax(logits, -1).cumsum(-1)
    y = (u > cum).sum(-1).clamp_max(c - 1)  # labels drawn from softmax(logits)
    return torch.softmax(0.7 * logits, -1)[None], y  # predictions: under-confident


def _aps_by_hand(pbar, u, lam=None, k_reg=1):
    """Romano et al.'s randomised APS score of every class (the mass of the classes ranked
    above it plus u times its own), and RAPS's rank penalty, written out class by class."""
    n, c = pbar.shape
    out = torch.empty_like(pbar)
    for i in range(n):
        order = sorted(range(c), key=lambda j: (-float(pbar[i, j]), j))
        above = 0.0
        for rank, j in enumerate(order, start=1):
            score = above + float(u[i]) * float(pbar[i, j])
            if lam is not None:
                score += lam * max(0, rank - k_reg)
            out[i, j] = score
            above += float(pbar[i, j])
    return out


@pytest.mark.parametrize("alpha", [0.1, 0.23])
def test_lac_threshold_and_sets_follow_the_conformal_rank(alpha):
    probs, y = _pool()
    n = 100
    cal = conformal(Predictions(probs[:, :n], y[:n]), alpha=alpha)
    k = math.ceil((n + 1) * (1 - alpha))  # 91 and 78 (ceil(n (1 - alpha)): 90 and 77)
    assert k == {0.1: 91, 0.23: 78}[alpha]
    scores = 1 - probs[0, :n].gather(1, y[:n, None])[:, 0]
    assert cal.threshold == float(scores.sort().values[k - 1])
    assert cal.num_calibration == n and cal.num_classes == 6
    test = Predictions(probs[:, n:])
    assert torch.equal(cal.predict_sets(test), 1 - probs[0, n:] <= cal.threshold)


@pytest.mark.parametrize("score", ["aps", "raps"])
def test_aps_and_raps_scores_and_sets_match_the_scores_written_out(score):
    probs, y = _pool(n=60)
    lam = 0.05 if score == "raps" else None
    cal = conformal(Predictions(probs[:, :40], y[:40]), alpha=0.2, score=score, seed=3, lam=0.05)
    u = torch.rand(40, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    true = _aps_by_hand(probs[0, :40], u, lam).gather(1, y[:40, None])[:, 0]
    k = math.ceil(41 * 0.8)  # 33
    assert cal.threshold == pytest.approx(float(true.sort().values[k - 1]), abs=1e-12)
    u_test = torch.rand(20, 1, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    sets = cal.predict_sets(Predictions(probs[:, 40:]), seed=11)
    assert torch.equal(sets, _aps_by_hand(probs[0, 40:], u_test, lam) <= cal.threshold + 1e-12)


@pytest.mark.parametrize("score", ["lac", "aps", "raps"])
def test_coverage_over_random_splits_is_k_over_n_plus_one_on_average(score):
    """Calibrating on n of a pool and testing on the rest, the expected coverage over random
    splits is exactly k / (n + 1) for continuous scores: k = ceil(45 * 0.9) = 41, 41 / 45 =
    0.911, between 1 - alpha and 1 - alpha + 1 / (n + 1) = 0.922 (the rank ceil(n (1 - alpha))
    = 40 would give 0.889)."""
    probs, y = _pool()
    n, alpha, splits = 44, 0.1, 600
    g = torch.Generator().manual_seed(1)
    covered, sizes = [], []
    for split in range(splits):
        order = torch.randperm(probs.shape[1], generator=g)
        cal_i, test_i = order[:n], order[n:]
        cal = conformal(
            Predictions(probs[:, cal_i], y[cal_i]), alpha=alpha, score=score, seed=split
        )
        sets = cal.predict_sets(Predictions(probs[:, test_i]))
        covered.append(coverage(sets, y[test_i]))
        sizes.append(mean_set_size(sets))
    mean = sum(covered) / splits
    # the sd of one split's coverage is about 0.04 (that of its threshold's rank): 0.0017 over
    # 600 (1,500 splits measured 0.9106 and 0.9113 for LAC, 0.9104 and 0.9111 for APS)
    assert abs(mean - 41 / 45) < 0.01
    assert 1.5 < sum(sizes) / splits < 6  # informative sets, not all classes


# --------------------------------------------------------------------------------------------
# Conformal regression
# --------------------------------------------------------------------------------------------


def _gaussian_pool(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    loc = 0.5 * torch.randn(3, n, 2, generator=g, dtype=torch.float64)
    scale = torch.rand(3, n, 2, generator=g, dtype=torch.float64) + 0.3
    y = loc[0] + 1.5 * torch.randn(n, 2, generator=g, dtype=torch.float64)
    return loc, scale, y


def _mixture_quantile(loc, scale, level):
    lo = torch.full(loc.shape[1:], -60.0, dtype=torch.float64)
    hi = -lo
    for _ in range(100):
        mid = (lo + hi) / 2
        below = torch.distributions.Normal(loc, scale).cdf(mid.expand_as(loc)).mean(0) < level
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return (lo + hi) / 2


def test_abs_and_cqr_thresholds_and_widths_by_hand():
    loc, scale, y = _gaussian_pool(200)
    preds = GaussianPredictions(loc, scale, y)
    k = math.ceil(201 * 0.9)  # 181
    mean = loc.mean(0)
    sd = ((scale**2).mean(0) + loc.var(0, unbiased=False)).sqrt()  # law of total variance
    cal = conformal(preds, alpha=0.1)
    q = ((y - mean).abs() / sd).sort(0).values[k - 1]
    torch.testing.assert_close(cal.threshold, q, rtol=0, atol=1e-12)
    lo, hi = cal.intervals(preds)
    torch.testing.assert_close(hi - lo, 2 * q * sd, rtol=0, atol=1e-10)
    torch.testing.assert_close((hi + lo) / 2, mean, rtol=0, atol=1e-10)

    cqr = conformal(preds, alpha=0.1, score="cqr")
    ql, qh = _mixture_quantile(loc, scale, 0.05), _mixture_quantile(loc, scale, 0.95)
    q = torch.maximum(ql - y, y - qh).sort(0).values[k - 1]
    torch.testing.assert_close(cqr.threshold, q, rtol=0, atol=1e-9)
    lo, hi = cqr.intervals(preds)
    torch.testing.assert_close(lo, ql - q, rtol=0, atol=1e-9)
    torch.testing.assert_close(hi, qh + q, rtol=0, atol=1e-9)


def test_abs_intervals_cover_k_over_n_plus_one_over_random_splits():
    loc, scale, y = _gaussian_pool(300, seed=2)
    n, alpha, splits = 42, 0.2, 600  # k = ceil(43 * 0.8) = 35: 35 / 43 = 0.814 (34: 0.791)
    g = torch.Generator().manual_seed(5)
    covered = []
    for _ in range(splits):
        order = torch.randperm(300, generator=g)
        c, t = order[:n], order[n:]
        cal = conformal(GaussianPredictions(loc[:, c], scale[:, c], y[c]), alpha=alpha)
        covered.append(coverage(cal.intervals(GaussianPredictions(loc[:, t], scale[:, t])), y[t]))
    assert abs(sum(covered) / splits - 35 / 43) < 0.01  # a split's sd: 0.06; 0.0025 over 600


# --------------------------------------------------------------------------------------------
# Likelihoods against torch.distributions
# --------------------------------------------------------------------------------------------


def test_categorical_nll_log_prob_and_probabilities_are_torchs():
    g = torch.Generator().manual_seed(0)
    out, y = torch.randn(3, 5, 4, generator=g), torch.randint(0, 4, (5,), generator=g)
    reference = torch.distributions.Categorical(logits=out)
    lik = Categorical()
    assert lik.nll(out, y).item() == pytest.approx(-reference.log_prob(y).sum().item(), rel=1e-6)
    torch.testing.assert_close(lik.distribution(out).log_prob(y), reference.log_prob(y))
    torch.testing.assert_close(lik.predictive(out), reference.probs)


def _gaussian_cases():
    g = torch.Generator().manual_seed(1)
    out = torch.randn(3, 5, 2, generator=g)
    wide = torch.randn(3, 5, 4, generator=g)
    sigma = torch.rand(3, 2, generator=g) + 0.2
    learned = Gaussian("learned")
    learned.prepare(out)
    with torch.no_grad():
        learned.raw_scale.copy_(torch.tensor([-1.0, 2.0]))
    return [
        (Gaussian(0.3), out, None, out, torch.full_like(out, 0.3)),
        (learned, out, None, out, F.softplus(torch.tensor([-1.0, 2.0])).expand_as(out)),
        (
            Gaussian("heteroscedastic", min_scale=0.01),
            wide,
            None,
            wide[..., :2],
            0.01 + F.softplus(wide[..., 2:]),
        ),
        (
            Gaussian(dist.HalfNormal(torch.ones(2))),
            out,
            {"sigma": sigma},
            out,
            sigma[:, None, :].expand_as(out),
        ),
        (
            Gaussian(dist.HalfNormal(1.0)),
            out,
            {"sigma": sigma[:, 0]},
            out,
            sigma[:, None, :1].expand_as(out),
        ),
    ]


@pytest.mark.parametrize("case", range(5), ids=["fixed", "learned", "hetero", "latent-D", "latent"])
def test_gaussian_nll_log_prob_and_moments_are_torchs(case):
    lik, out, latent, loc, scale = _gaussian_cases()[case]
    y = torch.randn(5, 2, generator=torch.Generator().manual_seed(2))
    reference = torch.distributions.Normal(loc, scale)
    expected = -reference.log_prob(y).sum().item()
    assert lik.nll(out, y, latent).item() == pytest.approx(expected, rel=1e-6)
    log_prob = lik.distribution(out, latent).log_prob(y)
    torch.testing.assert_close(log_prob, reference.log_prob(y).sum(-1))
    got_loc, got_scale = lik.predictive(out, latent)
    torch.testing.assert_close(got_loc, loc)
    torch.testing.assert_close(got_scale, scale)


@pytest.mark.parametrize("likelihood", ["categorical", "fixed", "hetero", "latent"])
def test_the_observation_is_scaled_n_over_b_and_predict_returns_the_draws_moments(likelihood):
    lik = {
        "categorical": "categorical",
        "fixed": Gaussian(0.3),
        "hetero": Gaussian("heteroscedastic"),
        "latent": Gaussian(dist.HalfNormal(torch.ones(2))),
    }[likelihood]
    net = nn.Linear(3, 4 if likelihood == "hetero" else 2)
    model = pyrouq.bayesian(net, likelihood=lik, num_data=70)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 3, generator=g)
    y = torch.randint(0, 2, (7,), generator=g) if likelihood == "categorical" else torch.randn(7, 2)
    trace = pyro.poutine.trace(model).get_trace(x, y)
    trace.compute_log_prob()
    obs = trace.nodes["obs"]
    out = trace.nodes["logits" if likelihood == "categorical" else "outputs"]["value"]
    if likelihood == "categorical":
        ref = torch.distributions.Categorical(logits=out).log_prob(y)
    elif likelihood == "hetero":
        ref = torch.distributions.Normal(out[:, :2], 1e-3 + F.softplus(out[:, 2:])).log_prob(y)
    elif likelihood == "fixed":
        ref = torch.distributions.Normal(out, 0.3).log_prob(y)
    else:
        ref = torch.distributions.Normal(out, trace.nodes["sigma"]["value"]).log_prob(y)
    assert obs["scale"] == 10.0  # N / B = 70 / 7
    assert obs["log_prob_sum"].item() == pytest.approx(10 * ref.sum().item(), rel=1e-5)

    # predict() on given draws: each draw's outputs through the likelihood, by hand
    weight = torch.randn(4, *net.weight.shape, generator=g)
    bias = torch.randn(4, *net.bias.shape, generator=g)
    draws = {"weight": weight, "bias": bias}
    if likelihood == "latent":
        draws["sigma"] = torch.rand(4, 2, generator=g) + 0.2
    preds = pyrouq.predict(model, x, posterior_samples=draws)
    outputs = torch.einsum("soi,ni->sno", weight, x) + bias[:, None, :]
    if likelihood == "categorical":
        torch.testing.assert_close(preds.probs, torch.softmax(outputs, -1))
    elif likelihood == "hetero":
        torch.testing.assert_close(preds.loc, outputs[..., :2])
        torch.testing.assert_close(preds.scale, 1e-3 + F.softplus(outputs[..., 2:]))
    else:
        torch.testing.assert_close(preds.loc, outputs)
        scale = 0.3 if likelihood == "fixed" else draws["sigma"][:, None, :]
        torch.testing.assert_close(preds.scale, torch.ones_like(outputs) * scale)


def test_decompositions_by_hand():
    g = torch.Generator().manual_seed(4)
    loc = torch.randn(5, 6, 2, generator=g, dtype=torch.float64)
    scale = torch.rand(5, 6, 2, generator=g, dtype=torch.float64) + 0.1
    d = GaussianPredictions(loc, scale).uncertainty()
    aleatoric = (scale**2).mean(0).sum(-1)  # mean_s sigma_s^2, summed over the outputs
    mean = loc.mean(0)
    epistemic = ((loc - mean) ** 2).mean(0).sum(-1)  # var_s mu_s (divided by S)
    torch.testing.assert_close(d.aleatoric, aleatoric)
    torch.testing.assert_close(d.epistemic, epistemic)
    torch.testing.assert_close(d.total, aleatoric + epistemic)

    probs = torch.softmax(torch.randn(5, 6, 3, generator=g, dtype=torch.float64), -1)

    def entropy(p):
        return -(p * p.log()).sum(-1)

    d = Predictions(probs).uncertainty(base=2)
    total, aleatoric = entropy(probs.mean(0)) / math.log(2), entropy(probs).mean(0) / math.log(2)
    torch.testing.assert_close(d.total, total)
    torch.testing.assert_close(d.aleatoric, aleatoric)
    kl = (probs * (probs.log() - probs.mean(0).log())).sum(-1).mean(0) / math.log(2)
    torch.testing.assert_close(d.epistemic, kl)  # the mutual information: mean KL to the mean


# --------------------------------------------------------------------------------------------
# Data: the bundled files against the raw IDX files
# --------------------------------------------------------------------------------------------


def _read_idx(path):
    raw = path.read_bytes()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim :]), dtype=torch.uint8).reshape(dims)


MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.mark.parametrize(
    "folder, split, prefix, counts",
    [
        ("MNIST", "train", "train", MNIST_TRAIN_COUNTS),
        ("MNIST", "test", "t10k", MNIST_TEST_COUNTS),
        ("FashionMNIST", "test", "t10k", [1000] * 10),
    ],
)
def test_bundled_arrays_are_the_raw_idx_files(shared_data, folder, split, prefix, counts):
    reader = pyrouq.data.mnist_arrays if folder == "MNIST" else pyrouq.data.fashion_mnist_arrays
    images, labels = reader(split)  # the bundled copy
    raw_images = _read_idx(shared_data / folder / "raw" / f"{prefix}-images-idx3-ubyte")
    raw_labels = _read_idx(shared_data / folder / "raw" / f"{prefix}-labels-idx1-ubyte")
    assert images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert torch.equal(images[0], raw_images[0]) and torch.equal(images[-1], raw_images[-1])
    assert torch.equal(images, raw_images) and torch.equal(labels, raw_labels.long())
    assert torch.bincount(labels, minlength=10).tolist() == counts


def test_normalisation_constants_seeds_and_the_last_batch(shared_data):
    images, _ = pyrouq.data.mnist_arrays("train")
    pixels = images.double() / 255
    assert pixels.mean().item() == pytest.approx(pyrouq.data.MNIST_MEAN, abs=1e-4)
    assert pixels.std().item() == pytest.approx(pyrouq.data.MNIST_STD, abs=1e-4)

    train, test = pyrouq.load_mnist(batch_size=1000, seed=3, train_size=2500)
    again, _ = pyrouq.load_mnist(batch_size=1000, seed=3, train_size=2500)
    first = [y for _, y in train]
    assert [len(y) for y in first] == [1000, 1000, 500]  # no batch dropped
    assert all(torch.equal(a, b) for a, b in zip(first, [y for _, y in again], strict=True))
    second = [y for _, y in train]  # the next epoch: another order of the same examples
    assert not all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert torch.equal(torch.cat(first).sort().values, torch.cat(second).sort().values)

    x, y = next(iter(test))  # the test loader never shuffles: the file's order
    raw = _read_idx(shared_data / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[:1000]
    torch.testing.assert_close(x[:, 0], (raw.float() / 255 - 0.1307) / 0.3081)
    assert y[:5].tolist() == [7, 2, 1, 0, 4]


# --------------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------------


def _class_preds():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(1, 20, 3, generator=g), -1)
    return Predictions(probs, torch.randint(0, 3, (20,), generator=g))


@pytest.mark.parametrize("alpha", [0, 1, -0.1, 1.5, float("nan")])
def test_an_alpha_outside_0_1_is_refused(alpha):
    with pytest.raises(ValueError, match=r"Expected alpha in \(0, 1\), the allowed miscoverage"):
        conformal(_class_preds(), alpha=alpha)


def test_refusals_name_what_came_and_what_to_do():
    preds = _class_preds()
    with pytest.raises(ValueError, match=r"needs at least 99 calibration points .* got 20"):
        conformal(preds, alpha=0.01)
    with pytest.raises(ValueError, match=r"non-empty probs, got shape \(1, 0, 3\)"):
        conformal(Predictions(preds.probs[:, :0]), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"targets in \[0, 3\) .* got values in \[1, 3\]"):
        conformal(Predictions(preds.probs), preds.targets + 1)
    with pytest.raises(ValueError, match=r"targets in \[0, 3\) .* got values in \[-1, "):
        temperature_scale(Predictions(preds.probs), preds.targets - 1)
    cal = conformal(preds)
    other = Predictions(torch.softmax(torch.randn(1, 4, 5), -1))
    with pytest.raises(ValueError, match="have 5 classes, the calibration predictions had 3"):
        cal.predict_sets(other)
    with pytest.raises(ValueError, match="Expected finite probs"):
        Predictions(torch.full((1, 2, 3), float("nan")))
    gaussian = GaussianPredictions(torch.zeros(2, 20, 1), torch.ones(2, 20, 1), torch.zeros(20))
    with pytest.raises(TypeError, match="got GaussianPredictions; a regression model's"):
        temperature_scale(gaussian)
    with pytest.raises(TypeError, match="got GaussianPredictions; a regression model's"):
        cal.predict_sets(gaussian)
    with pytest.raises(ValueError, match="'lac' scores classification"):
        conformal(gaussian, score="lac")
    with pytest.raises(TypeError, match="Expected GaussianPredictions, got Predictions"):
        conformal(gaussian).intervals(preds)
