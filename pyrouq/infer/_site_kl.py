"""The NLL and KL terms of a traced model and guide (a user's own Pyro model, or any guide but
pyrouq's mean-field one), as :class:`pyrouq.KLWeightedELBO` adds them up, and the ELBO's checks
of a guide's sites and of a step's gradients."""

from __future__ import annotations

import copy
import math
from collections.abc import Collection
from typing import Any, NoReturn

import pyro.distributions as dist
import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyrouq._autocast import autocast_dtype
from pyrouq._distribution_parts import distribution_masks, innermost_distribution, is_discrete
from pyrouq._numbers import is_real
from pyrouq._util import check_int
from pyrouq.infer._normal_kl import kl_dtype


def float32_zero(device: torch.device | str | None) -> Tensor:
    """The float32 zero on ``device`` that a sum of the ELBO's terms (an NLL, a KL, a loss)
    starts from: a float32 network trains and reports the same under a float64 default dtype
    (``torch.set_default_dtype``), whose zeros promoted its reported loss to float64."""
    return torch.zeros((), dtype=torch.float32, device=device)


def traced_terms(
    model_trace: Any,
    guide_trace: Any,
    labelled: bool = True,
    fix: str = "",
    fixed_priors: Collection[str] = (),
) -> tuple[Tensor, Tensor]:
    """One particle's ``(nll, kl)``, as Pyro's ``Trace_ELBO`` counts ``log p`` and ``log q``:
    ``-log p`` of the model's observed sites (its ``pyro.factor`` too), :func:`site_kl` of
    each latent site, and ``log q`` of the guide's own sites (an autoguide's auxiliary latent,
    a guide's ``pyro.factor``), each with its site's scale and mask. A site's KL is analytic
    only where the guide draws it after every latent site the model draws before it (Pyro's
    ``TraceMeanField_ELBO`` asks for that order): else its prior may hang on a site the guide
    draws later, given this one, and ``KL(q(w) || p(w | s))`` at that draw is biased (but for
    the sites named in ``fixed_priors``, a pyrouq network's own, whose priors are fixed: in
    any order). ``labelled``: whether labels were given; ``fix``: the guide to build, for
    messages."""
    device = next(  # the zeros the sums start from: on the sites' device (a GPU's; a
        # plate's subsample indices are made on the CPU)
        (
            s["value"].device
            for s in model_trace.nodes.values()
            if s["type"] == "sample" and not site_is_subsample(s)
        ),
        None,
    )
    nll = float32_zero(device)
    kl = float32_zero(device)
    order = {} if guide_trace is None else {name: i for i, name in enumerate(guide_trace.nodes)}
    latest = -1  # the guide's place of the latest drawn of the model's latent sites so far
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["is_observed"]:
            if site["infer"].get("_deterministic"):
                continue
            log_p = log_density(site["fn"], site["value"])
            nll = nll - scale_and_mask(log_p, site["scale"], site["mask"]).sum()
            continue
        guide_site = None if guide_trace is None else guide_trace.nodes.get(name)
        if guide_site is None:
            _missing(name, site, labelled, fix)
        check_reparameterised(name, guide_site)
        kl = kl + site_kl(site, guide_site, analytic=name in fixed_priors or order[name] > latest)
        latest = max(latest, order[name])
    if guide_trace is None:
        return nll, kl
    for name, site in guide_trace.nodes.items():  # the guide's own sites: part of log q(w)
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["infer"].get("_deterministic"):
            continue
        if model_trace.nodes.get(name, {}).get("type") == "sample":
            continue
        if not site["is_observed"] or isinstance(innermost_distribution(site["fn"]), dist.Unit):
            check_reparameterised(name, site)  # (an observed value needs no sampler)
        log_q = log_density(site["fn"], site["value"])
        kl = kl + scale_and_mask(log_q, site["scale"], site["mask"]).sum()
    return nll, kl


