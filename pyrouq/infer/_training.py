"""What ``fit()`` needs besides the ELBO: input checks, Ctrl-C handling, resume state (the
optimizer and callbacks are :mod:`pyrouq.infer._options`', the first look at the data is
:mod:`pyrouq.infer._probe`'s)."""

from __future__ import annotations

import contextlib
import itertools
import random
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from pyrouq import _engine
from pyrouq._batch_size import loader_batch_size
from pyrouq._util import (
    ShardedOrder,
    bad_rows,
    describe_batch,
    example_sampler,
    global_streams_kept,
    len_or,
    other_items_fix,
    warn_caller,
)
from pyrouq.infer._batch_inputs import refuse_several_inputs, unbatched_examples
from pyrouq.infer._site_kl import float32_zero
from pyrouq.infer.elbo import ELBOTerms
from pyrouq.likelihoods import Categorical, likelihood_of

TRAINING_STATE_VERSION = 1


class TrainingInterrupted(KeyboardInterrupt):
    """``fit()`` stopped on Ctrl-C (or a ``KeyboardInterrupt`` raised by a callback).

    The model and guide hold the parameters of the last completed optimizer step.

    Attributes
    ----------
    result : FitResult
        The epochs completed before the interruption.
    checkpoint : Path or None
        Where ``fit(checkpoint=...)`` wrote the partial run (resume it with
        ``fit(..., resume_from=checkpoint)``).
    epoch, step : int
        The epoch (1-based) and its last completed step.
    epoch_complete : bool
        Whether that step ended the epoch (stopped between epochs, e.g. by a callback): the
        message then says "at the end of epoch ...".

    Examples
    --------
    >>> import torch
    >>> from pyrouq import BayesianMLP, fit, mean_field_guide
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> batches = [(torch.randn(16, 4), torch.randint(0, 3, (16,)))]  # one step per epoch
    >>> def stop(record):
    ...     raise KeyboardInterrupt
    >>> try:
    ...     fit(model, mean_field_guide(model), batches, epochs=3, num_data=16,
    ...         progress=False, callbacks=[stop])
    ... except TrainingInterrupted as interrupted:
    ...     print(interrupted.epoch, interrupted.step, len(interrupted.result.history))
    1 1 1
    """

    def __init__(self, result: Any, checkpoint: Path | None, epoch: int, step: int):
        self.result = result
        self.checkpoint = checkpoint
        self.epoch = epoch
        self.step = step
        # stopped between epochs (a callback after an epoch's last step): the epoch is whole
        self.epoch_complete = bool(step) and len(getattr(result, "history", ())) >= epoch
        where = (
            f"; the partial run is saved at {str(checkpoint)!r} (resume with "
            "fit(..., resume_from=that path))"
            if checkpoint is not None
            else "; pass checkpoint=PATH to fit() to save partial runs"
        )
        when = (
            f"at the end of epoch {epoch} (after its last step, {step}): the model and guide "
            "keep the parameters of that step"
            if self.epoch_complete
            else f"in epoch {epoch} after step {step}: the model and guide keep the parameters "
            "of that step"
            if step
            else f"in epoch {epoch} before its first step: the model and guide keep the "
            "parameters they had when it began"
        )
        super().__init__(f"Training interrupted {when}{where}.")


