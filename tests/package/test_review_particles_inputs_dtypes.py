"""Review of the particles, predict-inputs, dtype and batch-input commits: the article before
what predict() got (an ndarray, a UserDict); Predictions.to() given a tensor (its dtype
checked) or a device and a dtype; rotate()'s per-channel constants as a pandas Series or an
empty tensor; fit()'s refusal of a dict of one input and of a tuple of example dicts, and
its list and namedtuple pairs."""

from __future__ import annotations

import collections

import numpy as np
import pyro
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import Predictions, bayesian, fit, mean_field_guide
from pyrouq.rotation import rotate

# --------------------------------------------------------------------------------------------
# predict(): the article before what came
# --------------------------------------------------------------------------------------------


def _predict_refusal(x) -> str:
    model = bayesian(nn.Linear(3, 2))
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, x, mean_field_guide(model), num_samples=2, progress=False)
    return str(info.value)


def test_predict_says_an_ndarray_and_a_userdict():
    # the article's docstring promised "an ndarray"; it said "got a ndarray", and "an UserDict"
    message = _predict_refusal(np.zeros((4, 3)))
    assert "or an iterable of batches, got an ndarray of shape (4, 3). Convert an array" in (
        message
    )
    message = _predict_refusal(collections.UserDict(ids=torch.zeros(4, 3)))
    assert "got a UserDict. Pass a tensor (N, ...) or a DataLoader." in message
    assert "got an int." in _predict_refusal(3)


# --------------------------------------------------------------------------------------------
# Predictions.to()
# --------------------------------------------------------------------------------------------


def _predictions() -> Predictions:
    logits = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    return Predictions(torch.softmax(logits, -1), torch.tensor([0, 1, 3]))


def test_predictions_to_a_half_tensor_is_refused_in_its_own_words():
    # to(tensor) took the tensor's dtype unchecked: "Expected probs of dtype torch.float32 or
    # torch.float64, got torch.float16; convert it with probs.double()"
    with pytest.raises(TypeError) as info:
        _predictions().to(torch.zeros(1, dtype=torch.float16))
    assert str(info.value).startswith(
        "Predictions.to() takes torch.float32 or torch.float64 for the probabilities, got a "
        "tensor of dtype torch.float16: the decompositions and metrics read"
    ), str(info.value)
    assert "a device (a tensor's: to(t.device))" in str(info.value)
    with pytest.raises(TypeError, match=r"got torch\.bfloat16: the decompositions"):
        _predictions().to(dtype=torch.bfloat16)


def test_predictions_to_takes_a_device_and_a_dtype_as_tensor_to_does():
    # to("cpu", torch.float64) and to(dtype=...) were "takes 2 positional arguments" and
    # "unexpected keyword argument 'dtype'"
    p = _predictions()
    for moved in (
        p.to("cpu", torch.float64),
        p.to(dtype=torch.float64),
        p.to(device=torch.device("cpu"), dtype=torch.float64),
        p.to(torch.zeros(1, dtype=torch.float64)),
        p.to(torch.float64),
    ):
        assert moved.probs.dtype == torch.float64
        assert torch.equal(moved.probs, p.probs.double())
        assert moved.targets is not None and moved.targets.dtype == torch.int64
        assert torch.equal(moved.targets, p.targets)
    assert p.to("cpu").probs.dtype == torch.float32
    with pytest.raises(TypeError, match=r"got a dtype in the device's place, then dtype="):
        p.to(torch.float64, torch.float32)


# --------------------------------------------------------------------------------------------
# rotate(): a pandas Series, an empty tensor
# --------------------------------------------------------------------------------------------

_RGB = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
_MEAN, _STD = (0.5, 0.25, 0.125), (0.5, 0.5, 0.25)


def test_rotate_takes_a_pandas_series_per_channel_again():
    pd = pytest.importorskip("pandas")
    # a Series has a shape and no reshape: "AttributeError: 'Series' object has no attribute
    # 'reshape'" (it was read by its tolist before)
    expected = rotate(_RGB, 20, mean=_MEAN, std=_STD)
    assert torch.equal(rotate(_RGB, 20, mean=pd.Series(_MEAN), std=pd.Series(_STD)), expected)


def test_rotate_counts_an_empty_tensor_of_constants():
    # it was "Expected mean to be a number or a sequence of numbers" for a tensor of no values
    with pytest.raises(ValueError, match=r"Expected mean to hold 3 value\(s\), .* got 0"):
        rotate(_RGB, 20, mean=torch.tensor([]), std=_STD)


# --------------------------------------------------------------------------------------------
# fit(): a dict of one input, a tuple of example dicts
# --------------------------------------------------------------------------------------------


def _fit(loader) -> str:
    model = bayesian(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)))
    with pytest.raises(TypeError) as info:
        fit(model, mean_field_guide(model), loader, epochs=1, num_data=8, progress=False)
    return str(info.value)


def test_fit_tells_a_dict_of_one_input_in_the_singular():
    # a vision model's {"pixel_values": x}: it was "(dict of 1 entries, Tensor)"
    message = _fit([({"pixel_values": torch.randn(8, 2)}, torch.zeros(8, dtype=torch.long))])
    assert "batch 1 of epoch 1 is (dict of 1 entry, Tensor), and pyrouq runs" in message


def test_fit_names_a_tuple_of_example_dicts_a_tuple():
    # a collate_fn returning tuple(items): it was told "is a list of 2 dicts"
    item = {"x": torch.randn(2), "y": torch.tensor(1)}
    message = _fit([(dict(item), dict(item))])
    assert message.startswith(
        "train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is a tuple of 2 "
        "dicts with the same keys ('x', 'y'): the examples of a batch as they came"
    ), message


def test_fit_still_trains_on_list_and_namedtuple_pairs():
    # a legitimate (x, y) batch as a list or a namedtuple passes the refusals
    pair = collections.namedtuple("pair", "x y")
    torch.manual_seed(0)
    x, y = torch.randn(8, 2), torch.randint(0, 3, (8,))
    for batch in ([x, y], pair(x, y)):
        pyro.clear_param_store()
        model = bayesian(nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 3)))
        result = fit(model, mean_field_guide(model), [batch], epochs=2, num_data=8, progress=False)
        assert (result.steps, len(result.history), result.num_data) == (2, 2, 8)
