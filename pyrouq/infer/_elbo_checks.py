"""What :class:`pyrouq.KLWeightedELBO` checks of its settings and of the arguments of a call:
the KL weight, the model's inputs and labels, whether the guide is one for the model, and
whether a Pyro effect handler (a plate) is active around the call."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from typing import Any

import pyro
import torch
from pyro.distributions.util import scale_and_mask
from pyro.infer.autoguide import AutoGuide, AutoGuideList
from pyro.poutine.block_messenger import BlockMessenger
from pyro.poutine.condition_messenger import ConditionMessenger
from pyro.poutine.do_messenger import DoMessenger
from pyro.poutine.guide import GuideMessenger
from pyro.poutine.indep_messenger import IndepMessenger
from pyro.poutine.messenger import Messenger
from pyro.poutine.seed_messenger import SeedMessenger
from pyro.poutine.trace_messenger import TraceMessenger
from pyro.poutine.util import site_is_subsample
from pyro.util import check_model_guide_match, check_site_shape

from pyrouq._forwards import own_forward
from pyrouq._numbers import finite_float, is_real, shown, tensor_hint, text_hint
from pyrouq._own_models import (
    guiding_sites,
    name_of,
    observes_something,
    samples_targets_unobserved,
    unobserved_sites,
)
from pyrouq._util import class_name, takes_labels, warn_caller
from pyrouq._wrappers import uncompiled
from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork
from pyrouq.infer._site_checks import check_drawable
from pyrouq.infer.guide import MeanFieldGuide, check_guide, refuse_guide_as_model

try:  # Pyro's private rule of a default poutine.block() (absent: every block is traced)
    from pyro.poutine.block_messenger import _block_fn
except ImportError:  # pragma: no cover (a Pyro that renamed it)
    _block_fn = None  # type: ignore[assignment]
# (read once: _hides_every_site runs for each handler around every ELBO call)
_BLOCK_SIGNATURE = inspect.signature(_block_fn) if _block_fn is not None else None

_CALLER = "KLWeightedELBO"


def check_traces(model_trace: Any, guide_trace: Any, max_plate_nesting: float) -> None:
    """What Pyro's ``Trace_ELBO`` checks of the traces under validation (its
    ``get_importance_trace``): the model and guide draw the same latent sites, and each sample
    site's log-density has the shape its plates give it (``check_site_shape``: a
    ``poutine.mask(model, mask)`` of one entry per data point around the whole model masks
    the global weight sites too, whose ``log p`` would count once per entry kept). The shapes
    are read off the sites (``fn``, ``value``, ``scale``, ``mask``); only where that shape is
    refused is the density taken, and the refusal is then Pyro's on it (a distribution of
    one's own may sum over dims its shapes leave batched, which Pyro takes)."""
    guiding = guiding_sites(model_trace, guide_trace)
    check_model_guide_match(model_trace, guiding, max_plate_nesting)
    for trace in (model_trace, guiding):
        for site in trace.nodes.values():
            if site["type"] == "sample" and not site_is_subsample(site):
                shape = _log_prob_shape(site)
                if shape is not None:  # (else computing the density raises torch's error)
                    _check_site_shape(site, shape, max_plate_nesting)


def _check_site_shape(site: Any, shape: torch.Size, max_plate_nesting: Any) -> None:
    """Pyro's ``check_site_shape`` of ``site`` on a log-density of ``shape``; where that is
    refused, on the density itself as Pyro's ``Trace_ELBO`` takes it (scaled and masked), so
    that only what Pyro refuses is refused, in its words."""
    try:  # (max_plate_nesting: inf until known, as Pyro's ELBOs pass it)
        check_site_shape({**site, "log_prob": torch.empty(shape, device="meta")}, max_plate_nesting)
    except ValueError:
        with torch.no_grad():
            log_p = site["fn"].log_prob(site["value"], *site["args"], **site["kwargs"])
            log_p = torch.as_tensor(scale_and_mask(log_p, site["scale"], site["mask"]))
        check_site_shape({**site, "log_prob": log_p}, max_plate_nesting)