class InterruptFlag:
    """While active, the first Ctrl-C only sets ``requested``; fit stops after its step.

    A second Ctrl-C raises ``KeyboardInterrupt`` at once. Outside the main thread (where
    signal handlers cannot be installed) Ctrl-C behaves as usual.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> InterruptFlag:
        if threading.current_thread() is threading.main_thread():
            try:
                self._previous = signal.signal(signal.SIGINT, self._handle)
                self._installed = True
            except ValueError:  # pragma: no cover - e.g. embedded interpreters
                self._installed = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False


def check_loader_inputs(loader: Iterable, likelihood: Any, num_outputs: int | None) -> bool:
    """Refuse NaN/inf inputs and bad labels of an in-memory loader before training starts.

    Works on the tensors of a :class:`pyrouq.data.TensorLoader` or of a ``DataLoader`` over a
    ``TensorDataset`` at once (no pass over the batches) and returns True; for other loaders
    it returns False: check their batches during training (:func:`check_batch`).
    """
    tensors = _in_memory_tensors(loader)
    if tensors is None:
        return False
    images, labels = tensors
    if images.dtype.is_floating_point:
        bad = bad_rows(images)
        if bad.numel():
            batch_size, shuffle = loader_batch_size(loader), getattr(loader, "shuffle", None)
            ordered = isinstance(example_sampler(loader), torch.utils.data.SequentialSampler)
            in_order = ordered if shuffle is None else not shuffle  # (a DataLoader has none)
            first = int(bad[0])
            where = (
                f" (the first in batch {first // batch_size + 1} of every epoch)"
                if batch_size and in_order
                else ""
            )
            raise ValueError(
                f"train_loader holds NaN or inf in {bad.numel()} of {images.shape[0]} examples, "
                f"e.g. example indices {bad[:5].tolist()}{where}; nothing was trained. Remove "
                "or repair them (torch.nan_to_num, or drop the rows) before fit()."
            )
    problem = likelihood.target_problem(labels, num_outputs)
    if problem is not None:
        raise ValueError(f"train_loader has {problem}; nothing was trained. Fix the targets.")
    return True


def unbatched_items(loader: Iterable) -> str | None:
    """What a torch DataLoader with automatic batching off (``batch_size=None``, no batch
    sampler, a map-style dataset read through a sampler) serves: ``"batches"`` when it serves
    its dataset's items as they are (an IterableDataset, or torch's samplers of single
    indices: the items of a dataset of pre-made batches, so ``len(dataset)`` does not count
    examples), ``"unknown"`` behind a sampler of one's own (single indices, or lists of them
    that fetch examples: it is not read, which could change or use it up); None for other
    loaders, whose batches are made of examples."""
    data = torch.utils.data
    if not isinstance(loader, data.DataLoader) or loader.batch_size is not None:
        return None
    if loader.batch_sampler is not None:
        return None
    if isinstance(loader.dataset, data.IterableDataset):
        return "batches"  # it yields its items as they are
    sampler = loader.sampler
    if isinstance(sampler, data.BatchSampler):
        return None  # lists of indices: dataset[[i, j, ...]], examples
    single = (
        data.SequentialSampler,
        data.RandomSampler,
        data.SubsetRandomSampler,
        data.WeightedRandomSampler,
        data.DistributedSampler,
    )
    return "batches" if isinstance(sampler, single) else "unknown"


def serves_dataset_as_is(loader: Iterable) -> bool:
    """Whether the loader's batches are its dataset's examples, every one of them (over the
    epochs), as they are: not a torch ``DataLoader`` with a ``collate_fn`` of its own (which
    may scale, reshape or relabel them), a sampler that leaves examples out (a subset's), or
    ``drop_last`` that never serves the same last ones."""
    data = torch.utils.data
    if not isinstance(loader, data.DataLoader):
        return True
    if unbatched_items(loader) is not None:
        return False
    if loader.collate_fn not in (data.default_collate, data.default_convert):
        return False
    batches = loader.batch_sampler
    if type(batches) not in (data.BatchSampler, type(None)):
        return False
    sampler = example_sampler(loader)
    if isinstance(sampler, data.RandomSampler):
        return not sampler.replacement and sampler.num_samples == len(sampler.data_source)
    if isinstance(sampler, data.SequentialSampler) and isinstance(batches, data.BatchSampler):
        if batches.drop_last:  # the same tail is never served, unless there is none
            return len(sampler) % batches.batch_size == 0
    return isinstance(sampler, (data.SequentialSampler, data.DistributedSampler))


def _in_memory_tensors(loader: Iterable) -> tuple[torch.Tensor, torch.Tensor] | None:
    if not serves_dataset_as_is(loader):  # then checked batch by batch, as they come
        return None
    dataset = getattr(loader, "dataset", None)
    images = getattr(dataset, "images", None)
    labels = getattr(dataset, "labels", None)
    if isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor):
        return images, labels
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) == 2:  # (more items: refused as batches)
        if isinstance(tensors[0], torch.Tensor) and isinstance(tensors[1], torch.Tensor):
            return tensors[0], tensors[1]
    return None


def unpack_batch(batch: Any, epoch: int, step: int) -> tuple[Any, Any]:
    """``(x, y)`` of a training batch, off any autograd graph they were computed in, or a
    TypeError naming what the loader yielded (a ValueError for a batch of no examples, whose
    N/B scaling has no B)."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            refuse_several_inputs(batch, epoch, step)  # several tensors, a dict of inputs
            raise TypeError(
                f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} "
                f"is ({type(x).__name__}, {type(y).__name__}). Convert them with "
                "torch.as_tensor(...), or serve them through a TensorDataset."
            )
        if x.dim() and not x.shape[0]:  # (a 0-dim x: the model's input checks speak)
            raise ValueError(
                f"Batch {step} of epoch {epoch} of train_loader holds no examples (x of shape "
                f"{tuple(x.shape)}): its likelihood, scaled by N/B, has no B to scale by, and a "
                "step on it would follow the KL alone. Leave empty batches out of the loader "
                "(a collate_fn or sampler that filters examples may leave none in a batch)."
            )
        # features or targets that require grad (computed with autograd on by a network
        # outside the model, a teacher's soft labels): fit() trains the model, no gradient
        # flows into the data, and the first step's backward would free a graph the batches
        # share (torch: "backward through the graph a second time")
        x, y = (t.detach() if t.requires_grad else t for t in (x, y))
        return x, y
    raise TypeError(
        unbatched_examples(batch, epoch, step)  # a list of dicts: examples, not a batch
        or f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} is "
        + describe_batch(batch)
        + _other_items_hint(batch)
    )


