"""What the data helpers tell a user whose images they refuse, and that the fix they name works:
binary float images already in [0, 1] (TensorLoader divided them by 255 without a word), flat
rows given to normalize(), a relative root= that does not exist, images of two channels, and raw
0-255 pixels held as floats given to normalize()."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import pyrouq
from pyrouq.data import MNIST_MEAN, MNIST_STD, TensorLoader, mnist_arrays, normalize


def _loader(images, flatten=False, normalize=False):
    labels = torch.arange(len(images)) % 10
    return TensorLoader(images, labels, 4, shuffle=False, flatten=flatten, normalize=normalize,
                        seed=0)  # fmt: skip


# --------------------------------------------------------------------------------------------
# TensorLoader: floats in [0, 1] are never divided by 255, binary ones neither
# --------------------------------------------------------------------------------------------


def test_tensor_loader_refuses_binary_float_images_it_would_divide_by_255():
    # they came out as 0 and 1/255 = 0.0039, trained near black, without a word
    g = torch.Generator().manual_seed(0)
    binary = (torch.rand(6, 28, 28, generator=g) > 0.5).float()
    with pytest.raises(ValueError) as info:
        _loader(binary)
    assert str(info.value) == (
        "TensorLoader: expected raw pixel values in 0-255, got floats that are all 0 or 1, "
        "binary images already scaled to [0, 1], which it would divide by 255 again. Pass "
        "images * 255, or train on them as they are with pyrouq.ArrayLoader("
        "images.unsqueeze(1), labels, batch_size); raw pixels of values 0 and 1 (of 255) go "
        "in as images.byte()."
    )
    # each fix it names gives what it says: the images themselves, or 0 and 1/255
    x, _ = next(iter(_loader(binary * 255)))
    assert torch.equal(x[:, 0], binary[:4])
    x, _ = next(iter(pyrouq.ArrayLoader(binary.unsqueeze(1), torch.zeros(6).long(), 4,
                                        shuffle=False)))  # fmt: skip
    assert torch.equal(x[:, 0], binary[:4])
    x, _ = next(iter(_loader(binary.byte())))  # uint8: raw pixels, divided by 255
    torch.testing.assert_close(x[:, 0], binary[:4] / 255.0, rtol=0, atol=0)


def test_tensor_loader_names_arrayloader_of_the_rows_themselves_for_flat_rows():
    rows = (torch.rand(6, 784, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    with pytest.raises(ValueError, match=r"as they are with pyrouq\.ArrayLoader\(images, labels"):
        _loader(rows, flatten=True)
    with pytest.raises(ValueError, match=r"as they are with pyrouq\.ArrayLoader\(images, labels"):
        _loader(rows * 3 - 1, flatten=True)  # normalised already
    # black images (all 0) are the same divided or not: still served
    x, _ = next(iter(_loader(torch.zeros(6, 28, 28))))
    assert x.shape == (4, 1, 28, 28) and not x.any()
    # raw float pixels (e.g. rotated) keep being divided by 255, as documented
    raw = torch.tensor([0.0, 1.0, 128.0, 255.0]).repeat(6, 196).reshape(6, 28, 28)
    x, _ = next(iter(_loader(raw)))
    assert x[0, 0, 0, :4].tolist() == torch.tensor([0.0, 1 / 255, 128 / 255, 1.0]).tolist()


# --------------------------------------------------------------------------------------------
# normalize(): the layout fix that suits the shape given
# --------------------------------------------------------------------------------------------


def test_normalize_tells_flat_rows_to_reshape_and_the_reshape_works():
    raw = mnist_arrays("test")[0][:3]
    rows = raw.reshape(3, 784)
    # it said "for one image use images.unsqueeze(0)", which gives (1, 3, 784)
    with pytest.raises(ValueError) as info:
        normalize(rows)
    assert str(info.value) == (
        "Expected images of shape (N, H, W) with N >= 1, got shape (3, 784); for flattened "
        "images (rows of 784 pixels) use images.reshape(-1, 28, 28), and flatten=True to get "
        "rows back."
    )
    got = normalize(rows.reshape(-1, 28, 28), flatten=True)
    expected = (rows.double() / 255 - MNIST_MEAN) / MNIST_STD  # by hand, in float64
    torch.testing.assert_close(got, expected.float(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"got shape \(784,\); for one flattened image use "
                       r"images\.reshape\(1, 28, 28\)\.$"):  # fmt: skip
        normalize(rows[0])
    with pytest.raises(ValueError, match=r"got shape \(3, 10\); reshape flattened images to "
                       r"\(N, H, W\) first, images\.reshape\(-1, H, W\); for one image, "
                       r"images\.unsqueeze\(0\)\.$"):  # fmt: skip
        normalize(rows[:, :10])
    with pytest.raises(ValueError, match=r"got shape \(0, 28, 28\); pass at least one image\.$"):
        normalize(raw[:0])
    # one image (H, W) is still told to gain its batch dim
    with pytest.raises(ValueError, match=r"\(28, 28\); for one image use images\.unsqueeze\(0\)"):
        normalize(raw[0])


# --------------------------------------------------------------------------------------------
# A relative root= that does not exist: the folder it looked in, in full
# --------------------------------------------------------------------------------------------


def test_missing_relative_root_is_named_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    where = Path.cwd() / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        mnist_arrays("test", root="nowhere")
    expected = where / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    assert str(info.value).startswith(
        f"MNIST test file not found: expected {expected} or {expected}.gz (looked under root=: "
        f"{where}). That folder does not exist. To fix: "
    )
    assert os.path.isabs(str(where))
    monkeypatch.setenv("PYROUQ_DATA", "elsewhere/../nowhere")  # $PYROUQ_DATA alike
    with pytest.raises(FileNotFoundError, match=rf"\(looked under \$PYROUQ_DATA: {where}\)\. "):
        mnist_arrays("test")


# --------------------------------------------------------------------------------------------
# Images of two channels are not called colour images
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["first", "last"])
def test_two_channel_images_are_told_as_two_channels_not_colour(layout):
    images = torch.zeros(5, 2, 28, 28, dtype=torch.uint8)
    if layout == "last":
        images = images.permute(0, 2, 3, 1)
    told = (
        "2 channels: the MNIST helpers take grey images; serve images of 2 channels as floats "
        "normalised per channel with pyrouq.ArrayLoader(x, labels, batch_size), x of shape "
        "(N, C, H, W)"
        + ("; channels-last ones permuted first, images.permute(0, 3, 1, 2)" if layout == "last"
           else "")
    )  # fmt: skip
    with pytest.raises(ValueError) as info:
        normalize(images)
    assert str(info.value) == (
        f"Expected images of shape (N, H, W) with N >= 1, got shape {tuple(images.shape)}; {told}."
    )
    with pytest.raises(ValueError) as info:
        _loader(images)
    assert str(info.value).endswith(f"({told}).") and "colour" not in str(info.value)
    # three channels are colour images
    with pytest.raises(ValueError, match=r"3 channels: .*; serve colour images as floats"):
        normalize(torch.zeros(5, 3, 28, 28, dtype=torch.uint8))


@pytest.mark.parametrize("scale", [1.0, 0.999])
def test_normalize_of_raw_pixels_held_as_floats_is_told_to_make_them_uint8(scale):
    # before: "these images look normalised already; pass them to the network as they are",
    # which fed the network 0-255 inputs
    images = mnist_arrays("test")[0][:4]
    floats = images.float() * scale
    high = f"{255 * scale:.4g}"
    with pytest.raises(TypeError) as info:
        normalize(floats)
    assert str(info.value) == (
        "Expected raw integer pixels in [0, 255] (e.g. uint8), got dtype torch.float32 with "
        f"values in [0, {high}], raw pixels held as floats; pass images.round().to(torch.uint8)."
    )
    fixed = normalize(floats.round().to(torch.uint8))  # the advice, against the hand formula
    reference = ((images.double() / 255 - MNIST_MEAN) / MNIST_STD).unsqueeze(1)
    torch.testing.assert_close(fixed.double(), reference, atol=0.5 / 255 / MNIST_STD, rtol=0)
    # images scaled or normalised already keep their words
    with pytest.raises(TypeError, match="look normalised already; pass them to the network as"):
        normalize(images.float() / 255)
