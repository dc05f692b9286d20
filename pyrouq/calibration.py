"""Post-hoc calibration and conformal prediction on any predictions.

Both are fitted on a held-out split (a *validation* or *calibration* split, never the training
data) and then applied to new predictions; neither touches the model:

* :func:`temperature_scale`: one temperature T for every draw's log-probabilities, fitted by
  the NLL of the predictive mixture;
* :func:`conformal`: split conformal prediction. For classifiers, prediction sets with the
  LAC, APS or RAPS score; for Gaussian regression, intervals from normalised residuals or, as
  in CQR, from the mixture's quantiles. On exchangeable data the sets (intervals) contain the
  true label (target) with probability at least ``1 - alpha``, marginally.

Shape convention: S draws or members, N inputs, C classes (D outputs for regression).

Saving a fitted recalibrator: each is a frozen dataclass of numbers, text and (a regressor's
thresholds) a tensor, so ``torch.save(dataclasses.asdict(fitted), path)`` writes its fields and
``type(fitted)(**torch.load(path, weights_only=True))`` rebuilds an equal one, with equal
outputs, from no pickled code. ``torch.save(fitted, path)`` pickles the object instead:
``torch.load(weights_only=True)`` refuses that file, and ``weights_only=False`` runs the code it
names, so load such a file only if you trust where it came from.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from pyrouq._conformal_scores import (
    _adaptive_scores,
    _check_alpha,
    _last_inside,
    _quantile,
    _regression_scores,
    check_alpha_field,
    check_class_fields,
    check_count,
    check_not_shifted,
    check_regression_threshold,
    check_thresholds,
)
from pyrouq._metric_inputs import _float64
from pyrouq._numbers import check_at_most, finite_float, is_integer, shown, tensor_hint, text_hint
from pyrouq._score_names import check_score as _check_score
from pyrouq._score_names import score_fix as _score_fix
from pyrouq._set_coverage import class_conditional_coverage, coverage, mean_set_size
from pyrouq._temperature_warnings import bound_warning, flat_warning
from pyrouq._tempered_nll import TemperedNLL
from pyrouq._tempered_nll import check_not_overflowing as _check_not_overflowing
from pyrouq._tempered_nll import log_probs as _log_probs
from pyrouq._util import MAX_SEED, check_seed
from pyrouq._words import slip_hint
from pyrouq.predictive import Predictions
from pyrouq.regression import GaussianPredictions

__all__ = [
    "ConformalClassifier",
    "ConformalRegressor",
    "TemperatureScaler",
    "class_conditional_coverage",
    "conformal",
    "coverage",
    "mean_set_size",
    "temperature_scale",
]

ClassScore = Literal["lac", "aps", "raps"]
RegressionScore = Literal["abs", "cqr"]

#: The range searched for the temperature.
TEMPERATURE_BOUNDS = (0.05, 20.0)


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------


_FROM_ARRAY = "pyrouq.Predictions.from_probs(torch.as_tensor(...)) ((S, N, C) probabilities)"


def _class_preds(preds: Any, name: str) -> Predictions:
    if not isinstance(preds, Predictions):
        if isinstance(preds, GaussianPredictions):
            fix = (
                "; a regression model's predictions get calibrated intervals from "
                "conformal(val_preds, val_targets), a ConformalRegressor"
            )
        elif torch.is_tensor(preds):
            fix = (
                f"; wrap probabilities as pyrouq.Predictions.from_probs({name}) ((S, N, C); "
                f"{name}[None] for one (N, C) draw)"
            )
        else:  # a numpy array: its probabilities as a tensor
            fix = f"; wrap probabilities as {_FROM_ARRAY}" if hasattr(preds, "__array__") else ""
        raise TypeError(
            f"Expected {name} to be Predictions (class probabilities, what predict() returns for "
            f"a classifier), got {type(preds).__name__}{fix}."
        )
    return preds


def _labels(preds: Predictions, targets: Any) -> Tensor:
    """``val_targets`` (or the labels ``val_preds`` carry), checked against ``val_preds``."""
    from pyrouq._metric_inputs import _check_targets, carried_targets

    fix = (
        "pass the (N,) labels of the held-out split, or predictions made from a loader of "
        "(x, y) batches, which carry them"
    )
    y = carried_targets(targets, preds, "val_targets", fix)
    return _check_targets(y, preds.mean_probs, "val_targets", "val_preds")


# --------------------------------------------------------------------------------------------
# Temperature scaling
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemperatureScaler:
    """Divides every draw's log-probabilities by :attr:`temperature` (then renormalises).

    Call it on predictions of the same model: ``scaler(preds) -> Predictions``.

    Each draw (or member) is tempered, not the mean: ``p_s ∝ p_s^(1/T)``. For one draw (a
    plain network) this is the temperature scaling of Guo et al. (2017); for S draws the
    prediction stays a mixture of S tempered distributions, so the uncertainty decomposition
    keeps its meaning (total = aleatoric + epistemic, the epistemic part the disagreement of
    the tempered members), and the same T applies whatever S. For one draw every input keeps
    the order of its classes, and so its argmax and the accuracy, up to rounding: two top
    classes a few units in the last place apart (in float32, logits within about 1e-6) can
    round to one value once tempered (T > 1 flattens them), and argmax then takes the lower
    index. For S draws the mixture's argmax can change for a few inputs (a confident draw
    weighs more or less against the others once tempered), so the accuracy may move a little.
    The epistemic part's size moves with T: toward 0 as T grows (every member flattens toward
    uniform), toward the members' disagreement on their top classes as T -> 0 (every member
    one-hot; 1e-300 is that already, and a T below 1.54e-307, by which the log-probabilities
    divided overflow, is refused). Tempering the mean's log-probabilities instead would return
    one distribution, with the epistemic part gone.

    Saved as its fields (the module docstring): ``torch.save(dataclasses.asdict(scaler), path)``,
    then ``TemperatureScaler(**torch.load(path, weights_only=True))``.

    Examples
    --------
    Made by :func:`temperature_scale` on a held-out split; by hand here to show what T does:

    >>> import torch
    >>> preds = Predictions(torch.tensor([[[0.8, 0.2]]]))  # odds 4:1
    >>> TemperatureScaler(2.0)(preds).probs  # odds 4 ** (1 / 2) = 2:1
    tensor([[[0.6667, 0.3333]]])
    """

    temperature: float

    def __post_init__(self) -> None:
        t = self.temperature
        if (number := finite_float(t)) is None or number <= 0:  # (None: also 10**400)
            raise ValueError(
                f"Expected a temperature > 0 (finite), got {shown(t)}{tensor_hint(t)}"
                f"{text_hint(t, 'temperature', 0)}: T > 1 softens the probabilities, T < 1 "
                "sharpens them. temperature_scale() fits one."
            )
        _check_not_overflowing(number)
        object.__setattr__(self, "temperature", number)

    def __call__(self, preds: Predictions) -> Predictions:
        preds = _class_preds(preds, "preds")
        # clamped at 1e-12 as in the fit: T is the NLL minimiser of this transform. Tempering
        # smaller probabilities exactly instead (1e-30 at T = 3: 1e-10, not 1e-4) applied
        # another transform than the one fitted (a validation NLL of 1.4 where the fit's T gave
        # 0.57), and float32's and float64's underflowed 0s other results (0.012 and 0 at T = 20)
        logp = _log_probs(preds.probs)  # (a copy of its own: divided in place)
        probs = torch.softmax(logp.div_(self.temperature), dim=-1)
        probs = probs.to(device=preds.probs.device, dtype=preds.probs.dtype)
        return Predictions(probs, preds.targets)

    def __repr__(self) -> str:
        return f"TemperatureScaler(temperature={self.temperature:.4f})"


def temperature_scale(
    val_preds: Predictions, val_targets: Tensor | None = None
) -> TemperatureScaler:
    """Fit one temperature on a validation split by the NLL of the tempered mixture.

    The NLL is minimised over ``log T`` in ``[log 0.05, log 20]``: a grid of 81 points, then
    golden-section search around the best one (to 1e-6 in ``log T``). A minimum at either bound
    (or within 0.1 % of it) warns and returns the bound: it means labels the predictions barely
    tell apart (T = 20), most often labels that are not the predictions', or predictions far
    less confident than their accuracy (T = 0.05), most often a split every draw gets all right
    (its NLL falls toward 0 as T -> 0, with no minimum; T = 0.05 then makes new predictions
    near one-hot).
    Probabilities below 1e-12 count as 1e-12, as in :func:`~pyrouq.metrics.nll`, in the fit
    and in the scaler it returns (which applies the transform fitted): a probability that
    underflowed to 0 says only "very small", and one confidently wrong input would otherwise
    outweigh the rest of the split. An NLL that no T changes (uniform draws, members that
    disagree symmetrically, one class) warns and gives T = 1.

    Parameters
    ----------
    val_preds : Predictions
        ``(S, N, C)`` predictions on held-out data (any model: Bayesian, BatchEnsemble, plain).
    val_targets : Tensor, optional
        ``(N,)`` labels; default: those the predictions carry.

    Returns
    -------
    TemperatureScaler
        For S draws it may move the accuracy a little (:class:`TemperatureScaler`).

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[4.0, 0.0], [4.0, 0.0], [4.0, 0.0], [4.0, 0.0]])
    >>> preds = Predictions(torch.softmax(logits, -1)[None], torch.tensor([0, 0, 0, 1]))
    >>> round(temperature_scale(preds).temperature, 2)  # 4/T = log 3: p = 0.75 as observed
    3.64
    """
    preds = _class_preds(val_preds, "val_preds")
    logp = _log_probs(preds.probs.detach())  # a fit: no graph (torch warned at float())
    y = _labels(preds, val_targets).to(logp.device)
    nll = TemperedNLL(logp, y)  # (one buffer for every T of the search)
    lo, hi = (math.log(b) for b in TEMPERATURE_BOUNDS)
    grid = [lo + (hi - lo) * i / 80 for i in range(81)]
    values = [nll(math.exp(t)) for t in grid]
    if max(values) - min(values) <= 1e-12 * max(1.0, abs(min(values))):
        warnings.warn(flat_warning(), stacklevel=2)
        return TemperatureScaler(1.0)
    best = min(range(len(grid)), key=values.__getitem__)
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = nll(math.exp(c)), nll(math.exp(d))
    while b - a > 1e-6:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = nll(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = nll(math.exp(d))
    log_t = (a + b) / 2
    temperature = math.exp(log_t)
    nll_t = nll(temperature)  # a bound as low (an NLL flat at 0 near
    if min(values[0], values[-1]) <= nll_t:  # T = 0.05: every input right) is the minimum
        log_t = lo if values[0] <= values[-1] else hi
    if min(log_t - lo, hi - log_t) < 1e-3:
        bound = TEMPERATURE_BOUNDS[0] if log_t - lo < hi - log_t else TEMPERATURE_BOUNDS[1]
        # (at 0.05 it told to check the labels, which give T = 20, not an all-right split)
        warnings.warn(bound_warning(bound, TEMPERATURE_BOUNDS, logp, y), stacklevel=2)
        # the bound itself, as the warning names it (exp(log 20) is 19.999999999999996), also
        # for a minimum within 0.1 % of it (T = 19.995 was told "lowest at T = 20")
        temperature = bound
    return TemperatureScaler(temperature)


# --------------------------------------------------------------------------------------------
# Conformal classification
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConformalClassifier:
    """Split-conformal prediction sets for a classifier (made by :func:`conformal`).

    The score of class c for an input (``p̄``: the mean probabilities) is

    * ``"lac"``: ``1 - p̄_c`` (least ambiguous set-valued classifier; Sadinle et al., 2019);
    * ``"aps"``: the mass of the classes ranked above c plus ``u * p̄_c``, u ~ U(0, 1) drawn per
      input (adaptive prediction sets, randomised; Romano et al., 2020);
    * ``"raps"``: the APS score plus ``lam * max(0, rank(c) - k_reg)`` (regularised APS;
      Angelopoulos et al., 2021).

    A set holds every class whose score is at most :attr:`threshold`. Empty sets can occur (no
    class is plausible enough at this alpha; LAC when the top probability is below ``1 -
    threshold``, APS/RAPS through the randomisation) and count as misses; every non-empty set
    holds the predicted class, since the scores grow with the rank.

    Attributes
    ----------
    score, alpha, threshold, lam, k_reg, seed
    num_classes : int or None
        C of the calibration predictions; predictions with another C are refused.
    num_calibration : int or None
        n, the calibration inputs (None when made by hand): the threshold is the
        ``ceil((n + 1)(1 - alpha))``-th smallest of their n scores, and the coverage on
        exchangeable data is below ``1 - alpha + 1 / (n + 1)`` when the scores have no ties.

    Saved as its fields (the module docstring): ``torch.save(dataclasses.asdict(sets), path)``,
    then ``ConformalClassifier(**torch.load(path, weights_only=True))``, seed included, so APS
    and RAPS draw the same sets.

    Examples
    --------
    >>> import torch
    >>> probs = torch.tensor([[0.7, 0.2, 0.1]] * 9 + [[0.1, 0.2, 0.7]])[None]  # S = 1, N = 10
    >>> lac = conformal(Predictions(probs, torch.zeros(10, dtype=torch.long)), alpha=0.2)
    >>> lac.score, lac.num_calibration, round(lac.threshold, 4)  # nine scores 0.3, one 0.9
    ('lac', 10, 0.3)
    >>> lac.predict_sets(Predictions(torch.tensor([[[0.75, 0.2, 0.05], [0.5, 0.3, 0.2]]])))
    tensor([[ True, False, False],
            [False, False, False]])
    """

    score: ClassScore
    alpha: float
    threshold: float
    lam: float
    k_reg: int
    seed: int
    num_classes: int | None = None
    num_calibration: int | None = None

    def __post_init__(self) -> None:
        where = "ConformalClassifier"
        _check_score(self.score, get_args(ClassScore), where)
        check_class_fields(self.threshold, self.lam, self.k_reg, self.num_classes)
        fields = {
            "alpha": check_alpha_field(self.alpha, where),
            "threshold": float(self.threshold),
            "lam": float(self.lam),
            "k_reg": int(self.k_reg),
            "seed": check_seed(self.seed, where),
            "num_classes": None if self.num_classes is None else int(self.num_classes),
            "num_calibration": check_count(self.num_calibration, where),
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def scores(self, preds: Predictions, seed: int | None = None) -> Tensor:
        """The ``(N, C)`` score of every class for every input (``u`` drawn from ``seed``),
        from ``p̄`` averaged in float64, as :attr:`Predictions.predicted` averages it: a float32
        mean can break a near-tie the other way and leave the predicted class out of a set."""
        pbar = _float64(_class_preds(preds, "preds").probs).mean(0)
        if self.num_classes is not None and pbar.shape[-1] != self.num_classes:
            raise ValueError(
                f"The predictions have {pbar.shape[-1]} classes, the calibration predictions "
                f"had {self.num_classes}: a conformal predictor applies to the model (and "
                "classes) it was calibrated on. Calibrate it on this model's predictions."
            )
        if seed is not None:  # (a bad one refused whatever the score, as predict_sets does)
            seed = check_seed(seed, "ConformalClassifier.scores()")
        if self.score == "lac":
            return 1.0 - pbar
        generator = torch.Generator().manual_seed(self.seed if seed is None else seed)
        u = torch.rand(pbar.shape[0], 1, generator=generator, dtype=torch.float64, device="cpu")
        u = u.to(pbar.device)  # (drawn on the CPU whatever the default device, as its generator)
        return _adaptive_scores(pbar, u, self.lam if self.score == "raps" else None, self.k_reg)

    def predict_sets(self, preds: Predictions, *, seed: int | None = None) -> Tensor:
        """``(N, C)`` booleans: class c is in the set of input n. APS and RAPS draw their
        ``u`` from ``seed`` (default: the predictor's seed plus one, modulo 2**32, not the
        calibration draws), one per input in the order given: an input's set depends on its
        row, so sets made in several calls differ from one call's (coverage alike)."""
        if seed is not None:
            seed = check_seed(seed, "ConformalClassifier.predict_sets()")
        seed = (self.seed + 1) % (MAX_SEED + 1) if seed is None else seed
        return (self.scores(preds, seed) <= self.threshold).to(preds.probs.device)

    def __repr__(self) -> str:
        extra = f", lam={self.lam:g}, k_reg={self.k_reg}" if self.score == "raps" else ""
        extra += f", seed={self.seed}" if self.score != "lac" else ""  # the scores' draws
        if self.num_calibration is not None:
            extra += f", num_calibration={self.num_calibration}"
        return (
            f"ConformalClassifier(score={self.score!r}, alpha={self.alpha:g}, "
            f"threshold={self.threshold:.6f}{extra})"
        )