def _log_prob_shape(site: Any) -> torch.Size | None:
    """The shape of a sample site's scaled and masked ``log_prob`` as Pyro computes it, or
    None where its parts do not broadcast or are not known."""
    fn, value = site["fn"], site["value"]
    batch, event = getattr(fn, "batch_shape", None), getattr(fn, "event_shape", None)
    if batch is None or event is None:
        return None
    parts = [batch]
    if torch.is_tensor(value):
        parts.append(value.shape[: max(value.dim() - len(event), 0)])
    parts += [w.shape for w in (site["scale"], site["mask"]) if torch.is_tensor(w)]
    try:
        return torch.broadcast_shapes(*parts)
    except (RuntimeError, ValueError):
        return None


PARTICLES_HINT = "Pass the number of draws from the guide per step, e.g. num_particles=1."
"""What to do about a ``num_particles`` that is no count (:class:`KLWeightedELBO`'s)."""


def check_kl_weight(kl_weight: object) -> float:
    """``kl_weight`` as a float, refused unless it is a finite real number >= 0."""
    if not is_real(kl_weight):
        raise TypeError(
            f"Expected kl_weight to be a float >= 0, got {kl_weight!r}{tensor_hint(kl_weight)}"
            f"{text_hint(kl_weight, 'kl_weight', 0, low_allowed=True)}. "
            f"Pass a number, e.g. kl_weight=1.0 (the exact ELBO).{annealing_hint(kl_weight)}"
        )
    if (number := finite_float(kl_weight)) is None or number < 0:
        raise ValueError(
            f"Expected kl_weight to be a finite float >= 0, got {shown(kl_weight)}. "
            "kl_weight = 1 is the exact ELBO; 0 <= kl_weight < 1 down-weights the prior."
        )
    return number + 0.0  # -0.0 as 0.0 (shown "-0" in a repr and a record)


def annealing_hint(kl_weight: object, caller: str = "KLWeightedELBO") -> str:
    """For a callable ``kl_weight`` (a KL annealing schedule), how to anneal: set
    ``KLWeightedELBO.kl_weight`` between steps (each loss reads it), under Pyro's SVI for
    fit(), which trains under one weight; "" for anything else."""
    if not callable(kl_weight):
        return ""
    how = (
        "set elbo.kl_weight between steps instead, each step's loss takes the value set"
        if caller == "KLWeightedELBO"
        else "fit() trains under one kl_weight; train with pyro.infer.SVI(model, guide, optim, "
        "elbo), elbo = pyrouq.KLWeightedELBO(), and set elbo.kl_weight between steps"
    )
    return (
        f" A schedule (KL annealing) is not taken as a function: {how}, e.g. "
        "elbo.kl_weight = min(1.0, step / 1000) before each svi.step(x, y)."
    )


