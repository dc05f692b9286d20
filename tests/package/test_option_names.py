"""Options and keywords in the words refusing or warning of them: fit(num_data=) against a
loader whose sampler draws from part of its dataset (a list of indices, a sampler or batch
sampler of one's own), and the keywords a BatchEnsemble convolution does not take (torch's
device, dtype and a transposed convolution's output_padding; a misspelt one told before any
work)."""

from __future__ import annotations

import warnings

import pytest
import torch
from _toy import tiny_mlp, toy_data
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset, WeightedRandomSampler

from pyrouq import fit, mean_field_guide
from pyrouq.nn import BatchEnsembleConv2d, BatchEnsembleConvTranspose2d

QUIET = {"progress": False}
TRAIN = list(range(10))  # the training examples: 10 of the dataset's 16


class _Indices(Sampler):
    """A sampler of one's own over a subset of the dataset (as a train split's indices)."""

    def __init__(self, indices):
        self.indices = indices

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


class _Buckets:
    """A batch sampler of one's own: lists of the subset's indices, 5 at a time."""

    def __iter__(self):
        return iter([TRAIN[:5], TRAIN[5:]])

    def __len__(self):
        return 2


def _fit(loader, num_data):
    torch.manual_seed(0)
    model = tiny_mlp()
    return fit(model, mean_field_guide(model), loader, epochs=1, num_data=num_data, **QUIET)


# -- 1. fit(num_data=N) of a loader drawing from a subset of its dataset ------------------------


@pytest.mark.parametrize(
    "sampling",
    [
        {"batch_size": 5, "sampler": TRAIN},  # torch takes any iterable of indices
        {"batch_size": 5, "sampler": _Indices(TRAIN)},
        {"batch_sampler": _Buckets()},
        {"batch_size": 5, "sampler": WeightedRandomSampler([1.0] * 10 + [0.0] * 6, 10, False)},
    ],
    ids=["list", "sampler", "batch_sampler", "weighted"],
)
def test_fit_takes_num_data_of_a_subset_drawn_by_a_sampler_of_its_own_without_a_word(sampling):
    # was: "fit(num_data=10) is below the 16 examples of train_loader's dataset ... Pass
    # num_data=16", though the loader draws the 10 training examples only, and N = 10 is right
    x, y = toy_data(16)
    loader = DataLoader(TensorDataset(x, y), **sampling)
    assert sorted(i for batch in loader.batch_sampler for i in batch) == TRAIN  # (10 drawn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _fit(loader, 10).num_data == 10


def test_fit_still_warns_of_num_data_below_a_dataset_drawn_from_whole():
    x, y = toy_data(16)
    loader = DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True)  # all 16, each epoch
    with pytest.warns(UserWarning, match=r"fit\(num_data=10\) is below the 16 examples") as told:
        _fit(loader, 10)
    assert f"weigh {16 / 10:.3g} times less" in str(told[0].message)  # 1.6


# -- 2. keywords of torch's convolutions a BatchEnsemble convolution does not take -------------


@pytest.mark.parametrize("keyword", [{"device": "cpu"}, {"dtype": torch.float64}])
def test_a_conv_given_device_or_dtype_is_told_how_to_get_them(keyword):
    # was: "... Leave them out.", which leaves the layer float32 on the default device
    with pytest.raises(
        TypeError,
        match=r"\(a Conv2d to copy\)\. For another device or dtype, copy a Conv2d made there, "
        r"base=nn\.Conv2d\(\.\.\., device=\.\.\., dtype=\.\.\.\), or move the layer: "
        r"\.to\(device, dtype\)\.$",
    ):
        BatchEnsembleConv2d(3, 4, 3, 2, **keyword)
    # both ways the words give do make a float64 layer
    copied = BatchEnsembleConv2d(3, 4, 3, 2, base=nn.Conv2d(3, 4, 3, dtype=torch.float64))
    moved = BatchEnsembleConv2d(3, 4, 3, 2).to(torch.float64)
    for layer in (copied, moved):
        assert {p.dtype for p in layer.parameters()} == {torch.float64}


def test_a_conv_given_output_padding_is_sent_to_the_transposed_one_not_to_padding():
    # was: "... Did you mean 'padding'?", another setting altogether
    with pytest.raises(TypeError) as caught:
        BatchEnsembleConv2d(3, 4, 3, 2, stride=2, output_padding=1)
    text = str(caught.value)
    assert "did you mean" not in text
    assert text.endswith(
        "(a Conv2d to copy). output_padding is a transposed convolution's setting: for one, "
        "use BatchEnsembleConvTranspose2d."
    )
    # which takes it, as torch's ConvTranspose2d: (5 - 1) * 2 + 3 + 1 = 12
    layer = BatchEnsembleConvTranspose2d(3, 4, 3, 2, stride=2, output_padding=1)
    assert layer(torch.randn(2, 3, 5, 5)).shape == (2, 4, 12, 12)
    assert (
        nn.ConvTranspose2d(3, 4, 3, stride=2, output_padding=1)(torch.randn(1, 3, 5, 5)).shape[-1]
        == 12
    )


@pytest.mark.parametrize("layer", [BatchEnsembleConv2d, BatchEnsembleConvTranspose2d])
def test_a_misspelt_keyword_is_told_before_the_settings_are_checked_or_torch_builds_a_layer(
    layer,
):
    # was, for the transposed one: the settings checked and torch's layer built first (stride=0
    # refused, the misspelling never told; 0.56 s to build a 1024 x 1024 x 7 x 7 one and then
    # refuse 'strid')
    # asked as every refused name is, after the names (was a sentence of its own at the end,
    # "Did you mean 'padding'?"), a slip in case told as such
    told = rf"^{layer.__name__} got the keyword argument\(s\) "
    for keywords, meant in (
        ({"paddin": 1}, r"'paddin' \(did you mean 'padding'\?\)"),
        ({"paddin": 1, "strid": 2}, r"'paddin', 'strid' \(did you mean 'padding' or 'stride'\?\)"),
        ({"strid": 2, "paddin": 1}, r"'strid', 'paddin' \(did you mean 'stride' or 'padding'\?\)"),
        ({"paddin": 1, "padding_": 2}, r"'paddin', 'padding_' \(did you mean 'padding'\?\)"),
        ({"Padding": 1}, r"'Padding' \(did you mean 'padding'\? the names are lower case\)"),
    ):
        with pytest.raises(TypeError, match=told + meant + r", which it does not take: .*\)\.$"):
            layer(3, 4, 3, 2, stride=0, **keywords)
    # one close to a name asked about, the others told to leave out (was: only 'padding' asked
    # about, 'zzz' given no word, "Leave them out." lost)
    for keywords, far in (
        ({"paddin": 1, "zzz": 2}, r"'zzz' is close to none of the names it takes: leave it out"),
        ({"zzz": 2, "paddin": 1, "qqq": 3},
         r"'zzz' and 'qqq' are close to none of the names it takes: leave them out"),
    ):  # fmt: skip
        with pytest.raises(
            TypeError, match=told + r".*\(did you mean 'padding'\?\), which .*\)\. " + far + r"\.$"
        ):
            layer(3, 4, 3, 2, stride=0, **keywords)
    with pytest.raises(TypeError, match=r"there is no bias= to set: leave it out\.$"):
        layer(3, 4, 3, 2, stride=0, bias=False)