@dataclass(frozen=True)
class ConformalRegressor:
    """Split-conformal intervals for Gaussian predictions (made by :func:`conformal`).

    * ``"abs"``: normalised residuals ``|y - mean| / sd`` of the predictive mixture (0 for a
      target at the mean of point masses, sd 0); intervals ``mean +- threshold * sd``;
    * ``"cqr"``: conformalised quantiles (Romano et al., 2019) of the mixture, ``lo`` and
      ``hi`` its ``alpha / 2`` and ``1 - alpha / 2`` quantiles; score ``max(lo - y, y - hi)``;
      intervals ``[lo - threshold, hi + threshold]``.

    A target is inside its interval exactly when its score is at most the threshold: the
    bounds are the last float64 values whose computed score is (the formulas above, rounded,
    could leave out by one ulp a target whose score is the threshold, and with it every tied
    target: count targets).

    One threshold per output (:attr:`threshold`, ``(D,)``, float64 on the CPU): in the
    targets' units for ``"cqr"``, unitless for ``"abs"``, so calibrate and apply on the same
    scale (both standardised, or both after ``Standardizer.inverse``). A CQR threshold is
    negative where the mixture's intervals are too wide; an input whose interval is narrower
    than ``-2 * threshold`` then gets ``lo > hi``, an empty interval that covers nothing (as in
    Romano et al.): mind it when averaging widths.

    :attr:`num_calibration` is n, the calibration inputs (None when made by hand): each
    threshold is the ``ceil((n + 1)(1 - alpha))``-th smallest of their n scores.

    Two predictors are equal when their score, alpha and thresholds are.

    Saved as its fields (the module docstring): ``torch.save(dataclasses.asdict(reg), path)``,
    then ``ConformalRegressor(**torch.load(path, weights_only=True))``.

    Examples
    --------
    >>> import torch
    >>> y = torch.arange(1, 10) / 10
    >>> cal = GaussianPredictions(torch.zeros(1, 9, 1), torch.ones(1, 9, 1), y)
    >>> reg = conformal(cal, score="abs", alpha=0.2)  # scores |y - 0| / 1 = 0.1, ..., 0.9
    >>> reg.threshold  # the ceil(10 * 0.8) = 8th smallest
    tensor([0.8000], dtype=torch.float64)
    >>> preds = GaussianPredictions(torch.tensor([[[0.0]], [[2.0]]]), torch.ones(2, 1, 1))
    >>> lo, hi = reg.intervals(preds)  # mean 1, sd sqrt(2): 1 -+ 0.8 * sqrt(2)
    >>> round(lo.item(), 3), round(hi.item(), 3)
    (-0.131, 2.131)
    """

    score: RegressionScore
    alpha: float
    threshold: Tensor
    num_calibration: int | None = None

    def __post_init__(self) -> None:
        where = "ConformalRegressor"
        _check_score(self.score, get_args(RegressionScore), where)
        object.__setattr__(self, "alpha", check_alpha_field(self.alpha, where))
        # detached: thresholds fitted on predictions that require grad kept their graph
        # (deepcopy refused them, and the graph's tensors stayed alive)
        object.__setattr__(self, "threshold", check_thresholds(self.threshold, self.score).detach())
        object.__setattr__(self, "num_calibration", check_count(self.num_calibration, where))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConformalRegressor):
            return NotImplemented
        return (self.score, self.alpha) == (other.score, other.alpha) and torch.equal(
            self.threshold, other.threshold
        )

    def __hash__(self) -> int:
        return hash((self.score, self.alpha, tuple(self.threshold.tolist())))

    def intervals(self, preds: GaussianPredictions) -> tuple[Tensor, Tensor]:
        """``(lo, hi)``, each ``(N, D)``."""
        if not isinstance(preds, GaussianPredictions):
            fix = (  # a classifier's, or means and scales not yet wrapped
                "a classifier's predictions get prediction sets from predict_sets() of "
                "conformal(val_preds, val_targets) on its held-out predictions"
                if isinstance(preds, Predictions)
                else "pass what predict() returns for a Gaussian model (for (S, N, D) means and "
                "standard deviations: GaussianPredictions(loc, scale))"
            )
            raise TypeError(f"Expected GaussianPredictions, got {type(preds).__name__}; {fix}.")
        q = self.threshold.to(preds.loc.device)
        if preds.loc.shape[-1] != q.shape[0]:
            raise ValueError(
                f"The predictions have {preds.loc.shape[-1]} outputs, the calibration "
                f"predictions had {q.shape[0]}: a conformal regressor applies to the model it "
                "was calibrated on. Calibrate it on this model's predictions."
            )
        if self.score == "abs":
            wide = preds.double()  # moments in float64, as the scores'
            mean, sd = wide.mean, wide.stddev
            return 0.0 - _last_inside(-mean, sd, q), _last_inside(mean, sd, q)
        lo, hi = preds.interval(1 - self.alpha)
        one = torch.ones_like(lo)  # 0.0 - x: a lower bound of 0 is 0., not -0.
        return 0.0 - _last_inside(-lo, one, q), _last_inside(hi, one, q)

    def __repr__(self) -> str:
        # (each threshold for up to 8 outputs; for more, their count and range: short)
        kept = self.threshold.tolist()
        if len(kept) <= 8:
            values = "[" + ", ".join(f"{v:.4f}" for v in kept) + "]"
        else:
            values = f"<{len(kept)} outputs, {min(kept):.4f} to {max(kept):.4f}>"
        n = "" if self.num_calibration is None else f", num_calibration={self.num_calibration}"
        return (
            f"ConformalRegressor(score={self.score!r}, alpha={self.alpha:g}, threshold={values}{n})"
        )


