"""Whether a forward calls its layers or reads their weights as tensors: a BatchEnsemble's
forward that reads a layer's weight or bias as a tensor bypasses the members' factors (a warning
on the first run) or meets the per-member biases (a note on the shape error it raises); local
reparameterisation draws whole a layer whose weight a forward reads (:func:`tensor_reads`); a
forward that runs them inside ``torch.utils.checkpoint`` is refused where the backward pass
would run them with other weights, and one that runs layers holding latent weights only
under ``torch.no_grad()`` is warned of (:func:`recompute_checked`, :class:`NoGradLayersWarning`);
:func:`call` names a layer refusing its input (:class:`~pyrouq._engine._layer_errors.LayersNamed`).
Also two small helpers of the engine's runs: :func:`check_draw_shapes` and :func:`noise_scale`."""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from types import FrameType
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from pyrouq._engine._layer_errors import LayersNamed
from pyrouq._mismatch import torch_words
from pyrouq._util import class_name, warn_caller

_lock = threading.Lock()
_depth = 0  # networks running with the fast path off (nested, or in other threads)
_found = True  # the setting the first of them found


FUSED_ATTENTION: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer, nn.MultiheadAttention)
"""The modules of torch's fused attention kernels (``torch.backends.mha``'s fast path)."""


@contextlib.contextmanager
def layers_called(
    net: nn.Module, kinds: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer,)
) -> Iterator[None]:
    """PyTorch's fused transformer layer (``nn.TransformerEncoderLayer`` in eval mode without
    gradients) reads its linear layers' weights and biases as tensors instead of calling the
    layers, which would bypass the BatchEnsemble layers (and meet their per-member biases): it
    is switched off while ``net`` runs, where ``net`` holds a module of ``kinds``, so every
    layer is called (:data:`FUSED_ATTENTION`: ``nn.MultiheadAttention``'s fused kernel too,
    for a vmap pass with gradients, inside which torch cannot tell that the draws require
    them, and would run kernels that have no backward). The switch is process-wide: the first
    of nested or concurrent (threads) runs turns it off and the last one out puts back what
    the first found."""
    global _depth, _found
    mha = getattr(torch.backends, "mha", None)
    # (no kinds: nothing to switch, no walk of the modules: a predict() with vmap passes none)
    if mha is None or not kinds or not any(isinstance(m, kinds) for m in net.modules()):
        yield
        return
    with _lock:
        if _depth == 0:
            _found = mha.get_fastpath_enabled()
            mha.set_fastpath_enabled(False)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                mha.set_fastpath_enabled(_found)


_CALLS_CHECKED = "_pyrouq_calls_checked"
"""Attribute :func:`calls_checked` sets on a network after its first successful run: the
names of the BatchEnsemble layers that run did not call (empty: it called every one)."""


@contextlib.contextmanager
def calls_checked(net: nn.Module, key: Hashable = None) -> Iterator[None]:
    """On a network's first successful run, warn if some of its BatchEnsemble layers were not
    called: a forward that reads a layer's weight as a tensor (``F.linear(x, self.fc.weight)``)
    meets the shared W and no member's factors, so the members do not differ there. A forward
    running modules inside ``torch.utils.checkpoint`` is refused where the backward pass would
    run them otherwise (:func:`recompute_checked`, ``key``: the way the members run)."""
    with recompute_checked(net, key=key), _calls_checked(net):
        yield


@contextlib.contextmanager
def _calls_checked(net: nn.Module) -> Iterator[None]:
    """:func:`calls_checked`'s check of the BatchEnsemble layers called."""
    checked = getattr(net, _CALLS_CHECKED, None)
    if checked is not None:  # a later run: no hooks, but a failure still gets its note
        try:
            yield
        except RuntimeError as error:  # a shape error: the layers the first run skipped
            if isinstance(checked, list) and checked and _shape_error(error):
                _note_uncalled(error, checked)
            raise
        return
    called: set[str] = set()
    layers = [
        (name, m) for name, m in net.named_modules() if getattr(m, "_is_batchensemble", False)
    ]
    handles = [
        m.register_forward_pre_hook(lambda *_, name=name: called.add(name)) for name, m in layers
    ]
    try:
        yield
    except RuntimeError as error:  # a shape error where a forward met per-member biases?
        missed = [name for name, _ in layers if name not in called]
        if missed:
            _note_uncalled(error, missed)
        raise
    finally:
        for handle in handles:
            handle.remove()
    missed = [name for name, _ in layers if name not in called]
    setattr(net, _CALLS_CHECKED, missed)
    if missed:
        warn_caller(
            f"{len(missed)} of the network's {len(layers)} BatchEnsemble layers were not called "
            f"in its forward: {_names(missed)}. "
            "The members do not differ there. If the forward reads a layer's weight or bias as "
            "a tensor (e.g. F.linear(x, self.fc.weight, self.fc.bias)), call the layer instead "
            "(self.fc(x)): its bias is per member, (M, out), and fails on most batch sizes; a "
            "layer the forward does not use (an auxiliary head) can be left as it is."
        )


