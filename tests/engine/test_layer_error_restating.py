"""Review 9e: which errors of a network's pass fit(), predict() and mcmc() restate as inputs the
network does not take. pyrouq's own words pass unchanged; torch's are restated naming x's batch
wherever torch raised them (a BatchEnsemble layer of pyrouq's calling torch's convolution too),
from whatever file the network lives in (one beside pyrouq whose name starts like its own), and
an error on ``batchnorm_data`` is not blamed on x."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from _toy import NextParam
from torch import nn

import pyrouq

torch.set_num_threads(1)


def _beside_pyrouq() -> type[nn.Module]:
    """A network class whose code lives in ``<pyrouq's folder>_ext/net.py`` (a user's package
    next to pyrouq's, its path starting with pyrouq's folder name)."""
    source = (
        "class MatNet(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = nn.Parameter(torch.randn(4, 3))\n"
        "    def forward(self, x):\n"
        "        return x @ self.w\n"
    )
    path = os.path.dirname(os.path.abspath(pyrouq.__file__)) + "_ext/net.py"
    space = {"nn": nn, "torch": torch}
    exec(compile(source, path, "exec"), space)
    return space["MatNet"]  # type: ignore[no-any-return]


def test_a_network_in_a_folder_named_like_pyrouqs_gets_torchs_error_restated():
    """Its file's path starts with pyrouq's folder (pyrouq_ext/): the error was taken for one
    pyrouq raised and came out as torch's bare words."""
    torch.manual_seed(0)
    net = _beside_pyrouq()()
    with pytest.raises(ValueError) as info:
        pyrouq.predict(net, torch.randn(5, 6), progress=False)
    message = str(info.value)
    assert message.startswith(
        "predict(): MatNet failed on x (a batch of shape (5, 6), dtype torch.float32): "
        "mat1 and mat2 shapes cannot be multiplied (5x6 and 4x3)."
    )
    assert isinstance(info.value.__cause__, RuntimeError)  # torch's, with its traceback


