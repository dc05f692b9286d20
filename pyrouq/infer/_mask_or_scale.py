"""The refusal of a ``poutine.mask`` or ``poutine.scale`` around a diagnostic that would not
weigh its sites as the handler asks: psis_diagnostic() (the handler masks or scales the
model's log joint and the guide's log density alike) and to_inference_data() (whose exported
log-likelihood is every point's, unscaled)."""

from __future__ import annotations

import torch
from pyro.poutine.mask_messenger import MaskMessenger
from pyro.poutine.scale_messenger import ScaleMessenger

from pyrouq.infer._elbo_checks import _visible_handlers

__all__ = ["refuse_mask_or_scale_around"]

_MASK_OR_SCALE = {
    "psis_diagnostic()": (
        "it masks the latent sites of the model and of the guide alike (a mask of several "
        "entries broadcasts their densities over its shape), so the log importance ratios would "
        "be other ones (under mask=False all 0, which reads as k-hat -inf, a guide equal to the "
        "posterior)",
        "on the x and y whose points should count",
        "it scales the log densities of the model and of the guide alike, so k-hat would be that "
        "of other importance ratios (these raised to that power)",
        "to weigh the likelihood as that of a data set of M points, pass num_data=M",
    ),
    "to_inference_data()": (
        "the export would not apply it, its log_likelihood holding every point's unmasked "
        "log p(y_n | x_n, w_s), the points the mask leaves out too, which az.loo and az.waic "
        "would count",
        "on the x and y whose points should count (x[keep], y[keep], keep the points the mask "
        "keeps)",
        "the export would not apply it, its log_likelihood being the unscaled "
        "log p(y_n | x_n, w_s) of each point, as az.loo and az.waic read it",
        "the export needs no weight: az.loo and az.waic count each point once",
    ),
}
"""Per caller of :func:`refuse_mask_or_scale_around`: what a mask around it does, how to call
it instead, what a scale does, and what to do for a weight."""


def refuse_mask_or_scale_around(caller: str) -> None:
    """Refuse a ``poutine.mask`` leaving entries out, or a ``poutine.scale`` other than 1,
    around ``caller``. The PSIS diagnostic weighs the model's log joint against the guide's log
    density: such a handler masks or scales both alike, latent sites included, so the log
    ratios would be other ones (under ``mask(False)`` all 0, read as k-hat -inf: a guide equal
    to the posterior). to_inference_data() exports every point's unscaled log-likelihood,
    whatever handler is around it (a Pyro model of one's own refused the mask as its own):
    refused rather than ignored (see :data:`_MASK_OR_SCALE`), but for a mask keeping every
    entry or a scale of ones, which change no point's log-likelihood (they would broadcast
    PSIS's log joint over their shape)."""
    mask_does, mask_advice, scale_does, scale_advice = _MASK_OR_SCALE[caller]
    pointwise = caller == "to_inference_data()"  # (a tensor of any shape changes nothing)
    for handler in _visible_handlers():
        if isinstance(handler, MaskMessenger):
            mask = handler.mask
            if mask is True or (
                isinstance(mask, torch.Tensor) and (mask.numel() == 1 or pointwise) and mask.all()
            ):
                continue
            shown_mask = (
                f"pyro.poutine.mask(mask={bool(mask)})"
                if not torch.is_tensor(mask) or mask.numel() == 1
                else f"pyro.poutine.mask() of a mask of shape {tuple(mask.shape)}"
            )
            raise ValueError(
                f"{caller} was called inside {shown_mask}, expected no mask around the call: "
                f"{mask_does}. Call {caller} outside the mask, {mask_advice}."
            )
        if isinstance(handler, ScaleMessenger):
            scale = handler.scale
            if pointwise and torch.is_tensor(scale) and bool((scale == 1).all()):
                continue
            if torch.is_tensor(scale) and scale.numel() == 1:
                scale = float(scale)
            if isinstance(scale, (int, float)) and scale == 1:
                continue
            shown_scale = f"{scale:g}" if isinstance(scale, float | int) else "a tensor"
            raise ValueError(
                f"{caller} was called inside pyro.poutine.scale(scale={shown_scale}), expected "
                f"no scale around the call: {scale_does}. Call {caller} outside it; "
                f"{scale_advice}."
            )
