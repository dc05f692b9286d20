"""Reference posteriors by Markov chain Monte Carlo: Pyro's NUTS (or HMC) on the full data,
several chains, with per-draw sampler statistics for arviz.

:func:`mcmc` returns an :class:`MCMCResult`: draws ``(chain, draw, *site_shape)`` of every
latent site and, per draw, whether the trajectory diverged, the step size, the tree depth and
the energy. :func:`pyrouq.predict` takes it as ``posterior_samples=``, and
:func:`pyrouq.to_inference_data` exports it with its chains (R-hat, ESS, trace and rank plots,
BFMI, LOO). For small networks only: NUTS costs up to ``2**max_tree_depth - 1`` full-data
gradient evaluations per draw (1,023 at the default), a network's posterior often all of them,
and a network above :data:`MAX_LATENT_VALUES` latent values is refused unless forced. After
sampling, :func:`mcmc` warns of divergences, of draws at ``max_tree_depth`` and of chains whose
log density ``lp`` disagrees (R-hat above 1.01).
Chains run in parallel processes when that pays (several chains, cores and steps); under a
Pyro effect handler (``poutine.scale``), which those processes would not see, in this one.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pyro
import torch
from torch import Tensor

from pyrouq._default_device import cpu_default
from pyrouq._engine._layer_calls import no_grad_watched
from pyrouq._forwards import own_forward
from pyrouq._mcmc_checks import (
    check_data,
    check_kernel,
    refuse_discrete_priors,
    refuse_forward_sites,
    refuse_own_latents,
    refuse_unsampled,
)
from pyrouq._mcmc_health import trouble
from pyrouq._mcmc_workers import (
    chain_job,
    parallel_chains,
    spawn_problem,
)
from pyrouq._meta_device import real_device
from pyrouq._mismatch import input_mismatch, inputs_fix, restated
from pyrouq._util import (
    MAX_SEED,
    check_count,
    check_finite_inputs,
    check_flag,
    check_int,
    check_seed,
    global_streams_kept,
    model_input,
    modes,
    module_device,
    module_dtype,
    restore_modes,
    warn_caller,
)
from pyrouq._wrappers import given_model
from pyrouq.convert import BayesianNetwork

__all__ = ["MAX_LATENT_VALUES", "PARALLEL_MIN_STEPS", "MCMCResult", "mcmc"]

#: Above this many latent values, :func:`mcmc` asks for ``force=True`` (and suggests VI).
MAX_LATENT_VALUES = 10_000

#: Steps per chain from which :func:`mcmc` runs several chains in parallel processes.
PARALLEL_MIN_STEPS = 200

Kernel = Literal["nuts", "hmc"]


@dataclass(eq=False)
class MCMCResult:
    """Draws of a posterior by MCMC, chain by chain.

    Attributes
    ----------
    samples : dict of str to Tensor
        ``(chain, draw, *site_shape)`` for every latent site, in the constrained space.
    sample_stats : dict of str to Tensor
        ``(chain, draw)``: ``diverging`` (bool), ``step_size``, ``tree_depth`` (NUTS; the
        number of leapfrog steps for HMC), ``energy`` (the Hamiltonian at the start of the
        draw's trajectory, for ``az.bfmi``), ``lp`` (the draw's log density in Pyro's
        unconstrained space, minus its potential energy: the log joint plus the log-Jacobian
        of the transforms) and ``acceptance_rate`` (the transition's acceptance probability:
        NUTS's mean over its trajectory, HMC's Metropolis one), named as arviz names them.
    kernel : str
        ``"nuts"`` or ``"hmc"``.
    warmup_steps : int
    seconds : list of float
        Wall time of each chain (warm-up included).
    model, x, y : optional
        The model and the data the chains ran on (not saved by :func:`pyrouq.save`). After a
        :func:`pyrouq.load`, set ``result.model = model`` before
        :func:`pyrouq.to_inference_data`, which takes no model beside a result, and set
        ``result.x``, ``result.y`` too or pass them: ``to_inference_data(result, x=x, y=y)``.
    metadata : dict
        JSON values of the caller's: ``pyrouq.save(path, result, metadata=...)`` stores them
        (``result.metadata`` when that argument is left out) and :func:`pyrouq.load` gives
        them back here.

    Examples
    --------
    Made by :func:`mcmc`; built by hand here to show the shapes:

    >>> import torch
    >>> result = MCMCResult({"w": torch.zeros(2, 3, 4)}, {}, kernel="nuts", warmup_steps=10)
    >>> result.num_chains, result.num_samples, result.draws()["w"].shape
    (2, 3, torch.Size([6, 4]))
    """

    samples: dict[str, Tensor]
    sample_stats: dict[str, Tensor]
    kernel: str
    warmup_steps: int
    seconds: list[float] = field(default_factory=list)
    model: Any = None
    x: Tensor | None = None
    y: Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_chains(self) -> int:
        """The number of chains."""
        return self._dims()[0]

    @property
    def num_samples(self) -> int:
        """Draws per chain."""
        return self._dims()[1]

    def _dims(self) -> tuple[int, int]:
        """(chain, draw), read off the first site; a result without them says so."""
        value = next(iter(self.samples.values()), None)
        if value is None or value.dim() < 2:
            came = "no sites" if value is None else f"a site of shape {tuple(value.shape)}"
            raise ValueError(
                f"This MCMCResult holds {came} in its samples, expected every latent site's "
                "draws as (chain, draw, *site_shape) (a result made by hand?). Set "
                "result.samples so, or use the result mcmc() returned."
            )
        return int(value.shape[0]), int(value.shape[1])

    def draws(self) -> dict[str, Tensor]:
        """Every draw of every chain, chain after chain: ``{site: (chain * draw, *shape)}``
        (the S draws :func:`pyrouq.predict` evaluates)."""
        return {site: value.flatten(0, 1) for site, value in self.samples.items()}

    @property
    def divergences(self) -> int:
        """The number of divergent transitions after warm-up, over all chains."""
        if "diverging" not in self.sample_stats:
            raise ValueError(
                "This MCMCResult records no divergences: its sample_stats hold "
                f"{sorted(self.sample_stats)}, no 'diverging' (a result made without mcmc()). "
                "Set result.sample_stats['diverging'], (chain, draw) booleans, to count them."
            )
        return int(self.sample_stats["diverging"].sum())

    def __repr__(self) -> str:
        told = "diverging" in self.sample_stats  # (a result made by hand may record none)
        try:  # (one made by hand may hold no draws: shown, not raised)
            dims = "chains={}, draws={}".format(*self._dims())
        except ValueError:
            dims = "no (chain, draw)"
        return (
            f"MCMCResult(kernel={self.kernel!r}, {dims}, sites={len(self.samples)}"
            f"{f', divergences={self.divergences}' if told else ''})"
        )


def mcmc(
    model: Any,
    x: Tensor,
    y: Tensor,
    num_samples: int,
    warmup_steps: int,
    num_chains: int = 4,
    *,
    kernel: Kernel = "nuts",
    seed: int | None = None,
    progress: bool = True,
    force: bool = False,
    max_tree_depth: int = 10,
    parallel: bool | None = None,
) -> MCMCResult:
    """Sample the posterior of a pyrouq Bayesian model by NUTS (or HMC) on the full data.

    Every chain adapts its step size and a diagonal mass matrix during ``warmup_steps``, then
    keeps ``num_samples`` draws. Chain c is seeded with ``seed + c`` (modulo 2**32;
    reproducible), whether the chains run in parallel processes or one after another, and the
    global random state (torch's, on the CPU and on the model's device, numpy's and Python's)
    is left as it was either way; only ``seed=None`` takes one draw from torch's generator, for
    the seed. Each chain shows a progress bar.

    The network runs in evaluation mode (no dropout; BatchNorm on its running statistics)
    and in its own precision (a ``torch.autocast`` around the call is turned off for it, as it
    is in the chain processes). NUTS samples the latent sites only. The model's point
    estimates (parameters it does not select, such as BatchNorm's, a ``Gaussian("learned")``
    noise scale) and its BatchNorm running statistics stay at their current values
    throughout: :func:`pyrouq.fit` the model first, or make them latent (``select=``, a
    noise prior such as ``Gaussian(dist.HalfNormal(1.0))``). A learned noise scale warns,
    naming its value.

    Parameters
    ----------
    model : BayesianNetwork
        A model made by :func:`pyrouq.bayesian` (``BayesianMLP``, ...), a Gaussian likelihood's
        latent noise included, in float32 or float64 (a float16 or bfloat16 one is refused:
        sample a float32 copy, whose draws :func:`pyrouq.predict` takes for it).
    x, y : Tensor
        The whole data set (no minibatches: ``model.num_data`` is set to N for the run),
        moved to the model's device.
    num_samples, warmup_steps : int
        Draws kept per chain; adaptation steps per chain (>= 0).
    num_chains : int, default 4
        R-hat compares chains: with one, ``az.rhat`` (and the ``r_hat`` column of
        :func:`pyrouq.summary`) is NaN.
    kernel : {"nuts", "hmc"}
    seed : int, optional
        In ``[0, 2**32 - 1]``. None: drawn from torch's generator (so ``torch.manual_seed``
        before the call makes it reproducible too). Since chain c runs on ``seed + c``, runs
        on nearby seeds share chains (``seed=1``'s chain 0 is ``seed=0``'s chain 1): for an
        independent run, take seeds at least ``num_chains`` apart. On a CUDA device the chains
        run cuDNN's deterministic kernels (put back afterwards), as a seeded :func:`fit`.
    progress : bool, default True
        A progress bar per chain (``tqdm.auto``'s). Chains run one after another show one
        bar at a time: a widget in a Jupyter notebook with ipywidgets, else a line of text
        on stderr redrawn in place. Chains run at once (in their own processes) draw text on
        stderr: a line each on a terminal; elsewhere (a notebook, a log file) their bars
        overwrite one shared line.
    force : bool, default False
        Sample a model above :data:`MAX_LATENT_VALUES` latent values anyway.
    max_tree_depth : int, default 10
        NUTS's limit on trajectory doublings (not read with ``kernel="hmc"``, which runs
        Pyro's HMC defaults: a trajectory of length 2 pi, its step size adapted in warm-up).
    parallel : bool, optional
        Run the chains in separate processes (``spawn``; one per core, the cores shared out
        as torch threads). Default: when there are several chains and cores and at least
        :data:`PARALLEL_MIN_STEPS` steps per chain (shorter chains finish before the
        processes have started), and the model can be sent to new processes (no class of the
        network defined in ``__main__``, which they could not import, nor one that does not
        pickle: defined inside a function, holding a lambda) and no Pyro effect handler is
        active around the call (``poutine.scale``, which they would not see); otherwise one
        after another, in this process.
        The draws are the same either way, except where torch splits a sum among its
        threads: a chain process computes on its share of the cores (``cores // chains``
        torch threads), this process on the caller's threads, and torch adds up a
        convolution's weight gradient (on any data), a linear layer's for some shapes (a
        logistic regression's, ``bayesian(nn.Linear(16, 10))`` on 128 points) and a sum of
        more than 32,768 values (the likelihood of large data) in another order for another
        number of threads; there the chains differ in the last bits, then drift apart (each
        as valid). Set ``torch.set_num_threads`` to the chain processes' number for the same
        draws. A chain
        process that dies (out of memory, say) raises a ``RuntimeError``; an interrupt
        (Ctrl-C) terminates the chain processes, and a chain process whose parent is killed
        ends too.
        Each chain process first runs the script's top-level code again (Python's ``spawn``),
        so a script that calls ``mcmc()`` needs the usual ``if __name__ == "__main__":``
        guard, or ``parallel=False``.

    Returns
    -------
    MCMCResult

    Raises
    ------
    ValueError
        A chain that finds no starting point with a finite log density (the network's outputs
        NaN or infinite at every weight tried) says so, naming the chain; a site with a
        discrete prior (Bernoulli, Poisson), which NUTS cannot move, is refused, named; so is a
        latent site the network samples itself (``pyro.sample`` in its forward), and one
        that a subclass's own ``forward`` samples beside the model's latent sites (the result
        would not keep it, and predict() would refuse its draws). Refused too: a vectorised
        ``pyro.plate``, a ``pyro.poutine.trace()`` recording sample sites or a
        ``pyro.poutine.condition()`` fixing latent sites (whose draws the result would lack) or
        giving them None, or a ``pyro.poutine.do()`` intervening on them (drawn from their
        prior), around the call (call mcmc() outside it), and ``parallel=True`` where the chain
        processes could not run the model as here (see ``parallel``).

    Warns
    -----
    UserWarning
        Once, after sampling, where the sampler statistics show trouble, with a sentence for
        each finding (what was found, what it means, what to do):

        * divergent transitions, their number and share of the draws: the step size was too
          large for the posterior's curvature there (NUTS adapts it to Pyro's target
          acceptance probability, 0.8, which mcmc() does not expose). Advice: a longer
          warm-up, standardised x and y (:class:`pyrouq.Standardizer`), priors and a noise
          scale that fit them;
        * more than 10 % of NUTS's draws at ``max_tree_depth``: trajectories stopped before
          they turned back, chains that explore slowly. Advice: a larger ``max_tree_depth``
          (each level doubles the cost of a draw) or a longer warm-up;
        * with 2 chains or more, an R-hat of ``lp`` above 1.01 (rank-normalised split R-hat,
          as ``az.rhat``, with the bulk ESS of ``az.ess``): the chains disagree, or are too
          short to tell. Advice: longer chains. R-hat is taken on the log density ``lp``,
          which a network's symmetries (hidden units swapped) leave unchanged, not on the
          weights, whose R-hat counts the symmetric copies of one mode as chains that
          disagree. Short chains of a healthy posterior can pass 1.01 too: 2 chains of 150
          draws of a one-weight regression did in 4 seeds of 10, 4 chains of 500 of a
          two-weight one in none (R-hat up to 1.005; docs: measured figures).

        The check reads ``result.sample_stats`` and costs nothing next to the sampling. A
        healthy run is not told anything; R-hat and ESS of every site remain for
        :func:`pyrouq.summary` on :func:`pyrouq.to_inference_data`'s export.

    Examples
    --------
    A tiny run to show the shapes: 4 + 4 steps and ``max_tree_depth=2`` only keep the example
    fast, and it warns so (draws at ``max_tree_depth``, an R-hat of ``lp`` above 1.01).
    For inference keep the default ``max_tree_depth=10`` and take hundreds of steps
    (``num_samples=500, warmup_steps=500``), heed the warnings, then check R-hat with
    :func:`pyrouq.summary`:

    >>> import torch
    >>> from pyrouq import BayesianMLP, predict
    >>> x, y = torch.randn(20, 2), torch.randint(0, 2, (20,))
    >>> model = BayesianMLP(in_features=2, hidden_features=4, out_features=2)
    >>> result = mcmc(model, x, y, num_samples=4, warmup_steps=4, num_chains=2, seed=0,
    ...               progress=False, max_tree_depth=2)
    >>> result.samples["fc1.weight"].shape  # (chain, draw, out, in)
    torch.Size([2, 4, 4, 2])
    >>> predict(model, x, posterior_samples=result, progress=False).probs.shape  # S = 2 * 4
    torch.Size([8, 20, 2])
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # a chain process (spawned) running the script's top-level code again
        raise RuntimeError(
            "mcmc() was called while a chain process was starting: each chain process first "
            "runs the script's top-level code again. Put the code that calls mcmc() under "
            '`if __name__ == "__main__":`, or pass mcmc(..., parallel=False).'
        )
    model = given_model(model)  # (a DDP-, DataParallel- or compile-wrapped pyrouq model)
    real_device("mcmc()", model)  # (before anything reads its values)
    refuse_unsampled(model)
    latent = model.latent_sites
    with torch.inference_mode(False):  # (an inference tensor cloned into a normal one)
        x, y = check_data(x, y)  # first: mcmc(model, guide, x, y, 100, 50) shifts the rest
    num_chains = check_count(
        "num_chains", num_chains, "Chains are what R-hat compares; 4 is usual."
    )
    num_samples = check_int(
        "num_samples", num_samples, hint="It counts the draws each chain keeps: e.g. 500."
    )
    warmup_steps = check_int(
        "warmup_steps", warmup_steps, minimum=0, hint="It counts each chain's adaptation "
        "steps (0: no adaptation): e.g. 500.",
    )  # fmt: skip
    max_tree_depth = check_int(
        "max_tree_depth", max_tree_depth, hint="It caps NUTS's trajectory doublings: e.g. 10."
    )
    if seed is not None:
        seed = check_seed(seed, "mcmc()")
    check_flag("progress", progress)
    check_flag("force", force)
    if parallel is not None:
        check_flag("parallel", parallel)
    check_kernel(kernel)
    if module_dtype(model) in (torch.float16, torch.bfloat16):  # a prior's draws are float32
        raise TypeError(
            f"mcmc() samples in float32 or float64, got a {module_dtype(model)} model; NUTS's "
            "energies and step sizes need the precision. Sample a float32 copy, "
            "mcmc(copy.deepcopy(model).float(), x, y, ...): predict() takes its draws for "
            "this model too."
        )
    refuse_discrete_priors(model)
    size = sum(math.prod(shape) for shape in latent().values())
    if size > MAX_LATENT_VALUES and not force:
        raise ValueError(
            f"{type(model).__name__} has {size:,} latent values, above the {MAX_LATENT_VALUES:,} "
            "that NUTS handles in reasonable time here. Fit it by variational inference "
            "(fit() with mean_field_guide(model)), or pass force=True to sample it anyway."
        )
    from pyrouq.infer._elbo_checks import refuse_handlers_around

    refuse_handlers_around(model, "mcmc()", "log density")  # (its own plate "data", ...)
    # NUTS differentiates the density; Pyro's own tensors under the CPU default (cpu_default)
    with torch.inference_mode(False), torch.enable_grad(), cpu_default():
        result = _mcmc(
            model, x, y, num_samples, warmup_steps, num_chains, kernel, seed, progress,
            max_tree_depth, parallel,
        )  # fmt: skip
    message = trouble(result.sample_stats, kernel, max_tree_depth, warmup_steps)
    if message is not None:  # divergences, draws at max_tree_depth, chains not mixed
        warn_caller(message)
    return result