def _missing(name: str, site: dict[str, Any], labelled: bool, fix: str) -> NoReturn:
    """Refuse a model's unobserved site that the guide does not draw."""
    enumerated = site["infer"].get("enumerate")  # else an unobserved label site is discrete
    if enumerated or (labelled and is_discrete(site["fn"])):
        raise ValueError(
            f"The model's discrete latent site {name!r} is missing from the guide, left out for "
            "enumeration: KLWeightedELBO does not enumerate (nor take score-function "
            "gradients). Train such a model with pyro.infer.SVI and pyro.infer.TraceEnum_ELBO."
        )
    if not labelled:
        raise ValueError(
            f"KLWeightedELBO needs the labels: the model's site {name!r} was not observed "
            "(y=None), and the guide does not draw it. Pass them, e.g. elbo.loss(model, guide, "
            f"x, y), or, if {name!r} is a latent site, build the guide for this model ({fix})."
        )
    raise ValueError(
        f"The model's latent site {name!r} is missing from the guide. Build the guide for "
        f"this model ({fix})."
    )


def site_kl(site: dict[str, Any], guide_site: dict[str, Any], analytic: bool = True) -> Tensor:
    """A latent site's ``KL(q || p)`` term, weighed as Pyro's ``Trace_ELBO`` weighs ``log q``
    and ``log p``: analytic where torch knows the pair, the model and guide weigh the site
    alike and ``analytic`` (:func:`traced_terms`'s order), else the single-draw estimate
    ``log q(w) - log p(w)``, each side with its own site's
    scale and mask (a model's ``poutine.scale`` or ``mask`` on the prior). An autoguide's
    ``Delta`` site (a constrained site's value, its log-Jacobian as its density) is always
    estimated: the analytic form registered for ``Delta`` leaves that density out; so are two
    distributions masked unlike each other with ``.mask(...)`` (the form registered for them
    keeps the entries both masks keep; masked alike, it is exact)."""
    q, p = guide_site["fn"], site["fn"]
    alike = (
        analytic
        and _same_weight(site["scale"], guide_site["scale"])
        and _same_mask(site["mask"], guide_site["mask"])
    )
    if alike and not isinstance(innermost_distribution(q), dist.Delta) and _same_masks(q, p):
        try:
            wide_q, wide_p = widened_distribution(q), widened_distribution(p)
            kl_site = torch.distributions.kl_divergence(wide_q, wide_p)
        except NotImplementedError:
            pass
        else:
            kl_site = torch.as_tensor(kl_site)
            kl_site = kl_site.to(kl_dtype(kl_site.dtype))  # a half site's sum: in float32
            return scale_and_mask(kl_site, guide_site["scale"], guide_site["mask"]).sum()
    value = guide_site["value"]
    log_q = scale_and_mask(log_density(q, value), guide_site["scale"], guide_site["mask"]).sum()
    return log_q - scale_and_mask(log_density(p, value), site["scale"], site["mask"]).sum()


def guide_site_kl(q: Any, prior: Any, values: list[Tensor], count: int) -> Tensor:
    """``KL(q || prior)`` of a mean-field guide's site ``q`` (built in float32 for a
    half-precision site), summed: analytic where torch knows the pair, else the Monte Carlo
    mean of ``log q(w) - log p(w)`` over ``values`` (the draws the loss took; where there are
    none, over ``count`` fresh draws, at least one). The prior is read in float32 too
    (:func:`widened_distribution`, as the traced path reads it): a bfloat16 ``StudentT``'s
    normaliser, rounded once per weight, moved a 12k-weight site's KL by 86 nats."""
    prior = widened_distribution(prior)
    try:
        return torch.distributions.kl_divergence(q, prior).sum()
    except NotImplementedError:
        pass
    draws = values or [q.rsample() for _ in range(max(count, 1))]
    estimate = sum(q.log_prob(w) - prior.log_prob(w) for w in draws)
    return torch.as_tensor(estimate).sum() / len(draws)


