"""save()'s warning of a model with latent sites saved without its guide: the posterior that
:func:`pyrouq.fit` fits lives in the guide, so a file of the model alone loses the fit."""

from __future__ import annotations

from torch import nn

from pyrouq._util import class_name, has_latent_sites, warn_caller
from pyrouq.convert._hints import names_list


class _GuideLeftOutWarning(UserWarning):
    """:func:`warn_guide_left_out`'s; fit(checkpoint=), which saves its guide, never gives it."""


def warn_guide_left_out(model: nn.Module, guide: object) -> None:
    """Warn where ``model`` has latent sites and ``guide`` is None: the file holds the model's
    structure, priors and other parameters, and no posterior. Quiet for a model without latent
    sites (a BatchEnsemble network, a plain one), which holds all it learned."""
    if guide is not None or not has_latent_sites(model):
        return
    sites = list(model.latent_sites())  # type: ignore[operator]
    warn_caller(
        f"save(): {class_name(model)} has latent sites ({names_list(sites, 4)}) and was saved "
        "without a guide: the file holds its structure, priors and other parameters, not the "
        "posterior that fit() fits, which lives in the guide (load() gives the model alone, "
        "and predict() asks for its guide). Pass the guide: save(path, model, guide). A model "
        "kept to go with an MCMCResult, its posterior saved apart with save(path, result), "
        "needs none.",
        _GuideLeftOutWarning,
    )
