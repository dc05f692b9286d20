"""A dtype sweep of the public journey: a network in float64, bfloat16 and float16 (and a
float32 one under bfloat16 autocast) through bayesian(), fit(), predict(), the decompositions
and metrics, calibration, the arviz export and save/load, against float64 references computed
by hand in numpy from the same weight draws."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pyro
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq.infer import mean_field_guide

HALF = (torch.bfloat16, torch.float16)
#: how far a half model's probabilities may be from float64's on these small inputs
PROB_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}


def _data(n=40, features=4, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)


def _draws(seed=0, s=5, scale=1.0):
    """``{site: (S, ...)}`` float64 draws of a Linear(4, 3) network's weight and bias."""
    g = torch.Generator().manual_seed(seed)
    weight = scale * torch.randn(s, 3, 4, generator=g, dtype=torch.float64)
    return {"weight": weight, "bias": torch.randn(s, 3, generator=g, dtype=torch.float64)}


def _reference_probs(x, draws):
    """Softmax of ``x @ W_s.T + b_s`` per draw, in numpy float64 (log-sum-exp shifted)."""
    logits = np.einsum("nf,scf->snc", x.double().numpy(), draws["weight"].numpy())
    logits = logits + draws["bias"].numpy()[:, None, :]
    logits = logits - logits.max(-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(-1, keepdims=True)


def _reference_entropy_parts(p):
    """(total, aleatoric, epistemic) of the entropy decomposition, numpy float64."""

    def h(q):
        return -(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0)).sum(-1)

    total, aleatoric = h(p.mean(0)), h(p).mean(0)
    return total, aleatoric, total - aleatoric


def _model(dtype):
    torch.manual_seed(0)
    pyro.clear_param_store()
    return pyrouq.bayesian(nn.Linear(4, 3).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, *HALF])
def test_predictions_from_the_same_draws_match_float64_in_every_dtype(dtype):
    """One set of float64 draws through a float64, float32, bfloat16 and float16 model: the
    probabilities are float64 for the float64 model and float32 for the others (half models'
    kept in float32, as the metrics read them), within the dtype's rounding of a numpy float64
    forward pass; the entropy decomposition and the metrics follow."""
    x, y = _data()
    draws = _draws()
    ref = _reference_probs(x, draws)
    preds = pyrouq.predict(_model(dtype), x.to(dtype), posterior_samples=draws, progress=False)
    assert preds.probs.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    tol = PROB_TOL.get(dtype, 1e-12)
    np.testing.assert_allclose(preds.probs.double().numpy(), ref, atol=tol, rtol=0)
    d = preds.uncertainty()
    assert d.total.dtype == preds.probs.dtype
    parts = (d.total, d.aleatoric, d.epistemic)
    for part, want in zip(parts, _reference_entropy_parts(ref), strict=True):
        np.testing.assert_allclose(part.double().numpy(), want, atol=5 * tol, rtol=0)
    metrics = pyrouq.evaluate(preds, y)
    nll = -np.log(ref.mean(0)[np.arange(len(y)), y.numpy()]).mean()
    assert metrics["nll"] == pytest.approx(nll, abs=5 * tol)
    assert metrics["acc"] == pytest.approx((ref.mean(0).argmax(-1) == y.numpy()).mean())


@pytest.mark.parametrize("dtype", HALF)
def test_half_softmax_of_large_logits_keeps_finite_entropies(dtype):
    """Logits in the hundreds round whole classes to probability 0 in half precision: the
    entropies stay finite (0 log 0 = 0), the epistemic part is >= 0, and the NLL of a target
    whose probability underflowed is finite (not inf from log 0)."""
    x, y = _data()
    draws = _draws(scale=300.0 if dtype == torch.bfloat16 else 30.0)
    preds = pyrouq.predict(_model(dtype), x.to(dtype), posterior_samples=draws, progress=False)
    assert bool((preds.probs == 0).any())  # the case this test is about
    for measure in ("entropy", "variance", "zero_one"):
        d = preds.uncertainty(measure)
        assert all(bool(torch.isfinite(t).all()) for t in (d.total, d.aleatoric, d.epistemic))
        assert bool((d.epistemic >= 0).all())
    metrics = pyrouq.evaluate(preds, y, ood=preds)
    assert all(np.isfinite(v) for v in metrics.values())


