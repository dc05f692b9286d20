"""The training-set size N that :func:`pyrouq.fit` scales the minibatch likelihood by (N/B):
``num_data`` as given, else counted from the loader, else the model's or the resumed run's,
and the refusals where none of them tells it (:func:`training_size`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyrouq._util import check_int, len_or
from pyrouq.checkpoint._resume import recorded_num_data
from pyrouq.infer._fit_inputs import dataset_size, num_examples, warn_num_data_below
from pyrouq.infer._training import unbatched_items, unpack_batch

__all__ = ["counted_num_data_note", "training_size"]

_NUM_DATA = "Pass the training-set size N (the likelihood is scaled by N/B), or leave num_data out."
"""What to do about a ``num_data`` that is no count."""


def training_size(num_data: Any, train_loader: Iterable, model: Any, resume_from: Any) -> int:
    """N for ``fit(model, guide, train_loader, num_data=num_data, resume_from=resume_from)``:
    ``num_data`` checked (a count; below the loader's examples, warned of), else
    :func:`~pyrouq.infer._fit_inputs.num_examples` of the loader, else the ``num_data`` the
    model was built with, else the run's at ``resume_from``; a ValueError saying what to pass
    where none tells it, or tells N < 1."""
    n: int | None
    if num_data is not None:  # (the N it gives: a count, or refused)
        n = check_int("num_data", num_data, hint=_NUM_DATA)
        warn_num_data_below(n, train_loader)
    else:
        n = num_examples(train_loader)
    if n is None:  # the N the model was built with (bayesian(net, num_data=N)), or resumed
        n = getattr(model, "given_num_data", None) or recorded_num_data(resume_from)
    served = unbatched_items(train_loader) if n is None else None
    size = dataset_size(train_loader) if served is not None else None
    if served is not None and size is not None:  # without a size: the message below
        counted = f"the size of its dataset ({size} items)"
        sampler = type(getattr(train_loader, "sampler", None)).__name__
        what = (
            f"it serves its dataset's items as they are, so {counted} counts the training "
            "examples only if they are single examples, not pre-made batches"
            if served == "batches"
            else f"its sampler of its own ({sampler}) is not read "
            f"to tell whether it fetches whole items (pre-made batches) or lists of examples, "
            f"so {counted} may not count the training examples"
        )
        raise ValueError(
            f"train_loader is a DataLoader with batch_size=None (automatic batching off): "
            f"{what}. Pass num_data=N, the number of examples: the minibatch likelihood is "
            "scaled by N/B."
        )
    if n is None and len_or(train_loader, None) == 0:  # ([]: neither batches nor a size)
        raise ValueError(
            f"train_loader is an empty {type(train_loader).__name__}: it holds no batches. "
            "Pass a loader with data, e.g. pyrouq.ArrayLoader(x, y, batch_size=64)."
        )
    if n is None and isinstance(train_loader, (list, tuple)) and train_loader:
        unpack_batch(train_loader[0], 1, 1)  # (a batch fit() refuses: said first, not after N)
    if n is None:
        raise ValueError(
            "Cannot tell the training-set size N from train_loader (it has no sized .dataset). "
            "Pass num_data=N: the minibatch likelihood is scaled by N/B."
        )
    if n < 1:
        raise ValueError(
            f"train_loader is empty (its dataset holds {n} examples). Pass a loader with data."
        )
    return n


def counted_num_data_note(num_data: Any, n: int, train_loader: Iterable) -> dict[str, str]:
    """What fit()'s refusal of a ``num_data`` that differs between ranks adds (by the
    argument's name) where it was left out and N counted from the rank's loader, told where
    that holds on every rank (else one rank's ``num_data`` differs from the others' counts):
    the ranks' datasets differ, which one ``num_data`` passed everywhere would leave as it
    is (each rank would train on a set of its own)."""
    if num_data is not None or num_examples(train_loader) != n:
        return {}
    return {
        "num_data": f"num_data was left out on this rank, so N = {n} was counted from "
        "train_loader (the examples of its dataset): the ranks' datasets differ. Build the "
        "same dataset on every rank (DistributedSampler(dataset) gives each rank its own "
        "shard of it)."
    }
