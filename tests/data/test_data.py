from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest
import torch

from pyrouq.data import (
    DataError,
    TensorLoader,
    fashion_mnist_arrays,
    load_fashion_mnist,
    load_mnist,
    mnist_arrays,
    ood_loader,
)

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_mnist_sizes_label_counts_and_mean_pixel():
    train_x, train_y = mnist_arrays("train")
    test_x, test_y = mnist_arrays("test")
    assert train_x.shape == (60000, 28, 28) and train_x.dtype == torch.uint8
    assert test_x.shape == (10000, 28, 28)
    assert train_y.dtype == torch.int64
    assert train_y.bincount(minlength=10).tolist() == MNIST_TRAIN_COUNTS
    assert test_y.bincount(minlength=10).tolist() == MNIST_TEST_COUNTS
    assert train_x.double().mean().item() == pytest.approx(33.318, abs=5e-4)


def test_fashion_mnist_test_is_bundled_and_balanced():
    images, labels = fashion_mnist_arrays("test")
    assert images.shape == (10000, 28, 28)
    assert labels.bincount(minlength=10).tolist() == [1000] * 10
    loader = ood_loader(batch_size=1000)
    x, _ = next(iter(loader))
    assert x.shape == (1000, 1, 28, 28)


def test_bundled_copy_equals_shared_raw_files(shared_data):
    for split in ("train", "test"):
        a_x, a_y = mnist_arrays(split)
        b_x, b_y = mnist_arrays(split, root=shared_data)
        assert torch.equal(a_x, b_x) and torch.equal(a_y, b_y)
    a_x, a_y = fashion_mnist_arrays("test")
    b_x, b_y = fashion_mnist_arrays("test", root=shared_data)
    assert torch.equal(a_x, b_x) and torch.equal(a_y, b_y)


def test_shared_root_serves_fashion_train(shared_data):
    train, test = load_fashion_mnist(batch_size=500, root=shared_data, seed=0)
    assert len(train.dataset) == 60000 and len(test.dataset) == 10000


def test_loader_shapes_normalisation_and_flatten():
    _, test = load_mnist(batch_size=1000, seed=0, shuffle=False)
    x, y = next(iter(test))
    assert x.shape == (1000, 1, 28, 28) and x.dtype == torch.float32
    raw, labels = mnist_arrays("test")
    expected = (raw[:1000].float() / 255 - 0.1307) / 0.3081
    torch.testing.assert_close(x[:, 0], expected)
    assert torch.equal(y, labels[:1000])
    flat, _ = load_mnist(batch_size=10, flatten=True, normalize=False, train_size=25)
    batches = list(flat)
    assert [b[0].shape for b in batches] == [(10, 784), (10, 784), (5, 784)]
    assert 0.0 <= batches[0][0].min() and batches[0][0].max() <= 1.0
    assert len(flat) == 3 and len(flat.dataset) == 25


def test_dataset_item_matches_batch():
    train, _ = load_mnist(batch_size=4, shuffle=False, train_size=4)
    x, y = next(iter(train))
    item_x, item_y = train.dataset[2]
    torch.testing.assert_close(item_x, x[2])
    assert item_y == y[2]


def test_dataset_takes_negative_indices_and_refuses_out_of_range():
    train, _ = load_mnist(batch_size=4, shuffle=False, train_size=4)
    torch.testing.assert_close(train.dataset[-1][0], train.dataset[3][0])
    with pytest.raises(IndexError, match="index 4 is out of range for a data set of 4"):
        train.dataset[4]
    assert len(list(train.dataset)) == 4  # iteration stops at the end


def test_changing_a_loaders_tensors_changes_no_other_loader():
    _, test = load_mnist()
    before = mnist_arrays("test")[0][:5].clone()
    test.images[:5] = 0
    test.labels[:5] = 3
    _, again = load_mnist()
    assert torch.equal(again.images[:5], before) and torch.equal(
        mnist_arrays("test")[0][:5], before
    )
    assert not torch.equal(again.labels[:5], torch.full((5,), 3))
    ood = ood_loader()
    ood.images[:1] = 0
    assert ood_loader().images[0].any()
    small, _ = load_mnist(train_size=64)  # a copy of the subset, not of the whole split
    assert small.images.untyped_storage().nbytes() == 64 * 28 * 28


