"""Second audit of pyrouq.diagnostics and pyrouq.plotting: exported values against hand
computations and arviz, and the fixes of the audit."""

from __future__ import annotations

import warnings

import matplotlib.pyplot as plt
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import pyrouq
from pyrouq.diagnostics import psis_diagnostic, to_inference_data
from pyrouq.infer import mean_field_guide
from pyrouq.models import BayesianMLP
from pyrouq.plotting import plot_image_grid, plot_reliability, plot_uncertainty_distributions

az = pytest.importorskip("arviz")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _regression_net(dtype: torch.dtype = torch.float32):
    model = pyrouq.bayesian(torch.nn.Linear(2, 1), likelihood=pyrouq.Gaussian(0.3))
    model = model.to(dtype)
    return model, mean_field_guide(model, init_scale=0.2)


# --------------------------------------------------------------------------------------------
# to_inference_data
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1024, 3])
def test_a_nan_target_is_named_whatever_the_batch_it_falls_in(batch_size):
    """Only the first batch's targets were checked: a NaN at row 4 with batch_size=3 met
    torch's support check (or, without validation, a warning blaming the model)."""
    model, guide = _regression_net()
    x, y = torch.randn(6, 2), torch.randn(6)
    y[4] = float("nan")
    message = r"to_inference_data\(\): NaN or inf targets at rows \[4\]"
    with pytest.raises(ValueError, match=message):
        to_inference_data(model, guide, x, y, num_samples=2, batch_size=batch_size)


def test_a_float64_model_exports_float64_predictions():
    """probs, loc and scale were cast to float32 whatever the model's dtype."""
    model, guide = _regression_net(torch.float64)
    x = torch.randn(7, 2, dtype=torch.float64)
    y = torch.randn(7, dtype=torch.float64)
    idata = to_inference_data(model, guide, x, y, num_samples=3, batch_size=4)
    pp = idata.posterior_predictive
    assert pp["loc"].dtype == np.float64 and pp["scale"].dtype == np.float64
    with torch.no_grad():
        for s in range(3):
            weights = {
                k: torch.from_numpy(idata.posterior[k].values[0, s]) for k in ("weight", "bias")
            }
            loc = model.outputs(x, weights)
            np.testing.assert_allclose(pp["loc"].values[0, s], loc.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(pp["scale"].values, 0.3)

    clf = BayesianMLP(in_features=4, hidden_features=5, out_features=3).double()
    clf_guide = mean_field_guide(clf, init_scale=0.2)
    xc, yc = torch.randn(6, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])
    idata = to_inference_data(clf, clf_guide, xc, yc, num_samples=2)
    probs = idata.posterior_predictive["probs"].values
    assert probs.dtype == np.float64
    # log of the stored probabilities is the stored log-likelihood to float64 precision
    picked = np.take_along_axis(probs[0], yc.numpy()[None, :, None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.log(picked), idata.log_likelihood["obs"].values[0], atol=1e-12)


def test_a_float32_model_still_exports_float32_predictions():
    model, guide = _regression_net()
    idata = to_inference_data(model, guide, torch.randn(5, 2), torch.randn(5), num_samples=2)
    assert idata.posterior_predictive["loc"].dtype == np.float32
    assert idata.log_likelihood["obs"].dtype == np.float64


def test_a_pyro_models_logits_keep_float64():
    x, y = torch.randn(6, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1, 2])

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 3, dtype=torch.float64), 1.0).to_event(2))
        logits = pyro.deterministic("logits", x @ w)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)

    def guide(x, y):
        pyro.sample("w", dist.Normal(torch.zeros(3, 3, dtype=torch.float64), 0.5).to_event(2))

    idata = to_inference_data(model, guide, x, y, num_samples=3)
    probs = idata.posterior_predictive["probs"].values[0]
    w = torch.from_numpy(idata.posterior["w"].values[0])
    expected = torch.softmax(torch.einsum("nd,sdc->snc", x, w), -1)
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, expected.numpy(), rtol=0, atol=1e-14)


