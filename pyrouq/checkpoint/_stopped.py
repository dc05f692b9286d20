"""Where fit()'s training state says an interrupted run stopped: read by ``pyrouq evaluate``
(which tells of an interrupted run's weights, and records it in metrics.json) and by
``fit(checkpoint=...)`` (which warns before writing over such a run), alike."""

from __future__ import annotations

from typing import Any

__all__ = ["stopped_run"]


def stopped_run(training: Any) -> dict[str, int] | None:
    """Where the training of an interrupted run stopped (the resume state that fit() saves
    each epoch and on Ctrl-C, which a finished run's checkpoint no longer holds): ``{"epochs",
    "epochs_done", "steps"}``; None for a run that trained all its epochs, or a state that is
    not fit()'s (none, or one without those entries as numbers)."""
    if not isinstance(training, dict):
        return None
    try:
        epochs, done, steps = (int(training[key]) for key in ("epochs", "epochs_done", "steps"))
    except (KeyError, TypeError, ValueError):
        return None
    if done >= epochs:
        return None
    return {"epochs": epochs, "epochs_done": done, "steps": steps}
