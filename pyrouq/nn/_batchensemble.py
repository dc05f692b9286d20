"""BatchEnsemble layers: M members folded into the batch, one shared weight and rank-1
factors per member (what :func:`pyrouq.batchensemble` puts in place of Linear and
convolution layers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from pyrouq import _engine
from pyrouq._memory import check_fits
from pyrouq._numbers import check_elements, is_integer
from pyrouq.nn._batchensemble_checks import (
    _CONV_SETTINGS,
    _check_base_fits,
    _check_base_type,
    _check_conv_args,
    _check_factor_init,
    _check_factors_held,
    _check_members,
    _check_sizes,
    _refuse_unknown,
    _settings_given,
    warn_unread_by_random_sign,
)
from pyrouq.nn._batchensemble_norm import NORM_LAYERS as NORM_LAYERS
from pyrouq.nn._batchensemble_norm import BatchEnsembleNorm as BatchEnsembleNorm
from pyrouq.nn._checks import _SPATIAL, check_ensemble_input

FactorInit = Literal["normal", "random_sign"]


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
        num_members = self.num_members = _check_members(num_members)  # (numpy's: an int)
        for factor, size in (("r", in_size), ("s", out_size)):  # (M, in) and (M, out)
            shape = {"num_members": num_members, "features": size}
            check_elements(f"{type(self).__name__}'s {factor}", shape, "Pass fewer members.")
        _check_factor_init(init, r_mean, r_std, s_mean, s_std)
        warn_unread_by_random_sign(
            init, dict(r_mean=r_mean, r_std=r_std, s_mean=s_mean, s_std=s_std)
        )
        device, dtype = self.weight.device, self.weight.dtype
        held = num_members * (in_size + 2 * out_size)  # r, s and the members' biases
        what = f"{type(self).__name__} of {num_members} members (its factors and biases)"
        check_fits(what, held, "Pass fewer members.", device, dtype)
        if init == "normal":
            options = dict(r_mean=r_mean, r_std=r_std, s_mean=s_mean, s_std=s_std)
            _check_factors_held(dtype, options)
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
        if bias is None:  # the members' own biases, from zero; frozen with a frozen layer
            bias = torch.zeros(out_size, device=device, dtype=dtype)
            trainable = self.weight.requires_grad
        else:  # a frozen base bias stays frozen, as does a frozen weight
            trainable = bias.requires_grad if isinstance(bias, nn.Parameter) else True
        self.bias = nn.Parameter(
            bias.detach().to(device, dtype).expand(num_members, -1).clone(),
            requires_grad=trainable,
        )
        self._member: int | None = None  # set during the engine's member passes
        self._member_weights: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]] | None = None

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
        """Every member's effective weight ``(M, *W.shape)`` and bias ``(M, out)``.

        The factors are multiplied first, then the weight once: for a convolution the factors'
        product ``(M, out, in)`` is a kernel's size smaller than the M weights, so these are
        walked once instead of twice."""
        extra = (1,) * (self.weight.dim() - 2)
        r = self._input_factor().reshape(*self._input_factor().shape, *extra)
        s = self.s.reshape(self.num_members, -1, 1, *extra)
        return self.weight.unsqueeze(0) * (s * r), self.bias

    def effective_weight(self, member: int) -> torch.Tensor:
        """Member ``member``'s weight ``diag(s_m) W diag(r_m)`` (for checks and export)."""
        meta = isinstance(member, torch.Tensor) and member.is_meta  # (it holds no value)
        if isinstance(member, torch.Tensor) and member.dim() == 0 and not meta:
            member = int(member) if is_integer(member.item()) else member  # as indexing takes it
        if not is_integer(member) or not -self.num_members <= member < self.num_members:
            raise ValueError(
                f"Expected member to be an int in [-{self.num_members}, {self.num_members}) (one "
                f"of the layer's {self.num_members} members, counted from the end if negative), "
                f"got {member!r}" + (": a meta tensor has no value; pass an int." if meta else ".")
            )
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
        rank = self.weight.dim()
        if rank == 2:
            size = self.weight.shape[1]
            check_ensemble_input(self, x, -1, size, "", min_rank=2)
        else:
            size = self.weight.shape[1] * int(self.groups)  # type: ignore[arg-type]
            check_ensemble_input(self, x, 1, size, _SPATIAL[rank], ranks=(rank,))
        return _engine.batchensemble_forward(self, x)


