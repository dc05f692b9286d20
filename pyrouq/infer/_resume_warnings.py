"""The warnings of ``fit(resume_from=...)``: each setting of the resumed call that changes
the run from where it stopped (``kl_weight``, the planned epochs, the learning-rate schedule,
the particles, N, the number of ranks, the loader's batches an epoch and batch size, the
learning rate) is warned of, with the setting that continues the run as it was, and so is
a finished run trained on for more epochs, whose schedule is planned anew; :meth:`Loop.resume
<pyrouq.infer._loop.Loop.resume>` calls them before it loads the run's state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyrouq._batch_size import loader_batch_size
from pyrouq._batchnorm import Norm
from pyrouq._util import ShardedOrder, len_or, warn_caller
from pyrouq.infer._options import WARMUP_FRACTION, lr_factor

if TYPE_CHECKING:
    from pyrouq.infer._loop import Loop

__all__ = ["warn_of_changes"]


def warn_of_changes(loop: Loop, state: dict[str, Any]) -> None:
    """Warn of each setting of ``loop`` that differs from the run's, as its checkpoint's
    training ``state`` holds them."""
    kl_weight = state.get("kl_weight", loop.elbo.kl_weight)
    if loop.guide is not None and float(kl_weight) != loop.elbo.kl_weight:  # (no KL else)
        warn_caller(
            f"fit(resume_from=...) continues a run trained with kl_weight={kl_weight} "
            f"under kl_weight={loop.elbo.kl_weight}: the objective changes from here on. "
            f"Pass kl_weight={kl_weight} to continue the run as it was."
        )
    _warn_of_other_settings(loop, state)
    _warn_of_a_new_plan(loop, state)
    if not _warned_of_other_ranks(loop, state):
        _warn_of_another_loader(loop, state)
    given, run = loop.base_lrs, [float(v) for v in state["base_lrs"]]
    if given != run:
        warn_caller(
            f"fit(resume_from=...) continues the run at its learning rate "
            f"{_lrs(run)}; lr={_lrs(given)} is ignored (the optimizer's state and the "
            "schedule carry on). Pass the run's lr, or start a new run to change it."
        )


def _warned_of_other_ranks(loop: Loop, state: dict[str, Any]) -> bool:
    """Warn, and return True, when the run was trained on another number of ranks than
    ``loop`` runs on (its checkpoint records it since 2026-12-07; not compared for older
    ones): each rank's shard of an epoch, and so its batches and the schedule planned over
    them, differ from the run's; the loader is then not the cause, and is not warned of. A
    pyrouq loader whose batches make the run's (:func:`_run_batch`) is told what differs
    still: the weight draws a step averages, BatchNorm's batch statistics; one whose batch
    size alone differs, the batch size that would make them."""
    theirs, ours = state.get("world"), loop.group.world
    if isinstance(theirs, bool) or not isinstance(theirs, int) or theirs < 1 or theirs == ours:
        return False
    head = f"fit(resume_from=...) continues {_ranks(ours)} a run trained {_ranks(theirs)}"
    where = (
        "in one process (no process group)"
        if theirs == 1
        else f"on {theirs} ranks (torchrun --nproc_per_node {theirs})"
    )
    run_size, size = int(state.get("batch_size") or 0), loader_batch_size(loop.loader) or 0
    batch = _run_batch(loop.loader, theirs, ours, run_size)
    if batch is not None and size * ours == batch:  # the same examples a step, split otherwise
        normed = (
            f", and BatchNorm layers normalise with the statistics of {size} examples where "
            f"the run's took {run_size}"
            if any(isinstance(m, Norm) for m in loop.model.modules())
            else ""
        )
        warn_caller(
            f"{head}: its steps see the run's batches ({batch} examples a step: {run_size}"
            f"{_each(theirs)} in the run, {size}{_each(ours)} here), but split otherwise: a "
            f"step's gradient {_draws(ours, theirs)} (drawn alike on every rank with "
            "distributed_draws='identical': the run then continues as it was, to float "
            f"rounding){normed}. Resume {where}, with the run's loader, to continue it as it was."
        )
        return True
    run_batches, batches = int(state.get("batches_per_epoch", 0)), len_or(loop.loader)
    changes = []
    if run_batches and batches and run_batches != batches:
        changes.append(
            f"an epoch takes {batches} steps{_on(ours)} where the run took {run_batches}"
            f"{_on(theirs)}, so the learning-rate schedule, planned over the run's steps, no "
            "longer matches"
        )
    if state["epoch_steps"]:
        changes.append(
            f"the {state['epoch_steps']} steps the run took of epoch "
            f"{state['epochs_done'] + 1} skip other batches than it saw"
        )
    changes.append("every step sees other batches than the run's would have")
    fits = (
        f", or give this loader batch_size={batch // ours}, whose steps then see the run's batches"
        if batch is not None and batch % ours == 0
        else ""
    )
    warn_caller(
        f"{head}: its epochs are split otherwise than the run's: {'; '.join(changes)}. "
        f"Resume {where}, with the run's loader, to continue it as it was{fits}."
    )
    return True


def _run_batch(loader: Any, theirs: int, ours: int, run_size: int) -> int | None:
    """The run's batch, the ``run_size`` examples on each of its ``theirs`` ranks, where
    ``loader`` on ``ours`` ranks can serve it: a pyrouq loader (every number of ranks shards
    one permutation drawn alike, rank r taking every world-th example from r, so that a step's
    shards together are the next ``world * batch_size`` examples of it) over examples that
    both numbers of ranks divide (else the permutation is padded); None elsewhere."""
    if not isinstance(loader, ShardedOrder) or not run_size:
        return None
    n = len(loader.dataset)  # type: ignore[attr-defined]
    return None if n % theirs or n % ours else run_size * theirs


def _each(world: int) -> str:
    """`` on each of 2 ranks`` or `` in one process``."""
    return f" on each of {world} ranks" if world > 1 else " in one process"


def _draws(ours: int, theirs: int) -> str:
    """How many draws of the weights a step's gradient averages on ``ours`` ranks, against the
    run's on ``theirs``: one per rank."""
    if ours == 1:
        return (
            f"is taken at one draw of the weights where the run's averaged {theirs}, one per rank"
        )
    run = "was taken at one" if theirs == 1 else f"averaged {theirs}"
    return f"averages {ours} draws of the weights, one per rank, where the run's {run}"