def _mcmc(
    model: Any,
    x: Any,
    y: Any,
    num_samples: int,
    warmup_steps: int,
    num_chains: int,
    kernel: str,
    seed: int | None,
    progress: bool,
    max_tree_depth: int,
    parallel: bool | None,
) -> MCMCResult:
    """:func:`mcmc` past its checks of the arguments, gradients on whatever the caller's
    grad mode (``torch.no_grad``, ``torch.inference_mode``)."""
    latent = model.latent_sites
    torch.clear_autocast_cache()  # an autocast around mcmc() caches casts of old weights
    device = module_device(model)
    if device is not None:  # as predict() and to_inference_data(): the data go to the model
        x, y = x.to(device), y.to(device)
    x = model_input(x, model, "mcmc()")
    check_finite_inputs(x, "mcmc()")
    # one layout for the same values: a transposed or sliced x rounds the gradients otherwise,
    # and the chains drift apart from those of the same data, same seed
    x, y = x.contiguous(), y.contiguous()
    num_data, was = model.num_data, modes(model)
    model.eval()  # before any pass: train-mode BatchNorm would update its running statistics
    try:  # every module's mode and num_data are restored however this ends
        # in the model's precision, as the chain processes run (an autocast around mcmc()
        # would run the chains here in float16 or bfloat16, with other draws)
        with _autocast_off(device):
            chains, y = _run_chains(
                model, x, y, kernel, warmup_steps, num_samples, num_chains, seed, progress,
                max_tree_depth, parallel,
            )  # fmt: skip
    finally:
        model.num_data = num_data
        restore_modes(was)
    samples = {k: torch.stack([c[0][k] for c in chains]) for k in chains[0][0]}
    stats = {k: torch.stack([c[1][k] for c in chains]) for k in chains[0][1]}
    order = list(latent())
    samples = {k: samples[k] for k in order if k in samples}
    return MCMCResult(samples, stats, kernel, warmup_steps, [c[2] for c in chains], model, x, y)


