"""Networks: plain ``MLP`` / ``LeNet`` and their Bayesian (Pyro model) counterparts.

Every pyrouq model follows one contract (see DESIGN.md): ``forward(x, y=None) -> logits`` of
shape ``(B, C)`` (Bayesian; ``(S, B, C)`` when the weights carry S draws) or ``(M, B, C)``
(BatchEnsemble, M members); logits are recorded as ``pyro.deterministic("logits")`` and labels
observed at ``"obs"`` inside ``pyro.plate("data")``, scaled by N/B so that a minibatch of B out
of N training points estimates the full-data likelihood.

The plain networks are ``nn.Sequential`` with named layers (``conv1``, ``fc1``, ...), and the
Bayesian models name their latent sites after them (``"conv1.weight"``, ``"fc1.bias"``, ...), so
weights copy across by name.
"""

from __future__ import annotations

import copy
import itertools
import math
import weakref
from collections import OrderedDict

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule
from torch import nn

from pyrouq.nn import (
    BatchEnsembleConv2d,
    BatchEnsembleLinear,
    BayesianConv2d,
    BayesianLinear,
    FactorInit,
    _check_factor_init,
    _check_members,
    build_pipeline,
    forget_params,
    run_pipeline,
)

__all__ = [
    "MLP",
    "BatchEnsembleLeNet",
    "BatchEnsembleMLP",
    "BatchEnsembleNetwork",
    "BayesianLeNet",
    "BayesianMLP",
    "LeNet",
    "batchensemble",
]

DEFAULT_PRIOR_SCALE = 1.0
"""Default standard deviation of the Normal(0, s) prior on every weight and bias."""


# --------------------------------------------------------------------------------------------
# Input checks shared by plain and Bayesian networks
# --------------------------------------------------------------------------------------------


def _check_mlp_input(name: str, x: torch.Tensor, in_features: int) -> None:
    if not torch.is_tensor(x):
        raise TypeError(f"{name} expects a torch.Tensor input, got {type(x).__name__}.")
    if x.dim() < 2 or math.prod(x.shape[1:]) != in_features:
        raise ValueError(
            f"{name} expects inputs of shape (B, {in_features}) (or (B, ...) with "
            f"{in_features} values per example), got shape {tuple(x.shape)}. "
            "Flatten the images (load_mnist(flatten=True)) or set in_features."
        )


def _check_lenet_input(name: str, x: torch.Tensor, in_channels: int) -> None:
    if not torch.is_tensor(x):
        raise TypeError(f"{name} expects a torch.Tensor input, got {type(x).__name__}.")
    if x.dim() != 4 or tuple(x.shape[1:]) != (in_channels, 28, 28):
        raise ValueError(
            f"{name} expects images of shape (B, {in_channels}, 28, 28), got shape "
            f"{tuple(x.shape)}. Use load_mnist(flatten=False), or x.view(-1, {in_channels}, "
            "28, 28) for flat inputs."
        )


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Expected {name} to be a positive integer, got {value!r}.")
    return value


# --------------------------------------------------------------------------------------------
# Plain networks
# --------------------------------------------------------------------------------------------


def _mlp_layers(
    in_features: int, hidden_features: int, out_features: int, num_hidden: int
) -> OrderedDict[str, nn.Module]:
    for name, value in (
        ("in_features", in_features),
        ("hidden_features", hidden_features),
        ("out_features", out_features),
    ):
        _check_positive_int(name, value)
    if isinstance(num_hidden, bool) or not isinstance(num_hidden, int) or num_hidden < 0:
        raise ValueError(f"Expected num_hidden to be an integer >= 0, got {num_hidden!r}.")
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    width = in_features
    for i in range(1, num_hidden + 1):
        layers[f"fc{i}"] = nn.Linear(width, hidden_features)
        layers[f"relu{i}"] = nn.ReLU()
        width = hidden_features
    layers[f"fc{num_hidden + 1}"] = nn.Linear(width, out_features)
    return layers


