"""The skeleton of a converted or plain network that ``load(path, module=net)`` rebuilds it
from, checked against the saved record: the same parameters, buffers, ties, submodules and
layer settings, and a network at all (not the function or class that builds one)."""

from __future__ import annotations

from typing import Any, NoReturn

from torch import nn

from pyrouq._engine import MaxPool2dChannelsLast, MaxPool2x2, SwappingSequential
from pyrouq._util import class_name
from pyrouq.checkpoint._describe import _given
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork, module_record

__all__ = ["check_holds_values", "check_structure", "checked_skeleton"]


def checked_skeleton(record: dict[str, Any], module: Any, path: Any) -> nn.Module:
    """``module``, the skeleton given to rebuild the network ``record`` describes, checked
    against it (a clear :class:`CheckpointError` where it does not match)."""
    if not isinstance(module, nn.Module):
        raise CheckpointError(_not_a_network(module, record))
    got = None
    if isinstance(module, (BayesianNetwork, BatchEnsembleNetwork)):
        got = f"a {class_name(module)}, a pyrouq model,"
    elif _converted_network(module, record):
        got = (
            f"the network inside a converted pyrouq model (its .net, a {class_name(module)} "
            "that the conversion rewrote),"
        )
    if got is not None:
        raise CheckpointError(
            f"module= got {got} but it takes the plain network the saved model was made from "
            f"({record.get('class', '?')}): load(path, module=make_net()), with make_net what "
            "built the network before bayesian(), batchensemble() or rank1() converted it."
        )
    check_holds_values(module)
    check_structure(record, module_record(module), path)
    return module


def check_holds_values(module: nn.Module) -> None:
    """A clear :class:`CheckpointError` where the skeleton ``module`` (a plain network, or a
    BatchEnsemble given for a saved one) holds tensors that cannot take the saved values:
    lazy modules' uninitialised parameters, tensors on the meta device."""
    lazy = [name for name, t in (*module.named_parameters(), *module.named_buffers())
            if nn.parameter.is_lazy(t)]  # fmt: skip
    if lazy:
        fault = (
            f"The skeleton ({class_name(module)}) has lazy modules that have not created "
            f"their parameters yet ({', '.join(repr(n) for n in lazy[:3])}"
            f"{', ...' if len(lazy) > 3 else ''})"
        )
        raise CheckpointError(
            f"{fault}: run one batch through it first (net(x)), then load(path, module=net).",
            skeleton_mismatch=f"{fault}.",
        )
    meta = [name for name, t in (*module.named_parameters(), *module.named_buffers())
            if t.is_meta]  # fmt: skip
    if meta:
        fault = (
            f"The skeleton ({class_name(module)}) has tensors on the meta device "
            f"({', '.join(repr(n) for n in meta[:3])}{', ...' if len(meta) > 3 else ''}), "
            "which hold no values and cannot take the saved ones."
        )
        raise CheckpointError(
            f"{fault} Build it on the CPU (outside `with torch.device('meta')`, or after "
            "torch.set_default_device('cpu')), then load(path, module=net).",
            skeleton_mismatch=fault,
        )


def check_structure(record: dict[str, Any], here: dict[str, Any], path: Any) -> None:
    """A clear :class:`CheckpointError` where ``here``, the structure record of a skeleton (of
    the network a BatchEnsemble skeleton was made from, its ``module_record``), differs from
    the saved ``record``: parameters, buffers, ties, submodules and layer settings."""
    for kind in ("parameters", "buffers"):
        saved, got = record.get(kind, {}), here[kind]
        name = _first_difference(saved, got)
        if name is not None:

            def shape(v: Any, ties: dict[str, str], name: str = name) -> str:
                if v is None:  # (a tied parameter is listed under its first name only)
                    return f"tied to {ties[name]!r}" if name in ties else "absent"
                return f"shape {tuple(v)}"

            _mismatch(
                f"The skeleton ({here['class']}) does not match {str(path)!r}, which holds "
                f"a {record.get('class', '?')}: {kind[:-1]} {name!r} is "
                f"{shape(saved.get(name), record.get('tied', {}))} in the checkpoint and "
                f"{shape(got.get(name), here.get('tied', {}))} in the skeleton."
            )
    saved_ties = record.get("tied")  # absent without ties (and before 2026-12-05): unchecked
    if saved_ties is not None and (
        (name := _first_difference(saved_ties, here.get("tied", {}))) is not None
    ):
        saved_tie, got_tie = (
            "its own tensor" if ties.get(name) is None else f"tied to {ties[name]!r}"
            for ties in (saved_ties, here.get("tied", {}))
        )
        _mismatch(
            f"The skeleton ({here['class']}) does not match {str(path)!r}: parameter "
            f"{name!r} is {saved_tie} in the checkpoint and {got_tie} in the skeleton (tied "
            "weights: one tensor under several names)."
        )
    saved_modules = record.get("modules")  # absent from checkpoints written before 2026-12-03
    if (
        saved_modules is not None
        and (name := _first_difference(saved_modules, here["modules"])) is not None
    ):
        saved_kind, got_kind = (
            "absent" if kind is None else f"a {kind}"
            for kind in (saved_modules.get(name), here["modules"].get(name))
        )
        _mismatch(
            f"The skeleton ({here['class']}) does not match {str(path)!r}: {_where(name)} is "
            f"{saved_kind} in the checkpoint and {got_kind} in the skeleton (layers without "
            "parameters, such as activations, count too)."
        )
    saved_settings = record.get("settings")  # absent from checkpoints written before 2026-12-04
    if (
        saved_settings is not None
        and (name := _first_difference(saved_settings, here["settings"])) is not None
    ):
        theirs, mine = saved_settings.get(name, {}), here["settings"].get(name, {})
        differ = [k for k in {**theirs, **mine} if theirs.get(k) != mine.get(k)]
        saved_values, got_values = (
            ", ".join(f"{k}={values.get(k, 'unset')!r}" for k in differ)
            for values in (theirs, mine)
        )
        _mismatch(
            f"The skeleton ({here['class']}) does not match {str(path)!r}: {_where(name)} "
            f"({here['modules'].get(name, '?')}) has {saved_values} in the checkpoint and "
            f"{got_values} in the skeleton, and may compute another function with the saved "
            "weights."
        )


