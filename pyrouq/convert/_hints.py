"""What the messages of :func:`~pyrouq.convert._select.select_parameters` say about the layers
a ``select=`` found but could not take parameters from."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from torch import nn
from torch.nn.utils import parametrize

from pyrouq._util import class_name, warn_caller

__all__ = [
    "WEIGHTED_TYPES",
    "converted",
    "names_list",
    "nothing_of_their_own",
    "refuse_types",
    "warn_parametrized",
]

WEIGHTED_TYPES = (nn.Linear, nn.modules.conv._ConvNd)
"""Layers whose weight and bias ``select=None`` makes latent."""


def names_list(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _computed(module: nn.Module, layers: Collection[str]) -> list[str]:
    """The tensors of the ``layers`` of ``module`` that a parametrization computes."""
    return [
        f"{name}.{tensor}" if name else tensor
        for name, m in module.named_modules()
        if name in layers and parametrize.is_parametrized(m)
        for tensor in m.parametrizations  # type: ignore[union-attr]
    ]


def warn_parametrized(module: nn.Module, layers: set[str]) -> None:
    """Warn when a selected layer's weight is computed by a parametrization (weight_norm,
    spectral_norm, ...): that tensor is no parameter, so it stays a point estimate."""
    computed = _computed(module, layers)
    if computed:
        warn_caller(
            f"bayesian(): {names_list(computed)} of {class_name(module)}: computed by a "
            "parametrization (e.g. weight_norm, spectral_norm) rather than stored as "
            "parameters, these stay point estimates, as do the parametrization's own tensors. "
            "To make them latent, remove the parametrization (torch.nn.utils.parametrize."
            "remove_parametrizations) before converting.",
        )


def converted(module: nn.Module) -> str:
    """For the messages refusing ``module`` with nothing to select: where it is the inner
    network of a converted model, what to pass instead."""
    if any(getattr(m, "_is_batchensemble", False) for m in module.modules()):
        return (
            " Its layers are BatchEnsemble layers: for a rank-1 network, pass the BatchEnsemble "
            "itself, bayesian(ensemble, ...), or the plain network to pyrouq.rank1."
        )
    if any(isinstance(m, WEIGHTED_TYPES) and "weight" in m._buffers for m in module.modules()):
        return (
            " Its nn.Linear / convolution weights are buffers, as in the .net of a model "
            "bayesian() made: pass model.plain_network() (a plain copy) or the original network."
        )
    return ""


def nothing_of_their_own(module: nn.Module, layers: Sequence[str], select: str) -> str:
    """The message refusing ``select`` (as the user wrote it) where the Linear / convolution
    ``layers`` it found hold no parameter of their own (a weight computed by a
    parametrization, and no bias; weights held as buffers)."""
    computed = _computed(module, layers)
    why = (
        f": {names_list(computed)} computed by a parametrization (e.g. weight_norm), not "
        "stored as parameters, and no bias"
        if computed
        else ""
    )
    fix = (
        " Remove the parametrization before converting (torch.nn.utils.parametrize."
        "remove_parametrizations(layer, 'weight')) to make the weight latent, or name the "
        "parametrization's own tensors, select=[name]."
        if computed
        else ""
    )
    found = ", ".join(repr(n) if n else "the network itself" for n in layers[:8])
    return (
        f"select={select} picks nothing: the nn.Linear / convolution layers it found in "
        f"{class_name(module)} ({found}) hold no parameter of their own{why}.{fix}"
        f"{converted(module)}"
    )


def refuse_types(module: nn.Module, select: object) -> None:
    """Refuse a ``select=`` that is a class, or a list holding one (``select=nn.Linear``: a
    class is callable, and would be called as ``(name, param) -> bool``), saying what to pass."""
    given = list(select) if isinstance(select, (list, tuple)) else [select]
    types = tuple(t for t in given if isinstance(t, type))
    if not types:
        return
    what = ", ".join(t.__name__ for t in types)
    how = ""
    if all(issubclass(t, nn.Module) for t in types):
        names = [
            f"nn.{t.__name__}" if t.__module__.startswith("torch.nn") else t.__name__ for t in types
        ]
        spelled = names[0] if len(names) == 1 else f"({', '.join(names)})"
        layers = [name for name, m in module.named_modules() if isinstance(m, types) and name]
        found = f"here {names_list(layers)}" if layers else f"{class_name(module)} has none"
        how = (
            f" For the layers of a type, pass their names ({found}): select=[name for name, m "
            f"in net.named_modules() if name and isinstance(m, {spelled})]; select=None "
            "already picks every nn.Linear and convolution."
        )
        if isinstance(module, types) and not layers:
            how = f" The network itself is a {type(module).__name__}: select=None (all of it)."
    raise TypeError(
        f"select= takes None, 'last_layer', module names or a callable (name, param) -> bool, "
        f"not a class: got {what}.{how}"
    )