def test_float_images_are_not_changed_in_place():
    images = torch.full((4, 28, 28), 255.0)
    loader = TensorLoader(
        images, torch.arange(4), 2, shuffle=False, flatten=False, normalize=True, seed=0
    )
    first, second = [x for x, _ in loader], [x for x, _ in loader]
    assert torch.equal(images, torch.full((4, 28, 28), 255.0))
    torch.testing.assert_close(torch.cat(first), torch.cat(second))
    assert loader.seed == 0 and 0 <= TensorLoader(images, torch.arange(4), 2, shuffle=True,
                                                  flatten=True, normalize=False,
                                                  seed=None).seed < 2**32  # fmt: skip


def _order(loader):
    return torch.cat([y for _, y in loader])


def test_same_seed_same_order_different_seed_different_order():
    a, _ = load_mnist(batch_size=1000, seed=1, train_size=5000)
    b, _ = load_mnist(batch_size=1000, seed=1, train_size=5000)
    c, _ = load_mnist(batch_size=1000, seed=2, train_size=5000)
    first_a, first_b, first_c = _order(a), _order(b), _order(c)
    assert torch.equal(first_a, first_b)
    assert not torch.equal(first_a, first_c)
    # the next epoch reshuffles, reproducibly
    second_a, second_b = _order(a), _order(b)
    assert torch.equal(second_a, second_b) and not torch.equal(first_a, second_a)
    # every example once per epoch
    assert torch.equal(first_a.sort().values, mnist_arrays("train")[1][:5000].sort().values)


