"""How a checkpoint describes a model and guide (JSON), and rebuilds them from it: the
pyrouq classes by name and configuration, converted networks from a skeleton module."""

from __future__ import annotations

import copy
import functools
import inspect
import warnings
from typing import Any

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import nn

from pyrouq import models
from pyrouq._util import class_name, module_device, warn_caller
from pyrouq._words import article
from pyrouq._wrappers import unwrapped
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork, SitePrior, module_record
from pyrouq.convert._conversion_warnings import (
    _BilinearSharedWarning,
    _ParametrizationDroppedWarning,
    _TiedBiasKeptWarning,
)
from pyrouq.likelihoods import _LIKELIHOODS

__all__ = [
    "CheckpointError",
    "build_guide",
    "build_model",
    "describe_guide",
    "describe_model",
    "expected_class_name",
    "register_guide",
]

# Constructor arguments rebuilt from the description, per class (the rest of the state is in the
# state_dict). BatchEnsemble models also record num_members.
_PLAIN_ARGS = {
    "MLP": ("in_features", "hidden_features", "out_features", "num_hidden"),
    "LeNet": ("in_channels", "num_classes"),
}


# Converted networks, rebuilt from a skeleton module
_CONVERTED = ("BayesianNetwork", "BatchEnsembleNetwork", "Module")

# The BatchEnsemble front doors' factor options, in their configuration since 2026-12-05. A
# file written before records none and was rebuilt with these, the defaults then (they set only
# the initial values, which the saved ones replace).
ENSEMBLE_DOORS = ("BatchEnsembleMLP", "BatchEnsembleLeNet")
FACTORS_BEFORE = {"use_base_weights": True, "init": "normal", "r_mean": 1.0, "r_std": 0.5,
                  "s_mean": 1.0, "s_std": 0.5}  # fmt: skip


_GUIDES: dict[str, type] = {}


def register_guide(cls: type) -> type:
    """Let checkpoints store guides of class ``cls`` (a decorator): ``guide.checkpoint_config()``
    is saved as JSON and ``cls(model, **config)`` rebuilds the guide. This keeps
    :mod:`pyrouq.checkpoint` free of imports from :mod:`pyrouq.infer`."""
    _GUIDES[cls.__name__] = cls
    return cls


def _same_class(registered: type | None, cls: type) -> bool:
    """Whether ``cls`` is the guide class registered under its name, or that class as it was
    before its module was reloaded (``importlib.reload(pyrouq.infer.guide)`` in a notebook
    registers the new class; a guide built before it is of the old one)."""
    if registered is None or registered is cls:
        return registered is not None
    return (cls.__module__, cls.__qualname__) == (registered.__module__, registered.__qualname__)


def guide_of_class(guide: Any, registered: type) -> bool:
    """Whether ``guide`` is of the ``registered`` guide class or a subclass of it, the class as
    it was before its module was reloaded included (:func:`_same_class`)."""
    return any(_same_class(registered, cls) for cls in type(guide).__mro__)


def _front_doors() -> dict[str, type]:
    return {
        cls.__name__: cls
        for cls in (
            models.MLP,
            models.LeNet,
            models.BayesianMLP,
            models.BayesianLeNet,
            models.BatchEnsembleMLP,
            models.BatchEnsembleLeNet,
        )
    }


def _module_description(model: nn.Module, record: dict[str, Any], original: type) -> dict:
    """The structure record of a converted network, plus how to build the skeleton itself
    when the original module is pyrouq's ``MLP`` or ``LeNet``."""
    record = dict(record)
    if original.__name__ in _PLAIN_ARGS and _front_doors().get(original.__name__) is original:
        net = model.net if hasattr(model, "net") else model
        record["pyrouq"] = {
            "class": original.__name__,
            "config": {arg: getattr(net, arg) for arg in _PLAIN_ARGS[original.__name__]},
        }
    return record


