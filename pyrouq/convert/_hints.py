"""What the messages of :func:`~pyrouq.convert._select.select_parameters` say about the layers
a ``select=`` found but could not take parameters from."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from pyrouq._signatures import call_signature, not_callable_as
from pyrouq._util import class_name, warn_caller

__all__ = [
    "LINEAR_TYPES",
    "WEIGHTED_TYPES",
    "converted",
    "names_list",
    "no_linear",
    "no_match",
    "nothing_of_their_own",
    "refuse_types",
    "warn_parametrized",
    "warn_unregistered",
]

WEIGHTED_TYPES = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd)
"""Layers whose weight and bias ``select=None`` makes latent (``nn.Bilinear``, torch's other
linear layer, too: left out, a bilinear head would stay deterministic without a word)."""

LINEAR_TYPES = (nn.Linear, nn.Bilinear)
"""Layers ``select="last_layer"`` picks the last of."""


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


def no_linear(module: nn.Module) -> str:
    """The message refusing ``select='last_layer'`` for ``module``, which has no nn.Linear."""
    convs = [name for name, m in module.named_modules() if isinstance(m, nn.modules.conv._ConvNd)]
    last = "."
    if convs and convs[-1]:
        last = f" (its last convolution, as select=[{convs[-1]!r}], if it makes the outputs)."
    elif convs:  # the network itself, whose name ('') select= lists do not take
        last = f". The network itself is a {type(module).__name__}: select=None (all of it)."
    return (
        f"select='last_layer' needs an nn.Linear, and {class_name(module)} has none. Pass "
        f"select= the names of the layers or parameters to make Bayesian{last}"
    )


def no_match(module: nn.Module, key: str, params: Sequence[str]) -> str:
    """The message refusing the ``select=`` entry ``key``, which matches none of the
    parameters ``params`` of ``module``; a key naming a tensor a parametrization computes, or a
    buffer, is told so."""
    owner, _, attr = key.rpartition(".")
    try:
        layer: nn.Module | None = module.get_submodule(owner)
    except AttributeError:
        layer = None
    why = ""
    if layer is not None and parametrize.is_parametrized(layer, attr):
        own = [n for n in params if n.startswith(f"{owner}.parametrizations.{attr}.".lstrip("."))]
        why = (
            f" {key!r} is computed by a parametrization (e.g. weight_norm), not stored as a "
            f"parameter: name the parametrization's own tensors ({names_list(own)}), or remove "
            f"it before converting (torch.nn.utils.parametrize.remove_parametrizations(layer, "
            f"{attr!r}))."
        )
    elif key in dict(module.named_buffers()):
        why = f" {key!r} is a buffer, not a parameter: buffers behave as in torch, never latent."
    return (
        f"select entry {key!r} matches no parameter of {class_name(module)}. Its parameters "
        f"are {names_list(list(params))}; give module names (e.g. 'fc') or dotted prefixes of "
        f"these.{why}"
    )


def _refuse_objects(module: nn.Module, objects: list[Any]) -> None:
    """Refuse layers or tensors given to ``select=`` in place of their names (named where
    ``module`` holds that very object: bayesian() asks of the network given, before its
    copy)."""
    given = objects[0]
    kind = isinstance(given, nn.Module)
    what = f"the {type(given).__name__} layer" if kind else f"a tensor {tuple(given.shape)}"
    where = "net.named_modules()" if kind else "net.named_parameters()"
    owned = module.named_modules() if kind else module.named_parameters(remove_duplicate=False)
    names = [name for name, value in owned if value is given]
    if names == [""]:
        fix = "It is the network itself: select=None (every Linear and convolution)."
    elif names and kind and not any(True for _ in given.parameters()):
        fix = f"It is {names[0]!r}, which has no parameters to make Bayesian."
    elif names:
        fix = f"Here it is named {names[0]!r}: select=[{names[0]!r}]."
    else:
        fix = f"Pass its name, as {where} gives it (e.g. select=['fc'])."
    raise TypeError(
        f"select= takes None, 'last_layer', module names or a callable (name, param) -> bool, "
        f"not the layers or tensors themselves: got {what}. {fix}"
    )


def _is_layer(module: nn.Module, given: nn.Module) -> bool:
    """Whether a module given to ``select=`` is a layer (of the network, or of torch, or one
    whose forward cannot take ``(name, param)``), not a selector of the user's own."""
    return (
        any(given is m for m in module.modules())
        or type(given).__module__.startswith("torch.")
        or not_callable_as(given.forward, "name", None) is not None
    )


def _refuse_signature(select: object) -> None:
    """Refuse a ``select=`` callable that cannot be called as ``(name, param)``."""
    if not callable(select) or isinstance(select, type):
        return
    if not_callable_as(select, "name", None) is None:  # it can (or says so when called)
        return
    signature = call_signature(select)
    raise TypeError(
        f"The select callable is called as select(name, param) for each parameter, "
        f"and {getattr(select, '__name__', class_name(select))}{signature} cannot take "
        "those two arguments. Pass e.g. lambda name, param: name.startswith('fc')."
    )


