"""fit()'s checks of its numbers and of its data: what it refuses before training (with what
to do instead), and how it counts the training examples N of a loader."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.nn.parameter import is_lazy

from pyrouq import checkpoint as _checkpoint
from pyrouq._batch_size import loader_batch_size
from pyrouq._numbers import is_real, tensor_hint, text_hint
from pyrouq._util import check_count, check_positive_float, example_sampler, warn_caller
from pyrouq._words import article
from pyrouq.infer._elbo_checks import annealing_hint
from pyrouq.infer._training import unbatched_items


class _Default(float):
    """A default told apart from the same number passed (``fit(lr=...)`` beside ``optim=``);
    shown as the number."""

    __slots__ = ()

    def __repr__(self) -> str:
        return float.__repr__(self)


DEFAULT_LR: float = _Default(2e-2)
"""``fit()``'s default ``lr``, the default Adam's learning rate (2e-2)."""


def warn_lr_beside_optim(lr: Any, optim: Any) -> None:
    """Warn of an ``lr`` passed beside ``optim`` (the default left alone): the optimizer
    ``optim`` builds has its own learning rate, and ``lr`` has no effect (warned of, as a
    ``kl_weight`` given for a model without latent sites is)."""
    if optim is not None and lr is not DEFAULT_LR:
        warnings.warn(
            f"fit(lr={lr!r}) has no effect beside optim=: lr is the learning rate of the "
            "default Adam only, and the optimizer optim builds keeps its own. Give the learning "
            f"rate to optim (e.g. optim=lambda params: torch.optim.AdamW(params, lr={lr!r})) "
            "and leave lr out, or leave optim out to train with pyrouq's Adam at lr.",
            stacklevel=3,
        )


def refuse_inference_tensors(model: Any, guide: Any) -> None:
    """Refuse a model or guide holding inference tensors (built inside
    ``torch.inference_mode()``, or first run there, its lazy parameters made there): autograd
    can neither record them nor update them in place, and torch's error, raised in the first
    step (or as a lazy parameter is made), names no tensor. A lazy parameter or buffer not
    made yet is checked too: one created inside ``torch.inference_mode()`` is an inference
    tensor, and stays one once made."""
    for role, module in (("model", model), ("guide", guide)):
        if not isinstance(module, torch.nn.Module):
            continue
        for name, tensor in (*module.named_parameters(), *module.named_buffers()):
            if _is_inference(tensor):
                raise RuntimeError(
                    f"fit() expects the {role}'s parameters and buffers to be normal tensors, "
                    f"but {type(module).__name__}'s {name!r} is an inference tensor: the "
                    f"{role} was built, or first run (its lazy parameters made), inside "
                    "torch.inference_mode(), and autograd can neither train nor update such "
                    "tensors. Build the model and its guide outside torch.inference_mode(), "
                    "and give a model with lazy layers its first batch outside it too "
                    "(bayesian() and batchensemble() copy a network made inside it into normal "
                    "tensors; pyrouq.load() gives normal tensors wherever it is called)."
                )


def _is_inference(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is an inference tensor: a LazyModule's parameter or buffer not made
    yet too, whose ``__torch_function__`` refuses every method but a few (torch has no public
    route to read it past that: an unmade parameter's ``.data`` is a plain tensor, an unmade
    buffer's is not)."""
    if is_lazy(tensor):
        with torch._C.DisableTorchFunctionSubclass():
            return bool(tensor.is_inference())
    return tensor.is_inference()


