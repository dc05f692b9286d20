"""Audit of rotate() in float16 / bfloat16, of the flags of rotate, evaluate_rotations,
normalize and the loaders (a string or None taken as true or false), and of the rotation
figures against torchvision and a hand computation."""

from __future__ import annotations

import numpy as np
import pyro
import pytest
import torch

import pyrouq
import pyrouq._idx
from pyrouq.data import load_mnist, mnist_arrays, normalize
from pyrouq.rotation import evaluate_rotations, rotate


def _normalised_test_images(n: int) -> torch.Tensor:
    return normalize(mnist_arrays("test")[0][:n])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rotate_in_reduced_precision_is_as_exact_as_the_dtype_allows(dtype):
    x = _normalised_test_images(20).to(dtype)
    ours = rotate(x, 30)
    assert ours.dtype == dtype and ours.shape == x.shape
    # the same inputs rotated in float64, then rounded to the dtype once
    best = rotate(x.double(), 30).to(dtype)
    # the grid used to be built in the dtype itself: max errors 0.072 (float16) and 0.47
    # (bfloat16) on values in [-0.42, 2.82], 70 times the dtype's rounding
    error = (ours.double() - best.double()).abs().max().item()
    assert error <= 2 * torch.finfo(dtype).eps, error
    # non-square images take the same path
    wide = torch.rand(3, 1, 10, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    error = (
        (
            rotate(wide, -47.5, normalized=False).double()
            - rotate(wide.double(), -47.5, normalized=False).to(dtype).double()
        )
        .abs()
        .max()
    )
    assert error.item() <= 2 * torch.finfo(dtype).eps


@pytest.mark.parametrize("angle", [-47.5, 0.25, 90, 200.0, 405])
def test_rotate_matches_torchvision_on_non_square_images(angle):
    tvf = pytest.importorskip("torchvision.transforms.functional")
    from torchvision.transforms import InterpolationMode

    x = torch.rand(2, 1, 9, 14, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = tvf.rotate(x, angle, interpolation=InterpolationMode.BILINEAR)
    torch.testing.assert_close(rotate(x, angle, normalized=False), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("value", [None, "no", 0, 1.0])
def test_rotate_refuses_a_normalized_that_is_not_a_bool(value):
    x = _normalised_test_images(2)
    # None rotated in a raw black (0.0) into normalised images, "no" a normalised black
    with pytest.raises(TypeError, match=r"Expected normalized to be True or False, got"):
        rotate(x, 30, normalized=value)


def test_evaluate_rotations_refuses_non_bool_flags_before_predicting():
    model = pyrouq.MLP()
    x, y = _normalised_test_images(4), torch.arange(4)
    with pytest.raises(TypeError, match=r"Expected normalized to be True or False, got 'no'"):
        evaluate_rotations(model, x, y, angles=[0, 30], normalized="no", progress=False)
    with pytest.raises(TypeError, match=r"Expected progress to be True or False, got 'no'"):
        evaluate_rotations(model, x, y, angles=[0, 30], progress="no")


def test_evaluate_rotations_rows_recomputed_by_hand():
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP()
    guide = pyrouq.mean_field_guide(model)
    images, labels = mnist_arrays("test")
    x, y = normalize(images[:40]), labels[:40]
    angles = [30, 0, -12.5]
    pyro.set_rng_seed(3)
    rows = evaluate_rotations(
        model, x, y, guide, angles=angles, num_samples=4, batch_size=16, progress=False
    )
    after = torch.get_rng_state()
    pyro.set_rng_seed(3)
    state = torch.get_rng_state()
    for angle, row in zip(angles, rows, strict=True):
        torch.set_rng_state(state)  # every angle sees the same draws
        preds = pyrouq.predict(
            model, rotate(x, angle), guide, num_samples=4, batch_size=16, progress=False
        )
        p = preds.probs.double().numpy()  # (S, N, C)
        pbar, targets = p.mean(0), y.numpy()
        conf, correct = pbar.max(1), pbar.argmax(1) == targets
        bins = np.clip(np.floor(conf * 15).astype(int), 0, 14)
        ece = sum(
            (bins == b).mean() * abs(correct[bins == b].mean() - conf[bins == b].mean())
            for b in range(15)
            if (bins == b).any()
        )
        total = -(pbar * np.log(pbar)).sum(1)
        aleatoric = -(p * np.log(p)).sum(2).mean(0)
        assert row["angle"] == float(angle)
        assert row["acc"] == pytest.approx(correct.mean(), abs=1e-12)
        assert row["ece"] == pytest.approx(ece, abs=1e-12)
        assert row["total"] == pytest.approx(total.mean(), abs=1e-10)
        assert row["epistemic"] == pytest.approx((total - aleatoric).mean(), abs=1e-10)
    assert torch.equal(torch.get_rng_state(), after)  # advanced as after one predict()


@pytest.mark.parametrize("value", ["no", None, 0])
def test_normalize_refuses_a_flatten_that_is_not_a_bool(value):
    images = torch.zeros(2, 28, 28, dtype=torch.uint8)
    # "no" used to flatten to (2, 784), None not to
    with pytest.raises(TypeError, match=r"Expected flatten to be True or False, got"):
        normalize(images, flatten=value)


def test_normalize_of_channel_images_says_to_drop_the_channel():
    images = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
    # it said "for one image use images.unsqueeze(0)", which gives 5 dimensions
    with pytest.raises(
        ValueError,
        match=r"got shape \(2, 1, 28, 28\); drop the channel dim: "
        r"images\[:, 0\]",
    ):
        normalize(images)
    with pytest.raises(ValueError, match=r"for one image use images\.unsqueeze\(0\)"):
        normalize(torch.zeros(28, 28, dtype=torch.uint8))


@pytest.mark.parametrize("value", ["False", "no", 1])
def test_load_mnist_refuses_a_download_that_is_not_a_bool(tmp_path, monkeypatch, value):
    def no_network(folder, root):  # pragma: no cover - reached only without the check
        raise AssertionError(f"download={value!r} went to the network")

    monkeypatch.setattr(pyrouq._idx, "_download", no_network)
    with pytest.raises(TypeError, match=r"Expected download to be True or False, got"):
        load_mnist(root=tmp_path, download=value)
    with pytest.raises(TypeError, match=r"Expected download to be True or False, got"):
        pyrouq.load_fashion_mnist(root=tmp_path, download=value)
