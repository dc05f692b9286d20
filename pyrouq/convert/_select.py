"""What the converters share: selecting parameters, resolving priors, module records."""

from __future__ import annotations

import copy
import inspect
import itertools
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import pyro.distributions as dist
import torch
from torch import Tensor, nn
from torch.nn.parameter import is_lazy
from torch.nn.utils import parametrize

from pyrouq._distribution_parts import innermost_distribution
from pyrouq._numbers import is_real, tensor_hint, text_hint
from pyrouq._util import (
    builder_of,
    check_held,
    check_int,
    check_positive_float,
    class_name,
    forward_inputs,
    warn_caller,
)
from pyrouq._words import slip_hint
from pyrouq._wrappers import _PARALLEL
from pyrouq.convert._hints import (
    LINEAR_TYPES,
    WEIGHTED_TYPES,
    no_linear,
    no_match,
    nothing_of_their_own,
    refuse_prior_signature,
    refuse_types,
    warn_unregistered,
)
from pyrouq.convert._hints import converted as _converted
from pyrouq.convert._hints import names_list as _names_list
from pyrouq.convert._hints import warn_parametrized as _warn_parametrized
from pyrouq.convert._record import LAYER_SETTINGS, module_record

__all__ = [
    "DEFAULT_PRIOR_SCALE",
    "LAYER_SETTINGS",
    "PriorSpec",
    "SelectSpec",
    "SitePrior",
    "module_record",
    "resolve_priors",
    "select_parameters",
]

DEFAULT_PRIOR_SCALE = 1.0
"""Standard deviation of the default ``Normal(0, s)`` prior of every latent site."""

PriorValue = float | dist.Distribution
PriorSpec = (
    float | dist.Distribution | Mapping[str, PriorValue] | Callable[[str, nn.Parameter], PriorValue]
)
"""What ``prior=`` accepts (see :func:`bayesian`)."""

SelectSpec = None | Literal["last_layer"] | Sequence[str] | Callable[[str, nn.Parameter], bool]
"""What ``select=`` accepts (see :func:`bayesian`)."""

COUNTER = itertools.count()
"""Numbers the converted models, so that each has its own name in Pyro's param store."""


# --------------------------------------------------------------------------------------------
# Selecting parameters
# --------------------------------------------------------------------------------------------


def _matches(name: str, key: str) -> bool:
    """Whether the dotted ``name`` is ``key`` or lies under it (``layer1`` covers
    ``layer1.0.conv1.weight``, not ``layer10.weight``)."""
    return name == key or name.startswith(key + ".")


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


def _picks(select: Callable[[str, nn.Parameter], bool], name: str, param: nn.Parameter) -> bool:
    """``select(name, param)`` as True or False, or a TypeError for an answer that is neither
    (a tensor of several values)."""
    answer = select(name, param)
    try:
        return bool(answer)
    except (RuntimeError, TypeError, ValueError):
        raise TypeError(
            f"The select callable must return True or False for each parameter; for {name!r} "
            f"it returned {class_name(answer)}{_shape_of(answer)}, which is neither. Return "
            "a bool, e.g. lambda name, param: name.startswith('fc')."
        ) from None


