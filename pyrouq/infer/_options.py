"""fit()'s options besides the objective: the optimizer ``optim=`` builds
(:func:`build_optimizer`) and the ``callbacks``, checked before training; the learning-rate
schedule (:func:`check_lr_schedule`, :func:`lr_factor`); what an error a callback raises is
noted with (:func:`callback_note`), and one of torch's anomaly detection at a NaN
(:func:`anomaly_note`)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import pyro
import torch
from torch import nn

from pyrouq._numbers import is_real
from pyrouq._signatures import not_callable_as
from pyrouq._util import warn_caller
from pyrouq._words import slip_hint
from pyrouq.infer._adam import Adam
from pyrouq.infer._nonfinite import USUAL_FIX

WARMUP_FRACTION = 0.2
"""Share of the steps over which ``lr_schedule="warmup_cosine"`` ramps the learning rate up."""


_EXAMPLE = "e.g. optim=lambda params: torch.optim.AdamW(params, lr=1e-3)"

#: Where Pyro's own torch optimizers live (what its ``ClippedAdam`` and the like wrap).
_PYRO_OPTIMIZER_MODULES = (
    pyro.optim.clipped_adam,
    pyro.optim.dct_adam,
    pyro.optim.adagrad_rmsprop,
)


def build_optimizer(
    model: nn.Module, guide: Any, probe: Any, optim: Any, lr: float, lr_schedule: str
) -> Any:
    """The optimizer of a fit() run over the parameters of the model, the guide (a module's)
    and those the probe saw created, frozen ones left out: pyrouq's Adam, or what ``optim``
    builds from them (refused when it holds none of them, warned of when it leaves some out,
    refused when its step needs a closure or, under a schedule, a group has no ``lr``)."""
    params: list[torch.Tensor] = list(model.parameters())
    if isinstance(guide, nn.Module):
        params += list(guide.parameters())
    seen: set[int] = set()
    unique = []
    for p in params + probe.created_params:
        if id(p) not in seen and p.requires_grad:  # frozen parameters stay as they are
            seen.add(id(p))
            unique.append(p)
    if not unique:
        frozen = any(not p.requires_grad for p in params)
        raise ValueError(
            f"Nothing to train: {type(model).__name__} and the guide have "
            + (
                "only frozen parameters (requires_grad=False), which fit() leaves as they "
                "are. Unfreeze the ones to train (module.requires_grad_(True))."
                if frozen
                else "no parameters."
            )
        )
    if optim is None:
        return Adam(unique, lr=lr)
    if isinstance(optim, pyro.optim.PyroOptim):
        raise TypeError(
            f"optim got a Pyro optimizer ({type(optim).__name__}), which wraps one for "
            f"pyro.infer.SVI; fit() takes a function building a torch optimizer, {_EXAMPLE}."
            + _schedule_note(isinstance(optim, pyro.optim.PyroLRScheduler))
        )
    if _pyro_optim_maker(optim):  # pyro.optim.Adam (not called): it would take the parameters
        name = getattr(optim, "__name__", type(optim).__name__)  # as its optim_args
        example = _counterpart_example(name)
        raise TypeError(
            f"optim got pyro.optim.{name}, which makes a Pyro optimizer for pyro.infer.SVI "
            f"from a dict of options; fit() takes a function building a torch optimizer from "
            f"the parameters it trains, {example}." + _schedule_note(_is_scheduler(name))
        )
    if isinstance(optim, torch.optim.Optimizer) or not callable(optim):
        raise TypeError(
            f"optim got {_an(optim)}; fit() takes a function building a torch optimizer from "
            f"the parameters it trains (which it gathers), {_EXAMPLE}."
        )
    refused = not_callable_as(optim, [])
    if refused:
        raise TypeError(
            f"optim cannot be called as optim(params) ({refused}); fit() calls it with the list "
            f"of parameters it trains, {_EXAMPLE}."
        )
    optimizer = optim(unique)
    if not hasattr(optimizer, "param_groups") or not callable(getattr(optimizer, "step", None)):
        raise TypeError(
            f"optim returned {_an(optimizer)}, expected a torch optimizer (a "
            f"torch.optim.Optimizer), {_EXAMPLE}."
        )
    _check_built(optimizer, unique, _names(model, guide), lr_schedule)
    return optimizer


def _pyro_optim_maker(optim: Any) -> bool:
    """Whether ``optim`` is one of ``pyro.optim``'s makers of Pyro optimizers (``Adam``,
    ``ClippedAdam``, ``ExponentialLR``: functions of options) or its ``PyroOptim`` class, rather
    than a torch optimizer class it holds (``pyro.optim.clipped_adam.ClippedAdam``)."""
    if not str(getattr(optim, "__module__", "")).startswith("pyro.optim"):
        return False
    return not (isinstance(optim, type) and issubclass(optim, torch.optim.Optimizer))


def _counterpart_example(name: str) -> str:
    """How to pass the torch optimizer class that ``pyro.optim.<name>`` wraps
    (``torch.optim.Adam``, ``pyro.optim.clipped_adam.ClippedAdam``) as ``optim=``; the usual
    example for a scheduler, which wraps none."""
    for module in (torch.optim, *_PYRO_OPTIMIZER_MODULES):
        made = getattr(module, name, None)
        if isinstance(made, type) and issubclass(made, torch.optim.Optimizer):
            if "lr" in inspect.signature(made).parameters:
                return f"e.g. optim=lambda params: {module.__name__}.{name}(params, lr=1e-3)"
            # (its groups have no lr for a schedule to multiply: AdagradRMSProp's eta)
            return f"e.g. optim={module.__name__}.{name} with lr_schedule='constant'"
    return _EXAMPLE


def _is_scheduler(name: str) -> bool:
    """Whether ``pyro.optim.<name>`` wraps a torch learning-rate scheduler."""
    made = getattr(torch.optim.lr_scheduler, name, None)
    schedulers = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    return name == "PyroLRScheduler" or (isinstance(made, type) and issubclass(made, schedulers))


def _schedule_note(scheduler: bool) -> str:
    """What a refusal of a Pyro learning-rate scheduler adds: fit()'s own schedules."""
    if not scheduler:
        return ""
    return (
        " fit() schedules the learning rate itself: lr_schedule='warmup_cosine' (default), "
        "'cosine' or 'constant'; for a scheduler of one's own, train with pyro.infer.SVI and "
        "the Pyro scheduler."
    )


