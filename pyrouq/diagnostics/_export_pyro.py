"""``to_inference_data`` on any Pyro model ``model(x, y)``: replayed on each guide draw, its
observed site ``"obs"`` read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from pyrouq._distribution_parts import innermost_distribution
from pyrouq._own_likelihood import check_likelihood_logits
from pyrouq._own_models import check_traces_match, name_of
from pyrouq.diagnostics._common import (
    _check_var_names,
    _fixed_support,
    _masked,
    _outside,
    _outside_support,
    _prepared,
)
from pyrouq.diagnostics._replay import _latent_sites, _replayed_draws
from pyrouq.diagnostics._store import _LATENT, _Draws, _stored_dtype


def _export_pyro(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    n: int,
    num_samples: int,
    var_names: str | Sequence[str] | None,
) -> tuple[_Draws, list[str]]:
    """Any Pyro model: replay it on every guide draw and read its ``"obs"`` site."""
    out = _Draws(num_samples)
    keep: list[str] = []
    with _prepared(model, n):
        for s, guide_trace, model_trace in _replayed_draws(
            model, guide, x, y, num_samples, "to_inference_data()", replay_outside=True
        ):
            if s == 0:
                check_traces_match(model_trace, guide_trace, "to_inference_data()", model, guide)
                keep = _check_var_names(var_names, list(_latent_sites(model_trace)))
            _refuse_outside(model, model_trace, s)
            site = model_trace.nodes.get("obs")
            if site is None or site["type"] != "sample" or not site["is_observed"]:
                raise ValueError(
                    f"{name_of(model)} has no observed site 'obs': to_inference_data() "
                    "reads the pointwise log-likelihood there. Observe y as "
                    "pyro.sample('obs', ..., obs=y) inside pyro.plate('data', N)."
                )
            if _masked(site):
                raise ValueError(
                    f"to_inference_data(): a mask (poutine.mask or .mask()) leaves points of "
                    f"{name_of(model)}'s observed site 'obs' "
                    "out. The model does not observe them, so they have no pointwise "
                    "log-likelihood, yet az.loo and az.waic would count each as a point, at the "
                    "density of whatever value fills y there. Export the observed points alone: "
                    "to_inference_data(model, guide, x[keep], y[keep]) with keep the points the "
                    "mask keeps."
                )
            if s == 0 and _fixed_support(site["fn"]):  # (torch's IndexError for a label of C)
                outside = _outside(site["fn"], site["value"])
                if outside:
                    raise ValueError(f"to_inference_data(): {_outside_support(site, outside)}")
            log_lik = site["fn"].log_prob(site["value"])
            if log_lik.shape != (n,):
                raise ValueError(
                    f"The pointwise log-likelihood of 'obs' has shape {tuple(log_lik.shape)}, "
                    f"expected ({n},), one value per point. Put 'obs' inside "
                    "pyro.plate('data', N) (dim -1) and run the model on all of x, without "
                    "subsampling."
                )
            for name in keep:
                out.put(_LATENT + name, s, model_trace.nodes[name]["value"])
            out.put("log_lik", s, log_lik.double())
            out.put("obs", s, site["fn"].sample())
            logits = model_trace.nodes.get("logits")
            if logits is not None and logits["value"].shape[-2:-1] == (n,):
                if s == 0:  # (probs the softmax of the logits its "obs" is drawn from)
                    fn = "to_inference_data()"
                    check_likelihood_logits(name_of(model), model_trace, logits["value"], fn)
                probs = logits["value"].softmax(-1)
                out.put("probs", s, probs.to(_stored_dtype(probs)))
    return out, keep


def _refuse_outside(model: Any, trace: Any, draw: int) -> None:
    """Refuse a guide draw outside the support a latent site's prior declares (a Normal guide
    for a HalfNormal scale, drawn below 0): the model cannot produce it, and its predictive
    draws failed in torch's words ("normal expects all elements of std >= 0.0") or were
    exported as if it could."""
    for name, site in _latent_sites(trace).items():
        if _masked(site) or not _outside(site["fn"], site["value"]):
            continue
        support = innermost_distribution(site["fn"]).support
        raise ValueError(
            f"to_inference_data(): the guide's draw {draw} of site {name!r} lies outside the "
            f"support of {name_of(model)}'s prior there ({support}), so the model cannot "
            "produce it, nor its predictions and log-likelihood. Use a guide that draws inside "
            "the model's support: pyro.infer.autoguide.AutoNormal(model) transforms to it."
        )
