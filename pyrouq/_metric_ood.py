"""The out-of-distribution metrics of :mod:`pyrouq.metrics` (re-exported there): per-input OOD
scores and the AUROC, AUPR and FPR95 of telling OOD inputs (the positive class, higher score =
more likely OOD) from in-distribution ones."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from pyrouq._metric_inputs import _check_scores, _prepare_probs
from pyrouq._numbers import is_array_like
from pyrouq._words import close_names, did_you_mean, slip_hint
from pyrouq.uncertainty import _SUM_TOL, decompose, entropy

OODScore = Literal["mutual_information", "entropy", "max_prob", "variance"]
"""Per-input OOD score of :func:`ood_scores` (higher = more likely out-of-distribution)."""

_OOD_SCORES: tuple[str, ...] = get_args(OODScore)

#: The short names the scores go by in the literature (lower case): MSP, the maximum softmax
#: probability; MI, the mutual information.
_SCORE_NAMES = {"msp": "max_prob", "mi": "mutual_information"}


def score_hint(given: object) -> str:
    """What a refusal of ``given`` as an OOD score's name puts after it: for another name of
    one (``"msp"``, ``"MI"``), `` (did you mean 'max_prob'? pyrouq's name for msp)``; for a
    slip of one, :func:`~pyrouq._words.slip_hint`'s question; else ``""``."""
    if isinstance(given, str) and given.strip().lower() in _SCORE_NAMES:
        meant = _SCORE_NAMES[given.strip().lower()]
        return did_you_mean([meant], f"pyrouq's name for {given.strip()}")
    return slip_hint(given, _OOD_SCORES)


def _predict_first(where: str, inputs: str = "ood_inputs") -> str:
    return (
        f"{where} scores predictions, not inputs: predict on them first, "
        f"ood=pyrouq.predict(model, {inputs}, guide), as for the in-distribution ones"
    )


def check_ood_predictions(
    ood: Any, num_classes: int | None = None, where: str = "evaluate()"
) -> None:
    """Refuse the out-of-distribution inputs themselves, a loader of them or images, where
    :func:`pyrouq.metrics.evaluate` takes predictions on them (a loader was told only that it
    had no ``.probs``, and a batch of images to stack draws on dim 0; probabilities on a dim
    too many are still told that). With ``num_classes``, the C of the in-distribution
    predictions, so are inputs of 2 or 3 dims whose last is not C, flattened ``(M, 784)`` or
    ``(M, 28, 28)`` images (they were told to apply a softmax, or to convert a uint8 dtype);
    probabilities of another C are left to the check of C. ``where``: the function that
    scores them (:func:`~pyrouq.plot_uncertainty_distributions` checks its ood alike). An
    array (numpy's, a list) is checked as the tensor it makes: inputs given so are told to
    predict on that tensor (predict() takes no array), not to convert them first (then told to
    predict)."""
    kind, inputs = "a tensor", "ood_inputs"
    if not isinstance(ood, Tensor) and is_array_like(ood):
        name = type(ood).__name__
        named = f"a {name}" if isinstance(ood, (list, tuple)) else f"an array ({name})"
        try:
            ood, kind, inputs = torch.as_tensor(ood), named, "torch.as_tensor(ood_inputs)"
        except (TypeError, ValueError, RuntimeError):
            pass  # (batches in a list: told below; else by the check of the probabilities)
    if isinstance(ood, Tensor) and ood.dim() > 3 and not _sums_to_one(ood):
        raise ValueError(
            f"Expected ood to be predictions on out-of-distribution inputs, (S, N, C) or (N, C) "
            f"probabilities, got {kind} of shape {tuple(ood.shape)}: the inputs? "
            f"{_predict_first(where, inputs)}."
        )
    if (
        isinstance(ood, Tensor)
        and num_classes is not None
        and ood.dim() in (2, 3)
        and ood.shape[-1] != num_classes
        and ood.numel()  # (empty, on the meta device: refused as such by the probability check)
        and not ood.is_meta
        and not _sums_to_one(ood)
    ):
        raise ValueError(
            f"Expected ood to be predictions on out-of-distribution inputs, (S, N, C) or (N, C) "
            f"probabilities over the C={num_classes} classes of the in-distribution ones, got "
            f"{kind} of shape {tuple(ood.shape)} that holds no probabilities: the inputs? "
            f"{_predict_first(where, inputs)}."
        )
    if isinstance(ood, Tensor) or hasattr(ood, "probs") or is_array_like(ood):
        return
    if isinstance(ood, str):  # (evaluate() tells a score's name first: refuse_ood_string)
        raise TypeError(_not_a_name(ood, where))
    if isinstance(ood, Mapping):  # one OOD set's predictions by name, or a dict of its fields
        keys = ", ".join(map(repr, list(ood)[:4])) + (", ..." if len(ood) > 4 else "")
        call = (  # (the caller's own call, one set at a time)
            "evaluate(predictions, targets, ood=p)"
            if where == "evaluate()"
            else f"{where.removesuffix(')')}in_dist, ood=p)"
        )
        fix = (
            "Pass its probabilities, ood=ood['probs'], or the Predictions predict() returned"
            if "probs" in ood
            else f"Pass one set's predictions at a time, e.g. {{name: {call} for name, p in "
            "ood.items()}"
        )
        raise TypeError(
            f"Expected ood to be predictions on out-of-distribution inputs (Predictions, or "
            f"(S, N, C) or (N, C) probabilities), got a {type(ood).__name__} (keys {keys}). "
            f"{fix}."
        )
    if hasattr(ood, "__iter__"):  # a loader, a list of batches
        raise TypeError(
            f"Expected ood to be predictions on out-of-distribution inputs, got "
            f"{type(ood).__name__}, a loader or batches of inputs? {_predict_first(where)}."
        )


def refuse_ood_string(ood: Any) -> None:
    """Refuse a string as ``ood``: an OOD score's name given third (``evaluate(preds, y,
    "entropy")``: the score goes fourth), or another string, a path or a data set's name (the
    predictions on its inputs go there)."""
    if not isinstance(ood, str):
        return
    other = _SCORE_NAMES.get(ood.strip().lower())  # 'msp', 'MI': a score by another name
    meant = [ood] if ood in _OOD_SCORES else close_names(ood.strip().lower(), _OOD_SCORES)
    meant = [other] if other is not None else meant
    if meant:
        # a score's name, one slipped from it ('Max-Prob') or another of its names ('msp') is
        # the score; a name only close to one ('energy', 'entropies') may be another: asked,
        # with the scores there are
        sure = ood in _OOD_SCORES or other is not None or slip_hint(ood, _OOD_SCORES)
        goes = (
            f"evaluate(predictions, targets, ood, {meant[0]!r})"
            + (f" ({meant[0]!r} is pyrouq's name for {ood.strip()})" if other else "")
            if sure
            else "evaluate(predictions, targets, ood, ood_score) with ood_score one of "
            f"{', '.join(map(repr, _OOD_SCORES))}{did_you_mean(meant)}"
        )
        raise TypeError(
            f"Expected ood to be predictions on out-of-distribution inputs, got the string "
            f"{ood!r}; an OOD score goes fourth, {goes}."
        )
    raise TypeError(_not_a_name(ood, "evaluate()"))


def _not_a_name(ood: str, where: str) -> str:
    """The refusal of a string as ``ood`` that names no OOD score: a file's or a data set's
    name, whose inputs' predictions go there."""
    return (
        f"Expected ood to be predictions on out-of-distribution inputs, got the string {ood!r} "
        f"(a file or a data set's name?). {_predict_first(where)}."
    )


def _sums_to_one(x: Tensor) -> bool:
    """Whether ``x`` holds probabilities over its last dim (stacked on too many dims, they are
    told how to stack them, not that they are inputs)."""
    if not x.is_floating_point() or x.is_meta or not x.numel():
        return False
    return bool(((x.sum(-1) - 1).abs() <= _SUM_TOL).all())


# ---------------------------------------------------------------------------------------------
# Out-of-distribution detection (OOD = positive class, higher score = more likely OOD)


def ood_scores(probs: Tensor, score: OODScore = "mutual_information") -> Tensor:
    """Per-input OOD scores, higher meaning more likely out-of-distribution.

    Parameters
    ----------
    probs : Tensor or object with ``.probs``
        ``(S, N, C)`` probabilities, or ``(N, C)`` mean probabilities (S = 1).
    score : {"mutual_information", "entropy", "max_prob", "variance"}
        * ``"mutual_information"``: the epistemic part of the entropy decomposition (nats);
          0 for every input when S = 1.
        * ``"entropy"``: the total predictive entropy ``H(p̄)`` (nats).
        * ``"max_prob"``: ``1 - max_c p̄_c``, so that higher means more likely OOD (same ranking
          as the negated maximum softmax probability baseline).
        * ``"variance"``: the epistemic part of the variance decomposition,
          ``sum_c Var_s(p_sc)``.

    Returns
    -------
    Tensor
        ``(N,)`` float64 scores on the input's device.

    Examples
    --------
    >>> probs = torch.tensor([[0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)
    >>> [round(v, 4) for v in ood_scores(probs, "max_prob").tolist()]
    [0.1, 0.5]
    """
    if score not in _OOD_SCORES:
        hint = score_hint(score)
        raise ValueError(
            f"Unknown OOD score {score!r}{hint}; expected one of "
            f"{', '.join(map(repr, _OOD_SCORES))}."
        )
    p = _prepare_probs(probs)
    if score == "mutual_information":
        return decompose(p, "entropy").epistemic
    if score == "entropy":  # H(p̄) itself: inputs of one mean tie exactly
        return entropy(p.mean(0))
    if score == "max_prob":
        return 1 - p.mean(0).amax(-1)
    return decompose(p, "variance").epistemic


def ood_auroc(scores_in: Tensor, scores_out: Tensor) -> float:
    """Area under the ROC curve for telling OOD (positive) from in-distribution inputs.

    The Mann-Whitney statistic: ``P(s_out > s_in) + P(s_out == s_in) / 2`` over all pairs,
    computed from average ranks (ties count 1/2).

    Examples
    --------
    >>> ood_auroc(torch.tensor([0.1, 0.5]), torch.tensor([0.5, 0.9]))  # (1 + 1 + 1/2 + 1) / 4
    0.875
    """
    s_in, s_out = _check_scores(scores_in, scores_out)
    n_in, n_out = s_in.numel(), s_out.numel()
    scores = torch.cat([s_in, s_out])
    is_out = torch.cat([torch.zeros_like(s_in), torch.ones_like(s_out)])
    sorted_scores, order = torch.sort(scores)
    _, counts = torch.unique_consecutive(sorted_scores, return_counts=True)
    ends = counts.cumsum(0)
    mean_rank = (ends - counts + 1 + ends).to(torch.float64) / 2  # ranks start at 1
    ranks = torch.repeat_interleave(mean_rank, counts)
    u = (ranks * is_out[order]).sum() - n_out * (n_out + 1) / 2
    return float(u / (n_in * n_out))


def ood_aupr(scores_in: Tensor, scores_out: Tensor) -> float:
    """Area under the precision-recall curve (average precision) with OOD as the positive class.

    ``AP = sum_k (R_k - R_{k-1}) P_k``, with ``P_k`` and ``R_k`` the precision and recall of the
    rule "OOD if score >= t_k" at the distinct scores ``t_1 > t_2 > ...`` (``R_0 = 0``): scikit-
    learn's ``average_precision_score``, no interpolation.

    Examples
    --------
    >>> ood_aupr(torch.tensor([0.1, 0.5]), torch.tensor([0.5, 0.9]))  # 1/2 * 1 + 1/2 * 2/3
    0.8333333333333333
    """
    tp, fp, _, n_out = _threshold_counts(*_check_scores(scores_in, scores_out))
    precision = tp / (tp + fp)
    recall = tp / n_out
    steps = torch.diff(recall, prepend=recall.new_zeros(1))
    return float((steps * precision).sum())


def ood_fpr95(scores_in: Tensor, scores_out: Tensor) -> float:
    """False-positive rate at 95% true-positive rate, OOD positive.

    Lower the threshold ``t`` through the distinct scores until the fraction of OOD inputs with
    score ``>= t`` (TPR, the OOD recall) first reaches ``>= 0.95``; return the fraction of
    in-distribution inputs with score ``>= t``. torch-uncertainty takes the threshold whose
    recall is closest to 0.95 instead, which may fall below 95% recall.

    Examples
    --------
    >>> ood_fpr95(torch.tensor([0.1, 0.5]), torch.tensor([0.5, 0.9]))  # t = 0.5
    0.5
    """
    tp, fp, n_in, n_out = _threshold_counts(*_check_scores(scores_in, scores_out))
    first = int(torch.nonzero(tp * 20 >= 19 * n_out)[0, 0])  # TPR >= 0.95, exactly
    return float(fp[first] / n_in)


# ---------------------------------------------------------------------------------------------
# Private helpers


def _threshold_counts(s_in: Tensor, s_out: Tensor) -> tuple[Tensor, Tensor, int, int]:
    """True and false positives of "OOD if score >= t" at each distinct score, decreasing t."""
    scores = torch.cat([s_in, s_out])
    is_out = torch.cat([torch.zeros_like(s_in), torch.ones_like(s_out)]).to(torch.float64)
    scores, order = torch.sort(scores, descending=True, stable=True)
    _, counts = torch.unique_consecutive(scores, return_counts=True)
    last = counts.cumsum(0) - 1
    tp = is_out[order].cumsum(0)[last]
    fp = (last + 1).to(tp.dtype) - tp
    return tp, fp, s_in.numel(), s_out.numel()