def _conv_net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2))


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
def test_torchs_error_in_pyrouqs_own_layers_is_restated_as_in_torchs(kind):
    """A BatchEnsemble layer of pyrouq's calls torch's convolution itself: its error (images
    smaller than the kernel) was taken for pyrouq's own words and passed bare, where the same
    network converted by bayesian() (torch's Conv2d) had it restated naming x."""
    torch.manual_seed(0)
    if kind == "bayesian":
        model = pyrouq.bayesian(_conv_net())
    elif kind == "batchensemble":
        model = pyrouq.batchensemble(_conv_net(), 2)
    else:
        model = pyrouq.rank1(_conv_net(), 2)
    guide = None if kind == "batchensemble" else pyrouq.mean_field_guide(model)
    x = torch.randn(5, 3, 2, 2)
    with pytest.raises(ValueError) as info:
        pyrouq.predict(model, x, guide, num_samples=None if guide is None else 2, progress=False)
    message = str(info.value)
    assert message.startswith(
        f"predict(): {type(model).__name__} failed on x (a batch of shape (5, 3, 2, 2), dtype "
        "torch.float32): Calculated padded input size per channel: (2 x 2)."
    ), message
    assert message.endswith("Check that the network takes x (shape, channels, flattening: "
                            "inputs of the shape it was built for).")  # fmt: skip
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_error_on_batchnorm_data_is_not_blamed_on_x():
    """x fits the network, batchnorm_data does not: the error said 'failed on x (a batch of
    shape (5, 4))', x's shape, for torch's words on batchnorm_data's (6, 7)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model = pyrouq.bayesian(net)
    guide = pyrouq.mean_field_guide(model)
    x = torch.randn(5, 4)
    with pytest.raises(RuntimeError, match=r"\(6x7 and 4x8\)") as info:
        pyrouq.predict(model, x, guide, num_samples=2, batchnorm_data=torch.randn(6, 7))
    assert "failed on x" not in str(info.value)
    if sys.version_info >= (3, 11):  # the note says where it came from
        assert "a batch of batchnorm_data, shaped (6, 7)" in " ".join(info.value.__notes__)
    # and x itself predicts with batchnorm_data that fits
    out = pyrouq.predict(model, x, guide, num_samples=2, batchnorm_data=torch.randn(6, 4))
    assert out.probs.shape == (2, 5, 3)


def test_pyrouqs_own_error_passes_unchanged_through_fit_and_mcmc_as_through_predict():
    """pyrouq's words on next(self.parameters()) mention 'dtype': fit() and mcmc() restated them
    as inputs the network does not take ('failed on the first examples of train_loader ...
    Check that the network takes the loader's inputs'), predict() passed them unchanged."""
    torch.manual_seed(0)
    model = pyrouq.bayesian(NextParam())
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    words = r"^NextParam\.forward raised StopIteration\. If it reads next\(self\.parameters"
    with pytest.raises(RuntimeError, match=words):
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    loader = pyrouq.ArrayLoader(x, y, batch_size=4)
    with pytest.raises(RuntimeError, match=words):
        pyrouq.fit(model, guide, loader, epochs=1, progress=False)
    with pytest.raises(RuntimeError, match=words):
        pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, progress=False)


@pytest.mark.parametrize("caller", ["fit", "predict", "mcmc"])
@pytest.mark.parametrize("layers", ["linear", "conv", "conv after float64"])
def test_torchs_words_on_mixed_dtypes_are_told_as_such_not_as_a_shape(caller, layers):
    """A network holding a float64 layer after a float32 one: torch's 'mat1 and mat2 must have
    the same dtype' came out with 'Check that the network takes x (shape, channels,
    flattening ...)', a fix for shapes; now with what the words are on and the cast that
    fixes it, which does. A convolution with a bias says it its own way ('Input type (float)
    and bias type (double) should be the same'), which kept the shapes' hint, as did its
    other order ('Input type (double) and bias type (float)', x cast to the first layer's)."""
    torch.manual_seed(0)
    dtype = "float64" if layers == "conv after float64" else "float32"  # (x's, cast)
    if layers == "linear":
        net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2).double())
    else:
        first, conv = nn.Linear(3, 3), nn.Conv1d(1, 1, 2)
        (conv if layers == "conv" else first).double()
        net = nn.Sequential(first, nn.Unflatten(1, (1, 3)), conv, nn.Flatten())
    model = pyrouq.bayesian(net)
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))

    def call():
        if caller == "fit":
            return pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, batch_size=4), epochs=1,
                              progress=False)  # fmt: skip
        if caller == "predict":
            return pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        return pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1,
                           progress=False)  # fmt: skip

    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert {
        "linear": "mat1 and mat2 must have the same dtype, but got Float and Double",
        "conv": "Input type (float) and bias type (double) should be the same",
        "conv after float64": "Input type (double) and bias type (float) should be the same",
    }[layers] in message
    assert (
        "These are torch's words on dtypes, not on x's shape: x reached the network as "
        f"torch.{dtype}, and a layer's weights, a draw or a tensor the network makes is of "
        f"another dtype. Give the model one dtype (model.to(torch.{dtype})) and x that dtype"
    ) in message
    assert "Check that the network takes" not in message and "flattening" not in message
    model.to(getattr(torch, dtype))  # the fix it names
    guide = pyrouq.mean_field_guide(model)
    assert call() is not None


class _Ids(nn.Module):
    """A network of ids: an nn.Embedding's bag (``"ids"``), its rows picked by index_select
    (``"select"``), or ids sent to a Linear as they are (``"linear"``: a wrong route, not a
    wrong dtype of the model)."""

    def __init__(self, route: str):
        super().__init__()
        self.route, self.embed, self.fc = route, nn.Embedding(10, 4), nn.Linear(4, 2)

    def forward(self, x):
        if self.route == "select":  # (torch's words: "Expected dtype int32 or int64 for index")
            return self.fc(self.embed.weight.index_select(0, x[:, 0]))
        return self.fc(self.embed(x).mean(1) if self.route == "ids" else x)


