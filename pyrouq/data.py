"""MNIST and Fashion-MNIST, offline first.

The package ships gzip-compressed IDX copies of MNIST (train and test) and of the Fashion-MNIST
test split (the out-of-distribution set), so nothing downloads by default. ``root=`` or the
``$PYROUQ_DATA`` environment variable point elsewhere; a torchvision layout
(``<root>/MNIST/raw/train-images-idx3-ubyte[.gz]``) is read as is, so a folder that torchvision
downloaded works unchanged.

Loaders keep the whole split in memory as one ``uint8`` tensor (on ``device``) and serve batches
as slices of a shuffled index: no per-item PIL conversion, no worker processes. Normalisation
(``(x / 255 - 0.1307) / 0.3081``, the usual MNIST mean and standard deviation) is applied per
batch and is on by default.

Example
-------
>>> from pyrouq.data import load_mnist
>>> train, test = load_mnist(batch_size=512, seed=0)
>>> x, y = next(iter(train))
>>> tuple(x.shape), tuple(y.shape), x.dtype, y.dtype
((512, 1, 28, 28), (512,), torch.float32, torch.int64)
>>> len(train.dataset), len(test.dataset)
(60000, 10000)
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from pyrouq._arguments import check_device, set_generator_state
from pyrouq._idx import DataError, _arrays
from pyrouq._numbers import is_integer, tensor_hint
from pyrouq._util import MAX_SEED, ShardedOrder, check_flag, check_int, check_seed
from pyrouq._words import DATASET_WORDS, close_hint

__all__ = [
    "MNIST_MEAN",
    "MNIST_STD",
    "NORMALIZED_BLACK",
    "DataError",
    "TensorLoader",
    "fashion_mnist_arrays",
    "load_fashion_mnist",
    "load_mnist",
    "mnist_arrays",
    "normalize",
    "ood_loader",
]

MNIST_MEAN = 0.1307
"""Mean pixel intensity of the MNIST training images, on the [0, 1] scale."""
MNIST_STD = 0.3081
"""Standard deviation of the MNIST training pixels, on the [0, 1] scale."""

Split = Literal["train", "test"]


def _own_copy(t: torch.Tensor, device: str | torch.device | None) -> torch.Tensor:
    """A loader's own copy of a cached array (on ``device``): changing it changes no other."""
    return t.to(device, copy=True) if device is not None else t.clone()


