"""A BatchEnsemble given to ``load()`` as the skeleton of a saved BatchEnsemble or rank-1
network (``load(path, module=batchensemble(net, M))``, as a factory that returns the ensemble
builds it): checked against the saved record of the network it was made from and the saved
number of members and normalisation layers, then the model rebuilt from it, as from that
network."""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from pyrouq.checkpoint._describe import (
    _ensemble_options,
    rebuild_latent,
)
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.checkpoint._skeleton import check_holds_values, check_structure
from pyrouq.convert import BatchEnsembleNetwork
from pyrouq.likelihoods import get_likelihood

__all__ = ["ensemble_rebuild"]

_STRUCTURAL = ("num_members", "norms")
"""The ensemble options that shape the network (the factors' initialisation options do not:
the saved ones are kept)."""


def ensemble_rebuild(
    name: str, config: dict[str, Any], record: dict[str, Any], module: Any, path: Any
) -> nn.Module | None:
    """The saved model ``name`` (``config``; ``record``: the structure of the network it was
    made from) rebuilt from ``module`` where that is a BatchEnsemble and the saved model is
    one or was made from one (rank-1); None otherwise (the plain skeleton's checks follow,
    which refuse a pyrouq model)."""
    if not isinstance(module, BatchEnsembleNetwork):
        return None
    saved = config if name == "BatchEnsembleNetwork" else config.get("ensemble")
    if name not in ("BatchEnsembleNetwork", "BayesianNetwork") or not isinstance(saved, dict):
        return None
    check_holds_values(module)  # (one built on the meta device would take no saved value)
    check_structure(record, dict(module.module_record), path)
    options = {"num_members": int(saved["num_members"]), **_ensemble_options(saved)}
    given = {"num_members": module.num_members, **module.options}
    differ = [key for key in _STRUCTURAL if options.get(key) != given.get(key)]
    if differ:
        theirs, mine = (
            ", ".join(f"{key}={values.get(key)!r}" for key in differ) for values in (options, given)
        )
        made = "a BatchEnsemble" if name == "BatchEnsembleNetwork" else "a rank-1 network"
        fault = (
            f"The skeleton (a BatchEnsemble, {mine}) does not match {str(path)!r}, which holds "
            f"{made} of {theirs}."
        )
        raise CheckpointError(
            f"{fault} Build the skeleton as the saved one was built (batchensemble(net, "
            f"{options['num_members']}, norms={options['norms']!r})), or pass the plain "
            "network it was made from: load(path, module=net).",
            skeleton_mismatch=fault,
        )
    kept = {key: value for key, value in options.items() if key in module.options}
    if name == "BatchEnsembleNetwork":
        built = copy.deepcopy(module)  # (a fresh name in Pyro's param store)
        built.likelihood = get_likelihood(config["likelihood"])
        built.num_data = built.given_num_data = None  # the file's, if it holds one (load())
        built.options.update(kept)
        return built
    model = rebuild_latent(module, config)  # (it copies the ensemble's network)
    model.ensemble_options = {**(model.ensemble_options or {}), **kept}
    return model