class MLP(nn.Sequential):
    """Multilayer perceptron ``in -> hidden (ReLU) x num_hidden -> out`` returning logits.

    Layers are named ``fc1, relu1, ..., fc{num_hidden+1}``. Inputs are ``(B, in_features)`` or
    any ``(B, ...)`` holding ``in_features`` values per example (flattened).

    Examples
    --------
    >>> import torch
    >>> MLP()(torch.randn(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden_features: int = 256,
        out_features: int = 10,
        num_hidden: int = 1,
    ):
        super().__init__(_mlp_layers(in_features, hidden_features, out_features, num_hidden))
        self.in_features = in_features
        self.hidden_features = hidden_features
        self.out_features = out_features
        self.num_hidden = num_hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_mlp_input(type(self).__name__, x, self.in_features)
        return super().forward(x)


def _lenet_layers(in_channels: int, num_classes: int) -> OrderedDict[str, nn.Module]:
    _check_positive_int("in_channels", in_channels)
    _check_positive_int("num_classes", num_classes)
    return OrderedDict(
        conv1=nn.Conv2d(in_channels, 6, 5),
        relu1=nn.ReLU(),
        pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(6, 16, 5),
        relu2=nn.ReLU(),
        pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(),
        fc1=nn.Linear(256, 120),
        relu3=nn.ReLU(),
        fc2=nn.Linear(120, 84),
        relu4=nn.ReLU(),
        fc3=nn.Linear(84, num_classes),
    )


class LeNet(nn.Sequential):
    """The classic LeNet for 28x28 images, returning logits.

    conv 6@5x5, ReLU, max-pool 2, conv 16@5x5, ReLU, max-pool 2, fc 256 -> 120 -> 84 -> C
    (ReLU between), as in torch-uncertainty. Input ``(B, in_channels, 28, 28)``.

    Examples
    --------
    >>> import torch
    >>> LeNet()(torch.randn(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10):
        super().__init__(_lenet_layers(in_channels, num_classes))
        self.in_channels = in_channels
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_lenet_input(type(self).__name__, x, self.in_channels)
        return super().forward(x)


# --------------------------------------------------------------------------------------------
# The observation model shared by every pyrouq model
# --------------------------------------------------------------------------------------------


def _check_labels(name: str, y: torch.Tensor, batch: int, num_classes: int) -> None:
    if not torch.is_tensor(y):
        raise TypeError(f"{name}: expected labels y as a torch.Tensor, got {type(y).__name__}.")
    if y.shape != (batch,):
        raise ValueError(
            f"{name}: expected labels y of shape ({batch},) to match the {batch} inputs, got "
            f"shape {tuple(y.shape)}. Pass one integer label per input."
        )
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected integer class labels y, got dtype {y.dtype}. Use y.long()."
        )
    if batch and is_validation_enabled():
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(
                f"{name}: labels must lie in [0, {num_classes}), got values in [{lo}, {hi}]. "
                "Check the targets or the model's number of classes."
            )


def observe(
    model: nn.Module,
    logits: torch.Tensor,
    y: torch.Tensor | None,
    num_data: int | None,
    members: int | None = None,
) -> torch.Tensor:
    """Record ``"logits"`` and observe ``y`` at ``"obs"`` in the ``"data"`` plate, scaled N/B.

    ``logits`` is ``(..., B, C)``; with ``members`` the observation sits in a ``"members"``
    plate (dim -2) too. Returns ``logits``.
    """
    name = type(model).__name__
    batch, num_classes = logits.shape[-2], logits.shape[-1]
    scale = 1.0
    if y is not None:
        _check_labels(name, y, batch, num_classes)
        if num_data is None:
            raise ValueError(
                f"{name}.num_data is not set: the likelihood of a minibatch of B points is "
                "scaled by N/B, with N the training-set size. Pass num_data=N to the "
                "constructor, set model.num_data = N, or train with pyrouq.fit(), which sets it."
            )
        scale = num_data / max(batch, 1)
    if members is not None:
        with (
            pyro.plate("members", members, dim=-2),
            pyro.plate("data", batch, dim=-1),
        ):
            pyro.deterministic("logits", logits, event_dim=1)
            with pyro.poutine.scale(scale=scale):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits
    with pyro.plate("data", batch, dim=-1):
        pyro.deterministic("logits", logits, event_dim=1)
        with pyro.poutine.scale(scale=scale):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def _check_num_data(num_data: int | None) -> int | None:
    if num_data is None:
        return None
    return _check_positive_int("num_data", num_data)


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
        self.prior_scale_value = float(prior_scale)

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
        logits = self._with_sample_dims(run_pipeline(self, self._steps, x), first.weight)
        return observe(self, logits, y, self.num_data)

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
    ``Predictive(parallel=True)``) the convolutions run as one grouped convolution.

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