def mnist_arrays(
    split: Split = "train", root: str | os.PathLike[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw MNIST arrays.

    Parameters
    ----------
    split : {"train", "test"}
        Which split.
    root : path, optional
        Folder in torchvision layout (``<root>/MNIST/raw/...``); default ``$PYROUQ_DATA`` or the
        bundled copy. An empty or blank string is refused, as a blank ``$PYROUQ_DATA`` is
        (pathlib reads ``""`` as the current folder: pass ``"."`` for that).

    Returns
    -------
    images : torch.Tensor
        ``uint8`` of shape ``(N, 28, 28)`` (N = 60000 for train, 10000 for test).
    labels : torch.Tensor
        ``int64`` of shape ``(N,)`` with values in ``[0, 10)``.

    Examples
    --------
    >>> images, labels = mnist_arrays("test")
    >>> tuple(images.shape), images.dtype, labels[:5].tolist()
    ((10000, 28, 28), torch.uint8, [7, 2, 1, 0, 4])
    """
    images, labels = _arrays("MNIST", split, root)
    return images.clone(), labels.clone()  # the caller's own: the cache stays as read


def fashion_mnist_arrays(
    split: Split = "test", root: str | os.PathLike[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw Fashion-MNIST arrays (``uint8`` images ``(N, 28, 28)``, ``int64`` labels).

    Only the test split is bundled; the train split needs a ``root`` that has it.
    """
    images, labels = _arrays("FashionMNIST", split, root)
    return images.clone(), labels.clone()


def normalize(images: torch.Tensor, *, flatten: bool = False) -> torch.Tensor:
    """Raw 0-255 images as the loaders give them to a network: float32, scaled to [0, 1], then
    standardised with the MNIST training mean and std (:data:`MNIST_MEAN`,
    :data:`MNIST_STD`, used for Fashion-MNIST as well).

    Parameters
    ----------
    images : torch.Tensor
        ``(N, H, W)`` integer pixels in [0, 255], e.g. from :func:`mnist_arrays`. One square
        channels-last image ``(H, H, C)`` (C <= 4, H >= 8) is refused with the fix, not read
        as H images of H x C pixels; a non-square one, ``(H, W, C)`` with H != W, cannot be
        told from a batch of H tall thin images and is read as such.
    flatten : bool, default False
        Return ``(N, H * W)`` (for an MLP) instead of ``(N, 1, H, W)`` (for a CNN).

    Examples
    --------
    >>> x = normalize(torch.zeros(2, 28, 28, dtype=torch.uint8))
    >>> x.shape, round(x[0, 0, 0, 0].item(), 4) == round(NORMALIZED_BLACK, 4)
    (torch.Size([2, 1, 28, 28]), True)
    """
    if not isinstance(images, torch.Tensor):
        raise TypeError(
            f"Expected images to be a torch.Tensor, got {type(images).__name__}; wrap them "
            "with torch.as_tensor(...)."
        )
    if images.is_floating_point() or images.is_complex() or images.dtype == torch.bool:
        told = ": these images look normalised already; pass them to the network as they are"
        values = images.is_floating_point() and not images.is_meta and images.numel()
        if values and bool(images.isfinite().all()):  # (meta: no values to read)
            low_f, high_f = images.min().item(), images.max().item()
            if 0 <= low_f and 1 < high_f <= 255:  # (told to pass them as they are: 0-255 inputs)
                told = (
                    f" with values in [{low_f:.4g}, {high_f:.4g}], raw pixels held as floats; "
                    "pass images.round().to(torch.uint8)"
                )
        raise TypeError(
            f"Expected raw integer pixels in [0, 255] (e.g. uint8), got dtype {images.dtype}{told}."
        )
    flatten = check_flag("flatten", flatten)  # a string such as "no" would flatten
    if images.dim() != 3 or images.shape[0] == 0:
        fix = _layout_fix(images.shape) or _batch_fix(images.shape)
        raise ValueError(
            f"Expected images of shape (N, H, W) with N >= 1, got shape {tuple(images.shape)}; "
            f"{fix}."
        )
    # one square (H, W, C) image, read as H images of W x C pixels; tall thin images such as
    # (5, 8, 4) are a batch, as before
    if images.shape[2] <= 4 and images.shape[0] == images.shape[1] >= 8:
        raise ValueError(
            f"Expected images of shape (N, H, W), got shape {tuple(images.shape)}, which would "
            f"be {images.shape[0]} images of {images.shape[1]} x {images.shape[2]} pixels; "
            f"{_one_image_fix(images.shape[2])}."
        )
    low, high = int(images.min()), int(images.max())
    if low < 0 or high > 255:
        raise ValueError(
            f"Expected pixel values in [0, 255], got values in [{low}, {high}]. Clip or "
            "rescale them to 8-bit pixels first."
        )
    return _Transform(flatten=flatten, normalize=True)(images)


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Transform:
    flatten: bool
    normalize: bool

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(torch.float32)  # the images themselves if float32: leave them alone
        x = x / 255.0 if x is images else x.div_(255.0)
        if self.normalize:
            x = x.sub_(MNIST_MEAN).div_(MNIST_STD)
        if self.flatten:
            return x.reshape(x.shape[0], -1)
        return x.unsqueeze(1)


class _TensorDataset(torch.utils.data.Dataset):
    """Map-style view of an in-memory split, with the loader's transform applied per item."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: _Transform):
        self.images = images
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self)
        try:
            index = operator.index(index)  # an int, numpy's or a one-element integer tensor
        except TypeError:  # a list, slice or float met "'<=' not supported between ..."
            raise TypeError(
                f"expected an integer index into a data set of {n} examples, got "
                f"{type(index).__name__} {index!r:.60}. Read one example at a time "
                "(dataset[i]), or iterate the loader for batches."
            ) from None
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a data set of {n} examples")
        index %= n
        return self.transform(self.images[index : index + 1])[0], self.labels[index]


class TensorLoader(ShardedOrder):
    """Batches of an in-memory split, served as slices of a (shuffled) index.

    ``images`` are raw pixel values in 0-255, ``(N, H, W)``, N >= 1 (the uint8 arrays of
    :func:`mnist_arrays`; or rows ``(N, D)`` with ``flatten=True``): every value is divided by
    255, floats too, so pass images already in [0, 1] as ``images * 255`` (or train on them
    with :class:`~pyrouq.ArrayLoader`); float images with values all within [0, 1] (binary
    ``{0, 1}`` ones too; all 0 aside) are refused as such, and so are finite values outside
    [0, 255] (images normalised already); NaN and inf are left to :func:`~pyrouq.fit`, which
    refuses them before training, naming the examples. ``images`` and ``labels`` must be on
    one device. Iterating yields ``(x, y)`` with ``x`` float32 of shape ``(B, 1, H, W)`` (or
    ``(B, H * W)`` with ``flatten=True``) and ``y`` of shape ``(B,)``, in the dtype of
    ``labels`` (int64 from :func:`mnist_arrays`; :func:`~pyrouq.fit` refuses floats); the
    last batch may be smaller. Each new iteration draws a new order from the loader's own
    generator, so a seed fixes the order of every epoch and leaves torch's global RNG alone.

    Attributes
    ----------
    dataset : torch.utils.data.Dataset
        ``len(loader.dataset)`` is the number of examples N (what ``fit`` scales by).
    batch_size : int
    shuffle : bool
    seed : int
        The seed of its generator (drawn from torch's global generator when None was given).

    Examples
    --------
    >>> images = torch.randint(0, 256, (10, 28, 28), dtype=torch.uint8)
    >>> loader = TensorLoader(images, torch.arange(10) % 3, 4, shuffle=True, flatten=False,
    ...                       normalize=False, seed=0)
    >>> x, y = next(iter(loader))
    >>> tuple(x.shape), x.dtype, bool(x.max() <= 1), len(loader), len(loader.dataset)
    ((4, 1, 28, 28), torch.float32, True, 3, 10)
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool,
        flatten: bool,
        normalize: bool,
        seed: int | None,
    ):
        for name, value in (("images", images), ("labels", labels)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"TensorLoader: expected {name} as a torch.Tensor, got "
                    f"{type(value).__name__}; convert an array with torch.from_numpy({name})."
                )
        flatten = check_flag("flatten", flatten)
        flat = images.dim() == 2 and flatten  # (N, D) rows, served flat
        if labels.dim() != 1 or not (images.dim() == 3 or flat) or len(images) != len(labels):
            fix = _layout_fix(images.shape)
            raise ValueError(
                "TensorLoader: expected images (N, H, W) (or rows (N, D) with flatten=True) and "
                f"labels (N,), one label per image, got shapes {tuple(images.shape)} and "
                f"{tuple(labels.shape)}{f' ({fix})' if fix else ''}."
            )
        if not len(labels):  # fit() and predict() would meet a loader yielding no batch
            raise ValueError(
                f"TensorLoader: expected at least one image, got none (images of shape "
                f"{tuple(images.shape)}, labels {tuple(labels.shape)}). Pass a split that holds "
                "examples (train_size= of load_mnist() takes at least 1)."
            )
        if images.device != labels.device:  # one index picks the rows of both
            raise ValueError(
                f"TensorLoader: images are on {images.device} and labels on {labels.device}; "
                "they must be on one device: pass labels.to(images.device)."
            )
        uncheckable = images.dtype in (torch.uint8, torch.bool) or images.is_complex()
        if images.numel() and not uncheckable:  # (uint8: raw pixels by construction)
            low, high = images.min().item(), images.max().item()
            served = "images" if flat else "images.flatten(1)" if flatten else "images.unsqueeze(1)"
            as_they_are = f"pyrouq.ArrayLoader({served}, "  # (as this loader would serve them)
            # floats in [0, 1], binary {0, 1} too: divided by 255 again, they would train near 0
            # (all 0: the same either way; a few ulps past 0 or 1: rotated)
            if images.is_floating_point() and -_SLACK <= low and 0 < high <= 1 + _SLACK:
                came = f"floats in [{low:.3g}, {high:.3g}], images already scaled to [0, 1]"
                raw = ""
                if bool((images == images.round()).all()):
                    came = "floats that are all 0 or 1, binary images already scaled to [0, 1]"
                    raw = "; raw pixels of values 0 and 1 (of 255) go in as images.byte()"
                raise ValueError(
                    f"TensorLoader: expected raw pixel values in 0-255, got {came}, which it "
                    "would divide by 255 again. Pass images * 255, or train on them as they "
                    f"are with {as_they_are}labels, batch_size){raw}."
                )
            # finite values only: fit() refuses NaN and inf, naming the examples
            if -math.inf < low < -_SLACK or 255 + _SLACK < high < math.inf:
                raise ValueError(  # normalised images would be divided by 255, normalised again
                    f"TensorLoader: expected raw pixel values in 0-255, got values in "
                    f"[{low:.3g}, {high:.3g}]: images normalised already, or pixels of another "
                    "scale. Pass raw 8-bit pixels (e.g. from mnist_arrays), or train on these as "
                    f"they are with {as_they_are}labels, batch_size)."
                )
        self.batch_size = check_int("batch_size", batch_size, hint=_BATCH_HINT)
        self.shuffle = check_flag("shuffle", shuffle)
        self.transform = _Transform(flatten=flatten, normalize=check_flag("normalize", normalize))
        self.dataset = _TensorDataset(images, labels, self.transform)
        if seed is None:
            seed = int(torch.randint(0, MAX_SEED + 1, (1,), device="cpu").item())
        else:
            seed = check_seed(seed, "TensorLoader")
        self.seed = seed
        self._generator = torch.Generator().manual_seed(self.seed)

    @property
    def images(self) -> torch.Tensor:
        return self.dataset.images

    @property
    def labels(self) -> torch.Tensor:
        return self.dataset.labels

    def __len__(self) -> int:
        n = self._local_size(len(self.dataset))
        return (n + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        images, labels = self.dataset.images, self.dataset.labels
        order = self._order(len(self.dataset), self.shuffle, self._generator)
        n = len(self.dataset) if order is None else len(order)
        if order is not None:
            order = order.to(images.device)
        for start in range(0, n, self.batch_size):
            if order is None:
                idx = slice(start, start + self.batch_size)
                yield self.transform(images[idx]), labels[idx]
            else:
                idx_t = order[start : start + self.batch_size]
                yield self.transform(self._rows(images, idx_t)), self._rows(labels, idx_t)

    def get_rng_state(self) -> torch.Tensor:
        """The state of the loader's generator (the next epoch's order follows from it)."""
        return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore a state from :meth:`get_rng_state` (``fit`` does this to resume a run)."""
        set_generator_state(self._generator, state, "TensorLoader")

    def __repr__(self) -> str:
        return (
            f"TensorLoader(num_examples={len(self.dataset)}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, device={self.images.device})"
        )


def _layout_fix(shape: torch.Size) -> str:
    """What to do with 4-d images where (N, H, W) grey pixels are expected ("" if not 4-d):
    ``images[:, 0]`` suits (N, 1, H, W) alone; for channels-last (N, H, W, 1) it would keep
    the first row of each image, and for RGB the red channel alone."""
    if len(shape) != 4:
        return ""
    if shape[1] == 1:  # (N, 1, H, W), as the loaders yield
        return "drop the channel dim: images[:, 0]"
    if shape[-1] == 1:  # channels-last grey
        return "drop the channel dim of channels-last images: images[..., 0]"
    last = shape[-1] < shape[1]  # (N, H, W, C): fewer channels than rows, as (N, 28, 28, 2)
    channels = shape[-1] if last else shape[1]
    kind = "colour images" if channels == 3 else f"images of {channels} channels"  # not RGB
    return (
        f"{channels} channels: the MNIST helpers take grey images; "
        f"serve {kind} as floats normalised per channel with "
        "pyrouq.ArrayLoader(x, labels, batch_size), x of shape (N, C, H, W)"
        + ("; channels-last ones permuted first, images.permute(0, 3, 1, 2)" if last else "")
    )


def _one_image_fix(channels: int) -> str:
    """What to do with one channels-last image ``(H, W, C)`` where ``(N, H, W)`` grey images
    are expected (read as H images of W <= 4 pixels a row, it was normalised as such)."""
    if channels == 1:
        return "one channels-last grey image (H, W, 1)? pass images[..., 0].unsqueeze(0)"
    return (
        f"one channels-last image of {channels} channels (H, W, C)? the MNIST helpers take "
        "grey images; serve colour ones as floats normalised per channel, of shape (1, C, H, W): "
        "images.permute(2, 0, 1).unsqueeze(0)"
    )


def _batch_fix(shape: torch.Size) -> str:
    """What to do with images that are not 4-d where normalize() expects ``(N, H, W)``, N >= 1:
    one image ``(H, W)`` gains a batch dim; flat rows ``(N, H * W)`` (as ``flatten=True``
    gives) or one flat image ``(H * W,)`` are reshaped to square images; a 2-d shape that is
    neither square nor rows of a square number of pixels is told both ways."""
    if len(shape) == 3:  # (0, H, W)
        return "pass at least one image"
    if len(shape) == 2 and shape[0] == shape[1]:
        return "for one image use images.unsqueeze(0)"
    side = math.isqrt(shape[-1]) if len(shape) in (1, 2) else 0
    if len(shape) == 1 and side and side * side == shape[0]:
        return f"for one flattened image use images.reshape(1, {side}, {side})"
    if len(shape) == 2 and side and side * side == shape[1]:
        return (
            f"for flattened images (rows of {shape[1]} pixels) use images.reshape(-1, {side}, "
            f"{side}), and flatten=True to get rows back"
        )
    if len(shape) == 2:  # (rows of pixels, or one image of H != W: either)
        return (
            "reshape flattened images to (N, H, W) first, images.reshape(-1, H, W); for one "
            "image, images.unsqueeze(0)"
        )
    return "pass a batch of grey images, (N, H, W)"


_BATCH_HINT = "Pass e.g. batch_size=256."
_SLACK = 1e-3  # interpolated raw pixels (rotations) round a few ulps past 0 and 255


def _make_loaders(
    folder: str,
    batch_size: int,
    root: str | os.PathLike[str] | None,
    flatten: bool,
    normalize: bool,
    shuffle: bool,
    seed: int | None,
    train_size: int | None,
    device: torch.device | str | None,
    download: bool,
) -> tuple[TensorLoader, TensorLoader]:
    batch_size = check_int("batch_size", batch_size, hint=_BATCH_HINT)
    download = check_flag("download", download)  # "False" would go to the network
    caller = "load_mnist()" if folder == "MNIST" else "load_fashion_mnist()"
    if seed is not None:  # named by the caller, and before the files are read
        seed = check_seed(seed, caller)
    check_device(device, caller)
    train_x, train_y = _arrays(folder, "train", root, download)
    test_x, test_y = _arrays(folder, "test", root, download, both=True)
    if train_size is not None:
        n = train_x.shape[0]
        if not is_integer(train_size) or not (1 <= train_size <= n):
            raise ValueError(
                f"Expected train_size to be an integer in [1, {n}], got {train_size!r}"
                f"{tensor_hint(train_size, integer=True)}. "
                "Pass None for the whole training split."
            )
        train_x, train_y = train_x[:train_size], train_y[:train_size]
    # the loaders' own copies (of the subset alone): changing one changes no other load
    train_x, train_y, test_x, test_y = (
        _own_copy(t, device) for t in (train_x, train_y, test_x, test_y)
    )
    common = dict(flatten=flatten, normalize=normalize)
    train = TensorLoader(train_x, train_y, batch_size, shuffle=shuffle, seed=seed, **common)
    test = TensorLoader(test_x, test_y, batch_size, shuffle=False, seed=0, **common)
    return train, test


def load_mnist(
    batch_size: int = 256,
    *,
    root: str | os.PathLike[str] | None = None,
    flatten: bool = False,
    normalize: bool = True,
    shuffle: bool = True,
    seed: int | None = None,
    train_size: int | None = None,
    device: torch.device | str | None = None,
    download: bool = False,
) -> tuple[TensorLoader, TensorLoader]:
    """MNIST train and test loaders, from the bundled copy unless told otherwise.

    Parameters
    ----------
    batch_size : int, default 256
        Examples per batch (the last batch may be smaller).
    root : path, optional
        Folder in torchvision layout (``<root>/MNIST/raw/train-images-idx3-ubyte[.gz]``).
        Default: ``$PYROUQ_DATA`` if set (a blank one is refused), else the bundled copy. An
        empty or blank string is refused (pathlib reads ``""`` as the current folder: pass ``"."``).
    flatten : bool, default False
        Yield ``(B, 784)`` (for MLPs) instead of ``(B, 1, 28, 28)``.
    normalize : bool, default True
        Map pixels to ``(x / 255 - 0.1307) / 0.3081``; with False, to ``x / 255`` in [0, 1].
    shuffle : bool, default True
        Reshuffle the training set at every epoch (the test loader never shuffles).
    seed : int, optional
        Seed of the training loader's own generator: the same seed gives the same batch order,
        epoch after epoch. Default: drawn from torch's global RNG.
    train_size : int, optional
        Keep only the first ``train_size`` training examples (quick experiments, tests).
    device : torch.device or str, optional
        Where the split tensors (and so every batch) live.
    download : bool, default False
        If the files are missing under ``root``, fetch them through torchvision (not where
        ``root`` names the data set's own folder, or its ``raw/``, and the root above holds
        them: that is an error naming that root); a fetch that fails (no network) is a
        RuntimeError naming the folder, and takes back the empty folders it made. The default
        never touches the network.

    Returns
    -------
    (train_loader, test_loader) : tuple of TensorLoader
    """
    return _make_loaders(
        "MNIST", batch_size, root, flatten, normalize, shuffle, seed, train_size, device, download
    )


def load_fashion_mnist(
    batch_size: int = 256,
    *,
    root: str | os.PathLike[str] | None = None,
    flatten: bool = False,
    normalize: bool = True,
    shuffle: bool = True,
    seed: int | None = None,
    train_size: int | None = None,
    device: torch.device | str | None = None,
    download: bool = False,
) -> tuple[TensorLoader, TensorLoader]:
    """Fashion-MNIST train and test loaders; same arguments as :func:`load_mnist`.

    Normalisation uses the MNIST statistics on purpose: Fashion-MNIST serves as the
    out-of-distribution set of a model trained on MNIST, so it must go through the same
    preprocessing. Only the test split is bundled: ``root`` must hold both splits,
    ``FashionMNIST/raw/train-*`` and ``t10k-*``. To get the bundled test split alone, use
    :func:`fashion_mnist_arrays` or :func:`ood_loader`.
    """
    return _make_loaders(
        "FashionMNIST",
        batch_size,
        root,
        flatten,
        normalize,
        shuffle,
        seed,
        train_size,
        device,
        download,
    )


def ood_loader(
    batch_size: int = 256,
    *,
    root: str | os.PathLike[str] | None = None,
    flatten: bool = False,
    normalize: bool = True,
    device: torch.device | str | None = None,
    dataset: Literal["fashion-mnist", "mnist"] = "fashion-mnist",
) -> TensorLoader:
    """An out-of-distribution test split (bundled) as an unshuffled loader with MNIST
    preprocessing: by default the Fashion-MNIST test split, the OOD set of models trained on
    MNIST; ``dataset="mnist"`` gives the MNIST test split, the OOD set of models trained on
    Fashion-MNIST."""
    if dataset not in ("fashion-mnist", "mnist"):
        # (or a typo's, another word's: 'fashion', 'f-mnist'; none of 'kmnist': DATASET_WORDS)
        hint = close_hint(dataset, ("fashion-mnist", "mnist"), DATASET_WORDS)
        raise ValueError(
            f"Unknown dataset {dataset!r}{hint}: expected 'fashion-mnist' (the OOD set of MNIST "
            "models) or 'mnist' (that of Fashion-MNIST models)."
        )
    folder = "FashionMNIST" if dataset == "fashion-mnist" else "MNIST"
    check_device(device, "ood_loader()")
    images, labels = _arrays(folder, "test", root)
    images, labels = _own_copy(images, device), _own_copy(labels, device)
    return TensorLoader(
        images, labels, batch_size, shuffle=False, flatten=flatten, normalize=normalize, seed=0
    )


#: A black pixel (raw value 0) after the default normalisation: the background of MNIST.
NORMALIZED_BLACK = (0.0 - MNIST_MEAN) / MNIST_STD


def __getattr__(name: str) -> object:
    """``pyrouq.data.rotate`` (where it lived before :mod:`pyrouq.rotation`), imported lazily."""
    if name == "rotate":
        from pyrouq.rotation import rotate

        return rotate
    raise AttributeError(f"module 'pyrouq.data' has no attribute {name!r}")
