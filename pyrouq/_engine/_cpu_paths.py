"""The engine's CPU fast paths (see :mod:`pyrouq._engine`): the schedule switch, the 2x2
max-pooling kernel and the rewrites of :func:`prepare`, the channels-last layout, and torch's
fused Adam kernel for ``fit()``'s optimizer (freed memory kept for reuse under glibc is in
:mod:`pyrouq._engine._memory_reuse`). Each is kept while ``benchmarks/`` shows that it pays;
:mod:`pyrouq._engine` decides where they apply."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.conv import _ConvNd

from pyrouq._util import has_hooks

CPU_CHUNK = 512
"""Inputs per pass when a network runs without gradients on CPU (larger batches are split:
oneDNN's convolutions ran 2-4x slower per image above ~512 on an Intel Xeon; AMD: neutral)."""

_forced: str | None = None

CHANNELS_LAST_MIN_CHANNELS = 16
"""On CPU, a network whose widest 2-d convolution reads at least this many channels runs
channels-last (:func:`channels_last`); LeNet's narrow convolutions (1 and 6 channels) run
faster as they are."""

POOL_CHANNELS_LAST_MIN_CHANNELS = 16
"""On CPU, a max-pooling other than 2x2 (:class:`MaxPool2dChannelsLast`) of an NCHW input with
at least this many channels runs channels-last: torch's NCHW kernel walks each window per
channel, the channels-last one vectorises across channels (3x3 stride 2 with padding 1, batch
256, forward and backward: 64 channels at 16 px 17 -> 5 ms, 16 at 16 px 4.0 -> 1.7 ms, 256 at
8 px 17 -> 6 ms; 6 channels about even, 3 channels 1.6x slower; Intel Xeon, 2 threads)."""

CHANNELS_LAST_MAX_CHANNELS = 128
"""...and none reads more than this many, unless the network has a depthwise convolution (one
input channel per group): oneDNN's channels-last convolutions lose on wide, small maps (Intel
Xeon, 2 threads, batch 512, 3x3: 256 channels at 4x4 1.2-2.5x slower, 512 at 2x2 3.1x, against
0.36-0.6x for 32-64 channels at 14-28 px): torchvision's resnet18 on 28 px images predicts at
1.55x its plain passes channels-last, 1.02x as it is (``benchmarks/bench_layout.py``). Its
NCHW depthwise convolutions are slower still: a train step of torchvision's mobilenet_v2,
mobilenet_v3_small, efficientnet_b0 and shufflenet_v2_x1_0 (batch 128, 32 px) takes 0.46,
0.33, 0.38 and 0.63 times as long channels-last, though they read up to 1,280 channels
(resnet18 1.00, resnext50_32x4d, grouped but not depthwise, 1.16)."""

_channels_last_active: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pyrouq_channels_last", default=False
)


@contextlib.contextmanager
def schedule(kind: str) -> Iterator[None]:
    """Run the ``"cpu"`` or the ``"accelerator"`` schedules whatever the device (the tests
    check that both compute the same function; nothing else should need it)."""
    global _forced
    if kind not in ("cpu", "accelerator"):
        raise ValueError(f"Unknown schedule {kind!r}: expected 'cpu' or 'accelerator'.")
    previous, _forced = _forced, kind
    try:
        yield
    finally:
        _forced = previous


def _cpu(x: Tensor) -> bool:
    """Whether the CPU schedules apply to a computation on ``x``."""
    return _forced == "cpu" if _forced is not None else x.device.type == "cpu"


# --------------------------------------------------------------------------------------------
# Preparing a network (exact rewrites, done once at conversion)
# --------------------------------------------------------------------------------------------


