"""Private helpers shared across modules: argument checks and module introspection."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import os
import random
import sys
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, get_type_hints

import numpy as np
import pyro
import torch
from torch import Tensor, nn

from pyrouq._dict_batches import dict_batch_fix
from pyrouq._input_dtype import not_floating, takes_indices
from pyrouq._input_kind import not_a_tensor
from pyrouq._numbers import (
    check_at_most,
    finite_float,
    is_integer,
    shown,
    tensor_hint,
    text_hint,
)
from pyrouq._words import article, flag_fix


def check_int(name: str, value: object, minimum: int = 1, hint: str = "") -> int:
    """``value`` as an int ``>= minimum`` and at most ``2**63 - 1`` (torch's int64), or a
    ValueError naming ``name``, the bound and ``value``.

    ``hint`` (what to do) is appended to the message.
    """
    if not is_integer(value) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(
            f"Expected {name} to be {expected}, got {value!r}"
            f"{tensor_hint(value, integer=True)}.{_space(hint)}"
        )
    check_at_most(name, int(value), hint)
    return int(value)


def class_name(obj: object) -> str:
    """The class a message names for ``obj``: a module's own name as ``repr`` shows it (torch's
    class, not the faster subclass the engine's CPU paths swapped in)."""
    if isinstance(obj, nn.Module) and not isinstance(obj, torch.jit.ScriptModule):
        return obj._get_name()
    return type(obj).__name__  # a TorchScript module's _get_name is its source's class


def builder_of(value: object) -> str | None:
    """What ``value`` is and how to build the network from it, when it builds a network rather
    than being one: an ``nn.Module`` class, or a function annotated to return one
    (``torchvision.models.resnet18``, a ``functools.partial`` of it), which a model function
    would run on the inputs (``resnet18(x)`` reads x as its ``weights``); else None."""
    if isinstance(value, type):
        if not issubclass(value, nn.Module):
            return None
        return f"the class {value.__name__}. Build the network: {value.__name__}(...)"
    if isinstance(value, nn.Module) or not callable(value):
        return None
    function = getattr(value, "func", value)  # a functools.partial's function
    try:
        returned = inspect.signature(value).return_annotation
        if isinstance(returned, str):  # postponed (from __future__ import annotations)
            returned = get_type_hints(inspect.unwrap(function)).get("return")
    except (TypeError, ValueError, NameError, AttributeError, SyntaxError):  # none, or unreadable
        return None
    if not (isinstance(returned, type) and issubclass(returned, nn.Module)):
        return None
    name = getattr(function, "__name__", type(value).__name__)
    return (
        f"the function {name}, which builds a {returned.__name__}. Call it to build the "
        f"network: {name}(...)"
    )


MAX_SEED = 2**32 - 1
"""The largest seed every generator pyrouq seeds takes (numpy's, through ``pyro.set_rng_seed``)."""


def check_seed(value: object, where: str) -> int:
    """``value`` as a seed, an int in ``[0, 2**32 - 1]``, or a ValueError saying so."""
    if not is_integer(value) or not 0 <= value <= MAX_SEED:
        raise ValueError(
            f"{where}: expected seed to be an integer in [0, 2**32 - 1], got {value!r}"
            f"{tensor_hint(value, integer=True)}. Pass "
            "e.g. seed=0."
        )
    return int(value)


def check_flag(name: str, value: object) -> bool:
    """``value`` if it is True or False, else a TypeError naming ``name`` and ``value`` (a
    string such as ``"no"`` would otherwise be taken as true)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"Expected {name} to be True or False, got {value!r}. {flag_fix(name, value)}")


def check_count(name: str, value: object, hint: str = "") -> int:
    """Like :func:`check_int` with ``minimum=1``, worded "an integer >= 1" (counts of things)."""
    if not is_integer(value) or value < 1:
        raise ValueError(
            f"Expected {name} to be an integer >= 1, got {value!r}"
            f"{tensor_hint(value, integer=True)}.{_space(hint)}"
        )
    check_at_most(name, int(value), hint)
    return int(value)


def check_positive_float(name: str, value: object, hint: str = "") -> float:
    """``value`` as a finite float ``> 0``, or a ValueError naming ``name`` and ``value``."""
    if (number := finite_float(value)) is None or number <= 0:
        raise ValueError(
            f"Expected {name} > 0 (a finite float), got {shown(value)}{tensor_hint(value)}"
            f"{text_hint(value, name, 0)}.{_space(hint)}"
        )
    return number


def check_held(name: str, value: float, dtype: torch.dtype, whose: str, hint: str) -> None:
    """Refuse a positive float that ``dtype`` cannot hold as one (1e-50 is 0 in float32, 1e40
    inf): a prior of scale 0 or inf, which Pyro or torch would refuse in their own words."""
    held = torch.tensor(value, dtype=dtype, device="cpu").item()  # (under a meta device too)
    if not 0 < held < math.inf:
        raise ValueError(
            f"Expected {name} to be a positive finite {dtype} ({whose}; at most "
            f"{torch.finfo(dtype).max:.3g}), got {value!r}, which {dtype} holds as {held}. {hint}"
        )


def _space(hint: str) -> str:
    return f" {hint}" if hint else ""


def _tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    """The parameters and buffers of ``module``, those of the network it wraps first (a
    converted model's ``.net``: its likelihood's own parameters, registered before it, such as
    a learned noise scale, do not decide where and in which dtype the network computes), and
    of its buffers a Bayesian model's latent weights first (held as buffers: a network whose
    every weight is latent computes in their dtype, not in that of a constant it holds)."""
    net = module._modules.get("net")  # (past PyroModule's hook, which records pyro.module)
    if net is None:
        net = getattr(module, "net", None)
    if isinstance(net, nn.Module) and net is not module:
        yield from net.parameters()
        for site in getattr(module, "_sites", ()):
            try:
                yield net.get_buffer(site)
            except AttributeError:  # (not held as a buffer)
                continue
        yield from net.buffers()
    yield from itertools.chain(module.parameters(), module.buffers())


def module_device(*modules: Any) -> torch.device | None:
    """Device of the first parameter or buffer of the first ``nn.Module`` that has one (a
    converted model's network's first)."""
    for module in modules:
        if isinstance(module, nn.Module):
            for tensor in _tensors(module):
                return tensor.device
    return None


def module_dtype(module: Any) -> torch.dtype | None:
    """Floating dtype of the first floating parameter or buffer of ``module`` (a converted
    model's network's first, its latent weights before its other buffers; None if none)."""
    if isinstance(module, nn.Module):
        for tensor in _tensors(module):
            if tensor.is_floating_point():
                return tensor.dtype
    return None


def model_input(x: Any, module: Any, name: str) -> torch.Tensor:
    """``x`` as ``module`` computes on it: floating inputs of another dtype (float64, float16)
    are cast to the module's dtype; integer, bool and complex inputs are refused, but integer
    ones pass to a network holding an ``nn.Embedding`` / ``nn.EmbeddingBag`` (its indices)."""
    if not torch.is_tensor(x):
        raise TypeError(not_a_tensor(x, name))
    if not x.is_floating_point():
        if takes_indices(x, module):
            return x
        raise TypeError(not_floating(x, module, name))
    dtype = module_dtype(module)
    if dtype is not None and x.dtype != dtype:
        x = x.to(dtype)
    return x


def len_or(loader: Any, default: Any = 0) -> Any:
    """``len(loader)``, or ``default`` for a loader without a length."""
    try:
        return len(loader)
    except (TypeError, NotImplementedError):  # (a sampler of no length raises either)
        return default


def example_sampler(loader: Any) -> Any:
    """The sampler that picks a loader's examples: its batch sampler's (``batch_sampler=``,
    or a ``BatchSampler`` given as ``sampler=`` with ``batch_size=None``), else its own."""
    sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    if sampler is None:  # not `or`: a sampler may be a tensor or an array of indices
        sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, torch.utils.data.BatchSampler):
        sampler = sampler.sampler
    return sampler


class AsItCame:
    """``x`` for each of ``runs`` runs of a network, as it came: a network may change its input
    in place (an in-place activation first), which the next run must not see. One copy is
    taken before the first run and handed out only once ``x`` has changed (told by its version
    counter, or, for an inference-mode tensor, which keeps none, by comparing)."""

    def __init__(self, x: Any, runs: int):
        self.x = x
        self.copy = x.clone() if runs > 1 and torch.is_tensor(x) else None
        self.version = None if self.copy is None or x.is_inference() else x._version

    def changed(self) -> bool:
        """Whether ``x`` has changed since it came (never, for one run: no copy is kept)."""
        if self.copy is None:
            return False
        if self.version is not None:
            return bool(self.x._version != self.version)
        return not torch.equal(self.x, self.copy)

    def __call__(self) -> Any:
        return self.copy.clone() if self.changed() else self.x  # type: ignore[union-attr]


class LayerInputError(ValueError):
    """A BatchEnsemble layer's refusal of its input (:meth:`of`), holding the layer
    (``layer``), its class and settings (``label``: what the message names) and what follows
    them (``detail``). The engine's run of a converted network re-raises it as a ValueError
    that also names the layer's dotted paths in the model (``_engine._layer_errors.LayersNamed``).
    It is built from one message as a ValueError is (Pyro's trace and a DataLoader worker
    re-raise an error as ``type(error)(message)``): one built so holds no layer (``None``)."""

    input_detail: str | None = None  # ``detail`` where it was given the model's input (first)

    def __init__(
        self,
        *args: Any,
        layer: nn.Module | None = None,
        label: str | None = None,
        detail: str | None = None,
    ):
        self.layer, self.label, self.detail = layer, label, detail
        super().__init__(*args)

    @classmethod
    def of(cls, layer: nn.Module, detail: str) -> LayerInputError:
        """The refusal of ``layer``: its class and settings, then ``detail``."""
        try:
            settings = layer.extra_repr()
        except Exception:  # (a subclass's own extra_repr failing: its settings unsaid)
            settings = "..."
        label = f"{type(layer).__name__}({settings})"
        return cls(f"{label} {detail}", layer=layer, label=label, detail=detail)

    def __reduce__(self) -> Any:  # pickled without the layer (its label, detail and notes kept)
        state = {k: v for k, v in self.__dict__.items() if k != "layer"}
        return type(self), self.args, state


def check_folded_batch(
    layer: Any, x: torch.Tensor, members: int, folded: int | None = None
) -> None:
    """Refuse an input to a BatchEnsemble layer whose first dim is not M * B: a multiple of M
    (of ``folded``, the M * B inputs of a BatchEnsemble network's run, when given: inputs
    merged into the batch, windows or tokens, keep it a multiple)."""
    unit = folded if folded is not None else members
    if x.dim() == 0 or x.shape[0] % unit:
        fix = (
            "Inside a BatchEnsemble network the members' folded batch must stay on dim 0 of "
            "every converted layer's input (only the linear layers and norms of a "
            "batch_first=False transformer layer, and the final norm of a stack of them, take "
            "it on dim 1): keep it there in the network's forward."
            if folded is not None
            else "Run it inside a model made by pyrouq.batchensemble(), which repeats the "
            "input once per member."
        )
        what = f"M * B = {folded}" if folded is not None else str(members)
        raise LayerInputError.of(
            layer,
            f"with {members} members expects a folded batch of M * B inputs (member-major), got "
            f"shape {tuple(x.shape)}, whose first dim is not a multiple of {what}. {fix}",
        )


def bad_rows(x: torch.Tensor) -> torch.Tensor:
    """Indices of the rows of ``x`` holding NaN or inf."""
    flat = x.reshape(x.shape[0], -1)
    return (~torch.isfinite(flat)).any(dim=1).nonzero().flatten()


def check_finite_inputs(
    x: torch.Tensor, caller: str, name: str = "x", first: int | None = None
) -> None:
    """Refuse floating inputs holding NaN or inf: the outputs on them would be NaN. ``x`` is
    all of ``name``, or (``first``) its batch whose first input is ``name``'s input ``first``:
    the rows named are then ``name``'s."""
    if x.is_floating_point() and x.numel() and not bool(torch.isfinite(x).all()):
        bad = bad_rows(x)
        where = f"{bad.numel()} of {x.shape[0]} inputs"
        if first is not None:
            bad = bad + first
            where = f"{bad.numel()} of the {x.shape[0]} inputs of its batch from input {first}"
        raise ValueError(
            f"{caller}: {name} holds NaN or inf in {where} (rows {bad[:5].tolist()}), whose "
            "outputs would be NaN. Remove or repair them (torch.nan_to_num, or drop the rows) "
            "first."
        )


