"""The private parts of :mod:`pyrouq.calibration`: the conformal rank and threshold, the
class ranking of APS / RAPS, the regression scores, and the checks of alphas, sets, intervals
and hand-made predictors."""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pyrouq._metric_inputs import WIDE_UNSIGNED, label_shape_fix
from pyrouq._numbers import (
    check_at_most,
    finite_float,
    is_array_like,
    is_integer,
    is_real,
    shown,
    tensor_hint,
    text_hint,
)
from pyrouq.predictive import Predictions
from pyrouq.regression import GaussianPredictions

_SCORES = ("lac", "aps", "raps", "abs", "cqr")


def check_not_shifted(val_targets: object, val_preds: object = None) -> None:
    """A TypeError for ``conformal(val_preds, 0.1)`` or ``conformal(val_preds, "aps")``: an
    alpha or a score given where the targets go (which would be told to wrap it with
    torch.as_tensor), or an alpha as a 0-d floating tensor (whose labels would be told to be
    converted with .long()). Not for regression predictions of one input, whose one target a
    0-d tensor may be (told the shapes targets take)."""
    value = val_targets
    if isinstance(value, Tensor) and value.dim() == 0 and value.is_floating_point():
        one = isinstance(val_preds, GaussianPredictions) and val_preds.loc.shape[1] == 1
        if one or value.device.type == "meta":  # (a meta tensor has no value to read)
            return
        value = _shortest(value)
    alpha = is_real(value) and not is_integer(value) and 0 < value < 1  # type: ignore[operator]
    if alpha or (isinstance(value, str) and value in _SCORES):
        name = "score" if isinstance(value, str) else "alpha"
        raise TypeError(
            f"conformal(): got {val_targets!r} as val_targets, the second argument; {name} "
            f"is not the second: pass conformal(val_preds, {name}={value!r}) (the targets "
            "default to those the predictions carry) or conformal(val_preds, val_targets, "
            "alpha, score)."
        )


def _shortest(value: Tensor) -> float:
    """A one-value floating tensor as the Python number alpha must be, the fewest digits that
    give its value back in its dtype (0.1 for float32, float16 and bfloat16 alike, not
    0.10000000149 or 0.100097656)."""
    number = float(value.item())
    for digits in range(1, 18):
        short = float(f"{number:.{digits}g}")
        back = torch.tensor(short, dtype=torch.float64).to(value.dtype).double().item()
        if back == number:
            return short
    return number


def _are_predictions(value: object) -> bool:
    """Whether ``value`` is predict()'s output (class or Gaussian predictions)."""
    return isinstance(value, (Predictions, GaussianPredictions))


def _check_alpha(alpha: object, n: int) -> float:
    # (compared as a float: 10**400 has none, Fraction(1, 10**400)'s is 0, a long double's
    # just below 1 is 1.0)
    if (a := finite_float(alpha)) is None or not 0 < a < 1:
        score = isinstance(alpha, str) and alpha in _SCORES  # conformal(preds, y, "aps")
        raise ValueError(
            f"Expected alpha in (0, 1), the allowed miscoverage (0.1: 90 % coverage), got "
            f"{shown(alpha)}{tensor_hint(alpha)}{'' if score else text_hint(alpha, 'alpha', 0, 1)}"
            + (f": a score, the fourth argument; pass score={alpha!r}." if score else ".")
        )
    if conformal_rank(n, a) > n:
        # (m + 1)(1 - a) <= m: m >= 1/a - 1, give or take; 1/a exactly (5e-324: no float)
        least = max(1, math.floor(1 / Fraction(a)) - 2)
        while conformal_rank(least, a) > least:
            least += 1
        digits = str(least)  # 1e-300: a count no float holds, shown as 9.99e+299
        count = digits if len(digits) < 16 else f"{digits[0]}.{digits[1:3]}e+{len(digits) - 1}"
        raise ValueError(
            f"alpha={a:g} needs at least {count} calibration points for a finite threshold, "
            f"got {n}. Hold out more data or raise alpha."
        )
    return a


