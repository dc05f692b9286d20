"""Bayesian layers: standalone Pyro modules whose weight and bias are latent sites with
``PyroSample`` priors (for hand-written Pyro models)."""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroSample

from pyrouq._engine._layer_calls import noise_scale
from pyrouq._numbers import check_at_most, check_elements, is_integer
from pyrouq._util import check_flag, check_held, check_int, check_positive_float
from pyrouq.nn._checks import check_layer_input

PRIOR_SCALE_HINT = "The prior on every weight is Normal(0, prior_scale); pass e.g. prior_scale=1.0."


def check_prior_scale(value: object) -> float:
    """``prior_scale`` as a float > 0 that torch's default dtype (the prior's) holds as one,
    or a ValueError: 1e-50 would be a prior of scale 0 in float32, 1e40 one of scale inf."""
    scale = check_positive_float("prior_scale", value, PRIOR_SCALE_HINT)
    check_held(
        "prior_scale", scale, torch.get_default_dtype(), "the prior's dtype", PRIOR_SCALE_HINT
    )
    return scale


def _stack_weights(weight: torch.Tensor, event_dim: int) -> tuple[torch.Tensor, torch.Size]:
    """Flatten the leading (sample) dims of ``weight`` into one; return it and those dims."""
    lead = weight.shape[: weight.dim() - event_dim]
    return weight.reshape((-1, *weight.shape[weight.dim() - event_dim :])), lead


def _check_sizes(layer: str, **sizes: object) -> tuple[int, ...]:
    """The layer's sizes as ints, or a ValueError naming the layer and a size that is not a
    positive integer."""
    return tuple(
        check_int(f"{layer}'s {name}", value, hint=f"Pass {name} as an int such as 16.")
        for name, value in sizes.items()
    )


def _conv_pair(
    name: str, value: object, minimum: int, example: str, words: tuple[str, ...] = ()
) -> tuple[int, int] | str:
    """A BayesianConv2d size (an int ``k`` or a pair ``(kh, kw)``, each ``>= minimum``, or one
    of ``words``) as ``(kh, kw)`` (or the word), or a ValueError naming it and ``value``."""
    if isinstance(value, str) and value in words:
        return value
    pair = value if isinstance(value, (tuple, list)) else (value,) * 2
    if len(pair) != 2 or any(not is_integer(k) or k < minimum for k in pair):
        kind = "a positive int" if minimum == 1 else "an int >= 0"
        named = "".join(f" or {w!r}" for w in words)
        raise ValueError(
            f"Expected BayesianConv2d's {name} to be {kind} or a pair of them "
            f"({name[0]}h, {name[0]}w){named}, "
            f"got {value!r}. Pass e.g. {example}."
        )
    for k in pair:
        check_at_most(f"BayesianConv2d's {name}", int(k), f"Pass e.g. {example}.")
    return int(pair[0]), int(pair[1])


def _positive_pair(name: str, value: object, example: str) -> tuple[int, int]:
    """``kernel_size`` or ``stride`` (an int ``k`` or a pair ``(kh, kw)``) as ``(kh, kw)``."""
    pair = _conv_pair(name, value, 1, example)
    assert not isinstance(pair, str)  # no words allowed
    return pair


