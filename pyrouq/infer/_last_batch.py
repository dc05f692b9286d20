"""fit()'s early refusal of an epoch's last batch of one under a BatchNorm in training mode:
where the loader's sizes are known before training (pyrouq's in-memory loaders, a torch
``DataLoader`` over a sized dataset, in order or shuffled by its own ``shuffle=True``, without
``drop_last``), a remainder of one is told at the run's first step, before its update (nothing
trained, nothing written), with the words its failure at the end of the first epoch had.

A BatchNorm meeting the first batch as ``(B, C)`` (or ``(B, C, 1, ...)``: one value per channel
per example) meets a batch of one as ``(1, C)``, which torch refuses; a BatchNorm of images
(``(B, C, H, W)``), or one meeting each example more than once (a BatchEnsemble's folded batch),
does not refuse it, and is not told."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)

from pyrouq._batch_size import loader_batch_size
from pyrouq._util import ShardedOrder

__all__ = ["LastBatchOfOne", "last_batch_watched"]


class LastBatchOfOne(Exception):
    """Raised by a BatchNorm's pre-hook in the run's first step: the epoch's batch ``step``
    holds one example, which that BatchNorm refuses (fit() words it as the step's failure)."""

    def __init__(self, step: int):
        super().__init__(f"batch {step} of each epoch holds one example")
        self.step = step


def last_step_of_one(loader: Any, world: int) -> int | None:
    """The step of an epoch's last batch where ``loader``'s sizes say it holds one example
    (``N`` examples in batches of ``B`` >= 2, ``N > B`` and ``N % B == 1``); None where they do
    not, or where they are not known before training: another loader (a sampler of its own or
    over other indices than the dataset's, a ``collate_fn`` of its own, a list of batches,
    ``drop_last=True``), or ranks, each serving its own shard."""
    if world != 1:
        return None
    dataset, size = getattr(loader, "dataset", None), loader_batch_size(loader)
    if size is None or size < 2 or not _known_sizes(loader):
        return None
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None
    if n <= size or n % size != 1:
        return None
    # a sampler over other indices (SequentialSampler(range(16)) of 17): other batches
    if isinstance(loader, DataLoader) and len(loader.sampler) != n:  # type: ignore[arg-type]
        return None
    return n // size + 1


def _known_sizes(loader: Any) -> bool:
    """Whether ``loader`` serves all its examples once an epoch in batches of its batch size, the
    last one holding what is left: pyrouq's in-memory loaders, or a ``DataLoader`` over a sized
    dataset with its own sequential or shuffled sampler, torch's ``default_collate`` (a
    ``collate_fn`` of one's own may serve other rows than examples: two views of each, or
    the ones it keeps) and no ``drop_last``."""
    if isinstance(loader, ShardedOrder):
        return True
    if not isinstance(loader, DataLoader) or loader.drop_last:
        return False
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
        return False
    if loader.collate_fn is not default_collate:
        return False
    sampler = loader.sampler
    if type(sampler) is SequentialSampler:
        return True
    if type(sampler) is RandomSampler:  # shuffle=True: each example once, unless told otherwise
        return not sampler.replacement and sampler._num_samples is None
    return False


@contextlib.contextmanager
def last_batch_watched(
    modules: Iterable[Any], loader: Any, world: int, rows: int
) -> Iterator[None]:
    """While inside (the run's first step, on a batch of ``rows`` examples), raise
    :class:`LastBatchOfOne` before the first BatchNorm taking batch statistics that meets one
    value per channel per example, where the epoch's last batch holds one example
    (:func:`last_step_of_one`) and the first holds the loader's batch size; nothing is watched
    otherwise."""
    # (every other step: rows 0; a first batch of other rows than its examples: not watched)
    known = rows >= 2 and rows == loader_batch_size(loader)
    step = last_step_of_one(loader, world) if known else None
    norms = [
        m
        for module in (modules if step is not None else ())
        if isinstance(module, nn.Module)
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    if step is None or not norms:
        yield
        return

    def check(norm: nn.Module, args: tuple[Any, ...]) -> None:
        h = args[0] if args else None
        batch_statistics = norm.training or norm.running_mean is None  # (as torch's forward)
        if not (batch_statistics and isinstance(h, torch.Tensor) and h.dim() >= 2):
            return
        if h.shape[0] == rows and math.prod(h.shape[2:]) == 1:  # a batch of one: (1, C)
            raise LastBatchOfOne(step)

    handles = [norm.register_forward_pre_hook(check) for norm in norms]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
