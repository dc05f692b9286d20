"""The data side against independent references: the raw IDX files parsed by numpy here, the
shipped gzip copies byte for byte, torchvision's rotate, numpy statistics and metrics by hand;
and the messages of the layouts and paths that the loaders refuse."""

from __future__ import annotations

import gzip
import itertools
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from torchvision.transforms import InterpolationMode

import pyrouq
from pyrouq.data import (
    MNIST_MEAN,
    MNIST_STD,
    TensorLoader,
    fashion_mnist_arrays,
    load_mnist,
    mnist_arrays,
    normalize,
)
from pyrouq.rotation import evaluate_rotations, rotate
from pyrouq.tabular import ArrayLoader, Standardizer, train_test_split

RAW = Path("/work/shared/data")
BUNDLED = Path(pyrouq.__file__).parent / "_data"
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
needs_raw = pytest.mark.skipif(not RAW.is_dir(), reason="the raw IDX files are not here")


def _idx(data: bytes) -> np.ndarray:
    """An unsigned-byte IDX file, parsed here with numpy alone."""
    ndim = data[3]
    assert data[2] == 0x08  # unsigned bytes
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _raw(folder: str, name: str) -> bytes:
    return (RAW / folder / "raw" / name).read_bytes()


def _loader(images, labels=None, **kw):
    labels = torch.zeros(len(images), dtype=torch.long) if labels is None else labels
    options = dict(shuffle=False, flatten=False, normalize=True, seed=0) | kw
    return TensorLoader(images, labels, 4, **options)


# --------------------------------------------------------------------------------------------
# Pixels, labels and the shipped copies
# --------------------------------------------------------------------------------------------


