"""``fit()``: checks its arguments, sets up the model, guide, optimizer and resume state, and
runs the training loop.

The objective is :class:`~pyrouq.KLWeightedELBO`; the loop itself (epochs, schedule, records,
checkpoints, Ctrl-C) is :mod:`pyrouq.infer._loop`; what both need besides (input checks,
interruption, resume state) lives in :mod:`pyrouq.infer._training`, and fit()'s own checks of
its numbers and its loader in :mod:`pyrouq.infer._fit_inputs`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import pyro
import torch
from torch import nn

from pyrouq import _engine
from pyrouq._default_device import cpu_default
from pyrouq._meta_device import real_device
from pyrouq._util import (
    check_flag,
    check_seed,
    has_latent_sites,
    len_or,
    module_device,
)
from pyrouq._wrappers import given_model
from pyrouq.checkpoint._checks import check_store_params, note_store_params
from pyrouq.checkpoint._resume import restore
from pyrouq.infer import _distributed, _rank_optimizers
from pyrouq.infer._checkpoint_refusals import (
    check_checkpoint,
    refuse_checkpoint,
    warn_of_an_interrupted_run,
)
from pyrouq.infer._elbo_checks import refuse_handlers_around
from pyrouq.infer._fit_inputs import (
    DEFAULT_LR,
    ReadAhead,
    check_loader_kind,
    check_paths,
    check_settings,
    refuse_inference_tensors,
    warn_lr_beside_optim,
)
from pyrouq.infer._fit_result import EpochRecord, FitResult
from pyrouq.infer._loop import Loop
from pyrouq.infer._num_data import counted_num_data_note, training_size
from pyrouq.infer._options import (
    LR_SCHEDULES,
    build_optimizer,
    check_callbacks,
    check_lr_schedule,
)
from pyrouq.infer._own_targets import OwnTargets
from pyrouq.infer._probe import Probe, is_pyrouq_model
from pyrouq.infer._rank_state import check_same_resume, compared_parameters
from pyrouq.infer._site_checks import check_drawable
from pyrouq.infer._sync_norm import check_sync_batchnorm
from pyrouq.infer._training import (
    TrainingInterrupted,
    check_loader_inputs,
    optimizer_name,
)
from pyrouq.infer.elbo import KLWeightedELBO
from pyrouq.infer.guide import check_guide
from pyrouq.likelihoods import Categorical, likelihood_of

__all__ = [
    "DEFAULT_KL_WEIGHT",
    "EpochRecord",
    "FitResult",
    "LRSchedule",
    "TrainingInterrupted",
    "fit",
]

LRSchedule = Literal["warmup_cosine", "cosine", "constant"]

_SET_UP = "fit()'s set-up, before training: an argument, its data, its model or resume_from"
"""What failed, as the other ranks' error names a failure in one rank's set-up."""

DEFAULT_KL_WEIGHT = Categorical.default_kl_weight
"""Default ``kl_weight`` of :func:`fit` for models without a pyrouq likelihood: the
classifiers' (``Categorical``'s), a tempered posterior (see ``fit``'s docstring)."""


def default_kl_weight(model: Any) -> float:
    """The ``kl_weight`` :func:`fit` uses for ``model`` when none is given: the model's own
    ``default_kl_weight`` (1.0 for a rank-1 network), else its likelihood's, else
    :data:`DEFAULT_KL_WEIGHT`."""
    own = getattr(model, "default_kl_weight", None)
    if own is not None:
        return float(own)
    likelihood = likelihood_of(model)
    return float(getattr(likelihood, "default_kl_weight", DEFAULT_KL_WEIGHT))


def fit(
    model: nn.Module,
    guide: nn.Module | Callable | None,
    train_loader: Iterable,
    *,
    epochs: int,
    lr: float = DEFAULT_LR,
    optim: Callable[[list[nn.Parameter]], Any] | None = None,
    lr_schedule: LRSchedule = "warmup_cosine",
    kl_weight: float | None = None,
    num_particles: int = 1,
    vectorize_particles: bool = False,
    num_data: int | None = None,
    progress: bool = True,
    seed: int | None = None,
    callbacks: Sequence[Callable[[EpochRecord], Any]] = (),
    checkpoint: str | os.PathLike[str] | None = None,
    resume_from: Any = None,
    metadata: dict[str, Any] | None = None,
    check_inputs: bool = True,
    distributed_draws: Literal["independent", "identical"] = "independent",
) -> FitResult:
    """Fit a pyrouq model by stochastic variational inference.

    Minimises :class:`KLWeightedELBO` with an optimizer (Adam by default) over the
    parameters of the guide and the model (BatchEnsemble models hold theirs), with Pyro's
    validation off in the loop.

    Parameters
    ----------
    model : PyroModule or nn.Module
        A model following the pyrouq contract (made by :func:`pyrouq.bayesian` or
        :func:`pyrouq.batchensemble`, ``BayesianLeNet``, ``BatchEnsembleMLP``, ...; its point
        estimates, e.g. BatchNorm parameters, are trained too, and so are the parameters its
        network creates with ``pyro.param``, as Pyro's SVI trains them, though
        :func:`pyrouq.save` refuses those) or any Pyro model written as a
        ``PyroModule`` with ``forward(x, y)`` (a model written as a function is refused: fit()
        sets ``model.num_data`` and switches train / eval modes; train it with Pyro's own
        ``SVI``, or wrap it in a ``PyroModule``). Its ``num_data`` is set to N. It trains in
        training mode: a model already in it keeps the modes of its submodules (a BatchNorm
        put in eval mode to keep its statistics stays so), one in eval mode is switched to
        training mode throughout; it is left in eval mode. So a second fit() trains the layers
        the first kept frozen, with a warning naming them: call ``model.train()``, then
        ``layer.eval()``, before it to keep them frozen. A converted model starts in
        training mode throughout (whatever modes the network had): freeze a layer after
        converting, ``model.net.bn.eval()``. A plain torch
        network returning logits (``MLP``, ``LeNet``; ``guide=None``) is fitted by maximum
        likelihood,
        ``loss = -(N/B) sum_batch log p(y | x)``, with the same optimizer and schedule. A model
        in ``DistributedDataParallel`` (a pyrouq model in ``DataParallel`` too) is trained as
        the module it wraps (fit() averages the gradients itself). A ``torch.compile`` d model
        (a BatchEnsemble too) trains compiled; ``torch.compile(DDP(model))``, of a pyrouq model
        or a plain network, as ``model`` compiled with the same settings (a pyrouq model's
        ``torch.compile(DataParallel(model))`` too; a plain network's is run as it is).
    guide : nn.Module or callable or None
        The variational distribution (``mean_field_guide(model)``, or a Pyro autoguide such as
        ``AutoNormal(model)``, whose lazily created parameters are set up on the first batch
        before the optimizer is built); ``None`` for models without latent sites
        (BatchEnsemble), where the loss is the negative log-likelihood. A guide built for
        another model (other sites or shapes) is refused before anything is trained. A guide
        in ``DistributedDataParallel`` is trained as the module it wraps.
    train_loader : iterable of (x, y)
        Training batches, e.g. from :func:`pyrouq.load_mnist` (a dataset of single examples,
        or one ``(x, y)`` pair, is refused: batch it; so are batches of examples left as they
        came, ``collate_fn=lambda b: b``, an empty batch, an empty list, and a str, bytes or
        dict, which iterate characters, ints and keys). Floating inputs
        of another dtype are cast to the model's (a Pyro model without parameters of its own:
        to its guide's; an autoguide not built yet has none but that of its values loaded into
        Pyro's param store to resume a run, and inputs of another dtype than the priors' are
        refused, as are those of a guide written as a function, whose dtype it cannot read, of
        another dtype than its draws; a Pyro model whose parameters are of another dtype than
        the draws of its guide or of its ``PyroSample`` priors, which ``model.to()`` leaves as
        they are, is refused naming both); integer ones (raw uint8 pixels) are refused,
        see :func:`pyrouq.data.normalize`, unless the network holds an ``nn.Embedding`` (ids, not
        bool). Batches that require grad are detached: no gradient flows into data. fit()
        computes its gradients whatever the caller's grad mode: called under
        ``torch.no_grad()``, ``torch.inference_mode()`` or ``torch.set_grad_enabled(False)``,
        it trains as it does outside them (as :func:`pyrouq.mcmc` does).
    epochs : int
        Passes over ``train_loader`` (>= 1). Training starts from the model's and guide's
        values: fit() on a fitted model trains on from them with a new optimizer and schedule
        (``resume_from`` continues a saved run as it was).
    lr : float, default 2e-2
        Learning rate of the default Adam optimizer (none of ``optim=``'s: passed beside it,
        it is warned of): ``torch.optim.Adam``'s update, step for
        step, in pyrouq's own class (every ``torch.optim`` optimizer imports ``torch._dynamo``
        when it is built: about 2 s, once per process); on CPU in torch's fused kernel, so
        ``torch.optim.Adam(fused=True)``'s numbers to the bit and ``torch.optim.Adam()``'s to
        float rounding; float16/bfloat16 parameters keep their moments in float32, each update
        rounded once into them. Its state dict has ``torch.optim.Adam``'s layout.
    optim : callable, optional
        ``params -> torch.optim.Optimizer`` (e.g. ``lambda p: torch.optim.AdamW(p, 1e-3)``)
        replacing the default Adam, with the learning rates it gives (an ``lr`` passed beside
        it has no effect and is warned of; ``lr_schedule`` multiplies the optimizer's own
        learning rates). A built optimizer, a Pyro optimizer or scheduler
        (``pyro.optim.Adam``, ``ClippedAdam``, ``ExponentialLR``, made or not: they are for
        ``SVI``; ``pyro.optim.clipped_adam.ClippedAdam`` is a torch optimizer) or a function
        returning something else is refused; so is an optimizer holding none of the
        parameters it is given (one leaving some out is warned of: freeze those instead), one
        whose ``step()`` needs a closure (LBFGS), and, unless ``lr_schedule="constant"``, one
        without an ``lr``.
    lr_schedule : {"warmup_cosine", "cosine", "constant"}, default "warmup_cosine"
        Multiplies every learning rate of the optimizer, over the ``epochs *
        len(train_loader)`` steps of the run: ``"warmup_cosine"`` ramps it linearly over the first
        w = 20 % of the steps (rounded down: none in runs under 5 steps), from 1/w of its
        value at the first step to its value at the w-th, then decays it along a half cosine
        from that value (at the next step too) towards 0, which it would reach one step after
        the last (a one-cycle policy: short
        runs converge much further, see the benchmarks);
        ``"cosine"`` decays from the start; ``"constant"`` leaves it alone. An epoch serving
        another number of batches than ``len(train_loader)`` is warned of.
    kl_weight : float, optional
        Weight of the KL term (1 = the exact ELBO; see :class:`KLWeightedELBO`; a model
        without latent sites has none: another value than the default is warned of), one for
        the whole run: for a schedule (KL annealing), train with ``pyro.infer.SVI`` and a
        :class:`KLWeightedELBO`, setting its ``kl_weight`` between steps. By default
        the likelihood's ``default_kl_weight``: 0.02 for classifiers (``Categorical``, and
        Pyro models of one's own observing integer labels), 1.0 for regression (``Gaussian``,
        and Pyro models of one's own observing real-valued targets). For
        classifiers it tempers the posterior ("cold posterior"): under the exact ELBO a
        mean-field guide over-prunes networks whose weights outnumber the training examples (a
        residual CNN with BatchNorm on Fashion-MNIST: 88.8 % accuracy against 91.0 % for the
        plain network, the deep layers' weights drowned in noise). On that network (3 epochs,
        seeds 0 and 1) 0.02 beat the plain network's NLL at both seeds (0.2436 and 0.2381
        against 0.2489 and 0.2393) with ECE <= 1 %, where 0.1 lost to it at both (0.2537,
        0.2473); LeNet on MNIST is as good with either. It does not beat the plain network
        as a rule: over 9 (network, seed) pairs on Fashion-MNIST it was ahead at 5 and behind
        at 4, by at most 0.012 either way, and over 15 on a GPU ahead at 4, on average 0.003
        behind (the docs' KL-weight page). Curated classification
        labels are what a tempered likelihood describes (Aitchison, 2021, "A statistical theory
        of cold posteriors"); regression targets are not curated, and there the exact ELBO gives
        the posterior that the regression tests check against the exact one. Pass
        ``kl_weight=1.0`` for the Bayesian posterior of any model as written (the docs'
        KL-weight page). A rank-1 network (:func:`pyrouq.rank1`) defaults to 1.0: its few
        latent factors do not over-prune. On LeNet (AMD EPYC, seeds 0 and 1) it improved on
        the BatchEnsemble's NLL, ECE and OOD AUROC, which 0.1 did not; on an Intel Xeon
        (seeds 0-4) rank-1's NLL was lower at 3 of 5 seeds and its ECE at all 5 (see the
        KL-weight page and the docs' measured figures).
    num_particles : int, default 1
        Draws from the guide per step. Each particle's training-mode pass updates BatchNorm
        running statistics, as P forward passes in torch do (P updates a step).
    vectorize_particles : bool, default False
        Draw every particle's weights at once, site by site as under a particle plate,
        rather than one particle after another. The particles then run as one batched pass
        on accelerators; on CPU, where oneDNN runs batched (grouped) convolutions slower
        than separate ones, each particle's forward and backward pass runs in turn (see
        :meth:`KLWeightedELBO.terms_and_grads`). Each draw's loss and gradient are computed
        alike either way, so the gradient has the same expectation, but the draws are taken
        from the random stream in another order: a seeded run gives other draws, hence
        another run, under the other setting.
    num_data : int, optional
        Training-set size N; default ``len(train_loader.dataset)`` (the number of indices of
        a ``SubsetRandomSampler``), else the ``num_data`` the model was built with
        (``bayesian(net, num_data=N)``), else the N of the run ``resume_from`` holds: a loader
        without a sized ``.dataset``, such as a list of batches, needs one of these. An N below
        the size of a dataset drawn from whole (torch's samplers) is warned of; a batch of more
        than N examples (N/B < 1) is refused, except from a sampler drawing with replacement.
    progress : bool, default True
        Show a tqdm progress bar (epoch, step, running loss).
    seed : int, optional
        Seeds torch, numpy and Python's ``random`` (as ``pyro.set_rng_seed``; not put back
        afterwards) before training, so a run repeats exactly from the model, guide and loader
        it is given (what they drew when built, a network's initial weights or the factors
        ``batchensemble()`` draws, follows the seed set before building them: call
        ``torch.manual_seed`` first for a run that repeats from scratch; a loader with a
        generator of its own, ``ArrayLoader(seed=...)`` or a DataLoader's ``generator=``,
        carries on from where the last run left it, as do a DataLoader's persistent workers:
        build it anew to repeat a run). fit()'s look at the first examples before training
        (counting the classes, making an autoguide's or a lazy layer's parameters) runs the
        network forward on them, and a guide that is a module, in evaluation mode (their modes
        put back after), so what a forward changes (a count of
        calls, an initialisation on its first call) happens there; it draws from a fork of the
        random streams seeded apart from the run's (from ``seed`` and a fixed label, the same
        on every rank; without a seed, from torch's stream, drawing nothing from it): the run
        draws what it would without the look, and the look's draws (an autoguide's or a lazy
        layer's initial values) are none of the run's. A call refused for its arguments seeds
        nothing, save for those checked once its first batch is read (the data, ``optim=``,
        ``resume_from=``, ``distributed_draws=``, a ``checkpoint=`` of a network creating
        parameters with ``pyro.param``): it has seeded by then. Rank r of a process group is
        seeded with ``(seed + r) % 2**32``: its own weight draws; without a
        seed, each rank seeds ``offset + r``, ``offset`` drawn from its generator. When fit()
        ends (or stops), the ranks' streams are seeded alike again, from a number drawn before
        they parted: a model built after it is built alike on every rank, as in one process,
        where the stream carries on. On a CUDA
        device a seeded (or resumed) run also keeps cuDNN to its deterministic kernels while it
        trains (``torch.backends.cudnn.deterministic``, no ``benchmark`` autotuning; put back
        afterwards): cuDNN's default convolution gradients add in a varying order, and two
        seeded runs of a convolutional network would drift apart in the last bits. That covers
        pyrouq's layers and common networks; a few other CUDA ops (``nn.Embedding``'s and
        bilinear ``interpolate``'s gradients, ``scatter_add_``, ...) repeat exactly only under
        ``torch.use_deterministic_algorithms(True)``, yours to set. On the CPU a run repeats
        with the same number of torch threads (``torch.get_num_threads()``): torch splits a
        convolution's weight gradient among them, a linear layer's for some shapes and any
        sum of more than 32,768 values, in another order for another number, so an MLP's
        run ends in other last bits too.
    callbacks : sequence of callables
        Each is called as ``callback(record)`` after every epoch (after the epoch's checkpoint
        is written). A callback may raise ``KeyboardInterrupt`` to stop the run (handled as
        Ctrl-C, below); any other error it raises stops fit() with that error (the model and
        guide keep the epoch's parameters). The random state, torch's, numpy's, Python's and
        the training loader's, is put back after the callbacks, and so are the modules' modes
        when they leave the model or the guide in eval mode, so one that draws (``predict()``
        to monitor the run), evaluates (``model.eval()``) or reads the training loader leaves
        the training as it would be without it (to freeze a layer, put it alone in eval mode).
        Under data-parallel training a callback that raises on one rank stops every rank (one
        that raises ``KeyboardInterrupt`` with ``TrainingInterrupted`` on every rank), and a
        pyrouq training loader serves the callbacks its whole data set, not the rank's shard.
    checkpoint : str or PathLike, optional
        Write a checkpoint (:func:`pyrouq.save` format, with the optimizer and the resume state)
        to this file after every epoch and when the run is interrupted. A model, guide or
        metadata :func:`pyrouq.save` would refuse (see its Raises) is refused before training.
        A file there holding an interrupted run is warned of before training, once the
        arguments (and the ranks, under torch.distributed) are checked, unless ``resume_from``
        is that file (which continues it): this run, started afresh (no ``resume_from``) or
        resuming another file, writes over it (a finished run is not warned of).
    resume_from : str, PathLike or Checkpoint, optional
        Continue the run saved there: the model and guide get its parameters, the optimizer its
        state, and the epoch count, learning-rate schedule, loss history and random-number
        states (torch's, numpy's, Python's) carry on, so an interrupted run resumed with the
        same arguments (``epochs`` is the run's total) ends with the same parameters and history
        as one that was never stopped. Exact for pyrouq's in-memory loaders and DataLoaders
        given a ``generator`` (the DataLoader's or its sampler's: its state is stored), datasets
        drawing their augmentations from those streams included (not with
        ``persistent_workers``, nor for augmentations drawn in worker processes when only the
        sampler has the generator), and for other DataLoaders resumed at an epoch boundary; the
        model must be built with the same arguments and priors (checked), another ``lr`` than
        the run's is ignored with a warning, and another ``kl_weight``, ``lr_schedule``,
        ``num_particles``, ``num_data``, batches per epoch, batch size (a loader's or its
        batch sampler's ``batch_size``) or (for an interrupted run) ``epochs`` is warned of, as
        it changes the run from there. A finished run trained on for more ``epochs`` has its
        schedule planned anew over them: a warm-up or cosine schedule's learning rate, near 0
        at the run's end, rises again (warned of, with how to train on at a flat one).
        Under torch.distributed a resumed run is repeatable but not the one never stopped: the
        checkpoint holds rank 0's random state, from which each rank derives its own stream
        (see "Scaling out"). A run resumed on another number of ranks than it trained on
        (one process counting as one) is warned of: its epochs are split into other shards
        (pyrouq's loaders serve each step the run's examples at a batch size the warning names).
    metadata : dict, optional
        JSON values stored in the checkpoints (string keys, lists rather than tuples); a
        resumed run keeps its checkpoint's when none is given.
    distributed_draws : {"independent", "identical"}, default "independent"
        Under torch.distributed (a process group initialised, e.g. by torchrun): each rank
        draws its own weights (a particle per rank), or every rank the same ones (needs
        ``seed``; the check that the averaged gradient equals one process's). See the docs'
        "Scaling out" page: each rank trains on its shard of every epoch, gradients are
        averaged after each step and BatchNorm's running statistics after each epoch (and
        when a refused step stops every rank), rank 0 alone shows progress and writes
        ``checkpoint``.
    check_inputs : bool, default True
        Refuse NaN/inf inputs and labels outside ``[0, C)``: for in-memory loaders
        (``TensorLoader``, ``TensorDataset``) before training starts, naming the examples;
        for any other loader batch by batch, before the step on that batch.

    Returns
    -------
    FitResult

    Raises
    ------
    FloatingPointError
        When the loss turns non-finite; the parameters and the normalisation layers' running
        statistics of the last finite step are kept (also when a step's forward pass fails;
        under torch.distributed, on every rank, with the statistics averaged over the ranks).
        Where the NLL and the KL are finite and the KL term, ``kl_weight * KL``, overflowed the
        loss's dtype, the error says so and asks for a smaller ``kl_weight``; it is then a
        ``FloatingPointError`` subclass whose ``overflow`` attribute holds those figures
        (``kl_weight``, ``kl``, ``nll``, ``dtype``). Under
        ``torch.autograd.detect_anomaly()`` a NaN in the backward pass raises torch's
        ``RuntimeError`` ("returned nan values") first; fit() adds a note of the same words.
    ValueError
        Bad arguments, NaN/inf inputs or bad labels (see ``check_inputs``), a vectorised
        ``pyro.plate`` around the call of a pyrouq model (which has its own plate ``"data"``: call
        fit() outside it; a sequential plate, or one with a hide-all ``poutine.block()`` inside it,
        is let through), a ``pyro.poutine.trace()`` recording sample sites around the call (each
        step would record the model's sites again; call fit() outside it), a
        ``pyro.poutine.condition()`` fixing a latent site of a pyrouq model around it (or giving it
        None, which Pyro writes over the guide's draw), a ``pyro.poutine.do()`` intervening on one,
        a ``resume_from`` that does not fit the model or holds a training state fit() did not
        write (``CheckpointError``), or a batch of one input that a BatchNorm in training mode
        cannot normalise (an epoch's last batch of one, where an in-memory loader's sizes show
        it, at the first step, before any update). Under torch.distributed, also ranks that
        differ (parameters, models' settings, loaders, arguments, optimizers, the run and point
        resumed from), a failure of another rank's set-up (naming that rank), and
        ``nn.SyncBatchNorm`` layers in training mode in a model on the CPU (torch synchronises
        them on GPUs only): freeze such a layer with ``.eval()`` or build BatchNorm layers.
    TrainingInterrupted
        On Ctrl-C: the first press lets the current step finish, then fit stops with that
        step's parameters, writes ``checkpoint`` if given, and raises this ``KeyboardInterrupt``
        subclass carrying the partial :class:`FitResult`. A second press inside a step raises a
        plain ``KeyboardInterrupt`` at once and writes nothing (``checkpoint`` keeps the last
        epoch's end); one while a batch is being fetched stops as the first press does. Under
        torch.distributed, a first press on any rank stops every rank after the same step (the
        next whose gradient average carries it; rank 0 writes), each raising this.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> import pyrouq
    >>> _ = torch.manual_seed(0)  # the data and the network's initial weights
    >>> x = torch.randn(64, 2)
    >>> y = (x[:, 0] > 0).long()  # two classes, split by the first feature
    >>> model = pyrouq.bayesian(nn.Linear(2, 2))
    >>> guide = pyrouq.mean_field_guide(model)
    >>> train = pyrouq.ArrayLoader(x, y, batch_size=16, seed=0)
    >>> result = pyrouq.fit(model, guide, train, epochs=20, seed=0, progress=False)
    >>> result.num_data, result.steps, result.losses[-1] < result.losses[0] / 2
    (64, 80, True)
    >>> predictions = pyrouq.predict(model, x, guide, num_samples=8, progress=False, seed=0)
    >>> predictions.probs.shape, (predictions.predicted == y).float().mean().item() > 0.9
    (torch.Size([8, 64, 2]), True)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"fit() expects model to be an nn.Module (a pyrouq model, a PyroModule or a plain "
            f"network), got {type(model).__name__}; build it with e.g. bayesian(net). A Pyro "
            "model written as a function: wrap it in a PyroModule whose forward(x, y) calls "
            "it, or train it with pyro.infer.SVI."
        )
    wrapped = model  # (resume_from= of an earlier pyrouq's file holding its DDP wrapper)
    model = given_model(model, keep_compiled=True)  # (DDP: fit() averages the gradients)
    guide = given_model(guide)  # DDP(guide)'s module: its own averaging would come on top
    # a failure on one rank only in the set-up (an argument, its first batch, a checkpoint it
    # cannot read) stops every rank at the block's end in one all_reduce, not in the next one
    early = _distributed.current(module_device(model, guide))
    # gradients whatever the caller's grad mode (a fit() under torch.no_grad() or
    # torch.inference_mode() would otherwise step on no gradients and train nothing), as mcmc()
    with (
        torch.inference_mode(False),
        torch.enable_grad(),
        cpu_default(),
        _distributed.together(early, _SET_UP),
    ):
        real_device("fit()", model, guide)  # (here: on one rank, stops them all)
        refuse_handlers_around(model, "fit()")  # a plate, a trace, a condition: before anything
        epochs, checked_lr = check_settings(epochs, lr, num_particles, kl_weight)
        warn_lr_beside_optim(lr, optim)  # (lr as given: its default is told apart)
        lr = checked_lr
        if seed is not None:
            seed = check_seed(seed, "fit()")
        check_lr_schedule(lr_schedule)
        check_paths(checkpoint, resume_from, metadata)
        check_loader_kind(train_loader)
        vectorize_particles = check_flag("vectorize_particles", vectorize_particles)
        check_inputs = check_flag("check_inputs", check_inputs)
        progress = check_flag("progress", progress)
        chosen_kl_weight, default_weight = kl_weight is not None, default_kl_weight(model)
        if kl_weight is None:
            kl_weight = default_weight
        # pyrouq models nest at most two plates ("members", "data"): no guessing trace needed; a
        # Pyro model of the user's own may nest more, which Pyro finds out (vectorized particles)
        nesting = 2 if is_pyrouq_model(model) or guide is None else float("inf")
        elbo = KLWeightedELBO(
            kl_weight, num_particles, vectorize_particles, max_plate_nesting=nesting
        )
        if guide is None and has_latent_sites(model):
            raise ValueError(
                f"{type(model).__name__} has latent sites but guide is None. Pass "
                "guide=mean_field_guide(model)."
            )
        if guide is not None:
            check_drawable(model, "a guide", "fit()")
        check_guide(model, guide, "fit()")
        refuse_inference_tensors(model, guide)
        check_sync_batchnorm(model, guide, wrapped)  # torch's SyncBatchNorm on the CPU: GPUs only
        if num_particles > 1 and guide is None:
            raise ValueError(
                f"num_particles={num_particles} given for {type(model).__name__}, which has no "
                "latent sites (a BatchEnsemble or a plain network): there is nothing to draw, so "
                "every particle would repeat the same pass. Leave num_particles=1."
            )
        if guide is None and kl_weight != default_weight:  # (the CLI passes the default)
            warnings.warn(
                f"fit(kl_weight={kl_weight}) has no effect on {type(model).__name__}, which has no "
                "latent sites (a BatchEnsemble or a plain network): there is no KL term, the loss "
                "is the negative log-likelihood alone. Leave kl_weight out.",
                stacklevel=2,
            )
        if isinstance(train_loader, Iterator) and epochs > 1:
            raise ValueError(
                f"train_loader is an iterator ({type(train_loader).__name__}), which yields its "
                f"batches once, but epochs={epochs}. Pass something that can be iterated once per "
                "epoch: a list of (x, y) batches, a DataLoader, or pyrouq's loaders."
            )
        if lr_schedule != "constant" and len_or(train_loader, None) is None:
            warnings.warn(
                f"fit(lr_schedule={lr_schedule!r}) plans the learning rate over the run's steps, "
                f"but train_loader ({type(train_loader).__name__}) has no length: the learning "
                "rate stays constant. Pass a loader with a length (a list, "
                "a DataLoader), or lr_schedule='constant'.",
                stacklevel=2,
            )
        if isinstance(train_loader, Iterator):  # fit's probe reads a batch ahead: it is put back
            train_loader = ReadAhead(train_loader, len_or(train_loader, None))
        n = training_size(num_data, train_loader, model, resume_from)
        callbacks = check_callbacks(callbacks)  # a generator is read once, here
        check_checkpoint(checkpoint, metadata, model, guide)  # before an epoch
        if seed is not None:  # after the checks (a refused call leaves the streams alone),
            pyro.set_rng_seed(seed)  # (the probe's pass draws from streams of its own)
        model.num_data = int(n)  # type: ignore[assignment]
        probe = Probe(model, guide, train_loader, seed)
        if is_pyrouq_model(model):  # pyro.params of its network's forward: save() refuses them
            note_store_params(model, probe.network_params)
            if checkpoint is not None:
                refuse_checkpoint(check_store_params, model, "save()")
        own_default = getattr(model, "default_kl_weight", None) is not None
        if not (chosen_kl_weight or own_default) and isinstance(probe.likelihood, OwnTargets):
            elbo.kl_weight = 1.0  # a regression written in Pyro: the exact ELBO, as for Gaussian()
        # in-memory data is checked once here; other loaders batch by batch, before each step
        check_each_batch = check_inputs and not check_loader_inputs(
            train_loader, probe.likelihood, probe.num_classes
        )
        optimizer = build_optimizer(model, guide, probe, optim, lr, lr_schedule)
        resume = None
        if resume_from is not None:
            ours = optimizer_name(optimizer)
            shown = f"{ours} (optim=None: pyrouq's Adam)" if optim is None else ours
            resume = restore(
                resume_from, model, guide, epochs, (ours, shown), optimizer, given=wrapped
            )
        group = _distributed.current(module_device(model, guide))  # a lazy guide's made now
        independent = _distributed.draws_option(distributed_draws, group, seed)
    check_same_resume(resume, group)  # resume_from on rank 0 alone: told as such, first
    _distributed.check_same_model(  # the parameters, then the likelihood, priors, ...
        model, guide, compared_parameters(model, guide, probe), group
    )
    _distributed.check_same_everywhere(
        _distributed.loader_state(train_loader), group, "loaders (their seeds or samplers)"
    )
    _distributed.check_same_arguments(
        {
            "lr": lr,
            "lr_schedule": list(LR_SCHEDULES).index(lr_schedule),
            "kl_weight": elbo.kl_weight,
            "num_particles": elbo.num_particles,
            "vectorize_particles": float(elbo.vectorize_particles and elbo.num_particles > 1),
            "num_data": n,
            "distributed_draws": float(independent),
            "seed": -1 if seed is None or independent else seed,  # identical draws: one seed
        },
        group,
        "Pass the same lr, lr_schedule, kl_weight, num_particles, vectorize_particles, "
        "num_data and distributed_draws on every rank (and the same seed with distributed_draws="
        "'identical'): the ranks train one model.",
        counted_num_data_note(num_data, n, train_loader),
    )
    _rank_optimizers.check_same_optimizer(optimizer, group)  # optim=: settings fit() cannot see
    # each rank draws from streams of its own while it trains; they join again after it
    # (seeded alike from a number drawn before they part), so that what a script builds
    # after fit() (a model, a loader without a seed) is built alike on every rank, as before
    # (drawn before the seed, or after own_streams' offset: an unseeded run draws as before)
    rejoin = None
    try:
        if seed is not None:
            if group.active and independent:
                rejoin = int(torch.randint(0, 2**31 - 1, ()).item())
            pyro.set_rng_seed(_distributed.rank_seed(seed, group, independent))
        elif independent:
            rejoin = _distributed.own_streams(group)
        with (
            torch.inference_mode(False),
            torch.enable_grad(),
            cpu_default(),
            _distributed.shards(train_loader, group),
        ):
            _distributed.check_same_steps(train_loader, epochs, group)
            # once no check refused, on any rank; raised as an error on one rank (warnings as
            # errors), it stops every rank there (as in the set-up), not in the first collective
            with _distributed.together(group, _SET_UP):
                warn_of_an_interrupted_run(checkpoint, resume_from)
            loop = Loop(
                model=model,
                held=wrapped,
                guide=guide,
                loader=train_loader,
                epochs=epochs,
                elbo=elbo,
                num_data=int(n),
                optimizer=optimizer,
                lr_schedule=lr_schedule,
                num_classes=probe.num_classes if check_each_batch else False,
                checkpoint=checkpoint,
                metadata=metadata,
                callbacks=callbacks,
                group=group,
                likelihood=probe.likelihood,
            )
            if resume is not None:
                loop.resume(resume)
                if independent:  # every rank restored rank 0's generator
                    _distributed.own_streams(group)
            with _engine.repeatable(loop.device, seed is not None or resume is not None):
                return loop.run(progress and group.leader)
    finally:
        if rejoin is not None:
            pyro.set_rng_seed(rejoin)
