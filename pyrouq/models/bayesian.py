"""Bayesian networks: ``BayesianMLP`` and ``BayesianLeNet``, Pyro models with a Normal prior
on every weight and bias (``PyroSample``)."""

from __future__ import annotations

from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import nn

from pyrouq.models._observe import _check_num_data, likelihood_scale, observe
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
CPU_CHUNK = 512
"""Inputs per pass when ``logits_with`` runs without gradients on CPU (larger batches are split)."""

DEFAULT_PRIOR_SCALE = 1.0
"""Default standard deviation of the Normal(0, s) prior on every weight and bias."""


# --------------------------------------------------------------------------------------------
# Bayesian networks
# --------------------------------------------------------------------------------------------


def _bayesian_layer(layer: nn.Module, prior_scale: float, local: bool) -> nn.Module:
    if isinstance(layer, nn.Linear):
        return BayesianLinear(
            layer.in_features,
            layer.out_features,
            prior_scale=prior_scale,
            local_reparameterization=local,
        )
    if isinstance(layer, nn.Conv2d):
        return BayesianConv2d(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size[0],
            stride=layer.stride[0],
            padding=int(layer.padding[0]),  # type: ignore[arg-type]
            prior_scale=prior_scale,
            local_reparameterization=local,
        )
    raise TypeError(f"No Bayesian version of {type(layer).__name__}.")  # pragma: no cover