def forward_inputs(module: nn.Module) -> list[inspect.Parameter] | None:
    """The positional parameters of ``module.forward`` (``*args`` included), or None where its
    signature cannot be read."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    return [p for p in params if p.kind in positional]


def takes_labels(model: nn.Module) -> bool:
    """Whether ``model.forward`` can take a second positional argument (labels ``y``: a Pyro
    model written as an ``nn.Module``), or its signature cannot be read (then it is given the
    benefit of the doubt)."""
    inputs = forward_inputs(model)
    return inputs is None or len(inputs) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in inputs)


def has_latent_sites(model: Any) -> bool:
    """Whether ``model`` is a pyrouq model with latent sites (``latent_sites()`` non-empty)."""
    sites = getattr(model, "latent_sites", None)
    return bool(sites()) if callable(sites) else False


class ShardedOrder:
    """What pyrouq's in-memory loaders share: the order of one epoch, drawn from the loader's
    own generator, and, while :meth:`sharded` is active (``fit()`` under torch.distributed),
    this rank's share of it: every rank draws the same permutation and takes every
    ``world``-th index from position ``rank``. The shards are disjoint and of one size,
    ``ceil(n / world)``: when ``world`` does not divide ``n``, the order is first lengthened
    by repeating its first few indices (as torch's ``DistributedSampler`` pads), so that every
    rank takes as many steps as the others."""

    _rank, _world = 0, 1

    @contextlib.contextmanager
    def sharded(self, rank: int, world: int) -> Iterator[None]:
        """Serve rank ``rank`` of ``world`` its shard while inside."""
        previous = (self._rank, self._world)
        self._rank, self._world = rank, world
        try:
            yield
        finally:
            self._rank, self._world = previous

    def _order(self, n: int, shuffle: bool, generator: torch.Generator) -> torch.Tensor | None:
        """This epoch's indices (None: ``0..n-1`` in order, unsharded)."""
        if shuffle:
            order: torch.Tensor | None = torch.randperm(n, generator=generator, device="cpu")
        else:
            order = torch.arange(n, device="cpu") if self._world > 1 else None
        if order is None or self._world == 1:
            return order
        padding = self._local_size(n) * self._world - n
        if padding:
            order = torch.cat([order, order.repeat(-(-padding // n))[:padding]])
        return order[self._rank :: self._world]

    def _local_size(self, n: int) -> int:
        """How many of ``n`` examples this rank serves per epoch (:func:`shard_size`)."""
        return shard_size(n, self._world)

    @staticmethod
    def _rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``t[index]`` (``index`` 1-d, on ``t``'s device), by ``index_select`` where ``t`` is
        contiguous (the same values and layout; a shuffled MNIST pass at batch 128 2-2.6x
        faster on CPU); a permuted ``t`` (channels-last) keeps ``t[index]``, which keeps it."""
        return t.index_select(0, index) if t.is_contiguous() else t[index]


def shard_size(n: int, world: int) -> int:
    """How many of ``n`` examples each of ``world`` ranks serves per epoch, ``ceil(n / world)``:
    :class:`ShardedOrder`'s shards (padded as torch's ``DistributedSampler`` pads them)."""
    return -(-n // world)


def _library_dirs() -> tuple[str, ...]:
    """Where pyrouq, torch and Pyro live (and ``contextlib``): the frames that
    :func:`warn_caller` passes over on its way to the user's line."""
    files = (os.path.dirname(__file__), os.path.dirname(torch.__file__), pyro.__path__[0])
    return (*(os.path.abspath(f) + os.sep for f in files), os.path.abspath(contextlib.__file__))


def warn_caller(message: str | Warning, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside pyrouq, torch
    and Pyro (the user's line), however deep inside them it is raised (a module's ``__call__``,
    a ``fit()`` step). A ``message`` that is a warning is warned as it is, of its class."""
    skipped = _library_dirs()
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of this function
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(skipped):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level)


def warn_of_a_shard(loader: Any, caller: str) -> None:
    """Warn when ``loader`` serves one rank's share of its dataset (a ``DistributedSampler``
    of several replicas): what ``caller`` computes from it is that share's."""
    sampler = example_sampler(loader)
    if isinstance(sampler, torch.utils.data.DistributedSampler) and sampler.num_replicas > 1:
        size = len(sampler.dataset)  # type: ignore[arg-type]
        evened = sampler.total_size - size  # examples repeated (> 0) or left out (< 0)
        how = (
            f", {evened} repeated to even the shares" if evened > 0
            else f", {-evened} in no share" if evened < 0 else ""
        )  # fmt: skip
        warn_caller(
            f"{caller}: x's DistributedSampler serves rank {sampler.rank}'s share of "
            f"{sampler.num_replicas} ({len(sampler)} of {size} examples{how}): the predictions, "
            "and the figures evaluated on them, are that share's. To predict the whole set, "
            "pass DataLoader(dataset, batch_size)."
        )


def describe_batch(batch: Any, needs_labels: bool = True) -> str:
    """What a loader yielded instead of ``(x, y)`` pairs, with the fix for a dict: for the
    error messages of :func:`pyrouq.fit` and :func:`pyrouq.predict` (``needs_labels=False``: it
    takes batches of inputs alone)."""
    if isinstance(batch, Mapping):
        return dict_batch_fix(batch, needs_labels)
    size = f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""
    name = type(batch).__name__
    return f"{article(name)} {name}{size}."


def other_items_fix(batch: Any) -> str:
    """The fix for a batch of more than two items (a collate_fn's or a dataset's extras:
    weights, indices), which :func:`pyrouq.fit` and :func:`pyrouq.predict` refuse: serve the
    ``(x, y)`` both read; "" for another batch."""
    if not isinstance(batch, (tuple, list)) or len(batch) <= 2:
        return ""
    return (
        f" Serve (x, y) without the other {len(batch) - 2} item(s): DataLoader(..., "
        "collate_fn=first_two) with a function of your module, def first_two(items): return "
        "torch.utils.data.default_collate(items)[:2] where x and y come first (pick their "
        "places otherwise; worker processes need it by name)."
    )


def rng_state(device: torch.device | None) -> tuple[Tensor, Tensor | None]:
    """The torch CPU RNG state and, on an accelerator, the state of ``device``'s generator."""
    if device is not None and device.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(device)
    if device is not None and device.type == "mps":
        return torch.get_rng_state(), torch.mps.get_rng_state()
    return torch.get_rng_state(), None


@contextlib.contextmanager
def global_streams_kept(device: torch.device | None = None) -> Iterator[None]:
    """torch's CPU generator, numpy's and Python's global ones and, given a ``device`` on an
    accelerator, its generator put back as they were after the block: what it draws (a
    callback, a dataset's augmentations, a chain) changes no later draw."""
    kept = rng_state(device), np.random.get_state(), random.getstate()  # noqa: NPY002
    try:
        yield
    finally:
        set_rng_state(device, kept[0])
        np.random.set_state(kept[1])  # noqa: NPY002
        random.setstate(kept[2])


def seed_generators(device: torch.device | None, seed: int) -> None:
    """Seed the generators :func:`rng_state` takes (the CPU's and ``device``'s; not every CUDA
    device's, as ``torch.manual_seed`` does, which would change, or queue a change of,
    generators the caller may be using)."""
    torch.default_generator.manual_seed(seed)
    if device is None or device.type == "cpu":
        return
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)
    elif device.type == "mps":
        torch.mps.manual_seed(seed)
    else:  # other accelerators: as torch does
        torch.manual_seed(seed)


def set_rng_state(device: torch.device | None, state: tuple[Tensor, Tensor | None]) -> None:
    """Restore a state :func:`rng_state` took."""
    torch.set_rng_state(state[0])
    if state[1] is not None and device is not None:
        if device.type == "cuda":
            torch.cuda.set_rng_state(state[1], device)
        else:
            torch.mps.set_rng_state(state[1])


#: A module's hook tables (what ``register_*_hook`` fills).
HOOK_TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def has_hooks(module: nn.Module) -> bool:
    """Whether a user registered a forward, pre-forward or backward hook on ``module``."""
    return any(getattr(module, table, None) for table in HOOK_TABLES)


def carry_hooks(old: nn.Module, new: nn.Module) -> None:
    """Give ``new`` (what replaces ``old`` in a network) ``old``'s hooks."""
    for table in (*HOOK_TABLES, "_is_full_backward_hook"):
        if hasattr(old, table):
            setattr(new, table, getattr(old, table))


def modes(model: Any) -> list[tuple[nn.Module, bool]]:
    """Every submodule of ``model`` with its ``training`` flag (none for a non-module), for
    :func:`restore_modes`: ``model.eval()`` then ``model.train()`` would turn a BatchNorm the
    user keeps in eval mode back to training."""
    return [(m, m.training) for m in model.modules()] if isinstance(model, nn.Module) else []


def restore_modes(saved: list[tuple[nn.Module, bool]]) -> None:
    """Put back the ``training`` flags :func:`modes` took."""
    for module, training in saved:
        module.training = training