def refuse_prior_signature(prior: object) -> None:
    """Refuse a ``prior=`` function that cannot be called as ``(name, param)`` (Python's
    words named neither the option nor how it is called)."""
    if not_callable_as(prior, "name", None) is None:  # it can (or says so when called)
        return
    name = getattr(prior, "__name__", class_name(prior))
    instance, tail = "prior=dist.Normal(0.0, 0.1)", ""
    if isinstance(prior, type) and issubclass(prior, torch.distributions.Distribution):
        # its instance is one prior for every site, expanded to each site's shape, which
        # torch refuses to do for a subclass with an __init__ of its own and no .expand()
        own = [c for c in prior.__mro__ if c.__module__.split(".")[0] not in ("torch", "pyro")]
        if any("expand" in vars(c) for c in own):
            instance += f", or {name}(...) built with its arguments"
        else:
            tail = (
                f"; {name}(...) built with its arguments would be one too once {name} "
                "defines .expand(), which torch asks of a subclass with an __init__ of its own"
            )
    raise TypeError(
        f"A prior= function is called as prior(name, param) for each latent site, and "
        f"{name}{call_signature(prior)} cannot take those two arguments. Pass e.g. lambda "
        "name, param: 0.1 if name.startswith('fc') else 1.0 (a float is the scale of "
        "Normal(0, s)), or one prior for every site: a float (prior=0.1) or a distribution "
        f"instance ({instance}){tail}."
    )


def refuse_types(module: nn.Module, select: object) -> None:
    """Refuse a ``select=`` that is a class, or a list holding one (``select=nn.Linear``: a
    class is callable, and would be called as ``(name, param) -> bool``), saying what to pass;
    likewise layers or tensors given in place of their names (a layer is callable too), and a
    callable that cannot take ``(name, param)``."""
    given = list(select) if isinstance(select, (list, tuple)) else [select]
    types = tuple(t for t in given if isinstance(t, type))
    objects = [  # a module whose forward takes (name, param) is a selector of its own
        v
        for v in given
        if isinstance(v, torch.Tensor) or (isinstance(v, nn.Module) and _is_layer(module, v))
    ]
    if objects and not types:
        _refuse_objects(module, objects)
    if not types:
        _refuse_signature(select)
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


_CONTAINERS = (list, tuple, set, frozenset, dict)

HELD_LOOKED_AT = 10_000
"""Items of one attribute's containers the conversion's checks (:func:`warn_unregistered`, the
refusal of a latent parameter held outside torch's registry) look at, at most: layers held in a
list lie near its start, and a long one (a vocabulary, a table of numbers) would cost every
conversion a pass over it (about 0.6 s a million items)."""

_END = object()


def contents(value: object, budget: int | None = HELD_LOOKED_AT) -> Iterator[object]:
    """What ``value``, a list, tuple (a namedtuple too), set or dict (its values), holds that is
    none of those, nested to any depth, depth first and in order; ``value`` itself if it is
    none of those. A container that holds itself is looked into once; modules are not looked
    into. Walked without recursion (a deeply nested list would exceed Python's limit), reading
    ``budget`` items at most, containers included (None: all)."""
    left = math.inf if budget is None else budget
    stack: list[Iterator[object]] = [iter((value,))]
    seen: set[int] = set()
    while stack and left > 0:
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            continue
        left -= 1
        if not isinstance(item, _CONTAINERS):
            yield item
        elif id(item) not in seen:
            seen.add(id(item))
            stack.append(iter(item.values() if isinstance(item, dict) else item))


def _stray(value: object, registered: set[int]) -> bool:
    """Whether ``value``, a list, tuple, set or dict, holds a module or parameter (as
    :func:`contents` reads it, :data:`HELD_LOOKED_AT` items at most) with a parameter not in
    ``registered``."""
    for item in contents(value):
        if isinstance(item, nn.Parameter):
            if id(item) not in registered:
                return True
        elif isinstance(item, nn.Module):
            if any(id(p) not in registered for p in item.parameters()):
                return True
    return False


def warn_unregistered(module: nn.Module) -> None:
    """Warn of the layers and parameters ``module`` holds in plain lists, tuples or dicts of
    its own (``self.layers = [nn.Linear(4, 4)]``) and not also registered: torch does not
    know them, so they are never latent, trained, saved nor moved, though forward may run them.
    Each attribute's containers are looked into up to :data:`HELD_LOOKED_AT` items."""
    registered = {id(p) for p in module.parameters()}
    torch_own = set(vars(nn.Module()))  # (its hook dicts, ...)
    found = [
        f"{path}.{attr}" if path else attr
        for path, owner in module.named_modules()
        for attr, value in vars(owner).items()
        if attr not in torch_own and isinstance(value, _CONTAINERS) and _stray(value, registered)
    ]
    if found:
        warn_caller(
            f"{class_name(module)} holds layers or parameters in plain Python containers "
            f"({names_list(found, 4)}: a list, tuple or dict), which torch does not register: "
            "their parameters are not in net.parameters(), so they are never latent, fit() "
            "does not train them, save() does not keep them (a loaded model has the "
            "skeleton's values) and .to() does not move them, though forward may run them. Hold "
            "them in nn.ModuleList / nn.ModuleDict (parameters: nn.ParameterList / "
            "nn.ParameterDict); if they are kept out of torch's sight on purpose (a frozen "
            "teacher network), filter this warning."
        )
