"""The skeleton :func:`pyrouq.load` rebuilds a file from, when the skeleton or the file holds a
wrapper (``torch.compile``'s, ``DistributedDataParallel``, ``DataParallel``): save() writes the
module inside them, which loads into a plain skeleton, but a file of an earlier pyrouq may hold
the wrapper itself (its parameters named ``'_orig_mod.'``... or ``'module.'``...)."""

from __future__ import annotations

from typing import Any

from torch import nn

from pyrouq._util import class_name
from pyrouq._wrappers import _PARALLEL, uncompiled, unwrapped
from pyrouq.checkpoint._checks import COMPILED_CLASS
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.checkpoint._skeleton import saved_modules

_PARALLEL_CLASSES = {f"{c.__module__}.{c.__qualname__}": c for c in _PARALLEL}
"""The parallel wrappers by the class name a record gives them."""


def _saved_records(description: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The file's model record (``description["model"]``) and the record of the module it
    holds (its ``"module"``), each empty where the description has none."""
    found = description.get("model") if isinstance(description, dict) else None
    saved: dict[str, Any] = found if isinstance(found, dict) else {}
    record = saved.get("module")
    return saved, record if isinstance(record, dict) else {}


def holds_wrapper(description: Any) -> bool:
    """Whether the file ``description`` describes holds the wrapper itself (torch.compile's,
    ``DistributedDataParallel``, ``DataParallel``: written by an earlier pyrouq), whose
    parameter names only a model wrapped as it was saved takes."""
    held = _saved_records(description)[1].get("class")
    return held == COMPILED_CLASS or held in _PARALLEL_CLASSES


def skeleton_for(description: dict[str, Any], module: Any, path: Any) -> Any:
    """The skeleton to rebuild from: the module inside the wrappers of ``module`` (save()
    writes a wrapped module as the module it wraps), but the wrapped one for a file holding
    the wrapper (written before save() unwrapped it, or a network compiled before it was
    converted), refused when plain, saying what to pass."""
    saved, record = _saved_records(description)
    held = record.get("class")
    if held in _PARALLEL_CLASSES:
        return _parallel_skeleton(_PARALLEL_CLASSES[held].__name__, record, module, path)
    if held != COMPILED_CLASS:
        return unwrapped(module)
    if _plain(module, record):
        inner = saved_modules(record).get("_orig_mod", "module")
        but, net = _missing(module, "compiled", inner)
        if saved.get("class") != "Module":  # bayesian(torch.compile(net)): its network's wrapper
            raise CheckpointError(
                f"{str(path)!r} holds a {saved.get('class')} made from a {inner} compiled by "
                f"torch.compile (converted with its wrapper, OptimizedModule, parameters named "
                f"'_orig_mod.'...), {but}. Pass load(path, module=torch.compile(net)){net}. To "
                "save a model that loads into a plain skeleton, convert before compiling: "
                "torch.compile(bayesian(net)), not bayesian(torch.compile(net)).",
                held_wrapper="torch.compile",
            )
        raise CheckpointError(
            f"{str(path)!r} holds a {inner} compiled by torch.compile, saved with its wrapper "
            f"(OptimizedModule, parameters named '_orig_mod.'...) by an earlier pyrouq, {but}. "
            f"Pass load(path, module=torch.compile(net)){net}; save the loaded model again to "
            "get a file that loads into a plain skeleton (save() now writes the module "
            "torch.compile wrapped).",
            held_wrapper="torch.compile",
        )
    return module


def _plain(module: Any, record: dict[str, Any]) -> bool:
    """Whether ``module`` (load()'s ``module=``) is no skeleton for a file holding a wrapper:
    a module in none, or none given where the record names no pyrouq model to rebuild (a
    builder or other object given is left to the description's own refusal)."""
    if module is None:
        return record.get("pyrouq") is None
    return isinstance(module, nn.Module) and unwrapped(module) is module


def _missing(module: Any, wrapped: str, inner: Any) -> tuple[str, str]:
    """What load() got instead of a skeleton in a wrapper, and what ``net`` is to be where no
    skeleton came (else nothing more to say)."""
    if module is not None:
        return f"but the skeleton ({class_name(module)}) is not {wrapped}", ""
    net = f", with net a freshly built {inner} of the same structure (e.g. from the same factory)"
    return "and load() got no skeleton (module=): pyrouq never unpickles code", net


def _parallel_skeleton(wrapper: str, record: dict[str, Any], module: Any, path: Any) -> Any:
    """The skeleton for a file holding a ``DistributedDataParallel`` or ``DataParallel``
    wrapper, saved by a pyrouq before save() unwrapped them: ``module`` when it is such a
    wrapper too (the same ``'module.'`` names; DDP's and DataParallel's records differ in
    their class), else refused, saying what to pass."""
    if not _plain(module, record):
        return module  # (a wrapper; or a builder: the description's own refusal says what to pass)
    wrap, where = _how_to_wrap(wrapper)
    but, net = _missing(module, "wrapped", saved_modules(record).get("module", "module"))
    raise CheckpointError(
        f"{str(path)!r} {_held(wrapper, record)}, {but}. Pass load(path, module={wrap}){where}"
        f"{net}; save the loaded model again to get a file that loads into a plain skeleton "
        f"(save() now writes the module {wrapper} wraps).",
        held_wrapper=_QUALIFIED[wrapper],
    )


def check_resumed_wrapper(description: Any, model: Any, path: str) -> Any:
    """Refuse ``fit(model, resume_from=path)`` of a file holding a ``DataParallel``,
    ``DistributedDataParallel`` or ``torch.compile`` wrapper of a network (an earlier
    pyrouq's, ``'module.'`` or ``'_orig_mod.'`` names) when ``model`` (as given to fit()) is
    not in that wrapper, saying what to pass; the structure comparison would otherwise say to
    rebuild the model, which the saved arguments do not mend. Where the file holds a
    parallel wrapper, the wrapper the run loads into (``model``, or the one inside its
    torch.compile wrapper: the same parameters), else None."""
    saved, record = _saved_records(description)
    held = record.get("class")
    if not isinstance(model, nn.Module):
        return None
    if held == COMPILED_CLASS and saved.get("class") == "Module" and unwrapped(model) is model:
        inner = saved_modules(record).get("_orig_mod", "module")
        raise CheckpointError(
            f"resume_from={path!r} holds a {inner} compiled by torch.compile, saved with its "
            "wrapper (OptimizedModule, parameters named '_orig_mod.'...) by an earlier pyrouq, "
            f"but the model ({class_name(model)}) is not compiled. Resume with "
            "fit(torch.compile(net), resume_from=...) (backend='eager' where no compiler "
            "runs); the checkpoints it writes then hold the module torch.compile wraps, "
            "which a plain model resumes from."
        )
    if held not in _PARALLEL_CLASSES:
        return None
    kind = _PARALLEL_CLASSES[held]
    wrapper = kind.__name__
    wrap, where = _how_to_wrap(wrapper)
    bare = uncompiled(model)  # (torch.compile(DDP(net)): fit() compiles net again, in it)
    if isinstance(bare, kind):
        if uncompiled(bare.module) is bare.module:
            return bare
        raise CheckpointError(
            f"resume_from={path!r} {_held(wrapper, record)}, but the model is a {wrapper} of a "
            "network compiled by torch.compile (parameters named 'module._orig_mod.'...). "
            f"Resume with fit({wrap}, resume_from=...){where}, net not compiled inside it "
            f"(torch.compile({wrap}) will do)."
        )
    raise CheckpointError(
        f"resume_from={path!r} {_held(wrapper, record)}, but the model "
        f"({class_name(model)}) is not in {wrapper}. Resume with fit({wrap}, "
        f"resume_from=...){where}; the checkpoints it writes then hold the module {wrapper} "
        "wraps, which a plain model resumes from."
    )


def _held(wrapper: str, record: dict[str, Any]) -> str:
    inner = saved_modules(record).get("module", "module")
    return (
        f"holds a {inner} in {wrapper}, saved with its wrapper (parameters named 'module.'...) "
        "by an earlier pyrouq"
    )


_QUALIFIED = {
    "DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "DataParallel": "torch.nn.DataParallel",
}
"""The parallel wrappers by their class name, as a call names them."""


def wrapper_where(held_wrapper: str) -> str:
    """Where the skeleton must be wrapped in ``held_wrapper`` (a
    :class:`CheckpointError`'s, e.g. ``"torch.nn.DataParallel"``), after the call that wraps
    it: DDP's process group, else nothing."""
    if held_wrapper == _QUALIFIED["DistributedDataParallel"]:
        return " in a process group (one of one process will do)"
    return ""


def _how_to_wrap(wrapper: str) -> tuple[str, str]:
    """The call that wraps ``net`` in ``wrapper``, and where it must run."""
    return f"{_QUALIFIED[wrapper]}(net)", wrapper_where(_QUALIFIED[wrapper])