def _fake_root(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    return raw


def _write_idx(path, magic, dims, payload, compress=False):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    data = header + payload
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def _write_split(raw, n_images=3, n_labels=3, image_magic=0x803, truncate=0, compress=False):
    payload = bytes(n_images * 28 * 28)
    _write_idx(
        raw / "t10k-images-idx3-ubyte",
        image_magic,
        [n_images, 28, 28],
        payload[: len(payload) - truncate],
        compress,
    )
    _write_idx(raw / "t10k-labels-idx1-ubyte", 0x801, [n_labels], bytes(range(n_labels)), compress)


def test_reads_uncompressed_and_gzip_roots(tmp_path):
    raw = _fake_root(tmp_path / "plain")
    _write_split(raw)
    images, labels = mnist_arrays("test", root=tmp_path / "plain")
    assert images.shape == (3, 28, 28) and labels.tolist() == [0, 1, 2]
    raw = _fake_root(tmp_path / "gz")
    _write_split(raw, compress=True)
    images, labels = mnist_arrays("test", root=tmp_path / "gz")
    assert images.shape == (3, 28, 28) and labels.tolist() == [0, 1, 2]


def test_missing_file_names_path_and_fix(tmp_path, monkeypatch):
    """Also: $PYROUQ_DATA points the loaders elsewhere than the bundled copy."""
    with pytest.raises(FileNotFoundError, match=r"MNIST test file not found: expected .*t10k-im"):
        mnist_arrays("test", root=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"\[\.gz\]\) or leave root=None to use the "
                       r"bundled copy\.$"):  # fmt: skip
        mnist_arrays("test", root=tmp_path)  # it has no download= to offer
    with pytest.raises(FileNotFoundError, match="download=True"):
        load_mnist(root=tmp_path)
    monkeypatch.setenv("PYROUQ_DATA", str(tmp_path))  # the folder named by the environment
    with pytest.raises(FileNotFoundError, match=r"\(looked under \$PYROUQ_DATA: .*\) or unset "
                       r"\$PYROUQ_DATA to use the bundled copy\.$"):  # fmt: skip
        mnist_arrays("test")


def test_a_tensor_loader_refuses_labels_that_do_not_match_the_images():
    from pyrouq.data import TensorLoader

    kw = dict(shuffle=False, flatten=True, normalize=False, seed=0)
    with pytest.raises(ValueError, match=r"expected images \(N, H, W\) \(or rows \(N, D\) with "
                       r"flatten=True\) and labels \(N,\), one label per image, got shapes "
                       r"\(10, 28, 28\) and \(5,\)\.$"):  # fmt: skip
        TensorLoader(torch.zeros(10, 28, 28, dtype=torch.uint8), torch.zeros(5).long(), 4, **kw)
    with pytest.raises(ValueError, match=r"got shapes \(10, 1, 28, 28\) and \(10,\) \(drop the "
                       r"channel dim: images\[:, 0\]\)"):  # fmt: skip
        TensorLoader(torch.zeros(10, 1, 28, 28), torch.zeros(10).long(), 4, **kw)
    rows = TensorLoader(torch.zeros(10, 784), torch.zeros(10).long(), 4, **kw)  # flat rows
    assert next(iter(rows))[0].shape == (4, 784)
    with pytest.raises(ValueError, match=r"got shapes \(10, 784\) and \(10,\)\.$"):
        TensorLoader(torch.zeros(10, 784), torch.zeros(10).long(), 4, **{**kw, "flatten": False})
    with pytest.raises(TypeError, match=r"expected images as a torch.Tensor, got ndarray; "
                       r"convert an array with torch.from_numpy\(images\)"):  # fmt: skip
        TensorLoader(np.zeros((10, 28, 28), np.uint8), torch.zeros(10).long(), 4, **kw)


def test_fashion_train_is_not_bundled_and_says_so():
    with pytest.raises(FileNotFoundError, match=r"FashionMNIST train file not found: expected "
                       r".*train-images-idx3-ubyte.*To fix: pyrouq bundles only MNIST and the "
                       r"Fashion-MNIST test split; for the FashionMNIST train split pass root= "
                       r"\(or set \$PYROUQ_DATA\)"):  # fmt: skip
        load_fashion_mnist()
    with pytest.raises(FileNotFoundError, match=r"\(<root>/FashionMNIST/raw/\.\.\.\); download="
                       r"True downloads into that root, never into the package\.$"):  # fmt: skip
        load_fashion_mnist(download=True)  # no root: nothing to download into


def test_wrong_magic_number(tmp_path):
    _write_split(_fake_root(tmp_path), image_magic=0x801)
    with pytest.raises(
        DataError,
        match=r"t10k-images-idx3-ubyte is not an IDX images file: expected magic "
        r"number 0x00000803, got 0x00000801\. Check that the path points at the MNIST images",
    ):
        mnist_arrays("test", root=tmp_path)


def test_truncated_file(tmp_path):
    _write_split(_fake_root(tmp_path), truncate=100)
    msg = r"shape \(3, 28, 28\) \(2368 bytes in all\) but the file holds 2268 bytes"
    with pytest.raises(DataError, match=msg):
        mnist_arrays("test", root=tmp_path)


def test_truncated_gzip_stream(tmp_path):
    raw = _fake_root(tmp_path)
    src = "pyrouq/_data/MNIST/raw/t10k-labels-idx1-ubyte.gz"
    from pathlib import Path

    blob = (Path(__file__).resolve().parents[2] / src).read_bytes()
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(blob[: len(blob) // 2])
    shutil.copy(
        Path(__file__).resolve().parents[2] / "pyrouq/_data/MNIST/raw/t10k-images-idx3-ubyte.gz",
        raw,
    )
    with pytest.raises(DataError, match=r"Could not read .*t10k-labels-idx1-ubyte\.gz: .*"
                       r"The file is corrupt or truncated; delete it and copy or download it "
                       r"again"):  # fmt: skip
        mnist_arrays("test", root=tmp_path)


def test_label_count_mismatch(tmp_path):
    _write_split(_fake_root(tmp_path), n_images=3, n_labels=2)
    with pytest.raises(
        DataError,
        match=r"MNIST test: 3 images in .* but 2 labels in .*; the "
        r"two files must hold the same number of examples.*copy both again",
    ):
        mnist_arrays("test", root=tmp_path)


def test_labels_outside_0_to_9_are_a_data_error(tmp_path):
    _write_split(_fake_root(tmp_path), n_images=12, n_labels=12)  # labels 0..11
    with pytest.raises(
        DataError,
        match=r"t10k-labels-idx1-ubyte holds labels from 0 to 11; MNIST and Fashion-MNIST "
        r"labels are 0 to 9\. It is not a labels file of either data set: copy it again\.$",
    ):
        mnist_arrays("test", root=tmp_path)


def test_unknown_split():
    with pytest.raises(ValueError, match=r"Unknown split 'valid': expected 'train' or 'test'"):
        mnist_arrays("valid")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, 2.5, None])
def test_non_positive_batch_size(bad):
    with pytest.raises(
        ValueError, match=f"Expected batch_size to be a positive integer, got {bad}"
    ):
        load_mnist(batch_size=bad)


def test_bad_train_size():
    with pytest.raises(ValueError, match=r"train_size to be an integer in \[1, 60000\], got 0"):
        load_mnist(train_size=0)