def _check_scales(layer: str, **scales: torch.Tensor) -> None:
    """Refuse scales that are not all > 0 (a Normal's), as the weight draws' ``Normal`` does:
    local reparameterisation squares them, and would take a negative one as its absolute."""
    for name, scale in scales.items():
        if not bool((scale > 0).all()):
            bad = scale[~(scale > 0)].flatten()[0].item()
            raise ValueError(
                f"{layer}.sample_with expects {name} > 0 (the standard deviations of the "
                f"Normal weight distribution), got a value of {bad}. Pass positive scales, e.g. "
                "softplus(raw) or raw.exp() of an unconstrained parameter."
            )


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
        prior_scale = check_prior_scale(prior_scale)
        self.local_reparameterization = check_flag(
            "local_reparameterization", local_reparameterization
        )
        self.register_buffer("prior_loc", torch.tensor(0.0))
        self.register_buffer("prior_scale", torch.tensor(float(prior_scale)))
        # partials of a module-level function, not lambdas, so that the layer pickles
        # (torch.save of a model); PyroSample renames a function it gets, not a partial
        self.weight = PyroSample(partial(_site_prior, kind="weight"))  # type: ignore[assignment,arg-type]
        self.bias = PyroSample(partial(_site_prior, kind="bias"))  # type: ignore[assignment,arg-type]

    def prior(self, kind: Literal["weight", "bias"]) -> dist.Distribution:
        """The prior of the ``"weight"`` or ``"bias"`` site: ``Normal(0, prior_scale)``."""
        if kind not in ("weight", "bias"):
            raise ValueError(f"Expected kind 'weight' or 'bias' (the layer's sites), got {kind!r}.")
        shape = self.weight_shape if kind == "weight" else self.bias_shape
        return dist.Normal(self.prior_loc, self.prior_scale).expand(shape).to_event(len(shape))

    def forward_with(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover - abstract
        """The layer with explicit weight and bias (no Pyro sample statements)."""
        raise NotImplementedError

    def _check_input(self, x: torch.Tensor) -> None:  # pragma: no cover - abstract
        """Refuse an input that is not a tensor of the layer's shape, saying what it expects."""
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
        self._check_input(x)
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
        ``(S, B, ...)`` gives one draw per stack slice (``num_draws`` is then ignored). An
        input of more dims than the layer's own ``(B, in)`` or ``(B, C, H, W)`` counts as
        stacked: a linear layer's ``(B, T, in)`` gets one draw per example. The scales must be
        > 0 on both paths (checked while distributions validate their arguments, as Pyro's
        default is).
        """
        self._check_input(x)
        if num_draws is not None:
            num_draws = check_int("num_draws", num_draws, hint="Pass e.g. num_draws=8, or None.")
        stacked = x.dim() > self._plain_rank
        if self.local_reparameterization:
            if torch.distributions.Distribution._validate_args:  # as the Normal below does
                _check_scales(type(self).__name__, weight_scale=weight_scale, bias_scale=bias_scale)
            mean, var = self.moments_with(x, weight_loc, weight_scale, bias_loc, bias_scale)
            shape = mean.shape if stacked or num_draws is None else (num_draws, *mean.shape)
            eps = torch.randn(shape, dtype=mean.dtype, device=mean.device)
            # var >= bias_scale^2 > 0; the clamp only guards rounding in the convolution
            return torch.addcmul(mean, noise_scale(var), eps)
        draws = x.shape[0] if stacked else num_draws
        lead = () if draws is None else (draws,)
        weight = dist.Normal(weight_loc, weight_scale).rsample(lead)
        bias = dist.Normal(bias_loc, bias_scale).rsample(lead)
        return self.forward_with(x, weight, bias)

    def extra_repr(self) -> str:
        lrt = ", local_reparameterization=True" if self.local_reparameterization else ""
        scale = "..." if self.prior_scale.is_meta else f"{self.prior_scale.item():g}"  # no value
        return f"weight_shape={self.weight_shape}, prior=Normal(0, {scale})" + lrt


class BayesianLinear(_BayesianLayer):
    """Linear layer whose weight ``(out, in)`` and bias ``(out,)`` are latent Pyro sites.

    Each forward samples (or, under a guide, replays) ``weight`` and ``bias`` from
    ``Normal(0, prior_scale)`` priors. Weights may carry leading sample dimensions (vectorised
    particles, ``Predictive(parallel=True)``): the layer then uses one batched matmul and
    returns ``(S, B, out)``.

    Parameters
    ----------
    in_features, out_features : int
        At least 1; a weight of more than ``2**63 - 1`` elements (torch's int64) is refused.
    prior_scale : float, default 1.0
        Standard deviation of the Normal prior on every weight and bias.
    local_reparameterization : bool, default False
        How :meth:`sample_with` (for a training loop of your own) draws the output under a
        Normal weight distribution: pre-activations ``Normal(x mu^T + b_mu, x^2 (sigma^2)^T +
        b_sigma^2)`` with one noise per output per example (True; lower-variance gradients), or
        one weight draw for the whole batch (False). ``forward`` is unaffected: it always
        samples (or replays) the weight and bias sites, and so are :class:`pyrouq.KLWeightedELBO`
        and :func:`pyrouq.fit`, which train a model of your own holding this layer through
        those sites (one weight draw per step) and warn that the flag is not applied. For
        local reparameterisation in training, convert a plain network with
        ``pyrouq.bayesian(net, local_reparameterization=True)`` and fit it with
        ``pyrouq.mean_field_guide(model)``.

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
        in_features, out_features = _check_sizes(
            "BayesianLinear", in_features=in_features, out_features=out_features
        )
        self.in_features = in_features
        self.out_features = out_features
        self.weight_shape = (out_features, in_features)
        check_elements(  # (else refused at the first forward, by torch)
            "BayesianLinear's weight",
            {"out_features": out_features, "in_features": in_features},
            "Pass smaller sizes.",
        )
        self.bias_shape = (out_features,)
        self._init_prior(prior_scale, local_reparameterization)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self.forward_with(x, self.weight, self.bias)

    def _check_input(self, x: torch.Tensor) -> None:
        check_layer_input(self, x, -1, self.in_features, f"(..., {self.in_features})")

    def forward_with(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
        """The layer with explicit weight and bias (no Pyro sample statements). With S drawn
        weights ``(S, out, in)``, an input ``(..., in)`` meets every draw, giving
        ``(S, ..., out)``; one of 3 dims or more whose first is S, ``(S, B, ..., in)``, pairs
        draw s with its slice s (as the layer before it, under the same draws, gives it)."""
        if weight.dim() == 2:
            return F.linear(x, weight, bias)
        w, _ = _stack_weights(weight, 2)  # (S, out, in)
        b, _ = _stack_weights(bias, 1)  # (S, out)
        draws = w.shape[0]
        per_draw = x.dim() >= 3 and x.shape[0] == draws  # one slice per draw
        lead = x.shape[1:-1] if per_draw else x.shape[:-1]
        rows = math.prod(lead)
        if per_draw:
            flat = x.reshape(draws, rows, x.shape[-1])
        else:  # every draw on all of x
            flat = x.reshape(1, rows, x.shape[-1]).expand(draws, -1, -1)
        # (out, not -1: on an empty batch, the reshape could not tell it)
        return torch.baddbmm(b.unsqueeze(1), flat, w.mT).reshape(draws, *lead, w.shape[1])


class BayesianConv2d(_BayesianLayer):
    """2-d convolution whose kernel ``(out, in, kh, kw)`` and bias ``(out,)`` are latent sites.

    With weight draws carrying a leading sample dimension S, all draws run as one grouped
    convolution (``groups=S``) and the output is ``(S, B, out, H', W')``.

    Parameters
    ----------
    in_channels, out_channels : int
    kernel_size : int or (int, int)
        A square ``k`` or a ``(kh, kw)`` kernel. A weight of more than ``2**63 - 1`` elements
        (torch's int64) is refused.
    stride, padding : int or (int, int), default 1 and 0
        Each ``>= 1`` and ``>= 0``; ``padding`` may also be ``"same"`` (stride 1) or
        ``"valid"``, as for ``torch.nn.functional.conv2d``.
    prior_scale : float, default 1.0
    local_reparameterization : bool, default False
        As for :class:`BayesianLinear` (:meth:`sample_with` only; ``fit()`` does not apply it
        to a model of your own), with moments ``conv(x, mu) + b_mu`` and ``conv(x^2,
        sigma^2) + b_sigma^2`` and one noise per output pixel per example.

    .. warning:: For a convolution, local reparameterisation gets every output's marginal
       right, but treats the outputs of one example at different positions as independent,
       whereas a weight draw (shared kernel) correlates them. The likelihood term it estimates
       is therefore an approximation of the ELBO's, unlike for linear layers, where it is exact.

    Examples
    --------
    >>> import torch
    >>> layer = BayesianConv2d(1, 4, kernel_size=3, padding=1)
    >>> x = torch.randn(2, 1, 8, 8)
    >>> layer(x).shape  # one prior draw
    torch.Size([2, 4, 8, 8])
    >>> layer.forward_with(x, torch.randn(5, 4, 1, 3, 3), torch.randn(5, 4)).shape  # S = 5
    torch.Size([5, 2, 4, 8, 8])
    """

    _plain_rank = 4

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        prior_scale: float = 1.0,
        local_reparameterization: bool = False,
    ):
        super().__init__()
        in_channels, out_channels = _check_sizes(
            "BayesianConv2d", in_channels=in_channels, out_channels=out_channels
        )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _positive_pair(
            "kernel_size", kernel_size, "kernel_size=3 or kernel_size=(3, 5)"
        )
        # checked here, not at the first forward (torch's "non-positive stride is not supported")
        self.stride = _positive_pair("stride", stride, "stride=2 or stride=(2, 1)")
        self.padding = _conv_pair(
            "padding", padding, 0, "padding=1 or padding=(1, 0)", ("same", "valid")
        )
        if self.padding == "same" and self.stride != (1, 1):
            raise ValueError(
                f"BayesianConv2d got padding='same' with stride={stride!r}: torch pads 'same' "
                "for stride 1 only. Pass stride=1, or padding as ints."
            )
        self.weight_shape = (out_channels, in_channels, *self.kernel_size)
        kernel = dict(zip(("kernel_height", "kernel_width"), self.kernel_size, strict=True))
        check_elements(  # (else refused at the first forward, by torch)
            "BayesianConv2d's weight",
            {"out_channels": out_channels, "in_channels": in_channels, **kernel},
            "Pass fewer channels or a smaller kernel.",
        )
        self.bias_shape = (out_channels,)
        self._init_prior(prior_scale, local_reparameterization)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", stride={self.stride}"
            + (f", padding={self.padding!r}" if self.padding != (0, 0) else "")
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return self.forward_with(x, self.weight, self.bias)

    def _check_input(self, x: torch.Tensor) -> None:
        shape = f"(B, {self.in_channels}, H, W) or (S, B, {self.in_channels}, H, W)"
        check_layer_input(self, x, -3, self.in_channels, shape, ranks=(4, 5))

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
            if x.shape[0] != s:
                raise ValueError(
                    f"BayesianConv2d got {s} weight draws and stacked inputs of shape "
                    f"{tuple(x.shape)}: inputs (S, B, C, H, W) hold one stack per draw, S = {s}. "
                    "Pass inputs (B, C, H, W) to run every draw on all of them."
                )
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


def _site_prior(layer: _BayesianLayer, kind: Literal["weight", "bias"]) -> dist.Distribution:
    """The prior of a Bayesian layer's ``kind`` site (for its ``PyroSample``)."""
    return layer.prior(kind)
