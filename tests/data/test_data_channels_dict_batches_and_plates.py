"""Review of the data, plate-room and dict-batch commits: rotate()'s constants given as tensors
shaped to broadcast; fit()'s refusal of a dict x whatever y is, and of a batch of example dicts
left as they came; predict() telling a guide's plate of a literal size smaller than the batch
in house words, and naming where a model function reads its num_data; the IDX cache's hit."""

from __future__ import annotations

import collections
import re
import time

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import _idx, bayesian, fit, mean_field_guide
from pyrouq.data import mnist_arrays
from pyrouq.rotation import rotate

# --------------------------------------------------------------------------------------------
# rotate(): per-channel constants as tensors
# --------------------------------------------------------------------------------------------

_RGB = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
_MEAN, _STD = (0.5, 0.25, 0.125), (0.5, 0.5, 0.25)


@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (3, 1, 1), (1, 1, 3)])
def test_rotate_takes_per_channel_tensors_shaped_to_broadcast(shape):
    # (1, 3, 1, 1) is the shape one normalises with, (x - m) / s; it was "Expected mean to be a
    # number or a sequence of numbers, one per channel, got Tensor tensor([[[[0.5000]], ..."
    expected = rotate(_RGB, 20, mean=_MEAN, std=_STD)
    m, s = torch.tensor(_MEAN).view(shape), torch.tensor(_STD).view(shape)
    assert torch.equal(rotate(_RGB, 20, mean=m, std=s), expected)
    assert torch.equal(rotate(_RGB, 20, mean=m.numpy(), std=s.requires_grad_()), expected)


def test_rotate_takes_a_one_element_tensor_as_one_number_for_every_channel():
    # torch broadcasts tensor([0.5]) over the channels, as a number; it was "Expected mean to
    # hold 3 value(s), one per channel of the images, got 1 (tensor([0.5000]))"
    expected = rotate(_RGB, 20, mean=0.5, std=0.25)
    got = rotate(_RGB, 20, mean=torch.tensor([0.5]), std=torch.tensor([[0.25]]))
    assert torch.equal(got, expected)
    with pytest.raises(ValueError, match=r"Expected mean to hold 3 value\(s\), .* got 2"):
        rotate(_RGB, 20, mean=torch.tensor([0.5, 0.5]).view(1, 2, 1, 1), std=0.25)
    with pytest.raises(TypeError, match=r"Expected std to be a number or a sequence of numbers"):
        rotate(_RGB, 20, mean=0.5, std=torch.full((3, 3), 0.5))  # not one value per channel
    with pytest.raises(ValueError, match=r"Expected each std to be a finite number > 0, got 0"):
        rotate(_RGB, 20, mean=0.5, std=torch.tensor([0.5, 0.0, 0.5]).view(1, 3, 1, 1))


def test_rotate_tells_a_string_of_a_number_what_to_pass():
    # the string-number hint of the other numeric arguments: it was "got str '0.5'; pass e.g.
    # mean=(0.4914, ...)" alone
    with pytest.raises(TypeError, match=r"got str '0.5' \(a string: pass a float, mean=0.5\); "):
        rotate(_RGB, 20, mean="0.5", std=0.25)
    with pytest.raises(TypeError, match=r"got str '-1' \(a string: pass a float > 0\); pass"):
        rotate(_RGB, 20, mean=0.5, std="-1")
    told = r"got '0.25' \(a string: pass the float 0.25\) in std=\(0.25, '0.25', 0.25\); "
    with pytest.raises(ValueError, match=told):
        rotate(_RGB, 20, mean=0.5, std=(0.25, "0.25", 0.25))


def test_rotate_shows_a_huge_int_among_the_channels_shortly():
    # it was written out in 401 digits inside the list (and 10**5000 raised Python's "Exceeds
    # the limit (4300 digits) for integer string conversion" instead of the refusal)
    told = "got about 10**400 in mean=[0.5, 0.5, about 10**400]; pass the per-channel mean"
    with pytest.raises(ValueError, match=re.escape(told)):
        rotate(_RGB, 20, mean=[0.5, 0.5, 10**400], std=0.25)
    told = "got about 10**5000 in std=(0.25, 0.25, about 10**5000); pass the per-channel std"
    with pytest.raises(ValueError, match=re.escape(told)):
        rotate(_RGB, 20, mean=0.5, std=(0.25, 0.25, 10**5000))
    told = "got 4 ([0.5, 0.5, about 10**400, 1]); pass one value per channel"
    with pytest.raises(ValueError, match=re.escape(told)):
        rotate(_RGB, 20, mean=[0.5, 0.5, 10**400, 1], std=0.25)
    told = "got set {about 10**5000}; pass e.g. mean="  # (no sequence: its own refusal)
    with pytest.raises(TypeError, match=re.escape(told)):
        rotate(_RGB, 20, mean={10**5000}, std=0.25)


# --------------------------------------------------------------------------------------------
# fit(): a dict of inputs, whatever the targets; example dicts left unbatched
# --------------------------------------------------------------------------------------------


