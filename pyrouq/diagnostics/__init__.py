"""Posterior diagnostics with arviz: ``InferenceData`` export, PSIS-LOO and the PSIS check of a
variational fit.

The only pyrouq module that uses arviz, and it imports it inside its functions, so
``import pyrouq`` stays fast and works without it.

Shape convention: S posterior draws or ensemble members, N inputs, C classes. Guide draws are
independent, so an export holds one chain of S draws; ``az.loo`` and ``az.waic`` work on it,
while R-hat and the MCMC effective sample sizes carry no information about it.

* :func:`to_inference_data` -- ``arviz.InferenceData`` with the posterior (guide draws of the
  latent sites), the posterior predictive, the pointwise log-likelihood and the observed data.
* :func:`psis_diagnostic` -- the Pareto k-hat of the importance ratios ``p(w, D) / q(w)`` over
  guide draws (Yao et al. 2018, "Yes, but did it work?: Evaluating variational inference").
* :func:`summary` -- ``az.summary`` of an export: ``kind="stats"`` for guide draws and
  ensemble members, every column (R-hat and ESS included) for MCMC chains.
"""

from pyrouq.diagnostics._common import (
    DEFAULT_IDATA_SAMPLES,
    DEFAULT_PSIS_SAMPLES,
    K_HAT_GOOD,
    K_HAT_OK,
)
from pyrouq.diagnostics._idata import to_inference_data
from pyrouq.diagnostics._psis import PSISResult, psis_diagnostic
from pyrouq.diagnostics._summary import summary

__all__ = [
    "DEFAULT_IDATA_SAMPLES",
    "DEFAULT_PSIS_SAMPLES",
    "K_HAT_GOOD",
    "K_HAT_OK",
    "PSISResult",
    "psis_diagnostic",
    "summary",
    "to_inference_data",
]
