"""Refusals of the results surface whose advice has to hold up: the predictions' to() given a
dtype's name or a meta tensor, rescale given an array or a bool tensor, and the set metrics
given a tuple that is not a pair of interval bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _toy import toy_class_predictions, toy_gaussian_predictions

from pyrouq import Predictions, conformal, mean_set_size

_MAKERS = pytest.mark.parametrize(
    "make", [toy_class_predictions, toy_gaussian_predictions], ids=["Predictions", "Gaussian"]
)


# -- to() ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["half", "int64", np.int64, "bool"])
@_MAKERS
def test_to_a_dtype_name_the_predictions_do_not_take_names_the_ones_they_do(make, dtype):
    # it said "pass the torch dtype, torch.half", which to() then refused in turn
    preds = make()
    with pytest.raises(TypeError) as info:
        preds.to(dtype)
    assert str(info.value) == (
        f"{type(preds).__name__}.to() takes a device or a torch dtype, got {dtype!r}, which "
        "names a dtype; pass torch.float32 or torch.float64, the dtypes the predictions take, "
        "or a device such as 'cpu' or 'cuda'."
    )


@pytest.mark.parametrize(
    ("dtype", "torch_dtype"),
    [
        (np.dtype("float64"), "torch.float64"),
        ("torch.float64", "torch.float64"),
        ("float", "torch.float32"),
    ],
    ids=["array-dtype", "torch-prefixed-name", "alias"],
)
@_MAKERS
def test_to_names_the_torch_dtype_of_an_arrays_dtype_or_a_dtypes_full_name(
    make, dtype, torch_dtype
):
    # np.dtype('float64') (an array's .dtype) and 'torch.float64' were called bad devices
    preds = make()
    with pytest.raises(TypeError) as info:
        preds.to(dtype)
    assert str(info.value) == (
        f"{type(preds).__name__}.to() takes a device or a torch dtype, got {dtype!r}, which "
        f"names a dtype; pass the torch dtype, {torch_dtype} (the predictions take "
        "torch.float32 or torch.float64), or a device such as 'cpu' or 'cuda'."
    )


@_MAKERS
def test_to_a_meta_tensor_is_refused_like_the_meta_device(make):
    # torch's "Tensor.item() cannot be called on meta tensors", after the copy
    preds = make()
    with pytest.raises(ValueError) as info:
        preds.to(torch.empty(0, device="meta", dtype=torch.float64))
    assert str(info.value) == (
        f"{type(preds).__name__}.to(): device=device(type='meta') holds shapes, no values, so "
        "the predictions would hold no values to evaluate. Pass device='cpu' or 'cuda' (or "
        "leave it out)."
    )
    moved = preds.to(torch.zeros(0, dtype=torch.float64))  # a real tensor: its dtype taken
    first = moved.probs if isinstance(moved, Predictions) else moved.loc
    assert first.dtype == torch.float64


# -- rescale ---------------------------------------------------------------------------------


def test_rescale_of_an_array_advises_a_tensor_that_keeps_its_float64():
    # it advised torch.as_tensor(mean).float(): a mean near 123456 rounded by ~0.004
    preds = toy_gaussian_predictions()
    mean, std = np.array([123456.789]), np.array([3.0])
    with pytest.raises(TypeError) as info:
        preds.rescale(mean, std)
    assert str(info.value) == (
        "Expected rescale's mean to be a float or a tensor of one value per output, got "
        "ndarray; pass torch.as_tensor(mean)."
    )
    out = preds.rescale(torch.as_tensor(mean), torch.as_tensor(std))  # as advised
    ref = preds.loc.double().numpy() * 3.0 + 123456.789  # by hand, in float64
    assert out.loc.dtype == torch.float64
    assert np.abs(out.loc.numpy() - ref).max() < 1e-9


@pytest.mark.parametrize(
    ("value", "got"),
    [
        (torch.ones(1, dtype=torch.bool), "a torch.bool tensor"),
        (torch.ones(1) + 0j, "a torch.complex64 tensor"),
    ],
    ids=["bool", "complex"],
)
def test_rescale_of_a_bool_or_complex_tensor_does_not_advise_casting_it(value, got):
    # it advised torch.as_tensor(std).float(): the bool's 0 and 1 the refusal was about
    with pytest.raises(TypeError) as info:
        toy_gaussian_predictions().rescale(0.0, value)
    assert str(info.value) == (
        f"Expected rescale's std to be a float or a tensor of one value per output, got {got}; "
        "pass a real number, or a tensor of real numbers (a Standardizer's y_mean and y_std)."
    )


# -- set metrics -----------------------------------------------------------------------------


def test_mean_set_size_of_a_one_tuple_of_sets_does_not_call_it_intervals():
    # `sets = predictor.predict_sets(preds),` (a trailing comma) was told it held intervals
    preds = toy_class_predictions()
    sets = conformal(preds, alpha=0.2).predict_sets(preds)
    with pytest.raises(TypeError) as info:
        mean_set_size((sets,))
    assert str(info.value) == (
        "Expected prediction sets as an (N, C) boolean tensor (predict_sets() returns them), "
        "got tuple; make them with conformal(val_preds, val_targets).predict_sets(preds)."
    )
    counts = [sum(row) for row in sets.tolist()]  # the sets themselves: their mean size by hand
    assert mean_set_size(sets) == pytest.approx(sum(counts) / len(counts), abs=1e-12)