def _other_items_hint(batch: Any) -> str:
    """What to do about a batch of one item, or of more than two (a collate_fn's or a
    dataset's extras: weights, indices)."""
    if isinstance(batch, torch.Tensor) or (isinstance(batch, (tuple, list)) and len(batch) == 1):
        return (
            " The inputs alone? fit() needs the targets too: serve (x, y), e.g. "
            "DataLoader(TensorDataset(x, y), batch_size=64)."
        )
    return other_items_fix(batch)


def warn_of_a_wrong_length(
    served: int, planned: int, epoch: int, epochs: int, schedule: str, loader: Any
) -> bool:
    """Warn that an epoch served another number of batches than ``len(train_loader)`` told
    when fit() planned the learning-rate schedule over it; True (told)."""
    total = epochs * planned
    effect = (
        f"after step {total} the learning rate is 0 and the later steps train nothing"
        if served > planned
        else "the learning rate does not run its planned course (its warm-up or decay is cut short)"
    )
    dataset = getattr(loader, "dataset", None)
    fix = "Make len(train_loader) the number of batches an epoch serves"
    if isinstance(loader, torch.utils.data.DataLoader):
        fix = (
            "A DataLoader over an IterableDataset split over workers serves a partial batch "
            "each: batch inside the dataset (fit() then needs num_data=N)"
            if isinstance(dataset, torch.utils.data.IterableDataset)
            else "A DataLoader's len() is its (batch) sampler's: make the sampler's __len__ the "
            "number of indices (batches) it yields"
        )
    fix += ", or pass lr_schedule='constant'."
    warn_caller(
        f"train_loader served {served} batches in epoch {epoch}, but len(train_loader) was "
        f"{planned}: lr_schedule={schedule!r} planned the learning rate over epochs * "
        f"len(train_loader) = {total} steps, so {effect}. {fix}"
    )
    return True


def check_batch(
    x: torch.Tensor,
    y: torch.Tensor,
    epoch: int,
    step: int,
    likelihood: Any,
    num_outputs: int | None,
) -> None:
    """Refuse a batch with NaN/inf inputs or bad labels before training on it (its (x, y)
    are tensors: :func:`unpack_batch` checked)."""
    if x.dtype.is_floating_point and not bool(torch.isfinite(x).all()):
        bad = bad_rows(x)
        raise ValueError(
            f"Batch {step} of epoch {epoch} holds NaN or inf in {bad.numel()} of {x.shape[0]} "
            f"inputs (rows {bad[:5].tolist()}); training stopped before that batch, so the "
            "parameters are those of the previous step. Clean the data before fit()."
        )
    problem = likelihood.target_problem(y, num_outputs)
    if problem is not None:
        raise ValueError(
            f"Batch {step} of epoch {epoch} has {problem}; training stopped before that batch."
        )


def rng_states(loader: Iterable, loader_state: torch.Tensor | None) -> dict[str, Any]:
    """Random-number states to store: torch's (CPU, CUDA), numpy's and Python's global ones
    (what a dataset's augmentations may draw from in the main process; ``fit(seed=...)``
    seeds them too) and the loader's epoch-start state."""
    states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    states["numpy"] = _numpy_state()
    states["python"] = _python_state()
    if loader_state is not None:
        states["loader"] = loader_state
    return states


def restore_rng_states(states: dict[str, Any], loader: Iterable) -> None:
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():  # (saved with more GPUs: those here)
        torch.cuda.set_rng_state_all(states["cuda"][: torch.cuda.device_count()])
    if "numpy" in states:  # not in checkpoints written before they were stored
        _set_numpy_state(states["numpy"])
    if "python" in states:
        _set_python_state(states["python"])
    if "loader" in states:
        set_loader_rng_state(loader, states["loader"])


