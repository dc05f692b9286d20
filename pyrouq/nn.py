"""Layers: Bayesian layers (``PyroSample`` weight priors) and the stacked-pipeline machinery.

Shape convention. Layers here pass *stacked* activations: a plain batch ``(B, ...)``, or a batch
with one leading stack dimension ``(S, B, ...)`` where S counts weight draws (Bayesian layers
under a particle or predictive plate) or ensemble members (BatchEnsemble layers). A weighted layer
adds the stack dimension when its weights carry one; stateless layers (activations, pooling,
flatten) run on the merged ``(S * B, ...)`` batch.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, Literal

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyrouq._util import check_count, check_positive_float

__all__ = [
    "BatchEnsembleConv2d",
    "BatchEnsembleLinear",
    "BayesianConv2d",
    "BayesianLinear",
]


def forget_params(prefix: str) -> None:
    """Remove every entry of Pyro's param store registered under ``prefix``."""
    store = pyro.get_param_store()
    for name in [n for n in store.keys() if n.startswith((prefix + ".", prefix + "$$$"))]:
        del store[name]


def _stack_weights(weight: torch.Tensor, event_dim: int) -> tuple[torch.Tensor, torch.Size]:
    """Flatten the leading (sample) dims of ``weight`` into one; return it and those dims."""
    lead = weight.shape[: weight.dim() - event_dim]
    return weight.reshape((-1, *weight.shape[weight.dim() - event_dim :])), lead


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"Expected {name} to be True or False, got {value!r}.")
    return value


