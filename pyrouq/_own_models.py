"""Pyro models of the user's own (a ``PyroModule`` with ``PyroSample`` priors written by hand,
a model function): pyrouq's models state their latent sites (``latent_sites()``); these have
theirs read off a trace. What :func:`pyrouq.predict`, :func:`pyrouq.fit` and the diagnostics
check of such a model's guide and draws: a latent site they lack (which Pyro's ``Trace_ELBO``
only warns of) or give another shape (which it refuses) is refused."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any, NoReturn

import pyro
import torch
from pyro import poutine
from pyro.poutine.util import site_is_subsample
from pyro.util import check_model_guide_match
from torch import Tensor

from pyrouq._distribution_parts import is_discrete
from pyrouq._own_likelihood import outputs_problem
from pyrouq._param_store import draws_as_built, forget_params_since, store_or_usual_fix
from pyrouq._util import rng_state, set_rng_state, warn_caller
from pyrouq._wrappers import name_of as name_of  # (a model's name: read here by many)
from pyrouq._wrappers import under_handlers, unwrapped
from pyrouq.likelihoods._categorical import are_probabilities


@contextlib.contextmanager
def room_for(model: Any, rows: int) -> Iterator[None]:
    """While predictions run on ``rows`` inputs, a model of the user's own whose ``num_data``
    is smaller gets ``num_data = rows``: ``pyro.plate("data", self.num_data,
    subsample_size=len(x))`` (the README's recipe, with ``num_data`` set by ``fit()`` to the
    training set's size) refuses a batch larger than the data set, and predictions read the
    logits only, which the plate's scale does not touch. A model inside Pyro's handlers
    (``poutine.condition(model, data=...)``) is the one given room."""
    model = under_handlers(model)[0]  # (the handlers' partial holds no num_data)
    num_data = getattr(model, "num_data", None)
    ours = callable(getattr(model, "latent_sites", None))  # pyrouq scales by N/B itself
    if not isinstance(num_data, int) or ours or num_data >= rows:
        yield
        return
    model.num_data = rows
    try:
        yield
    finally:
        model.num_data = num_data


def check_logits(
    owner: Any, out: Any, rows: int, recorded: bool, caller: str = "predict()"
) -> None:
    """Refuse what a model of the user's own gave as the class logits of ``rows`` inputs
    (``recorded``: its ``"logits"`` site, else its return value) unless it is ``(rows, C)``:
    logits ``(C, B)`` or of a subsample of the inputs would be read as other inputs' without a
    word, and extra dims as more draws or inputs; so are class probabilities (every row in
    [0, 1], summing to 1: a ``Categorical(probs=p)`` model's ``p``), which the softmax would
    flatten. A value that cannot be logits (not a tensor, one dim) is a ``TypeError`` that
    names the way out for a binary classifier and a regression model; so does the refusal of
    one logit a row, ``(rows, 1)`` (a Bernoulli classifier's, whose softmax is 1). Messages
    name ``caller``."""
    if torch.is_tensor(out) and out.dim() == 2 and out.shape[0] == rows:
        if out.shape[1] == 1:
            where = "recorded a 'logits' site" if recorded else "returned logits"
            raise ValueError(
                f"{caller}: {name_of(owner)} {where} of shape ({rows}, 1): one class, "
                f"every probability would be 1; {caller} needs class logits (B, C), C >= 2."
                f"{_ways_out('torch.cat([torch.zeros_like(l), l], -1)')}"
            )
        if are_probabilities(out):
            what = "recorded a 'logits' site of" if recorded else "returned"
            raise ValueError(
                f"{caller}: {name_of(owner)} {what} class probabilities, not logits: every "
                f"row of its ({rows}, {out.shape[1]}) values is in [0, 1] and sums to 1. "
                f"{caller} takes logits and applies the softmax, which would flatten them "
                "towards uniform. Return or record the logits (with Categorical(probs=p), "
                "pyro.deterministic('logits', p.log()))."
            )
        return
    if not torch.is_tensor(out) or out.dim() < 2:
        shown = (
            f"a tensor of shape {tuple(out.shape)}" if torch.is_tensor(out) else type(out).__name__
        )
        got = f"returned {shown} and recorded no 'logits' site"
        if recorded:
            got = f"recorded a 'logits' site of {shown}"
        raise TypeError(
            f"{name_of(owner)} {got}; {caller} needs a model of your own to return class "
            "logits (B, C) or record pyro.deterministic('logits', ...)."
            + _ways_out("torch.stack([torch.zeros_like(l), l], -1)")
        )
    if out.dim() == 2:
        why = f"{ONE_ROW_PER_INPUT}: plate 'data' with subsample_size=len(x))"
    else:
        why = (
            f"one run gives one draw, and {caller} stacks the S runs itself (no leading "
            "dim of draws or particles, nor of size 1), one row of C logits per input "
            "(not one per position, as a sequence's (B, T, C))"
        )
    where = "recorded a 'logits' site" if recorded else "returned logits"
    raise ValueError(
        f"{caller}: {name_of(owner)} {where} of shape {tuple(out.shape)} on a batch of "
        f"{rows} inputs, expected class logits ({rows}, C): {why}. Return or record "
        "logits of shape (B, C)."
    )


def _ways_out(two_columns: str) -> str:
    """The ways out for a binary classifier (``two_columns``: its logits made two) and a
    regression model, whose outputs predict() refuses as class logits."""
    return (
        f" A binary classifier observing Bernoulli(logits=l): return or record {two_columns} "
        "(its classes 0 and 1). A regression model of your own: draw its predictions with "
        "pyro.infer.Predictive, or build it as pyrouq.bayesian(net, "
        "likelihood=pyrouq.likelihoods.Gaussian(...)), which predict() takes."
    )


#: Why logits must be ``(B, C)`` in the inputs' order (both refusals of predict() say it).
ONE_ROW_PER_INPUT = (
    "one row per input, in the order given (not logits.T, nor those of a subsample of the inputs"
)


def traced_latent_sites(
    model: Any, x: Tensor, classes: bool = True
) -> dict[str, tuple[int, ...]] | None:
    """``{site: shape}`` of the latent sites of a model of the user's own that posterior draws
    must give, or None where the model cannot be run as below. With ``classes``, a model whose
    outputs are no class logits (:func:`outputs_problem`) is refused; without, they are read
    as its likelihood reads them (a pyrouq model's own, a regression's).

    The model runs under its priors on two batches of different sizes (the random state is
    kept as it was): the first 2 and 3 inputs of ``x`` (2 and 3 copies of its first input
    when it has fewer, or when those fail), else ``x`` without its last input and ``x``. Its
    global latent sites are the unobserved sample sites that both runs have, of the same
    shape, in plates of the same sizes; the others hold a value per input (the likelihood
    ``"obs"``, not observed without targets, in a plate, a sequential plate or none; a local
    latent variable, drawn from its prior for new inputs), and so do sites named like those
    only the larger run has, up to their numbers (``obs_0``, ``obs_1`` beside ``obs_2``: one
    site per input, in a loop). A model that runs on no two sizes (one that needs all its N
    rows) is run on ``x`` itself, its sites in a plate over the rows of ``x`` taken for
    per-input ones.
    """
    rows = x.shape[0]
    pairs = [(x[:2], x[:3])] if rows >= 3 else []
    pairs.append((_copies(x, 2), _copies(x, 3)))
    if rows > 3:
        pairs.append((x[:-1], x))
    state = rng_state(x.device)
    problem = None
    try:
        with torch.no_grad():
            for smaller, larger in pairs:
                try:
                    traces = [_run(model, batch) for batch in (smaller, larger)]
                except Exception:
                    continue
                small, large = (_sample_sites(trace) for trace in traces)
                per_input = {_numbered(name) for name in large if name not in small}
                found = {
                    name: shape
                    for name, (shape, plates) in small.items()
                    if large.get(name) == (shape, plates) and _numbered(name) not in per_input
                }
                problem = outputs_problem(name_of(model), traces[1], larger.shape[0])
                break
            else:
                trace = _run(model, x)
                found = _sites_beside_the_rows(trace, rows)
                problem = outputs_problem(name_of(model), trace, rows)
    except Exception:  # a model that runs on no batch of these: its sites are not checked
        return None
    finally:
        set_rng_state(x.device, state)
    if problem is not None and classes:
        raise problem
    return found


def _copies(x: Tensor, rows: int) -> Tensor:
    return x[:1].expand(rows, *x.shape[1:]).clone()


def _run(model: Any, x: Tensor) -> Any:
    """The trace of one run of ``model`` on ``x`` under its priors."""
    with room_for(model, x.shape[0]):
        return poutine.trace(model).get_trace(x)


def unobserved_sites(trace: Any) -> list[str]:
    """The names of a trace's unobserved sample sites, subsample sites left out: of a model run
    against a guide that draws none, the latent sites a guide must draw."""
    return [
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    ]


def observes_something(trace: Any) -> bool:
    """Whether a trace has an observed sample site, so that a loss holds a likelihood: a
    ``pyro.factor`` counts; a ``pyro.deterministic`` (observed, marked deterministic) and a
    subsample site do not."""
    return any(
        site["type"] == "sample"
        and site["is_observed"]
        and not site_is_subsample(site)
        and not (site["infer"] or {}).get("_deterministic")
        for site in trace.nodes.values()
    )


def _numbered(name: str) -> str:
    """A site's name with its numbers replaced: one pattern for ``obs_0``, ``obs_1``, ..."""
    return re.sub(r"\d+", "#", name)


def _sample_sites(trace: Any) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """``{site: (shape, plates)}`` of a trace's unobserved sample sites, ``plates`` the
    (name, size) of the plates around each."""
    return {
        name: (
            tuple(site["value"].shape),
            tuple((frame.name, frame.size) for frame in site["cond_indep_stack"]),
        )
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }


def _sites_beside_the_rows(trace: Any, rows: int) -> dict[str, tuple[int, ...]]:
    """The unobserved sample sites of a trace on ``rows`` inputs that no plate over the rows
    holds (a plate dim of that size in the site's batch shape)."""
    sites = {}
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or site_is_subsample(site):
            continue
        batch_shape = site["fn"].batch_shape
        if not any(
            frame.dim is not None
            and -frame.dim <= len(batch_shape)
            and batch_shape[frame.dim] == rows
            for frame in site["cond_indep_stack"]
        ):
            sites[name] = tuple(site["value"].shape)
    return sites


def fitting_draws(
    model: Any,
    draws: dict[str, Tensor],
    x: Tensor,
    caller: str,
    source: str,
    classes: bool = True,
    guide: Any = None,
) -> dict[str, Tensor]:
    """The draws ``{site: (S, *shape)}`` to run a model of the user's own under: those of its
    latent sites (:func:`traced_latent_sites`), each ``(S, *shape)``. Other sites are left
    out (``pyro.infer.Predictive`` gives ``"obs"`` and recorded ``"logits"`` too, computed on
    other inputs; a guide's draws of sites that hold a value per input, which the model then
    draws from its prior, warn in predict()); leading dims of size 1 after S (``Predictive``
    pads draws to the model's plate nesting) are dropped. A latent site missing, or of
    another shape, is refused: the model would draw it from its prior, or broadcast it,
    without a word (a discrete one, left to enumeration, with Pyro's way for such models); so
    are NaN draws (infinite ones warn). A model that cannot be traced on small batches gets
    every draw, unchecked. ``classes``:
    as :func:`traced_latent_sites` takes it; ``guide``, the guide drawn from, tells why its
    draws do not fit (:func:`_refuse`)."""
    expected = traced_latent_sites(model, x, classes)
    if expected is None:
        return draws
    sampled = _sampled_sites(model, x) if not expected else None
    if sampled is not None and not set(draws) & sampled:
        # no global latent site, and none of the draws is a site the model samples: a plain
        # network (forward(x, mask=None)), or a model without latent sites given others' draws
        drawn = ", ".join(sorted(draws)[:3]) + (", ..." if len(draws) > 3 else "")
        raise ValueError(
            f"{caller} got {source} for {name_of(model)}, which samples none of the sites drawn "
            f"({drawn or 'none'}): it has no latent site to draw, so every draw would be the "
            "same network. Leave it out; to draw a network's weights, make it Bayesian first: "
            "pyrouq.bayesian(net)."
        )

    if source == "the guide" and caller == "predict()" and set(draws) - set(expected):
        _warn_of_local_sites(model, draws, expected, x)

    def plural(verb: str) -> str:  # "posterior_samples give", "the guide gives"
        return verb if source == "posterior_samples" else verb + "s"

    missing = [site for site in expected if draws.get(site) is None]
    discrete = _discrete_sites(model, x, missing) if missing else []
    if discrete:  # Pyro's TraceEnum_ELBO and NUTS enumerate them, and draw none
        _refuse_enumeration(model, discrete, caller, f"{source} {plural('leave')} out")
    if source == "posterior_samples":
        _refuse_grouped(draws, expected, caller)
    kept = {}
    shapes = {site: tuple(value.shape[1:]) for site, value in draws.items()}  # one draw's
    for site, shape in expected.items():
        value = draws.get(site)
        if value is None:
            problem = f"the model's latent site {site!r} {shape} is not in it"
            _refuse(model, problem, caller, source, guide, shapes)
        value = unpadded(value, shape)
        got = tuple(value.shape[1:])
        if got != shape:
            problem = f"site {site!r} has shape {got} there but {shape} in the model"
            _refuse(model, problem, caller, source, guide, shapes)
        # NaN draws of a fit that diverged (the model would sample its likelihood on NaN
        # logits: torch's own error); a sum is finite unless a value is not (one pass)
        if source != "the prior" and value.is_floating_point() and not value.sum().isfinite():
            nan, inf = int(value.isnan().sum()), int(value.isinf().sum())
            if nan:
                raise ValueError(
                    f"{caller}: {source} {plural('give')} site {site!r} {nan} NaN values (of "
                    f"{value.numel()} drawn), which the model would run on; did the fit "
                    "diverge? Refit (e.g. with a smaller learning rate), or pass draws "
                    "without NaN."
                )
            if inf:  # a model may absorb them (a scale of inf); torch's error if it does not
                warn_caller(
                    f"{caller}: {source} {plural('give')} site {site!r} {inf} infinite values "
                    f"(of {value.numel()} drawn); if the model fails on them (torch's "
                    '"probability tensor contains either inf, nan"), the fit diverged: refit.'
                )
        kept[site] = value
    return kept


def _warn_of_local_sites(
    model: Any, draws: dict[str, Tensor], expected: dict[str, tuple[int, ...]], x: Tensor
) -> None:
    """Warn where a guide draws latent sites of the model that hold a value per input (a
    local latent variable, an amortised guide's ``q(z | x)``): predict() takes the guide's
    draws of the global sites once, and the model draws those from its prior for every input,
    where Pyro's ``Predictive`` would run the model on the guide's draws of them."""
    # (a site poutine.condition observes is not drawn: the model runs on its given value)
    sampled = _sampled_sites(model, x, observed=False) or set()
    local = sorted(site for site in draws if site not in expected and site in sampled)
    if not local:
        return
    warn_caller(
        f"predict(): the guide draws {name_of(model)}'s latent site(s) {local}, which hold a "
        "value per input (local latent variables): predict() takes the guide's draws of the "
        "global sites once and runs every input batch under them, so the model draws "
        f"{local} from its prior for each input, as for new inputs (not the guide's values: "
        "an AutoNormal's are those of its training points, an amortised guide's q(z | x) is "
        "not used). For the guide's draws of them on these inputs, use "
        "pyro.infer.Predictive(model, guide=guide, num_samples=S); if the prior is what you "
        "want, filter this warning: warnings.filterwarnings('ignore', message=r\".*hold a "
        'value per input")'
    )


def _refuse_grouped(
    draws: dict[str, Tensor], expected: dict[str, tuple[int, ...]], caller: str
) -> None:
    """Refuse draws grouped by chain (``get_samples(group_by_chain=True)``): every latent site
    given as ``(chain, draw, *shape)``, all with the same ``(chain, draw)``, of more than one
    draw per chain (one is read as Predictive's padding, and runs as it should). One site of
    another shape alone says nothing of chains: the shape check words it."""
    given = {site: draws.get(site) for site in expected}
    values = {site: v for site, v in given.items() if torch.is_tensor(v)}
    if not values or len(values) != len(expected):
        return
    if any(tuple(v.shape[2:]) != expected[site] for site, v in values.items()):
        return
    if any(v.dim() != len(expected[site]) + 2 for site, v in values.items()):
        return
    lead = {tuple(v.shape[:2]) for v in values.values()}
    if len(lead) != 1:
        return
    chains, per = lead.pop()
    if per < 2:
        return
    site, value = next(iter(values.items()))
    raise ValueError(
        f"{caller}: posterior_samples: site {site!r} has shape {tuple(value.shape)}, read as "
        f"(chain, draw) = {(chains, per)} before the site's shape {expected[site]}: predict() "
        "takes the draws flattened, (S, *shape). Pass the pyro.infer.MCMC run itself (or its "
        "get_samples(), chains not grouped), or value.reshape(-1, *value.shape[2:]) for every "
        f"site (chain after chain; every site given here is grouped as {(chains, per)})."
    )


def _sampled_sites(model: Any, x: Tensor, observed: bool = True) -> set[str] | None:
    """The names of the sites ``model`` samples on ``x`` (its likelihood, without targets,
    and per-input latent sites included; ``observed``: those it observes too), or None where
    it cannot be traced."""
    trace = prior_trace(model, x)
    if trace is None:
        return None
    return {
        name
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site_is_subsample(site)
        if observed or not site["is_observed"]
    }


def prior_trace(model: Any, x: Tensor) -> Any:
    """A trace of ``model`` on ``x`` under its priors (the random state kept), or None."""
    state = rng_state(x.device)
    try:
        with torch.no_grad():
            return _run(model, x)
    except Exception:
        return None
    finally:
        set_rng_state(x.device, state)


def samples_targets_unobserved(model: Any, x: Tensor) -> bool:
    """Whether ``model`` samples the targets' site ``"obs"`` unobserved on the inputs ``x``
    alone (traced under its priors, the random state kept; the param-store entries that trace
    made are removed, whatever it finds)."""
    stored = set(pyro.get_param_store().keys())
    trace = prior_trace(model, x)
    forget_params_since(stored)
    site = None if trace is None else trace.nodes.get("obs")
    return site is not None and site["type"] == "sample" and not site["is_observed"]


def _discrete_sites(model: Any, x: Tensor, names: list[str]) -> list[str]:
    """Those of the sites ``names`` that ``model`` draws on ``x`` from a discrete
    distribution or marks for enumeration."""
    trace = prior_trace(model, x)
    nodes = {} if trace is None else trace.nodes
    return [name for name in names if name in nodes and _enumerated(nodes[name])]


def _enumerated(site: dict[str, Any]) -> bool:
    """Whether a trace's sample site is left to enumeration: drawn from a discrete
    distribution, or marked for it."""
    return is_discrete(site["fn"]) or bool(site["infer"].get("enumerate"))


def unpadded(value: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Draws ``(S, 1, ..., 1, *shape)`` as ``(S, *shape)``: ``pyro.infer.Predictive`` pads a
    global site's draws with a dim of size 1 per plate of the model. Other shapes as given."""
    got = tuple(value.shape[1:])
    extra = len(got) - len(shape)
    if extra > 0 and got[extra:] == shape and all(d == 1 for d in got[:extra]):
        return value.reshape(value.shape[0], *shape)
    return value


def check_traces_match(
    model_trace: Any, guide_trace: Any, caller: str, model: Any, guide: Any = None
) -> None:
    """Refuse a guide's trace that misses a latent site of the model's trace replayed on it, or
    gives one another shape than the model's prior (Pyro's own check, which also warns of
    guide sites the model does not have); ``guide``, the guide traced, tells why
    (:func:`_refuse`)."""
    missing = [
        name
        for name, site in model_trace.nodes.items()
        if site["type"] == "sample"
        and not site["is_observed"]
        and not site_is_subsample(site)
        and name not in guide_trace.nodes
    ]
    discrete = [name for name in missing if _enumerated(model_trace.nodes[name])]
    if discrete:  # AutoNormal(model) is no fix: continuous guides refuse discrete sites
        _refuse_enumeration(model, discrete, caller, "its guide leaves out")
    drawn = {
        name: tuple(site["value"].shape)
        for name, site in guide_trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"]
    }
    if missing:
        _refuse(
            model,
            f"the model's latent site(s) {missing} are missing from the guide, so they would "
            "be drawn from the prior",
            caller,
            guide=guide,
            drawn=drawn,
        )
    try:
        check_model_guide_match(model_trace, guiding_sites(model_trace, guide_trace))
    except ValueError as err:
        _refuse(model, str(err).rstrip("."), caller, guide=guide, drawn=drawn)


def guiding_sites(model_trace: Any, guide_trace: Any) -> Any:
    """``guide_trace`` for Pyro's ``check_model_guide_match``, without the sites that both it
    and the model observe: a guide that runs the model (an ``AutoNormalMessenger``) records
    the model's likelihood, which Pyro's ``Trace_ELBO`` leaves out of the guide's side (its
    ``get_traces()``) rather than warn of a "non-auxiliary var in guide but not model"."""
    shared = [
        name
        for name, site in guide_trace.nodes.items()
        if site["type"] == "sample"
        and site["is_observed"]
        and model_trace.nodes.get(name, {}).get("is_observed")
    ]
    if not shared:
        return guide_trace
    kept = poutine.Trace()  # (what Pyro's check reads: the nodes; the guide's trace kept)
    kept.nodes.update((n, site) for n, site in guide_trace.nodes.items() if n not in shared)
    return kept


def _refuse_enumeration(model: Any, discrete: list[str], caller: str, lacks: str) -> NoReturn:
    """Refuse a guide or draws that leave discrete latent sites to enumeration (``lacks``:
    "its guide leaves out", "posterior_samples leave out")."""
    raise ValueError(
        f"{caller}: {name_of(model)} has discrete latent site(s) {discrete}, which {lacks} "
        "for enumeration; pyrouq does not enumerate (nor take score-function gradients), so "
        "they would be drawn from the prior. Use Pyro's own tools for such a model: "
        "pyro.infer.SVI with pyro.infer.TraceEnum_ELBO, and pyro.infer.Predictive."
    )


class GuideMismatch(ValueError):
    """A guide's trace, or posterior draws, that do not fit the model; ``problem`` says how,
    without the way out (the message itself when not given: it is rebuilt from its message
    alone, ``type(err)(str(err))``, by Pyro's trace re-raise, and pickled with ``problem``
    kept, e.g. by DataLoader workers)."""

    def __init__(self, message: str, problem: str | None = None):
        super().__init__(message)
        self.problem = message if problem is None else problem


def _refuse(
    model: Any,
    problem: str,
    caller: str,
    source: str | None = None,
    guide: Any = None,
    drawn: dict[str, tuple[int, ...]] | None = None,
) -> NoReturn:
    """Refuse draws (``source``: "the guide" or "posterior_samples") or, without a source, a
    guide's trace. An autoguide built for this very model (``guide``) that took another
    model's values from Pyro's param store, and so draws (``drawn``, one draw's shapes) other
    shapes than it was built with, is told to clear the store
    (:func:`~pyrouq._param_store.store_or_usual_fix`), not to pass the guide it is; one that
    draws the shapes it was built with (a model sized by x, given x of another shape; or a
    model changed since) is told to pass x of the shape it was fitted on, or a guide fitted
    for the model as it is now."""
    any_model = "(pyro.infer.autoguide.AutoNormal(model) is one for any Pyro model)"
    if source in (None, "the guide") and draws_as_built(model, guide, drawn):
        lead = "the guide does not fit"  # (its own model's: "pass the guide built for it" is none)
        fix = (
            f"The guide ({type(unwrapped(guide)).__name__}) was built for this model and draws "
            "the shapes it was built with; the model's sites take other shapes now (on x of "
            "another shape than the guide was fitted on, or the model changed since). Pass x of "
            "the shape the guide was fitted on, or a guide built and fitted for the model as it "
            "is now."
        )
    elif source is None:
        lead, fix = "the guide does not fit", f"Pass a guide built for this model {any_model}."
    else:
        lead = f"{source} {'do' if source == 'posterior_samples' else 'does'} not fit"
        fix = (
            f"Pass the guide fitted with this model {any_model}, or posterior draws "
            "{site: (S, *shape)} of its latent sites."
        )
    fix = store_or_usual_fix(fix, model, source, guide, drawn)  # (store taken: reshaped)
    raise GuideMismatch(f"{caller}: {lead} {name_of(model)}: {problem}. {fix}", problem)