def _numpy_state() -> dict[str, Any]:
    """numpy's legacy global state as a checkpoint keeps it (tensors and numbers, which
    ``torch.load(weights_only=True)`` reads back)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # noqa: NPY002
    return {
        "name": str(name),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def _set_numpy_state(state: dict[str, Any]) -> None:
    keys = state["keys"].numpy().astype(np.uint32)
    numpy_state = (state["name"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"])
    np.random.set_state(numpy_state)  # noqa: NPY002


def _python_state() -> dict[str, Any]:
    """Python's ``random`` state as a checkpoint keeps it (its 625 words as a tensor)."""
    version, words, gauss_next = random.getstate()
    return {
        "version": version,
        "words": torch.tensor(words, dtype=torch.int64),
        "gauss_next": gauss_next,
    }


def _set_python_state(state: dict[str, Any]) -> None:
    words = tuple(int(w) for w in state["words"].tolist())
    random.setstate((state["version"], words, state["gauss_next"]))


def _loader_generator(loader: Iterable) -> torch.Generator | None:
    """The generator a torch DataLoader shuffles with, when it was given one
    (``DataLoader(..., generator=g)``, or a sampler's own); without one it draws from torch's
    global state, which the checkpoint stores anyway."""
    if not isinstance(loader, torch.utils.data.DataLoader):
        return None
    generator = loader.generator or getattr(example_sampler(loader), "generator", None)
    return generator if isinstance(generator, torch.Generator) else None


def loader_rng_state(loader: Iterable) -> torch.Tensor | None:
    """The loader's own random state (pyrouq's loaders', or a DataLoader's generator's)."""
    get = getattr(loader, "get_rng_state", None)
    if callable(get):
        return get()  # type: ignore[no-any-return]
    generator = _loader_generator(loader)
    return None if generator is None else generator.get_state()


def set_loader_rng_state(loader: Iterable, state: torch.Tensor) -> None:
    put = getattr(loader, "set_rng_state", None)
    if callable(put):
        put(state)
        return
    generator = _loader_generator(loader)
    if generator is not None:
        generator.set_state(state)


def training_state(
    *,
    epochs: int,
    epochs_done: int,
    epoch_steps: int,
    steps: int,
    sums: torch.Tensor,
    history: list[Any],
    base_lrs: list[float],
    rng: dict[str, Any],
    optimizer: str,
    kl_weight: float,
    batches_per_epoch: int,
    batch_size: int,
    lr_schedule: str,
    num_particles: int,
    vectorize_particles: bool,
    num_data: int,
    world: int,
) -> dict[str, Any]:
    """The ``training`` entry of a checkpoint: Python's own numbers and strings (numpy's
    ``str_``, a subclass, would be unloadable), tensors, lists, dicts; save() skips its
    check of fit()'s (which walked the whole history every epoch). ``world``: the number of
    ranks the run trains on (1: one process), whose shards ``batches_per_epoch`` counts."""
    return {
        "optimizer": str(optimizer),
        "kl_weight": float(kl_weight),
        "batches_per_epoch": int(batches_per_epoch),
        "batch_size": int(batch_size),  # 0: the loader told none
        "lr_schedule": str.__str__(lr_schedule),  # (a str Enum's value, where str() names it)
        "num_particles": int(num_particles),
        "vectorize_particles": bool(vectorize_particles),
        "num_data": int(num_data),
        "world": int(world),
        "version": TRAINING_STATE_VERSION,
        "epochs": int(epochs),
        "epochs_done": int(epochs_done),
        "epoch_steps": int(epoch_steps),
        "steps": int(steps),
        "sums": sums.clone(),
        "history": [asdict(record) for record in history],
        "base_lrs": [float(v) for v in base_lrs],
        "rng": rng,
    }


def step_hits(likelihood: Any, outputs: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """``[correct, counted]`` of one training step's own outputs (the member- or draw-mean
    prediction when they carry leading dims); zeros for models that do not classify or whose
    step recorded no outputs."""
    if (
        outputs is None
        or not isinstance(likelihood, Categorical)
        or outputs.dim() < 2
        or outputs.shape[-1] < 2  # one logit a row (a Bernoulli model's): no argmax to count
    ):
        return torch.zeros(2, device=y.device)
    if outputs.dim() > 2:
        guess = likelihood.predictive(outputs.reshape(-1, *outputs.shape[-2:])).mean(0).argmax(-1)
    else:
        guess = outputs.argmax(-1)
    if guess.shape != y.shape:
        return torch.zeros(2, device=y.device)
    correct = (guess == y).sum()
    return torch.stack([correct, torch.full_like(correct, y.numel())]).float()  # no host copy


def plain_terms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, n: int) -> ELBOTerms:
    """Maximum likelihood for a plain torch network: ``-(N/B) sum_batch log p(y | x)``."""
    likelihood = likelihood_of(model) or Categorical()
    torch.clear_autocast_cache()  # an autocast around fit() would run the first step's casts
    outputs = model(x)
    if not torch.is_tensor(outputs) or outputs.dim() != 2:
        _engine.check_outputs(outputs, model, x.shape[0])  # says what to return instead
    likelihood.check_targets(y, outputs, "fit()")
    nll = likelihood.nll(outputs, y) * (n / max(y.shape[0], 1))
    kl = float32_zero(nll.device)
    return ELBOTerms(loss=nll, nll=nll.detach(), kl=kl, outputs=outputs.detach())


