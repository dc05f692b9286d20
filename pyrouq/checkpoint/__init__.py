"""Checkpoints that never run code: tensors plus a JSON description of how to rebuild.

A checkpoint is one file written by :func:`torch.save` holding only tensors, numbers, strings,
lists and dicts:

* ``"format"`` / ``"format_version"``: ``"pyrouq.checkpoint"`` and :data:`FORMAT_VERSION`;
* ``"description"``: a JSON string naming the model class and its constructor arguments (for a
  network converted by :func:`pyrouq.bayesian` / :func:`pyrouq.batchensemble`: its latent sites,
  prior families, likelihood and ensemble options, and the structure of the original module),
  the guide class and its arguments, ``num_data``, and the versions of pyrouq, torch and Pyro;
* ``"model"`` / ``"guide"``: their ``state_dict()`` (the guide's is ``None`` without a guide);
* ``"optimizer"``: an optimizer's ``state_dict()`` or ``None``;
* ``"metadata"``: a JSON string of the caller's metadata;
* ``"training"``: what :func:`pyrouq.fit` needs to resume an interrupted run, or ``None``.

:func:`load` reads it with ``torch.load(..., weights_only=True)``, so a file carrying a pickled
Python object is refused instead of executed, and rebuilds the model and guide from the
description (the classes are looked up in a fixed table of pyrouq classes, never imported by
name). A converted user network is rebuilt from a *skeleton*: ``load(path, module=net)`` with a
freshly built module of the same structure (checked), never from pickled code. Files are
written to a temporary name and renamed, so an interrupted save never leaves a truncated
checkpoint behind.

Examples
--------
>>> import tempfile, pathlib, torch
>>> from pyrouq import BayesianMLP, mean_field_guide
>>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
>>> guide = mean_field_guide(model)
>>> path = pathlib.Path(tempfile.mkdtemp()) / "run.pt"
>>> save(path, model, guide, metadata={"note": "tiny"})
PosixPath('...run.pt')
>>> restored = load(path)
>>> type(restored.model).__name__, restored.metadata
('BayesianMLP', {'note': 'tiny'})
>>> torch.equal(restored.guide.site_loc("fc1.weight"), guide.site_loc("fc1.weight"))
True
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pyrouq._default_device import cpu_default
from pyrouq._meta_device import real_device
from pyrouq._util import class_name, has_latent_sites, takes_labels
from pyrouq._words import article
from pyrouq._wrappers import unwrapped
from pyrouq.checkpoint._apart import untie_saved_apart
from pyrouq.checkpoint._checks import (
    check_store_params,
    optimizer_state,
    python_numbers,
)
from pyrouq.checkpoint._describe import (
    build_guide,
    build_model,
    describe_guide,
    describe_model,
    expected_class_name,
    register_guide,
    shared_member_norms,
    upgraded_state,
)
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.checkpoint._file import (
    FORMAT,
    FORMAT_VERSION,
    MCMC_FORMAT,
    MCMC_FORMAT_VERSION,
    _cpu,
    _write,
    checked_device,
    read,
    unreadable,
)
from pyrouq.checkpoint._guide_left_out import warn_guide_left_out
from pyrouq.checkpoint._json import json_text, python_number
from pyrouq.checkpoint._paths import check_path_type, check_target
from pyrouq.checkpoint._shown import checkpoint_repr
from pyrouq.checkpoint._state import frozen_names, load_state, refreeze
from pyrouq.checkpoint._wrapped_skeleton import skeleton_for
from pyrouq.convert._sites import rebuilding_saved
from pyrouq.mcmc import MCMCResult

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "describe_guide",
    "describe_model",
    "load",
    "register_guide",
    "save",
]


@dataclass(frozen=True)
class Checkpoint:
    """What :func:`load` returns.

    Attributes
    ----------
    model : nn.Module
        The rebuilt model with its saved parameters, in eval mode.
    guide : MeanFieldGuide or None
        The rebuilt guide (``None`` when none was saved).
    optimizer_state : dict or None
        The optimizer's ``state_dict()``, to pass to ``optimizer.load_state_dict``.
    metadata : dict
        The caller's metadata (JSON values).
    description : dict
        Classes, constructor arguments and library versions at save time.
    training : dict or None
        State for ``fit(..., resume_from=...)``: epochs done, history, random-number states.
    path : Path or None
        The file it came from.

    Examples
    --------
    >>> import os, tempfile
    >>> from torch import nn
    >>> from pyrouq import bayesian, mean_field_guide
    >>> model = bayesian(nn.Linear(4, 3))
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save(os.path.join(folder, "model.pt"), model, mean_field_guide(model),
    ...                 metadata={"seed": 0})
    ...     checkpoint = load(path, module=nn.Linear(4, 3))  # the skeleton it was converted from
    >>> type(checkpoint.model).__name__, checkpoint.metadata, checkpoint.path == path
    ('BayesianNetwork', {'seed': 0}, True)
    >>> checkpoint.guide is not None, checkpoint.optimizer_state, checkpoint.model.training
    (True, None, False)
    >>> checkpoint  # one line: classes and sizes # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    Checkpoint(model=<BayesianNetwork, 2 latent sites (15 values)>, guide=<MeanFieldGuide,
      30 parameters>, optimizer_state=None, metadata={'seed': 0}, training=None, path='...')
    """

    model: nn.Module
    guide: nn.Module | None
    optimizer_state: dict[str, Any] | None
    metadata: dict[str, Any]
    description: dict[str, Any] = field(repr=False)
    training: dict[str, Any] | None = field(default=None, repr=False)
    path: Path | None = None

    def __repr__(self) -> str:  # one line: the classes and sizes, not the whole model
        return checkpoint_repr(self)


def library_versions() -> dict[str, str]:
    """Versions of pyrouq, torch and Pyro (stored in checkpoints and run folders)."""
    import pyro

    from pyrouq import __version__

    return {"pyrouq": __version__, "torch": torch.__version__, "pyro": pyro.__version__}


def save(
    path: str | os.PathLike[str],
    model: nn.Module,
    guide: nn.Module | None = None,
    *,
    optimizer: Any = None,
    metadata: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint of ``model`` (and ``guide``, ``optimizer``) to ``path``.

    Parameters
    ----------
    path : str or PathLike
        The file to write (its folder is created; a leading ``~`` is refused, not expanded:
        pass ``os.path.expanduser(path)``). Written atomically: a temporary file in the same
        folder, then renamed (a device or a pipe, such as ``/dev/null``, is written into).
    model : pyrouq model or nn.Module
        A model made by :func:`pyrouq.bayesian` / :func:`pyrouq.batchensemble`, a front door
        (``BayesianLeNet``, ``BatchEnsembleMLP``, ...) or a plain ``nn.Module`` (rebuilt by
        ``load(path, module=skeleton)`` unless it is pyrouq's ``MLP`` / ``LeNet``). A
        ``torch.compile`` d model is saved as the module it compiled (``net._orig_mod``, the
        same parameters), a ``DistributedDataParallel`` or ``DataParallel`` one as the module
        it wraps (``.module``), which load into a plain skeleton.
    guide : MeanFieldGuide, optional
        The posterior fit() fitted; one in a wrapper (``DistributedDataParallel``,
        ``DataParallel``, ``torch.compile``) is saved as the guide inside it. (An
        :class:`~pyrouq.MCMCResult` is saved alone.)
    optimizer : torch optimizer, Pyro optimizer or a state dict, optional
        Saved as its ``state_dict()`` (a Pyro optimizer's ``get_state()``), numpy's numbers in
        it as Python's (``lr=np.float64(1e-3)``). A learning-rate scheduler or a module is
        refused: pass the optimizer.
    metadata : dict, optional
        JSON values that load back as saved (metrics, the command line, ...): string keys,
        lists rather than tuples.
    training : dict, optional
        Resume state, written by :func:`pyrouq.fit`; leave it alone (one that is not a dict,
        or holds a value load() would refuse to unpickle, is refused).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    CheckpointError
        For a model or guide it cannot describe (a subclass of a pyrouq model, a likelihood
        other than pyrouq's ``Categorical`` / ``Gaussian``, a prior that is not a
        ``pyro.distributions`` family with tensor parameters), an MCMCResult given as the
        guide, metadata that is not JSON, an ``optimizer`` that is no optimizer nor state dict
        (a learning-rate scheduler, a module), a ``default_kl_weight`` set to no finite number
        >= 0, or an optimizer state, or a module's extra state (``get_extra_state()``), that is
        not tensors, numbers and strings (load() would refuse to unpickle it; numpy's numbers
        are made Python's in the optimizer state, refused in the extra state), or a converted
        model whose network creates parameters with ``pyro.param`` in its forward (as
        :func:`pyrouq.fit` found them: a file holds no param store), or a ``training`` state
        that is not a dict or holds what load() would refuse to unpickle; also a model on the
        meta device (shapes, no values: nothing is written), or a guide there; a path the
        system cannot look up (a name of more than 255 bytes, or the whole too long).

    Warns
    -----
    UserWarning
        A model with latent sites saved without its guide, which holds the posterior: the file
        is written without it (a model kept to go with an MCMCResult needs none: ignore it).

    Examples
    --------
    >>> import os, tempfile
    >>> from pyrouq import MLP
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save(os.path.join(folder, "runs", "mlp.pt"), MLP(4, 8, 3))
    ...     print(path.name, path.parent.name, path.exists())
    mlp.pt runs True
    """
    saved = save_run(path, model, guide, optimizer, metadata, training, check_training=True)
    warn_guide_left_out(unwrapped(model), guide)  # (once written; fit(checkpoint=)'s has one)
    return saved


