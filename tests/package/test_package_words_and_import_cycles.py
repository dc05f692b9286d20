"""The package's words helpers, each module imported first, and the predictions' ``to()``: a
Gaussian predictions' ``to()`` takes what ``Predictions.to()`` takes, a dtype given as a string
is told as one, a loader's input tensor inside a 1-tuple is not told of "other inputs", "an"
before an UninitializedParameter; and what stays as it was: the wrapper's words (now from one
constant), the default number of draws read at predict()'s call, every form of fit()'s
BatchNorm refusal put in the command's words."""

from __future__ import annotations

import subprocess
import sys

import pyro.distributions as dist
import pytest
import torch
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq.predictive
from pyrouq import Predictions, bayesian, fit, mean_field_guide, predict
from pyrouq._batchnorm import one_value_in_training
from pyrouq._words import article
from pyrouq.cli._fit_words import batchnorm_in_command_words
from pyrouq.data import TensorLoader
from pyrouq.infer._batch_inputs import refuse_several_inputs
from pyrouq.regression import GaussianPredictions


def _gaussian() -> GaussianPredictions:
    return GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1), torch.zeros(3, 1))


def test_gaussian_predictions_to_takes_device_and_dtype_as_predictions_to_does():
    """It took one positional argument: to(dtype=...) and to(device, dtype) were TypeErrors
    of Python's, though its docstring said it takes them as Predictions.to() does."""
    p = _gaussian()
    for moved in (p.to(dtype=torch.float64), p.to("cpu", torch.float64), p.to(None, torch.float64)):
        assert moved is not p
        assert {moved.loc.dtype, moved.scale.dtype, moved.targets.dtype} == {torch.float64}
    same = p.to()
    assert same is not p and same.loc.dtype == torch.float32
    assert p.to(device=torch.device("cpu")).loc.device.type == "cpu"
    with pytest.raises(TypeError, match=r"got torch\.float16: the moments are computed"):
        p.to(dtype=torch.float16)
    with pytest.raises(
        TypeError,
        match=r"^GaussianPredictions\.to\(\) takes a device, then a dtype; got a dtype in the "
        r"device's place, then dtype=torch\.float32\. Pass to\(device, dtype\), to\(dtype\) or "
        r"to\(tensor\)\.$",
    ):
        p.to(torch.float64, torch.float32)


def test_a_dtype_given_as_a_string_is_told_as_a_string():
    """It said "got float64", which reads as the dtype it asks for."""
    p = Predictions.from_probs(torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]]))
    with pytest.raises(TypeError, match=r"for the probabilities, got 'float64': the decomp"):
        p.to("cpu", "float64")
    with pytest.raises(TypeError, match=r"for the moments and targets, got 'float64': the mom"):
        _gaussian().to(dtype="float64")
    with pytest.raises(TypeError, match=r"got a tensor of dtype torch\.int64: the decomp"):
        p.to(torch.zeros(1, dtype=torch.int64))  # (unchanged)


def test_a_loaders_input_inside_a_one_tuple_is_told_to_serve_the_tensor_itself():
    """It said "(tuple of 1 tensors, Tensor)" and told to compute "the other inputs" in forward
    or to concatenate them: there are none."""
    torch.manual_seed(0)
    model = bayesian(nn.Linear(3, 2))
    loader = [((torch.randn(4, 3),), torch.tensor([0, 1, 0, 1]))]
    told = (
        "train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is (tuple of 1 tensor, "
        "Tensor): the input tensor inside a tuple, and pyrouq runs the network on the tensor "
        "itself. Serve it as x, not inside a tuple or list (x[0])."
    )
    with pytest.raises(TypeError) as caught:
        fit(model, mean_field_guide(model), loader, num_data=4, epochs=1, progress=False)
    assert str(caught.value) == told


def test_an_before_uninitialized_and_a_before_union():
    """ "a UninitializedParameter": the "uni" of a Union is said "you-ni", not that of
    "un-initialized"."""
    assert article("UninitializedParameter") == "an"
    assert article("UninitializedBuffer") == "an"
    assert [article(w) for w in ("Union", "UserDict", "uint8", "ndarray", "int")] == [
        "a",
        "a",
        "a",
        "an",
        "an",
    ]


def test_an_before_initials_said_letter_by_letter():
    """ "holds a MLP": capitals without a vowel are said by their letters' names ("em")."""
    words = ("MLP", "MCMCResult", "HTTPError", "CNN", "NUTS", "LeNet", "BayesianMLP", "ELBO")
    assert [article(w) for w in words] == ["an", "an", "an", "a", "a", "a", "a", "an"]


_DICT_FIT = (
    "train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is (dict of 2 entries, dict "
    "of 1 entry), and pyrouq runs the network on one input tensor x. Wrap the network in a small "
    "nn.Module whose forward takes one tensor and builds the dict from it, convert that wrapper, "
    "and serve that tensor as x, and y as one tensor of targets."
)
_DICT_PREDICT = (
    "predict() expects x as a torch.Tensor or an iterable of batches, got a dict. Pass a tensor "
    "(N, ...) or a DataLoader. pyrouq runs networks of one tensor input: for a network whose "
    "forward takes a dict, wrap it in a small nn.Module whose forward takes one tensor and builds "
    "the dict from it, and convert that wrapper."
)


def test_the_wrappers_words_built_from_one_constant_are_the_words_they_were():
    batch = ({"a": torch.zeros(2, 3), "b": torch.zeros(2)}, {"y": torch.zeros(2)})
    with pytest.raises(TypeError) as caught:
        refuse_several_inputs(batch, 1, 1)
    assert str(caught.value) == _DICT_FIT
    model = bayesian(nn.Linear(3, 2))
    with pytest.raises(TypeError) as caught:
        predict(model, {"a": torch.randn(2, 3)}, mean_field_guide(model), progress=False)
    assert str(caught.value) == _DICT_PREDICT