def test_a_float32_model_under_bfloat16_autocast_predicts_float32_near_float64():
    """A float32 model inside torch.autocast("cpu", bfloat16): float32 probabilities within
    bfloat16 rounding of the float64 reference, and temperature scaling and conformal sets
    run on them."""
    x, _ = _data()
    draws = _draws()
    model = _model(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        preds = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    assert preds.probs.dtype == torch.float32
    np.testing.assert_allclose(preds.probs.double().numpy(), _reference_probs(x, draws), atol=1e-2)
    y = torch.as_tensor(_reference_probs(x, draws).mean(0).argmax(-1))
    y[:8] = (y[:8] + 1) % 3  # mostly right, a few wrong: a temperature inside the bounds
    labelled = pyrouq.Predictions(preds.probs, y)
    scaled = pyrouq.temperature_scale(labelled)(labelled)
    assert scaled.probs.dtype == torch.float32
    sets = pyrouq.conformal(labelled, alpha=0.2).predict_sets(labelled)
    assert sets.dtype == torch.bool and sets.shape == (40, 3)


@pytest.mark.parametrize("dtype", [torch.float64, *HALF])
def test_journey_fit_predict_export_save_keeps_the_documented_dtypes(dtype, tmp_path):
    """bayesian() -> mean_field_guide -> fit() (two steps) -> predict() -> to_inference_data ->
    save/load in each dtype: the parameters keep the model's dtype, the loss is finite, the
    probabilities are float64 for a float64 model and float32 otherwise, the pointwise
    log-likelihood is float64, and the loaded model predicts the same to the bit."""
    x, y = _data()
    model = _model(dtype)
    guide = mean_field_guide(model)
    result = pyrouq.fit(model, guide, [(x.to(dtype), y)], epochs=2, num_data=40, progress=False)
    assert all(np.isfinite(r.loss) for r in result.history)
    assert all(p.dtype == dtype for p in guide.parameters())
    preds = pyrouq.predict(model, x.to(dtype), guide, num_samples=4, progress=False, seed=0)
    assert preds.probs.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    idata = pyrouq.to_inference_data(model, guide=guide, x=x.to(dtype), y=y, num_samples=3)
    assert idata.log_likelihood["obs"].dtype == np.float64
    want = np.float64 if dtype == torch.float64 else np.float32
    assert idata.posterior_predictive["probs"].dtype == want
    assert np.isfinite(idata.log_likelihood["obs"].values).all()
    path = tmp_path / "run.pt"
    pyrouq.save(path, model, guide)
    loaded = pyrouq.load(path, module=nn.Linear(4, 3))
    again = pyrouq.predict(
        loaded.model, x.to(dtype), loaded.guide, num_samples=4, progress=False, seed=0
    )
    assert torch.equal(again.probs, preds.probs)


@pytest.mark.parametrize("dtype", HALF)
def test_half_gaussian_with_a_tiny_noise_scale_matches_the_float64_mixture_nll(dtype):
    """A regression network in half precision with a fixed noise scale of 1e-3 (its squared
    1e-6 is below float16's normal range): the predictions are float32, finite, and their
    NLL is the float64 mixture NLL computed in numpy from the same draws (within the half
    model's rounding of the means)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 2, generator=g)
    y = x @ torch.tensor([[0.5], [-0.25]]) + 1e-3 * torch.randn(20, 1, generator=g)
    pyro.clear_param_store()
    model = pyrouq.bayesian(nn.Linear(2, 1).to(dtype), likelihood=pyrouq.Gaussian(scale=1e-3))
    draws = {
        "weight": torch.tensor([[[0.5, -0.25]]], dtype=torch.float64).repeat(3, 1, 1),
        "bias": torch.tensor([[0.0]], dtype=torch.float64).repeat(3, 1),
    }
    preds = pyrouq.predict(model, x.to(dtype), posterior_samples=draws, progress=False)
    assert preds.loc.dtype == preds.scale.dtype == torch.float32
    assert bool(torch.isfinite(preds.uncertainty().total).all())
    # the float64 reference from the half model's own means (their rounding is the model's)
    mu = preds.loc.double().numpy()
    sd = preds.scale.double().numpy()
    yy = y.double().numpy()
    log_n = -0.5 * ((yy - mu) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi)
    ref = -(np.logaddexp.reduce(log_n[..., 0], axis=0) - np.log(3)).mean()
    assert preds.evaluate(y)["nll"] == pytest.approx(ref, rel=1e-9)


def test_float64_inputs_to_a_float32_model_are_cast_and_integer_inputs_refused():
    """float64 (and float16) inputs to a float32 model give the float32 inputs' predictions;
    raw uint8 pixels are refused naming the fix, in fit() and predict()."""
    x, y = _data()
    draws = _draws()
    model = _model(torch.float32)
    base = pyrouq.predict(model, x, posterior_samples=draws, progress=False).probs
    wide = pyrouq.predict(model, x.double(), posterior_samples=draws, progress=False).probs
    assert torch.equal(base, wide)
    pixels = (x.abs() * 50).to(torch.uint8)
    with pytest.raises(TypeError, match=r"raw 0-255 pixels\?.*pyrouq\.data\.normalize"):
        pyrouq.predict(model, pixels, posterior_samples=draws, progress=False)
    guide = mean_field_guide(model)
    with pytest.raises(TypeError, match=r"fit\(\) expects floating-point inputs"):
        pyrouq.fit(model, guide, [(pixels, y)], epochs=1, num_data=40, progress=False)


@pytest.mark.parametrize("dtype", HALF)
def test_a_half_batchensemble_predicts_float32_near_its_float64_copy(dtype):
    """A BatchEnsemble cast to half precision predicts float32 probabilities within the
    dtype's rounding of its float64 copy's."""
    x, _ = _data()
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ensemble = pyrouq.batchensemble(
            nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double(), num_members=3
        )
    ref = pyrouq.predict(ensemble, x.double(), progress=False).probs
    half = pyrouq.predict(copy.deepcopy(ensemble).to(dtype), x.to(dtype), progress=False).probs
    assert half.dtype == torch.float32
    torch.testing.assert_close(half.double(), ref, atol=PROB_TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [*HALF, torch.int64])
def test_predictions_to_a_dtype_the_metrics_cannot_read_is_refused_naming_what_it_takes(dtype):
    """Predictions.to(torch.bfloat16) met the constructor's check, which told the user to
    convert "probs" with probs.double(), a call they never made; it now names Predictions.to()
    and the dtypes it takes."""
    preds = pyrouq.Predictions.from_probs(torch.full((2, 3, 2), 0.5))
    with pytest.raises(TypeError, match=r"Predictions\.to\(\) takes torch\.float32 or torch"):
        preds.to(dtype)
    assert preds.to(torch.float64).probs.dtype == torch.float64