def _max_pool_2x2(x: Tensor) -> Tensor:
    """``F.max_pool2d(x, 2)``'s values (no gradient bookkeeping), by two strided maxima."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    x = x[..., :h, :w]
    rows = torch.maximum(x[..., 0::2, :], x[..., 1::2, :])
    return torch.maximum(rows[..., 0::2], rows[..., 1::2])


class _MaxPool2x2Function(torch.autograd.Function):
    """2x2 max-pooling of a 4-d CPU tensor: strided maxima forward, PyTorch's own backward.

    The forward compares the four strided corners of the windows (``a b / c d``), returns
    ``F.max_pool2d(x, 2)``'s values and derives the flat index of each window's first
    maximum in row-major order (a later element wins only when strictly greater) for
    ``max_pool2d_with_indices_backward``: the gradient is ``F.max_pool2d``'s, ties included
    (and NaNs: a window's last NaN takes it, as in torch's kernel).
    Boolean arithmetic instead of ``torch.where`` keeps the index cheap: the forward takes
    about half the time of ``F.max_pool2d``'s on CPU.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
        a, b = x[..., 0:h:2, 0:w:2], x[..., 0:h:2, 1:w:2]
        c, d = x[..., 1:h:2, 0:w:2], x[..., 1:h:2, 1:w:2]
        top, bottom = torch.maximum(a, b), torch.maximum(c, d)
        out = torch.maximum(top, bottom)
        second_row = bottom > top
        right_top, right_bottom = b > a, d > c
        # the winning row's column choice: right_top, or right_bottom where second_row
        second_col = right_top ^ (second_row & (right_top ^ right_bottom))
        width = x.shape[-1]
        corner = torch.arange(0, h, 2, device=x.device).unsqueeze(-1) * width + torch.arange(
            0, w, 2, device=x.device
        )  # flat index of each window's top-left element
        if bool(out.sum().isnan()):  # a NaN (or inf - inf): torch takes a window's last NaN
            nan_a, nan_b, nan_c, nan_d = a.isnan(), b.isnan(), c.isnan(), d.isnan()
            nan_row = nan_c | nan_d
            nan_col = nan_b ^ (nan_row & (nan_b ^ nan_d))
            nan = nan_row | nan_a | nan_b
            second_row = torch.where(nan, nan_row, second_row)
            second_col = torch.where(nan, nan_col, second_col)
        index = torch.add(corner, second_row, alpha=width).add_(second_col)
        ctx.save_for_backward(x, index)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        x, index = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, index
        )


