"""The score names of :func:`pyrouq.conformal` and its predictors: checking a name, and what to
do about one it does not know for a task (classification or regression)."""

from __future__ import annotations

from pyrouq._words import slip_hint


def score_fix(score: object, task: str) -> str:
    """What to do about a score conformal() does not know for ``task``: the other task's score
    (predictions of the other kind?), the one it slipped from (its case, spaces: the message's
    :func:`~pyrouq._words.slip_hint` asks), or leaving it out."""
    scores = {"classification": ("lac", "aps", "raps"), "regression": ("abs", "cqr")}
    other = "regression" if task == "classification" else "classification"
    text = score.strip().lower() if isinstance(score, str) else None
    if text in scores[other]:
        kind = "GaussianPredictions" if other == "regression" else "Predictions"
        preds = "Predictions" if other == "regression" else "GaussianPredictions"
        return (
            f": {score!r} scores {other} ({kind}), and val_preds are a {task} model's "
            f"{preds}. Pass one of these, or leave score out (its default, "
            f"{scores[task][0]!r})"
        )
    if slip_hint(score, scores[task]):  # ("RAPS", "aps "): the name it slipped from
        return f". Pass score={str(score).strip().lower()!r}"
    return f". Pass one of these, or leave score out (its default, {scores[task][0]!r})"


def check_score(score: object, allowed: tuple[str, ...], where: str) -> None:
    if score not in allowed:
        hint = slip_hint(score, allowed)  # (did you mean 'lac'? the names are lower case)
        raise ValueError(
            f"{where}: unknown score {score!r}{hint}, expected one of "
            f"{', '.join(map(repr, allowed))}{'' if hint else ' (lower case)'}. conformal() "
            "builds the predictor and picks the score."
        )