class _PriorOnly(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](3, 2)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))

    def forward(self, x, y=None):
        return self.fc(x)


def test_the_default_number_of_prior_runs_is_read_when_predict_runs(monkeypatch):
    monkeypatch.setattr(pyrouq.predictive, "DEFAULT_NUM_SAMPLES", 5)
    assert predict(_PriorOnly(), torch.randn(4, 3), progress=False, seed=0).probs.shape[0] == 5


@pytest.mark.parametrize(
    "first", ["pyrouq", "pyrouq.calibration", "pyrouq.checkpoint", "pyrouq.regression"]
)
def test_each_module_imports_first_in_a_fresh_interpreter(first):
    done = subprocess.run(
        [sys.executable, "-c", f"import {first}; import pyrouq; print(pyrouq.predict.__name__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "predict"


def _loader(n: int, batch_size: int) -> TensorLoader:
    images, labels = torch.zeros(n, 4, 4, dtype=torch.uint8), torch.zeros(n, dtype=torch.int64)
    return TensorLoader(
        images, labels, batch_size, shuffle=False, flatten=False, normalize=False, seed=0
    )


class _Unsized:
    batch_size = 3


_X = torch.zeros(1, 1, 4, 4)
_ONE_BATCH = " --batch-size 1 makes every batch one input: pass a --batch-size of 2 or more."
_SPLIT = (
    " The command splits the --train-size images among its 2 ranks, ceil(--train-size / 2) on "
    "each, which leaves one image on this rank: pass a --train-size of 3 or more (or start "
    "fewer ranks)."
)
_SHARD = (
    " The command runs on 2 ranks: each trains on its shard of the {images}, {share} of them, in "
    "batches of --batch-size{size} (per rank), so the remainder that counts is the shard's, not "
    "the whole data set's. That is the last batch of each rank's shard in the epoch: pick a "
    "--batch-size (or --train-size) that leaves no remainder of 1 from the {share} images of "
    "each rank."
)

# every form one_value_in_training gives (first batch / later batch, one process / ranks, the
# shard counted / not, of one image / more), the command's --batch-size and world, its words
_FORMS = {
    "first, one process": ((_X, 1, 1), 4, 1, " --train-size 1 leaves one example: pass a "
                           "--train-size of 2 or more."),
    "first, one process, batch size 1": ((_X, 1, 1), 1, 1, _ONE_BATCH),
    "first, ranks, shard not counted": ((_X, 1, 1, None, 2), 4, 2, _SPLIT),
    "first, ranks, not counted, batch size 1": ((_X, 1, 1, None, 2), 1, 2, _ONE_BATCH),
    "first, ranks, a shard of one": ((_X, 1, 1, _loader(2, 4), 2), 4, 2, _SPLIT),
    "first, ranks, a shard of one, batch size 1": (
        (_X, 1, 1, _loader(2, 1), 2), 1, 2,
        " --batch-size 1 makes every batch one input, and the command splits the --train-size "
        "images among its 2 ranks, ceil(--train-size / 2) on each, which leaves one image on "
        "this rank: pass a --train-size of 3 or more and a --batch-size of 2 or more (or start "
        "fewer ranks).",
    ),
    "first, ranks, a shard of three, batch size 1": ((_X, 1, 1, _loader(5, 1), 2), 1, 2,
                                                     _ONE_BATCH),
    "last, one process": ((_X, 1, 3, _loader(7, 3), 1), 3, 1, " That is the last batch of the "
                          "epoch: pick a --batch-size (or --train-size) that leaves no remainder "
                          "of 1."),
    "last, one process, batch size 1": ((_X, 1, 3, _loader(7, 1), 1), 1, 1, _ONE_BATCH),
    "last, ranks, counted": ((_X, 1, 2, _loader(7, 2), 2), 2, 2, _SHARD.format(
        images="7 images", share="ceil(7 / 2) = 4", size=" 2")),
    "last, ranks, counted, no batch size": ((_X, 1, 2, _loader(7, 2), 2), None, 2, _SHARD.format(
        images="7 images", share="ceil(7 / 2) = 4", size="")),
    "last, ranks, not counted": ((_X, 1, 2, _Unsized(), 2), 3, 2, _SHARD.format(
        images="images", share="ceil(--train-size / 2)", size=" 3")),
    "last, ranks, batch size 1": ((_X, 1, 2, _loader(7, 1), 2), 1, 2, _ONE_BATCH),
}  # fmt: skip


@pytest.mark.parametrize("form", list(_FORMS))
def test_every_form_of_fits_batchnorm_refusal_is_put_in_the_commands_words(form):
    args, batch_size, world, words = _FORMS[form]
    refusal = one_value_in_training(*args)
    message = " ".join(str(refusal).split())  # as the command makes it one line
    # (a later batch: "That is usually ...", or for a loader whose sizes fit() knows, "That is
    # the last batch of the epoch: 7 examples in batches of 3 leave 1, ...")
    cue = " Give batches of 2" if args[2] == 1 else " That is "
    head = message.split(cue)[0].split(" fit() runs on ")[0]  # (fit()'s words of the shards)
    said = batchnorm_in_command_words(refusal, batch_size, world)
    assert said == head + words
    for fits_words in ("drop_last", "DataLoader", "batch_size", "fit() runs"):
        assert fits_words not in said