class MaxPool2x2(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` with faster CPU paths (what :func:`prepare` puts in its place).

    Without gradients it takes the maximum of row pairs, then of column pairs (two strided
    ``torch.maximum`` calls): the same values as ``F.max_pool2d(x, 2)`` (odd trailing rows
    and columns dropped likewise), about 10x faster on CPU for LeNet's first activation.
    With gradients, on a 4-d CPU input, it does the same and derives the maxima's indices
    from the comparisons for PyTorch's max-pooling backward: the values and gradients of
    ``F.max_pool2d``, forward and backward in about half its time on LeNet's activations.
    Elsewhere it is ``F.max_pool2d``.
    """

    def __init__(self) -> None:
        super().__init__(2)

    def _get_name(self) -> str:  # repr and messages name the user's class
        return "MaxPool2d"

    def forward(self, x: Tensor) -> Tensor:
        refused = x.dim() not in (3, 4) or 0 in x.shape[-3:] or min(x.shape[-2:]) < 2  # by torch
        if refused or _torchs_own(x):
            return F.max_pool2d(x, 2)
        if torch.is_grad_enabled() and x.requires_grad:
            if x.device.type == "cpu" and x.dim() == 4:
                return _MaxPool2x2Function.apply(x)  # type: ignore[no-any-return]
            return F.max_pool2d(x, 2)
        return _max_pool_2x2(x)


def _pool_channels_last(x: Tensor, pool: nn.MaxPool2d, return_indices: bool) -> Any:
    """``pool`` on ``x`` laid out channels-last (the result is channels-last too)."""
    return F.max_pool2d(  # type: ignore[call-overload]
        x.contiguous(memory_format=torch.channels_last),
        pool.kernel_size,
        pool.stride,
        pool.padding,
        pool.dilation,
        ceil_mode=pool.ceil_mode,
        return_indices=return_indices,
    )


class _MaxPoolChannelsLastFunction(torch.autograd.Function):
    """Max-pooling of a 4-d NCHW CPU tensor, pooled channels-last and returned NCHW, with
    PyTorch's own NCHW backward on the maxima's indices: the values and gradients of
    ``F.max_pool2d`` (the indices are the same, ties and NaNs included)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, pool: nn.MaxPool2d) -> Tensor:  # type: ignore[override]
        out, index = _pool_channels_last(x, pool, return_indices=True)
        ctx.save_for_backward(x, index.contiguous())
        ctx.pool = pool
        return out.contiguous()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        x, index = ctx.saved_tensors
        pool = ctx.pool
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(
            grad,
            x,
            list(_pair(pool.kernel_size)),
            list(_pair(pool.stride)),
            list(_pair(pool.padding)),
            list(_pair(pool.dilation)),
            pool.ceil_mode,
            index,
        )
        return grad_x, None


class MaxPool2dChannelsLast(nn.MaxPool2d):
    """``nn.MaxPool2d`` (any window but 2x2, which :class:`MaxPool2x2` takes) with a faster CPU
    path (what :func:`prepare` puts in its place): a 4-d NCHW input of at least
    :data:`POOL_CHANNELS_LAST_MIN_CHANNELS` channels is pooled channels-last and the result
    returned NCHW, forward and backward (:class:`_MaxPoolChannelsLastFunction`): the same
    values and gradients as ``F.max_pool2d``, in a third of its time on a resnet's 64-channel
    stem. Elsewhere (a channels-last input, an accelerator, few channels) it is
    ``nn.MaxPool2d``."""

    def _get_name(self) -> str:  # repr and messages name the user's class
        return "MaxPool2d"

    def forward(self, x: Tensor) -> Tensor:
        if _torchs_own(x) or not (
            x.device.type == "cpu"
            and x.dim() == 4
            and x.shape[1] >= POOL_CHANNELS_LAST_MIN_CHANNELS
            and x.is_contiguous()
            and not x.is_contiguous(memory_format=torch.channels_last)
        ):
            return super().forward(x)
        if torch.is_grad_enabled() and x.requires_grad:
            return _MaxPoolChannelsLastFunction.apply(x, self)  # type: ignore[no-any-return]
        return _pool_channels_last(x, self, return_indices=False).contiguous()  # type: ignore[no-any-return]


def _torchs_own(x: Tensor) -> bool:
    """Whether the pools run torch's own kernels on ``x``: under a ``torch.func`` transform (grad,
    vmap) or with a forward-mode tangent (their autograd Functions support neither), or for an
    ``x`` dense in neither layout (torch lays its output out anew, as a ``.view()`` after needs)."""
    if torch._C._are_functorch_transforms_active():  # (first: vmap refuses the layout query)
        return True
    if not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)):
        return True
    return torch.autograd.forward_ad.unpack_dual(x).tangent is not None


def _is_plain_2x2_pool(layer: nn.Module) -> bool:
    if type(layer) is not nn.MaxPool2d:
        return False
    pairs = (layer.kernel_size, layer.stride, layer.padding, layer.dilation)
    as_pairs = [p if isinstance(p, tuple) else (p, p) for p in pairs]
    return (
        as_pairs == [(2, 2), (2, 2), (0, 0), (1, 1)]
        and not layer.ceil_mode
        and not layer.return_indices
    )


# torch's layers (not subclasses, which may keep their output) whose output is a new tensor no
# one else holds unless hooked: an in-place ReLU after one changes nothing torch would show
_FRESH = {nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.GroupNorm, nn.LayerNorm}
_FRESH |= {nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d}


def _swaps(previous: nn.Module | None, relu: nn.Module, pool: nn.Module) -> bool:
    """Whether :func:`run_children` runs ``pool`` before ``relu``: a plain ReLU directly
    followed by a :class:`MaxPool2x2`, neither hooked, nor every module (a hook would see other
    values), an in-place ReLU only after an unhooked layer of fresh output (torch changes in
    place what the Sequential's input, an ``nn.Identity``'s output or a hook holds)."""
    if type(relu) is not nn.ReLU or not isinstance(pool, MaxPool2x2):
        return False
    kinds = ("forward", "forward_pre", "backward", "backward_pre")
    hooked = (getattr(torch.nn.modules.module, f"_global_{k}_hooks", None) for k in kinds)
    if has_hooks(relu) or has_hooks(pool) or any(hooked):
        return False
    if not relu.inplace:
        return True
    fresh = type(previous) in _FRESH or any(  # pyrouq's layers: the members' outputs
        getattr(previous, flag, False) for flag in ("_is_batchensemble", "_is_member_norm")
    )
    return fresh and not has_hooks(previous)  # type: ignore[arg-type]


def run_children(sequential: nn.Sequential, x: Any) -> Any:
    """``nn.Sequential``'s forward, but a ReLU directly followed by a 2x2 max-pooling that
    :func:`prepare` made a :class:`MaxPool2x2` runs after it (max-pooling commutes with the
    monotone ReLU, which then runs on a quarter of the values). The children keep their
    places, so indexing and slicing the Sequential give what they gave."""
    children = list(sequential._modules.values())
    i = 0
    while i < len(children):
        previous = children[i - 1] if i else None
        if i + 1 < len(children) and _swaps(previous, children[i], children[i + 1]):
            x = children[i](children[i + 1](x))
            i += 2
        else:
            x = children[i](x)
            i += 1
    return x


class SwappingSequential(nn.Sequential):
    """What :func:`prepare` makes of a plain ``nn.Sequential``: its forward is
    :func:`run_children`."""

    def forward(self, x: Any) -> Any:
        return run_children(self, x)

    def _get_name(self) -> str:  # repr and messages name the user's class
        return "Sequential"


def prepare(net: nn.Module) -> nn.Module:
    """Rewrite ``net`` in place into the same function with faster CPU paths; returns it.

    Every ``nn.MaxPool2d(2)`` becomes a :class:`MaxPool2x2` and every other ``nn.MaxPool2d`` a
    :class:`MaxPool2dChannelsLast` (subclasses, same values and gradients; the same objects,
    their hooks kept), and a plain ``nn.Sequential`` a :class:`SwappingSequential`, which runs
    a ReLU directly followed by a 2x2 max-pooling after it (pyrouq's ``MLP`` and ``LeNet`` do
    the same). Parameters, buffers and the children's places are untouched.
    """
    for module in list(net.modules()):
        if _is_plain_2x2_pool(module):
            module.__class__ = MaxPool2x2
        elif type(module) is nn.MaxPool2d and not module.return_indices:
            module.__class__ = MaxPool2dChannelsLast
        elif type(module) is nn.Sequential:
            module.__class__ = SwappingSequential
    return net


def unprepare(net: nn.Module) -> nn.Module:
    """Undo :func:`prepare`'s class changes in place (for a plain copy handed to the user):
    its pools become ``nn.MaxPool2d`` and its Sequentials ``nn.Sequential`` again."""
    for module in net.modules():
        if type(module) in (MaxPool2x2, MaxPool2dChannelsLast):
            module.__class__ = nn.MaxPool2d
        elif type(module) is SwappingSequential:
            module.__class__ = nn.Sequential  # type: ignore[assignment]
    return net


def _channels_last_pays(net: nn.Module) -> bool:
    """Whether ``net``'s 2-d convolutions are wide enough for channels-last to pay on CPU but none
    too wide (:data:`CHANNELS_LAST_MAX_CHANNELS`; any width with a depthwise one), and none is of
    the kind whose channels-last weight gradient torch 2.14's CPU kernels get wrong: a strided 1x1
    convolution reading fewer than 8 channels (e.g. 4 channels, stride 2: 20-130 % off in
    float32, and a call that never returned at batch 6; found by comparing about 590 random
    convolutions, in both layouts, with float64: every other kind agreed to 1e-4; 154 depthwise
    ones, kernels 3-7, strides 1-2, 8-240 channels, agreed to 5e-6)."""
    widest = 0
    depthwise = False
    for m in net.modules():
        ensemble = getattr(type(m), "_is_batchensemble", False)  # class-level: no __getattr__
        if not (ensemble or isinstance(m, _ConvNd)):
            continue
        conv: Any = m
        weight = conv.weight
        transposed = getattr(type(m), "transposed", False)  # a BatchEnsemble layer's class flag
        if (not ensemble and type(m) is not nn.Conv2d) or transposed or weight.dim() not in (2, 4):
            return False  # transposed, 1-d and 3-d convolutions: not measured, left as they are
        if weight.dim() == 2:
            continue  # a BatchEnsemble Linear
        reads = int(weight.shape[1]) * int(conv.groups)
        one_by_one = tuple(weight.shape[-2:]) == (1, 1)
        strided = any(int(step) != 1 for step in _pair(conv.stride))
        if one_by_one and strided and int(weight.shape[1]) < 8:
            return False
        widest = max(widest, reads)
        depthwise = depthwise or (int(conv.groups) > 1 and int(weight.shape[1]) == 1)
    if depthwise:  # oneDNN's NCHW depthwise convolutions are the slow ones, at any width
        return widest >= CHANNELS_LAST_MIN_CHANNELS
    return CHANNELS_LAST_MIN_CHANNELS <= widest <= CHANNELS_LAST_MAX_CHANNELS


def _pair(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, (tuple, list)) else (value, value)


@contextlib.contextmanager
def channels_last(net: nn.Module, x: Tensor) -> Iterator[Tensor]:
    """``x`` laid out channels-last while ``net`` runs on it, when that pays: on CPU, for a 4-d
    floating input of a network whose widest 2-d convolution reads from
    :data:`CHANNELS_LAST_MIN_CHANNELS` to :data:`CHANNELS_LAST_MAX_CHANNELS` channels, or at least
    the former with a depthwise convolution (and none that :func:`_channels_last_pays` rules
    out). Within the block, :func:`nhwc` gives the 4-d weights the same layout, so oneDNN keeps
    every activation channels-last: ``bayesian(ResidualCNN())`` trains 1.30x faster (AMD EPYC,
    docs/measurements.md), more on a folded BatchEnsemble batch. A one-channel input, and the
    weights of depthwise and 1x1 convolutions, are both layouts at once, and torch then lays a
    convolution's output out NCHW: such outputs are turned channels-last, so that a network made
    of those alone (mobilenet_v2 on MNIST) runs channels-last too. The values are the same
    function's, up to float rounding. Otherwise ``x`` is returned unchanged."""
    if not _lays_out(net, x):
        yield x
        return
    token = _channels_last_active.set(True)
    hooks = [
        m.register_forward_hook(_output_channels_last)
        for m in net.modules()
        if isinstance(m, nn.Conv2d) or getattr(type(m), "_is_batchensemble", False)
    ]
    try:
        yield x.contiguous(memory_format=torch.channels_last)
    finally:
        for hook in hooks:
            hook.remove()
        _channels_last_active.reset(token)


def _lays_out(net: nn.Module, x: Tensor) -> bool:
    """Whether :func:`channels_last` lays ``x`` out channels-last for ``net`` (not already
    inside such a block, and not for a network found to refuse it, see :func:`laid_out`)."""
    return (
        not _channels_last_active.get()
        and not getattr(net, _NCHW_ONLY, False)
        and _cpu(x)
        and x.dim() == 4
        and x.is_floating_point()
        and _channels_last_pays(net)
    )


#: Set on a network whose forward failed channels-last (see :func:`laid_out`), and on one that
#: ran it: the attributes keep the answer.
_NCHW_ONLY, _LAYOUT_CHECKED = "_pyrouq_nchw_only", "_pyrouq_layout_checked"

_VIEW_ERROR = "view size is not compatible with input tensor's size and stride"


def laid_out(net: nn.Module, x: Tensor, body: Any) -> Any:
    """``body(x)``, ``net``'s run on ``x``, inside :func:`channels_last` when that lays ``x``
    out. A forward that ``.view()``s an activation (``h.view(h.size(0), -1)``) fails on a
    channels-last one, which torch's own layout would not: the first run of a network that
    fails so is undone (its buffers, e.g. BatchNorm's running statistics, and the random
    state restored) and run again as torch lays it out, as are all its runs after it."""
    if not _lays_out(net, x):
        return body(x)
    checked = getattr(net, _LAYOUT_CHECKED, False)
    saved = None
    first = x
    if not checked:
        saved = ([b.detach().clone() for b in net.buffers()], torch.get_rng_state())
        first = x.clone()  # the attempt may change it in place: the retry must see x as it was
    try:
        with channels_last(net, first) as laid:
            out = body(laid)
    except RuntimeError as err:
        if saved is None or _VIEW_ERROR not in str(err):
            raise
        with torch.no_grad():
            for buffer, value in zip(net.buffers(), saved[0], strict=True):
                buffer.copy_(value)
        torch.set_rng_state(saved[1])
        setattr(net, _NCHW_ONLY, True)
        return body(x)
    if not checked:
        setattr(net, _LAYOUT_CHECKED, True)
    return out


def _output_channels_last(module: nn.Module, args: Any, out: Any) -> Any:
    """A 4-d output laid out NCHW, channels-last (forward hook of :func:`channels_last`)."""
    if isinstance(out, Tensor) and out.dim() == 4:
        if not out.is_contiguous(memory_format=torch.channels_last):
            return out.contiguous(memory_format=torch.channels_last)
    return None


def nhwc(t: Tensor) -> Tensor:
    """A 4-d tensor in the channels-last layout inside :func:`channels_last`; else ``t``."""
    if t.dim() == 4 and _channels_last_active.get():
        return t.contiguous(memory_format=torch.channels_last)
    return t


def fusable_adam(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor) -> bool:
    """Whether torch's fused Adam kernel (``torch._fused_adam_``) may update ``param`` on CPU:
    one pass over the parameter and its state instead of the seven of the multi-tensor ops
    (an 11M-parameter guide's 22M values: 14 ms a step against 55 ms, Intel Xeon, 2 threads;
    ``benchmarks/bench_wide.py``). The kernel walks the four tensors as one memory layout, so
    they must share it (autograd lays gradients out as their parameters; one set by hand in
    another layout goes through the multi-tensor ops). Its values are those of
    ``torch.optim.Adam(fused=True)`` to the bit, and differ from the multi-tensor ops' in the
    last bit of some entries (float rounding)."""
    return (
        param.device.type == "cpu"
        and _FUSED_ADAM is not None
        and _fused_adam_on_cpu()
        and param.dtype in (torch.float32, torch.float64)
        and grad.dtype == param.dtype
        and not grad.is_sparse
        and (
            param.is_contiguous()
            or (param.dim() == 4 and param.is_contiguous(memory_format=torch.channels_last))
        )
        and grad.stride() == param.stride() == exp_avg.stride() == exp_avg_sq.stride()
    )


def fused_adam(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
) -> None:
    """One Adam update of tensors :func:`fusable_adam` accepted, whose ``steps`` already count
    this step (torch's bias corrections read them)."""
    assert _FUSED_ADAM is not None
    for dtype in {p.dtype for p in params}:
        index = [i for i, p in enumerate(params) if p.dtype == dtype]
        _FUSED_ADAM(
            [params[i] for i in index],
            [grads[i] for i in index],
            [exp_avgs[i] for i in index],
            [exp_avg_sqs[i] for i in index],
            [],
            [steps[i] for i in index],
            lr=lr,
            beta1=betas[0],
            beta2=betas[1],
            weight_decay=0.0,
            eps=eps,
            amsgrad=False,
            maximize=False,
        )


_FUSED_ADAM = getattr(torch, "_fused_adam_", None)


@functools.cache
def _fused_adam_on_cpu() -> bool:
    """Whether this torch has the fused kernel for CPU tensors (from torch 2.4; earlier ones
    have it for CUDA only), tried once on one value."""
    one = [torch.zeros(1) for _ in range(4)]
    try:
        _FUSED_ADAM(  # type: ignore[misc]
            one[:1], one[1:2], one[2:3], one[3:], [], [torch.ones(())], lr=0.0, beta1=0.9,
            beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False,
        )  # fmt: skip
    except (RuntimeError, NotImplementedError):
        return False
    return True