# --------------------------------------------------------------------------------------------
# BatchEnsemble networks
# --------------------------------------------------------------------------------------------

_ENSEMBLE_COUNTER = itertools.count()


def _batchensemble_layer(name: str, layer: nn.Module, members: int, options: dict) -> nn.Module:
    if isinstance(layer, nn.Linear):
        return BatchEnsembleLinear(
            layer.in_features, layer.out_features, members, base=layer, **options
        )
    if isinstance(layer, nn.Conv2d):
        if (
            layer.groups != 1
            or layer.dilation != (1, 1)
            or layer.padding_mode != "zeros"
            or isinstance(layer.padding, str)
            or layer.kernel_size[0] != layer.kernel_size[1]
        ):
            raise TypeError(
                f"Layer {name!r} ({layer}) is not supported by BatchEnsemble: only square "
                "kernels with groups=1, dilation=1, zero padding given as integers."
            )
        return BatchEnsembleConv2d(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size[0],
            members,
            stride=layer.stride[0],
            padding=int(layer.padding[0]),
            base=layer,
            **options,
        )
    raise TypeError(
        f"Layer {name!r} ({type(layer).__name__}) has parameters and no BatchEnsemble version; "
        "supported weighted layers are nn.Linear and nn.Conv2d (activations, pooling, flatten "
        "and other parameter-free layers are shared by the members)."
    )


