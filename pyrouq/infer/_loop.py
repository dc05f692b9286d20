"""The loop of :func:`~pyrouq.infer.fit`: epochs and steps, the learning-rate schedule, the
per-epoch records, checkpoints on the way and Ctrl-C; ``fit()`` sets it up and runs it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NoReturn

import pyro
import torch
from torch import nn

from pyrouq import _engine
from pyrouq import checkpoint as _checkpoint
from pyrouq._batch_size import loader_batch_size
from pyrouq._batchnorm import ONE_VALUE_PER_CHANNEL, one_value_in_training
from pyrouq._input_cast import typed_by
from pyrouq._util import (
    global_streams_kept,
    len_or,
    model_input,
    modes,
    module_device,
    module_dtype,
    restore_modes,
)
from pyrouq._wrappers import unwrapped
from pyrouq.infer import _distributed
from pyrouq.infer._elbo_checks import empty_guide
from pyrouq.infer._fit_inputs import no_batches_message, refuse_batch_above_n
from pyrouq.infer._fit_modes import train_for_fit
from pyrouq.infer._fit_result import EpochRecord, FitResult
from pyrouq.infer._last_batch import LastBatchOfOne, last_batch_watched
from pyrouq.infer._nonfinite import KLOverflowError, kl_overflow, loss_fix
from pyrouq.infer._options import anomaly_note, base_lr, callback_note, lr_factor
from pyrouq.infer._resume_warnings import warn_of_changes
from pyrouq.infer._site_kl import check_float16_gradients
from pyrouq.infer._training import (
    InterruptFlag,
    TrainingInterrupted,
    check_batch,
    loader_rng_state,
    optimizer_name,
    plain_terms,
    restore_rng_states,
    resumed_batches,
    rng_states,
    running_statistics,
    set_loader_rng_state,
    step_hits,
    training_state,
    unpack_batch,
    warn_of_a_wrong_length,
    whole_data,
)
from pyrouq.infer.elbo import KLWeightedELBO
from pyrouq.likelihoods._gaussian import floor_advice, learned_noise_advice

_SUMS = 5
"""Running sums of an epoch: loss, NLL, KL (per step), correct and counted examples."""


class Loop:
    """The state of one :func:`fit` run: epochs, steps, running sums, history."""

    def __init__(
        self,
        *,
        model: nn.Module,
        held: nn.Module,
        guide: Any,
        loader: Iterable,
        epochs: int,
        elbo: KLWeightedELBO,
        num_data: int,
        optimizer: Any,
        lr_schedule: str,
        num_classes: int | Literal[False] | None,
        checkpoint: Any,
        metadata: Any,
        callbacks: Sequence[Callable[[EpochRecord], Any]],
        group: _distributed.Group,
        likelihood: Any,
    ):
        self.model, self.guide, self.loader = model, guide, loader
        self.held = held  # the model as fit() was given it (a wrapper of model), for messages
        self.cast_to: Any = None  # whose dtype the inputs take, once settled (typed_by)
        self.guide_fn = guide if guide is not None else empty_guide
        # (a compiled BatchEnsemble is one: torch.compile's wrapper is no PyroModule)
        self.plain = guide is None and not isinstance(unwrapped(model), pyro.nn.PyroModule)
        self.epochs, self.elbo, self.num_data = epochs, elbo, num_data
        self.optimizer = optimizer
        # (a group without an lr, under lr_schedule="constant" alone: 0, as its checkpoint shows)
        self.base_lrs = [base_lr(group) or 0.0 for group in optimizer.param_groups]
        self.per_epoch = len_or(loader)  # the batches the schedule is planned over
        self.told = False  # (of an epoch serving another number of batches)
        total_steps = epochs * self.per_epoch
        self.lr_schedule = lr_schedule
        self.lr_factor = lr_factor(lr_schedule, total_steps)
        self.scheduled = lr_schedule != "constant" and total_steps > 0  # unsized: no plan
        self.check_batches = num_classes is not False
        self.num_classes = num_classes if num_classes is not False else None
        self.likelihood = likelihood
        self.checkpoint, self.metadata, self.callbacks = checkpoint, metadata, callbacks
        self.group = group
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.shares_steps = group.active and bool(self.params)  # a collective at every step
        self.statistics = running_statistics(model, guide)
        self.kept: list[torch.Tensor] | None = None  # taken at each step (lazy ones once made)
        self.device = module_device(model, guide) or torch.device("cpu")
        self.history: list[EpochRecord] = []
        self.steps = 0
        self.first_epoch, self.skip = 1, 0
        self.advice: str | None = None  # (floor_advice's, once)
        self.walked: list[torch.Tensor] | None = None  # (hold_registered's, once an epoch)
        self.sums = torch.zeros(_SUMS, dtype=torch.float64)

    def resume(self, saved: Any) -> None:
        state = saved.training
        if self.metadata is None:  # the run's own (`pyrouq fit`'s config), kept, not emptied
            self.metadata = getattr(saved, "metadata", None)
        where = "resume_from" if saved.path is None else f"resume_from={str(saved.path)!r}"
        warn_of_changes(self, state)
        try:
            self.optimizer.load_state_dict(saved.optimizer_state)
        except (KeyError, ValueError) as err:
            raise _checkpoint.CheckpointError(
                f"{where}: its optimizer state does not fit this fit()'s "
                f"{optimizer_name(self.optimizer)} ({err!r}): "
                "the parameters to optimise differ from the run's (a guide or model built "
                "otherwise) or the optimizer does. Resume with the run's model, guide and "
                "optim."
            ) from None
        self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.history = [EpochRecord(**record) for record in state["history"]]
        self.steps = int(state["steps"])
        self.first_epoch = int(state["epochs_done"]) + 1
        self.skip = int(state["epoch_steps"])
        if self.skip:
            sums = state["sums"].clone().double()  # 3 sums before train_acc was counted
            self.sums = torch.cat([sums, torch.zeros(_SUMS - len(sums), dtype=torch.float64)])
        restore_rng_states(state["rng"], self.loader)

    def result(self) -> FitResult:
        return FitResult(
            history=tuple(self.history),
            num_data=self.num_data,
            kl_weight=self.elbo.kl_weight,
            num_particles=self.elbo.num_particles,
            steps=self.steps,
            _weighs_kl=self.guide is not None,  # (no guide: the NLL alone)
        )

    def call_back(self, record: EpochRecord) -> None:
        """Run the callbacks on an epoch's record, with the random state (torch's, numpy's,
        Python's and the training loader's; a callback's own seeding too) put back afterwards,
        and the modules' modes when they leave the model in eval mode: a callback that draws
        (predict() to monitor the run), evaluates or reads the training loader changes nothing
        of the training, which stays the run a checkpoint written before the callbacks resumes
        exactly. Under ranks, a pyrouq training loader serves its whole data set to the
        callbacks, not the rank's shard. An error a callback raises is noted with where fit()
        stopped."""
        if not self.callbacks:
            return
        loader_state = loader_rng_state(self.loader)
        kept = modes(self.model) + modes(self.guide)
        try:
            with global_streams_kept(self.device), whole_data(self.loader):
                for callback in self.callbacks:
                    try:
                        callback(record)
                    except Exception as err:
                        if hasattr(err, "add_note"):  # Python >= 3.11
                            err.add_note(callback_note(callback, record.epoch, self.checkpoint))
                        raise
            guide = self.guide if isinstance(self.guide, nn.Module) else self.model
            if not (self.model.training and guide.training):  # an evaluation: trains on as it was
                restore_modes(kept)
        finally:
            if loader_state is not None:
                set_loader_rng_state(self.loader, loader_state)

    def save(self, epochs_done: int, epoch_steps: int, rng: dict[str, Any]) -> Any:
        if not self.group.leader:  # rank 0 writes; the others know where
            return self.checkpoint
        state = training_state(
            epochs=self.epochs,
            epochs_done=epochs_done,
            epoch_steps=epoch_steps,
            steps=self.steps,
            sums=self.sums,
            history=self.history,
            base_lrs=self.base_lrs,
            rng=rng,
            optimizer=optimizer_name(self.optimizer),
            kl_weight=self.elbo.kl_weight,
            batches_per_epoch=self.per_epoch,  # (the schedule's, as planned)
            batch_size=loader_batch_size(self.loader) or 0,  # (0: the loader tells none)
            lr_schedule=self.lr_schedule,
            num_particles=self.elbo.num_particles,
            vectorize_particles=bool(getattr(self.elbo, "vectorize_particles", False)),
            num_data=self.num_data,
            world=self.group.world,
        )
        return _checkpoint.save_run(  # (its state made of Python's values: not walked again)
            self.checkpoint,
            self.model,
            self.guide,
            self.optimizer,
            self.metadata,
            state,
            check_training=False,
        )

    def step(
        self, x: torch.Tensor, y: torch.Tensor, epoch: int, step: int, interrupt: InterruptFlag
    ) -> tuple[torch.Tensor, bool]:
        """One optimizer step on ``(x, y)``; returns its loss, NLL, KL and ``[correct,
        counted]`` on the CPU, read in one transfer before the update (on a GPU the update's
        kernels then run while the next batch is prepared), and, under ranks, whether any rank
        was interrupted (Ctrl-C: ``interrupt.requested``) as it entered the step's collective,
        which carries it (a request its forward or backward pass saw too: read at the
        collective, not as the step began; read as the step began, it stopped the ranks a step
        later than one process)."""
        if self.scheduled:
            for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
                group["lr"] = base * self.lr_factor(self.steps)
        self.optimizer.zero_grad(set_to_none=True)
        self.keep_statistics()  # what a refused step's forward pass updated is put back
        try:
            if self.plain:
                terms = plain_terms(self.model, x, y, self.num_data)
                terms.loss.backward()
                loss, walked = terms.loss.detach(), self.walked
                check_float16_gradients([self.model], loss, terms.outputs, walked)
            else:
                terms = self.elbo.terms_and_grads(self.model, self.guide_fn, x, y)
        except Exception as err:  # before the step's collective: the other ranks wait in it
            self.put_back_statistics()
            if (note := anomaly_note(err, epoch, step)) and hasattr(err, "add_note"):
                err.add_note(note)  # (Python >= 3.11)
            self.stop_with_the_ranks(err)
        if self.walked is None:
            self.hold_registered()
        stopped = _distributed.average_gradients(
            self.params, self.group, terms.loss, interrupt.requested
        )
        parts = torch.stack([terms.loss.detach(), terms.nll, terms.kl])
        parts = parts.to(torch.promote_types(parts.dtype, torch.float32))
        hits = step_hits(self.likelihood, terms.outputs, y).to(parts.dtype)
        shared = stopped.reshape(1).to(parts.dtype)
        advice = self.floor_advice(terms.outputs)  # "" but for a floor too small: then the
        grads = [p.grad for p in self.params if p.grad is not None] if advice else []  # are
        finite = [torch.stack([g.isfinite().all() for g in grads]).all()] if grads else []
        ok = [f.reshape(1).to(parts.dtype) for f in finite]  # checked for overflow too
        row = torch.cat([parts, hits, *ok, shared]).cpu().double()  # one host transfer
        row, everywhere, overflowed = row[: -1 - len(ok)], float(row[-1]), bool(ok) and not row[-2]
        if overflowed or not math.isfinite(float(row[0])):
            self.optimizer.zero_grad(set_to_none=True)
            self.put_back_statistics()
            self.share_statistics()
            active = self.group.active
            averaged = " (the statistics averaged over the ranks)" if active else ""
            where = f" on rank {self.group.rank} of {self.group.world}" if active else ""
            what = f"Non-finite loss ({float(row[0])})"
            if math.isfinite(float(row[0])):  # the gradients overflowed at the noise floor
                what = f"Non-finite gradients (the loss is finite, {float(row[0]):.6g})"
            weight = 0.0 if self.plain else self.elbo.kl_weight
            figures = (float(row[0]), float(row[1]), float(row[2]), weight, terms.loss.dtype)
            message = (
                f"{what}{where} at epoch {epoch}, step {step}; training stopped and the "
                f"parameters and normalisation statistics of the last finite step are kept"
                f"{averaged}. {loss_fix(*figures)}{advice}{learned_noise_advice(self.likelihood)}"
            )
            if (overflow := kl_overflow(*figures)) is not None:  # its figures, as attributes
                raise KLOverflowError(message, overflow)
            raise FloatingPointError(message)
        if not math.isfinite(everywhere):
            self.optimizer.zero_grad(set_to_none=True)
            self.put_back_statistics()
            self.share_statistics()
            raise FloatingPointError(
                f"Another rank stopped at epoch {epoch}, step {step} (a non-finite loss, a batch "
                "its input checks refused or an error in its step: its error says which); "
                "training stopped on every rank, and the parameters and normalisation "
                "statistics of the last finite step are kept (the statistics averaged over the "
                "ranks, as at an epoch's end)."
            )
        self.optimizer.step()
        self.steps += 1
        return row, self.shares_steps and everywhere > 0

    def hold_registered(self, walk: bool = True) -> None:
        """After an epoch's first step, which registered the parameters of the model and the
        guide in Pyro's param store, the ELBO's later steps of the epoch neither register them
        again (they find them there: between steps only the loader's code and the network's
        run, no callback) nor walk the modules for them; ``walk=False``, at an epoch's start
        and the run's end: registered and walked at the next step (a callback may have loaded
        the store, given the modules new parameters)."""
        self.walked = None
        if walk:
            modules = (self.model, self.guide_fn)
            self.walked = [p for m in modules if isinstance(m, nn.Module) for p in m.parameters()]
        self.elbo._registered = self.walked

    def floor_advice(self, outputs: torch.Tensor | None) -> str:
        """The non-finite-loss error's sentence on a heteroscedastic Gaussian's noise floor
        too small for the dtype (the outputs', else the parameters'); "" for other models."""
        if self.advice is None:  # worked out at the first step: the run's dtypes stay
            floats = [p.dtype for p in self.params if p.is_floating_point()]
            dtype = outputs.dtype if outputs is not None else (floats or [torch.float32])[0]
            self.advice = floor_advice(self.likelihood, dtype)
        return self.advice

    def keep_statistics(self) -> None:
        """Copy the normalisation layers' running statistics before a step (once a lazy
        layer's have been made by a first forward pass: before it, none are kept)."""
        if not self.statistics:
            return
        if self.kept is None:
            if not any(nn.parameter.is_lazy(t) for t in self.statistics):
                self.kept = [t.detach().clone() for t in self.statistics]
            return
        with torch.no_grad():
            torch._foreach_copy_(self.kept, self.statistics)

    def put_back_statistics(self) -> None:
        """The normalisation layers' running statistics as they were before the step being
        refused (its forward pass updated them)."""
        if self.kept is not None:
            with torch.no_grad():
                torch._foreach_copy_(self.statistics, self.kept)

    def share_statistics(self) -> None:
        """At a step refused on some rank, which every rank has learnt from the step's gradient
        ``all_reduce``: replace the floating buffers (the running statistics of the last finite
        step, each rank's of its own shard) by their means over the ranks, as at an epoch's end,
        so that every rank stops with the same model. Every rank stopping calls it, at the same
        step (the stop's collectives after the gradient one); without ranks or parameters (no
        gradient ``all_reduce``, nothing to stop together) nothing is done."""
        if self.group.active and self.params:
            modules = [m for m in (self.model, self.guide) if isinstance(m, nn.Module)]
            _distributed.average_buffers(modules, self.group)

    def stop_with_the_ranks(self, error: Exception) -> NoReturn:
        """Raise ``error`` (a batch this rank refuses, or a failure of its forward or backward
        pass) after taking part in the step's gradient ``all_reduce`` with a non-finite loss:
        the other ranks then stop at the same step (:meth:`step`) instead of waiting for this
        one; then the running statistics are averaged over the ranks with theirs
        (:meth:`share_statistics`)."""
        if self.group.active and self.params:
            self.optimizer.zero_grad(set_to_none=True)
            _distributed.average_gradients(self.params, self.group, torch.tensor(math.nan))
            self.optimizer.zero_grad(set_to_none=True)
            self.share_statistics()
        raise error

    def typed_by(self) -> Any:
        """Whose dtype the inputs are cast to (:func:`pyrouq._input_cast.typed_by`), asked once
        it holds a floating parameter (the model, or a guide built before the first step): not
        asked again at every step, where the model's dtype is read a second time."""
        if self.cast_to is None:
            by = typed_by(self.model, self.guide)
            if module_dtype(by) is None:
                return by
            self.cast_to = by
        return self.cast_to

    def run(self, progress: bool) -> FitResult:
        bar = None
        if progress:
            from pyrouq._progress import tqdm

            total = self.epochs * self.per_epoch or None  # (a loader without a length: none)
            bar = tqdm(total=total, initial=self.steps, leave=False, unit="step")
        epoch, batches, finished = self.first_epoch, self.skip, 0
        mid_step = False  # a step under way: a second Ctrl-C there leaves it half done
        loader_state = loader_rng_state(self.loader)
        at_start = rng_states(self.loader, loader_state)  # an epoch's, before its first batch
        train_for_fit(self.model, self.held)  # in training mode, the modes the user set stay
        try:
            with (
                pyro.validation_enabled(False),
                InterruptFlag() as interrupt,
                _engine.reuse_freed_memory(self.device),
            ):
                for epoch in range(self.first_epoch, self.epochs + 1):
                    start = time.perf_counter()
                    loader_state = loader_rng_state(self.loader)
                    at_start = rng_states(self.loader, loader_state)
                    _distributed.set_epoch(self.loader, epoch)
                    self.hold_registered(walk=False)
                    skip = self.skip if epoch == self.first_epoch else 0
                    batches = skip
                    if not skip:
                        self.sums = torch.zeros(_SUMS, dtype=torch.float64)
                    batches_left = resumed_batches(self.loader, skip, self.stop_with_the_ranks)
                    for step, batch in enumerate(batches_left, start=skip + 1):
                        try:
                            x, y = unpack_batch(batch, epoch, step)
                            if self.check_batches:
                                check_batch(x, y, epoch, step, self.likelihood, self.num_classes)
                            refuse_batch_above_n(y, self.num_data, self.loader, epoch, step)
                            x = model_input(  # (a model without parameters: its guide's dtype)
                                x.to(self.device, non_blocking=True), self.typed_by(), "fit()"
                            )
                        except (ValueError, TypeError) as err:
                            self.stop_with_the_ranks(err)
                        y = y.to(self.device, non_blocking=True)
                        if x.is_inference() or y.is_inference():  # (features computed under
                            x, y = x.clone(), y.clone()  # inference_mode: autograd refuses them)
                        mid_step = True
                        # the run's first step: an epoch's last batch of one is told now, where
                        # the loader's sizes say it comes and a BatchNorm would refuse it
                        first = step == skip + 1 and epoch == self.first_epoch
                        rows = x.shape[0] if first else 0
                        nets = (self.model, self.guide)
                        try:
                            with last_batch_watched(nets, self.loader, self.group.world, rows):
                                row, asked = self.step(x, y, epoch, step, interrupt)
                        except LastBatchOfOne as one:  # (nothing updated: the step refused)
                            raise one_value_in_training(
                                x[:1], epoch, one.step, self.loader
                            ) from None
                        except ValueError as err:
                            if not str(err).startswith(ONE_VALUE_PER_CHANNEL):
                                raise
                            raise one_value_in_training(
                                x, epoch, step, self.loader, self.group.world
                            ) from None
                        batches += 1
                        self.sums += row
                        mid_step = False
                        if bar is not None:
                            bar.update(1)
                            if step % 10 == 0:
                                bar.set_description(f"epoch {epoch}/{self.epochs}")
                                bar.set_postfix(loss=f"{self.sums[0].item() / batches:.4g}")
                        # under ranks, as the step's collective told every rank: all stop
                        # after the same step (a later Ctrl-C rides on the next step's)
                        if asked if self.shares_steps else interrupt.requested:
                            raise KeyboardInterrupt
                    if batches == 0:
                        raise ValueError(no_batches_message(self.loader, self.group.world, epoch))
                    if self.scheduled and not (skip or self.told) and batches != self.per_epoch:
                        plan = (self.per_epoch, epoch, self.epochs, self.lr_schedule, self.loader)
                        self.told = warn_of_a_wrong_length(batches, *plan)  # (once a run)
                    modules = [m for m in (self.model, self.guide) if isinstance(m, nn.Module)]
                    _distributed.average_buffers(modules, self.group)
                    correct, counted = self.sums[3:].tolist()
                    accuracy = self.sums.new_tensor([correct / counted if counted else math.nan])
                    per_rank = torch.cat([self.sums[:3] / batches, accuracy])
                    means, seconds = _distributed.epoch_figures(
                        per_rank.double(), time.perf_counter() - start, self.group
                    )
                    record = EpochRecord(
                        epoch=epoch,
                        loss=means[0],
                        nll=means[1],
                        kl=means[2],
                        train_acc=means[3],
                        seconds=seconds,
                    )
                    self.history.append(record)
                    finished, batches = batches, 0
                    # rank 0 alone writes, a callback may fail or stop the run (Ctrl-C too) on
                    # one rank: all stop with it, in one collective each epoch (not the next step's)
                    with _distributed.together(self.group, _EPOCH_END.format(epoch=epoch)):
                        if self.checkpoint is not None:
                            self.save(
                                epoch, 0, rng_states(self.loader, loader_rng_state(self.loader))
                            )
                        self.call_back(record)
                        if interrupt.requested:
                            raise KeyboardInterrupt
                    # during the collective; under ranks, the next step's carries it
                    if interrupt.requested and not self.shares_steps:
                        raise KeyboardInterrupt
        except KeyboardInterrupt:
            if mid_step:
                # a second Ctrl-C inside a step (weights drawn, some statistics or parameters
                # updated): no exact state to resume from; the last epoch's checkpoint stays
                self.model.eval()
                raise
            # Between steps (a callback, or Ctrl-C seen by InterruptFlag): the parameters are
            # those of the last completed step; `batches` counts this epoch's completed steps,
            # `finished` those of the epoch just completed (interrupted at its end).
            done = len(self.history)
            partial = batches if done < epoch else 0
            saved = None
            if self.checkpoint is not None:
                if partial:  # inside an epoch: its loader's start state, the steps' draws
                    rng = rng_states(self.loader, loader_state)
                elif done < epoch:  # before its first step (a loader stopped in its first
                    rng = at_start  # fetch, which drew the epoch's order): as it started
                else:  # at an epoch's end
                    rng = rng_states(self.loader, loader_rng_state(self.loader))
                saved = self.save(done, partial, rng)
            self.model.eval()
            last = partial if done < epoch else finished
            raise TrainingInterrupted(self.result(), saved, epoch, last) from None
        finally:
            self.hold_registered(walk=False)
            if bar is not None:
                bar.close()
            batches_left = None  # type: ignore[assignment]  # a kept traceback: no live workers
            self.model.eval()  # as documented, whatever ended the run
        return self.result()


_EPOCH_END = "writing the checkpoint or running a callback at the end of epoch {epoch}"