def conformal(
    val_preds: Predictions | GaussianPredictions,
    val_targets: Tensor | None = None,
    alpha: float = 0.1,
    score: ClassScore | RegressionScore | None = None,
    *,
    seed: int = 0,
    lam: float = 0.01,
    k_reg: int = 1,
) -> ConformalClassifier | ConformalRegressor:
    """Calibrate a split-conformal predictor on held-out predictions.

    Parameters
    ----------
    val_preds : Predictions or GaussianPredictions
        Predictions on the calibration split (never seen in training).
    val_targets : Tensor, optional
        Their labels / targets; default: those the predictions carry.
    alpha : float, default 0.1
        Allowed miscoverage: the sets (intervals) contain the truth with probability at least
        ``1 - alpha`` on exchangeable data. An alpha below about ``1 / (n + 1)`` for n
        calibration inputs (``(n + 1)(1 - alpha) > n``), whose threshold would be infinite,
        is refused, naming the n it needs.
    score : str, optional
        ``"lac"`` (default for classifiers), ``"aps"``, ``"raps"``; ``"abs"`` (default for
        regression) or ``"cqr"``. See :class:`ConformalClassifier`, :class:`ConformalRegressor`.
    seed : int, default 0
        Seed of the APS/RAPS randomisation on the calibration split (unused by the other
        scores, but checked).
    lam, k_reg : float, int
        The RAPS penalty ``lam * max(0, rank - k_reg)`` (unused by the other scores, but
        checked).

    Returns
    -------
    ConformalClassifier or ConformalRegressor

    Examples
    --------
    >>> import torch
    >>> probs = torch.tensor([[0.7, 0.2, 0.1]] * 9 + [[0.1, 0.2, 0.7]])[None]
    >>> cal = conformal(Predictions(probs, torch.zeros(10, dtype=torch.long)), alpha=0.2)
    >>> round(cal.threshold, 4)  # k = ceil(11 * 0.8) = 9: the 9th smallest of nine 0.3s, one 0.9
    0.3
    >>> cal.predict_sets(Predictions(probs[:, :1])).tolist()
    [[True, False, False]]
    """
    check_not_shifted(val_targets, val_preds)
    seed = check_seed(seed, "conformal()")
    if (penalty := finite_float(lam)) is None or penalty < 0:  # (None: also 10**400)
        raise ValueError(
            f"Expected lam >= 0, the RAPS penalty per rank, got {shown(lam)}{tensor_hint(lam)}"
            f"{text_hint(lam, 'lam', 0, low_allowed=True)}: pass a finite number (0: no "
            "penalty, the APS score)."
        )
    if not is_integer(k_reg) or k_reg < 0:
        raise ValueError(
            f"Expected k_reg, the ranks free of penalty, an integer >= 0, got {k_reg!r}"
            f"{tensor_hint(k_reg, integer=True)}."
        )
    check_at_most("k_reg", int(k_reg), "Pass e.g. k_reg=1 (a k_reg >= C leaves every rank free).")
    if isinstance(val_preds, GaussianPredictions):
        score = "abs" if score is None else score
        if score not in ("abs", "cqr"):
            raise ValueError(
                f"Unknown score {score!r}{slip_hint(score, ('abs', 'cqr'))} for regression: "
                "expected 'abs' (normalised residuals) "
                f"or 'cqr' (conformalised mixture quantiles){_score_fix(score, 'regression')}."
            )
        y = val_preds._targets(val_targets, "val_targets").double()
        a = _check_alpha(alpha, y.shape[0])
        scores = _regression_scores(val_preds, y, score, a)
        thresholds = _quantile(scores, a)
        check_regression_threshold(val_preds, y, scores, thresholds, score)
        return ConformalRegressor(score, a, thresholds, y.shape[0])  # type: ignore[arg-type]
    preds = _class_preds(val_preds, "val_preds")
    score = "lac" if score is None else score
    if score not in ("lac", "aps", "raps"):
        raise ValueError(
            f"Unknown score {score!r}{slip_hint(score, ('lac', 'aps', 'raps'))} for "
            "classification: expected 'lac', 'aps' or 'raps'"
            f"{_score_fix(score, 'classification')}."
        )
    y = _labels(preds, val_targets)
    a = _check_alpha(alpha, y.shape[0])
    predictor = ConformalClassifier(score, a, math.inf, float(lam), int(k_reg), seed)  # type: ignore[arg-type]
    scores = predictor.scores(preds, seed).detach()  # as in temperature_scale
    true_scores = scores.gather(1, y.to(scores.device)[:, None])[:, 0]
    threshold = float(_quantile(true_scores, a))
    classes = int(preds.probs.shape[-1])
    n = y.shape[0]
    return ConformalClassifier(score, a, threshold, float(lam), int(k_reg), seed, classes, n)  # type: ignore[arg-type]