@pytest.mark.parametrize("caller", ["fit", "predict", "mcmc", "psis", "export"])
@pytest.mark.parametrize("route", ["ids", "select", "linear"])
def test_torchs_words_on_the_dtype_of_ids_do_not_tell_to_cast_the_model(caller, route):
    """Float ids at an nn.Embedding (or index_select's index) were told 'Give the model one
    dtype (model.to(torch.float32)) and x that dtype', which changes nothing; integer ids at a
    Linear 'model.to(torch.int64)', which is no model. The first now names the ids' cast,
    which fixes it; the second was then told 'Check that the network takes x (shape, channels,
    flattening ...)', a fix for shapes, and now the route that fixes it: the ids through the
    nn.Embedding, features as floats. psis_diagnostic() and to_inference_data() kept telling
    both their shape check ('Check that the model takes x ...') after fit(), predict() and
    mcmc() told the dtype's fix."""
    torch.manual_seed(0)
    ids, y = torch.randint(0, 10, (8, 4)), torch.randint(0, 2, (8,))
    model = pyrouq.bayesian(_Ids(route))
    guide = pyrouq.mean_field_guide(model)

    def call(x):
        if caller == "fit":
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), 4)
            return pyrouq.fit(model, guide, loader, epochs=1, progress=False)
        if caller == "predict":
            return pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        if caller == "psis":
            return pyrouq.psis_diagnostic(model, guide, x, y, num_samples=25)
        if caller == "export":
            return pyrouq.to_inference_data(model, guide, x, y, num_samples=2)
        return pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1,
                           progress=False)  # fmt: skip

    with pytest.raises(ValueError) as info:
        call(ids if route == "linear" else ids.float())
    message = str(info.value)
    assert "model.to(" not in message
    assert "Check that the model takes" not in message
    if route == "linear":
        assert "mat1 and mat2 must have the same dtype, but got Long and Float" in message
        assert (
            "These are torch's words on dtypes, not on x's shape: x reached the network as "
            "torch.int64, as it came (a network holding an nn.Embedding or nn.EmbeddingBag "
            "takes integer inputs), and a layer of floating weights got it. In the forward, "
            "send ids through the embedding before such a layer, and features to it as floats "
            "(x.float())"
        ) in message
        assert "Check that the network takes" not in message
        return
    assert "x reached the network as" not in message
    assert (
        "index_select(): Expected dtype int32 or int64 for index"
        if route == "select"
        else "'indices' to have one of the following scalar types: Long, Int; but got "
        "torch.FloatTensor instead"
    ) in message
    assert (
        "These are torch's words on dtypes, not on x's shape: a layer takes integer indices (an "
        "nn.Embedding's or nn.EmbeddingBag's ids), and x reached it as torch.float32. Pass the "
        "ids as integers (x.long())"
    ) in message
    assert call(ids.float().long()) is not None  # the cast it names


class _IdsOnward(nn.Module):
    """Ids sent to a convolution as they are (``"conv"``, torch: 'Input type (long int) and
    bias type (float) should be the same'), or through an nn.Embedding to a Linear of another
    floating dtype (``"mixed"``: 'got Float and Double', the ids' route right)."""

    def __init__(self, route: str):
        super().__init__()
        self.route, self.embed = route, nn.Embedding(10, 4)
        self.conv = nn.Conv1d(1, 2, 3)
        self.fc = nn.Linear(16, 2, dtype=torch.float64 if route == "mixed" else None)

    def forward(self, x):
        if self.route == "conv":
            return self.conv(x.unsqueeze(1)).flatten(1)
        return self.fc(self.embed(x).flatten(1))