def _describe_priors(model: Any) -> dict[str, Any]:
    priors = {}
    for site in model.network_sites():
        prior = model.prior_of(site)
        if prior.opaque is not None:
            raise CheckpointError(
                f"save() cannot describe the prior of site {site!r} ({prior.opaque}): pyrouq "
                "stores a prior as a pyro.distributions family and its tensor parameters, and "
                "this one cannot be rebuilt from them. Use such a prior (Normal, Laplace, "
                "StudentT, Cauchy, ...) to save the model."
            )
        params = {k: list(getattr(prior, k).shape) for k in prior._names}
        priors[site] = {"family": prior.family, "params": params}
    return priors


def _describe_likelihood(model: Any) -> dict[str, Any]:
    """The description of ``model.likelihood``, refused where :func:`get_likelihood` would not
    rebuild it as it is: a class of one's own (a subclass too, which would come back as its
    base class) or a noise prior that is no family with tensor parameters."""
    likelihood = model.likelihood
    known = _LIKELIHOODS.get(getattr(likelihood, "name", None))  # type: ignore[arg-type]
    if type(likelihood) is not known:
        parent = next((c for c in _LIKELIHOODS.values() if isinstance(likelihood, c)), None)
        base = f", a subclass of {parent.__name__}" if parent is not None else ""
        own = ", ".join(cls.__name__ for cls in _LIKELIHOODS.values())
        raise CheckpointError(
            f"save() cannot describe the likelihood {class_name(likelihood)}{base}: a "
            f"checkpoint rebuilds only pyrouq's own likelihoods ({own}), by name, so it could "
            "not give this one back. Save the model with one of them, or save "
            "model.state_dict() with torch.save and rebuild the model yourself."
        )
    prior = getattr(likelihood, "noise_prior", None)
    if prior is not None and prior.opaque is not None:
        raise CheckpointError(
            f"save() cannot describe the noise prior of the Gaussian likelihood "
            f"({prior.opaque}): pyrouq stores a prior as a pyro.distributions family and its "
            "tensor parameters, and this one cannot be rebuilt from them. Use such a prior "
            "(HalfNormal, LogNormal, Gamma, HalfCauchy, ...) to save the model."
        )
    return likelihood.describe()  # type: ignore[no-any-return]


def describe_model(model: nn.Module, *, unwrap: bool = True) -> dict[str, Any]:
    """The JSON description that rebuilds ``model`` (``torch.compile``'s module, ``unwrap``):
    ``{"class", "config", "num_data"}``, plus ``"module"`` (the structure of the original
    network) for converted networks, and ``"default_kl_weight"`` where the model (or its
    likelihood) sets fit()'s own (a finite float >= 0). A state that load() would not read back
    (an object of a module's extra state) is refused."""
    from pyrouq.checkpoint._checks import own_kl_weight  # (it imports this module)
    from pyrouq.checkpoint._file import check_read_back

    model = unwrapped(model) if unwrap else model
    name = type(model).__name__
    doors = _front_doors()
    out: dict[str, Any]
    if doors.get(name) is type(model):
        if name in _PLAIN_ARGS:
            config = {arg: getattr(model, arg) for arg in _PLAIN_ARGS[name]}
        else:
            config = dict(model.config)  # type: ignore[arg-type]
            if getattr(model, "num_members", None) is not None:
                config["num_members"] = int(model.num_members)  # type: ignore[arg-type]
        out = {"class": name, "config": config}
    elif type(model) is BayesianNetwork:
        config = {
            "sites": list(model.network_sites()),
            "priors": _describe_priors(model),
            "likelihood": _describe_likelihood(model),
            "local_reparameterization": model.local_reparameterization,
        }
        if model.num_members is not None:  # rank-1: made from a BatchEnsemble
            options = model.ensemble_options or {}
            config["ensemble"] = {"num_members": model.num_members, **options}
        module = _module_description(model, model.module_record, type(model.net))
        out = {"class": name, "config": config, "module": module}
    elif type(model) is BatchEnsembleNetwork:
        config = {
            "num_members": model.num_members,
            **model.options,
            "likelihood": _describe_likelihood(model),
        }
        module = _module_description(model, model.module_record, type(model.net))
        out = {"class": name, "config": config, "module": module}
    elif isinstance(model, nn.Module) and not isinstance(model, PyroModule):
        out = {"class": "Module", "config": {}, "module": module_record(model)}
    else:
        raise CheckpointError(
            f"save() cannot describe a {name}: expected a model made by pyrouq.bayesian() or "
            f"pyrouq.batchensemble(), one of {sorted(doors)}, or a plain nn.Module. For a "
            "Pyro model of your own, keep torch.save(model.state_dict()) and the guide's "
            "parameters (pyro.get_param_store().save(path), which holds an autoguide's and "
            "every pyro.param), and rebuild the model and guide yourself."
        )
    check_read_back(model)
    out["num_data"] = getattr(model, "num_data", None)
    given = getattr(model, "given_num_data", None)  # the N it was built with, fit()'s default
    if given is not None:
        out["given_num_data"] = int(given)
    own = own_kl_weight(model)  # fit()'s kl_weight when none is given
    if own is not None:
        out["default_kl_weight"] = own
    return out