def save_run(
    path: str | os.PathLike[str],
    model: nn.Module,
    guide: nn.Module | None,
    optimizer: Any,
    metadata: dict[str, Any] | None,
    training: dict[str, Any] | None,
    *,
    check_training: bool,
) -> Path:
    """:func:`save`, and what fit() writes its checkpoint of each epoch with
    (:mod:`pyrouq.infer._loop`), which skips the check of its own ``training``
    state (Python's numbers and strings, tensors, lists and dicts, as it makes them), which
    walked the whole history: 4.5 ms a save at 1000 epochs."""
    from pyrouq.infer._site_checks import check_drawable  # (infer imports this package)
    from pyrouq.infer.guide import check_guide

    check_path_type(path, "save()")
    given, path = path, Path(path)  # (Path drops the "/" that makes "runs/" a folder)
    if metadata is not None and not isinstance(metadata, dict):
        raise CheckpointError(
            f"Expected metadata to be a dict of JSON values, got {type(metadata).__name__}; "
            "load() gives it back as Checkpoint.metadata, a dict. Pass e.g. "
            "metadata={'note': 'run 1'}."
        )
    if isinstance(model, MCMCResult):  # draws and sampler statistics, no model
        if guide is not None or optimizer is not None or training is not None:
            raise CheckpointError(
                "save() writes an MCMCResult alone (its draws and statistics): pass no guide, "
                "optimizer or training state with it."
            )
        check_target(given, "save()", "mcmc.pt")
        return _save_mcmc(path, model, metadata)
    check_target(given, "save()")
    if check_training:
        training = _checked_training(training)  # numpy's numbers as Python's, as written
    if isinstance(guide, MCMCResult):  # save(path, model, result): the result goes alone
        raise CheckpointError(
            f"save() got an MCMCResult as the guide of {class_name(model)}: an MCMC result is "
            "saved alone, its draws and sampler statistics, without the model: "
            "save(path, result). After load(path), set result.model = model for arviz."
        )
    # torch.compile(net), DDP(net): saved as net, which load() rebuilds from a plain skeleton
    # (the wrappers' parameter names, "_orig_mod."..., "module."..., would need a wrapped one);
    # a guide in any of them as the guide (DDP(guide), torch.compile(guide): its module)
    model, guide = unwrapped(model), unwrapped(guide)
    try:  # (torch's words: "Cannot copy out of meta tensor; no data!")
        real_device("save()", model, guide)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    if guide is not None and not has_latent_sites(model):  # its file would not load
        try:
            check_drawable(model, "a guide", "save()")
        except ValueError as err:
            raise CheckpointError(str(err)) from None
        describe_model(model)  # a Pyro model of one's own: save() cannot describe it, it says
        own = (  # an nn.Module written as a Pyro model (Pyro's VAE tutorial), perhaps
            " (if it is a Pyro model of your own, save() cannot rebuild it: save "
            "model.state_dict() and pyro.get_param_store() with torch.save)"
            if takes_labels(model)
            else ""
        )
        raise CheckpointError(
            f"save() got a guide for {type(model).__name__}, which has no latent sites to "
            f"draw{own}. Save the model alone (guide=None); to draw weights, make the network "
            "Bayesian first: pyrouq.bayesian(net), or pyrouq.rank1(net, M) for an ensemble."
        )
    check_guide(model, guide, "save()")
    check_store_params(model, "save()")  # (those fit() found in the network's forward)
    for owner in (model, guide):
        lazy = [
            name
            for name, p in (owner.named_parameters() if isinstance(owner, nn.Module) else ())
            if isinstance(p, nn.parameter.UninitializedParameter)
        ]
        if lazy:
            raise CheckpointError(
                f"save() got a {type(owner).__name__} whose parameters {lazy[:3]} are not "
                "created yet (a learned noise scale or a lazy layer takes its shape from the "
                "first batch): fit it, or call it on a batch, before saving."
            )
    description = {
        "model": describe_model(model),
        "guide": describe_guide(guide),
        "versions": library_versions(),
        "frozen": {  # parameters with requires_grad=False, frozen again by load()
            "model": frozen_names(model),
            "guide": frozen_names(guide) if guide is not None else [],
        },
    }
    metadata_json = json_text(metadata if metadata is not None else {})
    optimizer = optimizer_state(optimizer)  # numpy's numbers as Python's (load() reads them)
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "description": json.dumps(description, default=python_number),
        "model": _cpu(model.state_dict()),
        "guide": _cpu(guide.state_dict()) if guide is not None else None,
        "optimizer": _cpu(optimizer) if optimizer is not None else None,
        "metadata": metadata_json,
        "training": _cpu(training) if training is not None else None,
    }
    return _write(path, payload)


