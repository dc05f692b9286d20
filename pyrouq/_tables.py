"""Metrics as text tables: :func:`format_table` (re-exported by :mod:`pyrouq.metrics`)."""

from __future__ import annotations

from collections.abc import Mapping

from pyrouq._numbers import is_one_number, one_number

__all__ = ["format_table"]

# key: (group, display name, shown as a percentage), in display order
_DISPLAY: dict[str, tuple[str, str, bool]] = {
    "acc": ("Classification", "Acc", True),
    "nll": ("Classification", "NLL", False),
    "brier": ("Classification", "Brier", False),
    "ece": ("Calibration", "ECE", True),
    "aece": ("Calibration", "aECE", True),
    "aurc": ("Selective classification", "AURC", True),
    "augrc": ("Selective classification", "AUGRC", True),
    "cov_at_5_risk": ("Selective classification", "Cov@5Risk", True),
    "risk_at_80_cov": ("Selective classification", "Risk@80Cov", True),
    "disagreement": ("Uncertainty", "Disagreement", False),
    "expected_entropy": ("Uncertainty", "Expected entropy", False),
    "mutual_information": ("Uncertainty", "Mutual information", False),
    "ood_auroc": ("OOD", "AUROC", True),
    "ood_aupr": ("OOD", "AUPR", True),
    "ood_fpr95": ("OOD", "FPR95", True),
}

#: The rows of a regression table (:meth:`pyrouq.GaussianPredictions.evaluate`'s keys).
_REGRESSION_DISPLAY: dict[str, tuple[str, str, bool]] = {
    "rmse": ("Regression", "RMSE", False),
    "mae": ("Regression", "MAE", False),
    "nll": ("Regression", "NLL", False),
    "crps": ("Regression", "CRPS", False),
    "coverage_50": ("Intervals", "Coverage 50%", True),
    "coverage_90": ("Intervals", "Coverage 90%", True),
    "coverage_95": ("Intervals", "Coverage 95%", True),
    "width_50": ("Intervals", "Width 50%", False),
    "width_90": ("Intervals", "Width 90%", False),
    "width_95": ("Intervals", "Width 95%", False),
    "calibration_error": ("Calibration", "Quantile calibration error", False),
}


def format_table(metrics: dict[str, float]) -> str:
    """Format metrics as grouped text tables, one per group, like torch-uncertainty prints.

    Groups, in order: Classification, Calibration, Selective classification, Uncertainty, OOD
    and Other (unknown keys, under their own names; a value there that is not a number, such
    as the ``"ood_score"`` of a run's ``metrics.json``, is shown as its text); groups without a
    metric are left out. A known metric must be one number (TypeError otherwise).
    Accuracy, calibration, selective and OOD metrics are shown as percentages (``98.63%``), the
    others with 5 decimals; a value that rounds to zero is shown unsigned (``-0.0`` as
    ``0.00%``). Regression metrics (a dict with ``"crps"``, as
    :meth:`pyrouq.GaussianPredictions.evaluate` returns) are grouped as Regression, Intervals
    (coverages as percentages, widths in the targets' units) and Calibration.

    Examples
    --------
    >>> print(format_table({"acc": 0.98631, "nll": 0.0451}))
    ┌────────────────┬─────────┐
    │ Classification │   Value │
    ├────────────────┼─────────┤
    │ Acc            │  98.63% │
    │ NLL            │ 0.04510 │
    └────────────────┴─────────┘
    """
    if not isinstance(metrics, Mapping):
        raise TypeError(
            f"Expected metrics to be a dict of name -> value, got {type(metrics).__name__}; "
            "pass what evaluate() or Predictions.evaluate() returns."
        )
    groups: dict[str, list[tuple[str, str]]] = {}
    display = _REGRESSION_DISPLAY if "crps" in metrics else _DISPLAY
    for key, (group, name, percent) in display.items():
        if key in metrics:
            _check_metric(key, metrics[key])
            groups.setdefault(group, []).append((name, _format_value(metrics[key], percent)))
    for key, value in metrics.items():
        if key not in display:
            groups.setdefault("Other", []).append((str(key), _format_value(value, False)))
    if not groups:
        return ""
    left = max(len(s) for title, rows in groups.items() for s in [title, *(r[0] for r in rows)])
    right = max(len(s) for rows in groups.values() for s in ["Value", *(r[1] for r in rows)])
    bar = ("─" * (left + 2), "─" * (right + 2))
    tables = []
    for title, rows in groups.items():
        lines = [f"┌{bar[0]}┬{bar[1]}┐", f"│ {title:<{left}} │ {'Value':>{right}} │"]
        lines.append(f"├{bar[0]}┼{bar[1]}┤")
        lines += [f"│ {name:<{left}} │ {value:>{right}} │" for name, value in rows]
        lines.append(f"└{bar[0]}┴{bar[1]}┘")
        tables.append("\n".join(lines))
    return "\n".join(tables)


def _check_metric(key: str, value: object) -> None:
    """Refuse a value of a metric the table knows that is not one number (``"x"``, None, a
    tensor of several values): it was printed as its text, under the metric's name."""
    if not is_one_number(value):
        raise TypeError(
            f"format_table(): expected metric {key!r} to be a number (a float, or a tensor or "
            f"array of one value), got {value!r:.60} ({type(value).__name__}). Pass the values "
            "that evaluate() or Predictions.evaluate() return."
        )


def _format_value(value: object, percent: bool) -> str:
    if is_one_number(value):  # Python's and numpy's numbers, one-number tensors and arrays
        return unsigned_zero(one_number(value), ".2%" if percent else ".5f")
    return str(value)


def unsigned_zero(number: float, spec: str) -> str:
    """``format(number, spec)``, with no sign on a zero: -0.0, or a tiny negative number that
    rounds to zero (a rounding error below 0), prints as ``0.00%``, not ``-0.00%``."""
    text = format(number, spec)
    return text[1:] if text.startswith("-") and not text.strip("-0.%") else text