def _run_chains(
    model: Any,
    x: Tensor,
    y: Tensor,
    kernel: str,
    warmup_steps: int,
    num_samples: int,
    num_chains: int,
    seed: int | None,
    progress: bool,
    max_tree_depth: int,
    parallel: bool | None,
) -> tuple[list[Any], Tensor]:
    """:func:`mcmc`'s chains, the model in eval mode: the targets checked against one pass,
    then every chain run, in parallel processes or one after another; and y as they ran on
    it (real targets in the model's dtype). The pass runs with gradients, as NUTS runs the
    network, and warns of layers holding latent weights that it runs only under
    ``torch.no_grad()`` (:func:`~pyrouq._engine._layer_calls.no_grad_watched`): the chains'
    gradient would miss them."""
    with no_grad_watched():
        try:
            weights = model.template()  # (the trace as a context: errors pass unchanged)
            with pyro.poutine.trace() as tracer, model._hiding_own_sites(weights):
                outputs = model.outputs(x, weights)
        except (RuntimeError, ValueError) as err:  # torch's, e.g. a shape mismatch (as fit())
            if not input_mismatch(err):  # the user's own error, out of memory, a CUDA error
                raise
            raise ValueError(
                f"mcmc(): {type(model).__name__} failed on x (shape {tuple(x.shape)}, dtype "
                f"{x.dtype}): {restated(err, inputs_fix(err, x.dtype))}; nothing was sampled."
            ) from err
    refuse_own_latents(model, tracer.trace)
    # the pass's graph (point estimates of a last-layer model require grad) let go: the chains
    # would otherwise hold a forward over all of x beside their own
    del tracer
    outputs = outputs.detach()
    with pyro.validation_enabled(True):  # the labels' range once, whatever the setting
        model.likelihood.check_targets(y, outputs, "mcmc()")  # (y's dtype as the caller's)
    model.num_data = x.shape[0]  # (the forward's likelihood scale: 1, as the chains run it)
    built_in = (  # pyrouq's own forward and likelihood: they sample the latent sites alone
        isinstance(model, BayesianNetwork)
        and not own_forward(model)  # (nor one set on the instance; m.forward compiled is ours)
        and type(model.likelihood).__module__.startswith("pyrouq.")
    )
    if not built_in:  # a forward, or a likelihood's prepare()/observe(), of the user's own
        refuse_forward_sites(model, x, y)
    dtype = module_dtype(model)
    if y.is_floating_point() and dtype is not None and y.dtype != dtype:
        y = y.to(dtype)  # a float64 y would turn the log density, then NUTS's weights, float64
    likelihood = model.likelihood
    if getattr(likelihood, "mode", None) == "learned":
        _, scale = likelihood.loc_scale(outputs)
        values = ", ".join(f"{v:.4g}" for v in scale.reshape(-1, scale.shape[-1])[0].tolist())
        warn_caller(  # (the caller's line, however many of pyrouq's frames are between)
            f"mcmc(): the noise scale of Gaussian('learned') is a point estimate, held at its "
            f"current value ({values}) while NUTS samples the weights; untrained, it is 1. For "
            "a reference posterior give it a prior, Gaussian(dist.HalfNormal(1.0)), or fit() "
            "the model first."
        )
    base = seed if seed is not None else int(torch.randint(0, 2**31 - 1, ()).item())
    cores = _cores()
    if parallel is None:
        long_enough = warmup_steps + num_samples >= PARALLEL_MIN_STEPS
        parallel = num_chains > 1 and cores > 1 and long_enough and spawn_problem(model) is None
    elif parallel and num_chains > 1:
        problem = spawn_problem(model)
        if problem is not None:
            raise ValueError(
                f"mcmc(parallel=True) runs the chains in new processes, which {problem}, or "
                "pass parallel=False."
            )
    parallel = parallel and num_chains > 1  # one chain runs here, with the caller's threads
    workers = min(num_chains, cores)
    jobs = [
        (model, x, y, kernel, warmup_steps, num_samples, (base + chain) % (MAX_SEED + 1),
         chain, progress, max_tree_depth, max(1, cores // workers) if parallel else None)
        for chain in range(num_chains)
    ]  # fmt: skip
    if parallel:
        return parallel_chains(jobs, workers), y
    with global_streams_kept(module_device(model)):  # left as found, as by other processes
        return [chain_job(job) for job in jobs], y


@contextlib.contextmanager
def _autocast_off(device: torch.device | None) -> Iterator[None]:
    """torch.autocast turned off on the CPU and on ``device`` while the block runs."""
    with contextlib.ExitStack() as stack:
        for kind in dict.fromkeys(("cpu", device.type if device is not None else "cpu")):
            try:
                stack.enter_context(torch.autocast(kind, enabled=False))
            except RuntimeError:  # a device type autocast does not know: none to turn off
                pass
        yield


def _cores() -> int:
    """The cores this process may run on (its affinity, where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1
