"""Likelihoods: how a network's outputs meet the targets.

One object owns, for one kind of target, everything that used to be hard-coded as softmax and
cross-entropy across the package:

* how the targets are observed in a Pyro model (the ``"obs"`` site inside ``pyro.plate("data")``,
  scaled N/B, with the outputs recorded as a deterministic site);
* the fast negative log-likelihood that :func:`pyrouq.fit` back-propagates;
* the target checks (shape, dtype, range) with their error messages;
* how outputs become predictive distributions (:func:`pyrouq.predict`, the diagnostics).

Shape convention: outputs are ``(*S, B, D)``: leading sample dims S (weight draws or ensemble
members, possibly none), B inputs, D outputs (C classes for :class:`Categorical`).

Models take a likelihood as ``likelihood="categorical"`` / ``"gaussian"`` or as an instance
(``Gaussian(scale="learned")``); :func:`get_likelihood` maps the strings onto classes.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pyrouq._words import close_hint
from pyrouq.likelihoods._base import Likelihood
from pyrouq.likelihoods._categorical import Categorical
from pyrouq.likelihoods._gaussian import NOISE_SITE as NOISE_SITE
from pyrouq.likelihoods._gaussian import Gaussian

__all__ = ["Categorical", "Gaussian", "Likelihood", "LikelihoodName", "get_likelihood"]

LikelihoodName = Literal["categorical", "gaussian"]
"""The names :func:`get_likelihood` (and the converters' ``likelihood=``) take, lower case:
:class:`Categorical`, and :class:`Gaussian` with its default noise scale."""

_LIKELIHOODS: dict[str, type[Likelihood]] = {"categorical": Categorical, "gaussian": Gaussian}

#: Other words users write for a likelihood (in any case), and its name here (Laplace's
#: ``likelihood="regression" | "classification"`` among them).
_OTHER_WORDS = {
    "normal": "gaussian",
    "gauss": "gaussian",
    "regression": "gaussian",
    "classification": "categorical",
    "softmax": "categorical",
}

#: The noise scales of :class:`Gaussian` (its ``scale``), which users give as a likelihood.
_NOISE_SCALES = ("learned", "heteroscedastic", "heteroskedastic")


def _name_hint(name: object, scales: bool = True) -> str:
    """The question the refusal of an unknown likelihood ``name`` asks: its slip (``"Gaussian"``),
    another word for it (``"normal"``), else the name close to a typo (``"categorial"``); for
    a Gaussian's noise scale (``"heteroscedastic"``) given as the likelihood (``scales``: not a
    checkpoint's description), the likelihood that takes it."""
    if not isinstance(name, str):
        return ""
    if scales and name.strip().lower() in _NOISE_SCALES:
        scale = "learned" if "learned" in name.lower() else "heteroscedastic"
        return (
            f" (a noise scale of the Gaussian likelihood, not a likelihood: pass "
            f"likelihood=pyrouq.Gaussian({scale!r}))"
        )
    return close_hint(name, _LIKELIHOODS, _OTHER_WORDS)


def get_likelihood(spec: str | Likelihood | dict[str, Any]) -> Likelihood:
    """The likelihood named by ``spec``: a name (``"categorical"``, ``"gaussian"`` with its
    default scale), an instance (copied: each model owns its likelihood)
    or the :meth:`Likelihood.describe` dict of a checkpoint.

    Examples
    --------
    >>> get_likelihood("categorical")
    Categorical()
    """
    if isinstance(spec, Likelihood):
        return copy.deepcopy(spec)  # each model owns its likelihood (and its parameters)
    if isinstance(spec, type) and issubclass(spec, Likelihood):  # "Unknown likelihood" misled
        named = f" (or the name {spec.name!r})" if spec.name else ""
        raise ValueError(  # a ValueError, as for any other spec that is not one
            f"Expected a likelihood instance or name, got the class {spec.__name__} itself: "
            f"pass an instance, {spec.__name__}(){named}."
        )
    name = spec.get("name") if isinstance(spec, dict) else spec
    if not isinstance(name, str) or name not in _LIKELIHOODS:
        hint = _name_hint(name, scales=not isinstance(spec, dict))
        raise ValueError(
            f"Unknown likelihood {spec!r}{hint}: expected one of {sorted(_LIKELIHOODS)} or a "
            "pyrouq.likelihoods.Likelihood instance (e.g. pyrouq.likelihoods.Gaussian(0.5))."
        )
    if isinstance(spec, dict) and name == "gaussian":
        return Gaussian.from_description(spec)
    return _LIKELIHOODS[name]()


def likelihood_of(model: Any) -> Likelihood | None:
    """``model.likelihood`` where it is a pyrouq :class:`Likelihood` (or has its ``observe``
    and ``predictive``, as one reloaded in a notebook does), else None: an attribute
    of that name of a user's own model (a string, a distribution, a module of theirs) is not
    ours, and the model is then read as its own Pyro model is (a Categorical ``"obs"``)."""
    likelihood = getattr(model, "likelihood", None)
    interface = all(callable(getattr(likelihood, a, None)) for a in ("observe", "predictive"))
    return likelihood if isinstance(likelihood, Likelihood) or interface else None