def check_settings(epochs: Any, lr: Any, num_particles: Any, kl_weight: Any) -> tuple[int, float]:
    """``(epochs, lr)`` checked, and ``num_particles`` and ``kl_weight`` checked as far as
    :class:`~pyrouq.KLWeightedELBO` would refuse them, in words that say what fit() wants."""
    epochs = check_count(
        "epochs", epochs, "Pass the number of passes over train_loader, e.g. epochs=10."
    )
    lr = check_positive_float("lr", lr, "Pass a number, e.g. lr=1e-3 (the default Adam's is 2e-2).")
    check_count(
        "num_particles",
        num_particles,
        "Pass the number of draws from the guide per step, e.g. num_particles=1 (the default).",
    )
    if kl_weight is not None and not is_real(kl_weight):
        raise TypeError(
            f"Expected kl_weight to be a float >= 0 or None, got {kl_weight!r}"
            f"{tensor_hint(kl_weight)}{text_hint(kl_weight, 'kl_weight', 0, low_allowed=True)}. "
            "Pass a number, e.g. kl_weight=1.0 (the exact ELBO), or "
            "leave it out for the default (0.02 for classifiers, 1.0 for regression and rank-1 "
            f"networks).{annealing_hint(kl_weight, 'fit()')}"
        )
    return epochs, lr


def check_paths(checkpoint: Any, resume_from: Any, metadata: Any) -> None:
    """Refuse a ``checkpoint`` or ``resume_from`` that is not a path (or a Checkpoint), and
    ``metadata`` that is not a dict, before anything reads or writes them."""
    for name, value in (("checkpoint", checkpoint), ("resume_from", resume_from)):
        saved = name == "resume_from" and isinstance(value, _checkpoint.Checkpoint)
        if not (value is None or saved or isinstance(value, (str, os.PathLike))):
            also = " or the Checkpoint that pyrouq.load() returns" if name == "resume_from" else ""
            raise TypeError(
                f"Expected fit({name}=...) to be a file path (str or pathlib.Path){also}, got "
                f"{type(value).__name__}. Pass e.g. {name}='run.pt'."
            )
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(
            f"Expected fit(metadata=...) to be a dict of JSON values, got "
            f"{type(metadata).__name__}. Pass e.g. metadata={{'note': 'run 1'}}."
        )


def check_loader_kind(loader: Any) -> None:
    """Refuse what iterates examples or tensors rather than ``(x, y)`` batches: one pair of
    tensors or arrays, a list or map-style dataset (``TensorDataset``) of single examples."""
    hint = (
        "Serve batches: pyrouq.ArrayLoader(x, y, batch_size=64), or "
        "torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)."
    )
    data, what = torch.utils.data, f"{type(loader).__name__}"
    if not isinstance(loader, Iterable) and not hasattr(type(loader), "__getitem__"):
        raise TypeError(  # (was "'NoneType' object is not iterable", from the epoch's loop)
            f"Expected train_loader to be an iterable of (x, y) batches, got {what}. {hint}"
        )
    if isinstance(loader, (torch.Tensor, np.ndarray)):
        raise TypeError(
            f"train_loader is {article(what)} {what} (the inputs alone?), not (x, y) batches. "
            f"{hint}"
        )
    if isinstance(loader, (str, bytes, bytearray, Mapping)):  # (iterated: characters, ints, keys)
        gives = (
            "its keys"
            if isinstance(loader, Mapping)
            else "one character at a time"
            if isinstance(loader, str)
            else "one byte (an int) at a time"
        )
        raise TypeError(
            f"Expected train_loader to be an iterable of (x, y) batches, got {what} "
            f"{_shown(loader)}: iterated, it gives {gives}, not batches. {hint}"
        )
    if isinstance(loader, (tuple, list)):
        if len(loader) == 2 and all(isinstance(t, (torch.Tensor, np.ndarray)) for t in loader):
            raise TypeError(
                f"train_loader is {article(what)} {what} of 2 {type(loader[0]).__name__}s (one "
                "(x, y) pair?), "
                f"not an iterable of (x, y) batches: each would be taken for a batch. {hint}"
            )
    elif not isinstance(loader, data.Dataset) or isinstance(loader, data.IterableDataset):
        return
    elif hasattr(type(loader), "__iter__"):  # a dataset that iterates in its own way
        return
    try:
        label = loader[0][1]
    except Exception:  # not (x, y) items: the batch checks speak
        return
    if isinstance(label, (int, float, np.number)) or (torch.is_tensor(label) and label.dim() == 0):
        raise TypeError(
            f"train_loader is {article(what)} {what} of single examples (its first label is "
            "one number): "
            f"iterated directly, each example would be taken for a batch. {hint}"
        )