def log_density(fn: Any, value: Tensor) -> Tensor:
    """``fn.log_prob(value)``, of a half-precision value or distribution taken in float32 (a
    float16 sum of a 22k-weight site's log-densities, or of a likelihood scaled by N/B,
    overflows past 65,504; Pyro's Trace_ELBO then gives NaN or inf):
    :func:`widened_distribution`."""
    if torch.is_tensor(value) and value.is_floating_point():
        value = value.to(kl_dtype(value.dtype))
    return widened_distribution(fn).log_prob(value)


def widened_distribution(fn: Any, _seen: dict[int, Any] | None = None) -> Any:
    """``fn`` (a distribution or transform) with its float16 / bfloat16 tensors in float32:
    a shallow copy of it and of what it holds (the distribution inside ``Independent``,
    ``.mask``, ``.expand``; a ``TransformedDistribution``'s base and transforms; ``StudentT``'s
    chi2...); ``fn`` itself where it holds none (float32 and float64 are left as they are).
    The casts are differentiable: the gradients reach the parameters in their own dtype.

    Widening the value alone is not enough: ``Normal.log_prob`` divides by ``var = scale**2``,
    whose float16 gradient ``(w - loc)^2 / (2 var^2)`` passes 65,504 wherever a draw is 3.6
    scales off at scale 0.01 (an autoguide's), and ``kl_divergence`` of two ``Independent``
    sums the event dims in their dtype (a float16 22k-weight site's KL: inf)."""
    state = getattr(fn, "__dict__", None)
    if (
        state is None
        or isinstance(fn, torch.nn.Module)  # (a Pyro TransformModule: its parameters stay)
        or not isinstance(fn, (torch.distributions.Distribution, torch.distributions.Transform))
    ):
        return fn
    seen = {} if _seen is None else _seen
    if id(fn) in seen:  # (an object held twice, or by itself)
        return seen[id(fn)]
    seen[id(fn)] = fn
    changed = {}
    for key, item in state.items():
        wide = _widened_item(item, seen)
        if wide is not item:
            changed[key] = wide
    if changed:
        seen[id(fn)] = copy.copy(fn)
        vars(seen[id(fn)]).update(changed)
    return seen[id(fn)]


def _widened_item(item: Any, seen: dict[int, Any]) -> Any:
    if torch.is_tensor(item):
        half = item.is_floating_point() and kl_dtype(item.dtype) != item.dtype
        return item.float() if half else item
    if type(item) in (list, tuple):  # a TransformedDistribution's transforms, a Compose's parts
        items = [_widened_item(i, seen) for i in item]
        if all(a is b for a, b in zip(items, item, strict=True)):
            return item
        return type(item)(items)
    return widened_distribution(item, seen)


def _same_masks(q: Any, p: Any) -> bool:
    """Whether ``q`` and ``p`` are masked alike (or not at all): torch's KL of two masked
    distributions keeps the entries both masks keep, right only when the masks are equal."""
    mine, theirs = distribution_masks(q), distribution_masks(p)
    return len(mine) == len(theirs) and all(
        _same_weight(a, b) for a, b in zip(mine, theirs, strict=True)
    )