def _check_built(optimizer: Any, given: list[Any], names: dict[int, str], schedule: str) -> None:
    """Refuse an optimizer that trains none of the parameters it was given, whose ``step()``
    needs a closure (fit() calls it without), or whose groups have no learning rate for the
    schedule to multiply; warn of one that leaves some of them out."""
    what = f"optim returned an optimizer ({type(optimizer).__name__})"
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    left = [p for p in given if id(p) not in held]
    build = "Build it from the parameters optim is called with, " + _EXAMPLE
    if len(left) == len(given):
        raise ValueError(
            f"{what} that holds none of the {len(given)} parameters fit() called it with (the "
            f"model's and the guide's): nothing would be trained. {build}."
        )
    if left:
        shown = ", ".join(names.get(id(p), f"a tensor of shape {tuple(p.shape)}") for p in left[:3])
        warn_caller(
            f"{what} that holds {len(given) - len(left)} of the {len(given)} parameters fit() "
            f"called it with: the other {len(left)} ({shown}{', ...' if len(left) > 3 else ''}) "
            f"are not trained. {build}; to leave parameters out on purpose, freeze them before "
            "fit() (requires_grad_(False))."
        )
    refused = not_callable_as(optimizer.step)
    if refused:
        raise TypeError(
            f"{what} whose step() cannot be called without arguments ({refused}): fit() calls "
            "optimizer.step() after each backward pass, with no closure to re-evaluate the loss "
            "(as LBFGS needs). Use a first-order optimizer (SGD, Adam, AdamW, ...)."
        )
    for i, group in enumerate(optimizer.param_groups):
        if schedule != "constant" and base_lr(group) is None:
            raise TypeError(
                f"{what} whose parameter group {i} has no learning rate (its 'lr' is "
                f"{group.get('lr', 'missing')!r}, not a number), which lr_schedule={schedule!r} "
                "multiplies at every step. Pass lr_schedule='constant' to step it as it is, or "
                "give it an lr."
            )


def base_lr(group: dict[str, Any]) -> float | None:
    """A parameter group's learning rate as a float (a one-value tensor's too), or None
    when it has none (a custom optimizer's own step size, ``lr=None``)."""
    lr = group.get("lr")
    if is_real(lr) or (torch.is_tensor(lr) and lr.numel() == 1):
        return float(lr)
    return None


def _names(model: nn.Module, guide: Any) -> dict[int, str]:
    """The parameters of the model and of a guide module by id, named as a message shows them."""
    named = {id(p): f"model's {k}" for k, p in model.named_parameters()}
    if isinstance(guide, nn.Module):
        named.update({id(p): f"guide's {k}" for k, p in guide.named_parameters()})
    return named


def _an(value: Any) -> str:
    """How an error names a value it did not expect."""
    if isinstance(value, torch.optim.Optimizer):
        return f"a built {type(value).__name__} optimizer"
    return "None" if value is None else f"an object of type {type(value).__name__}"


