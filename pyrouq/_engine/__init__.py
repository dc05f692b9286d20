"""The execution engine: run a network with given weights, one draw or S draws.

Everything that evaluates a converted network goes through here: the models' ``forward``,
:class:`pyrouq.KLWeightedELBO`, :func:`pyrouq.predict`, the diagnostics. Weights are supplied
with :func:`torch.func.functional_call`, so any ``nn.Module`` runs unchanged, whatever its
nesting, residual connections or normalisation layers.

Every device-specific fast path of pyrouq lives in this package (the CPU kernels and the
channels-last layout in :mod:`pyrouq._engine._cpu_paths`, the memory reuse in
:mod:`pyrouq._engine._memory_reuse`), each kept while ``benchmarks/`` shows that it pays:

* S weight draws run as S passes on CPU and as one ``torch.func.vmap`` pass on accelerators:
  on CPU, vmap's batched products lose with gradients (a step of a 784-256-10 MLP at S = 4
  to 100 draws, batches 1 to 512: 0.44-0.98x; of 784-1200-1200-10: 0.50-0.97x; with
  LayerNorm, Dropout, an own ``F.linear`` net, a rank-1 net: 0.48-1.27x; BatchNorm in eval
  mode 0.90-1.19x) and about break even without (0.73-2.15x, mostly 1.0-1.3x), gaining
  broadly only where a pass costs little more than its calls (a 20-32-3 MLP: 0.98-30x), for
  S times one draw's activations without gradients (AMD EPYC, one thread, loaded,
  2026-12-07);
* without gradients, CPU batches above :data:`CPU_CHUNK` inputs are split;
* 2x2 max-pooling uses strided maxima on CPU (:class:`MaxPool2x2`), other max-pooling of
  NCHW inputs of 16 channels or more runs channels-last (:class:`MaxPool2dChannelsLast`), and
  a ReLU followed by a 2x2 max-pooling in an ``nn.Sequential`` runs as pooling then ReLU (the
  same function);
* BatchEnsemble layers run member by member on CPU (effective weights ``diag(s_i) W diag(r_i)``
  on each member's slice of the batch, or, in a layer whose weights outnumber the activations
  it meets, that member's activations scaled by ``r_i`` and ``s_i``), with rank-1 scaling of
  the activations elsewhere; a
  network without shared batch statistics in training (nor a shared InstanceNorm tracking
  running statistics) runs whole member passes on CPU; a layer
  with a single input feature that reads the members' repeated input (a grayscale stem) runs
  once for all members, its output scaled per member (exact: r_m is then a scalar);
* ``nn.TransformerEncoderLayer``'s fused eval path (which reads its linear layers' weights
  as tensors) is off while a BatchEnsemble runs, so that its BatchEnsemble layers are called,
  and torch's fused attention (``nn.MultiheadAttention`` too) while S draws run as one vmap
  pass with gradients (inside vmap the draws tell no ``requires_grad``, and those kernels
  have no backward);
* on CPU, networks whose widest 2-d convolution reads 16 to 128 channels run channels-last
  (:func:`channels_last`: the input and the 4-d weights, so oneDNN keeps the activations
  channels-last too; wider ones lose on small maps), except where a strided 1x1 convolution
  reads fewer than 8 channels (torch 2.14's CPU kernel miscomputes that one's weight
  gradient);
* while :func:`pyrouq.fit` and :func:`pyrouq.predict` run on CPU under glibc, freed memory is
  kept for reuse instead of being handed back to the system (:func:`reuse_freed_memory`):
  glibc serves every block above 32 MB with a fresh ``mmap``, whose pages fault in again at
  every step; a BatchEnsemble's M-fold activations cross that size first;
* :func:`pyrouq.fit`'s Adam updates CPU parameters in torch's fused kernel
  (:func:`~pyrouq._engine._cpu_paths.fusable_adam`).

Local reparameterisation (:func:`run_local`) lives in :mod:`pyrouq._engine._local`, the checks
of a network's outputs and of the normalisation layers that see its whole batch in
:mod:`pyrouq._engine._batch`; both are re-exported here.

Shape convention: S draws or members, B inputs, D outputs.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
import threading
import weakref
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from pyrouq._engine import _layer_calls, _layer_errors
from pyrouq._engine._batch import (
    batch_statistics,
    kept_buffers,
    put_back,
    statistics_across_members,
)
from pyrouq._engine._batch import check_outputs as check_outputs
from pyrouq._engine._cpu_paths import CPU_CHUNK, _cpu, laid_out, nhwc
from pyrouq._engine._cpu_paths import MaxPool2dChannelsLast as MaxPool2dChannelsLast
from pyrouq._engine._cpu_paths import MaxPool2x2 as MaxPool2x2
from pyrouq._engine._cpu_paths import SwappingSequential as SwappingSequential
from pyrouq._engine._cpu_paths import fusable_adam as fusable_adam
from pyrouq._engine._cpu_paths import fused_adam as fused_adam
from pyrouq._engine._cpu_paths import prepare as prepare
from pyrouq._engine._cpu_paths import run_children as run_children
from pyrouq._engine._cpu_paths import schedule as schedule
from pyrouq._engine._cpu_paths import unprepare as unprepare
from pyrouq._engine._layer_calls import FUSED_ATTENTION, call, calls_checked, layers_called
from pyrouq._engine._layer_errors import LayersNamed as LayersNamed
from pyrouq._engine._local import LOCAL_TYPES as LOCAL_TYPES
from pyrouq._engine._local import local_moments as local_moments
from pyrouq._engine._local import run_local as run_local
from pyrouq._engine._memory_reuse import reuse_freed_memory as reuse_freed_memory
from pyrouq._util import AsItCame, check_folded_batch

# --------------------------------------------------------------------------------------------
# Running a network with given weights
# --------------------------------------------------------------------------------------------


_repeatable_lock = threading.Lock()
_repeatable_depth = 0
_repeatable_saved: tuple[bool, bool] = (False, False)


@contextlib.contextmanager
def repeatable(device: torch.device | None, on: bool) -> Iterator[None]:
    """While inside, when ``on`` and ``device`` is a GPU, cuDNN runs its deterministic kernels
    only (``cudnn.deterministic``, no autotuning): its default convolution gradients add in a
    varying order, so two seeded runs of a BayesianLeNet on an H200 ended with other weights
    in the last bits (tests/engine/test_cuda.py, 2026-12-04). The flags are process-wide: the
    outermost of nested or concurrent (threads) uses sets them and the last one out puts back
    what the first one found."""
    global _repeatable_depth, _repeatable_saved
    if not on or device is None or device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    with _repeatable_lock:
        if _repeatable_depth == 0:
            _repeatable_saved = (cudnn.deterministic, cudnn.benchmark)
            cudnn.deterministic, cudnn.benchmark = True, False
        _repeatable_depth += 1
    try:
        yield
    finally:
        with _repeatable_lock:
            _repeatable_depth -= 1
            if _repeatable_depth == 0:
                cudnn.deterministic, cudnn.benchmark = _repeatable_saved


class _MemberPass(nn.Module):
    """Runs a BatchEnsemble network's members (:func:`run_members`) as one module's forward,
    so that :func:`~torch.func.functional_call` can put weights in place for it."""

    def __init__(self, net: nn.Module, num_members: int):
        super().__init__()
        self.net = net
        self.num_members = num_members

    def forward(self, x: Tensor) -> Tensor:
        return run_members(self.net, x, self.num_members)


def run(
    net: nn.Module, x: Tensor, weights: Mapping[str, Tensor], members: int | None = None
) -> Tensor:
    """``net(x)`` with the tensors ``weights`` (``{dotted name: value}``, unstacked) in place
    of its parameters or buffers of those names; the outputs ``(B, D)``, or ``(M, B, D)`` for
    a BatchEnsemble network of ``members`` members (run by :func:`run_members`).

    Without gradients on CPU, batches above :data:`CPU_CHUNK` are split unless a
    normalisation layer takes statistics of the batch (:func:`batch_statistics`): the same
    function for a network whose layers treat inputs independently, as torch's do in eval
    mode (a layer of the user's own that mixes a batch's inputs sees the chunks).
    """
    if (
        _cpu(x)
        and x.shape[0] > CPU_CHUNK
        and not torch.is_grad_enabled()
        and not batch_statistics(net)
    ):
        parts = [run(net, chunk, weights, members) for chunk in x.split(CPU_CHUNK)]
        return torch.cat(parts, dim=-2)

    def body(x: Tensor) -> Tensor:
        laid = {k: nhwc(v) for k, v in weights.items()}
        if members is not None:
            wrapper = _MemberPass(net, members)
            return call(wrapper, {f"net.{k}": v for k, v in laid.items()}, x, named=net)
        return check_outputs(call(net, laid, x), net, x.shape[0])

    return laid_out(net, x, body)  # type: ignore[no-any-return]


def sample_dims(weights: Mapping[str, Tensor], event_dims: Mapping[str, int]) -> torch.Size:
    """The leading (sample) dims of the first site of ``weights`` with the most draws and any
    such dims (a site of a single draw, shared by every draw, may come first)."""
    leads = [value.shape[: value.dim() - event_dims[name]] for name, value in weights.items()]
    return max(leads, key=lambda lead: (math.prod(lead), len(lead) > 0), default=torch.Size())


def output_dims(lead: torch.Size, plates: int = 1) -> tuple[int, ...]:
    """Leading dims of the outputs for weights with leading dims ``lead``.

    Weights drawn under plates carry dims ``(*S, 1)`` lined up with the model's plates, the
    last being the data plate, so the outputs are ``(*S, B, D)`` (e.g. ``(P, 1, B, D)`` for P
    vectorised particles outside two plates); weights ``(S, ...)`` give ``(S, B, D)``. The
    outputs of an ensemble (``plates=2``: members and data) take the place of two such dims.
    """
    dims = list(lead)
    for _ in range(plates):
        if len(dims) > 1 and dims[-1] == 1:
            dims.pop()
    return tuple(dims)


def run_draws(
    net: nn.Module,
    x: Tensor,
    weights: Mapping[str, Tensor],
    event_dims: Mapping[str, int],
    members: int | None = None,
) -> Tensor:
    """``net(x)`` under weights that may carry leading sample dims: ``(*S, B, D)``, or
    ``(*S, M, B, D)`` for a BatchEnsemble network of ``members`` members.

    ``event_dims[name]`` is the number of dims of one draw of ``name``. A site with a single
    draw is shared by every draw. On CPU (and while BatchNorm computes batch statistics) the
    draws run one at a time; elsewhere as one ``vmap`` pass.

    With gradients, the network runs with a copy of each draw that autograd may hold
    (:func:`_own_copy`): a network that changes its weight in place as it runs (a
    ``self.weight.clamp_(-c, c)`` in forward, under ``no_grad`` or not) then trains, its
    gradients those of the same change made out of place, and the draws stay as drawn (for
    the KL); without the copy, autograd refused the change, or the backward pass that met it
    (a view of ``unbind``, an ``exp``'s output that its backward reads, a leaf).
    """
    _layer_calls.check_draw_shapes(net, weights, event_dims)
    lead = sample_dims(weights, event_dims)
    if not len(lead):
        return run(net, x, {k: _own_copy(v) for k, v in weights.items()}, members)
    count = math.prod(lead)
    flat = {}
    for name, value in weights.items():
        event = event_dims[name]
        draws = value.reshape(-1, *value.shape[value.dim() - event :])
        if draws.shape[0] not in (1, count):
            raise ValueError(
                f"Site {name!r} carries {draws.shape[0]} draws where the others carry {count}; "
                "give every site the same leading sample dims."
            )
        flat[name] = draws

    def one_at_a_time(inputs: AsItCame) -> Tensor:
        # one view per draw (unbind): indexing the stack would back-propagate a zero tensor of
        # all S draws for every draw (S^2 weights written in the backward pass)
        views = {k: v.unbind(0) for k, v in flat.items()}
        outs = [
            run(
                net,
                inputs(),
                {k: _own_copy(v[s if len(v) > 1 else 0]) for k, v in views.items()},
                members,
            )
            for s in range(count)
        ]
        return torch.stack(outs)

    if _cpu(x) or batch_statistics(net) or count == 1:  # (vmap needs a site of S > 1 draws)
        stacked = one_at_a_time(AsItCame(x, count))
    else:
        given = AsItCame(x, count + 1)  # x as it came, should vmap fail after changing it
        # (copied here: inside vmap, a draw tells no requires_grad)
        shared = {k: _own_copy(v[0]) for k, v in flat.items() if v.shape[0] == 1}
        batched = {k: _own_copy(v) for k, v in flat.items() if v.shape[0] > 1}
        kept = _kept_buffers(net, weights)

        def one(draw: dict[str, Tensor]) -> Tensor:
            return run(net, x, {**shared, **draw}, members)

        # inside vmap a draw tells no requires_grad: torch's fused attention (eval mode) would
        # take draws that need gradients, and its kernels have no backward
        fused_off = torch.is_grad_enabled()
        try:
            with layers_called(net, FUSED_ATTENTION if fused_off else ()):
                stacked = torch.func.vmap(one, randomness="different")(batched)
            _RAN_THROUGH.setdefault(net, set()).add(_vmap_mode(net))
        except RuntimeError as err:  # an op vmap cannot batch (nn.LSTM's), .item(), data-
            if not _VMAP_REFUSAL.search(str(err)):  # dependent control flow: draw by draw
                raise
            put_back(kept)
            stacked = one_at_a_time(given)
    plates = 1 if members is None else 2
    return stacked.reshape(*output_dims(lead, plates), *stacked.shape[1:])


# --------------------------------------------------------------------------------------------
# BatchEnsemble
# --------------------------------------------------------------------------------------------


def batchensemble_forward(layer: Any, x: Tensor, sequence_first: bool = True) -> Tensor:
    """A BatchEnsemble layer on a folded batch ``(M * B, ...)`` (member-major), or on one
    member's batch ``(B, ...)`` during :func:`run_members`' member passes (``sequence_first``:
    whether a layer flagged so may find the folded batch on dim 1)."""
    member = layer._member
    if member is not None:
        if _scales_activations(layer, x):
            return _scaled_member(layer, x, member)
        if layer._member_weights is None:
            # one view per member: indexing the stack would back-propagate a zero tensor of
            # all M members' weights for every member
            weight, bias = layer.folded_weights()
            layer._member_weights = (weight.unbind(0), bias.unbind(0))
        weights, biases = layer._member_weights
        return layer._op(x, nhwc(weights[member]), biases[member])  # type: ignore[no-any-return]
    members = layer.num_members
    folded = _FOLDED.get()
    if folded is not None and sequence_first and getattr(layer, "_sequence_first", False):
        if x.dim() >= 3 and x.shape[1] == folded:
            # a linear layer of a batch_first=False transformer layer: its activations are
            # (T, M * B, F), the members on dim 1 (transposed once, whatever T is)
            out = batchensemble_forward(layer, x.transpose(0, 1), sequence_first=False)
            return out.transpose(0, 1)
    check_folded_batch(layer, x, members, folded)
    mark = getattr(x, _REPEATED, None)  # never on an inference tensor (no version counter)
    if mark is not None and mark == (members, x._version) and _single_input_feature(layer):
        # M copies of the same inputs into one input feature (a grayscale stem, a 1-d
        # regression input): r_m is a scalar per member, so every member's output is the
        # shared op's output scaled by r_m * s_m, plus b_m
        base = layer._op(x[: x.shape[0] // members], nhwc(layer.weight), None).unsqueeze(0)
        view = base.dim()
        scale = layer._factor_view(layer.s * layer.r, view)
        out = torch.addcmul(layer._factor_view(layer.bias, view), base, scale).flatten(0, 1)
        return nhwc(out)
    if _cpu(x):
        # one op per member with its effective weight: oneDNN handles B inputs at a time far
        # better than M * B with the activations scaled per member
        chunks = x.chunk(members)
        if _scales_activations(layer, chunks[0]):
            return torch.cat([_scaled_member(layer, c, m) for m, c in enumerate(chunks)])
        weight, bias = layer.folded_weights()
        return torch.cat(
            [layer._op(c, nhwc(w), b) for c, w, b in zip(chunks, weight, bias, strict=True)]
        )
    shape = (members, x.shape[0] // members, *x.shape[1:])  # (-1 fails on an empty batch)
    scaled = x.reshape(shape) * layer._factor_view(layer.r, x.dim() + 1)
    out = layer._op(scaled.flatten(0, 1), layer.weight, None)
    out = out.reshape(members, shape[1], *out.shape[1:])
    view = out.dim()
    return torch.addcmul(
        layer._factor_view(layer.bias, view), out, layer._factor_view(layer.s, view)
    ).flatten(0, 1)


def _scaled_member(layer: Any, x: Tensor, member: int) -> Tensor:
    """Member ``member``'s outputs on its ``B`` inputs, its factors scaling the inputs and
    outputs of the shared op: for weights larger than the activations they meet (the deep
    layers of a wide network on small images), instead of building the member's weights."""
    dims = x.dim() + 1
    r, s, bias = (layer._factor_view(f, dims)[member] for f in (layer.r, layer.s, layer.bias))
    out = layer._op(x * r, nhwc(layer.weight), None)
    return torch.addcmul(bias, out, s)  # type: ignore[no-any-return]


_FOLDED: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pyrouq_folded_batch", default=None
)
"""The size M * B of the folded batch a BatchEnsemble network runs on (:func:`run_members`),
which :func:`batchensemble_forward` finds on dim 0 of a layer's input, or on dim 1 of the
sequence-first activations of a ``batch_first=False`` transformer layer's linear layers."""