def _same_weight(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return (
            torch.is_tensor(a)
            and torch.is_tensor(b)
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    return bool(a == b)


def _same_mask(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return _same_weight(a, b)


def check_reparameterised(name: str, site: dict[str, Any]) -> None:
    """Refuse a guide site drawn without a reparameterised sampler (a discrete site, or
    ``VonMises``, ``LKJCholesky``...): the KLWeightedELBO's gradients reach the guide through
    its draws only (no score-function term), so such a site's parameters would never learn."""
    fn = site["fn"]
    if getattr(fn, "has_rsample", True):
        return
    if isinstance(innermost_distribution(fn), dist.Unit):  # pyro.factor(..., has_rsample=False)
        raise ValueError(
            f"The guide's pyro.factor({name!r}, ...) is not marked has_rsample=True: Pyro takes "
            "its log-factor for one of draws without a reparameterised sampler, whose "
            "score-function term KLWeightedELBO and fit() do not take. Pass "
            f"pyro.factor({name!r}, ..., has_rsample=True) where it comes from reparameterised "
            "draws (it is then part of log q, as in Trace_ELBO), or train with pyro.infer.SVI "
            "and Trace_ELBO."
        )
    what = type(innermost_distribution(fn)).__name__
    if is_discrete(fn):
        kind = "a discrete site"
        fix = (
            "Sum the site out of the model (enumeration: pyro.infer.TraceEnum_ELBO with "
            "pyro.infer.SVI) or train with pyro.infer.SVI and Trace_ELBO."
        )
    else:
        kind = f"torch has no rsample for {what}"
        fix = (
            "Draw it from a reparameterisable distribution in the guide, or train with "
            "pyro.infer.SVI and Trace_ELBO."
        )
    raise ValueError(
        f"The guide draws its site {name!r} from {what}, which has no reparameterised sampler "
        f"({kind}): KLWeightedELBO and fit() take gradients through the guide's draws only, "
        f"with no score-function term, so its parameters would not learn. {fix}"
    )


def check_max_plate_nesting(value: object) -> float:
    """:class:`pyrouq.KLWeightedELBO`'s ``max_plate_nesting``: an int >= 0, or Pyro's ``inf``
    (None too) for "not given" (guessed from one trace when vectorising), else a ValueError
    (Pyro failed deep in a trace: "can only concatenate str (not "int") to str")."""
    if value is None or (is_real(value) and value == math.inf):
        return math.inf
    return check_int(
        "max_plate_nesting",
        value,
        0,
        "Pass the number of plates the model nests (a pyrouq model's: at most 2), or None to "
        "have it guessed.",
    )


def check_float16_gradients(
    modules: list[Any],
    loss: Tensor,
    outputs: Tensor | None,
    params: list[Tensor] | None = None,
) -> None:
    """Refuse a step of a network run in float16 (float16 parameters, or a float32 network
    under ``torch.autocast(dtype=torch.float16)``: its ``outputs`` are float16) whose
    gradients overflowed while its loss is finite: the optimizer would write inf / NaN into
    the parameters, and the next loss would be NaN (which fit() would blame on the lr).
    ``params``: the parameters of ``modules``, where the caller walked them already."""
    if params is None:
        params = [p for m in modules if isinstance(m, torch.nn.Module) for p in m.parameters()]
    half = [p.grad for p in params if p.grad is not None and p.dtype == torch.float16]
    autocast = not half and (
        (outputs is not None and outputs.dtype == torch.float16)
        or _float16_autocast({p.device.type for p in params})  # outputs cast back: .float()
    )
    grads = [p.grad for p in params if p.grad is not None] if autocast else half
    if not grads:
        return
    norms = torch._foreach_norm(grads, math.inf)
    bad = int((~torch.isfinite(torch.stack([n.to(loss.device) for n in norms]))).sum())
    if not bad or not math.isfinite(float(loss)):  # a non-finite loss: fit() says so
        return
    if autocast:
        what = "under torch.autocast(dtype=torch.float16) the activations' gradients"
        fix = "autocast to torch.bfloat16 (float32's range), or leave autocast out"
    else:
        what = "the float16 gradients"
        fix = (
            "train in bfloat16 (net.bfloat16(): the same memory, float32's range) or in "
            "float32 (autocast to torch.bfloat16 if you like)"
        )
    raise FloatingPointError(
        f"float16 overflowed: the loss is finite ({float(loss):.6g}), but {bad} of the "
        f"{len(grads)} gradient tensors hold inf or NaN, as {what} passed float16's largest value, "
        "65,504. The loss sums a batch's log-likelihood scaled to the N training points (N/B "
        "times it), so its gradients grow with N; a lower lr does not help. The parameters "
        f"are kept as they were before this step. Instead, {fix}."
    )


def _float16_autocast(devices: set[str]) -> bool:
    """Whether a ``torch.autocast(dtype=torch.float16)`` is on for one of ``devices``."""
    return any(autocast_dtype(device) == torch.float16 for device in devices)
