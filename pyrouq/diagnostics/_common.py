"""Argument checks, model helpers and constants shared by the diagnostics."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from pyrouq._distribution_parts import distribution_masks, innermost_distribution
from pyrouq._input_cast import typed_by
from pyrouq._input_dtype import not_floating, takes_indices
from pyrouq._param_store import take_store_values
from pyrouq._runners import is_ensemble
from pyrouq._util import (
    builder_of,
    check_finite_inputs,
    modes,
    module_dtype,
    restore_modes,
    warn_caller,
)
from pyrouq._words import ensemble_draws
from pyrouq.infer._elbo_checks import own_model
from pyrouq.infer.guide import MeanFieldGuide
from pyrouq.likelihoods import Categorical

DEFAULT_IDATA_SAMPLES = 100
"""Guide draws S exported by :func:`to_inference_data` when ``num_samples`` is None."""

DEFAULT_PSIS_SAMPLES = 1000
"""Guide draws S used by :func:`psis_diagnostic` when ``num_samples`` is None."""

MIN_PSIS_SAMPLES = 25
"""Fewest draws :func:`psis_diagnostic` accepts: k-hat is fitted to the largest fifth of the
weights, and the fit needs at least five of them."""

K_HAT_GOOD = 0.5
"""Below this k-hat the importance ratios have finite variance: the guide is good."""

K_HAT_OK = 0.7
"""From this k-hat on, importance-weighted estimates with the guide are unreliable."""

_CONSTANT_WEIGHTS_RTOL = 1e-9
"""Log weights whose spread is below this times ``max(1, |largest|)`` are taken as constant
(k-hat -inf): there ``az.psislw`` fits a tail to the rounding of float64 values and returns
NaN or inf. Any larger spread is fitted: a log joint of 1e6 nats (a million observations)
leaves a spread of a few nats between draws that matters to importance sampling, and float32
rounding noise is bounded, so its fitted k-hat comes out small (below 0.5)."""

_ARVIZ_HINT = "pip install 'arviz>=0.20,<1' (it comes with pyrouq's default dependencies)"


GUIDE_DRAWS = "independent guide draws"
"""The ``draws`` attribute of an export of guide draws (independent: no chains to mix)."""
ENSEMBLE_MEMBERS = "ensemble members"
"""The ``draws`` attribute of an export of a BatchEnsemble's members."""


