"""Inference: the mean-field guide, the KL-weighted ELBO and ``fit()``.

Inference lives outside the model classes: a model only says what its latent sites and
priors are and how its network runs (:mod:`pyrouq.convert`); the guide (:mod:`.guide`), the
objective (:mod:`.elbo`) and the training loop (:mod:`.fit`) do the rest.
"""

from pyrouq.infer.elbo import ELBOTerms, KLWeightedELBO
from pyrouq.infer.fit import EpochRecord, FitResult, TrainingInterrupted, fit
from pyrouq.infer.guide import DEFAULT_INIT_SCALE, MeanFieldGuide, mean_field_guide

__all__ = [
    "DEFAULT_INIT_SCALE",
    "ELBOTerms",
    "EpochRecord",
    "FitResult",
    "KLWeightedELBO",
    "MeanFieldGuide",
    "TrainingInterrupted",
    "fit",
    "mean_field_guide",
]
