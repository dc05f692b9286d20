"""The warning of :func:`pyrouq.calibration.temperature_scale` when the validation NLL is lowest
at a bound of its search: what the bound means for these predictions, and what to do."""

from __future__ import annotations

import math

from torch import Tensor


def all_right(logp: Tensor, y: Tensor) -> bool:
    """Whether every draw of ``logp`` ``(S, N, C)`` puts its largest log-probability on the
    label of every input, alone (a tie shares it): the tempered NLL then falls toward 0 as
    T -> 0, with no minimum."""
    index = y.expand(logp.shape[0], -1)[..., None]  # (S, N, 1)
    others = logp.scatter(-1, index, -math.inf).amax(-1, keepdim=True)
    return bool((logp.gather(-1, index) > others).all())


def bound_warning(bound: float, bounds: tuple[float, float], logp: Tensor, y: Tensor) -> str:
    """The warning for a minimum at ``bound`` of the search ``bounds``. At the upper bound the
    predictions barely tell the labels apart, most often labels that are not theirs. At the
    lower bound they are far less confident than their accuracy: a split they get all right
    (which labels that are not theirs cannot cause), or probabilities softened before they came."""
    head = (
        f"temperature_scale: the validation NLL is lowest at T = {bound:g}, the bound of the "
        f"search [{bounds[0]:g}, {bounds[1]:g}]: "
    )
    if bound > 1:
        return head + (
            "the predictions barely tell the labels apart, so the flattest T fits best. Check "
            "that val_targets are the labels of val_preds, in the same order."
        )
    head += "the predictions are far less confident than their accuracy"
    if all_right(logp, y):
        return head + (
            f"; all {y.shape[0]} validation inputs are predicted right (by every draw), so the "
            f"NLL falls toward 0 as T -> 0, with no minimum: T = {bound:g} makes new predictions "
            "near one-hot. Fit T on a validation split with errors (a larger one, or one as hard "
            "as the test data), or keep T = 1 (no change)."
        )
    return head + (
        ". Check that val_preds hold the model's probabilities (a softmax applied once, to its "
        f"logits): T = {bound:g} multiplies their log-odds by {1 / bound:g}."
    )