def _arviz() -> Any:
    """Import arviz (once), without its notice about the coming 1.0 refactor."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="ArviZ is undergoing", category=FutureWarning)
            import arviz
    except ImportError as e:  # arviz, or a package it imports (matplotlib: told by name)
        top = (e.name or "arviz").split(".")[0]  # (pip's name where the import's differs)
        pip = {"PIL": "Pillow", "dateutil": "python-dateutil", "yaml": "PyYAML"}.get(top, top)
        hint = _ARVIZ_HINT if top == "arviz" else f"it imports {top} ({e}): pip install {pip}"
        raise ImportError(f"pyrouq.diagnostics needs arviz: {hint}.") from e
    return arviz


# --------------------------------------------------------------------------------------------
# Argument checks and model helpers
# --------------------------------------------------------------------------------------------


def num_samples_words(model: Any, guide: Any, result: Any) -> str:
    """What to_inference_data()'s refusal of a ``num_samples`` that is no integer >= 1
    advises: a number of guide draws where the export draws them, else to leave it out, as
    the refusal of any number there would (an MCMCResult's draws, a BatchEnsemble's members)."""
    if result is not None:
        return "Leave it out: an MCMCResult's draws are exported, S is the number of MCMC draws."
    if guide is None and isinstance(model, nn.Module) and is_ensemble(model):
        return f"Leave it out: a BatchEnsemble's {ensemble_draws(model.num_members)}."
    return f"It is the number of guide draws S (default {DEFAULT_IDATA_SAMPLES})."


def _check_data(fn: str, x: object, y: object) -> int:
    """N, after checking that x and y are tensors holding the same number of points."""
    for name, value in (("x", x), ("y", y)):
        if not torch.is_tensor(value):
            raise TypeError(
                f"{fn}: expected {name} to be a torch.Tensor, got {type(value).__name__}. "
                "Pass tensors holding every point (e.g. torch.cat over a loader's batches)."
            )
        if value.dim() == 0:
            raise ValueError(
                f"{fn}: expected {name} with a leading dimension of N points, got a scalar."
            )
    assert isinstance(x, Tensor) and isinstance(y, Tensor)
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{fn}: x and y must hold the same number of points, got x with "
            f"{x.shape[0]} (shape {tuple(x.shape)}) and y with {y.shape[0]} (shape "
            f"{tuple(y.shape)}). Pass one target per input."
        )
    if x.shape[0] == 0:
        raise ValueError(f"{fn}: x and y are empty. Pass at least one point.")
    check_finite_inputs(x, fn)
    return int(x.shape[0])


def _check_result_data(fn: str, given: str | None, x: object, y: object) -> None:
    """Where an MCMCResult's export got one of ``x=`` and ``y=`` (``given``) and the other is
    the result's own, of another length, say so: "y with 12" named no ``result.y``."""
    if given is None or not (torch.is_tensor(x) and torch.is_tensor(y)) or 0 in (x.dim(), y.dim()):
        return
    if x.shape[0] != y.shape[0]:
        other = "y" if given == "x" else "x"
        sizes = {"x": x.shape[0], "y": y.shape[0]}
        raise ValueError(
            f"{fn}: {given}= holds {sizes[given]} points, but result.{other}, the "
            f"{'targets' if other == 'y' else 'inputs'} the chains ran on, holds "
            f"{sizes[other]}: {given}= replaces result.{given} alone. Pass {other}= too, "
            f"one target per input: to_inference_data(result, x=x, y=y)."
        )


def _result_lacking(fn: str, missing: list[str]) -> str:
    """What an MCMCResult without its model or data (a loaded one) needs, all at once."""
    names = [f"result.{name}" for name in missing]
    lacks = " and ".join([", ".join(names[:-1]), names[-1]] if names[1:] else names)
    steps = ["set result.model = model (the model its chains ran)"] if "model" in missing else []
    data = [name for name in missing if name != "model"]
    if data:
        steps.append(f"pass {' and '.join(f'{name}=' for name in data)}")
    then = "to_inference_data(result, x=x, y=y)" if data else "call it again"
    instead = f" (or set result.{' and result.'.join(data)} instead of passing)" if data else ""
    return (
        f"{fn}: an MCMCResult is exported with the model and data its chains ran on and no "
        f"guide; a loaded result carries neither, and this one lacks {lacks}: "
        f"{' and '.join(steps)}, then {then}{instead}."
    )


def _check_callables(fn: str, model: object, guide: object) -> None:
    """A clear error for a model, or a guide other than None, that cannot be called (a
    FitResult met Pyro's "is not callable" or dataclasses' "cannot assign to field"). Then
    a pyrouq model and guide take the values loaded into Pyro's param store for them."""
    for name, value in (("model", model), ("guide", guide)):
        what = "the pyrouq model fit() trained" if name == "model" else "mean_field_guide(model)"
        builds = builder_of(value) if name == "model" else None  # resnet18 for resnet18()
        if builds is not None:
            raise TypeError(f"{fn}: expected the model to be {what}, got {builds}.")
        if (value is None and name == "guide") or callable(value):
            continue
        hints = {  # what was passed in the model's place, and what to pass instead
            "FitResult": " fit() returns a FitResult, the record of its epochs: pass the model "
            "and the guide that fit() trained.",
            "Checkpoint": " load() returns a Checkpoint: pass its model and guide "
            "(checkpoint.model, checkpoint.guide).",
        }
        raise TypeError(
            f"{fn}: expected the {name} to be callable ({what}, or a Pyro {name} function), "
            f"got {type(value).__name__}." + hints.get(type(value).__name__, "")
        )
    take_store_values(model, guide)


