"""Colour images (N, 3, H, W): rotate, evaluate_rotations and the image plots take them, with
the normalisation to undo given per channel (mean=, std=); other channel counts are refused."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import metrics
from pyrouq.data import MNIST_MEAN, MNIST_STD, NORMALIZED_BLACK
from pyrouq.plotting import plot_image_grid, plot_most_uncertain
from pyrouq.predictive import Predictions
from pyrouq.rotation import evaluate_rotations, rotate

MEAN = (0.4914, 0.4822, 0.4465)  # CIFAR-10's
STD = (0.2470, 0.2435, 0.2616)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _normalise(raw: torch.Tensor) -> torch.Tensor:
    return (raw - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def _raw(n: int = 4, h: int = 10, w: int = 14, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, 3, h, w, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# rotate


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("angle", [30.0, 90.0, -137.5, 180.0])
@pytest.mark.parametrize("normalized", [True, False])
def test_rotate_turns_every_channel_as_that_channel_alone(dtype, angle, normalized):
    raw = _raw()
    x = (_normalise(raw) if normalized else raw).to(dtype)
    kwargs = {"mean": MEAN, "std": STD} if normalized else {}
    out = rotate(x, angle, normalized=normalized, **kwargs)
    assert out.shape == x.shape and out.dtype == dtype
    for c in range(3):
        alone = {"mean": MEAN[c], "std": STD[c]} if normalized else {}
        one = rotate(x[:, c : c + 1], angle, normalized=normalized, **alone)
        assert torch.equal(out[:, c : c + 1], one)  # bit-identical


def test_rotate_fills_colour_images_with_black_of_each_channel():
    raw = _raw(h=12, w=12)
    out = rotate(_normalise(raw), 45, mean=MEAN, std=STD)
    # the normalisation is affine: rotating normalised images = normalising rotated raw ones
    expected = _normalise(rotate(raw, 45, normalized=False))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    black = torch.tensor([(0 - m) / s for m, s in zip(MEAN, STD, strict=True)])
    corner = out[:, :, 0, 0]  # rotated in from outside, in every channel: (0 - mean) / std
    # (a corner of a square turned by 45 degrees lies well outside it: all background)
    torch.testing.assert_close(corner, black.expand(4, 3), atol=1e-6, rtol=0)
    assert black[0] != pytest.approx(NORMALIZED_BLACK)  # not MNIST's black
    # quarter turns of square colour images are torch.rot90 of every channel
    assert torch.equal(rotate(raw, 90, normalized=False), torch.rot90(raw, 1, dims=(-2, -1)))


def test_rotate_keeps_grey_images_bit_for_bit():
    x = (
        torch.rand(3, 1, 9, 9, generator=torch.Generator().manual_seed(3)) - MNIST_MEAN
    ) / MNIST_STD
    out = rotate(x, 33.0)
    assert torch.equal(out, rotate(x, 33.0, mean=MNIST_MEAN, std=MNIST_STD))
    # the sampling of the one-channel code as it was: MNIST's black, a Python number
    cos, sin = math.cos(math.radians(33.0)), math.sin(math.radians(33.0))
    theta = torch.tensor([[[cos, -sin * 9 / 9, 0.0], [sin * 9 / 9, cos, 0.0]]])
    grid = nn.functional.affine_grid(theta, [1, 1, 9, 9], align_corners=False).expand(3, -1, -1, -1)
    ref = nn.functional.grid_sample(x - NORMALIZED_BLACK, grid, align_corners=False)
    assert torch.equal(out, ref + NORMALIZED_BLACK)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((2, 4, 5, 5), r"got shape \(2, 4, 5, 5\); 4 channels are not supported, only 1 \(grey\) "
         r"or 3 \(RGB\): drop the alpha channel of RGBA images with images\[:, :3\]\.$"),
        ((2, 2, 5, 5), r"got shape \(2, 2, 5, 5\); 2 channels are not supported, only 1 \(grey\) "
         r"or 3 \(RGB\): pass one channel at a time, images\[:, c:c \+ 1\]\.$"),
        ((2, 5, 5, 3), r"got shape \(2, 5, 5, 3\); for channels-last \(N, H, W, C\) images pass "
         r"images\.permute\(0, 3, 1, 2\)\.$"),
    ],
)  # fmt: skip
def test_other_channel_counts_are_refused(shape, message):
    head = r"^Expected images of shape \(N, 1, H, W\) or \(N, 3, H, W\) \(grey or RGB\), "
    with pytest.raises(ValueError, match=head + r".*" + message):
        rotate(torch.zeros(shape), 30, normalized=False)
    model = nn.Sequential(nn.Flatten(), nn.LazyLinear(3))
    with pytest.raises(ValueError, match=message):
        evaluate_rotations(model, torch.zeros(shape), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=message):
        plot_image_grid(Predictions.from_probs(torch.full((1, 2, 3), 1 / 3)), torch.zeros(shape))


def test_plots_of_numpy_images_give_numpy_fixes_that_work():
    # the plots take numpy arrays, but told a channels-last one 'pass images.permute(0, 3, 1,
    # 2)' and int64 pixels 'images.to(torch.uint8)': numpy arrays have neither method
    preds = Predictions.from_probs(torch.full((1, 2, 3), 1 / 3))
    rgb = np.random.default_rng(0).integers(0, 256, (2, 5, 5, 3), dtype=np.uint8)
    with pytest.raises(
        ValueError, match=r"\(N, H, W, C\) images pass images\.transpose\(0, 3, 1, 2\)\.$"
    ):
        plot_image_grid(preds, rgb)
    fig = plot_image_grid(preds, rgb.transpose(0, 3, 1, 2))  # as told: drawn in colour
    np.testing.assert_allclose(fig.axes[0].images[1].get_array(), rgb[1] / 255, atol=1e-7)
    plt.close(fig)
    wide = rgb[:, :, :, 0].astype(np.int64)  # grey 0-255 pixels as numpy's default integers
    told = (
        r"^Expected images of a float dtype or uint8, got int64; convert them: 0-255 pixels "
        r"with images\.astype\(np\.uint8\) \(images\.astype\(np\.float32\) keeps 0-255, "
    )
    with pytest.raises(TypeError, match=told):
        plot_most_uncertain(preds, wide, k=1)
    fig = plot_most_uncertain(preds, wide.astype(np.uint8), k=1)  # as told
    np.testing.assert_allclose(fig.axes[0].get_images()[0].get_array(), wide[0] / 255, atol=1e-7)
    plt.close(fig)
    with pytest.raises(TypeError, match=r"got torch\.int64; convert them: 0-255 pixels with "
                       r"images\.to\(torch\.uint8\) \(images\.float\(\) keeps"):  # fmt: skip
        plot_most_uncertain(preds, torch.from_numpy(wide), k=1)


def test_rotate_says_what_to_pass_for_normalised_colour_images():
    x = _normalise(_raw())
    with pytest.raises(
        ValueError,
        match=r"^Expected mean= and std= for normalised RGB images: the default, MNIST's "
        r"normalisation, has one channel, not 3\. Pass the per-channel constants the images "
        r"were normalised with, e\.g\. mean=\(0\.4914, 0\.4822, 0\.4465\), std=\(0\.2470, "
        r"0\.2435, 0\.2616\) for CIFAR-10, or normalized=False for images in \[0, 1\]\.$",
    ):
        rotate(x, 30)
    with pytest.raises(ValueError, match="for normalised RGB images"):  # even at angle 0
        rotate(x, 0)
    with pytest.raises(ValueError, match=r"got mean= alone; pass std= too\.$"):
        rotate(x, 30, mean=MEAN)
    with pytest.raises(ValueError, match=r"Expected mean to hold 3 value\(s\), one per channel"):
        rotate(x, 30, mean=(0.5, 0.5), std=STD)
    with pytest.raises(ValueError, match=r"Expected each std to be a finite number > 0, got 0"):
        rotate(x, 30, mean=MEAN, std=(0.2, 0, 0.2))
    with pytest.raises(TypeError, match=r"Expected mean to be a number or a sequence .* got str"):
        rotate(x, 30, mean="cifar", std=STD)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Expected no mean= or std= with normalized=False"):
        rotate(x, 30, normalized=False, mean=MEAN, std=STD)
    # one number stands for every channel
    same = rotate(x, 30, mean=0.5, std=0.25)
    assert torch.equal(same, rotate(x, 30, mean=(0.5,) * 3, std=[0.25] * 3))


# ---------------------------------------------------------------------------------------------
# evaluate_rotations


def _colour_classifier():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(16, 3),
    )  # fmt: skip
    model = pyrouq.bayesian(net)
    return model, pyrouq.mean_field_guide(model, init_scale=0.1)


def test_evaluate_rotations_on_a_colour_classifier():
    model, guide = _colour_classifier()
    g = torch.Generator().manual_seed(1)
    raw = torch.rand(12, 3, 16, 16, generator=g)
    y = torch.randint(0, 3, (12,), generator=g)
    x = _normalise(raw)
    torch.manual_seed(5)
    rows = evaluate_rotations(
        model, x, y, guide, angles=[0, 45, 90], num_samples=4, mean=MEAN, std=STD, progress=False
    )
    assert [row["angle"] for row in rows] == [0.0, 45.0, 90.0]
    # every angle sees the draws of the first: the same as predicting each rotation alone
    for row, turned in zip(
        rows,
        [x, _normalise(rotate(raw, 45, normalized=False)), torch.rot90(x, 1, (-2, -1))],
        strict=True,
    ):
        torch.manual_seed(5)
        preds = pyrouq.predict(model, turned, guide, num_samples=4, progress=False)
        assert row["acc"] == pytest.approx(metrics.acc(preds, y), abs=1e-6)
        assert row["ece"] == pytest.approx(metrics.ece(preds, y), abs=1e-5)
        parts = preds.uncertainty("entropy")
        assert row["epistemic"] == pytest.approx(float(parts.epistemic.mean()), abs=1e-5)
        assert row["total"] == pytest.approx(float(parts.total.mean()), abs=1e-5)
    # images in [0, 1]: normalized=False
    raw_rows = evaluate_rotations(
        model, raw, y, guide, angles=[60], num_samples=2, normalized=False, progress=False
    )
    assert 0.0 <= raw_rows[0]["acc"] <= 1.0
    # normalised colour images without their constants: refused before any prediction
    with pytest.raises(ValueError, match=r"Expected mean= and std= for normalised RGB images"):
        evaluate_rotations(model, x, y, guide, angles=[0], progress=False)


# ---------------------------------------------------------------------------------------------
# plots


def _preds(n: int) -> Predictions:
    g = torch.Generator().manual_seed(2)
    return Predictions.from_probs(torch.softmax(torch.randn(3, n, 4, generator=g), -1))


def test_plot_image_grid_draws_colour_images_unnormalised_and_clipped():
    raw = torch.tensor([1.3, -0.2, 0.6]).view(1, 3, 1, 1).expand(1, 3, 8, 8)  # out of [0, 1]
    x = _normalise(raw)
    fig = plot_image_grid(_preds(1), x, rows=1, cols=1, mean=MEAN, std=STD)
    image = fig.axes[0].images[0]
    drawn = np.asarray(image.get_array())
    assert drawn.shape == (8, 8, 3)
    np.testing.assert_allclose(drawn[3, 4], [1.0, 0.0, 0.6], atol=1e-6)  # clipped to [0, 1]
    # the rendered pixel at the centre of the cell: (255, 0, 153)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())
    left, upper = 0.075, 0.9  # the cell's image, in inches (1.25 x 1.25)
    cx, cy = fig.axes[0].transData.transform((left + 0.625, upper + 0.625))
    r, g, b, _ = pixels[pixels.shape[0] - int(cy), int(cx)].astype(int)
    assert r == 255 and g == 0 and abs(b - 153) <= 1


def test_plot_most_uncertain_draws_colour_images_in_zero_one_as_they_are():
    raw = _raw(n=5, h=6, w=6)
    preds = _preds(5)
    fig = plot_most_uncertain(preds, raw, k=2, component="total")  # no negative pixel: raw
    order = torch.argsort(preds.uncertainty("entropy").total, descending=True)[:2].tolist()
    for row, i in enumerate(order):
        drawn = np.asarray(fig.axes[2 * row].images[0].get_array())
        np.testing.assert_array_equal(drawn, raw[i].permute(1, 2, 0).numpy())
    # uint8 colour pixels: / 255
    u8 = (raw * 255).to(torch.uint8)
    fig = plot_image_grid(preds, u8, rows=1, cols=2)
    drawn = np.asarray(fig.axes[0].images[1].get_array())
    np.testing.assert_array_equal(drawn, (u8[1].permute(1, 2, 0).float() / 255).numpy())


def test_plot_keeps_grey_images_as_they_were():
    x = (
        torch.rand(3, 1, 5, 5, generator=torch.Generator().manual_seed(4)) - MNIST_MEAN
    ) / MNIST_STD
    fig = plot_image_grid(_preds(3), x, rows=1, cols=3)
    image = fig.axes[0].images[2]
    assert image.get_cmap().name == "gray"
    expected = (x[2, 0] * MNIST_STD + MNIST_MEAN).clamp(0.0, 1.0).numpy()
    np.testing.assert_array_equal(np.asarray(image.get_array()), expected)


def test_plots_say_what_to_pass_for_normalised_colour_images():
    x = _normalise(_raw(n=3, h=5, w=5))
    preds = _preds(3)
    with pytest.raises(
        ValueError,
        match=r"^Expected mean= and std= for normalised RGB images \(some pixels are negative\): "
        r"the default, MNIST's normalisation, has one channel, not 3\. Pass .*mean=\(0\.4914",
    ):
        plot_image_grid(preds, x)
    with pytest.raises(ValueError, match=r"RGB images: the default, MNIST's normalisation"):
        plot_most_uncertain(preds, x.clamp(0, 1), normalized=True)
    with pytest.raises(ValueError, match=r"Expected std to hold 3 value\(s\), one per channel"):
        plot_most_uncertain(preds, x, mean=MEAN, std=STD[:2])
    # normalized=False: shown clipped, as grey images are
    fig = plot_image_grid(preds, x, rows=1, cols=1, normalized=False)
    drawn = np.asarray(fig.axes[0].images[0].get_array())
    np.testing.assert_array_equal(drawn, x[0].permute(1, 2, 0).clamp(0, 1).numpy())