class BatchEnsembleNetwork(PyroModule):
    """BatchEnsemble version of an ``nn.Sequential``: a deterministic Pyro module.

    Every ``nn.Linear`` / ``nn.Conv2d`` becomes a BatchEnsemble layer (shared weight W,
    per-member rank-1 factors and biases, effective weight ``diag(s_i) W diag(r_i)``);
    parameter-free layers are shared. Inputs are plain ``(B, ...)`` batches and every member
    sees every input; ``forward(x, y=None)`` returns logits ``(M, B, C)``, recorded as
    ``"logits"``, with ``"obs"`` observed for every member inside a ``"members"`` plate
    (dim -2) and the ``"data"`` plate (dim -1), scaled N/B. There are no latent sites: fit it
    with ``fit(model, None, loader)`` (the loss is the members' summed negative
    log-likelihood) or plain ``pyro.infer.SVI`` with an empty guide.

    Its parameters are registered in Pyro's param store under a name unique to this instance
    (``model._pyro_name``), so two ensembles never share parameters.

    Parameters
    ----------
    spec : nn.Sequential
        The network to convert; its weights are copied (not shared) when
        ``use_base_weights`` is true, else re-initialised as torch does.
    num_members : int
        Ensemble size M (>= 1).
    use_base_weights : bool, default True
    init, r_mean, r_std, s_mean, s_std
        Factor initialisation, see :class:`~pyrouq.nn.BatchEnsembleLinear`.
    num_data : int, optional
        Training-set size N (set by ``fit()``).
    """

    def __init__(
        self,
        spec: nn.Sequential,
        num_members: int,
        *,
        use_base_weights: bool = True,
        init: FactorInit = "normal",
        r_mean: float = 1.0,
        r_std: float = 0.5,
        s_mean: float = 1.0,
        s_std: float = 0.5,
        num_data: int | None = None,
    ):
        super().__init__(name=f"{type(self).__name__}_{next(_ENSEMBLE_COUNTER)}")
        _check_members(num_members)
        _check_factor_init(init, r_std, s_std)
        if not isinstance(spec, nn.Sequential):
            raise TypeError(
                f"Expected an nn.Sequential (or MLP / LeNet) to convert, got {type(spec).__name__}."
            )
        self.num_members = num_members
        self.num_data = _check_num_data(num_data)
        options = dict(init=init, r_mean=r_mean, r_std=r_std, s_mean=s_mean, s_std=s_std)
        spec = copy.deepcopy(spec)
        if not use_base_weights:
            for layer in spec.modules():
                if isinstance(layer, (nn.Linear, nn.Conv2d)):
                    layer.reset_parameters()
        self._steps = build_pipeline(
            self, spec, lambda name, m: _batchensemble_layer(name, m, num_members, options)
        )
        if all(step is not None for _, step in self._steps):
            raise TypeError("The network to convert has no nn.Linear or nn.Conv2d layer.")
        weakref.finalize(self, forget_params, self._pyro_name)

    def _check_input(self, x: torch.Tensor) -> None:
        if not torch.is_tensor(x):
            raise TypeError(
                f"{type(self).__name__} expects a torch.Tensor input, got {type(x).__name__}."
            )

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(M, B, C)`` of every member on every input; observes ``y`` if given."""
        self._check_input(x)
        if x.device.type == "cpu":
            logits = self._member_passes(x)
        else:
            logits = run_pipeline(self, self._steps, x)
        return observe(self, logits, y, self.num_data, members=self.num_members)

    def _member_passes(self, x: torch.Tensor) -> torch.Tensor:
        """The same logits as the batched pass, computed as M plain passes.

        Each member runs the network with its effective weights ``diag(s_i) W diag(r_i)``
        (folded once per call, so the factors still get their gradients). On CPU this is the
        fastest schedule: every convolution and pooling works on B inputs at a time, which
        oneDNN handles far better than one pass over M * B inputs with per-member scaling of
        the activations (see benchmarks/results.md); on accelerators the batched pass is used.
        """
        first = next(i for i, (_, step) in enumerate(self._steps) if step is None)
        shared = x
        for _, step in self._steps[:first]:
            shared = step(shared)
        first_layer = getattr(self, self._steps[first][0])
        # A first convolution with one input channel is shared by the members: r_m is then a
        # scalar per member and conv(x r_m, W) s_m = conv(x, W) (r_m s_m).
        share_first = isinstance(first_layer, BatchEnsembleConv2d) and first_layer.in_channels == 1
        if share_first:
            base = F.conv2d(
                shared, first_layer.weight, None, first_layer.stride, first_layer.padding
            )
            scales = (first_layer.r * first_layer.s).unbind(0)
            biases = first_layer.bias.unbind(0)
        folded = {
            name: [t.unflatten(0, (self.num_members, -1)) for t in getattr(self, name)._folded()]
            for index, (name, step) in enumerate(self._steps)
            if step is None and not (share_first and index == first)
        }
        outputs = []
        for member in range(self.num_members):
            h = shared
            for index, (name, step) in enumerate(self._steps[first:], start=first):
                if share_first and index == first:
                    h = torch.addcmul(
                        biases[member][:, None, None], base, scales[member][:, None, None]
                    )
                elif step is None:
                    weight, bias = folded[name]
                    h = getattr(self, name).member_forward(h, weight[member], bias[member])
                else:
                    h = step(h)
            outputs.append(h)
        return torch.stack(outputs)


class BatchEnsembleMLP(BatchEnsembleNetwork):
    """BatchEnsemble of :class:`MLP` (same architecture and layer names), M members.

    Parameters
    ----------
    in_features, hidden_features, out_features, num_hidden : int
        As for :class:`MLP`.
    num_members : int, default 4
    base : MLP, optional
        Start from this (e.g. pre-trained) network's weights; default a fresh ``MLP``.
    use_base_weights, init, r_mean, r_std, s_mean, s_std, num_data
        See :class:`BatchEnsembleNetwork`.

    Examples
    --------
    >>> import torch
    >>> model = BatchEnsembleMLP(num_members=3)
    >>> model(torch.randn(5, 784)).shape
    torch.Size([3, 5, 10])
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden_features: int = 256,
        out_features: int = 10,
        num_hidden: int = 1,
        num_members: int = 4,
        *,
        base: MLP | None = None,
        use_base_weights: bool = True,
        init: FactorInit = "normal",
        r_mean: float = 1.0,
        r_std: float = 0.5,
        s_mean: float = 1.0,
        s_std: float = 0.5,
        num_data: int | None = None,
    ):
        if base is None:
            base = MLP(in_features, hidden_features, out_features, num_hidden)
        super().__init__(
            base,
            num_members,
            use_base_weights=use_base_weights,
            init=init,
            r_mean=r_mean,
            r_std=r_std,
            s_mean=s_mean,
            s_std=s_std,
            num_data=num_data,
        )
        self.in_features = base.in_features
        self.num_classes = base.out_features
        self.config = dict(
            in_features=base.in_features,
            hidden_features=base.hidden_features,
            out_features=base.out_features,
            num_hidden=base.num_hidden,
        )

    def _check_input(self, x: torch.Tensor) -> None:
        _check_mlp_input(type(self).__name__, x, self.in_features)