class _BayesianNetwork(PyroModule):
    """A plain ``nn.Sequential`` spec with every weighted layer made Bayesian."""

    num_classes: int
    config: dict[str, Any]  # constructor arguments: type(model)(**model.config) rebuilds it

    def __init__(
        self,
        spec: nn.Sequential,
        prior_scale: float,
        num_data: int | None,
        local_reparameterization: bool,
    ):
        super().__init__()
        self.num_data = _check_num_data(num_data)
        if not isinstance(local_reparameterization, bool):
            raise TypeError(
                "Expected local_reparameterization to be True or False, got "
                f"{local_reparameterization!r}."
            )
        self._steps = build_pipeline(
            self, spec, lambda _, m: _bayesian_layer(m, prior_scale, local_reparameterization)
        )
        self._first = next(name for name, step in self._steps if step is None)

    def _layers(self) -> dict[str, BayesianLinear | BayesianConv2d]:
        return {name: getattr(self, name) for name, step in self._steps if step is None}

    @property
    def local_reparameterization(self) -> bool:
        """Whether :class:`pyrouq.KLWeightedELBO` trains this model by local reparameterisation.

        True when any Bayesian layer has the flag (set by the constructor argument). Setting it
        sets every layer and ``config["local_reparameterization"]``. It changes the training
        path only, never :meth:`forward` (see the class docstring).
        """
        return any(layer.local_reparameterization for layer in self._layers().values())

    @local_reparameterization.setter
    def local_reparameterization(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(
                f"Expected local_reparameterization to be True or False, got {value!r}."
            )
        for layer in self._layers().values():
            layer.local_reparameterization = value
        if hasattr(self, "config"):
            self.config["local_reparameterization"] = value

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

    def priors(self) -> dict[str, dist.Distribution]:
        """The prior of every latent site, ``{site: Normal(0, prior_scale).to_event(...)}``."""
        return {
            f"{name}.{kind}": layer.prior(kind)
            for name, layer in self._layers().items()
            for kind in ("weight", "bias")
        }

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
        # reading each layer's PyroSample attributes samples (or replays) its sites, in the
        # order the layers run
        weights = {
            f"{name}.{kind}": getattr(layer, kind)
            for name, layer in self._layers().items()
            for kind in ("weight", "bias")
        }
        return self.forward_weighted(x, y, weights=weights)

    def _per_draw(self, x: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        """Stacked logits ``(S, B, C)`` for weights with sample dims, one draw at a time.

        The same function as the batched pass (grouped convolutions over the S draws), which
        oneDNN runs several times slower on CPU than S plain passes. A site with a single
        draw is shared by every draw.
        """
        draws: dict[str, tuple[torch.Tensor, ...]] = {}
        for name, layer in self._layers().items():
            for kind, event in (("weight", len(layer.weight_shape)), ("bias", 1)):
                value = weights[f"{name}.{kind}"]
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

        self._check_input(x)
        if x.device.type == "cpu" and x.shape[0] > CPU_CHUNK and not torch.is_grad_enabled():
            # oneDNN's convolutions run 2-4x slower per image on batches above ~512 on CPU
            return torch.cat([self.logits_with(c, weights) for c in x.split(CPU_CHUNK)], dim=-2)

        def weighted(name: str, h: torch.Tensor) -> torch.Tensor:
            layer = getattr(self, name)
            return layer.forward_with(h, weights[f"{name}.weight"], weights[f"{name}.bias"])

        h = run_pipeline(self, self._steps, x, weighted)
        return self._with_sample_dims(h, weights[f"{self._first}.weight"])

    def sample_weights(
        self,
        loc: dict[str, torch.Tensor],
        scale: dict[str, torch.Tensor],
        num_draws: int | None = None,
    ) -> dict[str, torch.Tensor]:
        """A reparameterised draw ``loc + scale * eps`` of every site, differentiable with
        respect to ``loc`` and ``scale``.

        Sites in forward order, each drawn whole (``(num_draws, *shape)`` with ``num_draws``):
        the standard-normal draws, in the same order, that Pyro's ``Normal(loc,
        scale).rsample`` makes for a guide sampled site by site, for one particle or under a
        particle plate.
        """
        lead = () if num_draws is None else (num_draws,)
        weights = {}
        for site, shape in self.latent_sites().items():
            mean, std = loc[site], scale[site]
            eps = torch.empty(lead + tuple(shape), dtype=mean.dtype, device=mean.device)
            weights[site] = mean + eps.normal_() * std
        return weights

    def forward_weighted(
        self, x: torch.Tensor, y: torch.Tensor | None = None, *, weights: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The model with explicit weights ``{site: value}``: :meth:`logits_with`, then
        ``"logits"`` recorded and ``y`` observed at ``"obs"`` (scale N/B), with no latent
        sample statements (what :meth:`forward` runs on its sampled sites). Weights with
        leading sample dims S run one draw at a time on CPU (faster there than the batched
        layers) and give logits ``(*S, B, C)``.
        """
        first = weights[f"{self._first}.weight"]
        if x.device.type == "cpu" and first.dim() > len(getattr(self, self._first).weight_shape):
            logits = self._with_sample_dims(self._per_draw(x, weights), first)
        else:
            logits = self.logits_with(x, weights)
        return observe(self, logits, y, self.num_data)

    def nll_with(
        self, x: torch.Tensor, y: torch.Tensor, weights: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``"obs"`` site's negative log-likelihood for one weight draw, outside Pyro.

        Returns ``(-(N/B) * sum_batch log p(y | x, w), logits)`` for unstacked weights
        ``{site: value}``: the value the model's trace gives for the observed site, computed
        with ``F.cross_entropy`` (what :meth:`pyrouq.KLWeightedELBO.terms_and_grads`
        back-propagates particle by particle). Labels are checked like :meth:`forward`'s.
        """
        logits = self.logits_with(x, weights)
        scale = likelihood_scale(self, logits, y, self.num_data)
        return F.cross_entropy(logits, y, reduction="sum") * scale, logits

    def forward_sampled(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        loc: dict[str, torch.Tensor],
        scale: dict[str, torch.Tensor],
        num_draws: int | None = None,
    ) -> torch.Tensor:
        """The model with weights ``~ Normal(loc, scale)`` drawn by reparameterisation: what
        :meth:`pyrouq.KLWeightedELBO.terms` runs with a :class:`pyrouq.MeanFieldGuide`
        (``terms_and_grads``, which ``fit`` calls, runs several weight-sampling particles
        through :meth:`sample_weights` and :meth:`nll_with` instead, one at a time).

        No latent sample statements, so no guide or model trace: with
        ``local_reparameterization`` every Bayesian layer draws its pre-activations
        (:meth:`~pyrouq.nn.BayesianLinear.sample_with`); otherwise every site's weight is drawn
        once by :meth:`sample_weights` and the network runs with them
        (:meth:`forward_weighted`).
        Differentiable with respect to ``loc`` and ``scale`` (``{site: tensor}`` of the sites'
        shapes, e.g. a mean-field guide's locations and scales). Records ``"logits"`` and
        observes ``y`` at ``"obs"`` (scale N/B) like :meth:`forward`. Returns logits
        ``(B, C)``, or ``(num_draws, B, C)``.
        """
        if not self.local_reparameterization:
            return self.forward_weighted(x, y, weights=self.sample_weights(loc, scale, num_draws))
        self._check_input(x)

        def weighted(name: str, h: torch.Tensor) -> torch.Tensor:
            w, b = f"{name}.weight", f"{name}.bias"
            layer = getattr(self, name)
            return layer.sample_with(h, loc[w], scale[w], loc[b], scale[b], num_draws)

        return observe(self, run_pipeline(self, self._steps, x, weighted), y, self.num_data)

    def _with_sample_dims(self, logits: torch.Tensor, first_weight: torch.Tensor) -> torch.Tensor:
        """Give stacked logits ``(S, B, C)`` the batch shape of the ``"obs"`` site.

        Weights drawn under plates carry sample dims ``(*S, 1)`` lined up with the site's
        plates, the last one being the data plate: the logits' batch shape is
        ``(*S, B)`` (e.g. ``(P, 1, B)`` for P vectorised particles outside two plates).
        Flattening them to ``(P, B)`` would put the particles in the ``"members"`` plate's
        dim and broadcast the likelihood over P x P draws.
        """
        if logits.dim() <= 2:
            return logits
        event = len(getattr(self, self._first).weight_shape)
        lead = list(first_weight.shape[: first_weight.dim() - event])
        if len(lead) > 1 and lead[-1] == 1:
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
    local_reparameterization : bool, default False
        Train by local reparameterisation: :class:`pyrouq.KLWeightedELBO` (hence
        :func:`pyrouq.fit`, and Pyro's ``SVI`` with that loss) with a :class:`pyrouq.MeanFieldGuide`
        then draws every layer's pre-activations from their Normal distribution under the
        guide, one noise per unit and example, instead of one weight draw per minibatch (see
        :class:`~pyrouq.KLWeightedELBO`). Lower-variance gradients for one extra layer pass
        per layer. Stored in ``config``. The model itself is unchanged: ``forward`` still
        samples every weight at its ``PyroSample`` site, so ``predict``, ``Predictive`` and
        other losses and guides see the same Pyro model as with False.

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
        local_reparameterization: bool = False,
    ):
        spec = nn.Sequential(_mlp_layers(in_features, hidden_features, out_features, num_hidden))
        super().__init__(spec, prior_scale, num_data, local_reparameterization)
        self.config = dict(
            in_features=in_features,
            hidden_features=hidden_features,
            out_features=out_features,
            num_hidden=num_hidden,
            prior_scale=prior_scale,
            local_reparameterization=local_reparameterization,
        )
        self.in_features = in_features
        self.num_classes = out_features

    def plain_network(self) -> MLP:
        return MLP(
            self.in_features,
            self.config["hidden_features"],
            self.num_classes,
            self.config["num_hidden"],
        )

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
    local_reparameterization : bool, default False
        As for :class:`BayesianMLP` (every convolution and linear layer).

    .. warning:: With ``local_reparameterization`` the convolutions' outputs at different
       positions of one example get independent noise, whereas a shared kernel draw correlates
       them: the trained objective approximates the ELBO there (exact for linear layers).
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        *,
        prior_scale: float = DEFAULT_PRIOR_SCALE,
        num_data: int | None = None,
        local_reparameterization: bool = False,
    ):
        spec = nn.Sequential(_lenet_layers(in_channels, num_classes))
        super().__init__(spec, prior_scale, num_data, local_reparameterization)
        self.config = dict(
            in_channels=in_channels,
            num_classes=num_classes,
            prior_scale=prior_scale,
            local_reparameterization=local_reparameterization,
        )
        self.in_channels = in_channels
        self.num_classes = num_classes

    def plain_network(self) -> LeNet:
        return LeNet(self.in_channels, self.num_classes)

    def _check_input(self, x: torch.Tensor) -> None:
        _check_lenet_input(type(self).__name__, x, self.in_channels)
