"""The warnings of :func:`pyrouq.calibration.temperature_scale`: a validation NLL lowest at a
bound of its search (what the bound means for these predictions, and what to do), or the same
at every T. Their advice is in Python's words (``val_targets``, ``val_preds``); a caller whose
user cannot follow them (``pyrouq evaluate --calibrate temperature``) gives its own words for
the same warnings with :func:`temperature_words`."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Advice:
    """What the warnings say in a caller's words: ``name`` begins them; ``labels`` is the
    advice at the upper bound, ``all_right`` at the lower one for a split predicted all
    right, ``softened`` at the lower one otherwise (``{bound}``, ``{factor}``: T and 1 / T);
    ``flat`` follows "the validation NLL is the same at every T" (its causes, what is done)."""

    name: str
    labels: str
    all_right: str
    softened: str
    flat: str


PYTHON = Advice(
    name="temperature_scale",
    labels="Check that val_targets are the labels of val_preds, in the same order.",
    all_right=(
        "Fit T on a validation split with errors (a larger one, or one as hard as the test "
        "data), or keep T = 1 (no change)."
    ),
    softened=(
        "Check that val_preds hold the model's probabilities (a softmax applied once, to its "
        "logits): T = {bound:g} multiplies their log-odds by {factor:g}."
    ),
    flat=(
        "(every draw is uniform over the classes, the draws disagree so symmetrically that "
        "their mixture is uniform at every T, or there is one class): no temperature fits "
        "better than another, so T = 1 (no change) is returned."
    ),
)

_ADVICE: ContextVar[Advice] = ContextVar("pyrouq_temperature_advice", default=PYTHON)


@contextlib.contextmanager
def temperature_words(advice: Advice) -> Iterator[None]:
    """While it runs, temperature_scale() warns in ``advice``'s words: the same warnings, of
    the same category and place (its caller's line)."""
    token = _ADVICE.set(advice)
    try:
        yield
    finally:
        _ADVICE.reset(token)


def all_right(logp: Tensor, y: Tensor) -> bool:
    """Whether every draw of ``logp`` ``(S, N, C)`` puts its largest log-probability on the
    label of every input, alone (a tie shares it): the tempered NLL then falls toward 0 as
    T -> 0, with no minimum."""
    index = y.expand(logp.shape[0], -1)[..., None]  # (S, N, 1)
    others = logp.scatter(-1, index, -math.inf).amax(-1, keepdim=True)
    return bool((logp.gather(-1, index) > others).all())


def flat_warning() -> str:
    """The warning for a validation NLL that no T changes; T = 1 is returned."""
    advice = _ADVICE.get()
    return f"{advice.name}: the validation NLL is the same at every T {advice.flat}"


def bound_warning(bound: float, bounds: tuple[float, float], logp: Tensor, y: Tensor) -> str:
    """The warning for a minimum at ``bound`` of the search ``bounds``. At the upper bound the
    predictions barely tell the labels apart, most often labels that are not theirs. At the
    lower bound they are far less confident than their accuracy: a split they get all right
    (which labels that are not theirs cannot cause), or probabilities softened before they came."""
    advice = _ADVICE.get()
    head = (
        f"{advice.name}: the validation NLL is lowest at T = {bound:g}, the bound of the "
        f"search [{bounds[0]:g}, {bounds[1]:g}]: "
    )
    if bound > 1:
        return head + (
            "the predictions barely tell the labels apart, so the flattest T fits best. "
            + advice.labels
        )
    head += "the predictions are far less confident than their accuracy"
    if all_right(logp, y):
        return head + (
            f"; all {y.shape[0]} validation inputs are predicted right (by every draw), so the "
            f"NLL falls toward 0 as T -> 0, with no minimum: T = {bound:g} makes new predictions "
            "near one-hot. " + advice.all_right
        )
    return head + ". " + advice.softened.format(bound=bound, factor=1 / bound)
