"""Classification, calibration, selective-prediction and OOD metrics (pure torch).

Shape convention: ``probs`` is ``(S, N, C)`` (S draws or members, N inputs, C classes) or
``(N, C)``, taken as the mean predictive probabilities ``p̄`` (S = 1). As in torch-uncertainty,
the metrics are computed on ``p̄ = mean_s p_s``; ``targets`` is an ``(N,)`` integer tensor of
class labels in ``[0, C)`` (left out or None: those the Predictions given carry, as in
:func:`evaluate`, else a ValueError saying to pass them). Each metric returns a python float,
a fraction (not a percentage), in nats where a logarithm is involved. Computations run in
float64 on the input's device.

:func:`evaluate` returns them all; :func:`format_table` prints them grouped. This module never
imports Pyro or the models.

Examples
--------
>>> import torch
>>> probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
>>> targets = torch.tensor([0, 1, 1])
>>> round(acc(probs, targets), 4), round(brier(probs, targets), 4)
(0.6667, 0.2733)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pyrouq import _metric_ood
from pyrouq._metric_inputs import (
    _check_targets,
    _equal_width_index,
    _prepare,
    _prepare_probs,
    carried_targets,
    check_same_draws,
    warn_other_draws,
)
from pyrouq._metric_ood import (
    _OOD_SCORES,
    check_ood_predictions,
    ood_aupr,
    ood_auroc,
    ood_fpr95,
    ood_scores,
    refuse_ood_string,
    score_hint,
)
from pyrouq._numbers import is_integer, shown, tensor_hint
from pyrouq._tables import format_table
from pyrouq.uncertainty import decompose

if TYPE_CHECKING:  # (the module imports no models, nor Pyro)
    from pyrouq.predictive import Predictions

__all__ = [
    "OODScore",
    "acc",
    "accuracy",
    "aece",
    "augrc",
    "aurc",
    "brier",
    "cov_at_5_risk",
    "disagreement",
    "ece",
    "evaluate",
    "expected_entropy",
    "format_table",
    "mutual_information",
    "nll",
    "ood_aupr",
    "ood_auroc",
    "ood_fpr95",
    "ood_scores",
    "risk_at_80_cov",
]

OODScore = _metric_ood.OODScore
"""Per-input OOD score of :func:`ood_scores` (higher = more likely out-of-distribution)."""

#: Number of bins of :func:`ece` (equal width) and :func:`aece` (equal mass).
NUM_BINS = 15
#: Lower clamp on ``p̄[target]`` in :func:`nll`, so an exact 0 gives ``-log(1e-12) ≈ 27.6``.
NLL_CLAMP = 1e-12


# ---------------------------------------------------------------------------------------------
# Classification


def acc(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Accuracy: ``mean_n [argmax_c p̄_nc == y_n]``.

    Ties in ``p̄`` go to the lowest class index (``torch.argmax``).

    Examples
    --------
    >>> acc(torch.tensor([[0.9, 0.1], [0.3, 0.7]]), torch.tensor([0, 0]))
    0.5
    """
    pbar, y = _prepare(probs, targets)
    return float((pbar.argmax(-1) == y).to(torch.float64).mean())


accuracy = acc