def check_callbacks(callbacks: Any) -> list[Callable[..., Any]]:
    """``callbacks`` as a list (a generator is read once, here), or a TypeError: not a sequence
    of callables, or one that cannot be called as ``callback(record)``."""
    refused = (
        f"Expected callbacks to be a sequence of callables, got {callbacks!r}: each is "
        "called as callback(record) after every epoch. Pass a list, e.g. "
        "callbacks=[print]."
    )
    if callable(callbacks) or not isinstance(callbacks, Iterable) or torch.is_tensor(callbacks):
        raise TypeError(refused)  # (a 0-d tensor raised "iteration over a 0-d tensor")
    callbacks = list(callbacks)
    if not all(callable(c) for c in callbacks):
        raise TypeError(refused)
    for i, callback in enumerate(callbacks):
        why = not_callable_as(callback, None)
        if why:
            raise TypeError(
                f"callbacks[{i}] ({_called(callback)}) cannot be called as callback(record) "
                f"({why}): fit() calls each callback with the epoch's EpochRecord after every "
                "epoch. Give it one parameter, e.g. def report(record): print(record.loss)."
            )
    return callbacks


def _called(callback: Any) -> str:
    """A callback's name in a message (a class's method's with its class, a local function's
    without the function it is local to)."""
    name = getattr(callback, "__qualname__", None) or type(callback).__name__
    return str(name).rsplit("<locals>.", 1)[-1]


def callback_note(callback: Any, epoch: int, checkpoint: Any) -> str:
    """What an error raised by a callback is noted with: where fit() stopped and what it kept."""
    kept = (
        f"; checkpoint {str(checkpoint)!r} holds that epoch's end" if checkpoint is not None else ""
    )
    return (
        f"(raised by the callback {_called(callback)} at the end of epoch {epoch} of fit(): "
        f"training stopped, the model and guide keep epoch {epoch}'s parameters{kept}. A callback "
        "stops a run and keeps its FitResult by raising KeyboardInterrupt: fit() then raises "
        "TrainingInterrupted carrying it.)"
    )


def anomaly_note(error: Exception, epoch: int, step: int) -> str | None:
    """What an error of torch's anomaly detection (``torch.autograd.detect_anomaly()``: a
    backward function "returned nan values") raised in a step's backward pass is noted with:
    fit()'s words for a non-finite loss, which that error comes before; None for others."""
    if not (isinstance(error, RuntimeError) and torch.is_anomaly_enabled()):
        return None
    if "returned nan values" not in str(error):
        return None
    return (
        f"(fit(): torch's anomaly detection stopped the backward pass of epoch {epoch}, step "
        f"{step} at a NaN, before fit()'s own check of the loss; training stopped and the "
        f"parameters and normalisation statistics of the last finite step are kept. {USUAL_FIX})"
    )


LR_SCHEDULES = {
    "warmup_cosine": "the default: a linear ramp over the first 20 % of the steps up to the "
    "learning rate given, then a half-cosine decay from it towards 0, reached one step after "
    "the last",
    "cosine": "a half-cosine decay towards 0 from the first step, reached one step after the last",
    "constant": "the learning rate as given at every step",
}
"""fit()'s learning-rate schedules, each glossed (fit() compares ranks' schedules by their index
here). The warm-up's last step and the decay's first both take the rate given; no step takes
0 (:func:`lr_factor`)."""


def check_lr_schedule(lr_schedule: Any) -> None:
    """Refuse an ``lr_schedule`` that is none of :data:`LR_SCHEDULES`, naming them; a name of
    another case (``"Cosine"``), with spaces around it (``"cosine "``) or with a hyphen or a
    space for the underscore (``"warmup-cosine"``) is asked whether it meant the name, and told
    how the names are written."""
    if isinstance(lr_schedule, str) and lr_schedule in LR_SCHEDULES:
        return
    named = isinstance(lr_schedule, str) or lr_schedule is None
    came = repr(lr_schedule) if named else f"of type {type(lr_schedule).__name__}"
    hint = slip_hint(lr_schedule, LR_SCHEDULES)
    names = ", ".join(f"{name!r} ({gloss})" for name, gloss in LR_SCHEDULES.items())
    raise ValueError(
        f"Unknown lr_schedule {came}{hint}: fit() takes one of {names}. Pass one of these "
        "names as lr_schedule."
    )


def lr_factor(lr_schedule: str, total_steps: int) -> Callable[[int], float]:
    """The factor ``lr_schedule`` multiplies the learning rate by at each step (0-based) of a
    run of ``total_steps``: for ``"warmup_cosine"``, ``(step + 1) / w`` over the first
    ``w = int(0.2 * total_steps)`` (1 at step ``w - 1``), then ``(1 + cos(pi * (step - w) /
    (total_steps - w))) / 2`` (1 again at step ``w``, 0 at ``total_steps``, a step not taken):
    10 steps take 0.5, 1, 1, 0.962, 0.854, 0.691, 0.5, 0.309, 0.146, 0.038."""
    warmup = int(WARMUP_FRACTION * total_steps) if lr_schedule == "warmup_cosine" else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(step - warmup, total_steps - warmup) / max(total_steps - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
