"""``mean_field_guide(model, init_from=trained)``: what a trained network gives the guide (its
held weights), what the messages ask for instead, and the warnings of what it holds that the
guide does not take (point estimates of other values, weights of layers the model lacks)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pyrouq._util import warn_caller

__all__ = [
    "expected_init_from",
    "held_state",
    "warn_extra_state",
    "warn_unshared_point_estimates",
]


def held_state(init_from: nn.Module) -> dict[str, torch.Tensor]:
    """The weights ``init_from`` holds: its state, or a trained BatchEnsembleNetwork's network's
    (its layers named as the rank-1 model's)."""
    ensemble_net = getattr(init_from, "net", None)
    if getattr(init_from, "num_members", None) is not None and isinstance(ensemble_net, nn.Module):
        return ensemble_net.state_dict()
    return init_from.state_dict()


def expected_init_from(model: Any) -> str:
    """What ``init_from`` should be for ``model``, for an error message."""
    members = getattr(model, "num_members", None)
    if members is not None:  # rank-1: the factors come from a trained BatchEnsemble
        return (
            f"a rank-1 model starts from a trained pyrouq.batchensemble(net, {members}) of "
            "the network it was made from, not from the plain network"
        )
    return "e.g. the module passed to bayesian(), trained"


def _shown(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def warn_unshared_point_estimates(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Warn when ``init_from`` holds other values than the model for parameters or buffers
    the guide does not own (BatchNorm's affine parameters and running statistics, ...): the
    guide copies only its sites, so a trained network's normalisation layers would be lost."""
    net = getattr(model, "net", None)
    if not isinstance(net, nn.Module):
        return
    own: dict[str, Any] = getattr(model, "network_sites", dict)()  # the guide's sites: their
    differ = [  # start values are not the model's to keep
        name
        for name, value in net.state_dict().items()
        if name in state
        and name not in own
        and state[name].shape == value.shape
        and not torch.equal(state[name].to(value.device, value.dtype), value)
    ]
    if differ:
        warn_caller(
            f"init_from sets the guide's means only; the model's own parameters and buffers "
            f"keep their values where init_from's differ ({_shown(differ)}). To start from the "
            "whole trained network (its BatchNorm statistics too), convert it: model = "
            "pyrouq.bayesian(trained); guide = mean_field_guide(model)."
        )


def warn_extra_state(model: Any, init_from: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Warn when ``init_from`` holds parameters or buffers that the model's network has no
    place for (a layer the model lacks): it is not of the model's structure, and the guide
    takes the weights the two share without a word (a deeper trained network's first layers).
    Not for a rank-1 model, whose trained BatchEnsemble holds per-member normalisation."""
    net = getattr(model, "net", None)
    if not isinstance(net, nn.Module) or getattr(model, "num_members", None) is not None:
        return
    held = net.state_dict()  # (built once, not once per name)
    extra = [name for name in state if name not in held]
    if extra:
        warn_caller(
            f"init_from ({type(init_from).__name__}) holds parameters or buffers that "
            f"{type(model).__name__}'s network lacks ({_shown(extra)}): it is not a network "
            "of the model's structure, and the guide takes only the weights the two share. "
            "Pass the trained network the model was converted from (the module given to "
            "bayesian(), trained), or convert the trained network itself: model = "
            "pyrouq.bayesian(trained); guide = mean_field_guide(model)."
        )