def optimizer_name(optimizer: Any) -> str:
    """The optimizer's class as a dotted path (``torch.optim.sgd.SGD``), as a checkpoint
    records it."""
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"


def resumed_batches(loader: Iterable, skip: int, stop: Callable[[Exception], Any]) -> Iterator:
    """An epoch's iterator over ``loader``, whose failure to fetch one of the batches every
    rank steps on (a dataset's error; any, for a loader without an exact length) goes to
    ``stop``: under torch.distributed it takes part in the step's collective before raising,
    so that the other ranks stop with this one instead of waiting for it until the group's
    timeout. Resuming inside an epoch, its first ``skip`` batches
    (taken by the run being resumed) are fetched and passed over here, with the random
    streams they draw from (a dataset's augmentations) put back, as the run's saved state
    already has their draws. A torch DataLoader without a generator of its own is iterated
    without the draw from torch's stream it makes for its seed: the run being resumed made it
    at the epoch's start, before its saved state (a sampler's own generator then repeats the
    epoch's order, and the draws stay the run's)."""
    stepped = _exact_length(loader)
    if not skip:
        return _fetched(iter(loader), stop, stepped)
    state = torch.get_rng_state()
    batches = iter(loader)
    if isinstance(loader, torch.utils.data.DataLoader) and not loader.generator:
        torch.set_rng_state(state)
    fetched = _fetched(batches, stop, stepped)
    with global_streams_kept():
        for _ in itertools.islice(fetched, skip):
            pass
    return fetched


def _exact_length(loader: Iterable) -> int | None:
    """``len(loader)`` where it counts the batches exactly (a list, pyrouq's loaders, a
    DataLoader over a map-style dataset); None where it may be a hint (an iterable dataset's)."""
    data = torch.utils.data
    exact = isinstance(loader, (list, tuple, ShardedOrder)) or (
        isinstance(loader, data.DataLoader) and not isinstance(loader.dataset, data.IterableDataset)
    )
    return len_or(loader, None) if exact else None


def _fetched(
    batches: Iterator, stop: Callable[[Exception], Any], stepped: int | None
) -> Iterator[Any]:
    """``batches``; a failure to fetch one of the first ``stepped`` (None: any) goes to
    ``stop`` (after the last, the other ranks are in the epoch's end, not in a step)."""
    count = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as err:  # (not a KeyboardInterrupt: fit() stops on it as it is)
            if stepped is None or count < stepped:
                stop(err)
            raise
        count += 1
        yield batch


@contextlib.contextmanager
def whole_data(loader: Iterable) -> Iterator[None]:
    """While inside, a pyrouq loader (which serves this rank's shard while fit() trains under
    torch.distributed) serves the whole data set again, as outside fit(): for the callbacks, so
    that one that predicts on, evaluates or counts the training loader sees what it sees in
    one process, not a ``1 / world`` shard of it, padded and shuffled. A ``DataLoader``'s
    ``DistributedSampler`` is the user's own, and serves its shard in and outside fit()."""
    if not isinstance(loader, ShardedOrder):
        yield
        return
    with loader.sharded(0, 1):
        yield


def running_statistics(model: nn.Module, guide: Any) -> list[torch.Tensor]:
    """The running statistics (and batch counts) of the BatchNorm / InstanceNorm layers of
    ``model`` and of a guide module, which every training forward pass updates: kept before
    each step, so that a step refused for a non-finite loss or an error leaves them as the last
    finite step did."""
    seen: set[int] = set()
    found = []
    owners = [m for m in (model, guide) if isinstance(m, nn.Module)]
    for module in (m for owner in owners for m in owner.modules()):
        if isinstance(module, _NormBase):
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                tensor = getattr(module, name, None)
                if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
                    seen.add(id(tensor))
                    found.append(tensor)
    return found