def _shown(loader: Any) -> str:
    """A str or bytes shown (shortened) in a message; a mapping by its first keys."""
    if isinstance(loader, Mapping):
        return f"with keys {list(loader)[:4]!r}"
    text = repr(loader)
    return text if len(text) <= 60 else f"{text[:57]}..."


def dataset_size(loader: Any) -> int | None:
    """``len(loader.dataset)``, or None (no dataset, or one without a length)."""
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return None


def num_examples(loader: Iterable) -> int | None:
    """N: the size of the loader's dataset, or of the subset its sampler draws from (None for a
    DataLoader without automatic batching, whose dataset's items may be whole batches)."""
    if unbatched_items(loader) is not None:
        return None
    sampler = example_sampler(loader)
    if isinstance(sampler, torch.utils.data.SubsetRandomSampler):
        return len(sampler)
    return dataset_size(loader)


def warn_num_data_below(num_data: int, loader: Iterable) -> None:
    """Warn of ``fit(num_data=N)`` below the examples the loader counts (:func:`num_examples`)
    and draws from (:func:`_draws_from_all`; a sampler of one's own may draw from a subset):
    the likelihood is then scaled as if the data were N examples, and weighs that many times
    less against the KL (on purpose, perhaps: a subsample standing for a smaller set)."""
    count = num_examples(loader)
    if count is not None and num_data < count and _draws_from_all(loader):
        warn_caller(
            f"fit(num_data={num_data}) is below the {count} examples of train_loader's "
            f"dataset: the likelihood is scaled by N/B as if the training set were {num_data} "
            f"examples, so the data weigh {count / num_data:.3g} times less against the KL than "
            f"they would with N = {count}. Pass num_data={count}, or leave it out (fit() reads "
            "it from the loader); keep it only if the loader draws from a larger set on purpose."
        )


def _draws_from_all(loader: Iterable) -> bool:
    """Whether the examples :func:`num_examples` counts are those the loader draws from: no
    sampler (pyrouq's loaders, a list with a ``.dataset``), or torch's samplers of the whole
    dataset (or of a ``SubsetRandomSampler``'s indices) batched by torch's ``BatchSampler``;
    not a sampler of one's own (a list of indices, a ``Sampler`` subclass, a batch sampler) or
    a ``WeightedRandomSampler``, which may draw from a part of the dataset: N = num_data."""
    data = torch.utils.data
    if type(getattr(loader, "batch_sampler", None)) not in (data.BatchSampler, type(None)):
        return False
    whole = (data.SequentialSampler, data.RandomSampler, data.SubsetRandomSampler)
    sampler = example_sampler(loader)
    return sampler is None or isinstance(sampler, (*whole, data.DistributedSampler))


def refuse_batch_above_n(y: Any, num_data: int, loader: Any, epoch: int, step: int) -> None:
    """Refuse a batch of B > N examples: its likelihood's scale N/B is below 1, and a batch
    drawn without replacement holds at most N (a sampler drawing with replacement may hold
    more, and is let be)."""
    size = y.shape[0] if isinstance(y, torch.Tensor) and y.dim() else None
    if size is None or size <= num_data or getattr(example_sampler(loader), "replacement", False):
        return
    raise ValueError(
        f"fit(): batch {step} of epoch {epoch} holds {size} examples, more than N = {num_data}, "
        f"the training-set size (num_data): the likelihood's scale N/B = {num_data}/{size} is "
        "below 1, though a training set of N examples has no batch of more than N. Pass "
        "num_data=N, the number of training examples, or leave it out for a loader with a sized "
        "dataset; for the per-example loss mean CE + k * KL, keep N and pass kl_weight=k * N."
    )


