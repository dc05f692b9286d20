"""Bayesian networks: ``BayesianMLP`` and ``BayesianLeNet``, Pyro models with a Normal prior
on every weight and bias (``PyroSample``)."""

from __future__ import annotations

import torch
from pyro.nn import PyroModule
from torch import nn

from pyrouq.models._observe import _check_num_data, observe
from pyrouq.models.plain import (
    MLP,
    LeNet,
    _check_lenet_input,
    _check_mlp_input,
    _lenet_layers,
    _mlp_layers,
)
from pyrouq.nn import BayesianConv2d, BayesianLinear, build_pipeline, run_pipeline

__all__ = ["DEFAULT_PRIOR_SCALE", "BayesianLeNet", "BayesianMLP"]

DEFAULT_PRIOR_SCALE = 1.0
"""Default standard deviation of the Normal(0, s) prior on every weight and bias."""


# --------------------------------------------------------------------------------------------
# Bayesian networks
# --------------------------------------------------------------------------------------------


def _bayesian_layer(layer: nn.Module, prior_scale: float) -> nn.Module:
    if isinstance(layer, nn.Linear):
        return BayesianLinear(layer.in_features, layer.out_features, prior_scale=prior_scale)
    if isinstance(layer, nn.Conv2d):
        return BayesianConv2d(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size[0],
            stride=layer.stride[0],
            padding=int(layer.padding[0]),  # type: ignore[arg-type]
            prior_scale=prior_scale,
        )
    raise TypeError(f"No Bayesian version of {type(layer).__name__}.")  # pragma: no cover