def _ranks(world: int) -> str:
    """``on 2 ranks`` or ``in one process``."""
    return f"on {world} ranks" if world > 1 else "in one process"


def _on(world: int) -> str:
    """`` on each of 2 ranks`` or nothing (one process)."""
    return f" on each of {world} ranks" if world > 1 else ""


def _warn_of_another_loader(loop: Loop, state: dict[str, Any]) -> None:
    """Warn of a loader serving another number of batches an epoch than the run's, or (as
    many) batches of another size."""
    theirs, ours = int(state.get("batches_per_epoch", 0)), len_or(loop.loader)
    if theirs and ours and theirs != ours:
        skipped = (
            f", and the {state['epoch_steps']} steps the run took of epoch "
            f"{state['epochs_done'] + 1} skip other batches than it saw"
            if state["epoch_steps"]
            else ""
        )
        warn_caller(
            f"fit(resume_from=...) continues a run of {theirs} batches an epoch with a "
            f"loader of {ours}: the learning-rate schedule no longer matches the run's"
            f"{skipped}. Resume with the run's loader (same data and batch size) to "
            "continue it exactly."
        )
    # (a run's 0, or none: its loader told no batch size, as a batch_sampler= one's did in
    # checkpoints written before its batch sampler's was read; not compared)
    theirs_size, ours_size = state.get("batch_size"), loader_batch_size(loop.loader)
    if theirs == ours and theirs_size and ours_size and theirs_size != ours_size:
        warn_caller(
            f"fit(resume_from=...) continues a run of batch size {theirs_size} with a loader "
            f"of batch size {ours_size}: its steps see other batches than the run's would "
            "have. Resume with the run's loader (same data and batch size) to continue it "
            "exactly."
        )


