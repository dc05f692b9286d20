"""How :func:`pyrouq.predict` takes S draws of a guide's latent sites: a
:class:`~pyrouq.MeanFieldGuide` sampled directly, any other guide traced once per draw on the
inputs alone (as Pyro's ``Predictive`` runs it), with clear errors for guides that cannot run
so."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoGuide
from pyro.poutine.guide import GuideMessenger
from torch import Tensor

from pyrouq import _own_models as own_models
from pyrouq._param_store import forget_params_since
from pyrouq.infer._draws import draw_runs
from pyrouq.infer.guide import MeanFieldGuide


def takes_inputs_alone(owner: Any, x: Tensor) -> bool:
    """Whether ``owner``'s forward takes ``x`` alone by its signature (True if unreadable)."""
    try:
        inspect.signature(getattr(owner, "forward", owner)).bind(x)
    except TypeError:
        return False
    except ValueError:  # (a builtin: no signature to read)
        pass
    return True


def sampled_directly(guide: Any) -> bool:
    """Whether ``guide`` is a :class:`~pyrouq.MeanFieldGuide` as pyrouq made it (not a
    subclass with its own ``forward``): its draws are then taken from its locs and scales."""
    return isinstance(guide, MeanFieldGuide) and type(guide).forward is MeanFieldGuide.forward


def draw_guide(guide: Any, num_samples: int, args: tuple) -> dict[str, Tensor]:
    """S draws of every latent site of the guide, stacked: ``{site: (S, *shape)}`` (not of its
    auxiliary sites, which no model samples).

    A :class:`~pyrouq.MeanFieldGuide` is sampled directly, one draw after another (the draws
    its traces would give), its scales computed once; any other guide is traced once per draw
    on ``args``.
    """

    if sampled_directly(guide):
        with torch.no_grad():
            loc = {s: guide.site_loc(s) for s in guide.sites}
            scale = {s: guide.site_scale(s) for s in guide.sites}
        return draw_runs(loc, scale, num_samples, guide.positive)
    # each draw goes into its slot of the site's stack as it comes (a list of the draws then
    # stacked holds them twice), and an auxiliary site, which no model samples (AutoNormal's
    # "<site>_unconstrained"), is not kept: a bayesian resnet18's 16 AutoNormal draws took
    # 2.3 GB at the peak for 0.68 GB of weights
    _refuse_targets_unobserved(guide, args)
    draws: dict[str, Tensor] = {}
    counts: dict[str, int] = {}
    for _ in range(num_samples):
        trace = _guide_trace(guide, args)
        for name, site in trace.nodes.items():
            auxiliary = (site.get("infer") or {}).get("is_auxiliary", False)
            if site["type"] == "sample" and not site["is_observed"] and not auxiliary:
                value = site["value"].detach()
                if name not in draws:
                    draws[name] = value.new_empty((num_samples, *value.shape))
                    counts[name] = 0
                elif draws[name].shape[1:] != value.shape:
                    raise ValueError(
                        f"The guide drew site {name!r} of shape {tuple(value.shape)} in one run "
                        f"and {tuple(draws[name].shape[1:])} in another: predict() stacks the "
                        "draws of a site, which need one shape. Make the guide draw each site "
                        "with the same shape in every run (the shape the model samples), or "
                        "pass the draws as posterior_samples={site: (S, *shape)}."
                    )
                draws[name][counts[name]] = value
                counts[name] += 1
    return {name: values[: counts[name]] for name, values in draws.items()}


def _guide_trace(guide: Any, args: tuple) -> Any:
    """One trace of ``guide(*args)``, or a clear error for a guide whose signature needs the
    targets (``guide(x, y)``), an autoguide that has never run (it traces the model on x alone
    to find its sites, and meets the likelihood unobserved) or one that runs the model at every
    call (a ``GuideMessenger``: AutoNormalMessenger). An autoguide that had never run is left
    unbuilt when that run fails, as it came: an ``AutoContinuous`` (``AutoDiagonalNormal``,
    ...) or an ``AutoDelta`` would keep the trace it took of the model without the parameters
    it failed to make, and never make them (``'AutoDiagonalNormal' object has no attribute
    'loc'`` at its next run, given the targets or not); the param-store entries that run made
    are removed."""
    unbuilt = _unbuilt(guide)
    stored = set(pyro.get_param_store().keys()) if unbuilt else set()  # (not at every draw)
    try:
        return _traced(guide, args, unbuilt)
    except BaseException:
        if unbuilt:  # (an AutoNormal puts it back itself; the others set it before failing)
            guide.prototype_trace = None
            forget_params_since(stored)
        raise


