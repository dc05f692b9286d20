"""The shared predictive API: any pyrouq model (and more) to ``(S, N, C)`` probabilities.

Shape convention, used everywhere in pyrouq: S posterior draws or ensemble members, N inputs,
C classes.

* Bayesian model + guide: S = ``num_samples`` draws of the weights from the guide. The same S
  draws serve every input batch, so draw s is one network evaluated on all N inputs.
* BatchEnsemble (no guide): S = M members.
* A plain ``nn.Module`` returning logits ``(B, C)``: S = 1.
* Any other Pyro model returning logits, or recording a ``"logits"`` site: S = ``num_samples``
  runs (with its guide if given; without one, its latent sites are drawn from their priors S
  times, once, and serve every input batch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import pyro
import torch
from torch import Tensor, nn

from pyrouq import _batchnorm as batchnorm
from pyrouq import _engine, _runners
from pyrouq._default_device import under_cpu_default
from pyrouq._input_cast import (
    guide_draws_refusal,
    latent_dtype_refusal,
    latent_sites_refusal,
    typed_by,
)
from pyrouq._meta_device import real_device
from pyrouq._metric_inputs import _float64
from pyrouq._mismatch import input_mismatch, inputs_fix, restated
from pyrouq._one_at_a_time import one_at_a_time
from pyrouq._own_models import name_of
from pyrouq._param_store import forget_params_since
from pyrouq._predict_batches import batches as _batches
from pyrouq._predict_batches import unaligned_labels, warn_of_labels
from pyrouq._predict_inputs import _inputs_of, _prepared, _progress_bar
from pyrouq._predict_runners import (
    num_samples_hint,
    posterior_samples_runner,
    runner_without_draws,
)
from pyrouq._seeded import draw_devices, seeded
from pyrouq._to_args import device_and_dtype
from pyrouq._util import (
    builder_of,
    check_int,
    modes,
    module_dtype,
    restore_modes,
    warn_of_a_shard,
)
from pyrouq._wrappers import given_model
from pyrouq.infer._elbo_checks import refuse_condition_around
from pyrouq.infer._site_checks import check_drawable
from pyrouq.infer.guide import check_guide
from pyrouq.likelihoods import Categorical, likelihood_of
from pyrouq.regression import GaussianPredictions
from pyrouq.uncertainty import Decomposition, Measure, _check_probs, decompose

__all__ = ["DEFAULT_NUM_SAMPLES", "Predictions", "predict"]

DEFAULT_NUM_SAMPLES = 32
"""Posterior draws used by :func:`predict` for a Bayesian model when num_samples is None."""


@dataclass(frozen=True, eq=False)
class Predictions:
    """Predictive probabilities of S draws or members on N inputs.

    Attributes
    ----------
    probs : torch.Tensor
        ``(S, N, C)``: ``probs[s, n]`` is the class distribution of draw/member s on input n.
        :func:`predict` makes them float32, or float64 for a float64 model (a float16 or
        bfloat16 model's are float32, the dtypes the decompositions and metrics read).
    targets : torch.Tensor or None
        ``(N,)`` labels, when :func:`predict` read them from a loader of ``(x, y)`` batches.

    Examples
    --------
    >>> import torch
    >>> p = Predictions.from_probs(torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]]))
    >>> p.mean_probs
    tensor([[0.7000, 0.3000]])
    >>> p.predicted
    tensor([0])
    >>> d = p.uncertainty("zero_one")
    >>> round(d.total.item(), 4), round(d.aleatoric.item(), 4), round(d.epistemic.item(), 4)
    (0.3, 0.3, 0.0)
    """

    probs: Tensor
    targets: Tensor | None = field(default=None)

    def __post_init__(self) -> None:
        from pyrouq.metrics import _check_targets

        _check_probs(self.probs, "probs", 3)
        if self.targets is not None:
            _check_targets(self.targets, self.probs[0])

    @classmethod
    def from_probs(cls, probs: Tensor, targets: Tensor | None = None) -> Predictions:
        """Wrap any ``(S, N, C)`` probability tensor (checked: finite, non-negative, rows sum
        to 1; targets ``(N,)`` labels in ``[0, C)``), as the constructor does."""
        return cls(probs=probs, targets=targets)

    @property
    def num_samples(self) -> int:
        """S, the number of draws or members."""
        return int(self.probs.shape[0])

    @property
    def num_inputs(self) -> int:
        """N."""
        return int(self.probs.shape[1])

    @property
    def num_classes(self) -> int:
        """C."""
        return int(self.probs.shape[2])

    @cached_property
    def mean_probs(self) -> Tensor:
        """``(N, C)`` mean predictive distribution p̄ (the Bayesian model average)."""
        return self.probs.mean(0)

    @cached_property
    def predicted(self) -> Tensor:
        """``(N,)`` predicted class, ``argmax_c p̄_c``, with p̄ averaged in float64 as the
        metrics and plots average it (a float32 mean, :attr:`mean_probs`, can break a near-tie
        the other way)."""
        return _float64(self.probs).mean(0).argmax(-1).to(self.probs.device)

    def uncertainty(self, measure: Measure = "entropy", base: float = math.e) -> Decomposition:
        """Total = aleatoric + epistemic, each ``(N,)``; see :func:`pyrouq.uncertainty.decompose`.

        Parameters
        ----------
        measure : {"entropy", "variance", "zero_one"}, default "entropy"
        base : float, default e
            Logarithm base of the entropy measure (2 for bits).
        """
        return decompose(self.probs, measure=measure, base=base)

    def evaluate(
        self,
        targets: Tensor | None = None,
        ood: Predictions | Tensor | None = None,
        ood_score: str | None = None,
    ) -> dict[str, float]:
        """Every metric of :func:`pyrouq.metrics.evaluate` (targets default to ``self.targets``)."""
        from pyrouq.metrics import evaluate

        return evaluate(self, targets, ood=ood, ood_score=ood_score)  # type: ignore[arg-type]

    def to(
        self,
        device: torch.device | str | torch.dtype | Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> Predictions:
        """A copy on ``device`` and/or with the probabilities in ``dtype``, ``torch.float32`` or
        ``torch.float64`` (the class-index targets keep theirs), given as ``Tensor.to`` takes
        them: ``to("cuda")``, ``to(torch.float64)``, ``to("cuda", torch.float64)``,
        ``to(dtype=torch.float64)``, or ``to(tensor)`` (its device and dtype)."""
        where, into, came = device_and_dtype("Predictions.to()", device, dtype)
        if into is not None and into not in (torch.float32, torch.float64):
            raise TypeError(
                f"Predictions.to() takes torch.float32 or torch.float64 for the probabilities, "
                f"got {came}{into!r}: the decompositions and metrics read float32 or float64 (a "
                "half-precision model's predict() returns float32 probabilities). Pass "
                "torch.float32, torch.float64, or a device (a tensor's: to(t.device))."
            )
        probs = self.probs.to(device=where, dtype=into)
        targets = None if self.targets is None else self.targets.to(probs.device)
        return Predictions(probs, targets)

    def double(self) -> Predictions:
        """The same predictions with float64 probabilities."""
        return self.to(torch.float64)

    def __repr__(self) -> str:
        return (
            f"Predictions(S={self.num_samples}, N={self.num_inputs}, C={self.num_classes}, "
            f"device={self.probs.device})"
        )


# --------------------------------------------------------------------------------------------
# predict()
# --------------------------------------------------------------------------------------------


def class_predictions(preds: Any, where: str) -> Predictions:
    """``preds`` if a classifier's :class:`Predictions`, else a clear error naming ``where``."""
    if not isinstance(preds, Predictions):
        raise TypeError(
            f"{where} works on class probabilities; the model predicts {type(preds).__name__} "
            "(a Gaussian likelihood): use its .evaluate() and the regression plots instead."
        )
    return preds


