"""The observation model shared by every pyrouq model (sites ``"logits"`` and ``"obs"``)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.util import is_validation_enabled
from torch import nn

from pyrouq._util import check_int

__all__ = ["observe"]

# --------------------------------------------------------------------------------------------
# The observation model shared by every pyrouq model
# --------------------------------------------------------------------------------------------


def _check_labels(name: str, y: torch.Tensor, batch: int, num_classes: int) -> None:
    if not torch.is_tensor(y):
        raise TypeError(f"{name}: expected labels y as a torch.Tensor, got {type(y).__name__}.")
    if y.shape != (batch,):
        raise ValueError(
            f"{name}: expected labels y of shape ({batch},) to match the {batch} inputs, got "
            f"shape {tuple(y.shape)}. Pass one integer label per input."
        )
    if y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected integer class labels y, got dtype {y.dtype}. Use y.long()."
        )
    if batch and is_validation_enabled():
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(
                f"{name}: labels must lie in [0, {num_classes}), got values in [{lo}, {hi}]. "
                "Check the targets or the model's number of classes."
            )


def likelihood_scale(
    model: nn.Module, logits: torch.Tensor, y: torch.Tensor, num_data: int | None
) -> float:
    """N/B, the factor of the minibatch log-likelihood, after checking the labels ``y``
    against ``logits`` ``(..., B, C)`` and that N is set."""
    name = type(model).__name__
    batch, num_classes = logits.shape[-2], logits.shape[-1]
    _check_labels(name, y, batch, num_classes)
    if num_data is None:
        raise ValueError(
            f"{name}.num_data is not set: the likelihood of a minibatch of B points is "
            "scaled by N/B, with N the training-set size. Pass num_data=N to the "
            "constructor, set model.num_data = N, or train with pyrouq.fit(), which sets it."
        )
    return num_data / max(batch, 1)


def observe(
    model: nn.Module,
    logits: torch.Tensor,
    y: torch.Tensor | None,
    num_data: int | None,
    members: int | None = None,
) -> torch.Tensor:
    """Record ``"logits"`` and observe ``y`` at ``"obs"`` in the ``"data"`` plate, scaled N/B.

    ``logits`` is ``(..., B, C)``; with ``members`` the observation sits in a ``"members"``
    plate (dim -2) too. Returns ``logits``.
    """
    scale = 1.0 if y is None else likelihood_scale(model, logits, y, num_data)
    batch = logits.shape[-2]
    if members is not None:
        with (
            pyro.plate("members", members, dim=-2),
            pyro.plate("data", batch, dim=-1),
        ):
            pyro.deterministic("logits", logits, event_dim=1)
            with pyro.poutine.scale(scale=scale):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits
    with pyro.plate("data", batch, dim=-1):
        pyro.deterministic("logits", logits, event_dim=1)
        with pyro.poutine.scale(scale=scale):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def _check_num_data(num_data: int | None) -> int | None:
    if num_data is None:
        return None
    return check_int("num_data", num_data)