def test_mcmc_chains_keep_their_order_and_match_predict_and_arviz():
    """(chain, draw) of every group is predict()'s draw order, chain after chain, and R-hat /
    ESS are arviz's on the raw (chain, draw) arrays."""
    model = pyrouq.bayesian(torch.nn.Linear(2, 1), likelihood=pyrouq.Gaussian(0.5))
    g = torch.Generator().manual_seed(0)
    chains, draws = 3, 5
    samples = {
        "weight": torch.randn(chains, draws, 1, 2, generator=g),
        "bias": torch.randn(chains, draws, 1, generator=g),
    }
    stats = {
        "diverging": torch.zeros(chains, draws, dtype=torch.bool),
        "step_size": torch.full((chains, draws), 0.1, dtype=torch.float64),
        "tree_depth": torch.full((chains, draws), 2),
        "energy": torch.arange(chains * draws, dtype=torch.float64).reshape(chains, draws),
    }
    x, y = torch.randn(7, 2, generator=g), torch.randn(7, generator=g)
    result = pyrouq.MCMCResult(samples, stats, "nuts", 10, model=model, x=x, y=y)
    idata = to_inference_data(result)
    np.testing.assert_array_equal(idata.posterior["weight"].values, samples["weight"].numpy())
    w, b = samples["weight"][:, :, 0].double(), samples["bias"].double()
    loc = torch.einsum("csd,nd->csn", w, x.double()) + b
    expected = torch.distributions.Normal(loc, 0.5).log_prob(y.double())
    np.testing.assert_allclose(idata.log_likelihood["obs"].values, expected.numpy(), rtol=1e-6)
    preds = pyrouq.predict(model, x, posterior_samples=result)
    np.testing.assert_array_equal(
        idata.posterior_predictive["loc"].values, preds.loc.reshape(chains, draws, 7, 1).numpy()
    )
    assert idata.sample_stats["energy"].values.tolist() == stats["energy"].tolist()
    raw = samples["bias"][..., 0].numpy()
    assert float(az.rhat(idata)["bias"][0]) == pytest.approx(float(az.rhat(raw)))
    assert float(az.ess(idata)["bias"][0]) == pytest.approx(float(az.ess(raw)))


def test_a_fit_result_in_the_models_place_is_a_clear_error(tmp_path):
    """fit()'s FitResult as the model met dataclasses' 'cannot assign to field num_data'."""
    model = BayesianMLP(in_features=4, hidden_features=3, out_features=2)
    guide = mean_field_guide(model)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 0])
    loader = DataLoader(TensorDataset(x, y), batch_size=5)
    fitted = pyrouq.fit(model, guide, loader, epochs=1, progress=False)
    message = r"expected the model to be callable .* got FitResult\. fit\(\) returns a FitResult"
    with pytest.raises(TypeError, match=r"to_inference_data\(\): " + message):
        to_inference_data(fitted, guide, x, y)
    with pytest.raises(TypeError, match=r"psis_diagnostic\(\): " + message):
        psis_diagnostic(fitted, guide, x, y)
    with pytest.raises(TypeError, match=r"expected the guide to be callable .* got FitResult"):
        to_inference_data(model, fitted, x, y)
    with pytest.raises(TypeError, match=r"expected the model to be callable .* got NoneType"):
        psis_diagnostic(None, guide, x, y)
    # load()'s Checkpoint in the model's place: told to pass its model and guide, which works
    checkpoint = pyrouq.load(pyrouq.save(tmp_path / "fitted.pt", model, guide))
    with pytest.raises(TypeError, match=r"got Checkpoint\. load\(\) returns a Checkpoint: pass"):
        to_inference_data(checkpoint, x=x, y=y)
    idata = to_inference_data(checkpoint.model, checkpoint.guide, x, y, num_samples=2)
    assert idata.log_likelihood["obs"].shape == (1, 2, 5)


# --------------------------------------------------------------------------------------------
# plotting
# --------------------------------------------------------------------------------------------


def test_integer_images_are_told_a_conversion_that_works():
    """int64 0-255 pixels were told to use images.float(), which is then refused as raw
    pixels; the advice now names uint8, and following it draws the images."""
    probs = torch.softmax(torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)), -1)
    pixels = torch.tensor([0, 128, 255]).reshape(3, 1, 1).expand(3, 4, 4)
    with pytest.raises(TypeError, match=r"got torch\.int64; .*images\.to\(torch\.uint8\)"):
        plot_image_grid(probs, pixels)
    fig = plot_image_grid(probs, pixels.to(torch.uint8), rows=1, cols=3)
    shown = [float(image.get_array()[0, 0]) for image in fig.axes[0].images]
    assert shown == pytest.approx([0.0, 128 / 255, 1.0])


def test_probabilities_that_require_grad_plot_without_torch_warnings():
    """Probabilities with requires_grad met torch's 'Converting a tensor with
    requires_grad=True to a scalar' warning in the checks; they are read detached."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 8, 4, generator=g), -1).requires_grad_()
    targets = torch.randint(0, 4, (8,), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_reliability(probs, targets)
        plot_uncertainty_distributions(probs, probs * 1)
    assert fig.axes[0].get_title().startswith("Reliability diagram (acc ")