class BatchEnsembleLinear(_BatchEnsembleLayer):
    """Linear layer of a BatchEnsemble: member m computes ``(x * r_m) W^T * s_m + b_m``.

    One shared weight ``W`` ``(out, in)``, per-member factors ``r`` ``(M, in)`` and ``s``
    ``(M, out)`` and biases ``(M, out)``. Input ``(M * B, ..., in)``, the members folded into
    the batch (member-major), output ``(M * B, ..., out)``.

    Parameters
    ----------
    in_features, out_features, num_members : int
        At least 1; a weight ``(out, in)`` or factors ``(M, in)``, ``(M, out)`` of more than
        ``2**63 - 1`` elements (torch's int64) are refused, as are factors and biases that
        would take more than the whole memory of the device the layer is built on.
    init : {"normal", "random_sign"}, default "normal"
        ``"normal"`` draws r ~ N(r_mean, r_std), s ~ N(s_mean, s_std); ``"random_sign"`` +-1.
    r_mean, r_std, s_mean, s_std : float, default 1.0, 0.5, 1.0, 0.5
        Read by ``init="normal"`` alone: ``"random_sign"`` warns of one other than its default
        (ignored).
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
            name = type(self).__name__
            in_features, out_features = _check_sizes(
                name, in_features=in_features, out_features=out_features
            )
            shape = {"out_features": out_features, "in_features": in_features}
            check_elements(f"{name}'s weight", shape, "Pass smaller sizes.")
            base = nn.Linear(in_features, out_features)
        _check_base_type(type(self).__name__, base, nn.Linear)
        sizes, base_sizes = (in_features, out_features), (base.in_features, base.out_features)
        _check_base_fits(type(self).__name__, base, sizes, base_sizes, {})
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.weight = nn.Parameter(
            base.weight.detach().clone(), requires_grad=base.weight.requires_grad
        )
        self._init_factors(
            num_members, in_features, out_features, base.bias, init, r_mean, r_std, s_mean, s_std
        )

    @classmethod
    def from_module(cls, base: nn.Linear, num_members: int, **options: Any) -> BatchEnsembleLinear:
        """The BatchEnsemble counterpart of ``base`` (its weight and bias copied)."""
        _check_base_type(cls.__name__, base, nn.Linear)
        return cls(base.in_features, base.out_features, num_members, base=base, **options)

    def _op(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, num_members={self.num_members}"


class _BatchEnsembleConv(_BatchEnsembleLayer):
    """Convolution of a BatchEnsemble: member m computes ``conv(x * r_m, W) * s_m + b_m``,
    ``r`` scaling input channels and ``s`` output channels (grouped convolutions included)."""

    _channel_dim = 1
    transposed = False  # class-level, read by the engine's layout choice
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
        **unknown: Any,
    ):
        _refuse_unknown(type(self).__name__, self._base_type, unknown)
        super().__init__()
        given = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
                 "padding_mode": padding_mode}  # fmt: skip
        if base is None:
            sizes = (in_channels, out_channels)
            _check_conv_args(type(self).__name__, self._base_type, sizes, kernel_size, given)
            base = self._base_type(in_channels, out_channels, kernel_size, **given)
            given = {}  # base is built with them
        _check_base_type(type(self).__name__, base, self._base_type)
        given = _settings_given(base, given)
        sizes, base_sizes = (in_channels, out_channels), (base.in_channels, base.out_channels)
        _check_base_fits(type(self).__name__, base, sizes, base_sizes, given, kernel_size)
        self.in_channels = base.in_channels
        self.out_channels = base.out_channels
        self.kernel_size = base.kernel_size
        self.stride = base.stride
        self.padding = base.padding
        self.dilation = base.dilation
        self.groups = base.groups
        self.padding_mode = base.padding_mode
        self._pad = tuple(base._reversed_padding_repeated_twice)
        self.weight = nn.Parameter(
            base.weight.detach().clone(), requires_grad=base.weight.requires_grad
        )
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
        _check_base_type(cls.__name__, base, cls._base_type)
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
        return self.weight.unsqueeze(0) * (s * r), self.bias

    def extra_repr(self) -> str:
        """As torch's convolution prints itself (settings other than the defaults shown), with
        the number of members."""
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
        text += f"stride={self.stride}"
        for key, default in (("padding", 0), ("dilation", 1), ("output_padding", 0)):
            value = getattr(self, key, None)  # a transposed convolution's output_padding
            if value is not None and value != (default,) * len(self.kernel_size):
                text += f", {key}={value}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text + f", num_members={self.num_members}"


class BatchEnsembleConv1d(_BatchEnsembleConv):
    """1-d convolution of a BatchEnsemble; arguments as ``nn.Conv1d`` plus ``num_members``
    and the factor options of :class:`BatchEnsembleLinear`. Input ``(M * B, C, L)``.

    Examples
    --------
    >>> import torch
    >>> layer = BatchEnsembleConv1d(3, 4, 3, num_members=2)
    >>> x = torch.randn(5, 3, 10)
    >>> out = layer(x.repeat(2, 1, 1))  # (M * B, out, L - 2)
    >>> expected = torch.conv1d(x, layer.effective_weight(1), layer.bias[1])
    >>> out.shape, torch.allclose(out[5:], expected, atol=1e-5)
    (torch.Size([10, 4, 8]), True)
    """

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
    and the factor options of :class:`BatchEnsembleLinear`. Input ``(M * B, C, D, H, W)``.

    Examples
    --------
    >>> import torch
    >>> layer = BatchEnsembleConv3d(2, 3, 3, num_members=2, padding=1)
    >>> x = torch.randn(4, 2, 5, 5, 5)
    >>> out = layer(x.repeat(2, 1, 1, 1, 1))
    >>> expected = torch.conv3d(x, layer.effective_weight(0), layer.bias[0], padding=1)
    >>> out.shape, torch.allclose(out[:4], expected, atol=1e-5)
    (torch.Size([8, 3, 5, 5, 5]), True)
    """

    _conv = staticmethod(F.conv3d)
    _base_type = nn.Conv3d