def _checked_training(training: Any) -> Any:
    """``training`` with numpy's numbers as Python's (made once: fit() saves its state, whose
    history grows, every epoch), or a refusal of one that is not a dict, or that holds a value
    load() would refuse to unpickle: save() wrote it, and load() refused the file, or
    fit(resume_from=) failed on it in Python's words ("'str' object has no attribute 'get'")."""
    if training is None:
        return None
    is_dict = isinstance(training, dict)
    training = python_numbers(training) if is_dict else training
    found = unreadable(training, "training") if is_dict else None
    if is_dict and not found:
        return training
    got = (
        f"a dict whose {found[0]} is {article(found[1])} {found[1]}, which load() would "
        "refuse to unpickle"
        if found
        else class_name(training)
    )
    raise CheckpointError(
        f"Expected save(training=...) to be the dict of resume state that fit() writes, got "
        f"{got}. Leave training out: fit(checkpoint=PATH) writes it; keep your own values in "
        "metadata= (JSON)."
    )


def _save_mcmc(path: Path, result: MCMCResult, metadata: dict[str, Any] | None) -> Path:
    own = metadata if metadata is not None else result.metadata
    json_text(own)  # refused as the caller's metadata (not as "metadata['metadata']...")
    meta = {
        "kernel": result.kernel,
        "warmup_steps": result.warmup_steps,
        "seconds": list(result.seconds),
        "sites": list(result.samples),
        "versions": library_versions(),
        "metadata": own,
    }
    text = json_text(meta)
    payload = {
        "format": MCMC_FORMAT,
        "format_version": MCMC_FORMAT_VERSION,
        "samples": _cpu(result.samples),
        "sample_stats": _cpu(result.sample_stats),
        "meta": text,
    }
    return _write(path, payload)