def folded_batch() -> int | None:
    """The size M * B of the folded batch being run (:data:`_FOLDED`), or None outside one."""
    return _FOLDED.get()


_REPEATED = "_pyrouq_repeated_for"
"""Attribute :func:`run_members` sets on the folded input it makes (the number of members
whose copies it holds), for :func:`batchensemble_forward`."""


def _scales_activations(layer: Any, x: Tensor) -> bool:
    """Whether one member's pass through ``layer`` is cheaper with its inputs and outputs
    scaled by the member's factors than with the member's effective weight: when the weight
    holds more values than the inputs and outputs together (each path walks its tensors a
    few times, forward and backward; the weights' path does so for every member)."""
    weight = layer.weight
    channels = int(x.shape[layer._channel_dim])
    outputs = x.numel() // channels * int(layer.s.shape[1])
    if weight.dim() > 2:
        stride = getattr(layer, "stride", (1,))
        shrink = math.prod(int(v) for v in stride)
        outputs = outputs * shrink if getattr(layer, "transposed", False) else outputs // shrink
    return weight.numel() > x.numel() + outputs


def _single_input_feature(layer: Any) -> bool:
    return int(layer.r.shape[1]) == 1


def _ensemble_layers(net: nn.Module) -> list[Any]:
    return [m for m in net.modules() if getattr(m, "_is_batchensemble", False)]