class BatchEnsembleLeNet(BatchEnsembleNetwork):
    """BatchEnsemble of :class:`LeNet` (same architecture and layer names), M members.

    Parameters as :class:`BatchEnsembleMLP`, with ``in_channels``, ``num_classes`` and
    ``base: LeNet``. Input ``(B, in_channels, 28, 28)``, logits ``(M, B, num_classes)``.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        num_members: int = 4,
        *,
        base: LeNet | None = None,
        use_base_weights: bool = True,
        init: FactorInit = "normal",
        r_mean: float = 1.0,
        r_std: float = 0.5,
        s_mean: float = 1.0,
        s_std: float = 0.5,
        num_data: int | None = None,
    ):
        if base is None:
            base = LeNet(in_channels, num_classes)
        super().__init__(
            base,
            num_members,
            use_base_weights=use_base_weights,
            init=init,
            r_mean=r_mean,
            r_std=r_std,
            s_mean=s_mean,
            s_std=s_std,
            num_data=num_data,
        )
        self.in_channels = base.in_channels
        self.num_classes = base.num_classes
        self.config = dict(in_channels=base.in_channels, num_classes=base.num_classes)

    def _check_input(self, x: torch.Tensor) -> None:
        _check_lenet_input(type(self).__name__, x, self.in_channels)


def batchensemble(
    module: nn.Module,
    num_members: int,
    *,
    use_base_weights: bool = True,
    r_mean: float = 1.0,
    r_std: float = 0.5,
    s_mean: float = 1.0,
    s_std: float = 0.5,
    init: FactorInit = "normal",
) -> BatchEnsembleNetwork:
    """Convert a plain (e.g. pre-trained) network into a BatchEnsemble of ``num_members``.

    ``MLP`` becomes :class:`BatchEnsembleMLP`, ``LeNet`` :class:`BatchEnsembleLeNet`, any
    other ``nn.Sequential`` of supported layers a :class:`BatchEnsembleNetwork`. With
    ``use_base_weights`` (the default) the shared weights W and every member's bias are copies
    of the module's, so the two-phase recipe is two calls: pre-train the plain network, then
    ``fit(batchensemble(net, M), None, loader, ...)``. The module itself is left untouched.

    Parameters
    ----------
    module : MLP, LeNet or nn.Sequential
    num_members : int
        Ensemble size M (>= 1).
    use_base_weights : bool, default True
        Copy W and biases from ``module``; False re-initialises them (torch's default init).
    r_mean, r_std, s_mean, s_std : float, default 1.0, 0.5, 1.0, 0.5
        With ``init="normal"``: r ~ N(r_mean, r_std), s ~ N(s_mean, s_std).
    init : {"normal", "random_sign"}, default "normal"

    Examples
    --------
    >>> import torch
    >>> net = MLP(in_features=4, hidden_features=8, out_features=3)
    >>> ensemble = batchensemble(net, 3, r_std=0.0, s_std=0.0)
    >>> x = torch.randn(2, 4)
    >>> torch.allclose(ensemble(x), net(x).expand(3, 2, 3))
    True
    """
    options = dict(
        num_members=num_members,
        use_base_weights=use_base_weights,
        init=init,
        r_mean=r_mean,
        r_std=r_std,
        s_mean=s_mean,
        s_std=s_std,
    )
    if isinstance(module, MLP):
        return BatchEnsembleMLP(base=module, **options)  # type: ignore[arg-type]
    if isinstance(module, LeNet):
        return BatchEnsembleLeNet(base=module, **options)  # type: ignore[arg-type]
    if isinstance(module, nn.Sequential):
        return BatchEnsembleNetwork(module, **options)  # type: ignore[arg-type]
    raise TypeError(
        f"batchensemble() converts an MLP, a LeNet or an nn.Sequential, got "
        f"{type(module).__name__}. Wrap your layers in nn.Sequential."
    )