def _shape_error(error: RuntimeError) -> bool:
    """Whether ``error`` reads as torch's shape mismatch (not, say, running out of memory):
    torch's own words, before the failing layer was added (its settings may say "size")."""
    text = torch_words(error).lower()
    return "size" in text or "shape" in text


def _note_uncalled(error: RuntimeError, missed: list[str]) -> None:
    """Add to ``error`` (a forward's failure) the BatchEnsemble layers it did not call."""
    note = (
        "pyrouq: the forward failed before calling these BatchEnsemble layers: "
        f"{_names(missed)}. If it reads a layer's bias as a tensor (e.g. "
        "F.linear(x, self.fc.weight, self.fc.bias), as some attention modules do), it "
        "meets that layer's per-member biases, shaped (M, out): call the layer instead "
        "(self.fc(x))."
    )
    if sys.version_info < (3, 11):  # no exception notes
        raise RuntimeError(f"{error}\n{note}") from error
    error.add_note(note)


def _names(names: list[str], shown: int = 5) -> str:
    """The first ``shown`` of ``names``, comma-separated, with ', ...' when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


_RECOMPUTE_CHECKED: weakref.WeakKeyDictionary[nn.Module, frozenset[Hashable]] = (
    weakref.WeakKeyDictionary()
)
"""What :func:`recompute_checked` settled for each network: the keys (the network's mode, the
way a BatchEnsemble's members run) of its runs with gradients that ran nothing inside
``torch.utils.checkpoint`` that the backward pass would compute otherwise. Kept beside the
network, not on it: a deep copy (``bayesian(model.plain_network())``) is checked again."""

_checking: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pyrouq_recompute_checking", default=False
)
_watching = contextvars.ContextVar("pyrouq_no_grad_watched", default=False)


@contextlib.contextmanager
def no_grad_watched() -> Iterator[None]:
    """Runs inside it are watched for layers holding latent weights run only under
    ``torch.no_grad()`` (:func:`recompute_checked`) in eval mode too: mcmc()'s first pass,
    as NUTS runs the network in eval mode and differentiates it there."""
    token = _watching.set(True)
    try:
        yield
    finally:
        _watching.reset(token)


def _outer_frames() -> set[FrameType]:
    """The frames of the calls that lead to the caller's (the run's callers)."""
    frames: set[FrameType] = set()
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        frames.add(frame)
        frame = frame.f_back
    return frames


def _inside_checkpoint(frame: FrameType | None, outer: set[FrameType]) -> bool:
    """Whether a frame from ``frame`` up to the run's callers (``outer``) runs code of
    ``torch.utils.checkpoint`` (its reentrant and non-reentrant forms alike)."""
    while frame is not None and frame not in outer:
        if frame.f_globals.get("__name__") == "torch.utils.checkpoint":
            return True
        frame = frame.f_back
    return False


def _runs_otherwise(module: nn.Module, swapped: AbstractSet[int]) -> bool:
    """Whether ``module``, run again in the backward pass, computes otherwise than in this
    run: it holds a tensor put in place for the run (``swapped``: their modules' ids), runs
    as one BatchEnsemble member's pass, or draws its pre-activations (local
    reparameterisation puts a forward of the engine's on it for the run)."""
    member = getattr(module, "_is_batchensemble", False) or getattr(module, "_is_member_norm", 0)
    return (
        id(module) in swapped
        or (member and getattr(module, "_member", None) is not None)
        or _drawing(module)
    )


def _drawing(module: nn.Module) -> bool:
    """Whether ``module`` draws its pre-activations in this run (local reparameterisation puts
    a forward of the engine's on it)."""
    patched = getattr(vars(module).get("forward"), "__module__", None) or ""
    return patched.startswith("pyrouq.")


@contextlib.contextmanager
def recompute_checked(
    net: nn.Module,
    swapped: Callable[[], AbstractSet[int]] = frozenset,
    key: Hashable = None,
    drawn: Callable[[], Mapping[str, Tensor]] = dict,
) -> Iterator[None]:
    """On a network's first run with gradients in each mode (training or not) and way of
    running (``key``: a BatchEnsemble's member passes or folded batch), refuse a forward that
    runs inside ``torch.utils.checkpoint`` (activation checkpointing: torchvision's DenseNet
    with ``memory_efficient=True``, ``checkpoint_sequential``) a module that the backward pass,
    which runs that part again, would compute otherwise (:func:`_runs_otherwise`): with the
    initial weights in place of the drawn ones, or a BatchEnsemble's folded batch in place
    of a member's (silently wrong gradients for a Bayesian network; torch's
    ``CheckpointError`` elsewhere). ``swapped``: gives the ids of the modules holding the
    tensors put in place (asked only when a run is checked). Not caught: checkpointing
    switched on after those runs, and a checkpointed function that reads the weights as
    tensors instead of calling their modules.

    The same run, in training mode or inside :func:`no_grad_watched` (mcmc()), warns of a
    forward that calls a module holding such tensors (``drawn``: the tensors put in place) only
    under ``torch.no_grad()`` (:func:`_no_grad_warning`), unless the forward also reads every
    one of them as a tensor with gradients (a tied weight, ``F.linear(x, self.fc.weight,
    self.fc.bias)``). Not watched: eval mode otherwise (gradients there are the user's, a
    saliency map's), and later runs (staged fine-tuning gets one warning); with warnings as
    errors the run raises it, every time."""
    checked = _RECOMPUTE_CHECKED.get(net, frozenset())
    watch = net.training or _watching.get()
    key = (net.training, watch, key)
    if not torch.is_grad_enabled() or key in checked or _checking.get():
        yield
        return
    outer, held = _outer_frames(), swapped()
    watched = {id(t): name for name, t in drawn().items()} if watch else {}
    for path, module in net.named_modules() if watch else ():
        if _drawing(module):  # (its latent tensors: the templates, read in place of a draw)
            watched.update((id(b), f"{path}.{n}") for n, b in module.named_buffers(recurse=False))
    own: dict[str, set[str]] = {}  # holders run: their tensors of ``watched``
    stack: list[tuple[str, str | None]] = []  # (module, where its checkpoint was called)
    found: list[str] = []
    gradients: dict[str, bool] = {}  # holders run: whether any call of theirs had gradients

    def before(module: nn.Module, args: Any, name: str) -> None:
        caller = None
        if _inside_checkpoint(sys._getframe(1), outer):
            # the first module of a checkpoint: called in its parent's forward
            caller = stack[-1][1] if stack and stack[-1][1] is not None else None
            if caller is None:
                caller = stack[-1][0] if stack else ""
            if _runs_otherwise(module, held):
                found.extend((name, caller))
                raise _CheckpointFound
        if id(module) in held or _drawing(module):
            gradients[name] = gradients.get(name, False) or torch.is_grad_enabled()
            tensors = (*module._parameters.values(), *module._buffers.values())
            own.setdefault(name, set()).update(watched[id(t)] for t in tensors if id(t) in watched)
        stack.append((name, caller))

    def after(module: nn.Module, args: Any, out: Any) -> None:
        if stack:
            stack.pop()

    handles = []
    token = _checking.set(True)
    # reads with gradients inside the network's forward (not functional_call's swapping)
    reads = _Reads(watched, lambda: bool(stack) and torch.is_grad_enabled())
    try:
        for name, module in net.named_modules():
            if isinstance(module, torch.jit.ScriptModule) or _stateless_leaf(module):
                continue  # (a ScriptModule takes no hooks; a hooked ReLU is not swapped)
            handles.append(
                module.register_forward_pre_hook(lambda m, a, name=name: before(m, a, name))
            )
            handles.append(module.register_forward_hook(after))
        with reads if watched else contextlib.nullcontext():
            yield
    except _CheckpointFound:
        where = f"the forward of {found[1]!r}" if found[1] else "the network's own forward"
        raise ValueError(
            f"{class_name(net)} runs {found[0]!r} inside torch.utils.checkpoint (activation "
            f"checkpointing, called in {where}), which runs it again during the backward "
            "pass, when pyrouq has put back the initial weights in place of the drawn ones (or "
            "a BatchEnsemble's folded batch in place of one member's): the gradients would be "
            "computed with other weights. Turn checkpointing off before converting the network "
            "(torchvision's DenseNet: memory_efficient=False; a forward of your own: call the "
            "block directly), or, with bayesian(), leave the layers it runs out of select=."
        ) from None
    finally:
        _checking.reset(token)
        for handle in handles:
            handle.remove()
    # holders run only without gradients, unless every tensor of theirs was read with them
    read = reads.read
    without = [n for n, had in gradients.items() if not had and not (own[n] and own[n] <= read)]
    if watch and without:  # (raised with warnings as errors: the run is not marked checked)
        warn_caller(_no_grad_warning(net, without))
    _RECOMPUTE_CHECKED[net] = checked | {key}


class NoGradLayersWarning(UserWarning):
    """Warned at a converted network's first run with gradients in training mode
    (:func:`pyrouq.fit`, Pyro's ``SVI``) and in :func:`pyrouq.mcmc`'s first pass, when its
    forward runs layers holding latent weights only under ``torch.no_grad()`` (or
    ``torch.inference_mode()``): their draws get no gradient from the data. Silence it (a
    backbone held fixed for some steps, then fine-tuned) with
    ``warnings.filterwarnings("ignore", category=pyrouq.NoGradLayersWarning)``.

    Attributes: ``network``, the network's class name; ``layers``, the dotted paths of those
    layers in it; ``finding``, the message without its advice (what the forward did, and what
    follows for fit() and mcmc()).

    Examples
    --------
    >>> import warnings
    >>> import torch
    >>> from torch import nn
    >>> from pyrouq import bayesian
    >>> class Frozen(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.body = nn.Linear(4, 3)
    ...     def forward(self, x):
    ...         with torch.no_grad():
    ...             return self.body(x)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = bayesian(Frozen())(torch.randn(5, 4))  # first run with gradients, training mode
    >>> [w.message.layers for w in caught if w.category is NoGradLayersWarning]
    [('body',)]
    """

    def __init__(
        self, message: str, *, network: str = "", layers: Sequence[str] = (), finding: str = ""
    ):
        super().__init__(message)
        self.network, self.layers, self.finding = network, tuple(layers), finding


def _no_grad_warning(net: nn.Module, names: list[str]) -> NoGradLayersWarning:
    """The warning of a forward that runs the modules ``names``, holding latent tensors, only
    under ``torch.no_grad()`` (a block a forward keeps fixed that way): their draws get no
    gradient from the data, so fit() would train their guide on the KL alone, toward the
    prior, and NUTS would miss their part of the gradient."""
    layers, hold = ("layer", "holds") if len(names) == 1 else ("layers", "hold")
    finding = (
        f"{class_name(net)}'s forward ran the {layers} {_names([repr(n) for n in names])}, "
        f"which {hold} latent weights, only under torch.no_grad() (or torch.inference_mode()) "
        "in its first run with gradients: their draws get no gradient from the data there, so "
        "fit() would train their guide on the KL alone, toward the prior (random weights), and "
        "mcmc() would miss their part of the gradient."
    )
    return NoGradLayersWarning(
        f"{finding} To keep those weights fixed, freeze them before "
        "converting (layer.requires_grad_(False); select=None leaves frozen parameters out) or "
        "leave them out of select=; to make them Bayesian, run them with gradients. If a later "
        "step runs them with gradients (staged fine-tuning: a backbone unfrozen after some "
        "steps), ignore this warning.",
        network=class_name(net),
        layers=names,
        finding=finding,
    )


def _stateless_leaf(module: nn.Module) -> bool:
    """A module without children, parameters or buffers (ReLU, pooling): one that runs the
    same again in the backward pass, which :func:`recompute_checked` need not watch; torch's
    and pyrouq's own only (a user's may run a checkpoint of its own, whose caller it names)."""
    own = type(module).__module__.startswith(("torch.nn.", "pyrouq."))
    return own and not (module._modules or module._parameters or module._buffers)


class _CheckpointFound(Exception):
    """Raised inside a forward by :func:`recompute_checked`; turned into the error it
    explains."""


def _holders(net: nn.Module, names: Iterable[str], named: nn.Module) -> set[int]:
    """The ids of the modules of ``net`` that hold the tensors ``names`` name (and of those
    holding the same tensors under other names: tied weights), in ``named``'s modules."""
    held: set[int] = set()
    for key in names:
        owner, _, attr = key.rpartition(".")
        try:
            held.add(id(getattr(net.get_submodule(owner), attr)))
        except AttributeError:
            continue
    return {
        id(module)
        for module in named.modules()
        for tensor in (*module._parameters.values(), *module._buffers.values())
        if id(tensor) in held
    }


def call(
    net: nn.Module, weights: dict[str, Tensor], x: Tensor, named: nn.Module | None = None
) -> Any:
    """``functional_call(net, weights, (x,))``; a forward's ``next(self.parameters())`` that
    finds none (a converted network, or a block of it, whose parameters are all latent, held
    as buffers) is told so: a bare StopIteration said nothing. ``named``: the network the
    message names, where ``net`` runs it (a BatchEnsemble's members). A forward running
    modules inside ``torch.utils.checkpoint`` is refused where the backward pass would run them
    otherwise (:func:`recompute_checked`); a layer refusing its input is named
    (:class:`~pyrouq._engine._layer_errors.LayersNamed`)."""
    shown = named if named is not None else net
    try:
        with (
            recompute_checked(shown, lambda: _holders(net, weights, shown), drawn=lambda: weights),
            LayersNamed(shown, x),
        ):
            return functional_call(net, weights, (x,))
    except StopIteration as error:
        raise RuntimeError(
            f"{class_name(shown)}.forward raised StopIteration. "
            "If it reads "
            "next(self.parameters()) (or a block's), e.g. for the device or dtype, it finds "
            "none where every parameter there is latent: pyrouq holds latent weights as "
            "buffers, each draw put in their place. Read them from the input (x.device, "
            "x.dtype) or from a buffer (next(self.buffers())), or leave a parameter of that "
            "block out of select=."
        ) from error


class _Reads(TorchFunctionMode):
    """Records the watched tensors (``{id: site}``) that an op makes a tensor of (while
    ``counted()``, when given)."""

    def __init__(self, watched: Mapping[int, str], counted: Callable[[], bool] | None = None):
        super().__init__()
        self.watched = watched
        self.counted = counted
        self.read: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # .shape, .dtype, .size(): metadata, not the values
        if self.counted is not None and not self.counted():
            return out
        if any(isinstance(leaf, Tensor) for leaf in tree_leaves(out)):
            for leaf in tree_leaves((args, kwargs)):
                site = self.watched.get(id(leaf)) if isinstance(leaf, Tensor) else None
                if site is not None:
                    self.read.add(site)
        return out


@contextlib.contextmanager
def tensor_reads(watched: Mapping[int, str]) -> Iterator[set[str]]:
    """While inside, the set it yields gets the site of every tensor of ``watched`` (``{id(t):
    site}``) that a torch op reads to make a tensor: a forward reading a layer's weight as a
    tensor (``F.linear(h, self.enc.weight.t())``, a tied decoder) besides calling the layer,
    whose pre-activations local reparameterisation draws (the weight would be the template
    there, not the guide's draw). Nothing is watched (no mode) for an empty ``watched``."""
    if not watched:
        yield set()
        return
    mode = _Reads(watched)
    with mode:
        yield mode.read


def check_draw_shapes(
    net: nn.Module, weights: Mapping[str, Tensor], event_dims: Mapping[str, int]
) -> None:
    """Refuse weights ``{name: (*S, *shape)}`` whose draws are not of the shape ``net`` holds
    under ``name`` (torch's error named no site: ``mat1 and mat2 shapes cannot be
    multiplied``), or that carry no draws (S = 0: torch's ``stack expects a non-empty
    TensorList``, vmap's ``Expected at least one Tensor``)."""
    for name, value in weights.items():
        owner, _, attr = name.rpartition(".")
        try:
            held = getattr(net.get_submodule(owner), attr)
        except AttributeError:
            continue  # (functional_call names a key the network lacks)
        if not isinstance(held, Tensor):
            continue
        shape, lead = tuple(held.shape), value.dim() - event_dims[name]
        if lead < 0 or tuple(value.shape[lead:]) != shape:
            raise ValueError(
                f"Site {name!r} takes draws of shape {shape}, after any leading sample dims "
                f"(*S, *shape); got shape {tuple(value.shape)}. Give it values of the site's "
                "shape (model.template() holds one of every site)."
            )
        if 0 in value.shape[:lead]:
            raise ValueError(
                f"Site {name!r} carries no draws: shape {tuple(value.shape)}. Give every site "
                "at least one draw, (S, *shape) with S >= 1 (one draw: value[None])."
            )


def noise_scale(var: Tensor) -> Tensor:
    """``sqrt(var)`` of local reparameterisation's pre-activation variances, with a finite
    gradient where ``var`` is 0: ``var`` clamped to float32's smallest normal number (1e-38,
    1e-19 as a scale, which float16 rounds to 0), in float32 or wider. Clamped to float16's
    own, 6e-5, a float16 network's scales had a floor of 0.008 (8x the exact 0.001 of weight
    scales 1e-3 on four inputs 0.5; noise where a row of zeros meets no bias)."""
    wide = var.to(torch.promote_types(var.dtype, torch.float32))
    return wide.clamp_min(torch.finfo(wide.dtype).tiny).sqrt().to(var.dtype)
