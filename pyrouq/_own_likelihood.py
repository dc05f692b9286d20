"""What the likelihood of a Pyro model of the user's own says of its outputs (private): read off
a trace of the model on inputs alone, whether :func:`pyrouq.predict` may take those outputs
(its ``"logits"`` site, else its return value) for the logits of one class of C per input."""

from __future__ import annotations

from typing import Any

import torch
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyrouq._distribution_parts import innermost_distribution, is_discrete
from pyrouq._util import warn_caller
from pyrouq.likelihoods._categorical import are_probabilities

__all__ = ["check_likelihood_logits", "outputs_problem"]

_REGRESSION_WAY = (
    "A regression model of your own: draw its predictions with pyro.infer.Predictive, or build "
    "it as pyrouq.bayesian(net, likelihood=pyrouq.likelihoods.Gaussian(...)), which predict() "
    "takes."
)

_COUNTS = (
    "Poisson",
    "GammaPoisson",
    "NegativeBinomial",
    "Geometric",
    "ZeroInflatedPoisson",
    "ZeroInflatedNegativeBinomial",
)
"""Count likelihoods: their values are numbers of events, no class of C."""
_TRIALS = ("Binomial", "BetaBinomial")
"""Counts of successes: of C columns per input, no class of C (one column: a binary model)."""


def outputs_problem(name: str, trace: Any, rows: int) -> Exception | None:
    """The refusal of a model (``name``) whose trace on ``rows`` inputs shows that its outputs
    ``(rows, C)``, ``C >= 2`` (its ``"logits"`` site, else its return value), are no class
    logits, or None: its likelihood draws continuous targets (a regression), C labels per
    input from a Bernoulli (a multi-label model) or counts (a Poisson at ``"obs"``, a Binomial
    of C columns). The likelihood is the site ``"obs"`` or,
    for a model without one, a site drawn around the outputs themselves (a continuous one
    whose mean they are, a Bernoulli whose probabilities are their sigmoid) where no discrete
    site beside it could be the labels (one named ``"label"``, say)."""
    node = trace.nodes.get("logits") or trace.nodes.get("_RETURN")
    out = None if node is None else node["value"]
    if not torch.is_tensor(out) or out.dim() != 2 or out.shape[0] != rows or out.shape[1] < 2:
        return None  # (outputs predict() refuses anyway, with their own message)
    site = trace.nodes.get("obs")
    if site is not None and site["type"] == "sample":
        found, where = _not_classes(site, out, near=False), "obs"
    else:
        found, where = None, ""
        for key, other in trace.nodes.items():
            if not _drawn(other):
                continue
            kind = _not_classes(other, out, near=True)
            if kind is not None and found is None:
                found, where = kind, key
            elif kind is None and _labels(other, rows):
                return None  # a discrete site per input: the model's labels, perhaps
    if found is None:
        return None
    family, classes = found
    if family == "Bernoulli":
        return TypeError(
            f"predict(): {name} observes {classes} labels per input (its {where!r} site is "
            "drawn from Bernoulli): a multi-label model, whose outputs predict() would take "
            f"for the logits of one softmax over {classes} classes. Draw its predictions with "
            "pyro.infer.Predictive (predict() covers models that pick one class of C per "
            "input)."
        )
    if family in _COUNTS + _TRIALS:
        return TypeError(
            f"predict(): {name} observes counts (its 'obs' site is drawn from {family}): a "
            f"count model, whose {classes} outputs per input predict() would take for the "
            f"logits of {classes} classes. Draw its predictions with pyro.infer.Predictive "
            "(predict() covers models that pick one class of C per input, and regressions "
            "built as pyrouq.bayesian(net, likelihood=pyrouq.likelihoods.Gaussian(...)))."
        )
    if where != "obs":  # no labels drawn on the inputs alone: a regression, or labels drawn
        return TypeError(  # only where y is given
            f"predict(): {name} draws no 'obs' site on the inputs alone, and a site drawn "
            f"around the outputs ({where!r}, a {family} whose mean they are): its {classes} "
            "outputs per input may be the means of continuous targets, which predict() would "
            f"take for the logits of {classes} classes. A classifier of your own: draw its "
            "labels at 'obs' whether or not y is given (pyro.sample('obs', "
            "dist.Categorical(logits=...), obs=y) samples them where y is None), from the "
            f"logits it returns. {_REGRESSION_WAY}"
        )
    return TypeError(
        f"predict(): {name} observes continuous targets (its {where!r} site is drawn from "
        f"{family}): a regression model, whose {classes} outputs per input predict() would "
        f"take for the logits of {classes} classes. {_REGRESSION_WAY}"
    )


def _drawn(site: Any) -> bool:
    """A sample site drawn by the model (not a subsample site, nor a ``pyro.deterministic``)."""
    return (
        site["type"] == "sample"
        and not site_is_subsample(site)
        and not (site["infer"] or {}).get("_deterministic")
    )


def _labels(site: dict[str, Any], rows: int) -> bool:
    """Whether a site draws discrete values, one or more per input."""
    value = site["value"]
    return (
        is_discrete(site["fn"])
        and torch.is_tensor(value)
        and value.dim() >= 1
        and value.shape[0] == rows
    )