class ReadAhead:
    """An iterator's batches with the first one read ahead, so that looking at it (fit's
    probe of the first examples) does not take it from the epoch."""

    def __init__(self, iterator: Iterator[Any], length: int | None = None):
        self._length = length  # a sized iterator's (a DataLoader's): the schedule plans over it
        self._first = next(iterator, None)
        self._rest = iterator

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError(f"{type(self._rest).__name__} has no length")
        return self._length

    def __iter__(self) -> Iterator[Any]:
        if self._first is not None:
            yield self._first
        yield from self._rest


def no_batches_message(loader: Iterable, world: int, epoch: int) -> str:
    """What fit() says when ``loader`` served no batch in ``epoch``, on one of ``world`` ranks:
    under torch.distributed, a ``DistributedSampler`` gives each rank its share of the
    examples, which may hold none (``drop_last=True`` with fewer examples than ranks) or fewer
    than a ``drop_last=True`` DataLoader's batch."""
    why = (
        "a DataLoader with drop_last=True and a batch_size above N yields none; an exhausted "
        "iterator none either"
    )
    fix = "Pass a loader with batches each epoch."
    sampler = example_sampler(loader)
    if world > 1 and isinstance(sampler, torch.utils.data.DistributedSampler):
        share, size = len(sampler), len(sampler.dataset)  # type: ignore[arg-type]
        why = (
            f"its DistributedSampler gives each of the {world} ranks {share} of the {size} examples"
        )
        if share == 0:  # drop_last=True: N // world each
            why += ": drop_last=True, with fewer examples than ranks"
            fix = (
                "Build the sampler with drop_last=False (it pads the shards to one size), or "
                "run on fewer ranks than examples."
            )
        else:
            batch = loader_batch_size(loader)  # (a batch_sampler='s too)
            why += f", fewer than a batch{f' of {batch}' if batch else ''} with drop_last=True"
            fix = (
                f"Pass a batch_size of at most {share} (the batch size is per rank), or "
                "drop_last=False."
            )
            if isinstance(loader, torch.utils.data.DataLoader) and loader.batch_size is None:
                # batch_sampler= (or a BatchSampler as sampler=): DataLoader refuses a
                # batch_size beside it
                fix = (
                    f"Build the batch sampler with a batch size of at most {share} (the batch "
                    "size is per rank; DataLoader takes no batch_size beside a batch_sampler), "
                    "or with drop_last=False."
                )
    return f"train_loader yielded no batches ({why}) in epoch {epoch}. {fix}"


def unsharded_loader_message(loader: Any, world: int) -> str:
    """fit()'s refusal, on ``world`` ranks, of a loader that does not shard the data by rank
    (neither pyrouq's nor a ``DataLoader`` with a ``DistributedSampler``): fit() cannot tell
    whether it serves every rank the same data or each rank data of its own (sharded
    beforehand, which fit() does not take), with what to do (for a loader over an
    ``IterableDataset``, which takes no sampler, too)."""
    message = (
        f"fit() runs on {world} ranks (torch.distributed is initialised), but train_loader "
        f"({type(loader).__name__}) is neither one of pyrouq's loaders (load_mnist, "
        "ArrayLoader, ...: they shard themselves by rank) nor a DataLoader with a "
        "DistributedSampler, so fit() cannot tell whether it gives every rank the same data "
        "or each rank its own; it takes no data sharded beforehand. "
    )
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return message + (
            f"Its dataset ({type(dataset).__name__}) is an IterableDataset, which takes no "
            "sampler: put the examples in a map-style dataset (torch.utils.data.TensorDataset, "
            "or one with __getitem__ and __len__) and pass DataLoader(dataset, batch_size, "
            "sampler=DistributedSampler(dataset)) on every rank, or train on one process."
        )
    return message + (
        "Give every rank the whole data set, as DataLoader(dataset, batch_size, "
        "sampler=DistributedSampler(dataset)) (dataset: e.g. TensorDataset(x, y)) or one of "
        "pyrouq's loaders: each rank then trains on a shard of its own."
    )