def _own_copy(draw: Tensor) -> Tensor:
    """``draw`` as :func:`run_draws` hands it to the network: a copy where autograd may hold it
    (gradients on, and ``draw`` requires them), so that a change the network makes to its
    weight in place is recorded on the copy. ``draw`` itself elsewhere: without gradients (a
    network that changes a draw changes it, as before), and where the autograd Function that
    drew it says that nothing holds it (``keeps_no_draw``: the ELBO's fused draw and KL of a
    site, whose backward reads the noise, not the draw; its copy cost a one-particle step of a
    small MLP 1-4% on a loaded 2-core CPU; copies of four particles cost 3-6%)."""
    if not (draw.requires_grad and torch.is_grad_enabled()):
        return draw
    drawn_by = getattr(draw.grad_fn, "_forward_cls", None)  # (a custom autograd Function's)
    return draw if getattr(drawn_by, "keeps_no_draw", False) else draw.clone()


_RAN_THROUGH: weakref.WeakKeyDictionary[nn.Module, set[tuple[bool, bool]]] = (
    weakref.WeakKeyDictionary()
)
"""The modes (:func:`_vmap_mode`) in which a network's vmap pass has run through: what vmap
refuses is in the network's code (an op, ``.item()``, control flow on a value), which its mode
may change (``if self.training``), not the draws' values, so its later passes in that mode keep
no buffers (one whose input's shape alone leads it to a refused op, after a pass that ran
through, finds a buffer moved before the refusal moved again by the draws)."""