def _warn_of_other_settings(loop: Loop, state: dict[str, Any]) -> None:
    """Warn of each setting that changes the run from here on: the planned epochs (the
    schedule's length), the schedule, the particles (their number and, for more than one,
    whether they are vectorised), N (checkpoints from before a setting
    was stored are not checked on it)."""
    # a finished run trained on for more epochs is planned anew, as fit() says when it
    # refuses the run's own total; an interrupted one is continued
    interrupted = int(state["epochs_done"]) < int(state.get("epochs", 0))
    ours = {
        "epochs": loop.epochs if loop.scheduled and interrupted else state.get("epochs"),
        "lr_schedule": loop.lr_schedule,
        "num_particles": loop.elbo.num_particles,
        # one particle is the same draw either way; another number is warned of above
        "vectorize_particles": getattr(loop.elbo, "vectorize_particles", None)
        if 1 < loop.elbo.num_particles == state.get("num_particles")
        else None,
        "num_data": loop.num_data,
    }
    effect = {
        "epochs": "the learning-rate schedule, planned over the run's epochs, is planned "
        "anew and the learning rate jumps",
        "lr_schedule": "the learning rate follows another schedule",
        "num_particles": "each step averages another number of draws",
        "vectorize_particles": "the particles are drawn in another order (all at once or "
        "one after another), so every later draw differs",
        "num_data": "the likelihood is scaled by another N against the KL",
    }
    for key, value in ours.items():
        if key in state and value is not None and state[key] != value:
            warn_caller(
                f"fit(resume_from=...) continues a run trained with {key}={state[key]!r} "
                f"under {key}={value!r}: {effect[key]}. Pass {key}={state[key]!r} to "
                "continue the run as it was."
            )


def _warn_of_a_new_plan(loop: Loop, state: dict[str, Any]) -> None:
    """Warn that a finished run trained on for more epochs under the run's schedule (a
    warm-up or a cosine, which brought the learning rate down towards 0 by the run's end) has
    it planned anew over the new total, so that the learning rate rises again (inside the new
    warm-up, on to the full rate at its end); say how to train on at a low, flat one. (Another
    schedule than the run's is warned of apart; checkpoints from before the planned epochs and
    batches were stored are not checked.)"""
    if not loop.scheduled or "epochs" not in state:
        return
    planned, done = int(state["epochs"]), int(state["epochs_done"])
    if done < planned or state.get("lr_schedule", loop.lr_schedule) != loop.lr_schedule:
        return
    steps, base = int(state["steps"]), [float(v) for v in state["base_lrs"]]
    run_steps = planned * int(state.get("batches_per_epoch", 0))
    if not (run_steps and steps):
        return
    last, now = lr_factor(loop.lr_schedule, run_steps)(steps - 1), loop.lr_factor(steps)
    if now <= last * (1 + 1e-6):  # (a run of a few steps: no rise worth a word)
        return
    # a step inside the new plan's warm-up: the rate climbs on to the full one at its end
    total = loop.epochs * loop.per_epoch
    warmup = int(WARMUP_FRACTION * total) if loop.lr_schedule == "warmup_cosine" else 0
    peak = ""
    if steps < warmup - 1:
        peak = (
            f" and on to {_lrs([b * loop.lr_factor(warmup - 1) for b in base])} at the end of "
            f"the warm-up (step {warmup} of {total})"
        )
    warn_caller(
        f"fit(resume_from=...) trains a finished run of {planned} epoch"
        f"{'s' if planned != 1 else ''} on to "
        f"epochs={loop.epochs}: lr_schedule={loop.lr_schedule!r} is planned anew over the "
        f"{loop.epochs} epochs, so the learning rate, which the run ended at "
        f"{_lrs([b * last for b in base])}, rises to {_lrs([b * now for b in base])} at the "
        f"next step{peak}, then decays towards 0 again. To train on at a low, flat learning "
        "rate instead, call fit() without resume_from (it trains on from the fitted parameters, "
        "with a new optimizer), giving the rate you want (as lr=... or in optim=...) and "
        "lr_schedule='constant'."
    )


def _lrs(values: list[float]) -> str:
    """One learning rate, or the distinct ones of several parameter groups."""
    distinct = sorted(set(values))
    return f"{distinct[0]:g}" if len(distinct) == 1 else str([float(f"{v:g}") for v in values])