def _fit(loader):
    model = bayesian(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)))
    with pytest.raises(TypeError) as info:
        fit(model, mean_field_guide(model), loader, epochs=1, num_data=8, progress=False)
    return str(info.value)


class _Encoding(collections.UserDict):
    """A mapping that is not a dict, as transformers' BatchEncoding."""


@pytest.mark.parametrize(
    ("targets", "came"),
    [
        ({"labels": torch.zeros(8, dtype=torch.long)}, "dict of 1 entry"),
        ([0] * 8, "list"),
        (None, "Tensor"),
    ],
)
def test_fit_tells_a_dict_of_inputs_to_wrap_the_network_whatever_the_targets(targets, came):
    # with dict or list targets it was "is (dict, dict). Convert them with torch.as_tensor(...)"
    # (which a dict refuses), and a Mapping that is not a dict got the same
    x = {"ids": torch.randn(8, 2)}
    if targets is None:  # a Mapping that is not a dict, tensor targets
        x, targets = _Encoding(x), torch.zeros(8, dtype=torch.long)
    message = _fit([(x, targets)])
    name = "_Encoding" if isinstance(x, _Encoding) else "dict"
    assert f"batch 1 of epoch 1 is ({name} of 1 entry, {came})" in message
    assert "Wrap the network in a small nn.Module whose forward takes one tensor" in message
    assert "as_tensor" not in message
    assert message.endswith(
        "serve that tensor as x." if came == "Tensor" else "and y as one tensor of targets."
    )


@pytest.mark.parametrize("size", [2, 3])
def test_fit_tells_a_batch_of_example_dicts_left_as_they_came(size):
    # a collate_fn returning its items as they are: two were "(dict, dict). Convert them with
    # torch.as_tensor(...)", three "a list of 3. Serve (x, y) without the other 1 item(s)"
    item = {"x": torch.randn(2), "y": torch.tensor(1)}
    message = _fit([[dict(item) for _ in range(size)]])
    assert message.startswith(
        f"train_loader must yield (x, y) tensor pairs; batch 1 of epoch 1 is a list of {size} "
        "dicts with the same keys ('x', 'y'): the examples of a batch as they came"
    )
    assert "torch.stack([item['x'] for item in items])" in message
    assert "without the other" not in message and "Convert them" not in message


class _Dicts(torch.utils.data.Dataset):
    """A dataset of dict examples, as Hugging Face's and many tutorials' are."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"label": torch.tensor(i % 3), "pixels": torch.full((2,), float(i))}


def test_the_fix_told_for_a_loader_of_dicts_runs_as_written():
    # it said "e.g. a collate_fn returning (batch['x'], batch['y'])": a collate_fn gets the list
    # of examples, so that failed in torch's words (list indices must be integers or slices)
    message = _fit(torch.utils.data.DataLoader(_Dicts(), batch_size=4))
    assert "is a dict with keys 'label', 'pixels'. Map it to pairs, e.g. " in message
    code = message.split("returns the pair: ", 1)[1].split("; then ", 1)[0]
    assert code == (
        "def pairs(items): b = torch.utils.data.default_collate(items); "
        "return b['pixels'], b['label']"
    )
    scope: dict = {"torch": torch}
    exec(code.replace("; ", "\n    ").replace(": b =", ":\n    b ="), scope)
    loader = torch.utils.data.DataLoader(_Dicts(), batch_size=4, collate_fn=scope["pairs"])
    model = bayesian(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)))
    result = fit(model, mean_field_guide(model), loader, epochs=1, progress=False)
    assert len(result.history) == 1


class _InputDicts(_Dicts):
    """Dict examples of inputs alone, as one predicts."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixels": super().__getitem__(i)["pixels"]}


def test_the_fix_told_predict_for_a_loader_of_input_dicts_runs_as_written():
    # it said "return b['pixels'], b['y']" for a dict with no labels: a KeyError as written
    model = bayesian(nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)))
    guide = mean_field_guide(model)
    with pytest.raises(
        TypeError, match=r"a dict with keys 'pixels'\. Map it to tensors of "
    ) as info:
        pyrouq.predict(model, torch.utils.data.DataLoader(_InputDicts(), batch_size=4), guide)
    code = str(info.value).split("returns them: ", 1)[1].split("; then ", 1)[0]
    assert code == "def inputs(items): return torch.utils.data.default_collate(items)['pixels']"
    scope: dict = {"torch": torch}
    exec(code.replace(": return", ":\n    return"), scope)
    loader = torch.utils.data.DataLoader(_InputDicts(), batch_size=4, collate_fn=scope["inputs"])
    preds = pyrouq.predict(model, loader, guide, num_samples=2, progress=False)
    assert preds.probs.shape == (2, 8, 3)


# --------------------------------------------------------------------------------------------
# predict(): plates of a literal size
# --------------------------------------------------------------------------------------------