def _vmap_mode(net: nn.Module) -> tuple[bool, bool]:
    """What may change the code a network's forward runs: training mode, gradients."""
    return net.training, torch.is_grad_enabled()


def _kept_buffers(net: nn.Module, weights: Mapping[str, Tensor]) -> list[tuple[Tensor, Tensor]]:
    """The buffers a vmap pass of ``net`` may move before it is refused (a counter the forward
    adds to), each with a copy, for the draws run one at a time to find them as they were; not
    the latent sites' (``weights``); none where a pass in this mode has run through
    (:data:`_RAN_THROUGH`): the copies would cost every call (on a GPU, a kernel launch each:
    60 for a ResNet-18's BatchNorm statistics) for a refusal that does not come."""
    if _vmap_mode(net) in _RAN_THROUGH.get(net, ()):
        return []
    return kept_buffers(net, weights.keys())


_VMAP_REFUSAL = re.compile(
    r"Batching rule not implemented|\bvmap\b|doesn't match the broadcast shape"
)
"""What ``torch.func.vmap``'s refusals of a network's ops say (not the network's own errors; the
last, an in-place update of a buffer of one value for all draws by the draws' values,
``self.mean.add_(h.mean(0))``, which one draw at a time makes, as torch does)."""


def run_members(net: nn.Module, x: Tensor, num_members: int) -> Tensor:
    """Every member of a converted BatchEnsemble on every input: ``(M, B, D)``.

    On accelerators, and whenever a BatchNorm shared by the members computes batch
    statistics (over the folded batch) or a shared InstanceNorm updates running statistics
    (once a call), the input is repeated once per member and the network runs on the folded
    batch ``(M * B, ...)``. Otherwise, on CPU, the network runs once per
    member with that member's effective weights, or its scaled activations where a layer's
    weights outnumber them (and its own norm copies, with ``norms="per_member"``): the same
    function, faster there.
    """
    member_passes = _cpu(x) and not statistics_across_members(net)
    run = partial(_run_members, net, num_members=num_members, member_passes=member_passes)
    with (
        layers_called(net),
        calls_checked(net, key=member_passes),
        _layer_errors.LayersNamed(net, x),
    ):
        return laid_out(net, x, run)  # type: ignore[no-any-return]


