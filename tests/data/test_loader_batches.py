"""The batches of pyrouq's in-memory loaders (TensorLoader, ArrayLoader) bit for bit against a
reference written here with plain torch indexing: a seeded ``randperm`` per epoch (the loader's
own generator, epoch after epoch), rows picked by ``t[index]``, normalised by hand; the same
values, dtype, shape and strides, the last partial batch included, shuffled, unshuffled and
sharded (neither loader has a ``drop_last``)."""

from __future__ import annotations

import pytest
import torch

from pyrouq.data import MNIST_MEAN, MNIST_STD, TensorLoader, load_mnist
from pyrouq.tabular import ArrayLoader

N, BATCH = 1000, 128  # 7 full batches and one of 104


def _orders(n, seed, shuffle, epochs, world=1, rank=0):
    """Each epoch's indices as the loaders document them: a permutation drawn from a generator
    seeded once, padded with its first indices to a multiple of ``world``, every ``world``-th
    from ``rank``."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
        pad = -(-n // world) * world - n
        yield torch.cat([order, order[:pad]]).tolist()[rank::world]


def _same(got, want):
    assert got.dtype == want.dtype and got.device == want.device
    assert got.shape == want.shape and got.stride() == want.stride()
    assert torch.equal(got, want)


def _check(loader, x, y, prepare, seed, shuffle, epochs=2, world=1, rank=0):
    for order in _orders(len(y), seed, shuffle, epochs, world, rank):
        batches = list(loader)
        sizes = [len(order[s : s + BATCH]) for s in range(0, len(order), BATCH)]
        assert [len(b[1]) for b in batches] == sizes
        for (bx, by), start in zip(batches, range(0, len(order), BATCH), strict=True):
            index = torch.tensor(order[start : start + BATCH])
            _same(bx, prepare(x[index]))
            _same(by, y[index])


def _by_hand(flatten):
    def prepare(raw):
        x = (raw.to(torch.float32) / 255 - MNIST_MEAN) / MNIST_STD
        return x.reshape(len(x), -1) if flatten else x.unsqueeze(1)

    return prepare


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("flatten", [False, True])
def test_mnist_batches_are_the_reference_ones(shuffle, flatten):
    train, _ = load_mnist(batch_size=BATCH, seed=7, shuffle=shuffle, flatten=flatten, train_size=N)
    assert train.images.dtype == torch.uint8 and len(train) == 8
    _check(train, train.images, train.labels, _by_hand(flatten), 7, shuffle)


@pytest.mark.parametrize("shuffle", [True, False])
def test_sharded_mnist_batches_are_the_reference_ones(shuffle):
    train, _ = load_mnist(batch_size=BATCH, seed=3, shuffle=shuffle, train_size=N)
    with train.sharded(1, 3):  # 334 of 1000 each (2 padded), picked by a strided index
        assert len(train) == 3
        _check(train, train.images, train.labels, _by_hand(False), 3, shuffle, world=3, rank=1)


def test_float_and_transposed_images_are_served_as_indexed():
    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (N, 6, 5), generator=g).float()  # raw pixels as floats
    labels = torch.randint(0, 10, (N,), generator=g)
    for images in (raw, raw.transpose(1, 2)):  # a transposed view keeps its layout in a batch
        loader = TensorLoader(
            images, labels, BATCH, shuffle=True, flatten=False, normalize=True, seed=5
        )
        _check(loader, images, labels, _by_hand(False), 5, True)
    assert next(iter(loader))[0].stride() == (30, 5, 1, 5)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("shape", [(1, 28, 28), (784,)])
def test_array_batches_are_the_reference_ones(shuffle, shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, *shape, generator=g)
    for y in (torch.randint(0, 10, (N,), generator=g), torch.randn(N, 2, generator=g)):
        loader = ArrayLoader(x, y, BATCH, shuffle=shuffle, seed=11)
        _check(loader, x, y, lambda rows: rows, 11, shuffle)


def test_array_batches_keep_a_permuted_layout():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(N, 3, 4, 4, generator=g).contiguous(memory_format=torch.channels_last)
    y = torch.randn(N, 8, generator=g)[:, ::2]  # strided targets: batches contiguous, as y[i]
    loader = ArrayLoader(x, y, BATCH, shuffle=True, seed=4)
    _check(loader, x, y, lambda rows: rows, 4, True)
    bx, by = next(iter(loader))
    assert bx.is_contiguous(memory_format=torch.channels_last) and by.is_contiguous()
    loader = ArrayLoader(x, y, BATCH, shuffle=True, seed=4)  # (its first epoch again)
    with loader.sharded(0, 3):
        _check(loader, x, y, lambda rows: rows, 4, True, epochs=1, world=3, rank=0)


def test_the_loaders_reprs_show_the_same_settings_their_seed_too():
    """ArrayLoader's repr left out its seed (and named N otherwise) where TensorLoader's
    shows it: a drawn seed, kept as loader.seed to rebuild the same order, was not seen."""
    x, y = torch.zeros(10, 3), torch.zeros(10)
    assert repr(ArrayLoader(x, y, 4, shuffle=False, seed=12)) == (
        "ArrayLoader(num_examples=10, batch_size=4, shuffle=False, seed=12, device=cpu)"
    )
    drawn = ArrayLoader(x, y, 4)
    assert f"shuffle=True, seed={drawn.seed}, device=cpu)" in repr(drawn)
    images, labels = torch.zeros(10, 2, 2), torch.zeros(10, dtype=torch.long)
    tensors = TensorLoader(images, labels, 4, shuffle=False, flatten=False, normalize=False,
                           seed=12)  # fmt: skip
    assert repr(tensors) == (
        "TensorLoader(num_examples=10, batch_size=4, shuffle=False, seed=12, device=cpu)"
    )