def _mismatch(fault: str) -> NoReturn:
    """Refuse a skeleton whose structure differs from the file's: ``fault`` says where."""
    raise CheckpointError(
        f"{fault} Build the module exactly as the saved one was built.", skeleton_mismatch=fault
    )


def _not_a_network(module: Any, record: dict[str, Any]) -> str:
    """Why ``module`` cannot be a skeleton, and what to pass: the network a builder (a class,
    a factory such as ``torchvision.models.resnet18``) builds, not the builder."""
    saved = record.get("class", "?")
    own = record.get("pyrouq")  # pyrouq's MLP / LeNet: rebuilt without a skeleton
    if isinstance(own, dict) and own.get("class"):
        saved += f", which load() rebuilds when module= is left out (pyrouq's {own['class']})"
    builds = isinstance(module, type) and issubclass(module, nn.Module)
    if builds or (callable(module) and not isinstance(module, type)):
        what = _given(module)  # the class / the function, "a function", "a callable Builder"
        name = getattr(getattr(module, "func", module), "__name__", "")
        callable_instance = what.startswith("a callable ")  # (what it returns is unknown)
        if not what.startswith("the "):  # a lambda's name is "<lambda>"; an instance has none
            name = "make_net"
        return (
            f"Expected module= to be an nn.Module instance (the skeleton), got {what}, "
            f"{'' if callable_instance else 'which builds one, '}not the network itself. "
            f"Pass the network built as for training: load(path, module={name}()), with "
            "the arguments that built the saved one (e.g. num_classes=...); the checkpoint "
            f"holds a {saved}."
        )
    return (
        f"Expected module= to be an nn.Module instance (the skeleton), got "
        f"{class_name(module)}. Pass a freshly built network of the saved structure (a "
        f"{saved}), e.g. load(path, module=make_net()) with make_net what built it for "
        "training."
    )


_REWRITTEN = {cls.__name__ for cls in (SwappingSequential, MaxPool2x2, MaxPool2dChannelsLast)}
"""The classes a conversion gives a network's Sequentials and max-poolings (the engine's faster
CPU paths), which no network a user builds has."""


def _converted_network(module: nn.Module, record: dict[str, Any]) -> bool:
    """Whether ``module`` is the network inside a converted model (``model.net``, its layers
    rewritten by the conversion) where the saved network was a plain one (a network saved as
    it sat inside a model, rewritten, takes such a skeleton): it holds the engine's rewritten
    classes or BatchEnsemble layers that the saved network has not, or holds as buffers of
    the same shapes the saved network's parameters (a Bayesian model's latent sites), as a
    network of the user's own class without a Sequential or a pooling does."""
    classes = set(saved_modules(record).values())
    for m in module.modules():
        name = type(m).__name__
        ensemble = getattr(type(m), "_is_batchensemble", False)
        if (name in _REWRITTEN or ensemble) and name not in classes:
            return True
    parameters = record.get("parameters") or {}
    own = dict(module.named_parameters())
    buffers = {name: list(b.shape) for name, b in module.named_buffers()}
    sites = [n for n, shape in parameters.items() if n not in own and buffers.get(n) == shape]
    return bool(sites)


def saved_modules(record: dict[str, Any]) -> dict[str, Any]:
    """The class name of each module a saved structure record names (its ``"modules"``), empty
    where it names none or holds no mapping (a hand-edited file)."""
    saved = record.get("modules")
    return saved if isinstance(saved, dict) else {}


def _first_difference(saved: dict[str, Any], got: dict[str, Any]) -> str | None:
    """The first name, in the saved record's order and then the skeleton's, whose entry
    differs between the two (one absent counts); None where they agree."""
    names = [*saved, *(name for name in got if name not in saved)]
    return next((name for name in names if saved.get(name) != got.get(name)), None)


def _where(name: str) -> str:
    return f"module {name!r}" if name else "the network itself"
