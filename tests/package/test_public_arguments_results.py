"""The arguments of the results surface (predictions, calibration, tabular helpers, figures)
that came through unchecked: each is refused before any work, in words naming it, what came
and what to pass, or taken as documented (a numpy number, a 0-d array)."""

from __future__ import annotations

import errno
import math

import numpy as np
import pytest
import torch
from _toy import toy_class_predictions, toy_gaussian_predictions

from pyrouq import (
    ArrayLoader,
    Predictions,
    Standardizer,
    class_conditional_coverage,
    conformal,
    mean_set_size,
    save_figures,
    temperature_scale,
)

# -- Standardizer made by hand, and its transform ----------------------------------------------


@pytest.mark.parametrize("x_std", [torch.ones(3), torch.ones(4, 1), torch.ones(2, 4)])
def test_a_hand_made_standardizer_refuses_stds_of_other_columns_than_its_means(x_std):
    # (4,) means with (3,) stds were taken, and transform_x() failed in torch's broadcasting
    with pytest.raises(ValueError) as info:
        Standardizer(torch.zeros(4), x_std, torch.zeros(1), torch.ones(1))
    assert str(info.value) == (
        "Standardizer: expected x_std of the shape of x_mean, (4,) (one standard deviation per "
        f"column, or one value for all), got shape {tuple(x_std.shape)}. Use "
        "Standardizer.fit(x, y), or pass the statistics of the same columns."
    )


def test_a_hand_made_standardizer_takes_one_std_for_all_columns_as_broadcast():
    scaler = Standardizer(
        torch.tensor([1.0, -1.0]), torch.tensor(2.0), torch.tensor(10.0), torch.tensor([4.0])
    )
    x, y = scaler.transform(torch.tensor([[3.0, 3.0], [1.0, -5.0]]), torch.tensor([2.0, 18.0]))
    assert x.tolist() == [[1.0, 2.0], [0.0, -2.0]]  # (x - mean) / 2, by hand
    assert y.tolist() == [-2.0, 2.0]  # (y - 10) / 4


@pytest.mark.parametrize("where", ["transform_x", "transform_y"])
def test_standardizer_transforms_refuse_a_mean_that_is_not_finite(where):
    # it returned NaN for every value of the column, and fit() then refused "NaN in x"
    scaler = Standardizer(
        torch.tensor([0.0, math.nan]), torch.ones(2), torch.tensor([math.inf]), torch.ones(1)
    )
    name, value = ("x", torch.ones(3, 2)) if where == "transform_x" else ("y", torch.ones(3, 1))
    with pytest.raises(ValueError) as info:
        getattr(scaler, where)(value)
    cols = "[1]" if name == "x" else "[0]"
    assert str(info.value) == (
        f"Standardizer.{where}(): the scaler's {name}_mean holds NaN or inf in column(s) "
        f"{cols}, so every standardised value there would be NaN or inf. Make the scaler with "
        "Standardizer.fit(x, y), or pass finite means."
    )


def test_standardizer_transform_refuses_x_and_y_of_other_examples():
    # 30 inputs and 3 targets were standardised and returned as a pair
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 2, generator=g), torch.randn(30, generator=g)
    scaler = Standardizer.fit(x, y)
    with pytest.raises(ValueError) as info:
        scaler.transform(x, y[:3])
    assert str(info.value) == (
        "Standardizer.transform(): x and y must hold the same number of rows, got 30 and 3; "
        "expected one row of y per row of x (y[i] the target of x[i]): pass the x and y of the "
        "same examples, or standardise them apart with transform_x() and transform_y()."
    )
    tx, ty = scaler.transform(x, y)  # the same examples: as numpy's mean and std (ddof 1)
    ref = (y.double().numpy() - y.double().numpy().mean()) / y.double().numpy().std(ddof=1)
    assert ty.double().numpy() == pytest.approx(ref, rel=1e-5, abs=1e-6)
    assert tx.shape == (30, 2)


