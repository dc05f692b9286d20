"""BatchEnsemble ``MLP`` and ``LeNet``: named front doors onto :func:`pyrouq.batchensemble`."""

from __future__ import annotations

from typing import Any

from pyrouq.convert import BatchEnsembleNetwork
from pyrouq.models.plain import MLP, LeNet, _check_lenet_input, _check_mlp_input
from pyrouq.nn import FactorInit

__all__ = ["BatchEnsembleLeNet", "BatchEnsembleMLP"]


_MLP_DEFAULTS = (("in_features", 784), ("hidden_features", 256), ("out_features", 10),
                 ("num_hidden", 1))  # fmt: skip
_LENET_DEFAULTS = (("in_channels", 1), ("num_classes", 10))
_FACTOR_OPTIONS = ("use_base_weights", "init", "r_mean", "r_std", "s_mean", "s_std")


def _factor_config(options: dict[str, Any]) -> dict[str, Any]:
    """The factor options of a front door's configuration, which its checkpoint records and
    rebuilds it with (numbers as the Python floats JSON gives back)."""
    return {
        key: options[key] if key in ("use_base_weights", "init") else float(options[key])
        for key in _FACTOR_OPTIONS
    }


def _check_base(
    name: str, base: Any, kind: type, given: dict[str, Any], defaults: dict[str, Any]
) -> None:
    """Refuse a ``base=`` of another class than ``kind``, or with an architecture other than
    the arguments given beside it (they were ignored)."""
    if not isinstance(base, kind):
        raise TypeError(
            f"{name}(base=) takes a pyrouq.{kind.__name__}, got {type(base).__name__}. For "
            "another network, use pyrouq.batchensemble(net, num_members)."
        )
    clash = [
        f"{arg}={value!r} (base has {getattr(base, arg)!r})"
        for arg, value in given.items()
        if value != defaults[arg] and value != getattr(base, arg)
    ]
    if clash:
        raise ValueError(
            f"{name}: base= has another architecture than the arguments given beside it: "
            f"{', '.join(clash)}. Pass base alone (its architecture is used), or leave it out."
        )


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
        See :class:`~pyrouq.BatchEnsembleNetwork`. All but ``num_data`` are stored in ``config``
        with the architecture (a checkpoint rebuilds the model with them; N is saved beside).

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
        given = dict(
            in_features=in_features,
            hidden_features=hidden_features,
            out_features=out_features,
            num_hidden=num_hidden,
        )
        if base is None:
            base = MLP(**given)
        _check_base(type(self).__name__, base, MLP, given, dict(_MLP_DEFAULTS))
        super().__init__(
            base,
            num_members,
            use_base_weights=use_base_weights,
            init=init,
            r_mean=r_mean,
            r_std=r_std,
            s_mean=s_mean,
            s_std=s_std,
            norms="shared",  # no normalisation layers: the option has nothing to act on
            num_data=num_data,
        )
        self.in_features = base.in_features
        self.num_classes = base.out_features
        self.config: dict[str, Any] = dict(
            in_features=base.in_features,
            hidden_features=base.hidden_features,
            out_features=base.out_features,
            num_hidden=base.num_hidden,
            **_factor_config(self.options),
        )

    def _check_input(self, x: Any) -> None:
        _check_mlp_input(type(self).__name__, x, self.in_features)


class BatchEnsembleLeNet(BatchEnsembleNetwork):
    """BatchEnsemble of :class:`LeNet` (same architecture and layer names), M members.

    Parameters as :class:`BatchEnsembleMLP`, with ``in_channels``, ``num_classes`` and
    ``base: LeNet``. Input ``(B, in_channels, 28, 28)``, logits ``(M, B, num_classes)``.

    Examples
    --------
    >>> import torch
    >>> model = BatchEnsembleLeNet(num_members=2)
    >>> model(torch.randn(3, 1, 28, 28)).shape  # (M, B, num_classes)
    torch.Size([2, 3, 10])
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
        given = dict(in_channels=in_channels, num_classes=num_classes)
        if base is None:
            base = LeNet(**given)
        _check_base(type(self).__name__, base, LeNet, given, dict(_LENET_DEFAULTS))
        super().__init__(
            base,
            num_members,
            use_base_weights=use_base_weights,
            init=init,
            r_mean=r_mean,
            r_std=r_std,
            s_mean=s_mean,
            s_std=s_std,
            norms="shared",  # no normalisation layers: the option has nothing to act on
            num_data=num_data,
        )
        self.in_channels = base.in_channels
        self.num_classes = base.num_classes
        self.config: dict[str, Any] = dict(
            in_channels=base.in_channels,
            num_classes=base.num_classes,
            **_factor_config(self.options),
        )

    def _check_input(self, x: Any) -> None:
        _check_lenet_input(type(self).__name__, x, self.in_channels)