def _mcmc_result(payload: dict[str, Any], path: Any) -> MCMCResult:
    try:
        meta = json.loads(payload["meta"])
        samples = {site: payload["samples"][site] for site in meta["sites"]}
        return MCMCResult(
            samples,
            dict(payload["sample_stats"]),
            str(meta["kernel"]),
            int(meta["warmup_steps"]),
            [float(t) for t in meta["seconds"]],
            metadata=meta.get("metadata", {}),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{str(path)!r} is a damaged MCMC result ({type(err).__name__}: {err}). Re-save it."
        ) from None


def load(
    path: str | os.PathLike[str],
    *,
    model_class: type | str | None = None,
    device: str | torch.device | None = None,
    module: nn.Module | None = None,
) -> Checkpoint | MCMCResult:
    """Rebuild the model and guide saved at ``path`` (or the MCMC result saved there).

    The rebuild's initial values, replaced by the saved ones, leave torch's random state as it
    was: a seed set before ``load`` gives the draws it gives without it. Its tensors are
    normal ones wherever it is called: a model loaded inside ``torch.inference_mode()`` to be
    evaluated can be trained on later by :func:`~pyrouq.fit`.

    Parameters
    ----------
    path : str or PathLike
        A file written by :func:`save` (a model and guide, or an MCMC result) or by
        ``fit(checkpoint=)``.
    model_class : type or str, optional
        The class the caller expects (e.g. ``BayesianLeNet``) or its name; a checkpoint of
        another class is refused. A converted network is held as ``"BayesianNetwork"``
        (:func:`pyrouq.bayesian`, :func:`pyrouq.rank1`) or ``"BatchEnsembleNetwork"``, a plain
        one as ``"Module"``; a name no checkpoint holds is refused with those it can hold.
    device : str or torch.device, optional
        Where the rebuilt model and guide live (default: the ``module=`` skeleton's device,
        else the CPU), or an MCMC result's draws (default CPU). A device torch cannot put
        tensors on here (a GPU it does not see) or the meta device (no values) is refused.
    module : nn.Module, optional
        The skeleton of a converted network (:func:`pyrouq.bayesian`,
        :func:`pyrouq.batchensemble`) or of a plain module: a freshly built network of the
        saved structure (same parameter and buffer names and shapes, the same class name for
        every submodule, activations included, and the same settings of torch's layers, such
        as a convolution's stride or a BatchNorm's eps; checked), e.g. from the
        factory that built the original. A BatchEnsemble, or a rank-1 network made from one,
        also takes the BatchEnsemble built from such a network (``batchensemble(net, M)``, as
        a factory returning one builds it) with the saved ``M`` and ``norms`` (checked). It is
        copied, not changed. Not needed for the
        front doors (``BayesianLeNet``, ...) nor for networks made from pyrouq's ``MLP`` /
        ``LeNet``. A ``torch.compile`` d skeleton is taken as the module it compiled; a file
        holding the compiled wrapper (saved by an earlier pyrouq, or a network compiled before
        it was converted) needs one: ``module=torch.compile(net)``.

    Returns
    -------
    Checkpoint or MCMCResult
        The model, guide and training state; or, for a file of :func:`pyrouq.mcmc`'s draws,
        the :class:`~pyrouq.MCMCResult`.

    Raises
    ------
    CheckpointError
        A missing, unreadable (no permission), truncated or corrupted file, one that
        ``torch.save()`` did not write (a plain ``pickle.dump``'s, a zip archive of other
        files), one holding pickled Python objects, one of a format version this pyrouq does
        not read (an MCMC result's too), one of another model class than ``model_class``, a
        converted network without a skeleton or with one that does not match, parameters that
        do not fit the description, or a description or metadata that ``save()`` did not write
        (edited by hand); a path the system cannot look up (a name of more than 255 bytes, or
        the whole too long).
    ValueError
        A ``device`` torch cannot use here, or the meta device.

    Warns
    -----
    UserWarning
        A converted network whose latent site is named as one of the model's own (``"obs"``,
        the likelihood's ``"sigma"``, ...), saved before :func:`pyrouq.bayesian` refused such
        names: it loads as it was trained, and the warning says what that name costs.

    Examples
    --------
    >>> import os, tempfile
    >>> import torch
    >>> from pyrouq import MLP
    >>> net = MLP(4, 8, 3)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     checkpoint = load(save(os.path.join(folder, "mlp.pt"), net))
    >>> x = torch.rand(2, 4)
    >>> torch.equal(checkpoint.model(x), net.eval()(x)), checkpoint.guide
    (True, None)
    """
    check_path_type(path, "load()")
    device = checked_device(device)
    # normal tensors whatever the caller's mode: a model loaded inside torch.inference_mode()
    # (to evaluate it) would hold inference tensors, which fit() cannot train later; built
    # under the CPU default whatever torch's default device (under meta, values were dropped)
    with torch.inference_mode(False), cpu_default():
        payload = read(path, release=True)  # (a ReadFile's copy of the tensors goes with it)
        if payload.get("format") == MCMC_FORMAT:
            if model_class is not None or module is not None:
                raise CheckpointError(
                    f"{str(path)!r} holds an MCMC result (draws, no model): load it without "
                    "model_class or module, then set result.model (and .x, .y) for arviz."
                )
            result = _mcmc_result(payload, path)
            if device is not None:
                result.samples = {k: v.to(device) for k, v in result.samples.items()}
            return result
        expected = None if model_class is None else expected_class_name(model_class)
        description = _parse_description(path, payload["description"])
        module = skeleton_for(description, module, path)
        with description_errors(path):
            with rebuilding_saved():  # (a network site named "obs", saved before it was refused)
                model = build_model(description, expected=expected, path=path, module=module)
            state = upgraded_state(model, payload)
            untie_saved_apart(model, state)
            shared = shared_member_norms(model, state) if isinstance(state, dict) else []
            load_state(model, state, "model", path)
            guide = None
            if description.get("guide") is not None:
                guide = build_guide(description, model, path=path)
                if payload.get("guide") is None:
                    raise CheckpointError(
                        f"{str(path)!r} describes a guide but holds no guide state."
                    )
                load_state(guide, payload["guide"], "guide", path)
            frozen = description.get("frozen")  # absent from checkpoints of pyrouq before 2026-12
            if isinstance(frozen, dict):
                refreeze(model, frozen.get("model"))
                if guide is not None:
                    refreeze(guide, frozen.get("guide"))
            saved = _checkpoint(payload, description, model, guide, path)
            if shared and saved.training is not None:  # resume refuses it: no optimizer state fits
                saved = replace(saved, training={**saved.training, "shared_norms": shared})
        if device is not None:
            model.to(device)
            if guide is not None:
                guide.to(device)
        model.eval()
        return saved


@contextlib.contextmanager
def description_errors(path: Any) -> Iterator[None]:
    """Turn the errors of rebuilding from a description pyrouq did not write (a file edited
    by hand, a key missing or of another type) into a :class:`CheckpointError` that says so."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, AttributeError, IndexError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"{str(path)!r} cannot be rebuilt from its description or metadata "
            f"({type(err).__name__}: {err}): not as pyrouq.save() writes them (edited by "
            "hand, or written by another program?). Use the file as pyrouq.save() wrote it, or "
            "save the trained model again."
        ) from err


def _checkpoint(payload: dict, description: dict, model: Any, guide: Any, path: Any) -> Checkpoint:
    return Checkpoint(
        model=model,
        guide=guide,
        optimizer_state=payload.get("optimizer"),
        metadata=json.loads(payload["metadata"]),
        description=description,
        training=payload.get("training"),
        path=Path(path),
    )


def _parse_description(path: Any, text: Any) -> dict[str, Any]:
    try:
        description = json.loads(text)
        description["model"]["class"]
    except (TypeError, ValueError, KeyError) as err:
        raise CheckpointError(
            f"{str(path)!r} has an unreadable model description ({err}). Re-save it."
        ) from None
    return description  # type: ignore[no-any-return]
