"""BatchNorm running statistics re-estimated for one draw of the weights (the
``batchnorm_data`` option of :func:`pyrouq.predict`, as SWAG's ``bn_update``), and the words of
predict() and to_inference_data() for a batch of one input that a BatchNorm without running
statistics refuses, and fit()'s for a training batch too small for a BatchNorm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from pyrouq._batch_size import loader_batch_size
from pyrouq._mismatch import came_from, came_from_elsewhere
from pyrouq._util import ShardedOrder, example_sampler, shard_size

Norm = nn.modules.batchnorm._BatchNorm

ONE_VALUE_PER_CHANNEL = "Expected more than 1 value per channel"
"""How torch's BatchNorm refuses batch statistics of one value per channel (a training batch,
or any batch of a BatchNorm without running statistics): the cue of fit()'s and predict()'s
words for it."""


class BatchTooSmall(ValueError):
    """fit()'s refusal of a training batch too small for a BatchNorm in training mode
    (:func:`one_value_in_training`), carrying what its words tell, for words of one's own
    (``pyrouq fit``'s): ``head``, its words before fit()'s advice; ``first``, whether the batch
    is a first batch of one input (else, usually, an epoch's last batch); ``world``, the ranks
    fit() runs on; ``share`` and ``total``, this rank's examples and the data set's (on ranks;
    None where the loader does not tell them, or on one process)."""

    def __init__(
        self,
        message: str,
        head: str = "",
        *,
        first: bool = False,
        world: int = 1,
        share: int | None = None,
        total: int | None = None,
    ):
        super().__init__(message)
        self.head, self.first, self.world = head, first, world
        self.share, self.total = share, total


def one_value_in_training(
    x: Tensor, epoch: int, step: int, loader: Any = None, world: int = 1
) -> BatchTooSmall:
    """fit()'s refusal of its batch ``step`` of ``epoch`` (1-based), ``x``, too small for the
    batch statistics of a BatchNorm in training mode. A first batch of one input is told on its
    own (a loader of one example, or of batch_size=1: drop_last does not help there; more
    examples, a larger batch_size or a frozen BatchNorm do; on ``world`` > 1 ranks whose shard
    of ``loader``'s examples holds one, more examples or fewer ranks); a later one as, usually,
    an epoch's last batch (drop_last, or a batch size that leaves no remainder of 1; pyrouq's
    own loaders, which have no drop_last, are told the batch sizes nearest theirs). On
    ``world`` > 1 ranks the remainder is that of this rank's shard, which is told."""
    share, total, batch = _shard(loader, world) if world > 1 else (None, None, None)
    told: dict[str, Any] = {"world": world, "share": share, "total": total}
    if step == 1 and x.shape[0] == 1:
        way = "more examples, or a larger batch_size"
        if share is not None and share < 2:  # no batch size gives this rank a batch of 2
            way = (
                f"more examples, or fewer ranks: fit() runs on {world} ranks (torch.distributed "
                f"is initialised), each on its own shard of the {total} examples ({share} on "
                "this rank), which no larger batch_size can make 2"
            )
        head = (
            f"Batch 1 of epoch {epoch} holds 1 input of shape {tuple(x.shape[1:])}, and a "
            "BatchNorm in training mode needs 2 or more inputs per batch to normalise them "
            f"(torch: '{ONE_VALUE_PER_CHANNEL}')."
        )
        advice = (
            f" Give batches of 2 or more inputs ({way}), "
            "or freeze the BatchNorm with .eval() (it then "
            "normalises with its running statistics; one built with "
            "track_running_stats=False takes its batch's statistics in eval mode too)."
        )
        return BatchTooSmall(head + advice, head, first=True, **told)
    head = (
        f"Batch {step} of epoch {epoch} holds {x.shape[0]} input(s) of shape "
        f"{tuple(x.shape[1:])}, and a BatchNorm in training mode needs more than one value per "
        f"channel to normalise it (torch: '{ONE_VALUE_PER_CHANNEL}')."
    )
    if world > 1:
        return BatchTooSmall(head + _shard_words(world, share, total, batch), head, **told)
    advice = _own_loader_words(loader) or (
        " That is usually the last batch of an epoch: drop it (DataLoader(..., drop_last=True)) "
        "or pick a batch size that leaves no remainder of 1."
    )
    return BatchTooSmall(head + advice, head, **told)


def _own_loader_words(loader: Any) -> str:
    """The advice for a last batch of one from pyrouq's own in-memory loader (``ArrayLoader``,
    ``TensorLoader``) on one process, which has no ``drop_last`` to give: the batch sizes
    nearest its own that leave no remainder of 1, or one example fewer. Empty for any other
    loader, or where its numbers do not leave one."""
    dataset, size = getattr(loader, "dataset", None), loader_batch_size(loader)
    if not isinstance(loader, ShardedOrder) or size is None or size < 2:
        return ""
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return ""
    if n <= size or n % size != 1:
        return ""
    fits = [b for b in range(2, n + 1) if n % b != 1]  # (n itself: one batch of them all)
    near = sorted(sorted(fits, key=lambda b: (abs(b - size), -b))[:2])
    sizes = " or ".join(f"batch_size={b}" for b in near)
    name = type(loader).__name__
    return (
        f" That is the last batch of the epoch: {n} examples in batches of {size} leave 1, and "
        f"{name} has no drop_last: pass {sizes} (no batch of one), or leave one example out."
    )


def _shard(loader: Any, world: int) -> tuple[int | None, int | None, int | None]:
    """``(share, total, batch)`` of ``loader`` on ``world`` ranks, each None where it does not
    tell: this rank's examples (``ceil(N / world)`` for pyrouq's loaders; a
    ``DistributedSampler``'s length, ``N // world`` with ``drop_last=True``), the data set's
    ``N``, and the batch size (the loader's, else its batch sampler's)."""
    share, total = None, None
    sampler = example_sampler(loader)
    dataset = getattr(loader, "dataset", None)
    try:
        if isinstance(loader, ShardedOrder) and dataset is not None:
            total = len(dataset)
            share = shard_size(total, world)
        elif isinstance(sampler, torch.utils.data.DistributedSampler):
            share, total = len(sampler), len(sampler.dataset)  # type: ignore[arg-type]
    except TypeError:  # a dataset without a length
        share, total = None, None
    return share, total, loader_batch_size(loader)


def _shard_words(world: int, share: int | None, total: int | None, batch: int | None) -> str:
    """The end of :func:`one_value_in_training`'s words on ``world`` ranks: each rank trains on
    its shard of the examples (:func:`_shard`'s ``share`` of ``total``) in batches of the
    loader's batch size, ``batch``."""
    if share is None:
        shard = "its own shard of the examples"
        rest = "of 1 from this rank's shard"
    else:
        shard = f"its own shard of the {total} examples ({share} on this rank)"
        rest = f"of 1 from this rank's {share} examples"
    batches = (
        f"in batches of {batch} (the batch size is per rank)"
        if batch is not None
        else "in the loader's batches (their size is per rank)"
    )
    return (
        f" fit() runs on {world} ranks (torch.distributed is initialised): each rank trains on "
        f"{shard}, {batches}, so the remainder that counts is the "
        "shard's, not the whole data set's. That is usually the last batch of this rank's "
        "shard in an epoch: drop it (DataLoader(..., drop_last=True)) or pick a batch size "
        f"that leaves no remainder {rest}."
    )


def alone_in_its_batch(
    err: BaseException,
    inputs: Tensor,
    index: int,
    x: Any,
    size: int,
    fn: str = "predict()",
    verb: str = "predict",
) -> str:
    """The words of ``fn`` (predict(), to_inference_data(), which ``verb`` the inputs) for
    torch's refusal of x's batch ``index`` (0-based), one input, by a BatchNorm that takes its
    batch's statistics in eval mode (built with ``track_running_stats=False``); empty for any
    other error (one on ``batchnorm_data``, worded where it came from, included)."""
    if not isinstance(err, ValueError) or not str(err).startswith(ONE_VALUE_PER_CHANNEL):
        return ""
    if inputs.dim() < 2 or inputs.shape[0] != 1 or came_from_elsewhere(err):
        return ""
    if not isinstance(x, Tensor):
        where = "x gave it alone: give batches of 2 inputs or more."
    elif x.shape[0] == 1:
        where = f"x is that one input: {verb} it together with others."
    elif size == 1:
        where = (
            f"batch_size=1 {verb}s each of x's {x.shape[0]} inputs alone: pass a batch_size of "
            "2 or more (one that leaves no remainder of 1)."
        )
    else:
        where = (
            f"batch_size={size} leaves 1 of x's {x.shape[0]} inputs alone: pass a batch_size "
            "that leaves no remainder of 1."
        )
    return (
        f"{fn}: batch {index + 1} of x holds 1 input of shape {tuple(inputs.shape[1:])}, "
        "and a BatchNorm built without running statistics (track_running_stats=False) "
        "normalises with the statistics of its batch in eval mode too, which need more than "
        f"one value per channel (torch: '{ONE_VALUE_PER_CHANNEL}'). {where} Its predictions "
        "depend on the inputs predicted together; build the BatchNorm with running statistics "
        f"(track_running_stats=True, the default) to {verb} each input alone."
    )


def batchnorms(model: Any) -> list[Norm]:
    """The model's BatchNorm layers that keep running statistics (any dimension, SyncBN)."""
    if not isinstance(model, nn.Module):
        return []
    return [m for m in model.modules() if isinstance(m, Norm) and m.running_mean is not None]


def check_batchnorm_data(model: Any, data: Any, guide: Any, posterior_samples: Any) -> list[Norm]:
    """The BatchNorm layers whose statistics ``batchnorm_data`` re-estimates per draw (none
    without it), or a clear error where there are no draws or no such layers."""
    if data is None:
        return []
    name = type(model).__name__
    if guide is None and posterior_samples is None:
        raise ValueError(
            f"predict() got batchnorm_data for {name} without posterior draws: it re-estimates "
            "BatchNorm statistics for each draw of the weights, so it needs a guide or "
            "posterior_samples. A BatchEnsemble's members and a plain network use the "
            "statistics fit() kept; leave batchnorm_data out."
        )
    norms = batchnorms(model)
    if not norms:
        raise ValueError(
            f"predict() got batchnorm_data, but {name} has no BatchNorm layer with running "
            "statistics to re-estimate. Leave batchnorm_data out."
        )
    return norms


def _buffers(module: Norm) -> list[Tensor]:
    """``running_mean``, ``running_var`` and ``num_batches_tracked`` (where kept)."""
    buffers = (module.running_mean, module.running_var, module.num_batches_tracked)
    return [b for b in buffers if b is not None]


def statistics_of(norms: list[Norm]) -> list[tuple[Tensor, ...]]:
    """Every layer's running statistics, copied."""
    return [tuple(b.clone() for b in _buffers(m)) for m in norms]


def load_all(norms: list[Norm], values: list[tuple[Tensor, ...]]) -> None:
    """Copy :func:`statistics_of`'s values back into the layers."""
    for module, saved in zip(norms, values, strict=True):
        for buffer, value in zip(_buffers(module), saved, strict=True):
            buffer.copy_(value)


def estimate_statistics(
    norms: list[Norm],
    inputs: list[Tensor],
    run: Callable[[Tensor], Tensor],
) -> list[tuple[Tensor, ...]]:
    """Every BatchNorm's statistics under one draw of the weights (``run``): reset, then the
    average over train-mode passes on ``inputs``, the rest of the network in eval mode. As in
    SWAG's ``bn_update``, every call weighs by its batch size (momentum ``b / (n + b)`` after
    ``n`` inputs; for batches of one size, torch's cumulative average, momentum None), not by
    the positions it averages over (images of other sizes would weigh by rows). The layers are
    back in eval mode with their momentum afterwards."""
    momenta = [m.momentum for m in norms]
    seen = dict.fromkeys(norms, 0)

    def weigh(module: Norm, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        size = (args[0] if args else kwargs["input"]).shape[0]  # bn(h) or bn(input=h)
        seen[module] += size
        module.momentum = size / seen[module] if seen[module] else 0.0  # empty: no change

    hooks = [m.register_forward_pre_hook(weigh, with_kwargs=True) for m in norms]
    try:
        for m in norms:
            m.reset_running_stats()
            m.train()
        for x in inputs:
            try:
                run(x.clone())  # a network changing its input in place changes a copy
            except (TypeError, ValueError, RuntimeError) as err:  # torch's words name no input
                came_from(err, "batchnorm_data")  # (predict() restates it as none of x's)
                if hasattr(err, "add_note"):  # Python >= 3.11
                    err.add_note(
                        f"predict(): this came from a batch of batchnorm_data, shaped "
                        f"{tuple(x.shape)}, run to re-estimate BatchNorm statistics for a draw. "
                        "If x's batches are shaped otherwise, pass training inputs shaped as "
                        "them (a tensor, or a loader of inputs or of (x, y) batches)."
                    )
                raise
        return statistics_of(norms)
    finally:
        for hook in hooks:
            hook.remove()
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
            m.eval()