class _BayesianNetwork(PyroModule):
    """A plain ``nn.Sequential`` spec with every weighted layer made Bayesian."""

    num_classes: int

    def __init__(self, spec: nn.Sequential, prior_scale: float, num_data: int | None):
        super().__init__()
        self.num_data = _check_num_data(num_data)
        self._steps = build_pipeline(self, spec, lambda _, m: _bayesian_layer(m, prior_scale))
        self._first = next(name for name, step in self._steps if step is None)

    def plain_network(self) -> nn.Sequential:  # pragma: no cover - abstract
        """A freshly initialised plain network with the same layers and names."""
        raise NotImplementedError

    def latent_sites(self) -> dict[str, torch.Size]:
        """Names and shapes of the latent sites (every weight and bias), in forward order."""
        sites: dict[str, torch.Size] = {}
        for name, step in self._steps:
            if step is None:
                layer = getattr(self, name)
                sites[f"{name}.weight"] = torch.Size(layer.weight_shape)
                sites[f"{name}.bias"] = torch.Size(layer.bias_shape)
        return sites

    def _check_input(self, x: torch.Tensor) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, C)`` (``(*S, B, C)`` when the weights carry sample dims S).

        Parameters
        ----------
        x : torch.Tensor
            A batch of B inputs.
        y : torch.Tensor, optional
            ``(B,)`` integer labels in ``[0, C)``, observed at ``"obs"`` with scale N/B.
        """
        self._check_input(x)
        first = getattr(self, self._first)
        if x.device.type == "cpu" and first.weight.dim() > len(first.weight_shape):
            logits = self._per_draw(x)
        else:
            logits = run_pipeline(self, self._steps, x)
        return observe(self, self._with_sample_dims(logits, first.weight), y, self.num_data)

    def _per_draw(self, x: torch.Tensor) -> torch.Tensor:
        """Stacked logits ``(S, B, C)`` computed one weight draw at a time.

        The same function as the batched pass (grouped convolutions over the S draws), which
        oneDNN runs several times slower on CPU than S plain passes.
        """
        draws: dict[str, tuple[torch.Tensor, ...]] = {}
        for name, step in self._steps:
            if step is None:
                layer = getattr(self, name)
                for kind, event in (("weight", len(layer.weight_shape)), ("bias", 1)):
                    value = getattr(layer, kind)
                    draws[f"{name}.{kind}"] = value.reshape(-1, *value.shape[-event:]).unbind(0)
        count = max(len(v) for v in draws.values())
        return torch.stack(
            [
                self.logits_with(x, {k: v[s if len(v) > 1 else 0] for k, v in draws.items()})
                for s in range(count)
            ]
        )

    def logits_with(self, x: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        """Logits of the network with explicit weights ``{site: value}``, outside Pyro.

        What ``poutine.condition(model, data=weights)(x)`` returns, without the sample
        statements (used by :func:`pyrouq.predict` in its inner loop). Values may carry
        leading sample dimensions like the model's sites.
        """

        def weighted(name: str, h: torch.Tensor) -> torch.Tensor:
            layer = getattr(self, name)
            return layer.forward_with(h, weights[f"{name}.weight"], weights[f"{name}.bias"])

        h = run_pipeline(self, self._steps, x, weighted)
        return self._with_sample_dims(h, weights[f"{self._first}.weight"])

    def _with_sample_dims(self, logits: torch.Tensor, first_weight: torch.Tensor) -> torch.Tensor:
        """Give stacked logits ``(S, B, C)`` the sample dims of the weights ``(*S, 1, ...)``."""
        if logits.dim() <= 2:
            return logits
        event = len(getattr(self, self._first).weight_shape)
        lead = list(first_weight.shape[: first_weight.dim() - event])
        while len(lead) > 1 and lead[-1] == 1:
            lead.pop()
        return logits.reshape(*lead, *logits.shape[-2:])


class BayesianMLP(_BayesianNetwork):
    """Bayesian MLP: ``MLP``'s architecture with a Normal prior on every weight and bias.

    A Pyro model following the pyrouq contract (``forward(x, y=None) -> logits``, sites
    ``"logits"`` and ``"obs"``); latent sites are named like the plain ``MLP``'s parameters
    (``"fc1.weight"``, ``"fc1.bias"``, ...).

    Parameters
    ----------
    in_features, hidden_features, out_features, num_hidden : int
        As for :class:`MLP` (default 784-256-10, one hidden layer).
    prior_scale : float, default 1.0
        Standard deviation of the ``Normal(0, prior_scale)`` prior on every weight and bias.
    num_data : int, optional
        Training-set size N; the minibatch likelihood is scaled by N/B. Set by ``fit()``.

    Examples
    --------
    >>> import torch
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3, num_data=100)
    >>> model(torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])).shape
    torch.Size([5, 3])
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden_features: int = 256,
        out_features: int = 10,
        num_hidden: int = 1,
        *,
        prior_scale: float = DEFAULT_PRIOR_SCALE,
        num_data: int | None = None,
    ):
        spec = nn.Sequential(_mlp_layers(in_features, hidden_features, out_features, num_hidden))
        super().__init__(spec, prior_scale, num_data)
        self.config = dict(
            in_features=in_features,
            hidden_features=hidden_features,
            out_features=out_features,
            num_hidden=num_hidden,
        )
        self.in_features = in_features
        self.num_classes = out_features

    def plain_network(self) -> MLP:
        return MLP(**self.config)

    def _check_input(self, x: torch.Tensor) -> None:
        _check_mlp_input(type(self).__name__, x, self.in_features)


class BayesianLeNet(_BayesianNetwork):
    """Bayesian LeNet: ``LeNet``'s architecture with a Normal prior on every weight and bias.

    Latent sites ``"conv1.weight"``, ``"conv1.bias"``, ..., ``"fc3.bias"``; input
    ``(B, in_channels, 28, 28)``. With S weight draws (vectorised particles or
    ``Predictive(parallel=True)``) the convolutions run as one grouped convolution on
    accelerators and one draw at a time on CPU (faster there); both give the same logits.

    Parameters
    ----------
    in_channels, num_classes : int
    prior_scale : float, default 1.0
    num_data : int, optional
        Training-set size N (set by ``fit()``).
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        *,
        prior_scale: float = DEFAULT_PRIOR_SCALE,
        num_data: int | None = None,
    ):
        spec = nn.Sequential(_lenet_layers(in_channels, num_classes))
        super().__init__(spec, prior_scale, num_data)
        self.config = dict(in_channels=in_channels, num_classes=num_classes)
        self.in_channels = in_channels
        self.num_classes = num_classes

    def plain_network(self) -> LeNet:
        return LeNet(**self.config)

    def _check_input(self, x: torch.Tensor) -> None:
        _check_lenet_input(type(self).__name__, x, self.in_channels)