def _typed(x: Tensor, model: Any, guide: Any, fn: str) -> Tensor:
    """Floating inputs in the dtype the model computes in, as predict() casts them: the
    model's parameters', else (every weight a ``PyroSample``, a function) its guide's (float64
    inputs from numpy met a float32 model's weights in torch's dtype error); others as given,
    but a pyrouq model's integer, bool or complex inputs are refused in ``fn``'s name, as
    predict() refuses them (not in its class's, from inside its forward), its
    ``nn.Embedding``'s indices aside (a Pyro model of one's own takes them as they are: group
    indices, say)."""
    if own_model(model) is not None and not x.is_floating_point():
        if not takes_indices(x, model):
            raise TypeError(not_floating(x, model, fn))
    dtype = module_dtype(typed_by(model, guide))
    if x.is_floating_point() and dtype is not None and x.dtype != dtype:
        return x.to(dtype)
    return x


def _numpy(value: Tensor) -> Any:
    """``value`` as a numpy array on the CPU; bfloat16, which numpy lacks, as float32 (a
    bfloat16 model's draws and targets)."""
    value = value.detach().cpu()
    return (value.float() if value.dtype == torch.bfloat16 else value).numpy()


def _check_labels(fn: str, y: Tensor, num_classes: int) -> None:
    problem = Categorical.label_problem(y, num_classes)
    if y.dim() != 1 or problem is not None:
        raise ValueError(
            f"{fn}: expected y as (N,) integer class labels in [0, {num_classes}), got shape "
            f"{tuple(y.shape)}{': ' + problem if problem else ''}. Check the targets or the "
            "model's number of classes."
        )


def check_var_names_kind(var_names: object, fn: str) -> None:
    """Refuse ``var_names`` that are neither a name nor an iterable of names (None: all)."""
    if var_names is not None and not isinstance(var_names, (str, Iterable)):
        raise TypeError(  # (was "'int' object is not iterable")
            f"{fn}: expected var_names to be a variable name or a list of them, got "
            f"{type(var_names).__name__}. Pass e.g. var_names=['fc1.weight'], or None for all."
        )


def _check_var_names(var_names: str | Sequence[str] | None, valid: Sequence[str]) -> list[str]:
    """The requested latent sites, in the model's order; every site when ``var_names`` is None."""
    if var_names is None:
        return list(valid)
    check_var_names_kind(var_names, "to_inference_data()")
    names = [var_names] if isinstance(var_names, str) else list(var_names)
    if not names:
        raise ValueError(
            "to_inference_data(): var_names is empty, so the posterior group would hold "
            f"nothing (and az.loo needs one): the latent sites are {list(valid)}. Pass some of "
            "them, or var_names=None for all of them."
        )
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"Unknown var_names {unknown}: the latent sites are {list(valid)}. Pass a subset "
            "of these, or var_names=None for all of them."
        )
    return [n for n in valid if n in names]


def _warn_not_finite(log_lik: Tensor, fn: str) -> None:
    """Warn where the pointwise log-likelihood ``(S, N)`` is NaN or +inf (no log density), or
    else -inf (a point of probability 0 at a draw): ``az.loo`` and ``az.waic`` are NaN then."""
    bad = torch.isnan(log_lik) | (log_lik == math.inf)
    what = "NaN or +inf"
    why = (
        "The model's outputs or the likelihood's parameters are not finite there; check the "
        "guide's scales (or the chains) and the model at those draws."
    )
    if not bool(bad.any()):
        bad, what = log_lik == -math.inf, "-inf"
        why = (
            "Those draws give the observed points probability 0 (an importance ratio "
            "1 / p(y_n | w_s) of inf); check the likelihood's support at those draws."
        )
    if bool(bad.any()):
        draws = bad.any(1).nonzero().flatten().tolist()
        warn_caller(  # (the caller's line, past pyrouq's and torch's frames)
            f"{fn}: the pointwise log-likelihood is {what} at {int(bad.sum())} of "
            f"{bad.numel()} entries, in draws {draws[:10]}{' ...' if len(draws) > 10 else ''} "
            f"(flattened over chains): az.loo and az.waic will return NaN. {why}",
            RuntimeWarning,
        )