def _to(part: Any, device: torch.device | None) -> Any:
    """A likelihood's per-batch predictive result (a tensor or a tuple of them) on ``device``."""
    if isinstance(part, tuple):
        return tuple(t.to(device) for t in part)
    return part.to(device)


@torch.no_grad()
@under_cpu_default
@one_at_a_time
def predict(
    model: nn.Module | Any,
    x: Tensor | Iterable,
    guide: Any = None,
    num_samples: int | None = None,
    batch_size: int = 1024,
    posterior_samples: Any = None,
    *,
    parallel: bool = True,
    batchnorm_data: Tensor | Iterable | None = None,
    batchnorm_batches: int = 20,
    max_draw_bytes: int = _runners.DEFAULT_MAX_DRAW_BYTES,
    progress: bool = True,
    seed: int | None = None,
) -> Predictions | GaussianPredictions:
    """Predictions of S draws (or members) of a model on inputs ``x``: class probabilities
    ``(S, N, C)`` for a classifier, means and standard deviations ``(S, N, D)`` for a model
    with a :class:`~pyrouq.likelihoods.Gaussian` likelihood.

    Parameters
    ----------
    model : PyroModule or nn.Module
        A pyrouq model (Bayesian, BatchEnsemble), any Pyro model returning logits or recording
        ``"logits"`` of shape ``(B, C)`` (those its ``"obs"`` is drawn from, when it draws it
        from a ``Categorical``: other ones, a regression's outputs, are refused), or a plain
        ``nn.Module`` returning logits ``(B, C)``. A ``BayesianNetwork`` with a ``forward`` of
        its own (its class's or the instance's) runs it under each draw, as ``Predictive``: the
        draws give every site it samples (a temperature), ``parallel`` stacks none of them; a
        BatchEnsemble's or rank-1 network's own ``forward`` is refused (not run per member).
        It runs in eval mode (dropout off: no MC dropout; BatchNorm's running statistics, or
        for one built with ``track_running_stats=False`` each batch's own, as in torch: a
        batch of one input is then refused) and is left in the mode it came in. A
        ``pyro.poutine.condition()`` or ``pyro.poutine.do()`` around the call fixing a latent
        site of a pyrouq model is refused: the draws would overrule its values (a value of None
        fixes nothing and is let through). A model in ``DistributedDataParallel`` runs as the
        module it wraps; a pyrouq model in ``DataParallel`` or ``torch.compile`` too.
    x : torch.Tensor or iterable
        ``(N, ...)`` inputs, or a loader yielding input tensors or ``(x, y)`` batches (then the
        labels are kept as ``Predictions.targets``: labels that are not one per input of their
        batch, or not valid targets, are left out with a warning); one ``(x, y)`` pair goes in a
        list, ``[(x, y)]`` (a bare pair whose tensors differ in rank is refused; one of equal ranks
        is read as two batches of inputs; a map-style ``Dataset`` goes in a ``DataLoader``, whose
        batches' examples left as they came, ``collate_fn=lambda b: b``, are refused, and so
        are batches of more than two items, ``(x, y, weights)``, as fit() refuses them; empty
        batches are skipped). Floating inputs of another dtype (float64, float16) are cast to the
        model's (or its guide's; a guide written as a function has none to read: inputs of
        another dtype than its draws are refused, as fit() refuses them, and so are they for a
        Pyro model without weights run from its priors, which draw in their own dtype; a Pyro
        model whose weights are of another dtype than the draws of its guide or of its
        ``PyroSample`` priors, which ``model.to()`` leaves as they are, is refused naming both);
        integer ones (raw uint8 pixels) are refused, see :func:`pyrouq.data.normalize`, unless
        the network holds an ``nn.Embedding`` (ids, not bool).
        NaN or inf inputs are refused. The predictions follow the order x gives: a loader that
        shuffles gives them shuffled, with its labels in the same order (so ``evaluate()`` is right
        without targets, but labels passed in the data set's order are not); predict from a loader
        with ``shuffle=False`` to keep that order. A torch ``DataLoader`` takes a seed from torch's
        random stream when it starts, before the draws, unless given ``generator=``: pass one for
        the draws a seed gives with a tensor (with ``seed=``, that draw comes from the seeded
        stream too: the call repeats either way).
    guide : callable, optional
        The fitted guide of a Bayesian model (one in ``DistributedDataParallel`` runs as its
        ``.module``); one built for another model (other sites or shapes) is refused, naming
        the first differing site. It runs on the inputs alone,
        ``guide(x)``, as in Pyro's ``Predictive``: one that needs the targets is refused, and
        so, before it runs, is a Pyro autoguide that has never run (or a ``GuideMessenger``)
        whose model samples its targets' site ``"obs"`` on the inputs alone: it would take
        them for a latent site (run an autoguide once on training data first,
        ``guide(x[:2], y[:2])``; a ``GuideMessenger`` runs the model at every call: build it
        on the model with its targets hidden, ``poutine.block(model, hide=["obs"])``).
        Unlike ``Predictive``, only its draws of the sites every input shares are used: a
        Pyro model of your own draws its per-input latent sites (those an amortised guide's
        ``q(z | x)`` draws) from their prior for each input, with a warning naming them.
    num_samples : int, optional
        Posterior draws S for a Bayesian model (default 32), from torch's random stream (which
        the call advances; with ``seed=``, a stream of their own). Must stay None for a
        BatchEnsemble (S = its M members) and a plain network (S = 1). For a rank-1 network
        (:func:`pyrouq.rank1`) each of K draws runs its M members: S = K * M predictions,
        draw-major (``s = k * M + m``); K defaults to 32 // M, at least 1.
    batch_size : int, default 1024
        Inputs per forward pass when ``x`` is a tensor. Memory stays bounded: at most
        ``max(batch_size, B)`` (input, draw) pairs are evaluated per pass (B, a batch's inputs;
        the M members of a BatchEnsemble or of a rank-1 draw run together: ``M * B``). On CPU
        a Bayesian network runs more than 512 inputs in chunks of 512 (faster there; the same
        outputs for a network that treats its inputs independently in eval mode, as torch's
        layers do, and none where a BatchNorm takes the batch's statistics: a layer of your own
        that mixes a batch's inputs sees at most 512 of them).
    posterior_samples : MCMCResult, pyro.infer.MCMC or dict, optional
        Draws from anywhere instead of a guide: an :class:`~pyrouq.mcmc.MCMCResult` or a
        ``pyro.infer.MCMC`` run (every chain's draws, chain after chain) or ``{site: (S,
        *shape)}`` (tensors or numpy arrays) with one S for every latent site
        (``pyro.infer.Predictive``'s output too: its other sites are left out, its padding of
        a site's draws to the model's plates, ``(S, 1, *shape)``, dropped). S is then their
        number (leave ``guide`` and ``num_samples`` out). Floating draws (arviz's, numpy's float64)
        take the dtype of the model's parameters (of the inputs for a model without any). The
        network runs on copies, made chunk by chunk of draws for every input batch (one
        chunk's memory, not all S draws'): one that changes its weight in place (a ``clamp_``)
        leaves the draws given as they were, and every batch runs on them as given (every
        batch of ``batchnorm_data`` too).
    parallel : bool, default True
        For pyrouq Bayesian models, hand several draws to one pass when the input batch is
        smaller than ``batch_size`` (on accelerators they run as one ``vmap`` pass; on CPU,
        where that gains little but for tiny networks, one draw at a time anyway); otherwise
        loop over draws. Results are identical either way.
    batchnorm_data : torch.Tensor or iterable, optional
        Training inputs (a tensor, taken ``batch_size`` rows at a time, or a loader yielding
        input tensors or ``(x, y)`` batches) for a network with BatchNorm and posterior draws
        (a guide or ``posterior_samples``). For each draw, every BatchNorm's running statistics
        are re-estimated under that draw's weights on the first ``batchnorm_batches`` batches
        (train-mode passes, no gradients, the statistics averaged over the batches, each
        weighted by its size; a batch of one input is left out), and that draw predicts with
        them, as SWAG does (Maddox et al. 2019). Without it every draw uses the statistics
        ``fit()`` accumulated over many draws, which fit no single draw exactly.
        It costs ``S * batchnorm_batches`` forward passes, and the draws then run one per
        pass (``parallel`` does not stack them); the model is left as it was.
        Measured on a ResidualCNN (3 epochs on Fashion-MNIST): NLL 0.2537 -> 0.2519, ECE
        about the same, but less disagreement between the draws and a lower
        mutual-information OOD AUROC (0.744 -> 0.693).
    batchnorm_batches : int, default 20
        How many batches of ``batchnorm_data`` each draw's statistics are estimated on: the
        first ones, read once before any draw, so every draw sees the same batches.
    max_draw_bytes : int, default 2**30 (1 GiB)
        The most memory the guide's weight draws take at once. Every input is predicted under
        the same S draws, so they are held while x is read; when S draws of the network's
        weights take more (32 draws of an 11M-weight resnet18 take 1.4 GB), they are taken
        in chunks that fit, and x is read once per chunk. The predictions are the same to the
        bit either way. That needs an x that gives the same batches each time it is read: a
        tensor, a list of batches, a ``DataLoader`` that does not shuffle, or a pyrouq loader
        with ``shuffle=False``; for any other iterable all S draws are held, with a warning
        (an x whose batches change between reads is refused). Applies to
        :func:`~pyrouq.mean_field_guide` guides (MCMC draws are in memory).
    progress : bool, default True
        Show a tqdm progress bar over the input batches, once a prediction has taken more
        than 2 s (quick calls print nothing); it goes away when done, as ``fit()``'s does.
    seed : int, optional
        In ``[0, 2**32 - 1]``. Given, the call's draws (a guide's, those of a Pyro model from
        its priors, a ``DataLoader``'s seed, a dropout that runs) come from torch's streams
        seeded with it, those of the CPU and of the model's device, as ``pyro.set_rng_seed(seed)``
        before the call would seed them, inside a fork of the random state: two calls with
        one seed give the same predictions to the bit, whatever ran between them, and torch's
        global streams are left as they were. None (default): the draws come from the global
        streams, which the call advances. MCMC draws, a BatchEnsemble's members and a plain
        network draw nothing: the seed changes nothing there.

    Returns
    -------
    Predictions or GaussianPredictions
        As the model's likelihood makes them (:class:`Predictions` for plain networks and
        other Pyro models), on the device of ``x`` (of the first batch for a loader).

    Examples
    --------
    >>> import torch
    >>> from pyrouq import BayesianMLP, mean_field_guide
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> guide = mean_field_guide(model)
    >>> predict(model, torch.randn(10, 4), guide, num_samples=5).probs.shape
    torch.Size([5, 10, 3])
    """
    model, guide = given_model(model), given_model(guide)  # (DDP-, DataParallel-, compile-wrapped)
    if seed is not None:  # the whole call in a seeded fork of torch's random state
        with seeded(seed, "predict()", draw_devices(model, guide, x)):
            return predict(
                model, x, guide, num_samples, batch_size, posterior_samples, parallel=parallel,
                batchnorm_data=batchnorm_data, batchnorm_batches=batchnorm_batches,
                max_draw_bytes=max_draw_bytes, progress=progress,
            )  # fmt: skip
    if torch.is_tensor(x) and x.dim() == 0:
        raise ValueError(
            f"predict() expects a batch of inputs, the examples on dim 0, got a 0-d tensor "
            f"({x.item()!r}). Pass one example as x.reshape(1, *shape) (one feature: "
            "x.reshape(1, 1))."
        )
    builds = builder_of(model)  # (a model function would run resnet18(x): x as its weights)
    if builds is not None:
        raise TypeError(
            f"predict() expects the model to be a network or a Pyro model, got {builds}, and "
            "pass that (as it is, or made Bayesian by bayesian() and fitted)."
        )
    _runners.check_arguments(model, guide, parallel, progress)
    batch_size = check_int("batch_size", batch_size, hint="Pass e.g. batch_size=256.")
    batchnorm_batches = check_int("batchnorm_batches", batchnorm_batches, hint="Pass e.g. 20.")
    max_draw_bytes = check_int("max_draw_bytes", max_draw_bytes, hint="Pass e.g. 2**30 (1 GiB).")
    if num_samples is not None:  # (the number of draws: for a Bayesian model, or a clear error)
        draws = num_samples_hint(model, guide, posterior_samples, DEFAULT_NUM_SAMPLES)
        num_samples = check_int("num_samples", num_samples, hint=draws)
    device = real_device("predict()", model, guide)  # (not meta)
    refuse_condition_around(model, "predict()")  # (its draws would overrule the values)
    likelihood = likelihood_of(model) or Categorical()
    words = getattr(likelihood, "target_words", ("labels", "label"))  # (regression: targets)
    was = modes(model)
    norms = batchnorm.check_batchnorm_data(model, batchnorm_data, guide, posterior_samples)
    refit = None
    if batchnorm_data is not None:  # norms is not empty then
        # read once, before any draw: every chunk of draws (max_draw_bytes) takes its
        # statistics on the same batches, those a shuffling loader gives at the same point
        inputs = _inputs_of(batchnorm_data, batch_size, batchnorm_batches, model, device)
        refit = (norms, lambda: inputs)
    saved = batchnorm.statistics_of(norms)
    if isinstance(model, nn.Module):
        model.eval()
    bar = None
    torch.clear_autocast_cache()  # an autocast around predict() caches casts of old weights
    try:
        with pyro.validation_enabled(False), _engine.reuse_freed_memory(device):
            sizes: list[int] = [0]  # the draws of each pass over x (one pass but for a guide)
            source: _runners.GuideDraws | None = None  # (a guide's draws, for their dtypes)
            stored = set(pyro.get_param_store().keys())  # (a refused guide's entries go)
            if posterior_samples is not None or guide is not None:
                check_drawable(
                    model, "posterior_samples" if guide is None else "a guide", "predict()"
                )
            if posterior_samples is not None:
                run = posterior_samples_runner(
                    model, posterior_samples, guide, num_samples, device, parallel, batch_size,
                    refit,
                )  # fmt: skip
            elif guide is not None:
                check_guide(model, guide, "predict()")
                members = getattr(model, "num_members", None) or 1  # rank-1: M per draw
                count = num_samples or max(1, DEFAULT_NUM_SAMPLES // members)
                sizes = _runners.draw_sizes(guide, model, count, max_draw_bytes, x)
                source = _runners.GuideDraws(guide, device)

                def guide_runner(size: int) -> Callable[[Tensor], Tensor]:
                    return _runners.bayesian_runner(
                        model, partial(source, size), size, parallel, batch_size, refit, guide=guide
                    )

            else:  # no draws given: a BatchEnsemble's members, a Pyro model's priors, a network
                run = runner_without_draws(
                    model, num_samples, parallel, batch_size, DEFAULT_NUM_SAMPLES
                )
            warn_of_a_shard(x, "predict()")
            bar = _progress_bar(x, batch_size, len(sizes)) if progress else None
            passes: list[list[Any]] = []  # each pass's parts, one per input batch
            targets: list[Tensor] = []
            out_device = None
            unaligned: str | None = None  # why the labels are not the inputs', if they are not

            came = _runners.AsTheyCame(len(sizes))

            def read(run: Callable[[Tensor], Any]) -> list[Any]:
                """One pass over x under ``run``'s draws (freed when it returns)."""
                nonlocal out_device, unaligned
                parts, first = [], 0
                for index, (xb, yb) in enumerate(_batches(x, batch_size)):
                    if out_device is None:
                        out_device = xb.device
                    if xb.dim() == 0:  # (it has no dim 0 to be empty or not)
                        raise ValueError(
                            "predict() expects x's batches with the examples on dim 0; a batch "
                            f"was a 0-d tensor ({xb.item()!r}). One example of one feature is "
                            "batch.reshape(1, 1)."
                        )
                    if not xb.shape[0]:  # an empty batch (a filtered loader's): nothing to
                        if bar is not None:  # predict, and a Pyro model's plate of 0 fails
                            bar.update()
                        continue
                    inputs = _prepared(xb, typed_by(model, guide), device, "x", first)
                    try:
                        outputs = came.run(index, xb, inputs, run)
                    except (TypeError, ValueError, RuntimeError) as err:
                        alone = batchnorm.alone_in_its_batch(err, inputs, index, x, batch_size)
                        if alone:
                            raise ValueError(alone) from err
                        one = inputs.dim() == 1 and inputs.is_floating_point()  # (not ids)
                        if one and hasattr(err, "add_note"):
                            err.add_note(
                                f"predict(): x's batches have shape {tuple(inputs.shape)}: if x "
                                "is one example, give it a batch dimension, x.unsqueeze(0); if "
                                "it is N examples of one feature, x.unsqueeze(-1)."
                            )
                        elif input_mismatch(err):  # torch's words (pyrouq's pass unchanged)
                            drawn = source.dtypes if source is not None else {}
                            refused = guide_draws_refusal(err, model, guide, inputs, drawn)
                            if refused is None:  # draws of another dtype than the model's
                                refused = latent_sites_refusal(
                                    err, model, guide, inputs, None, drawn, "predict()"
                                )
                            if refused is None and guide is None and posterior_samples is None:
                                refused = latent_dtype_refusal(  # (from the priors)
                                    err, model, None, inputs, None, "predict()"
                                )
                            if refused is not None:  # a function's draws: their dtype
                                forget_params_since(stored)
                                raise TypeError(refused) from err
                            cast = module_dtype(typed_by(model, guide)) is not None
                            weights = module_dtype(model) is not None  # (not PyroSamples)
                            fix = inputs_fix(err, inputs.dtype, cast=cast, weights=weights)
                            raise ValueError(
                                f"predict(): {name_of(model)} failed on x (a batch of "
                                f"shape {tuple(inputs.shape)}, dtype {inputs.dtype}): "
                                f"{restated(err, fix)}."
                            ) from err
                        raise
                    first += xb.shape[0]
                    latent = getattr(run, "latent", None)
                    part = likelihood.predictive(outputs, latent() if latent else None)
                    parts.append(_to(part, out_device))
                    if yb is not None and not passes:  # (not an input's label: none kept)
                        first_labels = targets[0] if targets else None
                        why = unaligned_labels(xb, yb, index, first_labels, words)
                        unaligned = unaligned or why
                        targets.append(yb.to(out_device))
                    if bar is not None:
                        bar.update()
                return parts

            for size in sizes:
                passes.append(read(guide_runner(size) if size else run))
    finally:
        if bar is not None:
            bar.close()
        batchnorm.load_all(norms, saved)
        restore_modes(was)
    batches = len(passes[0]) if passes else 0  # (the parts of several passes join in one)
    parts = _runners.joined_passes(passes)  # (each pass's parts freed once joined)
    if not parts:
        raise ValueError(
            "predict() got no inputs: x is empty. Expected at least one input, a tensor (N, ...) "
            "with N >= 1 or a loader yielding batches: pass the inputs to predict (a loader "
            "over an empty dataset, or one drained before, yields none)."
        )
    all_targets = torch.cat(targets) if len(targets) == batches and not unaligned else None
    if unaligned:
        warn_of_labels(unaligned, words)
    try:
        return likelihood.predictions(parts, all_targets)  # type: ignore[no-any-return]
    except (TypeError, ValueError) as err:
        if all_targets is None:
            raise
        alone = likelihood.predictions(parts, None)  # the outputs' own error, if it is theirs
        warn_of_labels(str(err), words)  # they cannot be the targets: the predictions stand alone
        return alone  # type: ignore[no-any-return]


def __getattr__(name: str) -> object:
    """The rotation helpers' former home (now :mod:`pyrouq.rotation`), imported lazily."""
    if name in ("DEFAULT_ANGLES", "evaluate_rotations", "format_rotation_table"):
        from pyrouq import rotation

        return getattr(rotation, name)
    raise AttributeError(f"module 'pyrouq.predictive' has no attribute {name!r}")