@needs_raw
@pytest.mark.parametrize("folder", ["MNIST", "FashionMNIST"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_arrays_equal_the_raw_idx_files(folder, split):
    arrays = mnist_arrays if folder == "MNIST" else fashion_mnist_arrays
    images, labels = arrays(split, root=RAW)
    ref_x, ref_y = (_idx(_raw(folder, name)) for name in FILES[split])
    assert ref_x.shape == ((60000 if split == "train" else 10000), 28, 28)
    assert images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert np.array_equal(images.numpy(), ref_x)
    assert np.array_equal(labels.numpy(), ref_y.astype(np.int64))
    assert sorted(np.unique(ref_y).tolist()) == list(range(10))


@needs_raw
def test_shipped_copies_equal_the_raw_files_byte_for_byte():
    shipped = sorted(BUNDLED.glob("*/raw/*.gz"))
    names = [f"{p.parent.parent.name}/{p.name}" for p in shipped]
    assert names == [
        "FashionMNIST/t10k-images-idx3-ubyte.gz",
        "FashionMNIST/t10k-labels-idx1-ubyte.gz",
        "MNIST/t10k-images-idx3-ubyte.gz",
        "MNIST/t10k-labels-idx1-ubyte.gz",
        "MNIST/train-images-idx3-ubyte.gz",
        "MNIST/train-labels-idx1-ubyte.gz",
    ]
    for path in shipped:
        assert gzip.decompress(path.read_bytes()) == _raw(path.parent.parent.name, path.stem)
    # and the default (bundled) arrays are those files
    x, y = fashion_mnist_arrays("test")
    assert np.array_equal(y.numpy(), _idx(_raw("FashionMNIST", FILES["test"][1])))
    assert np.array_equal(x[::997].numpy(), _idx(_raw("FashionMNIST", FILES["test"][0]))[::997])


@needs_raw
def test_normalisation_constants_are_those_of_the_training_pixels():
    pixels = _idx(_raw("MNIST", FILES["train"][0])).astype(np.float64) / 255
    assert round(pixels.mean(), 4) == MNIST_MEAN  # 0.13066...
    assert round(pixels.std(), 4) == MNIST_STD  # 0.30811...


@needs_raw
def test_seeded_loader_serves_the_reference_pixels_in_the_seeded_order():
    ref_x = _idx(_raw("MNIST", FILES["train"][0]))[:300].astype(np.float32)
    ref_y = _idx(_raw("MNIST", FILES["train"][1]))[:300].astype(np.int64)
    train, test = load_mnist(batch_size=128, root=RAW, seed=3, train_size=300)
    assert len(train) == 3 and len(train.dataset) == 300 and len(test.dataset) == 10000
    generator = torch.Generator().manual_seed(3)  # the loader's own generator, epoch by epoch
    for _ in range(2):
        order = torch.randperm(300, generator=generator).numpy()
        batches = list(train)
        assert [len(y) for _, y in batches] == [128, 128, 44]
        x = torch.cat([b for b, _ in batches])
        y = torch.cat([b for _, b in batches])
        assert x.shape == (300, 1, 28, 28) and x.dtype == torch.float32
        assert np.array_equal(y.numpy(), ref_y[order])
        expected = (ref_x[order] / 255 - 0.1307) / 0.3081
        np.testing.assert_allclose(x[:, 0].numpy(), expected, atol=1e-5)
    flat, _ = load_mnist(batch_size=50, root=RAW, train_size=60, shuffle=False, flatten=True,
                         normalize=False)  # fmt: skip
    x, y = next(iter(flat))
    np.testing.assert_allclose(x.numpy(), ref_x[:50].reshape(50, 784) / 255, atol=1e-7)
    assert np.array_equal(y.numpy(), ref_y[:50])


# --------------------------------------------------------------------------------------------
# Tabular helpers against numpy
# --------------------------------------------------------------------------------------------


def test_split_scaler_and_loader_against_numpy():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(23, 3, generator=g) * torch.tensor([1.0, 10.0, 0.1]) + 5
    y = torch.randn(23, generator=g) * 4 - 2
    tx, ty, vx, vy = train_test_split(x, y, test_fraction=0.3, seed=4)
    perm = torch.randperm(23, generator=torch.Generator().manual_seed(4))
    assert round(23 * 0.3) == 7
    assert torch.equal(vx, x[perm[:7]]) and torch.equal(tx, x[perm[7:]])
    assert torch.equal(vy, y[perm[:7]]) and torch.equal(ty, y[perm[7:]])
    scaler = Standardizer.fit(tx, ty)
    mean, std = tx.double().numpy().mean(0), tx.double().numpy().std(0, ddof=1)
    np.testing.assert_allclose(scaler.x_std.numpy(), std, rtol=1e-6)
    # the test rows use the training statistics: no leakage from the test split
    np.testing.assert_allclose(scaler.transform_x(vx).numpy(), (vx.numpy() - mean) / std,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    ny = ty.double().numpy()
    expected_y = (vy.numpy() - ny.mean()) / ny.std(ddof=1)
    np.testing.assert_allclose(scaler.transform_y(vy).numpy(), expected_y, rtol=1e-5, atol=1e-6)
    loader = ArrayLoader(tx, ty, batch_size=5, seed=7)
    generator = torch.Generator().manual_seed(7)
    for _ in range(2):
        batches = list(loader)
        assert [len(b) for _, b in batches] == [5, 5, 5, 1] and len(loader) == 4
        assert torch.equal(torch.cat([b for _, b in batches]),
                           ty[torch.randperm(16, generator=generator)])  # fmt: skip


# --------------------------------------------------------------------------------------------
# Rotation against torchvision
# --------------------------------------------------------------------------------------------


def _tv(images: torch.Tensor, angle: float) -> torch.Tensor:
    return TF.rotate(images, angle, interpolation=InterpolationMode.BILINEAR)


def test_rotate_matches_torchvision_raw_normalised_rgb_and_flat():
    raw = mnist_arrays("test")[0][:8].float().unsqueeze(1) / 255
    for angle in (15, 45, 90, 137.5, -60, 180, 400):
        assert (rotate(raw, angle, normalized=False) - _tv(raw, angle)).abs().max() < 1e-5
    # normalised: the black that rotates in is black in raw pixel space
    out = rotate((raw - 0.1307) / 0.3081, 33)
    assert (out - (_tv(raw, 33) - 0.1307) / 0.3081).abs().max() < 2e-5
    assert torch.isclose(out.min(), torch.tensor(-0.1307 / 0.3081))
    flat = rotate(raw.reshape(8, 784), 30, normalized=False)
    assert (flat - _tv(raw, 30).reshape(8, 784)).abs().max() < 1e-5
    rgb = torch.rand(2, 3, 12, 16, generator=torch.Generator().manual_seed(0))
    m, s = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    mt, st = torch.tensor(m).view(1, 3, 1, 1), torch.tensor(s).view(1, 3, 1, 1)
    for angle in (25, 90):
        out = rotate((rgb - mt) / st, angle, mean=m, std=s)
        assert (out - (_tv(rgb, angle) - mt) / st).abs().max() < 2e-5


def test_rotate_takes_constants_given_as_one_number_tensors():
    # it said "Expected mean to be a number ..., got Tensor tensor(0.1307)", and of a list of
    # 0-d tensors (images.mean((0, 2, 3)) unbound) "Expected each mean to be a finite number"
    x = normalize(mnist_arrays("test")[0][:4])
    expected = rotate(x, 30)
    out = rotate(x, 30, mean=torch.tensor(MNIST_MEAN), std=np.float64(MNIST_STD))
    assert torch.equal(out, expected)
    rgb = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    tensors = [torch.tensor(0.5)] * 3
    assert torch.equal(rotate(rgb, 20, mean=tensors, std=torch.tensor(0.5)),
                       rotate(rgb, 20, mean=(0.5,) * 3, std=0.5))  # fmt: skip
    with pytest.raises(ValueError, match=r"Expected each std to be a finite number > 0, got 0"):
        rotate(rgb, 20, mean=0.5, std=torch.tensor(0.0))


@pytest.mark.parametrize("given", [{"std": 10**400}, {"std": [0.5, 10**400, 0.5]},
                                   {"mean": 10**400}])  # fmt: skip
def test_rotate_refuses_an_int_too_large_for_a_float_as_a_constant(given):
    # it was Python's bare "OverflowError: int too large to convert to float"
    rgb = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    name = next(iter(given))
    need = "a finite number > 0" if name == "std" else "a finite number"
    with pytest.raises(
        ValueError, match=rf"Expected each {name} to be {need}, got about 10\*\*400"
    ):
        rotate(rgb, 20, **{"mean": 0.5, "std": 0.25, **given})


def test_evaluate_rotations_against_hand_computed_metrics():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    images, labels = mnist_arrays("test")
    x, y = normalize(images[:120]), labels[:120]
    rows = evaluate_rotations(net, x, y, angles=[0, 30, 90], progress=False)
    raw = x * 0.3081 + 0.1307
    for row, angle in zip(rows, (0, 30, 90), strict=True):
        with torch.no_grad():
            p = torch.softmax(net((_tv(raw, angle) - 0.1307) / 0.3081).double(), -1).numpy()
        conf, hit = p.max(1), (p.argmax(1) == y.numpy()).astype(float)
        ece = 0.0
        edges = np.linspace(0, 1, 16)
        for lo, hi in itertools.pairwise(edges):
            inside = (conf > lo) & (conf <= hi)
            if inside.any():
                ece += inside.mean() * abs(hit[inside].mean() - conf[inside].mean())
        assert row["angle"] == angle
        assert row["acc"] == pytest.approx(hit.mean(), abs=1e-12)
        assert row["ece"] == pytest.approx(ece, abs=1e-5)
        assert row["total"] == pytest.approx(-(p * np.log(p)).sum(1).mean(), abs=1e-5)
        assert row["epistemic"] == pytest.approx(0.0, abs=1e-6)  # one deterministic net


# --------------------------------------------------------------------------------------------
# Layouts refused, with the fix that suits them
# --------------------------------------------------------------------------------------------


def test_normalize_hints_fit_channels_last_and_colour_images():
    grey = mnist_arrays("test")[0][:2]
    # it said "for one image use images.unsqueeze(0)", which gives 5 dimensions
    with pytest.raises(ValueError, match=r"\(2, 28, 28, 1\); drop the channel dim of "
                       r"channels-last images: images\[\.\.\., 0\]"):  # fmt: skip
        normalize(grey.unsqueeze(-1))
    assert torch.equal(normalize(grey.unsqueeze(-1)[..., 0]), normalize(grey))
    with pytest.raises(ValueError, match=r"3 channels: the MNIST helpers take grey images; "
                       r"serve colour images .*pyrouq\.ArrayLoader"):  # fmt: skip
        normalize(grey.unsqueeze(1).expand(2, 3, 28, 28))


def test_normalize_refuses_one_channels_last_image_it_read_as_rows_of_images():
    images = mnist_arrays("test")[0][:3]
    grey = images[0]
    # (28, 28, 1) came back as 28 images of 28 x 1 pixels, (1, 28, 28, 1) after a reshape
    with pytest.raises(ValueError, match=r"got shape \(28, 28, 1\), which would be 28 images of "
                       r"28 x 1 pixels; one channels-last grey image \(H, W, 1\)\? pass "
                       r"images\[\.\.\., 0\]\.unsqueeze\(0\)\.$"):  # fmt: skip
        normalize(grey.unsqueeze(-1))
    assert torch.equal(normalize(grey.unsqueeze(-1)[..., 0].unsqueeze(0)), normalize(grey[None]))
    with pytest.raises(ValueError, match=r"one channels-last image of 3 channels \(H, W, C\)\? "
                       r".*images\.permute\(2, 0, 1\)\.unsqueeze\(0\)"):  # fmt: skip
        normalize(grey.unsqueeze(-1).expand(28, 28, 3))
    with pytest.raises(ValueError, match=r"one channels-last image of 4 channels \(H, W, C\)\? "):
        normalize(grey.unsqueeze(-1).expand(28, 28, 4))  # (RGBA)
    with pytest.raises(ValueError, match=r"got shape \(8, 8, 1\), which would be 8 images of 8 "):
        normalize(torch.zeros(8, 8, 1, dtype=torch.uint8))  # the smallest refused
    assert normalize(images).shape == (3, 1, 28, 28)  # three images, (N, H, W), as before
    # a batch of tall thin images, N != H, is a batch, as before the refusal
    thin = torch.randint(0, 256, (5, 8, 4), dtype=torch.uint8)
    expected = (thin.float() / 255 - MNIST_MEAN) / MNIST_STD
    assert torch.allclose(normalize(thin).reshape(5, 8, 4), expected, atol=1e-6)
    assert normalize(torch.zeros(3, 32, 2, dtype=torch.uint8)).shape == (3, 1, 32, 2)
    # and a batch of more images than rows, N > H (only N == H is one image's rows)
    assert normalize(torch.zeros(32, 8, 4, dtype=torch.uint8)).shape == (32, 1, 8, 4)


def test_tensor_loader_hints_fit_the_layout():
    images = torch.zeros(5, 28, 28, dtype=torch.uint8)
    # it said "drop the channel dim: images[:, 0]", which keeps the first row of each
    # channels-last image, and the red channel alone of an RGB one
    with pytest.raises(ValueError, match=r"\(drop the channel dim of channels-last images: "
                       r"images\[\.\.\., 0\]\)"):  # fmt: skip
        _loader(images.unsqueeze(-1))
    with pytest.raises(ValueError, match=r"\(3 channels: the MNIST helpers take grey images; "
                       r".*permuted first, images\.permute\(0, 3, 1, 2\)\)"):  # fmt: skip
        _loader(images.unsqueeze(-1).expand(5, 28, 28, 3))
    with pytest.raises(ValueError, match=r"\(3 channels: .*x of shape \(N, C, H, W\)\)\.$"):
        _loader(images.unsqueeze(1).expand(5, 3, 28, 28))
    with pytest.raises(ValueError, match=r"\(drop the channel dim: images\[:, 0\]\)"):
        _loader(images.unsqueeze(1))
    assert len(list(_loader(images.reshape(5, 784), flatten=True))) == 2


# --------------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------------


@needs_raw
def test_root_naming_a_file_says_which_folder_to_pass():
    label_file = RAW / "MNIST" / "raw" / FILES["test"][1]
    with pytest.raises(FileNotFoundError, match="To fix: root= names a file, not a folder: "
                       f"pass the folder that holds MNIST/, '{RAW}'"):  # fmt: skip
        mnist_arrays("test", root=label_file)


def test_root_that_does_not_exist_is_named_so(tmp_path):
    message = r"nowhere\)\. That folder does not exist\. To fix: pass a root= in torchvision"
    with pytest.raises(FileNotFoundError, match=r"\(looked under root=: .*" + message):
        load_mnist(root=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"nowhere\)\. To fix"):  # it exists now
        (tmp_path / "nowhere").mkdir()
        load_mnist(root=tmp_path / "nowhere")


def test_files_rewritten_with_their_mtime_restored_are_read_again(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in FILES["test"]:
        shutil.copyfile(BUNDLED / "MNIST" / "raw" / f"{name}.gz", raw / f"{name}.gz")
    labels_path = raw / f"{FILES['test'][1]}.gz"
    before = mnist_arrays("test", root=tmp_path)[1]
    assert before[:3].tolist() == [7, 2, 1]
    data = bytearray(gzip.decompress(labels_path.read_bytes()))
    data[8:11] = bytes([3, 3, 3])  # the first three labels
    stat = labels_path.stat()
    labels_path.write_bytes(gzip.compress(bytes(data)))
    os.utime(labels_path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as cp -p leaves it
    assert mnist_arrays("test", root=tmp_path)[1][:4].tolist() == [3, 3, 3, 0]