def _close(a: Any, b: Tensor, *dtypes: torch.dtype) -> bool:
    """Whether ``a`` is a tensor of ``b``'s shape holding its values, to the rounding of the
    coarsest of their dtypes and ``dtypes`` (float32's at the finest: a bfloat16 or float16
    one's, for values computed from half-precision outputs)."""
    if not torch.is_tensor(a) or a.shape != b.shape:
        return False
    kinds = [t.dtype for t in (a, b) if t.is_floating_point()] + list(dtypes)
    coarse = max([torch.finfo(kind).eps for kind in kinds if kind.is_floating_point], default=0)
    tolerance = max(coarse, torch.finfo(torch.float32).eps) ** 0.5
    wide = a.detach().double(), b.detach().double()
    return bool(torch.allclose(*wide, rtol=tolerance, atol=tolerance))


def _not_classes(site: dict[str, Any], out: Tensor, near: bool) -> tuple[str, int] | None:
    """``(distribution, C)`` where the site draws continuous values (a regression's targets),
    C >= 2 labels per input from a Bernoulli (a multi-label model) or, without ``near``,
    counts; with ``near``, only where it draws them around the outputs ``out`` (their mean,
    their sigmoid)."""
    fn = site["fn"]
    try:
        discrete = bool(fn.support.is_discrete)
    except (AttributeError, NotImplementedError):  # a distribution of one's own, no support
        return None
    family = type(innermost_distribution(fn)).__name__
    value = site["value"]
    classes = int(out.shape[1])
    columns = torch.is_tensor(value) and value.dim() == 2 and value.shape[-1] >= 2
    if not near and (family in _COUNTS or (family in _TRIALS and columns)):
        return family, classes  # counts: of events, of successes in C columns
    if family == "Bernoulli" and torch.is_tensor(value) and value.dim() == 2:
        # (rows, C) labels, each its own yes or no: not one class of C. One label a row,
        # (rows, 1), is a binary classifier, whose two-column logits [0, l] predict() takes
        if value.shape[-1] < 2:
            return None
        if near and not _close(_mean(fn), out.sigmoid()):
            return None
        return family, classes
    if discrete:
        return None
    if near and not _close(_mean(fn), out):
        return None
    return family, classes


def _mean(fn: Any) -> Any:
    """A distribution's mean, or None where it has none to give."""
    try:
        return fn.mean
    except (AttributeError, NotImplementedError, ValueError, RuntimeError):
        return None


def check_likelihood_logits(name: str, trace: Any, out: Tensor, caller: str = "predict()") -> None:
    """Warn (once per call of ``caller``: its first batch, its first draw) where the class
    logits ``out`` ``(B, C)`` of a model (``name``) run on B inputs (``trace``) are not those
    of the ``Categorical`` (or binary ``Bernoulli``, beside logits ``[0, l]``) it draws its
    ``"obs"`` from (logits divided by a temperature, a random effect added that they leave
    out; or on purpose: label smoothing, a noise model whose clean-class probabilities are
    wanted): ``caller`` gives their softmax, not the probabilities of the observed labels.
    Class probabilities given for logits are left to their own refusal; so are a likelihood
    of another family, or of other shapes."""
    site = trace.nodes.get("obs")
    if site is None or site["type"] != "sample":
        return
    if are_probabilities(out):  # (predict() refuses them as such, with their own message)
        return
    fn = innermost_distribution(site["fn"])
    family = type(fn).__name__
    softmax = out.detach().softmax(-1, dtype=torch.promote_types(out.dtype, torch.float32))
    if family == "Categorical":
        drawn, given = fn.probs, softmax
    elif family == "Bernoulli" and out.shape[-1] == 2:  # logits [0, l] of Bernoulli(logits=l)
        drawn, given = fn.probs, softmax[..., 1]
        if torch.is_tensor(drawn) and drawn.shape == (*out.shape[:-1], 1):
            drawn = drawn[..., 0]
    else:
        return
    if not torch.is_tensor(drawn) or drawn.shape != given.shape or not drawn.dim():
        return
    if _close(drawn, given, out.dtype):
        return
    drawn, given = drawn.detach().double(), given.double()
    gap = (drawn - given).abs().reshape(drawn.shape[0], -1).amax(1)
    warn_caller(
        f"{caller}: the class probabilities reported for {name}, the softmax of the logits "
        f"the model returned or recorded ({_rows(given)}), differ from those its 'obs' site "
        f"is drawn from ({family}: {_rows(drawn)}; the largest difference "
        f"{float(gap.max()):.3g}, at input {int(gap.argmax())}). They are not the predictive "
        "probabilities of the labels the model observes (logits divided by a temperature, or "
        "a term the likelihood adds that they leave out?), and what is computed from them "
        "(accuracy, calibration, uncertainty) is that softmax's. For predictions of the observed "
        "labels, return, or record with pyro.deterministic('logits', ...), the logits 'obs' "
        "is drawn from. If the difference is intended (label smoothing, a noise model whose "
        "clean-class probabilities you want), ignore this warning or filter it: "
        "warnings.filterwarnings('ignore', message=r\".*differ from those its 'obs' site is "
        'drawn from")'
    )


def _rows(probs: Tensor) -> str:
    """The first two rows of class probabilities (four values each at most), to be read."""
    return ", ".join(
        "[" + ", ".join(f"{v:.3g}" for v in row.reshape(-1)[:4].tolist()) + "]" for row in probs[:2]
    )