class _BayesianLayer(PyroModule):
    """Common part of the Bayesian layers: an isotropic Normal prior on weight and bias, and
    reparameterised draws of the output under an independent Normal weight distribution."""

    weight_shape: tuple[int, ...]
    bias_shape: tuple[int, ...]
    local_reparameterization: bool
    _plain_rank: int  # dims of an unstacked input (B, ...)
    # PyroSample attributes: reading them samples (or replays) a tensor
    weight: torch.Tensor
    bias: torch.Tensor

    def _init_prior(self, prior_scale: float, local_reparameterization: bool) -> None:
        prior_scale = check_positive_float(
            "prior_scale",
            prior_scale,
            "The prior on every weight is Normal(0, prior_scale); pass e.g. prior_scale=1.0.",
        )
        self.local_reparameterization = _check_flag(
            "local_reparameterization", local_reparameterization
        )
        self.register_buffer("prior_loc", torch.tensor(0.0))
        self.register_buffer("prior_scale", torch.tensor(float(prior_scale)))
        self.weight = PyroSample(lambda self: self.prior("weight"))  # type: ignore[assignment]
        self.bias = PyroSample(lambda self: self.prior("bias"))  # type: ignore[assignment]

    def prior(self, kind: Literal["weight", "bias"]) -> dist.Distribution:
        """The prior of the ``"weight"`` or ``"bias"`` site: ``Normal(0, prior_scale)``."""
        shape = self.weight_shape if kind == "weight" else self.bias_shape
        return dist.Normal(self.prior_loc, self.prior_scale).expand(shape).to_event(len(shape))

    def forward_with(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover - abstract
        """The layer with explicit weight and bias (no Pyro sample statements)."""
        raise NotImplementedError

    def moments_with(
        self,
        x: torch.Tensor,
        weight_loc: torch.Tensor,
        weight_scale: torch.Tensor,
        bias_loc: torch.Tensor,
        bias_scale: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of every output (pre-activation) when the weights and biases are
        independent ``Normal(loc, scale)``, for fixed input ``x``::

            mean = layer(x; weight_loc, bias_loc)
            var  = layer(x ** 2; weight_scale ** 2, bias_scale ** 2)

        (for a linear layer ``x mu^T + b_mu`` and ``x^2 (sigma^2)^T + b_sigma^2``; for a
        convolution ``conv(x, mu) + b_mu`` and ``conv(x^2, sigma^2) + b_sigma^2``). Each output
        is exactly Normal with these moments. Shapes as :meth:`forward_with` with unstacked
        weights; ``x`` may be stacked.
        """
        mean = self.forward_with(x, weight_loc, bias_loc)
        var = self.forward_with(x.square(), weight_scale.square(), bias_scale.square())
        return mean, var

    def sample_with(
        self,
        x: torch.Tensor,
        weight_loc: torch.Tensor,
        weight_scale: torch.Tensor,
        bias_loc: torch.Tensor,
        bias_scale: torch.Tensor,
        num_draws: int | None = None,
    ) -> torch.Tensor:
        """A reparameterised draw of the output when weight and bias are ``Normal(loc, scale)``.

        Differentiable with respect to the four tensors (no Pyro sample statements). With
        ``local_reparameterization`` the outputs are drawn directly (one standard-normal noise
        per output per example, ``mean + sqrt(var) * eps`` with the moments of
        :meth:`moments_with`); otherwise one weight and bias are drawn (``loc + scale * eps``)
        and applied to the whole batch. Input ``(B, ...)`` gives ``(B, ...)`` output, or
        ``(num_draws, B, ...)`` with ``num_draws`` independent draws; stacked input
        ``(S, B, ...)`` gives one draw per stack slice (``num_draws`` is then ignored).
        """
        stacked = x.dim() > self._plain_rank
        if self.local_reparameterization:
            mean, var = self.moments_with(x, weight_loc, weight_scale, bias_loc, bias_scale)
            shape = mean.shape if stacked or num_draws is None else (num_draws, *mean.shape)
            eps = torch.randn(shape, dtype=mean.dtype, device=mean.device)
            # var >= bias_scale^2 > 0; the clamp only guards rounding in the convolution
            return torch.addcmul(mean, var.clamp_min(torch.finfo(var.dtype).tiny).sqrt(), eps)
        draws = x.shape[0] if stacked else num_draws
        lead = () if draws is None else (draws,)
        weight = dist.Normal(weight_loc, weight_scale).rsample(lead)
        bias = dist.Normal(bias_loc, bias_scale).rsample(lead)
        return self.forward_with(x, weight, bias)

    def extra_repr(self) -> str:
        lrt = ", local_reparameterization=True" if self.local_reparameterization else ""
        return (
            f"weight_shape={self.weight_shape}, prior=Normal(0, {self.prior_scale.item():g})" + lrt
        )


class BayesianLinear(_BayesianLayer):
    """Linear layer whose weight ``(out, in)`` and bias ``(out,)`` are latent Pyro sites.

    Each forward samples (or, under a guide, replays) ``weight`` and ``bias`` from
    ``Normal(0, prior_scale)`` priors. Weights may carry leading sample dimensions (vectorised
    particles, ``Predictive(parallel=True)``): the layer then uses one batched matmul and
    returns ``(S, B, out)``.

    Parameters
    ----------
    in_features, out_features : int
    prior_scale : float, default 1.0
        Standard deviation of the Normal prior on every weight and bias.
    local_reparameterization : bool, default False
        How :meth:`sample_with` (the training path of :class:`pyrouq.KLWeightedELBO`) draws the
        output under a Normal guide: pre-activations ``Normal(x mu^T + b_mu, x^2 (sigma^2)^T +
        b_sigma^2)`` with one noise per output per example (True; lower-variance gradients), or
        one weight draw for the whole batch (False). ``forward`` is unaffected: it always
        samples (or replays) the weight and bias sites.

    Examples
    --------
    >>> import torch
    >>> layer = BayesianLinear(3, 2)
    >>> layer(torch.randn(5, 3)).shape
    torch.Size([5, 2])
    """

    _plain_rank = 2

    def __init__(
        self,
        in_features: int,
        out_features: int,
        prior_scale: float = 1.0,
        local_reparameterization: bool = False,
    ):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight_shape = (out_features, in_features)
        self.bias_shape = (out_features,)
        self._init_prior(prior_scale, local_reparameterization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with(x, self.weight, self.bias)

    def forward_with(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
        """The layer with explicit weight and bias (no Pyro sample statements)."""
        if weight.dim() == 2:
            return F.linear(x, weight, bias)
        w, _ = _stack_weights(weight, 2)  # (S, out, in)
        b, _ = _stack_weights(bias, 1)  # (S, out)
        # x: (B, in) broadcasts against every draw; (S, B, in) pairs draw s with stack s.
        return torch.baddbmm(b.unsqueeze(1), x.expand(w.shape[0], *x.shape[-2:]), w.mT)


class BayesianConv2d(_BayesianLayer):
    """2-d convolution whose kernel ``(out, in, k, k)`` and bias ``(out,)`` are latent sites.

    With weight draws carrying a leading sample dimension S, all draws run as one grouped
    convolution (``groups=S``) and the output is ``(S, B, out, H', W')``.

    Parameters
    ----------
    in_channels, out_channels, kernel_size : int
    stride, padding : int, default 1 and 0
    prior_scale : float, default 1.0
    local_reparameterization : bool, default False
        As for :class:`BayesianLinear`, with moments ``conv(x, mu) + b_mu`` and ``conv(x^2,
        sigma^2) + b_sigma^2`` and one noise per output pixel per example.

    .. warning:: For a convolution, local reparameterisation gets every output's marginal
       right, but treats the outputs of one example at different positions as independent,
       whereas a weight draw (shared kernel) correlates them. The likelihood term it estimates
       is therefore an approximation of the ELBO's, unlike for linear layers, where it is exact.
    """

    _plain_rank = 4

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        prior_scale: float = 1.0,
        local_reparameterization: bool = False,
    ):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.weight_shape = (out_channels, in_channels, kernel_size, kernel_size)
        self.bias_shape = (out_channels,)
        self._init_prior(prior_scale, local_reparameterization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_with(x, self.weight, self.bias)

    def forward_with(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
        """The layer with explicit weight and bias (no Pyro sample statements)."""
        if weight.dim() == 4:
            if x.dim() == 5:
                s, b = x.shape[:2]
                out = F.conv2d(x.flatten(0, 1), weight, bias, self.stride, self.padding)
                return out.unflatten(0, (s, b))
            return F.conv2d(x, weight, bias, self.stride, self.padding)
        w, _ = _stack_weights(weight, 4)  # (S, out, in, k, k)
        bias_s, _ = _stack_weights(bias, 1)
        s = w.shape[0]
        if x.dim() == 4:  # same inputs for every draw
            batch = x.shape[0]
            grouped = x.repeat(1, s, 1, 1)
        else:  # (S, B, C, H, W): draw s sees stack s
            batch = x.shape[1]
            grouped = x.transpose(0, 1).reshape(batch, s * x.shape[2], *x.shape[3:])
        out = F.conv2d(
            grouped,
            w.reshape(-1, *w.shape[2:]),
            bias_s.reshape(-1),
            self.stride,
            self.padding,
            groups=s,
        )
        return out.reshape(batch, s, self.out_channels, *out.shape[2:]).transpose(0, 1)


# --------------------------------------------------------------------------------------------
# Stacked pipelines
# --------------------------------------------------------------------------------------------


def _max_pool_2x2(x: torch.Tensor) -> torch.Tensor:
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
    ``max_pool2d_with_indices_backward``: the gradient is ``F.max_pool2d``'s, ties included.
    Boolean arithmetic instead of ``torch.where`` keeps the index cheap: the forward takes
    about half the time of ``F.max_pool2d``'s on CPU.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
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
        index = torch.add(corner, second_row, alpha=width).add_(second_col)
        ctx.save_for_backward(x, index)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x, index = ctx.saved_tensors
        return torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, index
        )


class MaxPool2x2(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` with faster CPU paths.

    Without gradients it takes the maximum of row pairs, then of column pairs (two strided
    ``torch.maximum`` calls): the same values as ``F.max_pool2d(x, 2)`` (odd trailing rows
    and columns dropped likewise), about 10x faster on CPU for LeNet's first activation.
    With gradients, on a 4-d CPU input, it does the same and derives the maxima's indices
    from the comparisons for PyTorch's max-pooling backward: the values and gradients of
    ``F.max_pool2d``, forward and backward in about half its time on LeNet's activations
    (3.4 ms against 6.8 ms for ``(512, 6, 24, 24)`` on the 2-core machine of
    ``benchmarks/results.md``). Elsewhere it is ``F.max_pool2d``.
    """

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            if x.device.type == "cpu" and x.dim() == 4:
                return _MaxPool2x2Function.apply(x)  # type: ignore[no-any-return]
            return F.max_pool2d(x, 2)
        return _max_pool_2x2(x)


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


def _is_stateless(module: nn.Module) -> bool:
    return not any(True for _ in module.parameters()) and not any(True for _ in module.buffers())


def run_pipeline(
    owner: nn.Module,
    steps: tuple[tuple[str, nn.Module | None], ...],
    x: torch.Tensor,
    weighted: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Run ``steps`` (name, stateless module or None for a weighted child of ``owner``) on x.

    A weighted child is looked up on ``owner`` by name (so Pyro sees it), or applied through
    ``weighted(name, x)`` when given; a stateless module runs on the merged stack
    ``(S * B, ...)`` when the activations carry a stack dimension.
    """
    stacked = False
    for name, stateless in steps:
        if stateless is None:
            rank = x.dim()
            x = getattr(owner, name)(x) if weighted is None else weighted(name, x)
            stacked = stacked or x.dim() > rank
        elif stacked:
            x = stateless(x.flatten(0, 1)).unflatten(0, x.shape[:2])
        else:
            x = stateless(x)
    return x


def build_pipeline(
    owner: nn.Module,
    spec: nn.Sequential,
    convert: Callable[[str, nn.Module], nn.Module],
) -> tuple[tuple[str, nn.Module | None], ...]:
    """Attach ``convert(name, layer)`` for each weighted layer of ``spec`` to ``owner``.

    Returns the steps for :func:`run_pipeline`; stateless layers are copied (a 2x2 max-pooling
    as :class:`MaxPool2x2`). A ReLU followed by a max-pooling is run as pooling then ReLU, the
    same function (both are monotone) with the ReLU on a quarter of the values.
    """
    steps: list[tuple[str, nn.Module | None]] = []
    for name, layer in spec.named_children():
        if _is_plain_2x2_pool(layer):
            steps.append((name, MaxPool2x2()))
        elif _is_stateless(layer):
            steps.append((name, copy.deepcopy(layer)))
        else:
            setattr(owner, name, convert(name, layer))
            steps.append((name, None))
    # max-pooling commutes with ReLU (both monotone): pool first, then ReLU on 4x fewer values
    for i in range(len(steps) - 1):
        (_, first), (_, second) = steps[i], steps[i + 1]
        if isinstance(first, nn.ReLU) and isinstance(second, nn.MaxPool2d):
            steps[i], steps[i + 1] = steps[i + 1], steps[i]
    return tuple(steps)


# --------------------------------------------------------------------------------------------
# BatchEnsemble layers
# --------------------------------------------------------------------------------------------

FactorInit = Literal["normal", "random_sign"]


def _check_members(num_members: object) -> int:
    return check_count(
        "num_members",
        num_members,
        "BatchEnsemble needs at least one member; 4 is a common choice.",
    )


def _check_factor_init(init: str, r_std: float, s_std: float) -> None:
    if init not in ("normal", "random_sign"):
        raise ValueError(
            f"Unknown init {init!r}: expected 'normal' (r ~ N(r_mean, r_std), s ~ N(s_mean, "
            "s_std)) or 'random_sign' (entries +-1)."
        )
    for name, value in (("r_std", r_std), ("s_std", s_std)):
        if not (isinstance(value, (int, float)) and math.isfinite(value)) or value < 0:
            raise ValueError(
                f"Expected {name} >= 0 (a finite float), got {value!r}. It is the standard "
                "deviation of the rank-1 factors around their mean; 0.5 is the default."
            )


class _BatchEnsembleLayer(PyroModule):
    """Shared weight, per-member rank-1 factors ``r`` (input side), ``s`` (output side), bias."""

    weight: nn.Parameter
    r: nn.Parameter
    s: nn.Parameter
    bias: nn.Parameter
    num_members: int

    def _init_factors(
        self,
        num_members: int,
        in_size: int,
        out_size: int,
        bias: torch.Tensor | None,
        init: str,
        r_mean: float,
        r_std: float,
        s_mean: float,
        s_std: float,
    ) -> None:
        self.num_members = _check_members(num_members)
        _check_factor_init(init, r_std, s_std)
        device, dtype = self.weight.device, self.weight.dtype
        r = torch.empty(num_members, in_size, device=device, dtype=dtype)
        s = torch.empty(num_members, out_size, device=device, dtype=dtype)
        if init == "normal":
            nn.init.normal_(r, r_mean, r_std)
            nn.init.normal_(s, s_mean, s_std)
        else:
            r.bernoulli_(0.5).mul_(2).sub_(1)
            s.bernoulli_(0.5).mul_(2).sub_(1)
        self.r = nn.Parameter(r)
        self.s = nn.Parameter(s)
        if bias is None:
            bias = torch.zeros(out_size, device=device, dtype=dtype)
        self.bias = nn.Parameter(bias.detach().to(device, dtype).expand(num_members, -1).clone())

    def _check_stacked(self, x: torch.Tensor, plain_rank: int) -> None:
        if x.dim() != plain_rank + 1 or x.shape[0] != self.num_members:
            raise ValueError(
                f"{type(self).__name__} with {self.num_members} members expects input of "
                f"{plain_rank} dims (B, ...) or {plain_rank + 1} dims ({self.num_members}, B, "
                f"...), got shape {tuple(x.shape)}."
            )

    def _folded(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's effective weight and bias, stacked along the output dimension.

        Returns ``(M * out, in, ...)`` weights (block m is ``diag(s_m) W diag(r_m)``) and
        ``(M * out,)`` biases. A shared input ``(B, in, ...)`` then goes through *one* op with
        M * out outputs: no gradient with respect to the input and no per-member scaling of
        large activations (the factors' gradients flow through the small weight tensor).
        """
        extra = (1,) * (self.weight.dim() - 2)
        r = self.r.reshape(self.num_members, 1, -1, *extra)
        s = self.s.reshape(self.num_members, -1, 1, *extra)
        return (s * self.weight.unsqueeze(0) * r).flatten(0, 1), self.bias.reshape(-1)

    def _scaled_input(self, x: torch.Tensor) -> torch.Tensor:
        """``x * r_m`` for stacked input ``(M, B, in, ...)``."""
        extra = (1,) * (x.dim() - 3)
        return x * self.r.reshape(self.num_members, 1, -1, *extra)

    def _member_output(self, out: torch.Tensor) -> torch.Tensor:
        """``out * s_m + b_m`` for ``out`` of shape ``(M, B, out, ...)``."""
        shape = (self.num_members, 1, self.s.shape[1]) + (1,) * (out.dim() - 3)
        return torch.addcmul(self.bias.reshape(shape), out, self.s.reshape(shape))

    def _shared_output(self, out: torch.Tensor) -> torch.Tensor:
        """``(B, M * out, ...)`` from a folded op to the stacked ``(M, B, out, ...)``."""
        return out.unflatten(1, (self.num_members, -1)).transpose(0, 1)

    def member_forward(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover - abstract
        """Apply one member, given its effective weight and bias (see :meth:`_folded`)."""
        raise NotImplementedError

    def effective_weight(self, member: int) -> torch.Tensor:
        """Member ``i``'s weight ``diag(s_i) W diag(r_i)`` (for checks and export)."""
        extra = (1,) * (self.weight.dim() - 2)
        s = self.s[member].reshape(-1, 1, *extra)
        r = self.r[member].reshape(1, -1, *extra)
        return s * self.weight * r


class BatchEnsembleLinear(_BatchEnsembleLayer):
    """Linear layer of a BatchEnsemble: member i computes ``(x * r_i) W^T * s_i + b_i``.

    One shared weight ``W`` ``(out, in)``, per-member factors ``r`` ``(M, in)`` and ``s``
    ``(M, out)`` and biases ``(M, out)``; the effective weight of member i is
    ``diag(s_i) W diag(r_i)``. Input ``(B, in)`` (every member sees it) or ``(M, B, in)``
    (member i sees slice i); output ``(M, B, out)``. All members run in one batched matmul.

    Parameters
    ----------
    in_features, out_features, num_members : int
    init : {"normal", "random_sign"}, default "normal"
        ``"normal"`` draws r ~ N(r_mean, r_std), s ~ N(s_mean, s_std); ``"random_sign"`` +-1.
    r_mean, r_std, s_mean, s_std : float, default 1.0, 0.5, 1.0, 0.5
    base : nn.Linear, optional
        Copy W and the bias (to every member) from this layer; default a fresh ``nn.Linear``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        num_members: int,
        *,
        init: FactorInit = "normal",
        r_mean: float = 1.0,
        r_std: float = 0.5,
        s_mean: float = 1.0,
        s_std: float = 0.5,
        base: nn.Linear | None = None,
    ):
        super().__init__()
        if base is None:
            base = nn.Linear(in_features, out_features)
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(base.weight.detach().clone())
        self._init_factors(
            num_members, in_features, out_features, base.bias, init, r_mean, r_std, s_mean, s_std
        )

    def member_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
        return F.linear(x, weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return self._shared_output(F.linear(x, *self._folded()))
        self._check_stacked(x, 2)
        return self._member_output(F.linear(self._scaled_input(x), self.weight))


class BatchEnsembleConv2d(_BatchEnsembleLayer):
    """2-d convolution of a BatchEnsemble: member i computes ``conv(x * r_i, W) * s_i + b_i``.

    ``r`` ``(M, in_channels)`` scales input channels, ``s`` ``(M, out_channels)`` output
    channels. Input ``(B, C, H, W)`` or ``(M, B, C, H, W)``; output ``(M, B, out, H', W')``,
    all members in one convolution over the ``M * B`` batch. Arguments as
    :class:`BatchEnsembleLinear`, plus ``kernel_size``, ``stride``, ``padding``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        num_members: int,
        *,
        stride: int = 1,
        padding: int = 0,
        init: FactorInit = "normal",
        r_mean: float = 1.0,
        r_std: float = 0.5,
        s_mean: float = 1.0,
        s_std: float = 0.5,
        base: nn.Conv2d | None = None,
    ):
        super().__init__()
        if base is None:
            base = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.stride = base.stride
        self.padding = base.padding
        self.weight = nn.Parameter(base.weight.detach().clone())
        self._init_factors(
            num_members, in_channels, out_channels, base.bias, init, r_mean, r_std, s_mean, s_std
        )

    def member_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
        return F.conv2d(x, weight, bias, self.stride, self.padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = x.dim() == 4
        if not shared:
            self._check_stacked(x, 4)
        if shared and self.in_channels == 1:
            # One input channel: r_m is a scalar per member and commutes with the convolution,
            # so every member shares one convolution: conv(x r_m, W) s_m = conv(x, W) r_m s_m.
            base = F.conv2d(x, self.weight, None, self.stride, self.padding)
            scale = (self.r * self.s).reshape(self.num_members, 1, -1, 1, 1)
            return torch.addcmul(self.bias.reshape(scale.shape), base.unsqueeze(0), scale)
        if shared:
            weight, bias = self._folded()
            return self._shared_output(F.conv2d(x, weight, bias, self.stride, self.padding))
        h = self._scaled_input(x).flatten(0, 1)
        out = F.conv2d(h, self.weight, None, self.stride, self.padding)
        return self._member_output(out.unflatten(0, x.shape[:2]))