def describe_guide(guide: Any) -> dict[str, Any] | None:
    """The JSON description of a guide (a :class:`~pyrouq.MeanFieldGuide`)."""
    if guide is None:
        return None
    if not _same_class(_GUIDES.get(type(guide).__name__), type(guide)):
        raise CheckpointError(
            f"save() can store a MeanFieldGuide, got {type(guide).__name__}. Build the guide "
            "with mean_field_guide(model), or save its state yourself (pyro.get_param_store())."
        )
    config: dict[str, Any] = getattr(guide, "checkpoint_config")()  # noqa: B009
    return {"class": type(guide).__name__, **config}


def upgrade_v1_state(model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """A version-1 state dict in today's layout: the front doors' priors come from their
    configuration, and BatchEnsemble layers sit under ``net``."""
    if isinstance(model, BayesianNetwork):
        kept = {k: v for k, v in state.items() if not k.endswith((".prior_loc", ".prior_scale"))}
        return {**model.state_dict(), **kept}
    if isinstance(model, BatchEnsembleNetwork):
        return {f"net.{k}": v for k, v in state.items()}
    return state


def own_way_note(net: nn.Module, names: Any) -> str:
    """Why an old ensemble file may not fit ``net``: those of its layers ``names`` whose class
    computes its own way (:func:`~pyrouq.convert._select.computes_its_own_way`), which pyrouq
    converted before 2026-12-04 and keeps plain since; ``""`` if there are none."""
    from pyrouq.convert._select import computes_its_own_way

    own = []
    for name in sorted(set(names)):
        try:
            if computes_its_own_way(net.get_submodule(name)):
                own.append(name)
        except AttributeError:
            continue
    if not own:
        return ""
    return (
        f"Its layers {own[:3]} are of subclasses with a forward of their own, which pyrouq "
        "before 2026-12-04 turned into BatchEnsemble layers (dropping that forward) and "
        "today's keeps as they are: if the file is that old, its model cannot be rebuilt; "
        "convert and train the network again."
    )


def _layer_names(module: nn.Module) -> list[str]:
    """The names of the Linear and convolution layers of ``module`` (``""``: itself)."""
    kinds = (nn.Linear, nn.modules.conv._ConvNd)
    return [name for name, layer in module.named_modules() if isinstance(layer, kinds)]


def upgrade_v2_state(model: nn.Module, state: Any) -> Any:
    """A version-2 state dict with a Bayesian network's latent-site start values, which that
    version did not save, taken from the rebuilt ``model`` (the skeleton's, as then), in the
    dtype the network was saved in."""
    if not isinstance(model, BayesianNetwork) or not isinstance(state, dict):
        return state
    current = model.state_dict()
    # the dtype the network was saved in: its saved tensors' (the sites left point estimates,
    # its buffers), else each site's prior's (version-2 priors were float32 before 2026-12-02
    # whatever the network; a float32 noise prior may sit beside a float64 network)
    network = {
        v.dtype
        for k, v in state.items()
        if k.startswith("net.") and torch.is_tensor(v) and v.is_floating_point()
    }
    filled = {}
    for index, site in enumerate(model.network_sites()):
        key = f"net.{site}"
        if key in state or key not in current:
            continue
        value = current[key]
        prior = [
            v.dtype
            for k, v in state.items()
            if k.startswith(f"site_priors.{index}.")
            and torch.is_tensor(v)
            and v.is_floating_point()
        ]
        dtype = next(iter(network)) if len(network) == 1 else (prior[0] if prior else None)
        filled[key] = value.to(dtype) if dtype is not None and value.is_floating_point() else value
    return {**filled, **state}


def upgraded_state(model: nn.Module, payload: dict[str, Any]) -> Any:
    """The model's saved state of a checkpoint ``payload`` in today's layout."""
    state = payload["model"]
    if payload.get("format_version") == 1:
        return upgrade_v1_state(model, state)
    if payload.get("format_version") == 2:
        return upgrade_v2_state(model, state)
    return state


def shared_member_norms(module: nn.Module, state: dict[str, Any]) -> list[str]:
    """The per-member norms of ``module`` (:class:`~pyrouq.nn.BatchEnsembleNorm`) that
    ``state`` holds as one layer the members shared: a per-member BatchEnsemble saved before
    that layer type got a copy per member (``nn.RMSNorm``, before 2026-12-05)."""
    paths = []
    for path, norm in module.named_modules():
        if not getattr(norm, "_is_member_norm", False):
            continue
        prefix = f"{path}." if path else ""
        own = list(norm.norms[0].state_dict())
        if own and f"{prefix}norms.0.{own[0]}" not in state:
            if all(f"{prefix}{key}" in state for key in own):
                paths.append(path)
    return paths


def share_out_member_norms(module: nn.Module, state: dict[str, Any]) -> None:
    """Give each member its copy of a norm :func:`shared_member_norms` finds saved as one
    (in place): every copy starts from the shared one, the same function."""
    for path in shared_member_norms(module, state):
        copies: Any = module.get_submodule(path).norms
        prefix = f"{path}." if path else ""
        for key in copies[0].state_dict():
            shared = state.pop(f"{prefix}{key}")
            for member in range(len(copies)):
                state[f"{prefix}norms.{member}.{key}"] = shared


def expected_class_name(expected: type | str) -> str:
    """The class name ``load(model_class=...)`` asks for (a class or its name)."""
    name = expected if isinstance(expected, str) else getattr(expected, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(
            f"Expected model_class to be a model class or its name, got {expected!r}. "
            "Pass e.g. model_class=pyrouq.BayesianLeNet, or leave it out."
        )
    return name


def build_model(
    description: dict[str, Any],
    *,
    expected: type | str | None = None,
    path: Any = None,
    module: nn.Module | None = None,
) -> nn.Module:
    """A fresh model of the described class and configuration (parameters not loaded)."""
    name = description["model"]["class"]
    doors = _front_doors()
    if expected is not None:
        expected_name = expected_class_name(expected)
        known = sorted(doors) + list(_CONVERTED)
        if expected_name != name and expected_name not in known:
            raise CheckpointError(
                f"model_class={expected_name!r} is no class a pyrouq checkpoint holds: expected "
                f"one of {known} (a network of pyrouq.bayesian() or rank1() is a "
                "BayesianNetwork, of batchensemble() a BatchEnsembleNetwork, a plain one a "
                "Module). "
                f"{str(path)!r} holds {article(name)} {name}: pass model_class={name!r}, or "
                "leave it out."
            )
        if expected_name != name:
            wanted = f"{article(expected_name)} {expected_name}"
            raise CheckpointError(
                f"{str(path)!r} holds {article(name)} {name}, expected {wanted}. Load it "
                f"without model_class, or pick the checkpoint of {wanted}."
            )
    if name not in doors and name not in _CONVERTED:
        raise CheckpointError(
            f"{str(path)!r} describes an unknown model class {name!r}; expected one of "
            f"{sorted(doors) + list(_CONVERTED)}."
        )
    config = dict(description["model"].get("config") or {})
    if name in doors and module is not None and isinstance(module, nn.Module):
        warn_caller(
            f"{str(path)!r} holds pyrouq's {name}, which it rebuilds from its description: the "
            f"module= skeleton ({class_name(module)}) is not used. Leave module= out for "
            "pyrouq's own models."
        )
    elif name in doors and module is not None:  # a builder (or anything else): not a skeleton
        warn_caller(
            f"{str(path)!r} holds pyrouq's {name}, which it rebuilds from its description: "
            f"module= ({_given(module)}) is not used. Leave module= out for pyrouq's own "
            "models; a skeleton, needed for other networks, is the network itself (an "
            "nn.Module instance, e.g. module=make_net())"
            + (", not what builds it." if callable(module) else ".")
        )
    device = module_device(module) if module is not None else None
    devices = [device] if getattr(device, "type", "") == "cuda" else []
    try:  # initial values replaced by the saved ones (torch's state kept); warned when built
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"bayesian\(\): the embedding weight")
            warnings.filterwarnings("ignore", category=_BilinearSharedWarning)
            warnings.filterwarnings("ignore", message=r"init='random_sign' sets every factor")
            warnings.filterwarnings("ignore", category=_TiedBiasKeptWarning)
            warnings.filterwarnings("ignore", category=_ParametrizationDroppedWarning)
            if name in doors:
                before = FACTORS_BEFORE if name in ENSEMBLE_DOORS else {}
                model = doors[name](**{**before, **config})
            else:
                from pyrouq.checkpoint._ensemble_skeleton import ensemble_rebuild

                record = description["model"].get("module") or {}
                model = ensemble_rebuild(name, config, record, module, path)  # a BatchEnsemble's
                if model is None:
                    skeleton = _skeleton(record, module, path, plain=name == "Module")
                    model = _rebuild_converted(name, config, skeleton)
    except (TypeError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        ensemble = name == "BatchEnsembleNetwork" or bool(config.get("ensemble"))
        note = own_way_note(module, _layer_names(module)) if ensemble and module else ""
        if note:
            raise CheckpointError(f"{str(path)!r}: cannot rebuild {name} ({err}). {note}") from None
        raise CheckpointError(
            f"{str(path)!r}: cannot rebuild {name} from its saved arguments {config} ({err})."
        ) from None
    num_data = description["model"].get("num_data")
    if num_data is not None and hasattr(model, "num_data"):
        model.num_data = int(num_data)
    given = description["model"].get("given_num_data")
    if given is not None and hasattr(model, "given_num_data"):
        model.given_num_data = int(given)
    own = description["model"].get("default_kl_weight")  # absent from older files: as rebuilt
    if own is not None:
        model.default_kl_weight = float(own)
    return model


def _given(module: Any) -> str:
    """What a ``module=`` that is not an ``nn.Module`` is, for a message: "the function
    make_net", "the class BayesianMLP", "a function" (a lambda), "a callable Builder" (an
    instance with ``__call__``), "a str", "an int"; a ``functools.partial`` by what it wraps."""
    function = module
    while isinstance(function, functools.partial):
        function = function.func
    if isinstance(function, type):
        return f"the class {function.__name__}"
    function = getattr(function, "func", function) if callable(function) else function
    if inspect.isroutine(function):
        name = getattr(function, "__name__", "")
        return f"the function {name}" if name.isidentifier() else "a function"
    kind = type(function).__name__
    return f"a callable {kind}" if callable(function) else f"{article(kind)} {kind}"


def _skeleton(
    record: dict[str, Any], module: nn.Module | None, path: Any, plain: bool = False
) -> nn.Module:
    """The skeleton to rebuild a converted (or ``plain``) network from, checked against
    ``record``."""
    if module is None:
        known = record.get("pyrouq")
        if known is not None:
            return _front_doors()[known["class"]](**known["config"])  # type: ignore[no-any-return]
        held = str(record.get("class", "?"))  # (qualified: "an app.Encoder", "a torch.nn...")
        what = "a plain network," if plain else "a network converted from"
        raise CheckpointError(
            f"{str(path)!r} holds {what} {article(held)} {held}. pyrouq "
            "never unpickles code: rebuild it from a skeleton, load(path, module=net), with "
            "net a freshly built module of the same structure (e.g. from the same factory).",
            held_class=held,
            held_plain=plain,
        )
    from pyrouq.checkpoint._skeleton import checked_skeleton  # (it imports _given from here)

    return checked_skeleton(record, module, path)


def _ensemble_options(config: dict[str, Any]) -> dict[str, Any]:
    """A saved BatchEnsemble's constructor options; checkpoints written before the ``norms``
    option existed hold members that shared the normalisation layers."""
    return {"norms": "shared", **{k: v for k, v in config.items() if k != "num_members"}}


def _drawn(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with factor means and stds a layer of any dtype holds: the factors drawn are
    replaced by the saved ones, and a float16 model saved with a large ``r_std`` (which the
    layers' construction-time check refuses) still loads; the saved options are set back."""
    return {**options, **dict.fromkeys(("r_mean", "s_mean"), 1.0), "r_std": 0.0, "s_std": 0.0}


def saved_config(model: dict[str, Any]) -> Any:
    """The configuration of a saved model description (``description["model"]``) as today's
    :func:`describe_model` writes it: a BatchEnsemble's ``norms``, absent from files older than
    that option, is "shared", as those versions built the members."""
    config = model.get("config")
    if not isinstance(config, dict):
        return config
    if model.get("class") == "BatchEnsembleNetwork" and "norms" not in config:
        return {**config, "norms": "shared"}
    ensemble = config.get("ensemble")
    if isinstance(ensemble, dict) and "norms" not in ensemble:  # rank-1
        return {**config, "ensemble": {**ensemble, "norms": "shared"}}
    return config


def _rebuild_converted(name: str, config: dict[str, Any], skeleton: nn.Module) -> nn.Module:
    if name == "Module":
        return copy.deepcopy(skeleton)
    if name == "BatchEnsembleNetwork":
        options = _ensemble_options(config)
        built = BatchEnsembleNetwork(skeleton, int(config["num_members"]), **_drawn(options))
        built.options.update({k: options[k] for k in built.options if k in options})
        return built
    source: nn.Module = skeleton
    ensemble = config.get("ensemble")
    if ensemble is not None:  # rank-1: the BatchEnsemble first, then its latent factors
        source = BatchEnsembleNetwork(
            skeleton,
            int(ensemble["num_members"]),
            likelihood=config["likelihood"],
            **_drawn(_ensemble_options(ensemble)),
        )
        saved = _ensemble_options(ensemble)
        source.options.update({k: saved[k] for k in source.options if k in saved})
    return rebuild_latent(source, config)


def rebuild_latent(source: nn.Module, config: dict[str, Any]) -> BayesianNetwork:
    """The BayesianNetwork a saved ``config`` describes, made from ``source`` (the skeleton,
    or the BatchEnsemble of a rank-1 network), its priors of the saved families and shapes."""
    model = BayesianNetwork(
        source,
        prior=dist.Normal(0.0, 1.0),  # a placeholder: the saved priors replace it below
        select=list(config["sites"]),
        likelihood=config["likelihood"],
        local_reparameterization=bool(config.get("local_reparameterization", False)),
    )
    # the saved order of the sites, which the priors, the guide and the saved tensors follow
    # (a skeleton may define its layers in another order: named_parameters() follows it)
    model._sites = {site: model._sites[site] for site in config["sites"]}
    sites = model.network_sites()
    device = module_device(model)  # the skeleton's (a GPU's): the priors live with the network
    model.site_priors = nn.ModuleList(
        SitePrior(
            spec["family"],
            {k: torch.zeros(shape, device=device) for k, shape in spec["params"].items()},
            sites[site],
        )
        for site, spec in config["priors"].items()
    )
    return model


def build_guide(description: dict[str, Any], model: nn.Module, *, path: Any = None) -> nn.Module:
    """A fresh guide of the described class for ``model`` (parameters not loaded)."""
    spec = dict(description["guide"])
    name = spec.pop("class", None)
    cls = _GUIDES.get(name)
    if cls is None:
        raise CheckpointError(
            f"{str(path)!r} describes an unknown guide class {name!r}; expected one of "
            f"{sorted(_GUIDES)}."
        )
    with warnings.catch_warnings():  # its start is replaced by the saved state: not news
        warnings.filterwarnings("ignore", message=r"mean_field_guide\(\): sites with a prior")
        build = getattr(cls, "_built_for_load", cls)  # (a MeanFieldGuide: its start left out)
        return build(model, **spec)  # type: ignore[no-any-return]
