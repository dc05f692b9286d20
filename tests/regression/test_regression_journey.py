"""Regression journey audit: the tabular helpers, a Gaussian model trained on standardised data
and its predictions brought back to the original units, checked against numbers computed by
hand; the messages for NaN rows, a non-finite rescaling mean and tensor plot arguments."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import GaussianPredictions, Standardizer, plot_regression

matplotlib.use("Agg")


def _data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    noise = (0.05 + 0.2 * x[:, 0].abs()) * torch.randn(n, generator=g)
    return x, 10 * (torch.sin(3 * x[:, 0]) + noise) + 100  # original units: mean ~100


# -- the messages ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda x, y: pyrouq.ArrayLoader(x, y),
        lambda x, y: pyrouq.train_test_split(x, y),
        lambda x, y: Standardizer.fit(x, y),
    ],
    ids=["ArrayLoader", "train_test_split", "Standardizer.fit"],
)
def test_nan_rows_are_named_in_the_message(call):
    # it said "x holds NaN or inf; remove or repair those rows first" without saying which
    x, y = torch.randn(10, 2), torch.randn(10)
    x[3, 1], x[7, 0] = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"x holds NaN or inf; remove or repair those rows "
                       r"first: 2 of 10, at rows \[3, 7\]\.$"):  # fmt: skip
        call(x, y)
    y = torch.full((10,), float("nan"))
    with pytest.raises(ValueError, match=r"y holds NaN .*: 10 of 10, at rows \[0, 1, 2, 3, 4, "
                       r"\.\.\.\]\.$"):  # fmt: skip
        call(torch.randn(10, 2), y)


@pytest.mark.parametrize("mean", [float("nan"), torch.tensor([0.0, math.inf])])
def test_rescale_refuses_a_mean_that_is_not_finite_as_such(mean):
    # it was refused as the model's own output: "Expected finite loc ... did the fit diverge?"
    p = GaussianPredictions(torch.zeros(2, 3, 2), torch.ones(2, 3, 2))
    with pytest.raises(ValueError, match=r"rescale's mean must be finite, got "):
        p.rescale(mean, 1.0)


def test_a_scaler_with_a_nan_mean_is_refused_as_such_by_inverse():
    scaler = Standardizer(torch.zeros(1), torch.ones(1), torch.tensor(math.nan), torch.tensor(2.0))
    p = GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1))
    with pytest.raises(ValueError, match=r"rescale's mean must be finite, got tensor\(nan\)"):
        scaler.inverse(p)


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"output": torch.tensor(1)}, r"\(a tensor: pass a Python integer, int\(t\)\)"),
        ({"num_sd": torch.tensor(2.0)}, r"\(a tensor: pass a Python number, float\(t\)\)"),
    ],
)
def test_plot_regression_says_a_tensor_argument_is_a_tensor(kwargs, fix):
    # "Expected output in [0, 2) ..., got tensor(1)": a value in range, refused without a reason
    # (output an integer: float(t), 1.0, is refused in turn)
    p = GaussianPredictions(torch.zeros(2, 3, 2), torch.ones(2, 3, 2))
    with pytest.raises(ValueError, match=fix):
        plot_regression(p, torch.arange(3.0), **kwargs)


# -- the journey, against hand computations ----------------------------------------------------


@pytest.fixture(scope="module")
def journey():
    torch.manual_seed(0)
    x, y = _data()
    train_x, train_y, test_x, test_y = pyrouq.train_test_split(x, y, test_fraction=0.25, seed=0)
    scaler = Standardizer.fit(train_x, train_y)
    net = nn.Sequential(nn.Linear(1, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 2))
    model = pyrouq.bayesian(net, likelihood=pyrouq.Gaussian("heteroscedastic"))
    guide = pyrouq.mean_field_guide(model)
    loader = pyrouq.ArrayLoader(*scaler.transform(train_x, train_y), batch_size=64, seed=0)
    result = pyrouq.fit(model, guide, loader, epochs=5, progress=False, seed=0)
    torch.manual_seed(1)
    test = pyrouq.ArrayLoader(*scaler.transform(test_x, test_y), batch_size=50, shuffle=False)
    standard = pyrouq.predict(model, test, guide, num_samples=8, progress=False)
    return {
        "scaler": scaler, "train_y": train_y, "test_x": test_x, "test_y": test_y,
        "result": result, "standard": standard, "model": model, "guide": guide,
    }  # fmt: skip


def test_the_split_and_the_scaler_are_the_training_rows_statistics(journey):
    scaler, train_y = journey["scaler"], journey["train_y"].double().numpy()
    assert journey["result"].kl_weight == 1.0  # regression: the exact ELBO
    assert float(scaler.y_mean) == pytest.approx(train_y.mean(), rel=1e-6)
    assert float(scaler.y_std) == pytest.approx(train_y.std(ddof=1), rel=1e-6)
    assert journey["test_x"].shape == (64, 1)  # round(256 * 0.25)


def test_inverse_gives_the_original_units_scores_by_hand(journey):
    scaler, standard, test_y = journey["scaler"], journey["standard"], journey["test_y"]
    original = scaler.inverse(standard)
    m, s = float(scaler.y_mean), float(scaler.y_std)
    # the carried targets come back as test_y, and both ways of scoring agree
    assert torch.allclose(original.targets[:, 0], test_y, atol=1e-4)
    ev, by_hand = original.evaluate(), original.evaluate(test_y)
    assert ev == pytest.approx(by_hand, rel=1e-6)
    es = standard.evaluate()
    loc = standard.loc.double().numpy()[..., 0] * s + m
    sd = standard.scale.double().numpy()[..., 0] * s
    yy = test_y.double().numpy()
    from scipy import stats

    assert ev["rmse"] == pytest.approx(np.sqrt(((loc.mean(0) - yy) ** 2).mean()), rel=1e-5)
    nll = -np.log(stats.norm.pdf(yy[None], loc, sd).mean(0)).mean()
    assert ev["nll"] == pytest.approx(nll, rel=1e-5)
    assert ev["nll"] - es["nll"] == pytest.approx(math.log(s), abs=1e-5)  # the Jacobian
    assert ev["crps"] / es["crps"] == pytest.approx(s, rel=1e-5)
    for level in (50, 90, 95):  # unit-free: the same targets fall inside
        assert ev[f"coverage_{level}"] == es[f"coverage_{level}"]
    u = original.uncertainty()
    assert np.allclose(u.aleatoric.numpy(), (sd**2).mean(0), rtol=1e-4)
    assert np.allclose(u.epistemic.numpy(), loc.var(0), rtol=1e-3, atol=1e-6)
    assert torch.allclose(u.total, u.aleatoric + u.epistemic)


def test_conformal_thresholds_are_the_ranked_scores_by_hand(journey):
    original = journey["scaler"].inverse(journey["standard"])
    y = journey["test_y"].double()
    n, alpha = y.shape[0], 0.2
    k = math.ceil((n + 1) * (1 - alpha))
    wide = original.double()
    scores = ((y - wide.mean[:, 0]).abs() / wide.stddev[:, 0]).sort().values
    cal = pyrouq.conformal(original, alpha=alpha, score="abs")
    assert float(cal.threshold[0]) == float(scores[k - 1])
    lo, hi = original.interval(1 - alpha)
    cqr = torch.maximum(lo[:, 0] - y, y - hi[:, 0]).sort().values
    assert float(pyrouq.conformal(original, alpha=alpha, score="cqr").threshold[0]) == float(
        cqr[k - 1]
    )
    # calibrated on these targets, its own intervals cover at least k of the n
    assert pyrouq.coverage(cal.intervals(original), y) >= k / n


def test_save_and_load_reproduce_the_predictions_bit_for_bit(journey, tmp_path):
    model, guide, scaler = journey["model"], journey["guide"], journey["scaler"]
    x = scaler.transform_x(journey["test_x"])
    path = tmp_path / "run.pt"
    pyrouq.save(path, model, guide)
    skeleton = nn.Sequential(nn.Linear(1, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 2))
    ckpt = pyrouq.load(path, module=skeleton)
    torch.manual_seed(5)
    a = pyrouq.predict(model, x, guide, num_samples=4, progress=False)
    torch.manual_seed(5)
    b = pyrouq.predict(ckpt.model, x, ckpt.guide, num_samples=4, progress=False)
    assert torch.equal(a.loc, b.loc) and torch.equal(a.scale, b.scale)


def test_a_run_resumed_from_its_checkpoint_ends_as_the_run_never_stopped(tmp_path):
    x, y = _data(128)
    scaler = Standardizer.fit(x, y)

    def run(**kwargs):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1))
        model = pyrouq.bayesian(net, likelihood=pyrouq.Gaussian("learned"))
        guide = pyrouq.mean_field_guide(model)
        loader = pyrouq.ArrayLoader(*scaler.transform(x, y), batch_size=32, seed=0)
        result = pyrouq.fit(model, guide, loader, epochs=4, progress=False, seed=0, **kwargs)
        return result, [*model.parameters(), *guide.parameters()]

    class Stop(Exception):
        pass

    def stop(record):
        if record.epoch == 2:
            raise Stop

    whole, expected = run()
    with pytest.raises(Stop):
        run(checkpoint=tmp_path / "run.pt", callbacks=[stop])
    resumed, got = run(resume_from=tmp_path / "run.pt")
    assert [r.loss for r in resumed.history] == [r.loss for r in whole.history]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
