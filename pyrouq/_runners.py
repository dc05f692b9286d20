"""How :func:`pyrouq.predict` evaluates a model on one input batch: one runner per kind of
model (a plain network, a BatchEnsemble, a Pyro model run S times, a Bayesian model under S
weight draws), and how many weight draws it holds at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from pyro import poutine
from torch import Tensor, nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from pyrouq import _batchnorm as batchnorm
from pyrouq import _engine
from pyrouq import _own_models as own_models
from pyrouq._forwards import forward_module
from pyrouq._guide_draws import draw_guide, sampled_directly, takes_inputs_alone
from pyrouq._own_likelihood import check_likelihood_logits
from pyrouq._param_store import take_store_values
from pyrouq._plate_room import batch_room
from pyrouq._util import (
    AsItCame,
    check_flag,
    class_name,
    has_latent_sites,
    rng_state,
    seed_generators,
    set_rng_state,
    takes_labels,
    warn_caller,
)
from pyrouq._words import article
from pyrouq._wrappers import uncompiled
from pyrouq.infer._site_checks import check_draws
from pyrouq.infer.guide import MeanFieldGuide
from pyrouq.likelihoods import Categorical, likelihood_of
from pyrouq.likelihoods._categorical import are_probabilities, judged

#: Bytes of weight draws :func:`pyrouq.predict` holds at once by default (``max_draw_bytes``).
DEFAULT_MAX_DRAW_BYTES = 2**30


def check_arguments(model: Any, guide: Any, parallel: Any, progress: Any) -> None:
    """Refuse, before anything runs, a model or guide that predict() cannot call (what
    ``fit()`` returns, draws given as the guide, the inputs given first, a guide given as the
    model) and flags not True or False; then :func:`take_store_values` of model and guide."""
    from pyro.infer import MCMC
    from pyro.infer.autoguide import AutoGuide

    from pyrouq.infer import FitResult
    from pyrouq.mcmc import MCMCResult

    check_flag("parallel", parallel)
    check_flag("progress", progress)
    for name, value in (("model", model), ("guide", guide)):
        if isinstance(value, FitResult):
            raise TypeError(
                f"predict() got a FitResult as the {name}: fit() returns the record of its "
                "epochs (losses, steps) and trains the model and the guide in place. Pass "
                "them: result = fit(model, guide, loader, ...), then predict(model, x, guide)."
            )
        if name == "guide" and isinstance(value, (dict, MCMCResult, MCMC)):
            raise TypeError(
                f"predict() got posterior draws (a {type(value).__name__}) as the guide: pass "
                "them by name, predict(model, x, posterior_samples=draws)."
            )
        if name == "model" and isinstance(value, (MeanFieldGuide, AutoGuide)):
            raise TypeError(
                f"predict() got a guide ({type(value).__name__}) as the model: the model comes "
                "first, predict(model, x, guide)."
            )
        if (value is None and name == "guide") or callable(value):
            continue
        first = " The model comes first: predict(model, x, ...)." if torch.is_tensor(value) else ""
        if name == "guide" and isinstance(value, int) and not isinstance(value, bool):
            first = f" The draw count comes after the guide: predict(model, x, guide, {value})."
        what = "a pyrouq model, an nn.Module or a Pyro model function"
        if name == "guide":
            what = "mean_field_guide(model), a Pyro autoguide or guide function"
        kind = type(value).__name__
        raise TypeError(
            f"predict() expects the {name} to be callable ({what}), got {article(kind)} "
            f"{kind}.{first}"
        )
    take_store_values(model, guide)


def is_ensemble(model: nn.Module) -> bool:
    return isinstance(getattr(model, "num_members", None), int) and not has_latent_sites(model)


def logits_of(
    model: Any, x: Tensor, owner: Any = None, warn: bool = True, caller: str = "predict()"
) -> Tensor:
    """Run a Pyro model once and return its logits: its ``"logits"`` site when it records
    one, else its return value. ``owner``: the model ``model`` wraps (a ``poutine`` handler),
    whose name messages give and whose ``num_data`` makes room for ``x``. With ``warn``, a
    warning where they are not the logits its ``"obs"`` is drawn from (a runner's first).
    Messages name ``caller``."""
    owner = model if owner is None else owner
    with batch_room(owner, x.shape[0], caller):  # (a plate too small for x: refused)
        try:
            trace = poutine.trace(model).get_trace(x)
        except TypeError as err:  # forward(x, y): y without a default
            if takes_inputs_alone(owner, x):
                raise  # an error from inside the forward, not of its signature
            raise TypeError(
                f"{own_models.name_of(owner)} cannot run on the inputs alone ({err}): "
                "predictions run the model as model(x), without targets, as Pyro's Predictive "
                "does. Write forward(x, y=None) (the contract of DESIGN.md and Pyro's models: "
                "observe y where it is given, sample it where it is None)."
            ) from err
    recorded = "logits" in trace.nodes
    out = trace.nodes["logits" if recorded else "_RETURN"]["value"]
    own_models.check_logits(owner, out, x.shape[0], recorded, caller)
    if warn:  # (not every draw's: once per predict() call)
        check_likelihood_logits(own_models.name_of(owner), trace, out, caller)
    return out


def _refuse_prior_weights(model: Any, x: Tensor) -> None:
    """Refuse to predict with a Pyro model of the user's own that samples global latent sites
    (weights) when no draws were given: it would draw them from their priors, anew for every
    input batch. Sites that hold a value per input (a local latent variable) are fine."""
    latent = own_models.traced_latent_sites(model, x)
    if latent:
        raise ValueError(
            f"{own_models.name_of(model)} samples the latent sites {sorted(latent)} and "
            "predict() got no draws of them: it would draw them from their priors, new ones for "
            "every input batch. Pass its fitted guide, predict(model, x, guide), or "
            "posterior_samples=...; for draws from the prior, use pyro.infer.Predictive."
        )


def plain_runner(model: nn.Module):
    checked = not takes_labels(model)  # forward(x, y): maybe a Pyro model, whose sites count
    refuse = _probabilities_refused(model)
    named = uncompiled(model)  # (the module whose layers name a refusal: once, not per batch)

    def run(x: Tensor) -> Tensor:
        nonlocal checked
        trace = None
        if not checked and x.shape[0]:  # the first run traced: latent sites are refused
            checked = True
            try:
                trace = poutine.trace(model).get_trace(x)
            except Exception:  # Pyro rewraps errors: run it plainly, for its own error
                trace = None
        if trace is None:
            with _engine.LayersNamed(named, x, plain=True):
                logits = model(x)  # (a layer refusing x named at its path, with the fix)
        else:
            sampled = (
                node["type"] == "sample" and not node["is_observed"]
                for node in trace.nodes.values()
            )
            if any(sampled):
                _refuse_prior_weights(model, x)
            logits = trace.nodes["_RETURN"]["value"]
        if not torch.is_tensor(logits) or logits.dim() != 2:
            _engine.check_outputs(logits, model, x.shape[0])  # says what to return instead
        if logits.shape[0] != x.shape[0]:  # logits.T, or a subsample's: another input's
            raise ValueError(
                f"predict(): {own_models.name_of(model)} returned logits of shape "
                f"{tuple(logits.shape)} on a batch of {x.shape[0]} inputs, expected class "
                f"logits ({x.shape[0]}, C): {own_models.ONE_ROW_PER_INPUT})."
            )
        if trace is not None:  # a Pyro model: the logits of the Categorical "obs" draws from
            check_likelihood_logits(own_models.name_of(model), trace, logits)
        logits = logits.unsqueeze(0)
        refuse(logits)
        return logits

    return run


def _probabilities_refused(model: Any) -> Callable[[Tensor], None]:
    """A check of a classifier's outputs ``(S, B, C)`` that refuses, on its first batch of
    enough inputs to tell, class probabilities (a forward ending in a softmax), which
    predict()'s own softmax would flatten towards uniform:
    :meth:`~pyrouq.likelihoods.Categorical.refuse_probabilities`. Nothing for another
    likelihood's outputs."""
    likelihood = likelihood_of(model)
    checked = likelihood is not None and not isinstance(likelihood, Categorical)

    few: list[Tensor] = []  # batches too small to tell alone (a loader of batch_size=1)
    who = f"predict(): {class_name(model)}"

    def refuse(outputs: Tensor) -> None:
        nonlocal checked
        if checked:
            return
        if judged(outputs) or not judged(outputs, pooled=True):
            checked = Categorical.refuse_probabilities(outputs, who)
        elif not are_probabilities(outputs, pooled=True):
            checked = True  # a row of logits: the network's outputs are no probabilities
        else:  # rows of probabilities, too few to tell: pooled with the next batches'
            if few and few[0].shape[:-2] != outputs.shape[:-2]:
                few.clear()
            few.append(outputs.detach())
            checked = Categorical.refuse_probabilities(torch.cat(few, dim=-2), who)

    return refuse


def ensemble_runner(model: nn.Module):
    forward_module(model, "predict()")  # (a forward of its own is refused)
    outputs = getattr(model, "outputs", None)
    refuse = _probabilities_refused(model)

    def run(x: Tensor) -> Tensor:
        out = outputs(x) if callable(outputs) else model(x)
        refuse(out)
        return out

    return run


def sampled_runner(model: Any, num_samples: int, parallel: bool, batch_size: int):
    """A Pyro model of the user's own without draws, run S times from its priors. Its global
    latent sites (weights) are drawn S times once, at the first batch, and every batch runs
    under those draws, so that draw s is one network on all inputs; sites that hold a value
    per input are drawn anew with every batch, as they are per input."""
    inner: Callable[[Tensor], Tensor] | None = None
    first = _first_run()

    def every_run(x: Tensor) -> Tensor:
        return torch.stack([logits_of(model, x, warn=first(x)) for _ in range(num_samples)])

    def run(x: Tensor) -> Tensor:
        nonlocal inner
        if inner is None and not x.shape[0]:  # nothing to learn the sites from: the next
            state = rng_state(x.device)  # batch will, from the random state found here
            try:
                return every_run(x)
            finally:
                set_rng_state(x.device, state)
        if inner is None:
            draws = _prior_draws(model, x, num_samples)
            if draws:
                inner = bayesian_runner(
                    model, lambda _: draws, num_samples, parallel, batch_size, None, "the prior"
                )
                run.latent = inner.latent  # type: ignore[attr-defined,union-attr]
            else:
                inner = every_run
        return inner(x)

    return run


def _first_run() -> Callable[[Tensor], bool]:
    """True for the first batch of inputs (not empty) it is given, then False: a runner's
    model of the user's own has its logits checked once (:func:`logits_of`), not per draw."""
    pending = [True]

    def first(x: Tensor) -> bool:
        if pending and x.shape[0]:
            return bool(pending.pop())
        return False

    return first


def _prior_draws(model: Any, x: Tensor, num_samples: int) -> dict[str, Tensor]:
    """S draws of the model's global latent sites from their priors, ``{site: (S, *shape)}``,
    each from a run of the model on ``x`` (the first input batch: a prior may read the
    inputs) seeded by a draw of the random state, so that the first batch's size moves none
    of them; empty for a model with none."""
    sites = own_models.traced_latent_sites(model, x) or {}
    if not sites:
        return {}
    values: dict[str, list[Tensor]] = {site: [] for site in sites}
    # each run from a seed of its own, drawn first: a run also samples "obs" (a value per
    # input), which must not move the next run's weights with the first batch's size
    seeds = torch.randint(2**62, (num_samples,)).tolist()
    state = rng_state(x.device)
    try:
        for seed in seeds:
            seed_generators(x.device, seed)
            with batch_room(model, x.shape[0]):
                trace = poutine.trace(model).get_trace(x)
            for site, drawn in values.items():
                drawn.append(trace.nodes[site]["value"].detach())
    finally:
        set_rng_state(x.device, state)
    return {site: torch.stack(drawn) for site, drawn in values.items()}


def bayesian_runner(
    model: Any,
    source: Callable[[Tensor], dict[str, Tensor]],
    num_samples: int,
    parallel: bool,
    batch_size: int,
    refit: tuple[list[batchnorm.Norm], Callable[[], list[Tensor]]] | None = None,
    what: str = "the guide",
    copied: bool = False,
    guide: Any = None,
):
    """Take the S draws once (``source(x)`` at the first batch: a guide's draws, MCMC draws;
    ``what`` names them in messages: "the guide" or "posterior_samples"),
    then evaluate every input batch under them, ``chunk`` draws per pass so that at most
    ``max(batch_size, B)`` (input, draw) pairs are evaluated at once. With ``refit`` (the
    BatchNorm layers and the inputs to estimate their statistics on), each draw's statistics
    are estimated once, after the draws, and loaded before that draw runs. With ``copied``
    (draws of the caller's own), the network runs on a copy of each chunk, made as the chunk
    runs (anew for every input batch, and for every batch a draw's BatchNorm statistics are
    estimated on): a network that changes its weight in place (a ``clamp_``) changes neither
    the caller's tensors nor the next batch's draws, for one chunk's memory (all S draws
    copied at once held as much again as the draws)."""
    draws: dict[str, Tensor] = {}
    taken: list[bool] = []
    per_draw: list[list[tuple[Tensor, ...]]] = []  # with refit: each draw's statistics
    norms = refit[0] if refit is not None else []
    direct = getattr(model, "outputs", None) if has_latent_sites(model) else None
    # a rank-1 BatchEnsemble (M = 1 included): each draw runs its M members, draw-major
    ensemble = direct is not None and getattr(model, "num_members", None) is not None
    forward = forward_module(model, "predict()")  # (an ensemble's own forward: refused)
    if forward is not None:  # its forward, conditioned on each draw, with every site it
        direct = None  # samples (a temperature), as Pyro's Predictive runs it; torch.compile's
        model = forward  # module (outputs() ran uncompiled too)
    classes = forward is None or isinstance(likelihood_of(model), Categorical)
    members: int = model.num_members if ensemble else 1
    refuse = _probabilities_refused(model)
    first = _first_run()

    def logits(x: Tensor, data: dict[str, Tensor]) -> Tensor:
        if direct is not None:
            return direct(x, data)  # type: ignore[no-any-return]
        if forward is not None:
            return own_forward_outputs(model, x, data, first(x))
        return logits_of(poutine.condition(model, data=data), x, model, first(x))

    def draw(s: int, stop: int | None = None) -> dict[str, Tensor]:
        """Draw ``s`` (draws ``s`` to ``stop``, stacked, where given), copied if ``copied``."""
        index = s if stop is None else slice(s, stop)
        return {k: v[index].clone() if copied else v[index] for k, v in draws.items()}

    def on_draw(s: int) -> Callable[[Tensor], Tensor]:
        """The network on draw ``s``, copied anew at every call if ``copied``."""
        return lambda x: logits(x, draw(s))

    def run(x: Tensor) -> Tensor:
        if not taken:  # once, at the first batch (a model may keep no site of them)
            taken.append(True)
            drawn = source(x)
            if direct is not None:  # the model's latent sites only (autoguides add others)
                check_draws(model, drawn, "predict()", what, guide)
                drawn = {site: drawn[site] for site in model.latent_sites()}
            else:  # a model of the user's own: its latent sites, read off a trace
                drawn = own_models.fitting_draws(model, drawn, x, "predict()", what, classes, guide)
            draws.update(drawn)
            if refit is not None:
                inputs = refit[1]()
                for s in range(num_samples):
                    per_draw.append(batchnorm.estimate_statistics(norms, inputs, on_draw(s)))
        stackable = parallel and direct is not None and refit is None
        pairs = members * max(x.shape[0], 1)  # an empty batch: one pass, of no inputs
        chunk = min(num_samples, max(1, batch_size // pairs)) if stackable else 1
        out = []
        starts = range(0, num_samples, chunk)
        given = AsItCame(x, len(starts))  # as it came to every pass
        for start in starts:
            stop = min(start + chunk, num_samples)
            if stop - start == 1:
                if per_draw:  # this draw's own BatchNorm statistics
                    batchnorm.load_all(norms, per_draw[start])
                one = logits(given(), draw(start))
                out.append(one if ensemble else one.unsqueeze(0))
            else:
                many = logits(given(), draw(start, stop))
                out.append(many.flatten(0, 1) if ensemble else many)
        joined = torch.cat(out)
        if direct is not None:  # (a model of the user's own: logits_of checks its logits)
            refuse(joined)
        return joined

    def latent() -> dict[str, Tensor] | None:
        """The draws of the likelihood's own sites (a noise scale), one per output draw."""
        sites: dict[str, Any] = getattr(likelihood_of(model), "latent_sites", dict)()
        own = [site for site in sites if site in draws]  # one the model never samples: the
        if members == 1:  # likelihood refuses it, with its message
            return {site: draws[site] for site in own} or None
        return {site: draws[site].repeat_interleave(members, 0) for site in own} or None

    run.latent = latent  # type: ignore[attr-defined]
    return run


def own_forward_outputs(
    model: Any, x: Tensor, data: dict[str, Tensor], warn: bool, caller: str = "predict()"
) -> Tensor:
    """The outputs of ``model``'s own ``forward`` (``model``: the module
    :func:`~pyrouq._forwards.forward_module` gave, torch.compile's wrapper already taken off)
    run on ``x`` conditioned on one draw ``data``: its logits (:func:`logits_of`, checked, with
    ``warn`` and ``caller`` as it takes them) for a ``Categorical`` likelihood, else a
    regression's outputs, as its likelihood records them."""
    conditioned = poutine.condition(model, data=data)
    if isinstance(likelihood_of(model), Categorical):
        return logits_of(conditioned, x, model, warn, caller)
    return _recorded_outputs(conditioned, x, model)


def _recorded_outputs(conditioned: Any, x: Tensor, model: Any) -> Tensor:
    """The outputs a :class:`~pyrouq.BayesianNetwork`'s own ``forward`` records under one draw
    (``conditioned``: the model conditioned on it) at its likelihood's site (a Gaussian's
    ``"outputs"``), else those it returns."""
    trace = poutine.trace(conditioned).get_trace(x)
    site = getattr(likelihood_of(model), "output_site", "_RETURN")
    outputs: Tensor = trace.nodes[site if site in trace.nodes else "_RETURN"]["value"]
    return outputs


def draw_sizes(guide: Any, model: Any, count: int, max_bytes: int, x: Any) -> list[int]:
    """How :func:`pyrouq.predict` takes a guide's ``count`` draws: the draws of each pass over
    ``x``. All at once when they fit in ``max_bytes``; else in chunks that fit, for a
    :class:`~pyrouq.MeanFieldGuide` of a pyrouq model (whose draws, taken chunk after chunk
    in one random stream, are those of a single call) and an ``x`` that can be read again in
    the same order; else all at once, with a warning."""
    if not sampled_directly(guide) or getattr(model, "outputs", None) is None:
        return [count]
    with torch.no_grad():
        per_draw = sum(
            (loc := guide.site_loc(site)).numel() * loc.element_size() for site in guide.sites
        )
    fits = max(1, max_bytes // max(per_draw, 1))
    if fits >= count:
        return [count]
    if not repeatable(x):
        warn_caller(
            f"predict() holds all {count} weight draws at once ({count * per_draw / 2**30:.2f} "
            f"GiB, more than max_draw_bytes={max_bytes}): x is a {type(x).__name__}, which "
            "may not give its batches in the same order when read again, so the draws cannot "
            "be taken in chunks with a pass over x for each. Pass a tensor, a list of batches "
            "or a DataLoader that does not shuffle to bound the memory, or raise "
            "max_draw_bytes to silence this."
        )
        return [count]
    return [min(fits, count - start) for start in range(0, count, fits)]


def joined_passes(passes: list[list[Any]]) -> list[Any]:
    """The predictive parts of the passes over x (one pass per chunk of draws,
    :func:`draw_sizes`; one part per input batch), as the likelihood's ``predictions`` takes
    them: one pass's parts as they are, several passes' as one part holding them all, tensors
    ``(S, N, ...)`` or tuples of them, each part copied into its place and let go. The peak is
    then the parts and the whole, as for one pass joined by the likelihood, whatever the
    allocator keeps of the freed parts (their parts joined batch by batch first, a predict() in
    8 chunks of draws peaked one more copy of its probabilities above the same call in one on
    one machine and 0.3 of one on another; in 16 chunks of 1.2 GB, 4.75x against 3.75x)."""
    if len(passes) == 1:
        return passes.pop()
    for p, row in enumerate(passes[1:], 2):
        if len(row) != len(passes[0]):
            _other_batches(p, f"{len(row)} batches where the first gave {len(passes[0])}")
    if not passes[0]:  # no inputs (on every read)
        return passes.pop()
    first = passes[0][0]
    columns = len(first) if isinstance(first, tuple) else 0
    wholes = [_whole_of(passes, column) for column in range(max(columns, 1))]
    passes.clear()
    return [tuple(wholes)] if columns else wholes


def _whole_of(passes: list[list[Any]], column: int) -> Tensor:
    """Column ``column`` of the parts (or the parts, tensors) of ``passes`` in one tensor
    ``(S, N, ...)``: draws along dim 0 (pass after pass), inputs along dim 1 (batch after
    batch). Each part is dropped from ``passes`` once copied."""

    def part(p: int, b: int) -> Tensor:
        got = passes[p][b]
        return got[column] if isinstance(got, tuple) else got

    for p in range(1, len(passes)):
        for b in range(len(passes[0])):
            got, first = part(p, b), part(0, b)
            if got.shape[1:] != first.shape[1:] or got.dtype != first.dtype:
                _other_batches(
                    p + 1,
                    f"a batch {tuple(got.shape[1:])} {got.dtype} where the first gave "
                    f"{tuple(first.shape[1:])} {first.dtype} (batch {b})",
                )
    draws = [part(p, 0).shape[0] for p in range(len(passes))]
    inputs = [part(0, b).shape[1] for b in range(len(passes[0]))]
    one = part(0, 0)
    whole = one.new_empty((sum(draws), sum(inputs), *one.shape[2:]))
    for p, row in enumerate(passes):
        s0 = sum(draws[:p])
        for b in range(len(row)):
            n0 = sum(inputs[:b])
            whole[s0 : s0 + draws[p], n0 : n0 + inputs[b]] = part(p, b)
            if isinstance(row[b], tuple):  # let go of this column (the others still to copy)
                row[b] = tuple(t if i != column else None for i, t in enumerate(row[b]))
            else:
                row[b] = None
    return whole


def _other_batches(read: int, what: str) -> None:
    raise ValueError(
        f"predict(): x gave other batches on its read {read} than on its first ({what}): the "
        "chunks of draws (max_draw_bytes) read x once each, so x must give the same batches "
        "every time it is read. Pass a tensor, a list or a DataLoader that does not shuffle "
        "(and drops no batch at random), or a larger max_draw_bytes for one read."
    )


def repeatable(x: Any) -> bool:
    """Whether reading ``x`` again gives the same batches in the same order: a tensor, a list
    or tuple, a DataLoader with a sequential sampler, a loader with ``shuffle=False``."""
    if torch.is_tensor(x) or isinstance(x, (list, tuple)):
        return True
    if isinstance(x, DataLoader):
        batches = x.batch_sampler
        if batches is None:  # batch_size=None: the sampler's items are the batches
            return isinstance(x.sampler, SequentialSampler)
        return type(batches) is BatchSampler and isinstance(batches.sampler, SequentialSampler)
    return getattr(x, "shuffle", None) is False


class GuideDraws:
    """Draws of a guide taken chunk after chunk in one random stream: whatever runs between
    two calls (a pass over the inputs, a DataLoader taking its seed), the next call starts
    where the last one's draws ended, so the chunks' draws are, to the bit, those of one
    :func:`draw_guide` call for all of them. The first call draws from the state it finds: a
    DataLoader without a ``generator=`` has taken its seed from torch's stream by then."""

    def __init__(self, guide: Any, device: torch.device | None) -> None:
        self.guide = guide
        self.device = device if device is not None else torch.device("cpu")
        self.state: tuple[Tensor, Tensor | None] | None = None
        self.dtypes: dict[str, torch.dtype] = {}  # the last draws' floating sites' dtypes

    def __call__(self, num_samples: int, x: Tensor) -> dict[str, Tensor]:
        if self.state is not None:
            set_rng_state(self.device, self.state)
        with batch_room(self.guide, x.shape[0], guide=True):  # its plate too small: refused
            draws = draw_guide(self.guide, num_samples, (x,))
        self.state = rng_state(self.device)
        self.dtypes = {k: v.dtype for k, v in draws.items() if v.is_floating_point()}
        return draws


class AsTheyCame:
    """x's input batches for each of ``passes`` passes over x (the draws' chunks), as they
    came: a network that changes its input in place changes the first pass's batches (as
    calling it would), and the later passes read a copy of each batch of x it changed. A
    batch is copied just before its first pass and kept only if the network changed it and
    the batch is x's own (not a cast or moved copy that every pass makes anew); a later pass
    takes the copy only for the same batch (a loader making its batches anew gives others)."""

    def __init__(self, passes: int):
        self.passes = passes
        self.changed: dict[int, tuple[Tensor, int]] = {}  # index -> (copy, x's storage)
        self.unchanged: set[int] = set()  # batches the network left alone

    def run(self, index: int, batch: Tensor, inputs: Tensor, run: Callable[[Tensor], Any]) -> Any:
        """``run(inputs)``, ``inputs`` being the ``index``-th ``batch`` of x as prepared."""
        if self.passes < 2 or index in self.unchanged or _storage(inputs) != _storage(batch):
            return run(inputs)
        if index in self.changed:
            copy, storage = self.changed[index]
            return run(copy.clone() if storage == _storage(batch) else inputs)
        given = AsItCame(inputs, 2)
        out = run(inputs)
        if given.changed():
            self.changed[index] = (given.copy, _storage(batch))  # type: ignore[assignment]
        else:
            self.unchanged.add(index)
        return out


def _storage(x: Tensor) -> int:
    return int(x.untyped_storage().data_ptr())