def _run_members(net: nn.Module, x: Tensor, num_members: int, member_passes: bool) -> Tensor:
    """:func:`run_members` on ``x`` as laid out (``member_passes``: one pass per member)."""
    if member_passes:
        layers = _ensemble_layers(net)
        # the modules told which member runs: the layers and any per-member norms
        told = layers + [m for m in net.modules() if getattr(m, "_is_member_norm", False)]
        try:
            outs = []
            inputs = AsItCame(x, num_members)
            for member in range(num_members):
                for module in told:
                    module._member = member
                outs.append(check_outputs(net(inputs()), net, x.shape[0]))
        finally:
            for module in told:
                module._member = None
            for layer in layers:
                layer._member_weights = None
        return torch.stack(outs)
    folded = nhwc(x.repeat(num_members, *([1] * (x.dim() - 1))))
    if not folded.is_inference():  # (torch.inference_mode keeps no version counter)
        setattr(folded, _REPEATED, (num_members, folded._version))  # in-place ops change it
    token = _FOLDED.set(folded.shape[0] or None)  # (an empty batch: any layer's input fits)
    try:
        out = check_outputs(net(folded), net, folded.shape[0])
    finally:
        _FOLDED.reset(token)
    return out.unflatten(0, (num_members, x.shape[0]))