# -- the predictions' to() -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make", [toy_class_predictions, toy_gaussian_predictions], ids=["Predictions", "Gaussian"]
)
def test_predictions_to_refuses_a_device_name_torch_does_not_know(make):
    # torch's "Expected one of cpu, cuda, ipu, ... device type at start of device string"
    preds = make()
    owner = f"{type(preds).__name__}.to()"
    with pytest.raises(ValueError) as info:
        preds.to("gpu")
    assert str(info.value).startswith(
        f"{owner}: expected device to be a torch device, e.g. 'cpu' or 'cuda', got 'gpu' ("
    )
    assert str(info.value).endswith("). Pass device='cpu' or leave it out.")


@pytest.mark.parametrize(
    "make", [toy_class_predictions, toy_gaussian_predictions], ids=["Predictions", "Gaussian"]
)
def test_predictions_to_refuses_the_meta_device_before_copying(make):
    # torch's "Tensor.item() cannot be called on meta tensors", from the copy's own checks
    preds = make()
    with pytest.raises(ValueError) as info:
        preds.to("meta")
    assert str(info.value) == (
        f"{type(preds).__name__}.to(): device='meta' holds shapes, no values, so the "
        "predictions would hold no values to evaluate. Pass device='cpu' or 'cuda' (or leave "
        "it out)."
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_predictions_to_cuda_without_a_gpu_is_refused_in_words():
    with pytest.raises(ValueError, match=r"^Predictions\.to\(\): torch cannot use "):
        toy_class_predictions().to("cuda")


@pytest.mark.parametrize("dtype", [np.float64, "float64"], ids=["numpy", "name"])
@pytest.mark.parametrize(
    "make", [toy_class_predictions, toy_gaussian_predictions], ids=["Predictions", "Gaussian"]
)
def test_predictions_to_says_a_dtype_name_is_not_a_torch_dtype(make, dtype):
    preds = make()
    with pytest.raises(TypeError) as info:
        preds.to(dtype)
    assert str(info.value) == (
        f"{type(preds).__name__}.to() takes a device or a torch dtype, got {dtype!r}, which "
        "names a dtype; pass the torch dtype, torch.float64 (the predictions take "
        "torch.float32 or torch.float64), or a device such as 'cpu' or 'cuda'."
    )
    moved = preds.to(torch.float64).to("cpu").to(torch.device("cpu"))  # still taken
    before, after = (p.probs if isinstance(p, Predictions) else p.loc for p in (preds, moved))
    assert after.dtype == torch.float64 and after.device.type == "cpu"
    assert torch.equal(after, before.double())


# -- conformal and the set metrics -----------------------------------------------------------


def test_conformal_intervals_of_a_tensor_say_to_wrap_it_not_that_it_is_a_classifiers():
    # "a classifier's predictions get prediction sets from conformal(..., score='lac')"
    regressor = conformal(toy_gaussian_predictions(), alpha=0.2)
    with pytest.raises(TypeError) as info:
        regressor.intervals(torch.zeros(20, 1))
    assert str(info.value) == (
        "Expected GaussianPredictions, got Tensor; pass what predict() returns for a Gaussian "
        "model (for (S, N, D) means and standard deviations: GaussianPredictions(loc, scale))."
    )


@pytest.mark.parametrize(
    "call",
    [lambda i: mean_set_size(i), lambda i: class_conditional_coverage(i, torch.zeros(20).long())],
    ids=["mean_set_size", "class_conditional_coverage"],
)
def test_set_metrics_given_intervals_say_how_intervals_are_measured(call):
    lo, hi = conformal(toy_gaussian_predictions(), alpha=0.2).intervals(toy_gaussian_predictions())
    with pytest.raises(TypeError) as info:
        call((lo, hi))
    assert str(info.value) == (
        "Expected prediction sets as an (N, C) boolean tensor (predict_sets() returns them), "
        "got tuple; intervals (lo, hi) have neither a size in classes nor a class: measure "
        "them with coverage((lo, hi), targets) and their mean width, (hi - lo).mean()."
    )


def test_calibration_given_a_numpy_array_says_to_make_predictions_of_it():
    preds = toy_class_predictions()
    with pytest.raises(TypeError) as info:
        temperature_scale(preds.probs.numpy(), preds.targets)
    assert str(info.value) == (
        "Expected val_preds to be Predictions (class probabilities, what predict() returns for "
        "a classifier), got ndarray; wrap probabilities as "
        "pyrouq.Predictions.from_probs(torch.as_tensor(...)) ((S, N, C) probabilities)."
    )


# -- GaussianPredictions' numbers ------------------------------------------------------------


def test_quantile_and_interval_take_a_level_in_a_0d_numpy_array_as_a_tensor_of_one():
    # np.array(0.9) was refused ("got ndarray") where torch.tensor(0.9) was taken
    preds = toy_gaussian_predictions()
    assert torch.equal(preds.quantile(np.array(0.9)), preds.quantile(0.9))
    lo, hi = preds.interval(np.array([0.5]))
    ref_lo, ref_hi = preds.interval(0.5)
    assert torch.equal(lo, ref_lo) and torch.equal(hi, ref_hi)
    # the mixture's 0.9 quantile of input 0, against a bisection of its CDF (float64)
    loc, scale = preds.loc[:, 0, 0].double(), preds.scale[:, 0, 0].double()
    a, b = -20.0, 20.0
    for _ in range(200):
        mid = (a + b) / 2
        cdf = float(torch.special.ndtr((mid - loc) / scale).mean())
        a, b = (mid, b) if cdf < 0.9 else (a, mid)
    assert float(preds.quantile(np.float32(0.9))[0, 0]) == pytest.approx(a, abs=1e-5)


def test_rescale_refuses_a_bool_tensor_as_the_mean_with_what_to_pass():
    # a bool tensor was taken as 0 and 1 (an array as the mean: test_predictions_to_and_rescale_
    # advice.py, which also follows the advice)
    with pytest.raises(TypeError) as info:
        toy_gaussian_predictions().rescale(torch.zeros(1, dtype=torch.bool), 2.0)
    assert str(info.value) == (
        "Expected rescale's mean to be a float or a tensor of one value per output, got a "
        "torch.bool tensor; pass a real number, or a tensor of real numbers (a Standardizer's "
        "y_mean and y_std)."
    )


# -- loaders' saved states, figures' folders -----------------------------------------------


def test_array_loader_refuses_a_state_of_another_size_in_words():
    # torch's "Expected a CPUGeneratorImplState of size 5056 but found ... size to be 16"
    loader = ArrayLoader(torch.randn(10, 2), torch.zeros(10), 3, seed=0)
    size = loader.get_rng_state().numel()
    with pytest.raises(ValueError) as info:
        loader.set_rng_state(torch.zeros(16, dtype=torch.uint8))
    assert str(info.value) == (
        f"ArrayLoader.set_rng_state() expects the {size}-byte state that get_rng_state() "
        "returns, got a uint8 tensor of 16 bytes (another generator's?). Pass "
        "loader.get_rng_state() of this kind of loader."
    )
    state = loader.get_rng_state()
    first = [b[0].tolist() for b in loader]
    loader.set_rng_state(state)  # a state of the right size still restores the order
    assert [b[0].tolist() for b in loader] == first


def test_save_figures_names_the_out_dir_it_cannot_create(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    fig = plt.figure()
    with pytest.raises(NotADirectoryError) as info:
        save_figures({"reliability": fig}, blocker / "figures")
    err = info.value
    assert err.errno == errno.ENOTDIR and err.filename == str(blocker / "figures")
    assert err.strerror == (
        "save_figures() could not create out_dir (Not a directory); pass a folder you can "
        "write to (created if missing)"
    )
    assert not plt.fignum_exists(fig.number)  # closed all the same


@pytest.mark.parametrize(
    ("score", "how", "meant"),
    [
        ("aps ", "have no spaces around them", "aps"),
        (" Lac", "are lower case and have no spaces around them", "lac"),
        ("RAPS", "are lower case", "raps"),
    ],
)
def test_conformal_tells_a_score_that_slipped_by_spaces_or_case_how(score, how, meant):
    # "aps " was told "Pass one of these" as if it were no score at all
    with pytest.raises(ValueError) as info:
        conformal(toy_class_predictions(), alpha=0.2, score=score)
    assert str(info.value) == (
        f"Unknown score {score!r} (did you mean {meant!r}? the names {how}) for classification: "
        f"expected 'lac', 'aps' or 'raps'. Pass score={meant!r}."
    )