def _local(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
    with pyro.plate("data", 100, subsample_size=len(x)):
        z = pyro.sample("z", dist.Normal(0.0, 1.0))
        logits = pyro.deterministic("logits", x @ w + z[:, None])
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def _local_guide(x, y=None):
    pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
    with pyro.plate("data", 100, subsample_size=len(x)):
        pyro.sample("z", dist.Normal(0.0, 1.0))


def test_predict_tells_a_guides_plate_smaller_than_the_batch_in_house_words():
    # the guide, not the model, met the batch first: Pyro's "subsample_size does not match
    # len(subsample), 150 vs 100. Did you accidentally use different subsample_size ..."
    x = torch.randn(150, 3)
    with pytest.raises(ValueError) as refused:
        pyrouq.predict(_local, x, _local_guide, num_samples=2, progress=False)
    assert str(refused.value).startswith(
        'predict(): _local_guide\'s plate "data" has size 100, and predict() ran a batch of 150 '
        "inputs, more than the plate holds (Pyro: subsample_size does not match len(subsample), "
        "150 vs 100). Pass predict(..., batch_size=100) or less"
    ), str(refused.value)
    assert 'pyro.plate("data", _local_guide.num_data, subsample_size=len(x))' in str(refused.value)
    with pytest.warns(UserWarning, match="latent site"):  # the way out it names
        out = pyrouq.predict(_local, x, _local_guide, 2, batch_size=100, progress=False)
    assert out.probs.shape == (2, 150, 2)


def test_a_guides_plate_is_told_to_set_the_guides_num_data():
    # it said "(the README's recipe; fit() sets it)": fit() sets the model's num_data alone
    with pytest.raises(ValueError) as refused:
        pyrouq.predict(_local, torch.randn(150, 3), _local_guide, num_samples=2, progress=False)
    message = str(refused.value)
    assert 'pyro.plate("data", _local_guide.num_data, subsample_size=len(x))' in message
    assert message.endswith(
        "which predict() raises for its batches (set the guide's num_data to the training "
        "set's size yourself: fit() sets the model's, not the guide's)."
    ), message
    assert "fit() sets it)" not in message


def _hundred(x, y=None):
    w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
    logits = pyro.deterministic("logits", x @ w)
    with pyro.plate("data", 100, subsample_size=len(x)):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


class _Hundred(pyro.nn.PyroModule):
    def forward(self, x, y=None):
        return _hundred(x, y)


def _told(model) -> str:
    with pytest.raises(ValueError) as refused:
        pyrouq.predict(model, torch.randn(150, 3), num_samples=2, progress=False)
    return str(refused.value)


def test_the_num_data_recipe_names_where_the_model_reads_it():
    # a model function has no self: it was pyro.plate("data", self.num_data, ...) for both
    assert 'pyro.plate("data", _hundred.num_data, subsample_size=len(x))' in _told(_hundred)
    assert 'pyro.plate("data", self.num_data, subsample_size=len(x))' in _told(_Hundred())

    def follows(x, y=None):  # the recipe followed: predict() raises num_data for its batches
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        logits = pyro.deterministic("logits", x @ w)
        with pyro.plate("data", follows.num_data, subsample_size=len(x)):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits

    follows.num_data = 100  # type: ignore[attr-defined]
    out = pyrouq.predict(follows, torch.randn(150, 3), num_samples=2, progress=False)
    assert out.probs.shape == (2, 150, 2) and follows.num_data == 100  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# The IDX cache: (mtime, ctime, size) stamps still hit on a second load
# --------------------------------------------------------------------------------------------


def test_a_second_load_of_the_same_files_is_served_from_the_cache():
    first = mnist_arrays("test")
    start = time.perf_counter()
    second = mnist_arrays("test")
    took = time.perf_counter() - start
    # the copies handed out share nothing with the cache, which holds one entry per file pair
    key = next(k for k in _idx._CACHE if k[0].name.startswith("t10k-images"))
    cached = _idx._CACHE[key]
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert len(cached[0]) == 6 and took < 0.5  # parsing 10,000 images again takes longer


# --------------------------------------------------------------------------------------------
# Layout hints: the channel count of channels-last images of other than 3 or 4 channels
# --------------------------------------------------------------------------------------------


def test_layout_hint_counts_the_channels_of_two_channel_channels_last_images():
    # (N, 28, 28, 2) was told "28 channels", the image height, and no permute
    from pyrouq.data import TensorLoader, normalize

    images = torch.zeros(5, 28, 28, 2, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\(5, 28, 28, 2\); 2 channels: .*permuted first, "):
        normalize(images)
    with pytest.raises(ValueError, match=r"\(2 channels: the MNIST helpers take grey images"):
        TensorLoader(images, torch.zeros(5, dtype=torch.long), 4, shuffle=False, flatten=False,
                     normalize=True, seed=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"\(5, 2, 28, 28\); 2 channels: .*\(N, C, H, W\)\.$"):
        normalize(images.permute(0, 3, 1, 2))
