"""Bayesian ``MLP`` and ``LeNet``: named front doors onto :func:`pyrouq.bayesian`."""

from __future__ import annotations

from typing import Any

from pyrouq.convert import DEFAULT_PRIOR_SCALE, BayesianNetwork
from pyrouq.models.plain import MLP, LeNet, _check_lenet_input, _check_mlp_input

__all__ = ["DEFAULT_PRIOR_SCALE", "BayesianLeNet", "BayesianMLP"]


class BayesianMLP(BayesianNetwork):
    """Bayesian MLP: ``bayesian(MLP(...), prior=prior_scale)``, a Normal prior on every weight
    and bias.

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
        :func:`pyrouq.fit`, and Pyro's ``SVI`` with that loss) with a
        :class:`pyrouq.MeanFieldGuide` then draws every layer's pre-activations from their
        Normal distribution under the guide, one noise per unit and example, instead of one
        weight draw per minibatch. Lower-variance gradients for one extra layer pass per
        layer. Stored in ``config``. The model itself is unchanged: ``forward`` still samples
        every weight at its site, so ``predict``, ``Predictive`` and other losses and guides
        see the same Pyro model as with False.

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
        net = MLP(in_features, hidden_features, out_features, num_hidden)
        super().__init__(
            net,
            prior=_prior_scale(prior_scale),
            num_data=num_data,
            local_reparameterization=local_reparameterization,
        )
        self.config: dict[str, Any] = dict(
            in_features=net.in_features,
            hidden_features=net.hidden_features,
            out_features=net.out_features,
            num_hidden=net.num_hidden,
            prior_scale=_prior_scale(prior_scale),
            # checked by the converter (True / False, numpy's too): a JSON bool here
            local_reparameterization=bool(local_reparameterization),
        )
        self.in_features = net.in_features
        self.num_classes = net.out_features

    def _check_input(self, x: Any) -> None:
        _check_mlp_input(type(self).__name__, x, self.in_features)


class BayesianLeNet(BayesianNetwork):
    """Bayesian LeNet: ``bayesian(LeNet(...), prior=prior_scale)``, a Normal prior on every
    weight and bias.

    Latent sites ``"conv1.weight"``, ``"conv1.bias"``, ..., ``"fc3.bias"``; input
    ``(B, in_channels, 28, 28)``.

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

    Examples
    --------
    >>> import torch
    >>> model = BayesianLeNet(num_classes=10)
    >>> list(model.latent_sites())[:4]
    ['conv1.weight', 'conv1.bias', 'conv2.weight', 'conv2.bias']
    >>> model(torch.randn(2, 1, 28, 28)).shape  # one prior draw of the weights
    torch.Size([2, 10])
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
        net = LeNet(in_channels, num_classes)
        super().__init__(
            net,
            prior=_prior_scale(prior_scale),
            num_data=num_data,
            local_reparameterization=local_reparameterization,
        )
        self.config: dict[str, Any] = dict(
            in_channels=net.in_channels,
            num_classes=net.num_classes,
            prior_scale=_prior_scale(prior_scale),
            # checked by the converter (True / False, numpy's too): a JSON bool here
            local_reparameterization=bool(local_reparameterization),
        )
        self.in_channels = net.in_channels
        self.num_classes = net.num_classes

    def _check_input(self, x: Any) -> None:
        _check_lenet_input(type(self).__name__, x, self.in_channels)


def _prior_scale(value: Any) -> float:
    from pyrouq.nn._bayesian import check_prior_scale

    return check_prior_scale(value)