def _unbuilt(guide: Any) -> bool:
    """Whether ``guide`` is a Pyro autoguide that has never run (it finds its sites then)."""
    return isinstance(guide, AutoGuide) and getattr(guide, "prototype_trace", 1) is None


def _refuse_targets_unobserved(guide: Any, args: tuple) -> None:
    """Refuse, before it runs, an autoguide that has never run or a ``GuideMessenger`` whose
    model samples its targets' site ``"obs"`` on the inputs alone (``args``), as the contract's
    models do where ``y`` is None: run on them, the guide would take ``"obs"`` for one of its
    latent sites (for real-valued targets without a word, then Pyro's warning of a guide site
    ``'obs'`` at every call with the targets; for labels, Pyro's words to enumerate it). The
    model is traced under its priors, the random state kept; the guide is left as it came, and
    the param-store entries that trace made are removed."""
    if not (_unbuilt(guide) or isinstance(guide, GuideMessenger)) or not args:
        return
    if not own_models.samples_targets_unobserved(guide.model, args[0]):
        return
    raise _refusal(
        guide, "its model samples the targets' site 'obs' on the inputs alone", _unbuilt(guide)
    )


def _traced(guide: Any, args: tuple, unbuilt: bool) -> Any:
    """:func:`_guide_trace`'s trace and errors (``unbuilt``: an autoguide that never ran)."""
    try:
        return poutine.trace(guide).get_trace(*args)
    except TypeError as err:  # guide(x, y): y without a default
        if not args or takes_inputs_alone(guide, args[0]):
            raise  # an error from inside the guide, not of its signature
        raise TypeError(
            f"predict(): the guide {own_models.name_of(guide)!r} cannot run on the inputs alone "
            f"({err}): predictions draw from the guide as guide(x), without targets, as Pyro's "
            "Predictive does. Write it as guide(x, y=None) (a mean-field guide does not read "
            "y), or pass its draws as posterior_samples=."
        ) from err
    except (ValueError, NotImplementedError) as err:
        unobserved = "discrete sample site" in str(err)  # the targets, sampled without y
        if not (unobserved and (unbuilt or isinstance(guide, GuideMessenger))):
            raise
        first = " ".join(str(err).split(". ")[0].split())
        named = re.search(r"discrete sample site '([^']+)'", first)  # (Pyro's words name it)
        raise _refusal(guide, first, unbuilt, named[1] if named else "obs") from err


def _refusal(guide: Any, why: str, unbuilt: bool, site: str = "obs") -> ValueError:
    """predict()'s refusal of an autoguide that had never run (``unbuilt``, as it was before
    that run: an ``AutoContinuous`` or ``AutoDelta`` sets its prototype trace before it
    fails), or of a ``GuideMessenger``, run on the inputs alone where its model samples its
    targets (``why``: what shows it; ``site``: the targets' site, the one to hide)."""
    how = (
        "has not run yet: it would trace the model on the inputs alone to find its sites, "
        "where the model samples its targets. Run it once on training data first, "
        "guide(x_train[:2], y_train[:2]), as fit() and SVI do (parameters loaded into "
        "Pyro's param store are then taken)"
        if unbuilt
        else "runs the model at every call, and predictions have no targets to give it, "
        "nor has Pyro's Predictive; build it on the model with its targets hidden, "
        f"AutoNormalMessenger(poutine.block(model, hide=[{site!r}])), or fit an AutoNormal"
    )
    return ValueError(f"predict(): the guide {type(guide).__name__} {how} ({why}).")