def _quantile(scores: Tensor, alpha: float) -> Tensor:
    """The conformal threshold: the ``ceil((n + 1)(1 - alpha))``-th smallest score (per column
    for ``(n, D)`` scores)."""
    n = scores.shape[0]
    return scores.sort(dim=0).values[conformal_rank(n, alpha) - 1]


def conformal_rank(n: int, alpha: float) -> int:
    """``ceil((n + 1)(1 - alpha))``, of the float alpha's exact value, where a product within
    float rounding of an integer k is k: alpha = 0.7 (a little below 7/10 in binary) and n = 9
    give 3, not the 4 that (9 + 1) * (1 - 0.7) = 3.0000000000000004 would, and alpha = 1/3
    with n = 2 gives 2; a genuine fraction counts (alpha = 0.69999999999, n = 9: 4), and an
    alpha just below 1 gives the smallest score (rank 1)."""
    exact = (n + 1) * (1 - Fraction(float(alpha)))
    nearest = round(exact)
    if abs(exact - nearest) <= Fraction(8 * sys.float_info.epsilon) * (n + 1):
        return max(1, nearest)
    return max(1, math.ceil(exact))


def _ranked(pbar: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(order, cumulative_before, rank)``: classes by decreasing probability, the mass of
    the classes ranked above each class, and each class's rank (1 = the most probable)."""
    order = pbar.argsort(dim=1, descending=True, stable=True)
    sorted_p = pbar.gather(1, order)
    before_sorted = sorted_p.cumsum(1) - sorted_p
    before = torch.empty_like(pbar).scatter_(1, order, before_sorted)
    ranks = torch.empty_like(order).scatter_(
        1, order, torch.arange(1, pbar.shape[1] + 1, device=pbar.device).expand_as(order)
    )
    return order, before, ranks


def _adaptive_scores(pbar: Tensor, u: Tensor, lam: float | None, k_reg: int) -> Tensor:
    """The APS score of every class (``lam`` None), the mass ranked above it plus ``u * p̄_c``,
    or the RAPS score, plus ``lam * max(0, rank - k_reg)``; then the running maximum along the
    ranks: the rounded sums could fall by an ulp from one rank to the next (1 pair in 15,000 of
    random 10-class softmaxes), and a set then held a class but not one ranked above it."""
    order, before, ranks = _ranked(pbar)
    out = before + u * pbar
    if lam is not None:
        out = out + lam * (ranks - k_reg).clamp_min(0).double()
    return out.scatter(1, order, out.gather(1, order).cummax(1).values)


def _regression_scores(preds: GaussianPredictions, y: Tensor, score: str, alpha: float) -> Tensor:
    if score == "abs":
        wide = preds.double()  # moments in float64
        return abs_score((y - wide.mean).abs(), wide.stddev)
    lo, hi = preds.interval(1 - alpha)
    return torch.maximum(lo - y, y - hi)


def check_regression_threshold(
    preds: GaussianPredictions, y: Tensor, scores: Tensor, threshold: Tensor, score: str
) -> None:
    """Refuse thresholds ``(D,)`` that ``scores`` ``(n, D)`` made NaN or infinite: scores that
    overflowed float64 (the predictor would refuse them with a note on alpha, not the cause),
    and "abs" scores of an infinite stddev (0, whatever the residual: NaN intervals)."""
    if score == "abs" and not bool((stddev := preds.double().stddev).isfinite().all()):
        raise ValueError(
            f"conformal(): expected finite predictive stddevs for the 'abs' scores |y - mean| / "
            f"stddev, but {int((~stddev.isfinite()).sum())} of {stddev.numel()} are inf (the "
            "mixture's variance, computed in float64, overflows: means or scales past about "
            "1e154). Rescale the targets and fit again (standardise them, pyrouq.Standardizer), "
            "then predict and calibrate again."
        )
    if bool(threshold.isfinite().all()):
        return
    bad = (~threshold.isfinite()).nonzero()[:, 0].tolist()
    count = int((~scores[:, bad].isfinite()).sum())
    if score == "abs":
        wide = preds.double()
        spread = float(wide.stddev[:, bad].min())
        residual = float((y - wide.mean)[:, bad].abs().max())
        cause = (
            "the scores |y - mean| / stddev, computed in float64, overflow: a predictive "
            "stddev of 0 or one too small for its residual (the smallest stddev "
            f"{spread:.3g}, the largest residual {residual:.3g}; a scale below about 1e-154 "
            "squares to 0). Rescale the targets and fit again (standardise them, "
            "pyrouq.Standardizer), or give the model larger scales (e.g. a larger "
            "Gaussian(min_scale=...) floor), then predict and calibrate again"
        )
    else:
        cause = (
            "the scores max(lo - y, y - hi) of the mixture's interval overflow float64: "
            "rescale the targets (standardise them, pyrouq.Standardizer), then fit, predict "
            "and calibrate again"
        )
    raise ValueError(
        f"conformal(): expected finite {score!r} scores, but {count} of the {scores.shape[0]} "
        f"calibration scores of output(s) {bad} are NaN or inf, which made the threshold "
        f"{threshold[bad].tolist()}: {cause}."
    )


def abs_score(residual: Tensor, stddev: Tensor) -> Tensor:
    """The "abs" score ``residual / stddev``, 0 where both are 0: a target at the mean of a
    point mass (a stddev of 0) is inside its width-0 interval (the quotient is 0 / 0, NaN)."""
    return torch.where(residual == 0, torch.zeros_like(residual), residual / stddev)


def _last_inside(centre: Tensor, spread: Tensor, threshold: Tensor) -> Tensor:
    """The largest float64 ``y`` whose score ``(y - centre) / spread``, computed in float64, is
    at most ``threshold``: the upper bound of an interval that holds a target exactly when
    its score says so (``-_last_inside(-centre, ...)``: the lower bound, the score's rounding
    being symmetric). ``centre + threshold * spread`` rounded can be one ulp short, and
    leave out a target whose score is the threshold; the bound is found by bisection within
    8 ulps of its operands, which bound the rounding of the score and of the formula."""
    start = centre + threshold * spread
    finite = torch.isfinite(start)
    slack = 8 * torch.finfo(torch.float64).eps * (centre.abs() + (threshold * spread).abs())
    slack = torch.where(finite, slack, torch.zeros_like(slack))
    inside, outside = start - slack, start + slack  # score at most, and above, the threshold
    for _ in range(64):  # to adjacent floats, but for a bound near 0 found by cancellation
        mid = inside + (outside - inside) / 2
        ok = abs_score(mid - centre, spread) <= threshold  # (mid at a point mass: inside)
        inside, outside = torch.where(ok, mid, inside), torch.where(ok, outside, mid)
    return torch.where(finite, inside, start)


def _sets(sets: Any, intervals: bool = False) -> Tensor:
    """``sets`` as an ``(N, C)`` boolean tensor, or a clear error; ``intervals``: the caller
    (coverage()) takes intervals too."""
    if not isinstance(sets, Tensor) or sets.dtype != torch.bool:
        pair = isinstance(sets, (list, tuple)) and len(sets) == 2
        bounds = pair and all(isinstance(t, Tensor) and t.dtype != torch.bool for t in sets)
        stacked = isinstance(sets, list) and sets and all(isinstance(t, Tensor) for t in sets)
        rows = "torch.stack" if stacked else "torch.tensor"  # (of tensors, of lists)
        if isinstance(sets, list) and intervals:
            fix = (
                "; for intervals pass the tuple (lo, hi) that intervals() returns, for sets an "
                f"(N, C) boolean tensor ({rows}(sets) of a list of rows)."
            )
        elif isinstance(sets, list) and not bounds:  # rows ([lo, hi]: told below)
            fix = (
                f"; convert a list of boolean rows with {rows}(sets), or make sets with "
                "conformal(val_preds, val_targets).predict_sets(preds)."
            )
        elif isinstance(sets, Tensor) and bool(((sets == 0) | (sets == 1)).all()):
            fix = "; convert 0/1 membership indicators with sets.bool()."
        elif isinstance(sets, Tensor):  # probabilities, labels: .bool() would be wrong
            fix = (
                " holding values other than 0 and 1, so no 0/1 membership indicators (of "
                "probabilities, .bool() would put every class above 0 in the set); make sets "
                "with conformal(val_preds, val_targets).predict_sets(preds)."
            )
        elif _are_predictions(sets):
            fix = (
                " (predictions, not sets): make sets with conformal(val_preds, val_targets)"
                ".predict_sets(preds), intervals with .intervals(preds) (a tuple (lo, hi))."
            )
        elif pair:  # (lo, hi), or [lo, hi] (coverage() reads a tuple as intervals first)
            fix = (
                "; intervals (lo, hi) have neither a size in classes nor a class: measure them "
                "with coverage((lo, hi), targets) and their mean width, (hi - lo).mean()."
            )
        else:
            fix = (
                "; convert an array with torch.as_tensor(sets)."
                if hasattr(sets, "shape")
                else "; make them with conformal(val_preds, val_targets).predict_sets(preds)."
            )
        raise TypeError(
            "Expected prediction sets as an (N, C) boolean tensor (predict_sets() returns "
            f"them), got {sets.dtype if isinstance(sets, Tensor) else type(sets).__name__}" + fix
        )
    if sets.dim() != 2:
        raise ValueError(
            "Expected prediction sets as an (N, C) boolean tensor, one row per input "
            f"(predict_sets() returns them), got shape {tuple(sets.shape)}."
        )
    if sets.shape[0] == 0:
        raise ValueError(
            f"Expected at least one prediction set, got shape {tuple(sets.shape)}: a coverage "
            "or a mean size of no sets is undefined."
        )
    return sets


def _labels_of(sets: Tensor, targets: Any, where: str) -> Tensor:
    """``targets`` as the ``(N,)`` class labels of ``(N, C)`` sets, or a clear error."""
    num, classes = sets.shape
    check_tensor_targets(targets, where, "labels")
    if targets.shape != (num,):
        fix = label_shape_fix(targets.shape, num, classes, "labels", targets.dtype)
        raise ValueError(
            f"{where}: expected labels of shape ({num},), one per prediction set, got "
            f"{tuple(targets.shape)}; {fix}."
        )
    if targets.dtype in WIDE_UNSIGNED:  # torch's "min_all" not implemented for them
        raise ValueError(
            f"{where}: expected int64 class labels, got dtype {targets.dtype}, which torch can "
            "neither take the minimum of nor compare with int64 class indices; convert them "
            "with labels.long()."
        )
    y = targets.to(sets.device)
    wrong_dtype = y.is_floating_point() or y.is_complex() or y.dtype == torch.bool
    if wrong_dtype or (num and (y.min() < 0 or y.max() >= classes)):
        # complex labels have no min (torch's NotImplementedError came instead of this)
        shown = num and not y.is_complex()
        fix = (
            "integer class indices (labels.long() for whole-number floats)"
            if wrong_dtype
            else "the labels of the inputs the sets were made for, in the sets' classes"
        )
        raise ValueError(
            f"{where}: expected integer class labels in [0, {classes - 1}] for sets over "
            f"{classes} classes, got dtype {targets.dtype}"
            + (f" and values in [{y.min().item()}, {y.max().item()}]" if shown else "")
            + f"; pass {fix}."
        )
    return y.long()


def check_tensor_targets(targets: Any, where: str, what: str) -> None:
    """A TypeError unless ``targets`` is a tensor (a list or an array has a shape too, and
    was refused as of the wrong shape: "expected (3,), got (3,)")."""
    if not isinstance(targets, Tensor):
        if targets is None:  # preds.targets of a predict() given x without labels
            fix = ": pass them as a tensor (preds.targets is None when x had no labels)"
        elif _are_predictions(targets):  # coverage(sets, test_preds)
            fix = f": pass the predictions' .targets, the {what} they carry"
        else:
            fix = "; wrap them with torch.as_tensor(...)" if is_array_like(targets) else ""
        raise TypeError(
            f"{where}: expected the {what} as a torch.Tensor, got {type(targets).__name__}{fix}."
        )


def _intervals(intervals: tuple[Any, ...]) -> tuple[Tensor, Tensor]:
    """``(lo, hi)`` as two tensors of one shape without NaN, or a clear error."""
    if len(intervals) != 2 or not all(isinstance(t, Tensor) for t in intervals):
        raise TypeError(
            "coverage(): expected intervals as a tuple (lo, hi) of two tensors (intervals() "
            f"returns it), got a tuple of {len(intervals)}: "
            f"{', '.join(type(t).__name__ for t in intervals)}."
        )
    lo, hi = intervals
    if lo.shape != hi.shape:
        raise ValueError(
            f"coverage(): expected lo and hi of one shape, got {tuple(lo.shape)} and "
            f"{tuple(hi.shape)}: each target needs its own lower and upper bound."
        )
    for name, bound in (("lo", lo), ("hi", hi)):
        if bound.isnan().any():
            raise ValueError(
                f"coverage(): {name} holds {int(bound.isnan().sum())} NaN values; an interval "
                "needs both bounds."
            )
    return lo, hi.to(lo.device)


def _interval_targets(targets: Any, lo: Tensor) -> Tensor:
    """``targets`` as float64 values of the intervals' shape (``(N,)`` for one output
    allowed) on their device, or a clear error."""
    check_tensor_targets(targets, "coverage()", "targets")
    shape = tuple(lo.shape)
    column = len(shape) == 2 and shape[1] == 1  # (N,) targets of one output allowed
    ok = tuple(targets.shape) == shape or (column and tuple(targets.shape) == shape[:1])
    if not ok:
        got = tuple(targets.shape)
        one = len(shape) == 1 and got == (*shape, 1)  # one output, given as a column
        turned = len(shape) == 2 and got == shape[::-1]  # (D, N) for (N, D) intervals
        fix = (
            "Pass targets[:, 0]: the intervals are of one output, one value per input"
            if one
            else f"Pass targets.T: they hold an input per column, the intervals one per row "
            f"({shape[0]} inputs, {shape[1]} outputs)"
            if turned
            else "Pass the targets of the inputs the intervals were made for, one per "
            "interval (and per output)"
        )
        raise ValueError(
            f"coverage(): expected targets of shape {shape}, as the intervals"
            + (f" (or ({shape[0]},))" if column else "")
            + f", got {got}. {fix}."
        )
    if targets.is_complex():  # .double() dropped the imaginary part, with torch's warning
        raise ValueError(
            f"coverage(): expected real targets, got dtype {targets.dtype}; pass their real "
            "values (targets.real, if the imaginary parts are 0)."
        )
    y = targets.to(lo.device).double().reshape(shape)
    if y.isnan().any():
        raise ValueError(
            f"coverage(): the targets hold {int(y.isnan().sum())} NaN values; drop those "
            "rows (a NaN is inside no interval, outside none)."
        )
    return y


def check_alpha_field(alpha: object, where: str) -> float:
    """A predictor's ``alpha`` in (0, 1) as a float, or a ValueError naming ``where``."""
    if (a := finite_float(alpha)) is None or not 0 < a < 1:  # (as in _check_alpha)
        raise ValueError(
            f"{where}: expected alpha in (0, 1), the allowed miscoverage, got {shown(alpha)}"
            f"{tensor_hint(alpha)}{text_hint(alpha, 'alpha', 0, 1)}. conformal() builds the "
            "predictor from held-out predictions."
        )
    return a


def check_class_fields(threshold: object, lam: object, k_reg: object, classes: object) -> None:
    """The numbers of a :class:`ConformalClassifier` made by hand, or a clear error."""
    where = "ConformalClassifier"
    if not is_real(threshold) or math.isnan(threshold):
        raise ValueError(
            f"{where}: expected threshold to be a real number (the largest score a set "
            f"admits; inf admits every class), got {threshold!r}{tensor_hint(threshold)}"
            f"{text_hint(threshold, 'threshold', 0, low_allowed=True, inf_allowed=True)}."
        )
    if threshold < 0:  # every score is >= 0: 1 - p, a mass, plus RAPS's penalties (lam >= 0)
        raise ValueError(
            f"{where}: expected threshold >= 0, got {threshold!r}: every score is at least 0 "
            "('lac' 1 - p, 'aps' and 'raps' a probability mass, plus penalties), so no class "
            "is ever within a negative threshold and every set would be empty. conformal() "
            "makes it from held-out predictions; pass a threshold >= 0 (inf admits every class)."
        )
    if (penalty := finite_float(lam)) is None or penalty < 0:  # (None: also 10**400)
        raise ValueError(
            f"{where}: expected lam >= 0 (finite), the RAPS penalty per rank, got {shown(lam)}"
            f"{tensor_hint(lam)}{text_hint(lam, 'lam', 0, low_allowed=True)}."
        )
    if not is_integer(k_reg) or k_reg < 0:
        raise ValueError(
            f"{where}: expected k_reg, the ranks free of penalty, an integer >= 0, got "
            f"{k_reg!r}{tensor_hint(k_reg, integer=True)}."
        )
    check_at_most(f"{where}'s k_reg", int(k_reg), "Pass e.g. k_reg=1.")
    if classes is not None and (not is_integer(classes) or classes < 1):
        raise ValueError(
            f"{where}: expected num_classes to be None or an integer >= 1, got {classes!r}."
        )
    if classes is not None:
        check_at_most(f"{where}'s num_classes", int(classes), "Pass the number of classes C.")


def check_count(count: object, where: str) -> int | None:
    """A predictor's ``num_calibration``: None or an int >= 1, or a ValueError."""
    if count is not None and (not is_integer(count) or count < 1):
        raise ValueError(
            f"{where}: expected num_calibration, the number of calibration inputs, to be None "
            f"or an integer >= 1, got {count!r}{tensor_hint(count, integer=True)}."
        )
    if count is not None:
        check_at_most(f"{where}'s num_calibration", int(count), "Pass n, or None.")
    return None if count is None else int(count)


def check_thresholds(threshold: object, score: str) -> Tensor:
    """A :class:`ConformalRegressor`'s thresholds as a float64 ``(D,)`` tensor, or an error:
    finite (:func:`conformal` refuses an alpha whose threshold would be infinite), and for
    ``"abs"`` at least 0 (a number of standard deviations: a negative one inverts the
    intervals, ``lo > hi``)."""
    values = threshold
    if isinstance(threshold, np.ndarray) and threshold.dtype.kind in "fiu":  # (as a list)
        values = torch.tensor(threshold.astype(np.float64), device="cpu")  # (a copy, native)
    if isinstance(threshold, (list, tuple)):
        values = torch.as_tensor(threshold, dtype=torch.float64, device="cpu")
    if not isinstance(values, Tensor) or not values.is_floating_point() or values.dim() != 1:
        got = (
            f"shape {tuple(values.shape)}, dtype {values.dtype}"
            if isinstance(values, Tensor)
            else type(threshold).__name__
        )
        raise ValueError(
            "ConformalRegressor: expected threshold as a floating (D,) tensor, one per output "
            f"(conformal() makes it), got {got}; for one output pass torch.tensor([t])."
        )
    if values.numel() == 0 or bool(values.isnan().any()):
        raise ValueError(
            "ConformalRegressor: expected at least one threshold and no NaN, got "
            f"{values.tolist()}."
        )
    if not bool(values.isfinite().all()):
        raise ValueError(
            f"ConformalRegressor: expected finite thresholds, got {values.tolist()}: an "
            "infinite one gives intervals without bounds (conformal() refuses an alpha that "
            "would need one). conformal() makes them from held-out predictions."
        )
    if score == "abs" and bool((values < 0).any()):
        raise ValueError(
            "ConformalRegressor: expected thresholds >= 0 for score 'abs' (numbers of standard "
            f"deviations), got {values.tolist()}: a negative one gives intervals with lo > hi. "
            "conformal() makes them from held-out predictions (only 'cqr' thresholds may be "
            "negative)."
        )
    # float64 as documented (a float32 tensor stayed float32), on the CPU: a predictor
    # calibrated on a GPU then pickles anywhere; intervals() moves it to the predictions
    return values.to(device="cpu", dtype=torch.float64)
