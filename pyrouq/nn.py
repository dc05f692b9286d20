"""Layers: Bayesian layers (``PyroSample`` weight priors) and BatchEnsemble layers.

Bayesian layers are standalone Pyro modules for hand-written Pyro models; their weight and bias
may carry leading sample dimensions ``(S, ...)`` (vectorised particles, ``Predictive(parallel=
True)``), and the output then is ``(S, B, ...)``. (Networks made Bayesian by
:func:`pyrouq.bayesian` keep their own layers; see :mod:`pyrouq.convert`.)

BatchEnsemble layers are what :func:`pyrouq.batchensemble` puts in place of every ``nn.Linear``
and convolution: M members folded into the batch, input and output ``(M * B, ...)``
(member-major: rows ``m * B ... (m + 1) * B - 1`` belong to member m).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample
from torch import nn

from pyrouq import _engine
from pyrouq._util import check_count, check_positive_float

__all__ = [
    "BatchEnsembleConv1d",
    "BatchEnsembleConv2d",
    "BatchEnsembleConv3d",
    "BatchEnsembleLinear",
    "BayesianConv2d",
    "BayesianLinear",
]


def _stack_weights(weight: torch.Tensor, event_dim: int) -> tuple[torch.Tensor, torch.Size]:
    """Flatten the leading (sample) dims of ``weight`` into one; return it and those dims."""
    lead = weight.shape[: weight.dim() - event_dim]
    return weight.reshape((-1, *weight.shape[weight.dim() - event_dim :])), lead


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"Expected {name} to be True or False, got {value!r}.")
    return value


# --------------------------------------------------------------------------------------------
# Bayesian layers
# --------------------------------------------------------------------------------------------


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


class _BatchEnsembleLayer(nn.Module):
    """Shared weight W, per-member rank-1 factors ``r`` (input side), ``s`` (output side) and
    per-member biases; member m's effective weight is ``diag(s_m) W diag(r_m)``."""

    _is_batchensemble = True
    weight: nn.Parameter
    r: nn.Parameter
    s: nn.Parameter
    bias: nn.Parameter
    num_members: int
    _channel_dim: int  # dim of the features in one member's activations (B, ...)

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
        self._member: int | None = None  # set during the engine's member passes
        self._member_weights: tuple[torch.Tensor, torch.Tensor] | None = None

    def _op(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:  # pragma: no cover - abstract
        """The plain layer with explicit weight and bias."""
        raise NotImplementedError

    def _input_factor(self) -> torch.Tensor:
        """``r`` laid out like one member's weight: ``(M, 1, in)`` (Linear) or
        ``(M, out, in / groups)`` (convolutions)."""
        return self.r.unsqueeze(1)

    def folded_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every member's effective weight ``(M, *W.shape)`` and bias ``(M, out)``."""
        extra = (1,) * (self.weight.dim() - 2)
        r = self._input_factor().reshape(*self._input_factor().shape, *extra)
        s = self.s.reshape(self.num_members, -1, 1, *extra)
        return s * self.weight.unsqueeze(0) * r, self.bias

    def effective_weight(self, member: int) -> torch.Tensor:
        """Member ``member``'s weight ``diag(s_m) W diag(r_m)`` (for checks and export)."""
        return self.folded_weights()[0][member]

    def _factor_view(self, factor: torch.Tensor, ndim: int) -> torch.Tensor:
        """``factor`` ``(M, C)`` shaped to broadcast against stacked activations ``(M, B, ...)``
        of ``ndim`` dims, C on the feature dim."""
        shape = [1] * ndim
        shape[0] = self.num_members
        shape[self._channel_dim + 1 if self._channel_dim >= 0 else self._channel_dim] = -1
        return factor.reshape(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Folded batch ``(M * B, ...)`` in, ``(M * B, ...)`` out (member-major)."""
        return _engine.batchensemble_forward(self, x)


class BatchEnsembleLinear(_BatchEnsembleLayer):
    """Linear layer of a BatchEnsemble: member m computes ``(x * r_m) W^T * s_m + b_m``.

    One shared weight ``W`` ``(out, in)``, per-member factors ``r`` ``(M, in)`` and ``s``
    ``(M, out)`` and biases ``(M, out)``. Input ``(M * B, ..., in)``, the members folded into
    the batch (member-major), output ``(M * B, ..., out)``.

    Parameters
    ----------
    in_features, out_features, num_members : int
    init : {"normal", "random_sign"}, default "normal"
        ``"normal"`` draws r ~ N(r_mean, r_std), s ~ N(s_mean, s_std); ``"random_sign"`` +-1.
    r_mean, r_std, s_mean, s_std : float, default 1.0, 0.5, 1.0, 0.5
    base : nn.Linear, optional
        Copy W and the bias (to every member) from this layer; default a fresh ``nn.Linear``.

    Examples
    --------
    >>> import torch
    >>> layer = BatchEnsembleLinear(4, 3, num_members=2)
    >>> x = torch.randn(5, 4)
    >>> out = layer(x.repeat(2, 1))  # (M * B, out)
    >>> torch.allclose(out[5:], x @ layer.effective_weight(1).T + layer.bias[1], atol=1e-6)
    True
    """

    _channel_dim = -1

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

    @classmethod
    def from_module(cls, base: nn.Linear, num_members: int, **options: Any) -> BatchEnsembleLinear:
        """The BatchEnsemble counterpart of ``base`` (its weight and bias copied)."""
        return cls(base.in_features, base.out_features, num_members, base=base, **options)

    def _op(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, num_members={self.num_members}"


class _BatchEnsembleConv(_BatchEnsembleLayer):
    """Convolution of a BatchEnsemble: member m computes ``conv(x * r_m, W) * s_m + b_m``,
    ``r`` scaling input channels and ``s`` output channels (grouped convolutions included)."""

    _channel_dim = 1
    _conv: Any  # F.conv1d / conv2d / conv3d
    _base_type: Any  # nn.Conv1d / Conv2d / Conv3d

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        num_members: int,
        *,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
        padding_mode: Any = "zeros",
        init: FactorInit = "normal",
        r_mean: float = 1.0,
        r_std: float = 0.5,
        s_mean: float = 1.0,
        s_std: float = 0.5,
        base: nn.modules.conv._ConvNd | None = None,
    ):
        super().__init__()
        if base is None:
            base = self._base_type(
                in_channels,
                out_channels,
                kernel_size,
                stride=stride,
                padding=padding,
                dilation=dilation,
                groups=groups,
                padding_mode=padding_mode,
            )
        self.in_channels = base.in_channels
        self.out_channels = base.out_channels
        self.kernel_size = base.kernel_size
        self.stride = base.stride
        self.padding = base.padding
        self.dilation = base.dilation
        self.groups = base.groups
        self.padding_mode = base.padding_mode
        self._pad = tuple(base._reversed_padding_repeated_twice)
        self.weight = nn.Parameter(base.weight.detach().clone())
        self._init_factors(
            num_members,
            base.in_channels,
            base.out_channels,
            base.bias,
            init,
            r_mean,
            r_std,
            s_mean,
            s_std,
        )

    @classmethod
    def from_module(
        cls, base: nn.modules.conv._ConvNd, num_members: int, **options: Any
    ) -> _BatchEnsembleConv:
        """The BatchEnsemble counterpart of ``base`` (its weight, bias and settings copied)."""
        return cls(
            base.in_channels, base.out_channels, base.kernel_size, num_members, base=base, **options
        )

    def _op(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        padding: Any = self.padding
        if self.padding_mode != "zeros":
            x = F.pad(x, self._pad, mode=self.padding_mode)
            padding = 0
        return self._conv(x, weight, bias, self.stride, padding, self.dilation, self.groups)

    def _input_factor(self) -> torch.Tensor:
        members, groups = self.num_members, self.groups
        per_in, per_out = self.in_channels // groups, self.out_channels // groups
        r = self.r.reshape(members, groups, 1, per_in).expand(members, groups, per_out, per_in)
        return r.reshape(members, self.out_channels, per_in)

    def folded_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        extra = (1,) * (self.weight.dim() - 2)
        r = self._input_factor().reshape(self.num_members, self.out_channels, -1, *extra)
        s = self.s.reshape(self.num_members, -1, 1, *extra)
        return s * self.weight.unsqueeze(0) * r, self.bias

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, num_members={self.num_members}"
        )


class BatchEnsembleConv1d(_BatchEnsembleConv):
    """1-d convolution of a BatchEnsemble; arguments as ``nn.Conv1d`` plus ``num_members``
    and the factor options of :class:`BatchEnsembleLinear`. Input ``(M * B, C, L)``."""

    _conv = staticmethod(F.conv1d)
    _base_type = nn.Conv1d


class BatchEnsembleConv2d(_BatchEnsembleConv):
    """2-d convolution of a BatchEnsemble: member m computes ``conv(x * r_m, W) * s_m + b_m``.

    ``r`` ``(M, in_channels)`` scales input channels, ``s`` ``(M, out_channels)`` output
    channels; grouped and depthwise convolutions included. Input ``(M * B, C, H, W)`` (members
    folded into the batch, member-major), output ``(M * B, out, H', W')``. Arguments as
    ``nn.Conv2d`` (``stride``, ``padding``, ``dilation``, ``groups``, ``padding_mode``) plus
    ``num_members`` and the factor options of :class:`BatchEnsembleLinear`; ``base`` copies an
    ``nn.Conv2d``'s settings, weight and bias.

    Examples
    --------
    >>> import torch
    >>> layer = BatchEnsembleConv2d(3, 4, 3, num_members=2, padding=1)
    >>> x = torch.randn(5, 3, 8, 8)
    >>> out = layer(x.repeat(2, 1, 1, 1))
    >>> expected = torch.conv2d(x, layer.effective_weight(0), layer.bias[0], padding=1)
    >>> torch.allclose(out[:5], expected, atol=1e-5)
    True
    """

    _conv = staticmethod(F.conv2d)
    _base_type = nn.Conv2d


class BatchEnsembleConv3d(_BatchEnsembleConv):
    """3-d convolution of a BatchEnsemble; arguments as ``nn.Conv3d`` plus ``num_members``
    and the factor options of :class:`BatchEnsembleLinear`. Input ``(M * B, C, D, H, W)``."""

    _conv = staticmethod(F.conv3d)
    _base_type = nn.Conv3d


BATCHENSEMBLE_LAYERS: dict[type[nn.Module], type[_BatchEnsembleLayer]] = {
    nn.Linear: BatchEnsembleLinear,
    nn.Conv1d: BatchEnsembleConv1d,
    nn.Conv2d: BatchEnsembleConv2d,
    nn.Conv3d: BatchEnsembleConv3d,
}
"""The layer types :func:`pyrouq.batchensemble` converts (subclasses included)."""