class _BatchEnsembleConvTranspose(_BatchEnsembleConv):
    """Transposed convolution of a BatchEnsemble: member m computes
    ``conv_transpose(x * r_m, W) * s_m + b_m``; W is ``(in, out / groups, *kernel)`` as in
    ``nn.ConvTranspose*d``, and ``forward(x, output_size=None)`` takes torch's ``output_size``."""

    transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        num_members: int,
        *,
        output_padding: Any = 0,
        base: nn.modules.conv._ConvTransposeNd | None = None,
        **options: Any,
    ):
        _refuse_unknown(type(self).__name__, self._base_type, options)  # (before building base)
        if base is None:  # stride, padding, dilation, groups as in torch; the rest: factors
            settings = {k: options.pop(k) for k in _CONV_SETTINGS if k in options}
            given = {**settings, "output_padding": output_padding}
            sizes = (in_channels, out_channels)
            _check_conv_args(type(self).__name__, self._base_type, sizes, kernel_size, given)
            base = self._base_type(
                in_channels, out_channels, kernel_size, output_padding=output_padding, **settings
            )
        else:  # base brings its output_padding too
            _check_base_type(type(self).__name__, base, self._base_type)
            given = _settings_given(base, {"output_padding": output_padding})
            _check_base_fits(type(self).__name__, base, (0, 0), (0, 0), given)
        super().__init__(in_channels, out_channels, kernel_size, num_members, base=base, **options)
        self.output_padding = base.output_padding
        self._output_padding_now = base.output_padding  # what output_size asks for, per call

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, output_size: list[int] | None = None
    ) -> torch.Tensor:
        """Folded batch ``(M * B, in, ...)`` in, ``(M * B, out, ...)`` out (member-major);
        ``output_size`` as in ``nn.ConvTranspose*d``."""
        rank = self.weight.dim()
        size = self.in_channels
        check_ensemble_input(self, x, 1, size, _SPATIAL[rank], ranks=(rank,))
        if output_size is None:
            return _engine.batchensemble_forward(self, x)
        self._output_padding_now = nn.modules.conv._ConvTransposeNd._output_padding(
            self,  # type: ignore[arg-type]
            x,
            output_size,
            list(self.stride),
            list(self.padding),  # type: ignore[arg-type]
            list(self.kernel_size),
            rank - 2,
            list(self.dilation),
        )
        try:
            return _engine.batchensemble_forward(self, x)
        finally:
            self._output_padding_now = self.output_padding

    def _op(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        return self._conv(
            x,
            weight,
            bias,
            self.stride,
            self.padding,
            self._output_padding_now,
            self.groups,
            self.dilation,
        )

    def folded_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        members, groups = self.num_members, self.groups
        per_in, per_out = self.in_channels // groups, self.out_channels // groups
        extra = (1,) * (self.weight.dim() - 2)
        r = self.r.reshape(members, self.in_channels, 1, *extra)
        s = self.s.reshape(members, groups, 1, per_out).expand(members, groups, per_in, per_out)
        s = s.reshape(members, self.in_channels, per_out, *extra)
        return self.weight.unsqueeze(0) * (r * s), self.bias


class BatchEnsembleConvTranspose1d(_BatchEnsembleConvTranspose):
    """1-d transposed convolution of a BatchEnsemble; arguments as ``nn.ConvTranspose1d`` plus
    ``num_members`` and the factor options of :class:`BatchEnsembleLinear`. Input
    ``(M * B, C, L)``.

    Examples
    --------
    >>> import torch
    >>> layer = BatchEnsembleConvTranspose1d(3, 4, 2, num_members=2, stride=2)
    >>> x = torch.randn(5, 3, 6)
    >>> out = layer(x.repeat(2, 1, 1))  # (M * B, out, 12)
    >>> expected = torch.conv_transpose1d(x, layer.effective_weight(1), layer.bias[1], stride=2)
    >>> out.shape, torch.allclose(out[5:], expected, atol=1e-5)
    (torch.Size([10, 4, 12]), True)
    """

    _conv = staticmethod(F.conv_transpose1d)
    _base_type = nn.ConvTranspose1d


class BatchEnsembleConvTranspose2d(_BatchEnsembleConvTranspose):
    """2-d transposed convolution of a BatchEnsemble: member m computes
    ``conv_transpose2d(x * r_m, W) * s_m + b_m``.

    ``r`` ``(M, in_channels)`` scales input channels, ``s`` ``(M, out_channels)`` output
    channels. Arguments as ``nn.ConvTranspose2d`` (``stride``, ``padding``,
    ``output_padding``, ``dilation``, ``groups``) plus ``num_members`` and the factor options
    of :class:`BatchEnsembleLinear`; ``base`` copies an ``nn.ConvTranspose2d``'s settings,
    weight and bias. ``forward(x, output_size=None)`` as torch's.

    Examples
    --------
    >>> import torch
    >>> layer = BatchEnsembleConvTranspose2d(3, 4, 2, num_members=2, stride=2)
    >>> x = torch.randn(5, 3, 4, 4)
    >>> out = layer(x.repeat(2, 1, 1, 1))  # (M * B, out, 8, 8)
    >>> expected = torch.conv_transpose2d(x, layer.effective_weight(1), layer.bias[1], stride=2)
    >>> out.shape, torch.allclose(out[5:], expected, atol=1e-5)
    (torch.Size([10, 4, 8, 8]), True)
    """

    _conv = staticmethod(F.conv_transpose2d)
    _base_type = nn.ConvTranspose2d


class BatchEnsembleConvTranspose3d(_BatchEnsembleConvTranspose):
    """3-d transposed convolution of a BatchEnsemble; arguments as ``nn.ConvTranspose3d`` plus
    ``num_members`` and the factor options of :class:`BatchEnsembleLinear`. Input
    ``(M * B, C, D, H, W)``.

    Examples
    --------
    >>> import torch
    >>> layer = BatchEnsembleConvTranspose3d(2, 3, 2, num_members=2, stride=2)
    >>> x = torch.randn(4, 2, 3, 3, 3)
    >>> out = layer(x.repeat(2, 1, 1, 1, 1))  # (M * B, out, 6, 6, 6)
    >>> w, b = layer.effective_weight(0), layer.bias[0]
    >>> out.shape, torch.allclose(out[:4], torch.conv_transpose3d(x, w, b, stride=2), atol=1e-5)
    (torch.Size([8, 3, 6, 6, 6]), True)
    """

    _conv = staticmethod(F.conv_transpose3d)
    _base_type = nn.ConvTranspose3d


BATCHENSEMBLE_LAYERS: dict[type[nn.Module], type[_BatchEnsembleLayer]] = {
    nn.Linear: BatchEnsembleLinear,
    nn.Conv1d: BatchEnsembleConv1d,
    nn.Conv2d: BatchEnsembleConv2d,
    nn.Conv3d: BatchEnsembleConv3d,
    nn.ConvTranspose1d: BatchEnsembleConvTranspose1d,
    nn.ConvTranspose2d: BatchEnsembleConvTranspose2d,
    nn.ConvTranspose3d: BatchEnsembleConvTranspose3d,
}
"""The layer types :func:`pyrouq.batchensemble` converts (subclasses included)."""