def nll(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Negative log-likelihood: ``mean_n -log max(p̄_n[y_n], 1e-12)``, natural log (nats).

    The clamp at ``1e-12`` keeps a confidently wrong prediction (``p̄[y] = 0``) finite
    (``≈ 27.63``); torch-uncertainty's ``CategoricalNLL`` takes the log unclamped (``inf``).

    Examples
    --------
    >>> round(nll(torch.tensor([[0.5, 0.5], [0.25, 0.75]]), torch.tensor([0, 1])), 4)
    0.4904
    """
    pbar, y = _prepare(probs, targets)
    p_true = pbar.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    return float(-torch.log(p_true.clamp_min(NLL_CLAMP)).mean()) + 0.0  # no -0.0 for p = 1


def brier(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Brier score: ``mean_n sum_c (p̄_nc - [c == y_n])^2`` (sum over classes, in ``[0, 2]``).

    Examples
    --------
    >>> round(brier(torch.tensor([[0.8, 0.2], [0.5, 0.5]]), torch.tensor([0, 1])), 4)
    0.29
    """
    pbar, y = _prepare(probs, targets)
    onehot = torch.nn.functional.one_hot(y, pbar.shape[-1]).to(pbar.dtype)
    return float((pbar - onehot).pow(2).sum(-1).mean())


# ---------------------------------------------------------------------------------------------
# Calibration


def ece(
    probs: Tensor | Predictions, targets: Tensor | None = None, *, num_bins: int = NUM_BINS
) -> float:
    """Expected calibration error with ``num_bins`` (default 15) equal-width confidence bins.

    ``ECE = sum_b |B_b| / N * |acc(B_b) - conf(B_b)|`` with confidence ``max_c p̄_nc``,
    ``acc(B_b)`` the accuracy and ``conf(B_b)`` the mean confidence of bin ``B_b``; empty bins
    add 0. With K bins they are left-closed ``[b/K, (b+1)/K)``, edges ``b/K`` correctly rounded
    (torchmetrics' ``linspace(0, 1, K + 1)`` edges can be an ulp below (a value on one falls a
    bin higher: float32 edges 8-10 of K = 15) or above (a bin lower: float32 3, 6, 7 of K = 15,
    float64 0.3 of K = 10); 1.0 joins the last bin ``[(K-1)/K, 1]`` (torchmetrics: its own bin).
    The figures pyrouq reports (``evaluate()``, the tables) use 15. Memory: ``O(N)`` for K up to
    ``2**53`` (each ``b/K`` correctly rounded below it), past max(2N, 2**16) bins the occupied only.

    Examples
    --------
    >>> probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.4, 0.6]])
    >>> round(ece(probs, torch.tensor([0, 1, 0, 0])), 4)  # (2 * |0.5 - 0.9| + 2 * |0.5 - 0.6|) / 4
    0.25
    >>> round(ece(probs, torch.tensor([0, 1, 0, 0]), num_bins=1), 4)  # |0.5 - 0.75|
    0.25
    """
    num_bins = _check_bins(num_bins)
    pbar, y = _prepare(probs, targets)
    conf, pred = pbar.max(-1)
    bins = _equal_width_index(conf, num_bins)
    return _binned_calibration_error(conf, (pred == y).to(conf.dtype), bins)


def aece(
    probs: Tensor | Predictions, targets: Tensor | None = None, *, num_bins: int = NUM_BINS
) -> float:
    """Adaptive ECE with ``num_bins`` (default 15) equal-mass bins (Nixon et al. 2019).

    Points are sorted by increasing confidence ``max_c p̄_nc`` (stable sort) and cut into K
    contiguous groups whose sizes differ by at most one, the larger ones first: exactly
    ``torch.tensor_split(sorted, K)``, as torch-uncertainty does. Then
    ``aECE = sum_b |B_b| / N * |acc(B_b) - conf(B_b)|`` as in :func:`ece`. With N < K the
    last ``K - N`` bins are empty and add 0 (torch-uncertainty returns NaN there). Any K up to
    ``2**53``, in ``O(N)`` memory, as in :func:`ece`.

    Examples
    --------
    >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2]])
    >>> round(aece(probs, torch.tensor([0, 1])), 4)  # (|1 - 0.9| + |0 - 0.8|) / 2
    0.45
    """
    num_bins = _check_bins(num_bins)
    pbar, y = _prepare(probs, targets)
    conf, pred = pbar.max(-1)
    conf, order = torch.sort(conf, stable=True)
    # torch.tensor_split(x, K): the first r = N % K bins hold q + 1 = N // K + 1 points.
    n = conf.numel()
    q, r = divmod(n, num_bins)
    pos = torch.arange(n, device=conf.device)
    big = r * (q + 1)
    bins = torch.where(pos < big, pos // (q + 1), r + (pos - big) // max(q, 1))
    return _binned_calibration_error(conf, (pred == y)[order].to(conf.dtype), bins)


def equal_width_bins(conf: Tensor, num_bins: int) -> tuple[Tensor, Tensor]:
    """``(edges, bins)``: the ``num_bins + 1`` edges of equal-width bins of [0, 1] and each
    confidence's bin, left-closed, a confidence of 1.0 in the last (as :func:`ece` bins)."""
    edges = torch.arange(num_bins + 1, dtype=conf.dtype, device=conf.device) / num_bins
    return edges, _equal_width_index(conf, num_bins)


def _check_bins(num_bins: Any) -> int:
    if not is_integer(num_bins) or num_bins < 1:
        raise ValueError(
            f"Expected num_bins to be a positive integer, got {num_bins!r}"
            f"{tensor_hint(num_bins, integer=True)}. The reported figures use {NUM_BINS}."
        )
    if num_bins > 2**53:
        raise ValueError(
            f"Expected num_bins <= 2**53 (above it, the bins' numbers b and K are not exact "
            f"in float64), got {shown(num_bins)}. The reported figures use {NUM_BINS}."
        )
    return int(num_bins)


# ---------------------------------------------------------------------------------------------
# Selective classification (confidence = max_c p̄_nc)


def aurc(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Area under the risk-coverage curve (Geifman & El-Yaniv 2017), confidence ``max_c p̄``.

    Sort the points by decreasing confidence; the selective risk at coverage ``k / N`` is the
    error rate among the ``k`` most confident points, and ``AURC = (1/N) sum_{k=1}^N risk_k``.
    Ties in confidence are averaged: inside a block of tied points the error count grows
    linearly, its expectation over all orderings of the block (so the result does not depend
    on the input order). torch-uncertainty integrates the same curve with the trapezoidal rule
    and divides by ``1 - 1/N``; the two agree as N grows.

    Examples
    --------
    >>> probs = torch.tensor([[0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> round(aurc(probs, torch.tensor([0, 0, 1])), 4)  # (0/1 + 0/2 + 1/3) / 3
    0.1111
    """
    errors = _error_counts(*_prepare(probs, targets))
    k = torch.arange(1, errors.numel() + 1, dtype=errors.dtype, device=errors.device)
    return float((errors / k).mean())


def augrc(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Area under the generalized risk-coverage curve (Traub et al. 2024).

    The generalized risk at coverage ``k / N`` is the fraction of all N points that are both
    accepted (among the ``k`` most confident) and wrong: ``errors_k / N``;
    ``AUGRC = (1/N) sum_{k=1}^N errors_k / N``. Ties as in :func:`aurc`.

    Examples
    --------
    >>> probs = torch.tensor([[0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> round(augrc(probs, torch.tensor([0, 1, 0])), 4)  # (0 + 1 + 1) / 3 / 3
    0.2222
    """
    errors = _error_counts(*_prepare(probs, targets))
    return float(errors.mean() / errors.numel())


def cov_at_5_risk(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Coverage at 5% risk: the largest coverage ``k / N`` whose selective risk is ``<= 0.05``.

    Risks as in :func:`aurc`. Returns ``0.0`` when no coverage reaches a risk of 5% or less
    (torch-uncertainty returns NaN there).

    Examples
    --------
    >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> cov_at_5_risk(probs, torch.tensor([0, 0, 1, 0]))  # risks 0, 0, 1/3, 1/4
    0.5
    """
    errors = _error_counts(*_prepare(probs, targets))
    n = errors.numel()
    k = torch.arange(1, n + 1, dtype=errors.dtype, device=errors.device)
    ok = torch.nonzero(errors * 20 <= k + 1e-9)  # risk = errors / k <= 1/20, exactly
    return float(ok[-1, 0] + 1) / n if ok.numel() else 0.0


def risk_at_80_cov(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Selective risk at 80% coverage: the error rate among the ``ceil(0.8 N)`` most confident.

    The count is rounded up (computed exactly, in integers), as torch-uncertainty does; ties as
    in :func:`aurc`.

    Examples
    --------
    >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> round(risk_at_80_cov(probs, torch.tensor([0, 0, 1, 1])), 4)  # top ceil(3.2) = 4
    0.5
    """
    errors = _error_counts(*_prepare(probs, targets))
    k = (4 * errors.numel() + 4) // 5  # ceil(0.8 N) in integers, no float round-off
    return float(errors[k - 1] / k)


# ---------------------------------------------------------------------------------------------
# Ensemble / posterior uncertainty


def disagreement(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Ensemble disagreement: the fraction of member pairs whose predicted classes differ.

    For each input, over the ``S (S - 1) / 2`` unordered pairs ``i < j`` of the members'
    ``argmax`` predictions, the fraction with ``pred_i != pred_j``; averaged over inputs. Equal
    to ``1 - sum_c n_c (n_c - 1) / (S (S - 1))`` with ``n_c`` the votes for class ``c``. 0.0 when
    S = 1 (also for ``(N, C)`` input). ``targets`` is accepted and ignored.

    Examples
    --------
    >>> probs = torch.tensor([[[0.9, 0.1], [0.6, 0.4]], [[0.2, 0.8], [0.7, 0.3]]])
    >>> disagreement(probs)  # input 0: the members disagree; input 1: they agree
    0.5
    """
    p = _prepare_probs(probs)
    s, n, c = p.shape
    if s == 1:
        return 0.0
    preds = p.argmax(-1).T  # (N, S)
    votes = p.new_zeros(n, c).scatter_add_(1, preds, p.new_ones(n, s))
    agreeing_pairs = (votes * (votes - 1)).sum(-1) / 2
    return float((1 - agreeing_pairs / (s * (s - 1) / 2)).mean())


def expected_entropy(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Mean over inputs of the expected entropy ``mean_s H(p_s)`` (aleatoric part), in nats.

    See :func:`pyrouq.uncertainty.decompose`; ``targets`` is accepted and ignored.

    Examples
    --------
    >>> round(expected_entropy(torch.tensor([[[0.5, 0.5]], [[1.0, 0.0]]])), 4)  # log(2) / 2
    0.3466
    """
    return float(decompose(_prepare_probs(probs), "entropy").aleatoric.mean())


def mutual_information(probs: Tensor | Predictions, targets: Tensor | None = None) -> float:
    """Mean over inputs of the mutual information ``H(p̄) - mean_s H(p_s)`` (epistemic), nats.

    See :func:`pyrouq.uncertainty.decompose`; ``targets`` is accepted and ignored.

    Examples
    --------
    >>> round(mutual_information(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])), 4)  # log(2)
    0.6931
    """
    return float(decompose(_prepare_probs(probs), "entropy").epistemic.mean())


# ---------------------------------------------------------------------------------------------
# Out-of-distribution detection (OOD = positive class, higher score = more likely OOD):
# ood_scores, ood_auroc, ood_aupr and ood_fpr95 live in pyrouq._metric_ood (imported above)


# ---------------------------------------------------------------------------------------------
# All at once


def evaluate(
    predictions: Any,
    targets: Tensor | None = None,
    ood: Any = None,
    ood_score: OODScore | None = None,
) -> dict[str, float]:
    """Compute every metric of this module, as fractions (not percentages), nats for logs.

    Parameters
    ----------
    predictions : Tensor or object with ``.probs``
        ``(S, N, C)`` probabilities (e.g. a ``Predictions``), or ``(N, C)`` mean probabilities
        (S = 1: disagreement and mutual information are then 0). A
        :class:`~pyrouq.GaussianPredictions` returns its regression metrics
        (:meth:`~pyrouq.GaussianPredictions.evaluate`).
    targets : Tensor, optional
        ``(N,)`` integer labels in ``[0, C)``; default ``predictions.targets`` (the
        labels a ``Predictions`` carries when it was predicted from a loader).
    ood : Tensor or object with ``.probs``, optional
        ``(S, M, C)`` (or ``(M, C)``) probabilities on M >= 1 out-of-distribution inputs. When
        given, the in- and out-of-distribution inputs are scored with ``ood_score`` and the OOD
        metrics are added. The OOD inputs themselves (images, a loader) are refused: pass
        ``predict(model, ood_inputs, guide)``.
    ood_score : {"mutual_information", "entropy", "max_prob", "variance"}, optional
        The per-input score of :func:`ood_scores`. Default: the mutual information, or for
        one draw (S = 1: a plain network), whose draws cannot disagree, the entropy; the
        mutual information and the variance of one draw are refused (0 for every input), as
        are they where ``ood`` holds another number of draws (they depend on it: predict both
        with the same ``num_samples``), and an ``ood_score`` without ``ood``. ``"entropy"``
        and ``"max_prob"`` score the mean prediction, which also grows less certain with
        more disagreeing draws: with another number of draws in ``ood`` they warn (an
        ``(M, C)`` tensor counts as one draw, though it may be the mean of as many).

    Returns
    -------
    dict of str to float
        Keys, in this order: ``acc``, ``nll``, ``brier``, ``ece``, ``aece``, ``aurc``,
        ``augrc``, ``cov_at_5_risk``, ``risk_at_80_cov``, ``disagreement``,
        ``expected_entropy``, ``mutual_information``, and with ``ood``: ``ood_auroc``,
        ``ood_aupr``, ``ood_fpr95``.

    Examples
    --------
    >>> probs = torch.tensor([[[0.9, 0.1], [0.3, 0.7]], [[0.7, 0.3], [0.4, 0.6]]])
    >>> ood = torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]])
    >>> m = evaluate(probs, torch.tensor([0, 1]), ood=ood)
    >>> list(m)[:3], m["acc"], m["ood_auroc"]
    (['acc', 'nll', 'brier'], 1.0, 1.0)
    """
    refuse_ood_string(ood)  # evaluate(preds, y, "entropy"): ood_score is the fourth
    if ood_score is not None and ood_score not in _OOD_SCORES:
        hint = score_hint(ood_score)
        raise ValueError(
            f"Unknown ood_score {ood_score!r}{hint}; expected one of "
            f"{', '.join(map(repr, _OOD_SCORES))}."
        )
    if ood_score is not None and ood is None:
        raise ValueError(
            f"ood_score={ood_score!r} given without ood: it scores the in- and "
            "out-of-distribution inputs for the OOD metrics. Pass ood=(predictions on the OOD "
            "inputs), or leave ood_score out."
        )
    from pyrouq.regression import GaussianPredictions

    if isinstance(predictions, GaussianPredictions):
        if ood is not None:
            raise ValueError(
                "ood is scored for classifiers only; for regression compare the epistemic "
                "variances of predictions.uncertainty() in and out of distribution."
            )
        return predictions.evaluate(targets)  # its own targets, if None
    p = _prepare_probs(predictions, name="predictions")  # a wrong type first, before 'No targets'
    targets = carried_targets(targets, predictions)
    if hasattr(targets, "probs"):  # evaluate(preds, ood_preds): torch.as_tensor would fail
        raise TypeError(
            f"Expected targets to be (N,) class labels, got {type(targets).__name__}; "
            "predictions on out-of-distribution inputs go as ood: evaluate(predictions, "
            "targets, ood), or predictions.evaluate(targets, ood=ood) (targets None: those "
            "the predictions carry)."
        )
    pbar = p.mean(0)
    y = _check_targets(targets, pbar, of="predictions")
    on_mean = (acc, nll, brier, ece, aece, aurc, augrc, cov_at_5_risk, risk_at_80_cov)
    out = {fn.__name__: fn(pbar, y) for fn in on_mean}
    out["disagreement"] = disagreement(p)
    parts = decompose(p, "entropy")
    out["expected_entropy"] = float(parts.aleatoric.mean())
    out["mutual_information"] = float(parts.epistemic.mean())
    if ood is not None:
        check_ood_predictions(ood, p.shape[-1])
        ood_p = _prepare_probs(ood, name="ood")
        if ood_p.shape[-1] != p.shape[-1]:
            raise ValueError(
                f"Expected ood with C={p.shape[-1]} classes like the in-distribution probs, "
                f"got shape {tuple(getattr(ood, 'probs', ood).shape)}; score both with the "
                "same model."
            )
        named = f"ood_score={ood_score!r}"  # (else the default's, as told below)
        if ood_score is None:
            ood_score = "mutual_information" if p.shape[0] > 1 else "entropy"
            named = f"the default ood_score, {ood_score!r},"
        elif ood_score in ("mutual_information", "variance") and p.shape[0] == 1:
            raise ValueError(
                f"ood_score={ood_score!r} of one draw (S = 1) is 0 for every input, so its OOD "
                "metrics say nothing. Use ood_score='entropy' (the default for S = 1) or "
                "'max_prob', or predict with posterior draws or ensemble members."
            )
        if ood_score in ("mutual_information", "variance"):
            check_same_draws(p, ood_p, named)
        else:  # (the mean of more draws is less certain: warned, an (N, C) mean may be fair)
            warn_other_draws(p, ood_p, named)
        s_in, s_out = ood_scores(p, ood_score), ood_scores(ood_p, ood_score)
        out["ood_auroc"] = ood_auroc(s_in, s_out)
        out["ood_aupr"] = ood_aupr(s_in, s_out)
        out["ood_fpr95"] = ood_fpr95(s_in, s_out)
    return out


# ---------------------------------------------------------------------------------------------
# Private helpers: metrics on validated float64 p̄ (N, C)


def _binned_calibration_error(conf: Tensor, correct: Tensor, bins: Tensor) -> float:
    """``sum_b |B_b| / N * |acc_b - conf_b| = sum_b |sum_{B_b} correct - sum_{B_b} conf| / N``."""
    if int(bins.max()) >= max(2 * bins.numel(), 2**16):  # mostly empty: the occupied ones only
        bins = torch.unique(bins, return_inverse=True)[1]  # (a sort; O(N) memory either way)
    sum_conf = conf.new_zeros(int(bins.max()) + 1).index_add_(0, bins, conf)
    sum_correct = torch.zeros_like(sum_conf).index_add_(0, bins, correct)
    occupied = sum_conf > 0  # (a confidence is >= 1/C): empty bins' zeros would regroup the sum
    return float((sum_correct - sum_conf)[occupied].abs().sum() / conf.numel())


def _error_counts(pbar: Tensor, y: Tensor) -> Tensor:
    """Expected number of errors among the k most confident points, k = 1..N, float64 ``(N,)``.

    Inside a block of equal confidences the count is interpolated linearly, which is its
    expectation over all orderings of the block.
    """
    conf, pred = pbar.max(-1)
    conf, order = torch.sort(conf, descending=True, stable=True)
    wrong = (pred != y)[order].to(torch.float64)
    cum = torch.cat([wrong.new_zeros(1), wrong.cumsum(0)])  # cum[k]: errors among the first k
    _, counts = torch.unique_consecutive(conf, return_counts=True)
    ends = counts.cumsum(0)
    starts = ends - counts
    before, block_errors = cum[starts], cum[ends] - cum[starts]
    block = torch.repeat_interleave(torch.arange(counts.numel(), device=conf.device), counts)
    taken = torch.arange(1, conf.numel() + 1, device=conf.device) - starts[block]
    return before[block] + block_errors[block] * taken / counts[block]
