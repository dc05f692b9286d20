"""The guide's draws replayed through the model (:func:`_replayed_draws`, for the exports and
the PSIS check), and what is said where the model fails on the first of them: a guide built
for points of another number (a local latent site), draws that do not fit the model run under
its priors, or inputs the model does not take (:func:`_explain_inputs`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pyro
import torch
from pyro import poutine
from pyro.infer.util import is_validation_enabled
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyrouq._distribution_parts import innermost_distribution
from pyrouq._input_cast import latent_dtype_refusal, typed_by
from pyrouq._mismatch import dtype_fix, input_mismatch, restated
from pyrouq._own_models import GuideMismatch, check_traces_match, name_of
from pyrouq._util import global_streams_kept, module_dtype
from pyrouq.diagnostics._common import _check_labels, _masked, _outside
from pyrouq.infer._elbo_checks import own_model
from pyrouq.infer._site_checks import check_draws
from pyrouq.likelihoods import Categorical


def _latent_sites(trace: poutine.Trace) -> dict[str, Any]:
    """The latent sample sites of ``trace`` by name: neither observed nor a plate's subsample."""
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }


def _replayed_draws(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    num_samples: int,
    caller: str,
    replay_outside: bool = False,
) -> Iterator[tuple[int, Any, Any]]:
    """``(s, guide_trace, model_trace)`` for S guide draws, the model replayed on each.

    The first draw runs under the caller's validation setting, the rest without (speed). With
    ``replay_outside``, a first draw outside a latent site's support that a distribution's
    validation refused is replayed without it, as later draws are (the PSIS check weighs such
    draws 0, the export refuses them by name), and the next draw runs under that setting in
    its place, and so on until one runs there: a fault of the model that validation finds
    (a Gamma likelihood's negative concentration) is not hidden behind a draw outside.
    """
    validate = is_validation_enabled()
    checked = False  # whether a draw ran under the caller's validation setting
    for s in range(num_samples):
        checking = not checked
        with pyro.validation_enabled(checking and validate):
            try:
                guide_trace = poutine.trace(guide).get_trace(x, y)
            except RuntimeError as err:  # an autoguide not fitted, building itself on x
                said = latent_dtype_refusal(err, model, guide, x, y, caller) if not s else None
                if said is not None:
                    raise TypeError(said) from err
                raise
            if s == 0:  # before the model runs on them
                drawn = {n: site["value"][None] for n, site in _latent_sites(guide_trace).items()}
                check_draws(model, drawn, caller, guide=guide)
            try:
                replayed = poutine.trace(poutine.replay(model, trace=guide_trace))
                model_trace = replayed.get_trace(x, y)
                checked = True
            except Exception as err:
                # a draw outside a latent site's support, refused by the validation of a
                # distribution it parameterises (a Normal of scale < 0): replayed as later
                # draws are, without validation
                retry = checking and replay_outside
                model_trace = _outside_draw(model, guide_trace, x, y) if retry else None
                if model_trace is None:
                    if checking:
                        where = f" at the guide's draw {s} (the earlier ones outside the support)"
                        where = " at the guide's first draw" if s == 0 else where
                        _check_class_labels(model, guide_trace, x, y, caller)
                        _explain_per_point_sites(err, model, guide_trace, x, y, caller)
                        if _draws_fit(err, model, guide_trace, x, y, caller, guide):
                            _explain_inputs(err, model, x, caller, where, guide)
                        _own_refusal(err, model, caller)
                    raise
            if s == 0:  # (before the log density reads the labels)
                _check_class_labels(model, guide_trace, x, y, caller, model_trace)
        yield s, guide_trace, model_trace


def _outside_draw(model: Any, guide_trace: Any, x: Tensor, y: Tensor) -> Any:
    """The model's trace on a guide's draw, replayed without Pyro's validation (the
    random state kept), where that draw lies outside a latent site's declared support; None
    where it lies inside (or the replay fails again): the first error stands."""
    if not is_validation_enabled():
        return None
    try:
        with global_streams_kept(x.device), pyro.validation_enabled(False):
            trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    except Exception:
        return None
    sites = _latent_sites(trace).values()
    return trace if any(not _masked(t) and _outside(t["fn"], t["value"]) for t in sites) else None


def _check_class_labels(
    model: Any, guide_trace: Any, x: Tensor, y: Tensor, caller: str, model_trace: Any = None
) -> None:
    """Refuse labels outside a pyrouq classifier's ``[0, C)`` in the words to_inference_data()
    gives (:func:`_check_labels`) under either validation setting (without Pyro's, the log
    density would refuse them as observed values outside the support). C is read from the
    model's outputs in ``model_trace``, its first replay; where that failed (under Pyro's
    validation the model refused the labels as its own), from a run without the targets (the
    random state kept), left to the replay's error to word if it fails too. Only where the
    labels are integers outside [0, 1] (C >= 2)."""
    likelihood = getattr(own_model(model), "likelihood", None)
    if not isinstance(likelihood, Categorical) or y.dim() != 1 or not y.numel():
        return
    if likelihood.label_problem(y, None) is not None or likelihood.label_problem(y, 2) is None:
        return  # (its dtype: the model words it; labels in [0, 1]: any classifier's)
    try:
        if model_trace is None:
            with global_streams_kept(x.device), torch.no_grad(), pyro.validation_enabled(False):
                model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x)
        logits = innermost_distribution(model_trace.nodes["obs"]["fn"]).logits
    except Exception:
        return
    _check_labels(caller, y, logits.shape[-1])