def model_inputs(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """``(x, y)`` from the arguments of a pyrouq model's ``forward(x, y=None)``."""
    x = args[0] if args else kwargs.get("x")
    y = args[1] if len(args) > 1 else kwargs.get("y")
    return x, y


def lacks_labels(model: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the call left the model's label slot empty: y given as None, or not given to a
    model whose forward takes a second argument (Pyro's ``model(data)`` has none)."""
    if len(args) > 1 or "y" in kwargs:
        return model_inputs(args, kwargs)[1] is None
    try:
        named = inspect.signature(getattr(model, "forward", model)).parameters.values()
    except (TypeError, ValueError):  # no signature to read
        return False
    slots = [p for p in named if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(slots) > 1


def needs_labels(y: Any) -> None:
    if y is None:
        raise ValueError(
            "KLWeightedELBO needs the labels: the model's site 'obs' was not observed "
            "(y=None). Pass them, e.g. elbo.loss(model, guide, x, y)."
        )


def refuse_unbuilt_without_labels(guide: Any, labelled: bool, x: Any = None) -> None:
    """Refuse a call without the labels (``y=None``) whose guide is a Pyro autoguide that has
    never run: it would be built on that call, tracing the model with its ``"obs"`` site
    unobserved, and guide the targets as a latent site for good (Pyro's words on a discrete
    one, to enumerate it; a number for a continuous one, and warnings of a guide site
    ``'obs'`` the model observes at every call after). The guide is left unbuilt. So is a
    ``GuideMessenger`` (AutoNormalMessenger) refused, which runs the model at every call, where
    its model samples ``"obs"`` on the inputs ``x`` alone (traced under its priors, the random
    state kept): it would guide the targets, and keep parameters for them."""
    if labelled:
        return
    if isinstance(guide, AutoGuide) and guide.prototype_trace is None:
        how = "has not run yet: built on this call, on the inputs alone, it"
        end = ", for good"
    elif isinstance(guide, GuideMessenger) and _samples_targets(guide.model, x):
        how = "runs the model at every call: on the inputs alone, it"
        end = " (and keep parameters for it)"
    else:
        return
    raise ValueError(
        f"KLWeightedELBO needs the labels, which were not given (y=None), and the guide "
        f"{type(guide).__name__} {how} would take the site the model samples in the targets' "
        f"place ('obs') for one of its latent sites{end}. Pass them, e.g. "
        "elbo.loss(model, guide, x, y)."
    )


def _samples_targets(model: Any, x: Any) -> bool:
    """Whether ``model`` samples the targets' site ``"obs"`` unobserved on the inputs ``x``
    alone (:func:`~pyrouq._own_models.samples_targets_unobserved`)."""
    return torch.is_tensor(x) and samples_targets_unobserved(model, x)


def _hides_every_site(handler: Messenger) -> bool:
    """Whether ``handler`` is a ``poutine.block()`` that hides every site from the handlers
    outside it: its default (``hide_all=True``, no ``expose`` nor ``expose_types`` list), not
    one given a ``hide_fn`` or ``expose_fn`` of the user's own. Read from Pyro's private
    ``_block_fn`` arguments by name; where they cannot be read (a Pyro that changed them),
    False: the handler is then treated as any other (the ELBO traces: correct, only slower)."""
    return _hides(handler, ())


def _hides_sample_sites(handler: Messenger) -> bool:
    """Whether ``handler`` is a ``poutine.block()`` that hides every sample site, observed or
    not, from the handlers outside it (``expose_types=["param"]``, ``hide_types=["sample",
    "observe"]``), read as :func:`_hides_every_site` reads one."""
    return _hides(handler, ("sample", "observe"))


def _hides(handler: Messenger, kinds: tuple[str, ...]) -> bool:
    """Whether ``handler`` is a default ``poutine.block()`` that hides every site of the
    ``kinds`` (none: of every kind) whatever its name."""
    hide = getattr(handler, "hide_fn", None) if isinstance(handler, BlockMessenger) else None
    if _BLOCK_SIGNATURE is None or not (
        isinstance(hide, functools.partial) and hide.func is _block_fn
    ):
        return False
    try:
        given = _BLOCK_SIGNATURE.bind_partial(*hide.args, **hide.keywords).arguments
        every = bool(given["hide_all"]) and not given["expose"]  # (a name exposed: any site)
        if not kinds:
            return every and not given["expose_types"]
        return all(
            k in given["hide_types"] or (every and k not in given["expose_types"]) for k in kinds
        )
    except Exception:  # (arguments renamed or reordered past reading)
        return False


def _pyro_stack() -> list[Messenger] | None:
    """Pyro's stack of active effect handlers (private: None if a Pyro renamed it)."""
    stack = getattr(pyro.poutine.runtime, "_PYRO_STACK", None)
    return None if stack is None else list(stack)


def _visible_handlers() -> Iterator[Messenger]:
    """The Pyro effect handlers active around the call that see its sites: from the innermost
    (the end of Pyro's stack, which applies it first) outward, up to a ``poutine.block()``
    that hides every site (``SVI.run`` wraps its steps in one): those outside it see none."""
    for handler in reversed(_pyro_stack() or []):
        if _hides_every_site(handler):
            return
        yield handler


def handlers_active() -> bool:
    """Whether a Pyro effect handler that could change the model's or guide's sites is active
    around the call (``poutine.scale``, ``mask``, ``condition``, a trace recording sample
    sites...): the ELBO then traces both, so that the handler applies as it does to Pyro's
    own ELBOs. ``SVI.step``'s capture of the parameters (``poutine.trace(param_only=True)``),
    ``poutine.seed``, a ``poutine.block()`` itself (it hides sites from the handlers outside
    it, which still count, and changes none) and handlers outside one that hides every site
    change no site (:func:`_visible_handlers`). Without Pyro's stack to read (a Pyro that
    renamed it), any handler counts (Pyro's public ``am_i_wrapped``): the ELBO traces,
    correct."""
    if _pyro_stack() is None:
        return bool(pyro.poutine.runtime.am_i_wrapped())
    return any(
        not isinstance(handler, SeedMessenger)
        and type(handler) is not BlockMessenger  # (a subclass may do more than hide)
        and not (isinstance(handler, TraceMessenger) and handler.param_only)
        for handler in _visible_handlers()
    )


def own_model(model: Any) -> Any:
    """``model`` if it is a pyrouq model (perhaps compiled: ``torch.compile``'s wrapper holds
    it as ``_orig_mod``; no other wrapper, nor a module of the user's own that has such an
    attribute, is looked through), else None."""
    model = uncompiled(model)
    return model if isinstance(model, (BayesianNetwork, BatchEnsembleNetwork)) else None


def _own_plates(model: BayesianNetwork | BatchEnsembleNetwork) -> int:
    """How many plates a pyrouq model's ``forward`` nests: ``"data"`` over the batch (dim -1),
    and for an ensemble ``"members"`` (dim -2)."""
    return 1 if getattr(model, "num_members", None) is None else 2


def refuse_plate_around(model: Any, caller: str, call: str, weighed: str | None = "loss") -> None:
    """Refuse a vectorised ``pyro.plate`` active around ``caller``'s ``call`` of a pyrouq model
    (one outside a ``poutine.block()`` that hides every site is not), before anything runs:
    the model observes its targets inside a ``pyro.plate("data")`` of its own (an ensemble
    also inside ``"members"``), which such a plate duplicates or collides with (Pyro's bare
    "duplicate plate" or "collide at dim"), or which broadcasts the weights to other shapes.
    A sequential plate (``for i in pyro.plate``) changes no shape and is let through, as is
    any plate around a model of the user's own. ``weighed``: what the plate would multiply
    (mcmc() has no loss: its log density), which ``poutine.scale`` weighs instead; None where
    the call reads no such sum (the arviz export's pointwise log-likelihood)."""
    own = own_model(model)
    if own is None:
        return
    for handler in _visible_handlers():
        if isinstance(handler, IndepMessenger) and handler.dim is not None:
            two = _own_plates(own) > 1
            members = " and pyro.plate('members') at dim=-2" if two else ""
            weigh = (
                f" (multiplying the {weighed}). Call {call} outside the plate; to weigh the "
                f"{weighed}, put pyro.poutine.scale(scale=...) around the call instead."
                if weighed
                else f". Call {call} outside the plate."
            )
            raise ValueError(
                f"{caller} got {type(own).__name__} called inside "
                f"pyro.plate({handler.name!r}, {handler.size}, dim={handler.dim}), expected no "
                "plate around the call: the model observes its targets inside "
                f"{'plates' if two else 'a plate'} of its own, pyro.plate('data') over the "
                f"batch at dim=-1{members}, which a plate around it duplicates, collides "
                f"with or broadcasts the weights over{weigh}"
            )


_FIXED_SITE = {
    "fit()": "its guide would draw sites the model then observes (Pyro's 'site ... must be "
    "sampled in trace')",
    "mcmc()": "its draws would lack those sites, which predict() and to_inference_data() need",
    "predict()": "it draws every latent site from the guide or the posterior samples, and "
    "would ignore the values given",
    "psis_diagnostic()": "it weighs the guide's draws of every latent site, which the values "
    "given would replace",
    "to_inference_data()": "it exports the draws of every latent site, which the values given "
    "would replace",
}
"""Why each caller refuses a ``poutine.condition()`` fixing latent sites around it."""

_INTERVENED = {
    "fit()": "the network would run with the values given while its guide learnt those sites "
    "from their prior alone (do() samples each anew under another name, unused)",
    "mcmc()": "its draws of those sites would come from their prior alone, the network "
    "running with the values given",
}
"""Why fit() and mcmc() refuse a ``poutine.do()`` intervening on latent sites around them
(the other callers as :data:`_FIXED_SITE` says)."""

_OVERWRITTEN = {
    "fit()": "the guide's draw",
    "mcmc()": "NUTS's value",
    "psis_diagnostic()": "the guide's draw",
}
"""The callers whose runs a ``poutine.condition()`` giving None for a latent site breaks, and
the value it writes over: Pyro leaves the site unobserved but sets its value to None, after the
handlers inside (a replay of the guide, NUTS's conditioning) gave it one (Pyro's own SVI fails
so, "assert msg['value'] is not None"); predict() and to_inference_data() run as without it."""


def refuse_handlers_around(
    model: Any, caller: str, weighed: str | None = "loss", trace: bool = True
) -> None:
    """Before ``caller`` (fit(), mcmc(), the diagnostics) runs anything: refuse a vectorised
    plate, a trace recording sample sites (not with ``trace=False``: the diagnostics, which
    never refused one) and a condition (or do()) fixing latent sites around it (the three
    below)."""
    refuse_plate_around(model, caller, caller, weighed)
    if trace:
        refuse_trace_around(caller)
    refuse_condition_around(model, caller)


def refuse_condition_around(model: Any, caller: str) -> None:
    """Refuse a ``pyro.poutine.condition()`` around ``caller`` that fixes latent sites of a
    pyrouq model (one outside a ``poutine.block()`` that hides every site is not seen):
    fit() failed in Pyro's words, mcmc() gave draws without those sites, which predict() and
    to_inference_data() then refused as another model's, predict() ignored it, and the
    diagnostics said the guide did not belong to the model. One that
    conditions other sites (the targets, ``"obs"``) is let through, as Pyro applies it, and so
    is a value of None, which Pyro leaves unobserved, where the run survives it (else refused
    as :data:`_OVERWRITTEN` says, not as fixing the site). A ``pyro.poutine.do()`` intervening on
    latent sites is refused the same way: fit() trained the guide on their prior alone (the
    network ran with the values), mcmc() drew them from their prior, predict() ignored it."""
    own = own_model(model)
    latent = getattr(own, "latent_sites", None)
    if not callable(latent):
        return
    for handler in _visible_handlers():
        if not isinstance(handler, (ConditionMessenger, DoMessenger)):
            continue
        do, given = isinstance(handler, DoMessenger), handler.data
        data: dict[str, Any] = (  # site names to values (None: not fixed)
            {name: node.get("value") for name, node in given.nodes.items()}
            if isinstance(given, pyro.poutine.Trace)
            else dict(given)
        )
        fixed = [site for site in latent() if data.get(site) is not None]
        nones = [site for site in latent() if site in data and data[site] is None]
        if nones and not do and caller in _OVERWRITTEN:
            raise ValueError(
                f"{caller} was called inside pyro.poutine.condition() giving None for latent "
                f"site(s) {_names(nones)} of {type(own).__name__}: Pyro observes nothing there "
                f"but writes the None over {_OVERWRITTEN[caller]} of the site, so the run "
                f"would fail in Pyro's words. Leave the None entries out of data (they "
                f"condition nothing), or call {caller} outside the handler."
            )
        if fixed:
            why = (do and _INTERVENED.get(caller)) or _FIXED_SITE[caller]
            raise ValueError(
                f"{caller} was called inside pyro.poutine.{'do' if do else 'condition'}() "
                f"fixing latent site(s) {_names(fixed)} of {type(own).__name__}, expected "
                f"none fixed: {why}. Call "
                f"{caller} outside the handler; to hold a weight fixed, leave its layer a "
                "point estimate (bayesian(net, select=...) without it) and set its value."
            )


def _names(sites: list[str]) -> str:
    """Up to three ``sites`` quoted, "..." for more."""
    return f"{', '.join(map(repr, sites[:3]))}{', ...' if len(sites) > 3 else ''}"


def refuse_trace_around(caller: str) -> None:
    """Refuse a ``pyro.poutine.trace()`` recording sample sites around ``caller``, a run of
    many steps (one recording parameters only, as ``SVI.step``'s, or outside a
    ``poutine.block()`` that hides every site, is let through): each step runs the model
    again, whose sites the trace would record a second time, Pyro's bare "Multiple sample
    sites named '0.weight'" (a guide's draw and the model's of the same site: at once). A
    ``poutine.block()`` hiding every sample site (``expose_types=["param"]``) hides them from
    a trace outside it, which records parameters alone: let through too."""
    for handler in _visible_handlers():
        if _hides_sample_sites(handler):
            return
        if isinstance(handler, TraceMessenger) and not handler.param_only:
            raise ValueError(
                f"{caller} was called inside pyro.poutine.trace(), expected no trace around "
                "the call: each of its steps runs the model again, whose sample sites a trace "
                "records once only (Pyro's 'Multiple sample sites named ...'). Call "
                f"{caller} outside the trace; to see the model's sites, trace one run of it: "
                "pyro.poutine.trace(model).get_trace(x, y)."
            )


def set_known_plate_nesting(elbo: Any, model: Any, guide: Any) -> None:
    """Before ``elbo`` traces ``model`` against ``guide`` with vectorised particles, set its
    ``max_plate_nesting``, if not given, to the plates a pyrouq model nests (with a
    :class:`MeanFieldGuide`, an autoguide or no guide, which add none), so that Pyro does not
    guess it from a trace of its own (which draws from the random streams and logs "Guessed
    max_plate_nesting"). Kept afterwards, as Pyro keeps the value it guesses."""
    own = own_model(model)
    if (
        elbo.vectorize_particles
        and elbo.max_plate_nesting == float("inf")
        and own is not None
        and not own_forward(own)  # (a subclass's, or one set on the instance, may add plates)
        and (
            is_empty_guide(guide)
            or isinstance(guide, MeanFieldGuide)
            or (isinstance(guide, AutoGuide) and not isinstance(guide, AutoGuideList))
        )
    ):
        elbo.max_plate_nesting = _own_plates(own) + (elbo.num_particles > 1)


def warn_local(local: str, model: Any, guide: Any, direct: bool) -> None:
    """Warn that ``model`` (``local``: what in it asks for local reparameterisation) is traced
    and its weights sampled; ``direct``: it and ``guide`` would run directly but for a Pyro
    effect handler around the call (:func:`handlers_active`)."""
    if direct:
        why = (
            "a Pyro effect handler (poutine.scale, mask, condition, a plate, a trace...) is "
            "active around the call, so the model is traced"
        )
        fix = "Call the ELBO outside the handler for local reparameterisation."
    else:
        why = (
            "KLWeightedELBO applies it to a model made by pyrouq.bayesian() with a "
            f"MeanFieldGuide only (it needs the guide's locations and scales), got "
            f"{type(model).__name__} with {type(guide).__name__}"
        )
        fix = (
            "Convert the network with pyrouq.bayesian(net, local_reparameterization=True) and "
            "use pyrouq.mean_field_guide(model)."
        )
    warn_caller(  # (the caller's line: ELBO.loss(), SVI.step() and fit() are between)
        f"{local} has local_reparameterization=True, but {why}: weights are sampled instead. {fix}"
    )


def local_owner(model: Any) -> str | None:
    """What in ``model`` asks for local reparameterisation (the model, or a pyrouq.nn layer
    inside a model of the user's own), named for a warning; None if nothing does."""
    if getattr(model, "local_reparameterization", False):
        return type(model).__name__
    if isinstance(model, torch.nn.Module):
        for name, module in model.named_modules():
            if getattr(module, "local_reparameterization", False):
                return f"{type(model).__name__}'s layer {name!r} ({class_name(module)})"
    return None


_AUTO_NORMAL = "e.g. pyro.infer.autoguide.AutoNormal(model)"


def refuse_unguided(model: Any, sites: list[str], build: str = _AUTO_NORMAL) -> None:
    """Refuse ``guide=None`` for ``model``, whose latent ``sites`` a guide must draw."""
    name = name_of(model)
    shown_sites = ", ".join(repr(s) for s in sites[:3])
    more = ", ..." if len(sites) > 3 else ""
    raise ValueError(
        f"{_CALLER} got guide=None for {name}, whose latent sites ({shown_sites}{more}) a "
        "guide must draw (without one, each call draws them from their priors). Pass the "
        f"guide built for it, {build} (guide=None is for a model without latent sites, such "
        "as a BatchEnsemble)."
    )


def check_unguided_trace(model: Any, model_trace: Any, labelled: bool) -> None:
    """Refuse a trace of ``model`` run with ``guide=None`` (against a guide that draws none)
    as :func:`pyrouq.fit` refuses it: one with an unobserved ``"obs"`` site where the call
    gave no labels (``labelled``: :func:`needs_labels`), one with latent sites
    (:func:`refuse_unguided`), or one that observes nothing (its loss would be 0: nothing
    to learn)."""
    sites = unobserved_sites(model_trace)
    if not labelled and "obs" in sites:
        needs_labels(None)
    if sites:
        refuse_unguided(model, sites)
    if not observes_something(model_trace):
        raise ValueError(
            f"{_CALLER} got guide=None for {name_of(model)}, which observes nothing: run "
            "as model(x, y), it has no observed site and no latent one, so the loss would "
            "hold no likelihood of the targets (a loss of 0, nothing to learn). Observe them, "
            "e.g. pyro.sample('obs', dist.Categorical(logits=logits), obs=y) inside "
            "pyro.plate('data', self.num_data, subsample_size=len(x))."
        )


def plain_network_error(model: Any, err: TypeError) -> ValueError | None:
    """The refusal of ``guide=None`` for a plain torch network (an ``nn.Module``, not a
    ``PyroModule``, whose ``forward(x)`` takes no labels), which the step's call with the
    labels met as ``err`` (torch's "forward() takes 2 positional arguments but 3 were
    given"); None for any other model or error. Decided by the call's failure, not by the
    signature: a Pyro model written as an ``nn.Module`` may take its labels by keyword, as
    ``**kwargs`` or hold them itself."""
    if not (
        isinstance(model, torch.nn.Module)
        and not isinstance(model, pyro.nn.PyroModule)
        and not takes_labels(model)
        and "positional argument" in str(err)
    ):
        return None
    return ValueError(
        f"{_CALLER} got guide=None for a plain network ({type(model).__name__}), whose "
        "forward(x) takes no labels: no likelihood observes them, so it has no ELBO. Train it "
        "by maximum likelihood with pyrouq.fit(net, None, ...), or make it Bayesian first: "
        "pyrouq.bayesian(net) with pyrouq.mean_field_guide(model), or pyrouq.rank1(net, M) for "
        "an ensemble (guide=None); a Pyro model written as an nn.Module takes them, "
        "forward(x, y=None)."
    )


def empty_guide(*args: Any, **kwargs: Any) -> None:
    """The guide of a model without latent sites (a BatchEnsemble, a Pyro model of one's own),
    marked ``_pyrouq_empty`` (:func:`is_empty_guide`)."""
    return None


empty_guide._pyrouq_empty = True  # type: ignore[attr-defined]


def is_empty_guide(guide: Any) -> bool:
    """Whether ``guide`` is pyrouq's guide that draws nothing (:func:`empty_guide`)."""
    return bool(getattr(guide, "_pyrouq_empty", False))


def traced_guide(model: Any, guide: Any) -> Any:
    """The guide the traced path runs against ``model``, checked as :func:`pyrouq.fit` checks
    it: ``guide=None`` becomes a guide that draws nothing for a model without latent sites
    (a BatchEnsemble, a Pyro model of the user's own: the caller refuses one whose trace then
    holds latent sites or no observed one, :func:`check_unguided_trace`, and a plain torch
    network the labels' call fails on, :func:`plain_network_error`) and is refused for a
    pyrouq model with latent sites, naming them; a guide
    built for another model (the first differing site named), the model itself, or a
    :class:`MeanFieldGuide` for a model that has no weights to draw are refused."""
    refuse_guide_as_model(model, _CALLER)  # (with guide=None too: check_guide is not reached)
    latent = getattr(model, "latent_sites", None)
    if guide is None:
        sites = list(latent()) if callable(latent) else []
        if sites:
            refuse_unguided(model, sites, "mean_field_guide(model)")
        return empty_guide
    if isinstance(guide, MeanFieldGuide):  # (an ensemble, a plain network: none to draw)
        check_drawable(model, "a guide", _CALLER)
    check_guide(model, guide, _CALLER)
    return guide
