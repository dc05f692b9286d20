"""What ``fit()`` needs besides the ELBO: the first look at the data (number of classes, lazily
built guides), the optimizer, input checks, Ctrl-C handling, resume state."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from torch import nn

from pyrouq._own_models import check_traces_match
from pyrouq._util import (
    bad_rows,
    describe_batch,
    example_sampler,
    has_latent_sites,
    model_input,
    modes,
    module_device,
    restore_modes,
    warn_caller,
)
from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork
from pyrouq.infer._adam import Adam
from pyrouq.infer.elbo import ELBOTerms
from pyrouq.infer.guide import MeanFieldGuide
from pyrouq.likelihoods import Categorical

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
    """

    def __init__(self, result: Any, checkpoint: Path | None, epoch: int, step: int):
        self.result = result
        self.checkpoint = checkpoint
        self.epoch = epoch
        self.step = step
        where = (
            f"; the partial run is saved at {str(checkpoint)!r} (resume with "
            "fit(..., resume_from=that path))"
            if checkpoint is not None
            else "; pass checkpoint=PATH to fit() to save partial runs"
        )
        super().__init__(
            f"Training interrupted in epoch {epoch} after step {step}: the model and guide keep "
            f"the parameters of that step{where}."
        )


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
            batch_size = getattr(loader, "batch_size", None)
            shuffled = bool(getattr(loader, "shuffle", True))
            first = int(bad[0])
            where = (
                f" (the first in batch {first // batch_size + 1} of every epoch)"
                if batch_size and not shuffled
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


def items_are_batches(loader: Iterable) -> bool:
    """Whether ``loader`` is a torch DataLoader with automatic batching off
    (``batch_size=None`` and no batch sampler): it serves its dataset's items as they are, the
    batches of a dataset of pre-made batches, so ``len(dataset)`` does not count examples."""
    data = torch.utils.data
    if not isinstance(loader, data.DataLoader) or loader.batch_size is not None:
        return False
    if loader.batch_sampler is not None:
        return False
    if isinstance(loader.dataset, data.IterableDataset):
        return True  # it yields its items as they are
    # torch's samplers of single indices: dataset[i], an item (a sampler of lists of indices,
    # a batch sampler of one's own, fetches dataset[[i, j, ...]]: examples)
    return type(loader.sampler) in (
        data.SequentialSampler,
        data.RandomSampler,
        data.SubsetRandomSampler,
        data.WeightedRandomSampler,
        data.DistributedSampler,
    )


def serves_dataset_as_is(loader: Iterable) -> bool:
    """Whether the loader's batches are its dataset's examples, every one of them (over the
    epochs), as they are: not a torch ``DataLoader`` with a ``collate_fn`` of its own (which
    may scale, reshape or relabel them), a sampler that leaves examples out (a subset's), or
    ``drop_last`` that never serves the same last ones."""
    data = torch.utils.data
    if not isinstance(loader, data.DataLoader):
        return True
    if items_are_batches(loader):
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
    if isinstance(tensors, tuple) and len(tensors) >= 2:
        if isinstance(tensors[0], torch.Tensor) and isinstance(tensors[1], torch.Tensor):
            return tensors[0], tensors[1]
    return None


def unpack_batch(batch: Any, epoch: int, step: int) -> tuple[Any, Any]:
    """``(x, y)`` of a training batch, or a TypeError naming what the loader yielded."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError(
                f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} "
                f"is ({type(x).__name__}, {type(y).__name__}). Convert them with "
                "torch.as_tensor(...), or serve them through a TensorDataset."
            )
        return x, y
    raise TypeError(
        f"train_loader must yield (x, y) tensor pairs; batch {step} of epoch {epoch} is "
        + describe_batch(batch)
    )


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
    """Random-number states to store: torch's (CPU, CUDA) and the loader's epoch-start state."""
    states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    if loader_state is not None:
        states["loader"] = loader_state
    return states


def restore_rng_states(states: dict[str, Any], loader: Iterable) -> None:
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "loader" in states:
        set_loader_rng_state(loader, states["loader"])


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
    num_data: int,
) -> dict[str, Any]:
    """The ``training`` entry of a checkpoint (tensors, numbers, strings, lists, dicts)."""
    return {
        "optimizer": optimizer,
        "kl_weight": kl_weight,
        "batches_per_epoch": batches_per_epoch,
        "batch_size": batch_size,  # 0: the loader told none
        "lr_schedule": lr_schedule,
        "num_particles": num_particles,
        "num_data": num_data,
        "version": TRAINING_STATE_VERSION,
        "epochs": epochs,
        "epochs_done": epochs_done,
        "epoch_steps": epoch_steps,
        "steps": steps,
        "sums": sums.clone(),
        "history": [asdict(record) for record in history],
        "base_lrs": list(base_lrs),
        "rng": rng,
    }


class OwnTargets:
    """The likelihood fit() assumes for a Pyro model of the user's own that has real-valued
    targets (a regression written in Pyro, as in Pyro's Bayesian-regression tutorial): the
    targets are the model's to judge (its distributions validate them), and there is no
    training accuracy to count."""

    def target_problem(self, y: torch.Tensor, num_outputs: int | None) -> str | None:
        return None


class Probe:
    """What fit learns from a couple of training examples (a Pyro model of the user's own:
    from the loader's first batch) before it builds the optimizer: the number of classes of
    a model that does not state it (for the label checks), and the parameters created on the
    first call, by a guide (Pyro's autoguides) or by a Pyro model of the user's own
    (``pyro.param`` in its forward); such a model's sites are checked against the guide's."""

    def __init__(self, model: nn.Module, guide: Any, loader: Iterable):
        self.likelihood: Any = getattr(model, "likelihood", None) or Categorical()
        self.num_classes: int | None = getattr(model, "num_classes", None)
        self.created_params: list[torch.Tensor] = []
        categorical = isinstance(self.likelihood, Categorical)
        needs_classes = self.num_classes is None or not categorical  # D of a regression too
        lazy_guide = guide is not None and not isinstance(guide, MeanFieldGuide)
        # a Pyro model of the user's own: does it scale its likelihood by N/B?
        foreign = own_pyro_model(model, guide)
        if not (needs_classes or lazy_guide or foreign):
            return
        # a user's model may run on whole batches only (pyro.plate("data", N) over a batch of
        # all N): it is probed on the loader's first batch, the others on two examples
        batch = _first_batch(loader) if foreign else _first_examples(loader)
        if batch is None:
            return
        device = module_device(model, guide)
        x, y = (t.to(device) if device is not None else t for t in batch)
        if foreign and getattr(model, "likelihood", None) is None and y.dtype.is_floating_point:
            self.likelihood = OwnTargets()
        x = model_input(x, model, "fit()")
        was = modes(model)
        model.eval()
        try:
            with torch.no_grad(), pyro.validation_enabled(False):
                if needs_classes:
                    try:
                        self.num_classes = _output_size(model, x, self.likelihood, foreign)
                    except RuntimeError as err:  # torch's own message, e.g. a shape mismatch
                        raise ValueError(
                            f"fit(): {type(model).__name__} failed on the first examples of "
                            f"train_loader (x of shape {tuple(x.shape)}, dtype {x.dtype}): "
                            f"{' '.join(str(err).split())}. Check that the network takes the "
                            "loader's inputs (shape, channels, flattening); nothing was trained."
                        ) from err
            if foreign:
                _check_scaled(model, x, y)
            if lazy_guide:
                with poutine.trace(param_only=True) as capture, poutine.block(hide=["obs"]):
                    guide(x, y)
                self.created_params = _unconstrained(capture.trace)
            if foreign:
                self.created_params += _own_model_params(model, guide, x, y)
        finally:
            restore_modes(was)


def _unconstrained(trace: Any) -> list[torch.Tensor]:
    """The tensors an optimizer updates of the ``pyro.param`` sites of a param-only trace."""
    return [site["value"].unconstrained() for site in trace.nodes.values()]


def _own_model_params(model: nn.Module, guide: Any, x: torch.Tensor, y: torch.Tensor) -> list:
    """The parameters a Pyro model of the user's own creates with ``pyro.param`` as it runs
    (trained with the rest, as Pyro's SVI does), once its sites are checked against the
    guide's: a latent site the guide lacks or gives another shape is refused here."""
    try:
        guide_trace = poutine.trace(guide).get_trace(x, y) if guide is not None else None
        run = model if guide_trace is None else poutine.replay(model, trace=guide_trace)
        with poutine.trace(param_only=True) as capture:
            model_trace = poutine.trace(run).get_trace(x, y)
    except Exception as err:
        raise ValueError(
            f"fit(): {type(model).__name__} and its guide failed on the first batch of "
            f"train_loader (x of shape {tuple(x.shape)}), run as model(x, y) replayed on "
            f"guide(x, y) to check their sites: {type(err).__name__}: "
            f"{' '.join(str(err).split())}. Nothing was trained."
        ) from err
    if guide_trace is not None:
        check_traces_match(model_trace, guide_trace, "fit()", model)
    return _unconstrained(capture.trace)


def _check_scaled(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Warn when a Pyro model of the user's own observes a minibatch without the factor N/B
    (``pyro.plate("data", B)`` instead of ``pyro.plate("data", N, subsample_size=B)``): its
    likelihood then counts as if the batch were the whole data set, and the KL outweighs it
    N/B times. ``x, y``: the loader's first batch (one of the whole data set needs none)."""
    num_data = getattr(model, "num_data", None)
    if not num_data or num_data <= x.shape[0]:
        return
    try:
        trace = poutine.trace(model).get_trace(x, y)
    except Exception:  # the model's own errors surface, with their context, in the first step
        return
    observed = [
        site
        for site in trace.nodes.values()
        if site["type"] == "sample" and site["is_observed"] and not site_is_subsample(site)
    ]
    if observed and all(_is_one(site["scale"]) for site in observed):
        warn_caller(
            f"fit(): {type(model).__name__} observes its targets without the factor N/B: on "
            f"{x.shape[0]} of N = {num_data} examples the likelihood's scale is 1, so every "
            "minibatch counts as the whole data set and the KL outweighs it N/B times. Observe "
            "them inside pyro.plate('data', self.num_data, subsample_size=len(x)) (fit() sets "
            "model.num_data), or under poutine.scale(scale=self.num_data / len(x))."
        )


def _is_one(scale: Any) -> bool:
    """Whether a site's scale is 1 (a number, or a tensor of per-example weights)."""
    if torch.is_tensor(scale):
        return bool((scale == 1).all())
    return float(scale) == 1.0


def _first_examples(loader: Iterable) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two training examples ``(x, y)`` as a batch, read without disturbing the loader."""
    dataset = getattr(loader, "dataset", None) if serves_dataset_as_is(loader) else None
    try:
        items = [dataset[i] for i in range(min(2, len(dataset)))]  # type: ignore[index, arg-type]
        xs = torch.stack([torch.as_tensor(item[0]) for item in items])
        ys = torch.stack([torch.as_tensor(item[1]) for item in items])
        return xs, ys
    except Exception:
        pass
    batch = _first_batch(loader)
    if batch is None:
        return None
    x, y = batch
    return x[:2], y[:2]


def _first_batch(loader: Iterable) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The loader's first batch ``(x, y)``, read without disturbing the loader (its random
    state put back where it has one)."""
    state = loader_rng_state(loader)
    try:
        batch = next(iter(loader))
    except (StopIteration, TypeError, ValueError):
        return None
    finally:
        if state is not None:
            set_loader_rng_state(loader, state)
    x, y = unpack_batch(batch, 1, 1)  # what the first step would refuse, refused now
    return x, y


def own_pyro_model(model: Any, guide: Any) -> bool:
    """Whether ``model`` is a Pyro model of the user's own: a ``PyroModule``, or an
    ``nn.Module`` given with a guide (as in Pyro's VAE tutorial), not one of pyrouq's (nor one
    of pyrouq's wrapped by ``torch.compile`` or ``nn.DataParallel``)."""
    if is_pyrouq_model(model):
        return False
    return isinstance(model, pyro.nn.PyroModule) or (
        guide is not None and isinstance(model, nn.Module)
    )


def is_pyrouq_model(model: Any) -> bool:
    """Whether ``model`` is a converted pyrouq model, perhaps inside ``torch.compile``'s or
    ``nn.DataParallel``'s wrapper."""
    while True:
        if isinstance(model, (BayesianNetwork, BatchEnsembleNetwork)):
            return True
        inner = getattr(model, "_orig_mod", None)  # torch.compile
        if inner is None and isinstance(
            model, nn.DataParallel | nn.parallel.DistributedDataParallel
        ):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return False
        model = inner


def _output_size(model: Any, x: torch.Tensor, likelihood: Any, own: bool) -> int | None:
    """The number of outputs D of ``model`` on ``x`` (classes, or regression targets), after
    the likelihood has seen the outputs (it sizes a learned noise scale)."""
    run = getattr(model, "outputs", None)
    if callable(run) and has_latent_sites(model):
        out = run(x, model.template())
    elif callable(run):
        out = run(x)
    elif not own and not isinstance(model, pyro.nn.PyroModule):
        out = model(x)
    else:
        return None
    if not torch.is_tensor(out) or out.dim() < 2:
        return None
    likelihood.prepare(out)
    size = getattr(likelihood, "num_outputs", None)
    return int(size(out)) if callable(size) else int(out.shape[-1])


def build_optimizer(model: nn.Module, guide: Any, probe: Probe, optim: Any, lr: float) -> Any:
    params: list[torch.Tensor] = list(model.parameters())
    if isinstance(guide, nn.Module):
        params += list(guide.parameters())
    seen: set[int] = set()
    unique = []
    for p in params + probe.created_params:
        if id(p) not in seen and p.requires_grad:  # frozen parameters stay as they are
            seen.add(id(p))
            unique.append(p)
    if not unique:
        frozen = any(not p.requires_grad for p in params)
        raise ValueError(
            f"Nothing to train: {type(model).__name__} and the guide have "
            + (
                "only frozen parameters (requires_grad=False), which fit() leaves as they "
                "are. Unfreeze the ones to train (module.requires_grad_(True))."
                if frozen
                else "no parameters."
            )
        )
    if optim is None:
        return Adam(unique, lr=lr)
    example = "e.g. optim=lambda params: torch.optim.AdamW(params, lr=1e-3)"
    if isinstance(optim, pyro.optim.PyroOptim):
        raise TypeError(
            f"optim got a Pyro optimizer ({type(optim).__name__}), which wraps one for "
            f"pyro.infer.SVI; fit() takes a function building a torch optimizer, {example}."
        )
    if isinstance(optim, torch.optim.Optimizer) or not callable(optim):
        raise TypeError(
            f"optim got {_an(optim)}; fit() takes a function building a torch optimizer from "
            f"the parameters it trains (which it gathers), {example}."
        )
    optimizer = optim(unique)
    if not hasattr(optimizer, "param_groups") or not callable(getattr(optimizer, "step", None)):
        raise TypeError(
            f"optim returned {_an(optimizer)}, expected a torch optimizer (a "
            f"torch.optim.Optimizer), {example}."
        )
    return optimizer


def _an(value: Any) -> str:
    """How an error names a value it did not expect."""
    if isinstance(value, torch.optim.Optimizer):
        return f"a built {type(value).__name__} optimizer"
    return "None" if value is None else f"an object of type {type(value).__name__}"


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
    likelihood = getattr(model, "likelihood", None) or Categorical()
    outputs = model(x)
    if not torch.is_tensor(outputs) or outputs.dim() != 2:
        shown = f"outputs of shape {tuple(outputs.shape)}" if torch.is_tensor(outputs) else ""
        raise TypeError(
            f"{type(model).__name__} returned {shown or type(outputs).__name__}; fit() trains "
            "a plain network that returns its outputs (B, D) as one tensor."
        )
    likelihood.check_targets(y, outputs, "fit()")
    nll = likelihood.nll(outputs, y) * (n / max(y.shape[0], 1))
    kl = torch.zeros((), device=nll.device)
    return ELBOTerms(loss=nll, nll=nll.detach(), kl=kl, outputs=outputs.detach())


def optimizer_name(optimizer: Any) -> str:
    """The optimizer's class as a dotted path (``torch.optim.sgd.SGD``), as a checkpoint
    records it."""
    cls = type(optimizer)
    return f"{cls.__module__}.{cls.__qualname__}"
