"""Audit 10: regression predictions against independent references (numpy / scipy), the
loader's targets of a regression, the Gaussian noise floor, and checkpoints of every model
kind (round trips and the errors of a wrong skeleton)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from scipy import integrate, optimize, stats
from torch import nn

import pyrouq
from pyrouq import (
    ArrayLoader,
    BayesianLeNet,
    BayesianMLP,
    CheckpointError,
    Gaussian,
    GaussianPredictions,
    Standardizer,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    predict,
    rank1,
    save,
)

# --------------------------------------------------------------------------------------------
# GaussianPredictions against a hand (numpy / scipy) computation over the draws
# --------------------------------------------------------------------------------------------


def _draws(seed=0, s=5, n=6, d=2):
    rng = np.random.default_rng(seed)
    loc = rng.normal(size=(s, n, d))
    scale = np.exp(0.5 * rng.normal(size=(s, n, d)))
    y = 1.5 * rng.normal(size=(n, d))
    return loc, scale, y


def _mixture_cdf(loc, scale, t):
    return float(stats.norm.cdf(t, loc, scale).mean())


def test_moments_nll_crps_intervals_and_calibration_match_an_independent_reference():
    loc, scale, y = _draws()
    p = GaussianPredictions(torch.tensor(loc), torch.tensor(scale), torch.tensor(y))
    # law of total variance, by hand
    aleatoric, epistemic = (scale**2).mean(0), loc.var(0)
    np.testing.assert_allclose(p.mean.numpy(), loc.mean(0), rtol=0, atol=1e-14)
    np.testing.assert_allclose(p.aleatoric_variance.numpy(), aleatoric, rtol=1e-13)
    np.testing.assert_allclose(p.epistemic_variance.numpy(), epistemic, rtol=1e-13)
    u = p.uncertainty()
    np.testing.assert_allclose(u.total.numpy(), (aleatoric + epistemic).sum(-1), rtol=1e-13)
    np.testing.assert_allclose(u.epistemic.numpy(), epistemic.sum(-1), rtol=1e-13)
    # the mixture's log density: log mean_s prod_d N(y_d | mu_sd, sigma_sd) (scipy)
    log_p = np.log(stats.norm.pdf(y[None], loc, scale).prod(-1).mean(0))
    np.testing.assert_allclose(p.log_prob().numpy(), log_p, rtol=1e-12)
    ev = p.evaluate()
    assert ev["nll"] == pytest.approx(-log_p.mean(), rel=1e-12)
    mean = loc.mean(0)
    assert ev["rmse"] == pytest.approx(math.sqrt(((mean - y) ** 2).mean()), rel=1e-12)
    assert ev["mae"] == pytest.approx(np.abs(mean - y).mean(), rel=1e-12)
    # CRPS: the integral of (F(t) - 1{t >= y})^2, brute force
    crps = np.zeros(y.shape)
    for n, d in np.ndindex(*y.shape):

        def f(t, n=n, d=d):
            return _mixture_cdf(loc[:, n, d], scale[:, n, d], t)

        below = integrate.quad(lambda t: f(t) ** 2, -60, y[n, d], limit=200)[0]
        above = integrate.quad(lambda t: (1 - f(t)) ** 2, y[n, d], 60, limit=200)[0]
        crps[n, d] = below + above
    np.testing.assert_allclose(p.crps().numpy(), crps.mean(-1), rtol=1e-8, atol=1e-10)
    assert ev["crps"] == pytest.approx(crps.mean(), rel=1e-8)
    # central intervals: the mixture's quantiles by root finding on its CDF
    for level in (0.5, 0.9, 0.95):
        bounds = np.zeros((2, *y.shape))
        for k, q in enumerate(((1 - level) / 2, (1 + level) / 2)):
            for n, d in np.ndindex(*y.shape):
                bounds[k, n, d] = optimize.brentq(
                    lambda t, n=n, d=d, q=q: _mixture_cdf(loc[:, n, d], scale[:, n, d], t) - q,
                    -100,
                    100,
                    xtol=1e-14,
                )
        lo, hi = p.interval(level)
        np.testing.assert_allclose(lo.numpy(), bounds[0], rtol=0, atol=1e-9)
        np.testing.assert_allclose(hi.numpy(), bounds[1], rtol=0, atol=1e-9)
        key = round(100 * level)
        inside = (y >= bounds[0]) & (y <= bounds[1])
        assert ev[f"coverage_{key}"] == pytest.approx(inside.mean(), abs=1e-15)
        assert ev[f"width_{key}"] == pytest.approx((bounds[1] - bounds[0]).mean(), rel=1e-9)
    # the quantile calibration error (Kuleshov et al. 2018) over the PIT values
    pit = np.array([_mixture_cdf(loc[:, n, d], scale[:, n, d], y[n, d])
                    for n, d in np.ndindex(*y.shape)])  # fmt: skip
    levels = 0.05 * np.arange(1, 20)
    observed = (pit[None] <= levels[:, None]).mean(1)
    assert ev["calibration_error"] == pytest.approx(((observed - levels) ** 2).mean(), abs=1e-15)


def test_standardised_predictions_score_in_the_original_units():
    torch.manual_seed(0)
    x = torch.randn(20, 3, dtype=torch.float64)
    y = torch.stack([1000 + 50 * x[:, 0], -3 + 0.01 * x[:, 1]], 1)
    scaler = Standardizer.fit(x, y)
    ys = scaler.transform_y(y)
    loc = ys[None] + 0.3 * torch.randn(4, 20, 2, dtype=torch.float64)
    scale = 0.5 + torch.rand(4, 20, 2, dtype=torch.float64)
    ev = scaler.inverse(GaussianPredictions(loc, scale, ys)).evaluate()
    mu = loc.numpy() * scaler.y_std.numpy() + scaler.y_mean.numpy()
    sigma = scale.numpy() * scaler.y_std.numpy()
    t = y.numpy()
    log_p = np.log(stats.norm.pdf(t[None], mu, sigma).prod(-1).mean(0))
    assert ev["nll"] == pytest.approx(-log_p.mean(), rel=1e-10)
    assert ev["rmse"] == pytest.approx(math.sqrt(((mu.mean(0) - t) ** 2).mean()), rel=1e-10)


# --------------------------------------------------------------------------------------------
# predict() of a regression: targets of every shape, and the warning's words (fixed)
# --------------------------------------------------------------------------------------------


def _regression(out, likelihood, y):
    pyro.clear_param_store()
    torch.manual_seed(0)
    x = torch.randn(y.shape[0], 3)
    model = bayesian(nn.Linear(3, out), likelihood=likelihood, num_data=x.shape[0])
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, batch_size=10, seed=0), epochs=1, progress=False)
    return model, guide, x


@pytest.mark.parametrize(
    "out, likelihood, shape, dtype",
    [
        (1, lambda: Gaussian("learned"), (20,), torch.float32),
        (1, lambda: Gaussian(0.3), (20, 1), torch.float32),
        (2, lambda: Gaussian("learned"), (20, 2), torch.float64),
        (4, lambda: Gaussian("heteroscedastic"), (20, 2), torch.float32),
        (2, lambda: Gaussian(dist.HalfNormal(torch.ones(2))), (20, 2), torch.float32),
    ],
)
def test_predict_carries_the_loaders_targets_and_scores_them(out, likelihood, shape, dtype):
    y = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    model, guide, x = _regression(out, likelihood(), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = ArrayLoader(x, y, batch_size=7, shuffle=False)
        p = predict(model, loader, guide, num_samples=3, progress=False, seed=0)
    assert p.targets.dtype == dtype
    assert torch.equal(p.targets, y.reshape(20, -1))
    loc, scale = p.loc.double().numpy(), p.scale.double().numpy()
    t = y.reshape(20, -1).double().numpy()
    log_p = np.log(stats.norm.pdf(t[None], loc, scale).prod(-1).mean(0))
    assert p.evaluate()["nll"] == pytest.approx(-log_p.mean(), rel=1e-9)


def test_predicts_warning_calls_a_regressions_y_targets_not_labels():
    y = torch.randn(20, 1)
    model, guide, x = _regression(1, Gaussian(0.5), y)
    batches = [(x[:10], y[:5]), (x[10:], y[5:15])]  # 5 targets for 10 inputs: misaligned
    with pytest.warns(UserWarning) as caught:
        p = predict(model, batches, guide, num_samples=2, progress=False)
    assert p.targets is None
    message = str(caught[0].message)
    assert message.startswith("predict(): the targets x yields cannot be the predictions'")
    assert "batch 1 of x holds 10 inputs and targets of shape (5, 1), not one target per " in (
        message
    )
    assert "label" not in message


# --------------------------------------------------------------------------------------------
# Gaussian: a noise floor the outputs' dtype cannot hold (fixed: NaN before)
# --------------------------------------------------------------------------------------------


def test_a_noise_floor_that_underflows_the_outputs_dtype_is_refused():
    het = Gaussian("heteroscedastic", min_scale=1e-50)
    outputs = torch.tensor([[0.0, -200.0]])  # softplus(-200) underflows: the floor alone
    with pytest.raises(ValueError, match=r"Gaussian\(min_scale=1e-50\) is below the smallest "
                       r"normal float32 number \(1\.18e-38\)"):  # fmt: skip
        het.nll(outputs, torch.zeros(1))
    # float64 outputs hold it: a finite NLL, by hand
    y = torch.tensor([1e-50], dtype=torch.float64)
    expected = 0.5 + math.log(1e-50) + 0.5 * math.log(2 * math.pi)  # z = 1
    assert het.nll(outputs.double(), y).item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match=r"Gaussian\(scale=1e-45\) is below the smallest"):
        Gaussian(1e-45).nll(torch.zeros(2, 1), torch.zeros(2))
    # a representable floor still gives its scale where the softplus underflows
    _, scale = Gaussian("heteroscedastic", min_scale=1e-30).predictive(outputs)
    assert scale.item() == pytest.approx(1e-30, rel=1e-6)


# --------------------------------------------------------------------------------------------
# Checkpoints: every model kind round-trips bit-exactly; wrong skeletons are named
# --------------------------------------------------------------------------------------------


def _cnn():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )


def _mlp(out=3):
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, out))


_XI, _XT = torch.randn(8, 1, 8, 8), torch.randn(8, 3)
_YI, _YT, _YR = torch.randint(0, 3, (8,)), torch.randint(0, 3, (8,)), torch.randn(8, 2)

KINDS = {
    "BayesianMLP": (lambda: BayesianMLP(3, 8, 3, num_data=8), None, _XT, _YT, True),
    "BayesianLeNet": (
        lambda: BayesianLeNet(num_data=8),
        None,
        torch.randn(2, 1, 28, 28),
        _YI[:2],
        True,
    ),
    "bayesian_batchnorm": (lambda: bayesian(_cnn(), num_data=8), _cnn, _XI, _YI, True),
    "batchensemble": (lambda: batchensemble(_cnn(), 3), _cnn, _XI, _YI, False),
    "rank1": (lambda: rank1(_mlp(), 3, num_data=8), _mlp, _XT, _YT, True),
    "learned_noise": (
        lambda: bayesian(_mlp(2), likelihood=Gaussian("learned"), num_data=8),
        lambda: _mlp(2),
        _XT,
        _YR,
        True,
    ),
    "last_layer": (lambda: bayesian(_mlp(), select="last_layer", num_data=8), _mlp, _XT, _YT, True),
}


def _same_state(a, b):
    a, b = a.state_dict(), b.state_dict()
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_model_kind_round_trips_bit_exactly(kind, tmp_path):
    make, skeleton, x, y, sampled = KINDS[kind]
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = make()
    guide = mean_field_guide(model) if sampled else None
    fit(model, guide, [(x, y)], epochs=2, num_data=x.shape[0], progress=False)
    draws = 3 if sampled else None
    before = predict(model, x, guide, num_samples=draws, progress=False, seed=1)
    save(tmp_path / "m.pt", model, guide)
    pyro.clear_param_store()
    back = load(tmp_path / "m.pt", module=skeleton() if skeleton else None)
    assert _same_state(model, back.model)  # weights, buffers (BatchNorm statistics), noise
    if sampled:
        assert _same_state(guide, back.guide)
    after = predict(back.model, x, back.guide, num_samples=draws, progress=False, seed=1)
    if isinstance(before, GaussianPredictions):
        assert torch.equal(before.loc, after.loc) and torch.equal(before.scale, after.scale)
    else:
        assert torch.equal(before.probs, after.probs)


@pytest.fixture(scope="module")
def resnet_file(tmp_path_factory):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("resnet") / "resnet.pt"
    save(path, bayesian(torchvision.models.resnet18(num_classes=3), num_data=10))
    return path, torchvision


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_builder_given_as_skeleton_is_told_to_build_the_network(resnet_file):
    path, torchvision = resnet_file
    with pytest.raises(CheckpointError) as caught:
        load(path, module=torchvision.models.resnet18)
    message = str(caught.value)
    assert "got the function resnet18, which builds one, not the network itself" in message
    assert "Pass the network built as for training: load(path, module=resnet18())" in message
    assert "the checkpoint holds a torchvision.models.resnet.ResNet" in message
    with pytest.raises(CheckpointError, match=r"got the class ResNet, .*module=ResNet\(\)"):
        load(path, module=torchvision.models.ResNet)
    with pytest.raises(CheckpointError, match=r"got a function, .*load\(path, module=make_net"):
        load(path, module=lambda: torchvision.models.resnet18(num_classes=3))
    with pytest.raises(CheckpointError, match=r"got int\. Pass a freshly built network of the "):
        load(path, module=3)
    # the network the builder builds loads
    back = load(path, module=torchvision.models.resnet18(num_classes=3))
    assert type(back.model.net).__name__ == "ResNet"


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_broken_files_and_mismatched_skeletons_are_named(tmp_path):
    torch.manual_seed(0)
    model = bayesian(_mlp(2), likelihood=Gaussian("learned"), num_data=8)
    model(_XT)  # the learned noise takes its shape
    path = save(tmp_path / "reg.pt", model)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"is not a readable checkpoint: it is truncated "):
        load(tmp_path / "cut.pt", module=_mlp(2))
    with pytest.raises(CheckpointError, match=r"parameter '3\.weight' is shape \(2, 8\) in the "
                       r"checkpoint and shape \(3, 8\) in the skeleton"):  # fmt: skip
        load(path, module=_mlp(3))
    with pytest.raises(CheckpointError, match=r"module '2' is a ReLU in the checkpoint and a "):
        load(path, module=nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(),
                                        nn.Linear(8, 2)))  # fmt: skip
    mlp_path = save(tmp_path / "mlp.pt", BayesianMLP(3, 8, 3))
    with pytest.raises(CheckpointError, match=r"holds a BayesianMLP, expected a BayesianLeNet"):
        load(mlp_path, model_class=pyrouq.BayesianLeNet)