@pytest.mark.parametrize("caller", ["fit", "predict", "mcmc"])
@pytest.mark.parametrize("route", ["conv", "mixed"])
def test_torchs_words_on_dtypes_past_integer_ids_are_told_as_they_are(caller, route):
    """1fe3cfc told every dtype error of integer x that the ids reached a layer of floating
    weights ('send ids through the nn.Embedding before such a layer'): untrue where they went
    through it and torch's words name two floating dtypes (a float64 Linear after the
    embedding); and a convolution's words on integer ids were not read as on dtypes at all
    ('Check that the network takes x (shape, channels, flattening ...)')."""
    torch.manual_seed(0)
    ids, y = torch.randint(0, 10, (8, 4)), torch.randint(0, 2, (8,))
    model = pyrouq.bayesian(_IdsOnward(route))

    def call():
        guide = pyrouq.mean_field_guide(model)
        if caller == "fit":
            return pyrouq.fit(model, guide, pyrouq.ArrayLoader(ids, y, 4), epochs=1,
                              progress=False)  # fmt: skip
        if caller == "predict":
            return pyrouq.predict(model, ids, guide, num_samples=2, progress=False)
        return pyrouq.mcmc(model, ids, y, num_samples=2, warmup_steps=2, num_chains=1,
                           progress=False)  # fmt: skip

    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "Check that the network takes" not in message
    if route == "conv":
        assert "Input type (long int) and bias type (float) should be the same" in message
        assert (
            "x reached the network as torch.int64, as it came (a network holding an "
            "nn.Embedding or nn.EmbeddingBag takes integer inputs), and a layer of floating "
            "weights got it"
        ) in message
        return
    assert "mat1 and mat2 must have the same dtype, but got Float and Double" in message
    assert "send ids through" not in message
    assert (
        "These are torch's words on dtypes, not on x's shape: x reached the network as "
        "torch.int64, as it came, and they name two floating dtypes, not x's: the network's "
        "layers, or tensors its forward makes, are not of one dtype. Give the model one dtype "
        "(model.to(torch.float32))"
    ) in message
    model.to(torch.float32)  # the fix it names
    assert call() is not None


@pytest.mark.parametrize("caller", ["fit", "predict", "mcmc"])
def test_the_check_of_what_the_network_takes_is_worded_once(caller):
    """A later layer refusing what the one before it gave: fit() said 'Check that the network
    takes the loader's inputs (shape, channels, flattening)', predict() '... x (shape,
    channels, flattening: inputs of the shape it was built for)' and mcmc() '... N inputs of
    the shape ...'; now the one sentence, naming what each was given."""
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(4, 8), nn.Linear(7, 2)))
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    with pytest.raises(ValueError) as info:
        if caller == "fit":
            pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 4), epochs=1, progress=False)
        elif caller == "predict":
            pyrouq.predict(model, x, guide, num_samples=2, progress=False)
        else:
            pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1, progress=False)
    inputs = "the loader's inputs" if caller == "fit" else "x"
    ending = {"fit": "; nothing was trained.", "predict": ".", "mcmc": "; nothing was sampled."}
    assert str(info.value).endswith(
        f"at 'net.1' of the model). Check that the network takes {inputs} (shape, channels, "
        f"flattening: inputs of the shape it was built for){ending[caller]}"
    ), str(info.value)


@pytest.mark.parametrize("caller", ["fit", "predict"])
@pytest.mark.parametrize("kind", ["bayesian", "plain layer", "plain network"])
def test_a_bare_layer_or_a_plain_network_is_named_with_the_fix(caller, kind):
    """bayesian(nn.Linear(4, 3)) given 5 features: the layer is the network itself, which was
    named nowhere (torch's words and 'Check that the network takes x'), where the same layer in
    a Sequential got its path and the fix; so was a plain network's layer, or a plain layer,
    given to fit() or predict(). Now each is named, at 'net' of the model, as given as the
    network, or at its path in the network, with the fix."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 3)
    model = {
        "bayesian": pyrouq.bayesian(layer),
        "plain layer": layer,
        "plain network": nn.Sequential(nn.Identity(), layer),
    }[kind]
    guide = pyrouq.mean_field_guide(model) if kind == "bayesian" else None
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    with pytest.raises(ValueError) as info:
        if caller == "fit":
            pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 3), epochs=1, progress=False)
        else:
            pyrouq.predict(model, x, guide, num_samples=guide and 2, progress=False)
    where = {
        "bayesian": "at 'net' of the model",
        "plain layer": "given as the network",
        "plain network": "at '1' of the network",
    }[kind]
    assert (
        f"(in Linear(in_features=4, out_features=3, bias=True) {where}): the model's input, of "
        "5 features where this layer takes 4. Pass inputs of 4 features, or build the network "
        "for 5 (its first layer's in_features=5)"
    ) in str(info.value), str(info.value)
    assert "Check that the network takes" not in str(info.value)