def _warn_one_draw(fn: str, how: str) -> None:
    """Warn of an export of a single draw: ``az.loo`` fails on it (arviz's "index -2 is out of
    bounds for axis 0 with size 1"), far from the export; ``how`` says how to get more."""
    warn_caller(  # (the caller's line, past pyrouq's and torch's frames)
        f"{fn}: one draw exported (S = 1): az.loo fails on a single draw (arviz's IndexError) "
        f"and az.waic reads its spread as 0. For PSIS-LOO and WAIC, {how}."
    )


def _check_result(result: Any, fn: str) -> None:
    """Refuse an MCMCResult whose sites or sample stats disagree on (chain, draw), or whose
    draws are not finite (one made or edited by hand, or loaded): the export read the first
    site's chains and draws for all of them, and sliced the others' wrongly without a word."""
    shapes: dict[str, tuple[int, ...]] = {}
    for site, value in result.samples.items():
        if not torch.is_tensor(value) or value.dim() < 2:
            got = f"shape {tuple(value.shape)}" if torch.is_tensor(value) else type(value).__name__
            raise ValueError(
                f"{fn}: result.samples[{site!r}] is {got}, expected a tensor (chain, draw, "
                "*site_shape). Give every site its chains first: value[None] for one chain."
            )
        shapes[site] = tuple(value.shape[:2])
    if not shapes:
        raise ValueError(
            f"{fn}: result.samples is empty: there are no draws to export. Pass the result "
            "that mcmc() returned, {site: (chain, draw, *site_shape)} for every latent site."
        )
    if len(set(shapes.values())) > 1:
        raise ValueError(
            f"{fn}: the sites of result.samples hold different (chain, draw) counts, {shapes}: "
            "draw d of chain c is one value of every site. Pass the samples of one run, or cut "
            "every site to common chains and draws (value[:C, :S])."
        )
    chains, draws = next(iter(shapes.values()))
    if 0 in (chains, draws):
        raise ValueError(
            f"{fn}: result.samples hold {chains} chain(s) of {draws} draw(s) each, so there "
            "are no draws to export. Pass the result of a run that kept draws (mcmc() with "
            "num_samples >= 1 and num_chains >= 1), or don't cut them all away."
        )
    stats = {k: tuple(v.shape) for k, v in result.sample_stats.items()}
    # a statistic of the user's may hold more than a number per draw: (chain, draw, ...)
    wrong = {k: shape for k, shape in stats.items() if shape[:2] != (chains, draws)}
    if wrong:
        raise ValueError(
            f"{fn}: result.sample_stats must be (chain, draw) = {(chains, draws)}, as the "
            f"samples, got {wrong}. Pass the stats of the same run, cut as the samples (dims "
            "of a statistic's own may follow the two)."
        )
    for site, value in result.samples.items():
        if not value.is_floating_point():
            continue
        bad = (~torch.isfinite(value)).reshape(chains, draws, -1).any(-1).nonzero()
        if len(bad):
            chain, draw = bad[0].tolist()
            raise ValueError(
                f"{fn}: result.samples[{site!r}] holds NaN or inf in {len(bad)} of "
                f"{chains * draws} draws, the first at chain {chain}, draw {draw}: the model's "
                "predictions and log-likelihood would be NaN there. NUTS and HMC draws are "
                "finite: check how these samples were made or loaded, or keep the finite draws "
                "of every site and of result.sample_stats (value[:, keep])."
            )


