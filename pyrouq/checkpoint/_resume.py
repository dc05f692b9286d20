"""Resuming a run: :func:`restore` loads a checkpoint that :func:`pyrouq.fit` wrote into a
freshly built model and guide, after checking that they are the run's (class, configuration,
network structure, priors) and that the run has epochs left."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from torch import nn

from pyrouq._numbers import finite_float, is_real
from pyrouq._util import warn_caller
from pyrouq._wrappers import unwrapped
from pyrouq.checkpoint import (
    MCMC_FORMAT,
    Checkpoint,
    CheckpointError,
    _checkpoint,
    _parse_description,
    describe_model,
    description_errors,
    python_number,
    read,
)
from pyrouq.checkpoint._apart import member_norms_saved_apart, saved_apart
from pyrouq.checkpoint._describe import (
    _GUIDES,
    ENSEMBLE_DOORS,
    FACTORS_BEFORE,
    guide_of_class,
    saved_config,
    shared_member_norms,
    upgraded_state,
)
from pyrouq.checkpoint._state import load_state
from pyrouq.checkpoint._wrapped_skeleton import check_resumed_wrapper, holds_wrapper
from pyrouq.convert import SitePrior
from pyrouq.likelihoods import _LIKELIHOODS


def restore(
    source: Any,
    model: nn.Module,
    guide: Any,
    epochs: int,
    optimizer: tuple[str, str],
    built: Any = None,
    given: Any = None,
) -> Checkpoint:
    """Load the run saved at ``source`` (a path or a :class:`Checkpoint`) into ``model`` and
    ``guide`` to continue it for a total of ``epochs`` with ``optimizer`` (the dotted class
    path of fit()'s optimizer, and how the message names it); returns the checkpoint with its
    training state (what ``fit(resume_from=...)`` continues). A checkpoint of another
    configuration or optimizer, or of a finished run, is refused before anything is loaded,
    as is one whose optimizer state has other parameter groups than the optimizer ``built``
    (fit()'s, when given); one whose saved tensors do not fit leaves the model and guide as
    they were (values and dtypes). ``given``: the model as passed to fit(), in the wrappers
    fit() took off ``model`` (by default ``model``), which a file of an earlier pyrouq holding
    a ``DistributedDataParallel`` or ``DataParallel`` wrapper is loaded into (the wrapper,
    inside a torch.compile one if so given). A guide in a wrapper (``DataParallel``,
    ``torch.compile``) is checked and loaded as the guide it holds, which save() stored."""
    given = model if given is None else given
    guide = unwrapped(guide)
    if isinstance(source, Checkpoint):
        saved = source
        where = str(saved.path) if saved.path is not None else "the checkpoint"
        parallel = check_resumed_wrapper(saved.description, given, where)
        model = parallel if parallel is not None else _as_saved(model, saved.description)
        model_state = saved.model.state_dict()
        guide_state = None if saved.guide is None else saved.guide.state_dict()
    else:
        payload = _training_run(source, release=True)  # (a ReadFile's copy goes with it)
        description = _parse_description(source, payload["description"])
        parallel = check_resumed_wrapper(description, given, str(source))
        model = parallel if parallel is not None else _as_saved(model, description)
        with description_errors(source):
            saved = _checkpoint(payload, description, model, guide, source)
            model_state, guide_state = upgraded_state(model, payload), payload.get("guide")
    where = str(saved.path) if saved.path is not None else "the checkpoint"
    stored, here = saved.description["model"], describe_model(model, unwrap=False)
    if stored["class"] != here["class"]:
        raise CheckpointError(
            f"resume_from={where!r} holds a {stored['class']}, but the model is a "
            f"{here['class']}. Resume with the model class the run was started with."
        )
    for key in ("config", "module"):
        theirs, mine = stored.get(key), here.get(key)
        if key == "config":  # options of a later date than the file, as they built it
            theirs = saved_config(stored)
        door = stored["class"] in ENSEMBLE_DOORS
        if key == "config" and door and isinstance(theirs, dict) and isinstance(mine, dict):
            # a front door's factor options, which a file written before 2026-12-05 does not
            # record: unknown (they set only the initial values), so not compared, as then
            mine = {k: v for k, v in mine.items() if k in theirs or k not in FACTORS_BEFORE}
        if key == "module" and isinstance(theirs, dict) and isinstance(mine, dict):
            # entries added to the structure record after the checkpoint was written
            mine = {k: v for k, v in mine.items() if k in theirs}
        if key == "config" and isinstance(theirs, dict) and isinstance(mine, dict):
            theirs, mine = _used_likelihood(theirs, mine)
        if theirs != mine:  # the innermost entries that differ, three at most
            differ = _differences(theirs, mine, key)
            shown = "; ".join(
                f"{path} is {_entry(a)} there and {_entry(b)} in the model"
                for path, a, b in differ[:3]
            )
            more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
            raise CheckpointError(
                f"resume_from={where!r} holds a {stored['class']} of another {key}: {shown}"
                f"{more}. {_rebuild_advice(theirs, mine, saved)}"
            )
    saved_guide = saved.description.get("guide") is not None
    if saved_guide != (guide is not None):
        raise CheckpointError(
            f"resume_from={where!r} was saved {'with' if saved_guide else 'without'} a "
            f"guide, but guide is {'None' if guide is None else type(guide).__name__}."
        )
    guide_class = (saved.description.get("guide") or {}).get("class")
    registered = _GUIDES.get(guide_class) if isinstance(guide_class, str) else None
    if guide is None or guide_class is None:
        other = False
    elif registered is not None:  # its subclasses hold the same state (of before a reload too)
        other = not guide_of_class(guide, registered)
    else:
        other = guide_class != type(guide).__name__
    if other:
        raise CheckpointError(
            f"resume_from={where!r} was trained with a {guide_class} guide, but guide is of class "
            f"{type(guide).__name__}: the saved guide state belongs to the other class. "
            f"Build the guide as the run did (a {guide_class}"
            f"{', mean_field_guide(model)' if guide_class == 'MeanFieldGuide' else ''})."
        )
    check_training(saved.training, saved.optimizer_state, where)
    shared = shared_member_norms(model, model_state) if isinstance(model_state, dict) else []
    shared = shared or list((saved.training or {}).get("shared_norms", []))  # load() shared out
    if shared:
        raise CheckpointError(
            f"resume_from={where!r} was saved when the members shared the norms at "
            f"{shared} (an older pyrouq: nn.RMSNorm got a copy per member on 2026-12-05); "
            "pyrouq.load() rebuilds it with each member's copy, but its optimizer state "
            "cannot continue: start a new fit() from the loaded model."
        )
    if saved.training is None:
        raise _no_training(saved.metadata, where)
    apart = saved_apart(model, model_state)
    if apart:
        raise CheckpointError(
            f"resume_from={where!r} was saved when the per-member bias of {apart} was tied to "
            "another layer's in the model but trained apart from it (an older pyrouq: a tied "
            "bias stays one since 2026-12-06), so its optimizer state does not fit this model. "
            "Resume with the model pyrouq.load() rebuilds from it, which keeps them apart: "
            "fit(pyrouq.load(path).model, ..., resume_from=path) (load(path, module=net) for a "
            "network of your own); nothing was loaded."
        )
    apart = member_norms_saved_apart(model, model_state)
    if apart:
        raise CheckpointError(
            f"resume_from={where!r} was saved when the per-member norm parameters {apart} were "
            "tied to another norm layer's in the model but trained apart from it (an older "
            "pyrouq: a tie between two norm layers stays one within each member since "
            "2026-12-06), so its optimizer state does not fit this model. Resume with the model "
            "pyrouq.load() rebuilds from it, which keeps them apart: "
            "fit(pyrouq.load(path).model, ..., resume_from=path) (load(path, module=net) for a "
            "network of your own); nothing was loaded."
        )
    done = int(saved.training["epochs_done"])
    if done >= epochs:
        planned = int(saved.training["epochs"])
        if done >= planned:
            fix = (
                f"it finished the run it was planned for ({planned} epochs): there is nothing "
                f"to resume. To train on, pass a larger total, e.g. epochs={done + 1} (the "
                "learning-rate schedule is then planned over the new total)"
            )
        else:
            fix = (
                f"pass the total number of epochs of the run (more than {done}), e.g. "
                f"epochs={planned}, as it was planned"
            )
        raise ValueError(
            f"resume_from has already completed {done} epochs, but epochs={epochs}: {fix}."
        )
    if saved.optimizer_state is None:
        raise ValueError("resume_from holds no optimizer state; it cannot continue a run.")
    ours, named = optimizer
    theirs = saved.training.get("optimizer", ours)  # not recorded before 2026-12-03
    if theirs != ours:
        if theirs.startswith("pyrouq."):
            fix = "Leave optim=None, as the run did"
        else:
            name = theirs.rsplit(".", 1)[-1]
            fix = f"Pass the run's optim, e.g. lambda params: {name}(params, ...)"
        raise CheckpointError(
            f"resume_from={where!r} was trained with the optimizer {theirs}, but this fit() "
            f"builds {named}: the saved optimizer state (moments, step counts) belongs to the "
            f"other one. {fix}, or start a new run."
        )
    _check_optimizer_groups(built, saved.optimizer_state, where)
    _check_same_priors(model, model_state, where)
    _warn_other_dtype(model, model_state, where)
    modules = [m for m in (model, guide) if isinstance(m, nn.Module)]
    before = [_tensors_of(m) for m in modules]
    try:
        load_state(model, model_state, "model", where, built="the model given")
        if guide is not None:
            load_state(guide, guide_state, "guide", where, built="the guide given")
    except Exception:  # refused: the model and guide as they were, dtypes too
        for module, copies in zip(modules, before, strict=True):
            _put_back(module, copies)
        raise
    return saved


_TRAINING_KEYS = ("epochs_done", "steps", "epoch_steps", "history", "base_lrs", "rng")
"""What every training state fit() writes holds, and resuming reads."""


def check_training(training: Any, optimizer_state: Any, where: str) -> None:
    """Refuse the training state of the checkpoint at ``where`` (and its optimizer state) that
    fit() did not write (:func:`_unfit_training`), before anything reads it: fit() resuming,
    and ``pyrouq fit --resume`` finishing a run trained in full, alike."""
    unfit = _unfit_training(training, optimizer_state)
    if unfit:
        raise CheckpointError(
            f"resume_from={where!r} holds a training state that fit() did not write ({unfit}): "
            "save(training=...) is fit()'s to fill, or the file was edited. Start a new fit() "
            "from ckpt = pyrouq.load(path) (ckpt.model, ckpt.guide), or resume from a "
            "checkpoint that fit(checkpoint=...) wrote."
        )


def _unfit_training(training: Any, optimizer_state: Any = None) -> str | None:
    """What makes a saved training state one fit() did not write (None: it may be fit()'s, or
    there is none): not a dict, without a key that resuming reads (the sums of an epoch it
    stopped inside too), a count that is none (N, the particles and the ranks, where recorded,
    counted from 1), a KL weight that is no finite number >= 0, learning rates or a history
    not in lists, other learning rates than the saved ``optimizer_state`` has parameter groups
    (fit() writes one per group), an epoch record of other keys than
    :class:`~pyrouq.EpochRecord`'s fields, or no torch random state to restore."""
    from pyrouq.infer._fit_result import EpochRecord  # (the infer package imports this one)

    if training is None:
        return None
    if not isinstance(training, dict):
        return f"a {type(training).__name__}, not a dict"
    missing = [key for key in _TRAINING_KEYS if key not in training]
    if missing:
        return f"no {', '.join(map(repr, missing))}"
    for key in ("epochs_done", "steps", "epoch_steps"):  # (read as ints: int(None) failed)
        count = training[key]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            return f"{key!r} is {count!r}, not a count"
    # (where recorded: read as ints, counts from 1; the ranks since 2026-12-07)
    for key in ("num_data", "num_particles", "world"):
        count = training.get(key, 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return f"{key!r} is {_shown(count)}, not a count from 1"
    weight = training.get("kl_weight", 0.0)  # (read as a float: float(None) failed)
    if (number := finite_float(weight)) is None or number < 0:
        return f"'kl_weight' is {_shown(weight)}, not a weight of 0 or more"
    if training["epoch_steps"] and not isinstance(training.get("sums"), torch.Tensor):
        return "no 'sums' of the epoch it stopped inside"  # (a KeyError 'sums' there)
    rates, history = training["base_lrs"], training["history"]  # (iterated: "not iterable")
    if not (isinstance(rates, (list, tuple)) and all(is_real(v) for v in rates)):
        return f"'base_lrs' is {_shown(rates)}, not a list of learning rates"
    if not (isinstance(history, (list, tuple)) and all(isinstance(r, dict) for r in history)):
        return f"'history' is {_shown(history)}, not a list of epoch records"
    groups = optimizer_state.get("param_groups") if isinstance(optimizer_state, dict) else None
    if isinstance(groups, list) and len(rates) != len(groups):  # (zip(strict=True) refused)
        return (
            f"'base_lrs' holds {len(rates)} learning rate(s), one per parameter group, but its "
            f"optimizer state has {len(groups)} parameter group(s)"
        )
    fields = [field.name for field in dataclasses.fields(EpochRecord)]
    for number, record in enumerate(history, 1):  # (EpochRecord(**record): a TypeError)
        if set(record) != set(fields):
            return (
                f"'history' record {number} has the keys {list(record)}, where an epoch record "
                f"has {fields}"
            )
    rng = training["rng"]  # (restored before the first step: a KeyError 'torch' there)
    torch_state = rng.get("torch") if isinstance(rng, dict) else None
    if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8):
        return "'rng' holds no torch random state"
    return None


def _training_run(source: Any, release: bool = False) -> dict[str, Any]:
    """What :func:`read` gives of the file at ``source``, an MCMC result refused."""
    payload = read(source, release=release)
    if payload.get("format") == MCMC_FORMAT:
        raise CheckpointError(
            f"resume_from={str(source)!r} holds an MCMC result, not a training run; "
            "resume from a checkpoint that fit(checkpoint=...) wrote."
        )
    return payload


def _no_training(metadata: Any, where: str) -> CheckpointError:
    """The refusal of the checkpoint at ``where`` that holds no training state: the final one
    of a finished `pyrouq fit` run (its ``metadata`` records the command and metrics), or
    save()'s."""
    run = metadata.get("config") if isinstance(metadata, dict) else None
    if isinstance(run, dict) and "command" in run and "metrics" in metadata:
        return CheckpointError(  # not save()'s: the finished run of the command
            f"resume_from={where!r} holds no training state: it is the final checkpoint "
            "of a finished `pyrouq fit` run, which keeps the weights and metrics, not the "
            "optimizer state. To train on, start a new fit() from ckpt = pyrouq.load(path) "
            "(ckpt.model, ckpt.guide), or run `pyrouq fit` with more --epochs."
        )
    return CheckpointError(
        f"resume_from={where!r} holds no training state (it was written by save(), not "
        "by fit(checkpoint=...)). Load it with pyrouq.load() to evaluate it instead."
    )


def _shown(value: Any) -> str:
    """A value of a training state in a refusal: its repr, or its type where that is long."""
    shown = repr(value)
    return shown if len(shown) <= 40 else f"a {type(value).__name__}"


def recorded_num_data(source: Any) -> int | None:
    """The training-set size N a run saved at ``source`` (a path or a :class:`Checkpoint`)
    trained with, for fit() resuming it from a loader that cannot tell N; None where its
    training state records none (an earlier pyrouq's: fit() then asks for ``num_data=``). A
    file :func:`read` refuses (absent, not a checkpoint), an MCMC result, a checkpoint holding
    no training state and one whose training state fit() did not write are refused here, in
    :func:`restore`'s words: fit() would otherwise ask for num_data=, then refuse the file."""
    if source is None:
        return None
    if isinstance(source, Checkpoint):
        training, optimizer_state, metadata = (
            source.training,
            source.optimizer_state,
            source.metadata,
        )
        where = str(source.path) if source.path is not None else "the checkpoint"
    else:
        payload, where = _training_run(source), str(source)
        training, optimizer_state = payload.get("training"), payload.get("optimizer")
        try:
            metadata = json.loads(payload["metadata"])
        except (TypeError, ValueError):  # (restore's description_errors tell it)
            metadata = None
    if training is None:
        raise _no_training(metadata, where)
    check_training(training, optimizer_state, where)
    n = training.get("num_data") if isinstance(training, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


def _as_saved(model: nn.Module, description: Any) -> nn.Module:
    """The model as the run saved it: ``torch.compile(net)``'s or ``DataParallel(net)``'s
    ``net`` (save() writes that), or the wrapper itself for a file of an earlier pyrouq, which
    saved the wrapper (``'_orig_mod.'``... or ``'module.'``... names)."""
    return model if holds_wrapper(description) else unwrapped(model)  # type: ignore[no-any-return]


def _check_optimizer_groups(built: Any, state: Any, where: str) -> None:
    """Refuse an optimizer state whose parameter groups hold other numbers of parameters than
    those of the optimizer ``built`` (what its ``load_state_dict`` refuses), before the model
    and guide are loaded: the parameters to train differ (other frozen ones) or their grouping."""
    groups = getattr(built, "param_groups", None)
    saved = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(groups, list) or not isinstance(saved, list):
        return  # the optimizer's load_state_dict says what is wrong
    ours = [len(group["params"]) for group in groups]
    theirs = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), list)
              else None for g in saved]  # fmt: skip
    if ours != theirs:
        raise CheckpointError(
            f"resume_from={where!r} holds an optimizer state of parameter groups of {theirs} "
            f"parameters, but this fit()'s optimizer has {ours}: the parameters to train "
            "differ from the run's (a model or guide built otherwise, other parameters frozen) "
            "or their grouping (another optim). Resume with the run's model, guide and optim; "
            "nothing was loaded."
        )