def _shape_of(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return "" if shape is None else f" of shape {tuple(shape)}"


def select_parameters(module: nn.Module, select: SelectSpec) -> list[str]:
    """The dotted names of the parameters of ``module`` that ``select`` picks, in
    ``named_parameters(remove_duplicate=False)`` order (see :func:`bayesian` for the accepted
    values): a tied parameter is picked under any of its names, to be made one latent site
    (whichever of its names picks it)."""
    params = dict(module.named_parameters(remove_duplicate=False))
    if not params:
        raise ValueError(
            f"{class_name(module)} has no parameters, so there is nothing to make Bayesian. "
            f"Pass a network with weights (e.g. nn.Linear / nn.Conv2d layers).{_converted(module)}"
        )
    if select is None:
        weighted = {name for name, m in module.named_modules() if isinstance(m, WEIGHTED_TYPES)}
        candidates = [n for n in params if _owner(n) in weighted]
        chosen = [n for n in candidates if params[n].requires_grad]  # frozen ones stay fixed
        if weighted and not candidates:  # (weights computed by parametrizations, no bias)
            raise ValueError(nothing_of_their_own(module, sorted(weighted), "None"))
        if not candidates:
            raise ValueError(
                f"{class_name(module)} has no nn.Linear or convolution layer, so "
                f"select=None picks nothing. Its parameters are {_names_list(list(params))}; "
                "pass select= a list of names or prefixes, or a callable (name, param) -> "
                f"bool.{_converted(module)}"
            )
        if not chosen:
            raise ValueError(
                f"Every nn.Linear and convolution parameter of {class_name(module)} is frozen "
                f"(requires_grad=False: {_names_list(candidates)}), and select=None leaves "
                "frozen parameters as they are, so it picks nothing. Unfreeze the layers to make "
                "Bayesian (layer.requires_grad_(True)), or name them: select=[...]."
            )
        _warn_parametrized(module, weighted)
        return chosen
    if isinstance(select, str):
        if select != "last_layer":
            hint = slip_hint(select, ("last_layer",))
            raise ValueError(
                f"Unknown select {select!r}{hint}: expected None (every Linear and convolution), "
                "'last_layer', a list of module names or prefixes, or a callable "
                "(name, param) -> bool. For one module, pass a list: select=[name]."
            )
        linears = [name for name, m in module.named_modules() if isinstance(m, LINEAR_TYPES)]
        if not linears:
            raise ValueError(no_linear(module))
        chosen = [n for n in params if _owner(n) == linears[-1]]
        if not chosen:
            raise ValueError(nothing_of_their_own(module, linears[-1:], "'last_layer'"))
        _warn_parametrized(module, {linears[-1]})
        return chosen
    refuse_types(module, select)
    if callable(select):
        chosen = [n for n, p in params.items() if _picks(select, n, p)]
        if not chosen:
            raise ValueError(
                f"The select callable returned False for every parameter of "
                f"{class_name(module)} ({_names_list(list(params))}); it must pick at least "
                "one."
            )
        return chosen
    if isinstance(select, Sequence) and select and all(isinstance(k, str) for k in select):
        for key in select:
            if not any(_matches(n, key) for n in params):
                raise ValueError(no_match(module, key, list(params)))
        return [n for n in params if any(_matches(n, k) for k in select)]
    raise TypeError(
        f"Expected select to be None, 'last_layer', a non-empty list of names or a callable "
        f"(name, param) -> bool, got {select!r}."
    )


# --------------------------------------------------------------------------------------------
# Priors
# --------------------------------------------------------------------------------------------


class SitePrior(nn.Module):
    """The prior of one latent site: a ``pyro.distributions`` family and its parameters.

    The parameters are buffers, so they move with ``.to(device)`` and are saved in the model's
    ``state_dict``; a distribution that cannot be rebuilt from its parameters is held as is
    (``opaque``; such a model cannot be saved).
    """

    def __init__(
        self,
        family: str | None,
        params: Mapping[str, Tensor],
        shape: torch.Size,
        opaque: Any = None,
    ):
        super().__init__()
        self.family = family
        self.shape = torch.Size(shape)
        self.opaque = opaque
        self._names = tuple(params)
        for key, value in params.items():
            self.register_buffer(key, value.detach().clone())

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # a cast or a move (.double(), .to(device)) reaches the buffers; an opaque prior's
        # tensors are given the same treatment, so that its draws match the network's
        out = super()._apply(fn, recurse)
        if self.opaque is not None:
            with torch.no_grad():
                self.opaque = map_tensors(self.opaque, fn)
        return out

    def base(self) -> dist.TorchDistribution:
        """The univariate distribution, before expansion to the site's shape."""
        if self.opaque is not None:
            return self.opaque
        cls = getattr(dist, str(self.family))
        return cls(**{key: getattr(self, key) for key in self._names})  # type: ignore[no-any-return]

    def distribution(self) -> dist.TorchDistribution:
        """The site's prior, of the site's shape, all of it one event."""
        base = self.base()
        if base.batch_shape != self.shape:
            base = base.expand(self.shape)
        return base.to_event(len(self.shape)) if len(self.shape) else base

    def extra_repr(self) -> str:
        if self.opaque is not None:
            return f"opaque={self.opaque}"
        values = []
        for key in self._names:
            value = getattr(self, key)
            if value.numel() == 1:  # a meta tensor has no value: "...", as torch shows it
                values.append(f"{key}={'...' if value.is_meta else format(value.item(), 'g')}")
            elif value.numel() <= 8 and not value.is_meta:  # a few values (one per output)
                values.append(f"{key}=[{', '.join(f'{v:g}' for v in value.flatten().tolist())}]")
            else:
                values.append(f"{key}=tensor of shape {tuple(value.shape)}")
        return f"{self.family}({', '.join(values)})"


def map_tensors(
    obj: Any, fn: Callable[[Tensor], Tensor], memo: dict[int, Any] | None = None
) -> Any:
    """A copy of the distribution (or transform) ``obj`` with ``fn`` applied to every tensor it
    holds, nested distributions and transforms included (one tensor held twice stays one)."""
    memo = {} if memo is None else memo
    if id(obj) in memo:
        return memo[id(obj)]
    if torch.is_tensor(obj):
        out: Any = fn(obj)
    elif type(obj) in (list, tuple):
        out = type(obj)(map_tensors(item, fn, memo) for item in obj)
    elif isinstance(obj, (torch.distributions.Distribution, torch.distributions.Transform)):
        out = copy.copy(obj)
        memo[id(obj)] = out
        out.__dict__ = {
            # a transform's weak reference to its inverse is rebuilt on demand; an inverse
            # transform's own _inv (``t.inv``: the transform it inverts) is a strong one, kept
            key: None if isinstance(value, weakref.ref) else map_tensors(value, fn, memo)
            for key, value in obj.__dict__.items()
        }
    else:
        return obj
    memo[id(obj)] = out
    return out


def _site_prior(
    value: Any,
    site: str,
    shape: torch.Size,
    device: Any = None,
    dtype: torch.dtype | None = None,
    every: bool = False,
) -> SitePrior:
    """A :class:`SitePrior` of ``site`` from a float (the scale of a zero-mean Normal) or a
    univariate distribution (expanded to the site's shape), its floating parameters on
    ``device`` and in ``dtype`` (the site's template parameter's; by default a
    distribution's own and torch's default for a float). ``every``: ``value`` is the one
    ``prior=`` given for every site, which a refusal names so (not as this site's alone)."""
    subject = "prior=" if every else f"The prior of {site!r}"
    if is_real(value):
        scale_of = "prior=" if every else f"the prior scale of {site!r}"
        scale = check_positive_float(
            scale_of,
            value,
            "A float prior is the standard deviation s of Normal(0, s); pass e.g. 1.0.",
        )
        kind = dtype or torch.get_default_dtype()
        whose = f"the dtype of site {site!r}" if every else "the site's dtype"  # (mixed nets)
        check_held(scale_of, scale, kind, whose, "Pass 1.0.")
        params = {
            "loc": torch.tensor(0.0, device=device, dtype=dtype),
            "scale": torch.tensor(scale, device=device, dtype=dtype),
        }
        return SitePrior("Normal", params, shape)
    if not isinstance(value, torch.distributions.Distribution):
        hint = tensor_hint(value) or text_hint(value, "prior=" if every else "its scale", 0)
        if torch.is_tensor(value) and value.numel() != 1:  # float(t) would fail: scales
            hint = (
                f" of shape {tuple(value.shape)} (scales per weight: pass prior="
                f"{{{site!r}: dist.Normal(0.0, t)}})"
            )
        got = type(value).__name__
        if isinstance(value, type):  # prior=dist.Normal: an instance, Normal(0., 1.), meant
            got = f"the class {value.__name__} itself"
            if issubclass(value, torch.distributions.Distribution):
                name, named = value.__name__, getattr(value, "arg_constraints", None)
                built = _library_built(value)
                shown = f"dist.{name}" if built and hasattr(dist, name) else name
                hint = (  # (Normal(0.0, 1.0), not Gamma(0.0, 1.0): a concentration of 0)
                    f"; pass an instance, e.g. {shown}(0.0, 1.0)"
                    if built and isinstance(named, dict) and set(named) == {"loc", "scale"}
                    else f"; pass an instance with its parameters, e.g. {shown}(...)"
                )
        by_site = " (or a dict of them by site name)" if every else ""
        raise TypeError(
            f"{subject} must be a float (the scale of Normal(0, s)) or a pyro.distributions "
            f"distribution{by_site}, got {got}{hint}."
        )
    base = value
    while isinstance(base, torch.distributions.Independent):
        base = base.base_dist
    if isinstance(base, dist.ExpandedDistribution):
        base = base.base_dist
    if base.event_shape:
        shaped = (
            f"each site's shape ({site!r}: {tuple(shape)})"
            if every
            else f"the site's shape {tuple(shape)}"
        )
        raise ValueError(
            f"{subject} must be univariate (event_shape ()), expanded to {shaped} by pyrouq; "
            f"got {base} with event_shape {tuple(base.event_shape)}. Pass e.g. "
            "dist.Normal(0.0, 1.0)."
        )
    try:
        broadcast = torch.broadcast_shapes(base.batch_shape, shape)
    except RuntimeError:
        broadcast = None
    if broadcast != shape:
        if every:  # one prior for sites of several shapes
            raise ValueError(
                f"prior= has batch_shape {tuple(base.batch_shape)}, which does not broadcast to "
                f"the shape {tuple(shape)} of site {site!r}, one of the sites it is the prior "
                "of. Pass a scalar distribution, or a dict of priors by site name, prior="
                f"{{{site!r}: a prior of its shape, ...}}."
            )
        raise ValueError(
            f"The prior of {site!r} has batch_shape {tuple(base.batch_shape)}, which does not "
            f"broadcast to the site's shape {tuple(shape)}. Pass a scalar distribution or one "
            "of the site's shape."
        )
    if isinstance(innermost_distribution(value), dist.Delta):  # masked ones too
        if every:  # (the advice below is for one site: select= takes it out alone)
            raise ValueError(
                "prior= is a Delta, which would fix every latent weight: a guide's KL to it is "
                "infinite. Pass a prior with a spread, e.g. prior=1.0; a parameter you mean to "
                "keep fixed, leave out of select= (a point estimate, trained by fit()) or fix "
                "yourself (param.requires_grad_(False)) before converting."
            )
        raise ValueError(
            f"{subject} is a Delta, which fixes the weight: a guide's KL to it is "
            "infinite. Leave the parameter out of select= (a point estimate, trained by fit()) "
            "or fix it yourself (param.requires_grad_(False)) before converting."
        )
    family = type(base).__name__
    params = {k: getattr(base, k) for k in base.arg_constraints}
    try:
        params = {k: torch.as_tensor(v, device=device) for k, v in params.items()}
        if dtype is not None:
            params = {k: v.to(dtype) if v.is_floating_point() else v for k, v in params.items()}
        rebuilt = getattr(dist, family)(**params)
        if type(rebuilt).__name__ != family or rebuilt.batch_shape != base.batch_shape:
            raise TypeError
    except Exception:  # not rebuildable from its parameters: keep the object itself, its
        # tensors on the site's device and in its dtype, as a rebuilt prior's are
        def cast(tensor: Tensor) -> Tensor:
            floating = dtype is not None and tensor.is_floating_point()
            return tensor.detach().to(device=device, dtype=dtype if floating else None)

        return SitePrior(None, {}, shape, opaque=map_tensors(base, cast))
    return SitePrior(family, params, shape)


def _same_prior(one: Any, other: Any, site: str, param: nn.Parameter) -> bool:
    """Whether two priors given for one site are the same (a float and ``Normal(0, it)``, or
    two distributions of one family built apart, with equal parameters)."""
    a, b = (_site_prior(v, site, param.shape, param.device, param.dtype) for v in (one, other))
    return (
        a.opaque is None
        and b.opaque is None
        and a.family == b.family
        and set(a._names) == set(b._names)
        and all(torch.equal(getattr(a, k), getattr(b, k)) for k in a._names)
    )


def resolve_priors(
    prior: PriorSpec,
    params: Mapping[str, nn.Parameter],
    all_names: Sequence[str],
    aliases: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, SitePrior]:
    """One :class:`SitePrior` per latent site (``params``: ``{site: template parameter}``). A
    dict's key covers a tied site (``aliases``: ``{site: its other names}``) when it matches
    any of its names."""
    out: dict[str, SitePrior] = {}
    names = {site: (site, *(aliases or {}).get(site, ())) for site in params}
    if isinstance(prior, Mapping):
        for key in prior:
            if not isinstance(key, str) or not any(
                _matches(n, key) for site in params for n in names[site]
            ):
                unselected = [n for n in all_names if isinstance(key, str) and _matches(n, key)]
                why = (
                    f"it names parameters that are not latent ({_names_list(unselected)}; widen "
                    "select= to make them Bayesian)"
                    if unselected
                    else "it matches no parameter"
                )
                raise ValueError(
                    f"prior key {key!r} matches no latent site: {why}. The latent sites are "
                    f"{_names_list(list(params))}; use these names or their dotted prefixes."
                )
    to_learn: list[str] = []  # sites whose prior has parameters that require grad
    learnt: set[str] = set()
    for site, param in params.items():
        if isinstance(prior, Mapping):
            keys = sorted((k for k in prior if any(_matches(n, k) for n in names[site])), key=len)
            value: Any = prior[keys[-1]] if keys else DEFAULT_PRIOR_SCALE
            # equally long keys: names of a tied site (a third name's key may differ too)
            for key in (k for k in keys[:-1] if len(k) == len(keys[-1])):
                other = prior[key]
                if other is not value and not _same_prior(other, value, site, param):
                    raise ValueError(
                        f"prior keys {key!r} and {keys[-1]!r} both match {site!r}, one "
                        f"tensor under the names {_names_list(names[site])}, with other "
                        "priors, and neither is longer (more specific) than the other. Give "
                        f"it one prior: drop one key, or add the key {site!r}."
                    )
        elif callable(prior) and not isinstance(prior, torch.distributions.Distribution):
            # a class built as torch, Pyro or Python build it (dist.Normal itself) is refused
            # below; one with a constructor of its own may be a function (name, param) -> prior
            if not _library_built(prior):
                refuse_prior_signature(prior)
            value = prior if _library_built(prior) else prior(site, param)
        else:
            value = prior
        every = value is prior and not isinstance(prior, Mapping)  # (not a function's result)
        out[site] = _site_prior(value, site, param.shape, param.device, param.dtype, every)
        if isinstance(value, torch.distributions.Distribution):
            grads = [k for k, v in _parameters_of(value).items() if v.requires_grad]
            if grads:
                to_learn.append(site)
                learnt.update(grads)
    if to_learn:
        warn_caller(
            f"The priors of {_names_list(to_learn)} have parameters that require grad "
            f"({', '.join(sorted(learnt))}); pyrouq does not learn priors (they are part of the "
            "model, not of the fit): fit() leaves their values as given. Pass plain tensors "
            "to silence this.",
        )
    return out


def _library_built(value: Any) -> bool:
    """Whether ``value`` is a class whose constructor is torch's, Pyro's or Python's own
    (``dist.Normal``, a subclass of it that adds none, ``float``)."""
    if not isinstance(value, type):
        return False
    own = next(c for c in value.__mro__ if "__init__" in vars(c) or "__new__" in vars(c))
    return own.__module__.partition(".")[0] in ("builtins", "torch", "pyro")


def _parameters_of(prior: torch.distributions.Distribution) -> dict[str, Tensor]:
    """The tensor parameters of the univariate distribution inside ``prior``'s wrappers."""
    base = innermost_distribution(prior)
    values = {k: getattr(base, k, None) for k in base.arg_constraints}
    return {k: v for k, v in values.items() if torch.is_tensor(v)}


# --------------------------------------------------------------------------------------------
# Bayesian networks

# --------------------------------------------------------------------------------------------
# Shared checks
# --------------------------------------------------------------------------------------------


def check_num_data(num_data: int | None) -> int | None:
    hint = "Pass the training-set size N, or leave num_data out (fit() sets it)."
    return None if num_data is None else check_int("num_data", num_data, hint=hint)


def check_module(module: Any, what: str) -> None:
    """A plain ``nn.Module`` to convert, or a TypeError saying what came."""
    if not isinstance(module, nn.Module):
        # bayesian(MyNet), bayesian(torchvision.models.resnet18): what builds one, named
        fix = f"{class_name(module)}. Pass the network, e.g. nn.Sequential(nn.Linear(4, 2))"
        raise TypeError(f"Expected an nn.Module to {what}, got {builder_of(module) or fix}.")
    if getattr(module, "_pyrouq_model", False):
        raise TypeError(
            f"{class_name(module)} is already a pyrouq model; pass the plain network "
            "it was made from."
        )
    if isinstance(module, _PARALLEL):  # (DataParallel, DistributedDataParallel)
        # their replicas split the batch, which a BatchEnsemble folds members into, and
        # torch.func.functional_call refuses DataParallel
        raise TypeError(
            f"Cannot {what} {class_name(module)}: pass the network inside it "
            "(net.module). To train on several devices, run fit() under torch.distributed "
            "(e.g. torchrun): it shards the data and averages the gradients itself (docs: "
            "scaling out)."
        )
    if isinstance(module, torch.jit.ScriptModule):
        raise TypeError(
            f"Cannot {what} {class_name(module)}: it is a TorchScript module, whose "
            "layers are compiled code, not nn.Linear / convolution modules to replace. Convert "
            "the nn.Module before torch.jit.script / torch.jit.trace."
        )
    inputs = [  # the inputs forward requires: no default, not *args
        p.name
        for p in forward_inputs(module) or []
        if p.kind != p.VAR_POSITIONAL and p.default is p.empty
    ]
    if len(inputs) > 1:
        raise TypeError(
            f"Cannot {what} {class_name(module)}: its forward takes {len(inputs)} inputs "
            f"({', '.join(inputs)}), and pyrouq runs a network on one input tensor x (fit() "
            "and predict() pass the loader's x). Wrap it in a module whose forward(x) takes "
            "one tensor: compute the other inputs from x (a padding mask: x == pad_id), "
            "concatenate them into x and split it, or hold a fixed one as a buffer; or give "
            "the other inputs defaults (fit() and predict() never pass them)."
        )
    try:
        keywords = [
            p.name
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind == p.KEYWORD_ONLY and p.default is p.empty
        ]
    except (TypeError, ValueError):
        keywords = []
    if keywords:
        raise TypeError(
            f"Cannot {what} {class_name(module)}: its forward requires the keyword "
            f"argument(s) {', '.join(keywords)}, and pyrouq runs a network on one input tensor "
            "x alone. Give them defaults, or wrap the network in a module whose forward(x) "
            "passes them."
        )
    lazy = [name for name, p in module.named_parameters() if is_lazy(p)]
    if lazy:  # nothing about them (shape, prior, member factors) is known yet
        raise ValueError(
            f"Cannot {what} {class_name(module)}: its lazy modules have not created their "
            f"parameters yet ({_names_list(lazy)}). Run one batch through the network first "
            "(net(x)), then convert it."
        )
    warn_unregistered(module)  # (self.layers = [nn.Linear(...)]: never latent, trained, saved)


def weight_readers() -> tuple[type, ...]:
    """Module types whose forward reads their layers' weights and biases as tensors instead of
    calling the layers: ``nn.MultiheadAttention`` and torchvision's Swin attention (v1, v2).
    Their layers stay plain (a network holding torchvision's is built after that module was
    imported, so it is looked up only then)."""
    readers: list[type] = [nn.MultiheadAttention]
    swin = sys.modules.get("torchvision.models.swin_transformer")
    if swin is not None:
        readers.append(swin.ShiftedWindowAttention)  # ShiftedWindowAttentionV2 subclasses it
    return tuple(readers)


def computes_its_own_way(layer: nn.Module) -> bool:
    """Whether ``layer``, a Linear or convolution, is of a subclass that overrides torch's
    computation (``forward`` or ``_conv_forward``: a weight-standardised convolution, a
    scaled linear layer), which a layer built from its weights alone would drop."""
    if getattr(layer, "_is_batchensemble", False):
        return False  # pyrouq's own layer
    # the classes it is made of, less the one torch.nn.utils.parametrize generates
    made_of = [t for t in type(layer).__mro__ if t.__module__ != parametrize.__name__]
    base = next((t for t in made_of if t.__module__.startswith("torch.nn.")), None)
    if base is None or base is made_of[0]:  # torch's own layer (parametrized or not)
        return False
    return any(
        getattr(type(layer), attr, None) is not getattr(base, attr, None)
        for attr in ("forward", "_conv_forward")
    )
