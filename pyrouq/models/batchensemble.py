"""BatchEnsemble networks: deterministic Pyro modules with shared weights and per-member
rank-1 factors, and the ``batchensemble()`` converter."""

from __future__ import annotations

import copy
import itertools
import weakref

import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from torch import nn

from pyrouq.models._observe import _check_num_data, observe
from pyrouq.models.plain import MLP, LeNet, _check_lenet_input, _check_mlp_input
from pyrouq.nn import (
    BatchEnsembleConv2d,
    BatchEnsembleLinear,
    FactorInit,
    _check_factor_init,
    _check_members,
    build_pipeline,
    forget_params,
    run_pipeline,
)

__all__ = [
    "BatchEnsembleLeNet",
    "BatchEnsembleMLP",
    "BatchEnsembleNetwork",
    "batchensemble",
]

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
            assert step is not None  # the steps before the first weighted one are stateless
            shared = step(shared)
        first_layer = getattr(self, self._steps[first][0])
        # A first convolution with one input channel is shared by the members: r_m is then a
        # scalar per member and conv(x r_m, W) s_m = conv(x, W) (r_m s_m).
        share_first = isinstance(first_layer, BatchEnsembleConv2d) and first_layer.in_channels == 1
        start = first + 1 if share_first else first
        if share_first:
            base = F.conv2d(
                shared, first_layer.weight, None, first_layer.stride, first_layer.padding
            )
            scales = [sc[:, None, None] for sc in (first_layer.r * first_layer.s).unbind(0)]
            biases = [b[:, None, None] for b in first_layer.bias.unbind(0)]
            pool = self._steps[start][1] if start < len(self._steps) else None
            if isinstance(pool, nn.MaxPool2d):
                # Max-pooling commutes with a per-channel affine map: pool once for all
                # members, max for positive scales and min for negative ones.
                high, low = pool(base), -pool(-base)
                heads = [
                    torch.addcmul(b, torch.where(sc >= 0, high, low), sc)
                    for sc, b in zip(scales, biases, strict=True)
                ]
                start += 1
            else:
                heads = [torch.addcmul(b, base, sc) for sc, b in zip(scales, biases, strict=True)]
        folded = {
            name: [t.unflatten(0, (self.num_members, -1)) for t in getattr(self, name)._folded()]
            for name, step in self._steps[start:]
            if step is None
        }
        outputs = []
        for member in range(self.num_members):
            h = heads[member] if share_first else shared
            for name, step in self._steps[start:]:
                if step is None:
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