def _tensors_of(module: nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """A copy of every parameter and buffer of ``module``, by (owner's path, name), in host
    memory (a copy on the accelerator could run a large model out of its memory); a tensor
    held under several names (a tied weight) is copied once, and so put back tied."""
    copies: dict[int, torch.Tensor] = {}
    return {
        (path, name): copies.setdefault(id(tensor), tensor.detach().to("cpu", copy=True))
        for path, owner in module.named_modules(remove_duplicate=False)
        for name, tensor in (*owner._parameters.items(), *owner._buffers.items())
        if tensor is not None
    }


def _put_back(module: nn.Module, saved: dict[tuple[str, str], torch.Tensor]) -> None:
    """Give ``module`` back the tensors :func:`_tensors_of` copied: the parameters' values
    and dtypes (the same Parameter objects), the buffers as they were (a cast replaced them)."""
    moved: dict[int, torch.Tensor] = {}  # one tensor per copy: ties stay ties
    for (path, name), value in saved.items():
        owner = module.get_submodule(path)
        parameter = owner._parameters.get(name)
        if parameter is not None:
            parameter.data = value.to(parameter.device)
        else:
            current = owner._buffers.get(name)
            device = value.device if current is None else current.device
            owner._buffers[name] = moved.setdefault(id(value), value.to(device))


def _warn_other_dtype(model: nn.Module, state: Any, where: str) -> None:
    """Warn when the run saved a tensor of another floating dtype than the model's tensor of
    the same name (a float64 model takes the float32 run's dtype)."""
    if not isinstance(state, dict):
        return
    own = model.state_dict()
    pairs = [
        (value.dtype, own[key].dtype)
        for key, value in state.items()
        if torch.is_tensor(value)
        and value.is_floating_point()
        and torch.is_tensor(own.get(key))
        and own[key].is_floating_point()
        and value.dtype != own[key].dtype
    ]
    if pairs:
        saved, built = {a for a, _ in pairs}, {b for _, b in pairs}
        warn_caller(
            f"resume_from={where!r} holds {_dtypes(saved)} tensors where the model was built "
            f"in {_dtypes(built)}: it takes the run's dtype, as it was trained (inputs are "
            "cast to it). Build the model in the run's dtype to silence this."
        )


def _dtypes(dtypes: set[torch.dtype]) -> str:
    return " / ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def _check_same_priors(model: nn.Module, state: Any, where: str) -> None:
    """Refuse to resume a run under other priors than it was trained with: a prior's
    parameters are buffers of the model, which loading the run's state would silently put back
    in place of the ones the model was built with (the description records only the family)."""
    if not isinstance(state, dict):
        return
    prior_of = getattr(model, "prior_of", None)
    sites = getattr(model, "network_sites", lambda: ())()
    named = {id(prior_of(site)): site for site in sites} if prior_of is not None else {}
    for name, module in model.named_modules():
        if not isinstance(module, SitePrior):
            continue
        entries = {key: state.get(f"{name}.{key}") for key in module._names}
        saved = {key: v for key, v in entries.items() if torch.is_tensor(v)}
        if len(saved) < len(entries):
            continue  # load_state reports a missing entry
        here = {key: getattr(module, key) for key in module._names}
        if all(
            saved[key].shape == here[key].shape and torch.equal(saved[key].to(here[key]), here[key])
            for key in here
        ):
            continue
        what = f"site {named[id(module)]!r}" if id(module) in named else repr(name)
        raise CheckpointError(
            f"resume_from={where!r} was trained with the prior {_prior_text(module, saved)} of "
            f"{what}, but the model has {_prior_text(module, here)}. Rebuild the model with "
            "the run's prior (or start a new run without resume_from)."
        )


def _prior_text(prior: Any, params: dict[str, torch.Tensor]) -> str:
    def value(t: torch.Tensor) -> str:
        flat = t.detach().flatten()
        if flat.numel() and bool((flat == flat[0]).all()):
            return f"{flat[0].item():g}"
        return f"<tensor of shape {tuple(t.shape)}>"

    return f"{prior.family}(" + ", ".join(f"{k}={value(v)}" for k, v in params.items()) + ")"


def _used_likelihood(
    theirs: dict[str, Any], mine: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The configurations ``theirs`` and ``mine`` without the likelihood's settings that
    neither side's likelihood uses (the ``min_scale`` of a Gaussian of fixed, learned or
    latent noise): another value of one leaves the run the same."""
    unused: list[set[str]] = []
    for config in (theirs, mine):
        spec = config.get("likelihood")
        name = spec.get("name") if isinstance(spec, dict) else None
        kind = _LIKELIHOODS.get(name) if isinstance(name, str) else None
        unused.append(kind._unused_settings(spec) if kind and isinstance(spec, dict) else set())
    common = unused[0] & unused[1]
    if not common:
        return theirs, mine

    def used(config: dict[str, Any]) -> dict[str, Any]:
        spec = {k: v for k, v in config["likelihood"].items() if k not in common}
        return {**config, "likelihood": spec}

    return used(theirs), used(mine)


_ABSENT = object()  # an entry one side lacks


def _rebuild_advice(theirs: Any, mine: Any, saved: Checkpoint) -> str:
    """What to do about a model of another configuration ``mine`` than the run's ``theirs``:
    where the latent sites differ (not of a rank-1 network), ``bayesian(net, select=...)``
    with the run's, which another ``select=`` picked (or an earlier pyrouq's, before
    ``select=None`` and ``"last_layer"`` took an ``nn.Bilinear``)."""
    generic = "Rebuild the model with the saved arguments."
    if not isinstance(theirs, dict) or not isinstance(mine, dict):
        return generic
    sites = theirs.get("sites")
    if theirs.get("ensemble") is not None or not isinstance(sites, list):
        return generic
    if sites == mine.get("sites"):
        return generic
    if len(sites) <= 6:
        select = repr(sites)
    elif saved.path is not None:
        select = f"list(pyrouq.load({str(saved.path)!r}, module=net).model.network_sites())"
    else:
        select = "list(resume_from.model.network_sites())"
    return (
        "Its latent sites are not those select= picked here (another select=, or an earlier "
        "pyrouq's select=None or 'last_layer', which left nn.Bilinear out): convert the network "
        "with the run's, "
        f"bayesian(net, select={select}), and the run's other arguments."
    )


def _differences(theirs: Any, mine: Any, path: str) -> list[tuple[str, Any, Any]]:
    """``(path, theirs, mine)`` for each innermost entry in which two JSON values differ:
    dicts key by key, lists of lists or dicts of one length item by item (``path['key'][i]``);
    a list of numbers (a shape) is one value."""
    if theirs == mine:
        return []
    if isinstance(theirs, dict) and isinstance(mine, dict):
        return [
            found
            for k in {**theirs, **mine}
            for found in _differences(
                theirs.get(k, _ABSENT), mine.get(k, _ABSENT), f"{path}[{k!r}]"
            )
        ]
    if (
        isinstance(theirs, list)
        and isinstance(mine, list)
        and len(theirs) == len(mine)
        and any(isinstance(v, (dict, list)) for v in theirs + mine)  # a shape is one value
    ):
        return [
            found
            for i, (a, b) in enumerate(zip(theirs, mine, strict=True))
            for found in _differences(a, b, f"{path}[{i}]")
        ]
    return [(path, theirs, mine)]


def _entry(value: Any) -> str:
    return "absent" if value is _ABSENT else _short(value, 120)


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, default=python_number)
    return text if len(text) <= limit else text[:limit] + "..."