def _check_guide_finite(guide: Any, fn: str) -> None:
    """Refuse a guide whose parameters hold NaN or inf (a fit that diverged): Pyro's check of
    the guide's distributions failed on them ("Expected parameter loc ... to satisfy the
    constraint Real()"), naming neither the guide nor a fix."""
    if isinstance(guide, MeanFieldGuide):
        named = [(f"{s!r} (location)", guide.site_loc(s)) for s in guide.sites]
        named += [(f"{s!r} (scale)", guide.site_scale(s)) for s in guide.sites]
    elif isinstance(guide, nn.Module):
        named = [
            (repr(name), p) for name, p in guide.named_parameters() if not nn.parameter.is_lazy(p)
        ]
    else:
        return
    bad = [name for name, t in named if t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:
        raise ValueError(
            f"{fn}: the guide's parameters hold NaN or inf, at {', '.join(bad[:3])}"
            f"{' ...' if len(bad) > 3 else ''}: its fit diverged, so its draws are not numbers. "
            "Fit it again, with a smaller learning rate (or from a checkpoint of before the "
            "loss turned NaN)."
        )


def _check_outputs(
    outputs: Tensor, where: str, cols: slice, fn: str, likelihood: Any = None
) -> None:
    """Refuse a pyrouq model's outputs ``(..., B, D)`` that are NaN or inf at a draw (``where``
    names it; the points ``cols``): torch's check of the likelihood's parameters failed on them
    ("Expected parameter logits ..."), naming neither the draw nor the inputs. A classifier's
    logit of -inf (a class masked out, as fit() and predict() take it) is a probability of 0:
    refused only where every class of a point is -inf."""
    bad = ~torch.isfinite(outputs)
    if isinstance(likelihood, Categorical) and bool(bad.any()):
        minus_inf = outputs == float("-inf")
        bad = (bad & ~minus_inf) | minus_inf.all(-1, keepdim=True)
    if not bool(bad.any()):
        return
    first = cols.start or 0
    rows = (
        bad.reshape(-1, *outputs.shape[-2:]).any(-1).any(0).nonzero().flatten() + first
    ).tolist()
    raise ValueError(
        f"{fn}: the model's outputs are NaN or inf {where}, for inputs {rows[:10]}"
        f"{' ...' if len(rows) > 10 else ''}, so its predictions and log-likelihood are not "
        "numbers. Check those inputs (far larger than the data the model was fitted on?) and "
        "the draws; a float16 model overflows past 65,504: export a float32 copy of the model "
        "and its guide."
    )


def _outside(fn: Any, value: Tensor) -> int | None:
    """How many entries of ``value`` lie outside ``fn``'s support, checked entry by entry on
    the distribution inside its Independent / Expanded / Masked wrappers; None where that
    cannot be told (no support declared, a dependent one, a mixture's: torch's check asks for
    every component's)."""
    inner = innermost_distribution(fn)
    if isinstance(inner, torch.distributions.MixtureSameFamily):
        return None
    try:
        return int((~torch.as_tensor(inner.support.check(value), dtype=torch.bool)).sum())
    except (NotImplementedError, ValueError, RuntimeError, IndexError, AttributeError):
        return None


def _outside_support(site: dict[str, Any], outside: int) -> str:
    """Why observed values outside their distribution's support are refused, and what to do."""
    fn, value = site["fn"], site["value"]
    nan = value.is_floating_point() and bool(value.isnan().any())
    return (
        f"The observed values of site {site['name']!r} lie outside the support of its "
        f"distribution ({type(fn).__name__}, support {fn.support}) at {outside} entries"
        f"{' (NaN among them: drop the points without a target)' if nan else ''}: the "
        "model cannot have produced these data. Pass data of that support (labels of a "
        "Bernoulli in {0, 1}, of a Categorical in [0, C), say)."
    )


def _fixed_support(fn: Any) -> bool:
    """Whether ``fn``'s support is the same at every draw: no bound held as a tensor, which a
    draw may set (a Uniform's, a Binomial's count), where a value outside is a log-likelihood
    of -inf at that draw rather than data the model cannot produce."""
    try:
        bounds = vars(innermost_distribution(fn).support).values()
    except (AttributeError, NotImplementedError, TypeError):
        return False
    return not any(torch.is_tensor(bound) for bound in bounds)


def _masked(site: dict[str, Any]) -> bool:
    """Whether a mask leaves entries of the site out (``poutine.mask`` or ``.mask()``; a mask
    of True everywhere leaves none), whose values may then lie anywhere: its support is not
    checked, and its pointwise log-likelihood is not the model's."""
    masks = [site["mask"], *distribution_masks(site["fn"])]
    return any(_leaves_out(mask) for mask in masks)


def _leaves_out(mask: Any) -> bool:
    if mask is None or mask is True:
        return False
    return not (torch.is_tensor(mask) and bool(mask.all()))


@contextlib.contextmanager
def _prepared(model: Any, num_points: int) -> Iterator[None]:
    """Evaluation mode, and a pyrouq model's ``num_data`` set to ``num_points`` (scale N/B = 1),
    both restored on exit; a ``torch.autocast`` around the caller runs the current weights (its
    cached casts of the parameters, of fit()'s last step or a checkpoint's, are dropped)."""
    torch.clear_autocast_cache()
    was = modes(model)
    has_num_data = hasattr(model, "num_data")
    saved = getattr(model, "num_data", None)
    if isinstance(model, nn.Module):
        model.eval()
    if has_num_data:
        model.num_data = num_points
    try:
        yield
    finally:
        if has_num_data:
            model.num_data = saved
        restore_modes(was)


#: The names of a convolution's kernel dims, by their number.
_KERNEL_DIMS = {1: ["k"], 2: ["kh", "kw"], 3: ["kd", "kh", "kw"]}


def _weight_dims(model: Any, site: str, shape: tuple[int, ...]) -> list[str] | None:
    """Named dims of a site of a layer of ``model``'s network, by the layer's layout: a
    Linear's or convolution's weight ``(out, in[, kernel...])``, a transposed convolution's
    ``(in, out[, kernel...])``, a bias ``(out,)``, BatchEnsemble factors ``r`` ``(member,
    in)`` and ``s`` ``(member, out)``; None (arviz's own names) for any other site. A grouped
    convolution's weight holds ``in / groups`` (``out / groups`` transposed) on its second dim,
    named ``<layer>_in_per_group`` (``_out_per_group``): one name is one size in xarray."""
    layer_name, _, kind = site.rpartition(".")
    layer = _layer_of(model, layer_name)
    held = getattr(layer, kind, None)  # the layer's own tensor of that name (a site's value)
    if layer is None or not isinstance(held, Tensor) or tuple(held.shape) != tuple(shape):
        return None
    ndim = len(shape)
    prefix = layer_name.replace(".", "_") + "_" if layer_name else ""
    names = {"r": ["member", "in"], "s": ["member", "out"], "bias": ["out"]}.get(kind)
    if kind == "weight" and ndim >= 2:
        lead = ["in", "out"] if getattr(layer, "transposed", False) else ["out", "in"]
        if getattr(layer, "groups", 1) != 1:
            lead[1] += "_per_group"
        names = lead + _KERNEL_DIMS.get(ndim - 2, [])
    if names is None or len(names) != ndim:
        return None
    return [prefix + name for name in names]


def _layer_of(model: Any, layer_name: str) -> nn.Module | None:
    """The Linear, convolution or BatchEnsemble layer that ``layer_name`` names (``""``: the
    root), in a pyrouq model's network (``model.net``, where its sites are named) or else in the
    model itself (a Pyro model's own layers, one of which may be called ``net``)."""
    root = model.net if getattr(model, "_pyrouq_model", False) else model
    if not isinstance(root, nn.Module):
        return None
    try:
        layer = root.get_submodule(layer_name)
    except AttributeError:
        return None
    ensemble = getattr(layer, "_is_batchensemble", False)
    if ensemble or isinstance(layer, (nn.Linear, nn.modules.conv._ConvNd)):
        return layer
    return None