def _draws_fit(
    err: Exception,
    model: Any,
    guide_trace: Any,
    x: Tensor,
    y: Tensor,
    caller: str,
    guide: Any = None,
) -> bool:
    """Whether the model's failure on the guide's first draw with a shape error read as inputs
    (``err``) is the inputs', x, not the guide's. A pyrouq model's draws were checked
    (:func:`check_draws`). A model of the user's own is run once under its priors (the random
    state kept): where it fails there too, so does x; where it runs, the guide is checked
    against its trace as after a replay (:func:`check_traces_match`: a guide missing a site
    is refused, naming it; one whose draws have other shapes there is refused naming x and
    the sites, as a guide of another model or one built on x of another shape: a model may
    size its sites by x). False otherwise (it fails there in another way, or runs and the
    guide fits it): Pyro's error stands, with the site shapes it appends."""
    if callable(getattr(model, "latent_sites", None)) or not input_mismatch(err):
        return True
    with global_streams_kept(x.device), torch.no_grad():
        try:
            prior = poutine.trace(model).get_trace(x, y)
        except Exception as again:
            return input_mismatch(again)
    try:
        check_traces_match(prior, guide_trace, caller, model, guide)
    except GuideMismatch as mismatch:
        guided = _latent_sites(guide_trace)
        differ = [
            f"{name!r} of shape {tuple(site['value'].shape)} there, the guide's "
            f"{tuple(guided[name]['value'].shape)}"
            for name, site in _latent_sites(prior).items()
            if name in guided and site["value"].shape != guided[name]["value"].shape
        ]
        if not differ:
            raise
        raise ValueError(
            f"{caller}: the guide's draws do not fit {name_of(model)} run under its priors on "
            f"x (shape {tuple(x.shape)}, dtype {x.dtype}): its site(s) {'; '.join(differ)}. "
            "The guide was built for another model, or on x of another shape. Pass x of the "
            "shape the guide was fitted on, or a guide built for this model on such x "
            "(pyro.infer.autoguide.AutoNormal(model) is one for any Pyro model)."
        ) from mismatch
    return False


def _without_shapes(err: Exception) -> str:
    """``err``'s message without the table of site shapes Pyro's trace appends to it (its
    title right-aligned: "  Trace Shapes:" beside a long site name)."""
    return re.split(r"\n *Trace Shapes:", str(err))[0]


def _own_refusal(err: Exception, model: Any, caller: str) -> None:
    """A pyrouq model's refusal of the data, worded with its name or the caller's (under
    Pyro's validation, "BayesianNetwork: labels in [0, 5], expected class indices in [0, 1]
    ..."), restated as the caller's, without the site shapes Pyro's trace appends; pass any
    other."""
    said = _without_shapes(err)
    if not isinstance(err, ValueError) or not callable(getattr(model, "latent_sites", None)):
        return
    for name in (f"{type(model).__name__}: ", f"{caller}: "):
        if said.startswith(name):
            raise ValueError(f"{caller}: {said[len(name) :]}") from err


def _explain_inputs(
    err: Exception, model: Any, x: Tensor, caller: str, where: str = "", guide: Any = None
) -> None:
    """Restate torch's error from the model's first pass that reads as inputs it does not take
    (:func:`pyrouq._mismatch.input_mismatch`: "mat1 and mat2 shapes cannot be multiplied"),
    naming x and what to check, as ``predict()`` and ``mcmc()`` do (torch's words on dtypes
    with their fix, :func:`pyrouq._mismatch.dtype_fix`, x cast as ``guide`` and the model
    cast it); pass any other."""
    if not input_mismatch(err):
        return
    said = _without_shapes(err)
    cast = module_dtype(typed_by(model, guide)) is not None  # (as predict() tells it)
    weights = module_dtype(model) is not None  # (a model of PyroSamples: model.to() is none)
    fix = dtype_fix(err, x.dtype, cast, weights) or (
        "Check that the model takes x (shape, channels, flattening: N inputs of the shape it "
        "was built for) and that the guide and draws are this model's"
    )  # (not after a first layer's fix for the input: restated)
    raise ValueError(
        f"{caller}: {name_of(model)} failed on x (shape {tuple(x.shape)}, dtype {x.dtype}){where}: "
        f"{restated(err, fix, said)}."
    ) from err


def _explain_per_point_sites(
    err: Exception, model: Any, guide_trace: Any, x: Tensor, y: Tensor, caller: str
) -> None:
    """Where the model failed on a guide's first draw that holds a value per point of a plate
    over the data (one the model, run under its priors, sizes by x) of another size than the N
    points given (a local latent site of an autoguide built on the training set), say so:
    torch's "size of tensor a (10) must match ... (40)" told nothing."""
    n = int(x.shape[0])
    try:
        prior = poutine.trace(model).get_trace(x, y)
    except Exception:
        return
    data_plates = {
        frame.name
        for site in prior.nodes.values()
        if site["type"] == "sample"
        for frame in site["cond_indep_stack"]
        if frame.size == n
    }
    sites = sorted(
        _latent_sites(guide_trace).items(), key=lambda i: bool(i[1]["infer"].get("is_auxiliary"))
    )
    for name, site in sites:  # the model's own sites before auxiliary ones (``z_unconstrained``)
        for frame in site["cond_indep_stack"]:
            size = frame.full_size or frame.size
            if frame.vectorized and frame.name in data_plates and size != n:
                raise ValueError(
                    f"{caller}: the model failed on the guide's draws ({type(err).__name__}: "
                    f"{str(err).splitlines()[0] if str(err) else ''}), and the guide's site "
                    f"{name!r} holds a value per point of plate {frame.name!r} of {size} "
                    f"points, while x holds {n}: a local latent site, fitted for the points "
                    "the guide was built on. Pass those points, all of them, or export a "
                    "model whose latent sites are global."
                ) from err
