"""The input checks of :mod:`pyrouq.metrics` (probabilities, labels, OOD scores), shared with
the plots and the predictions, and the equal-width confidence bins of its ECE."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import Tensor

from pyrouq._meta_device import refuse_meta
from pyrouq._numbers import is_array_like
from pyrouq._util import warn_caller
from pyrouq.uncertainty import _check_probs

WIDE_UNSIGNED: tuple[torch.dtype, ...] = tuple(
    dtype
    for dtype in (getattr(torch, name, None) for name in ("uint16", "uint32", "uint64"))
    if isinstance(dtype, torch.dtype)
)
"""torch.uint16 / uint32 / uint64 (from torch 2.3): torch has no min() of them, nor a
comparison with int64; torch 2.2, which pyrouq supports, has none of them."""


def _float64(x: Tensor) -> Tensor:
    """``x`` as float64; MPS has no float64, so it moves to the CPU there."""
    if x.device.type == "mps":
        x = x.cpu()
    return x.to(torch.float64)


def _prepare_probs(probs: Any, name: str = "probs") -> Tensor:
    """Validate ``(S, N, C)`` or ``(N, C)`` probabilities; return them as ``(S, N, C)`` float64."""
    if not isinstance(probs, Tensor):
        if hasattr(probs, "loc") and hasattr(probs, "scale"):  # GaussianPredictions
            raise TypeError(
                f"Expected {name} to be class probabilities, got {type(probs).__name__}, a "
                "Gaussian likelihood's predictions: evaluate them with their .evaluate() and "
                "plot them with plot_regression() / plot_calibration()."
            )
        if not hasattr(probs, "probs"):
            arrayish = is_array_like(probs)
            raise TypeError(
                f"Expected {name} to be an (S, N, C) or (N, C) probability tensor or an object "
                f"with a .probs attribute (e.g. pyrouq Predictions), got {type(probs).__name__}"
                f"{f'; pass torch.as_tensor({name})' if arrayish else ''}."
            )
        probs = probs.probs
    _check_probs(probs, name=name, ndim=(3, 2))
    p = _float64(probs.detach())  # the metrics are numbers: nothing to differentiate
    return p.unsqueeze(0) if p.dim() == 2 else p


def _check_targets(targets: Any, pbar: Tensor, name: str = "targets", of: str = "probs") -> Tensor:
    """Validate ``(N,)`` integer labels in ``[0, C)`` for ``pbar`` ``(N, C)``; return them long.
    ``name`` is the labels' argument's name in the words, ``of`` that of the predictions."""
    n, c = pbar.shape
    return check_labels(targets, n, c, name, of).to(device=pbar.device, dtype=torch.long)


def check_labels(
    targets: Any, n: int, c: int | None, name: str = "targets", of: str = "probs"
) -> Tensor:
    """``targets`` if they are ``(n,)`` integer labels in ``[0, c)``, else a TypeError /
    ValueError naming ``name`` (and ``of``, the argument they label, where their shape is
    wrong); ``c`` None (the classes not known yet, as before a first prediction): all but the
    upper bound is checked."""
    if targets is None:  # ece(preds, preds.targets) of inputs without labels: no tensor to wrap
        raise TypeError(
            f"Expected {name} to be a torch.Tensor of class labels, got None; pass the ({n},) "
            "labels of the inputs predicted (a Predictions' .targets is None when predict() "
            "was given inputs without labels)."
        )
    if not isinstance(targets, Tensor):
        raise TypeError(
            f"Expected {name} to be a torch.Tensor of class labels, got "
            f"{type(targets).__name__}; wrap it with torch.as_tensor(...)."
        )
    if targets.dtype == torch.bool or targets.is_floating_point() or targets.is_complex():
        rows = f"{name}.long()" if targets.dtype == torch.bool else name  # no argmax of bools
        fix = f"convert them with {name}.long() (or, for one-hot rows, {rows}.argmax(-1))"
        if targets.is_complex():  # (torch has no argmax of complex numbers either)
            fix = f"convert them with {name}.long()"
        elif c is not None and tuple(targets.shape) == (n, c):  # one-hot rows: their argmax
            fix = label_shape_fix(targets.shape, n, c, name, targets.dtype)
        raise TypeError(
            f"Expected integer {name} (class indices), got dtype {targets.dtype}; {fix}."
        )
    refuse_meta(  # (after the dtype, read without values; was torch's ".item() cannot be
        # called on meta tensors")
        targets,
        name,
        "there are no labels to check. Pass the labels themselves (on the cpu, or the device "
        "of probs).",
    )
    if targets.dim() != 1 or targets.numel() != n:
        fix = label_shape_fix(targets.shape, n, -1 if c is None else c, name)
        raise ValueError(
            f"Expected {name} of shape (N,) = ({n},), one label per input of {of}, got shape "
            f"{tuple(targets.shape)}; {fix}."
        )
    if targets.dtype in WIDE_UNSIGNED:  # torch's "min_all" not implemented for them
        raise TypeError(
            f"Expected int64 {name} (class indices), got dtype {targets.dtype}, which torch "
            "can neither take the minimum of nor compare with int64 predictions; convert them "
            f"with {name}.long()."
        )
    if not targets.numel():
        return targets
    lo, hi = int(targets.min()), int(targets.max())
    if c is None and lo < 0:
        raise ValueError(
            f"Expected {name} to be class indices 0..C-1 for C classes, got values in "
            f"[{lo}, {hi}]; relabel them as 0..C-1."
        )
    if c is not None and (lo < 0 or hi >= c):
        fix = f"relabel them as 0..{c - 1}"
        if c == 1 and hi > 1:  # labels of more classes than two: no binary classifier's
            fix = (
                f"{of} hold one class, which every input gets with probability 1, and {name} "
                f"name classes up to {hi}. Pass probabilities over every class, one column "
                "per class (a softmax over the model's outputs, one output per class)"
                + (", and relabel the labels as 0..C-1" if lo < 0 else "")
            )
        elif c == 1:  # (relabelled 0..0, every input is right: acc 1, ECE 0)
            keep = (
                "keep these labels"
                if lo >= 0
                else f"relabel these as 0 and 1 (e.g. ({name} > 0).long() for labels -1 and 1)"
            )
            fix = (
                f"{of} hold one class, which every input gets with probability 1. For a binary "
                "classifier pass both classes' probabilities, torch.cat([1 - p, p], dim=-1) "
                "of its class-1 probabilities p (a sigmoid's, not a softmax over its one "
                f"output, which is 1 everywhere), and {keep}"
            )
        raise ValueError(
            f"Expected {name} in [0, {c}) (class indices for C={c} classes), got values in "
            f"[{lo}, {hi}]; {fix}."
        )
    return targets


def _prepare(probs: Any, targets: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(p̄, y)``: float64 mean probabilities ``(N, C)`` and long targets ``(N,)``; targets
    None are those ``probs`` carries (Predictions), else a ValueError in :func:`evaluate`'s
    words (:func:`carried_targets`)."""
    pbar = _prepare_probs(probs).mean(0)
    if targets is None:  # (a number or another type: _check_targets says what came)
        targets = carried_targets(None, probs)
    return pbar, _check_targets(targets, pbar)


def _equal_width_index(conf: Tensor, num_bins: int) -> Tensor:
    """``bucketize(conf, arange(K + 1) / K, right=True) - 1`` clamped to ``[0, K - 1]``, exactly,
    without the K + 1 edges: ``floor(conf * K)``, moved one bin where it rounded across an edge."""
    b = (conf * num_bins).floor().clamp(0, num_bins - 1)
    b = b - (b / num_bins > conf).to(b.dtype)
    return (b + (((b + 1) / num_bins <= conf) & (b < num_bins - 1)).to(b.dtype)).long()


def _check_scores(scores_in: Any, scores_out: Any) -> tuple[Tensor, Tensor]:
    out = []
    for name, s in (("scores_in", scores_in), ("scores_out", scores_out)):
        if not isinstance(s, Tensor):
            arrayish = is_array_like(s)
            fix = (
                f"pass torch.as_tensor({name})"
                if arrayish
                else "compute them with ood_scores(probs, score)"
            )
            raise TypeError(
                f"Expected {name} to be a torch.Tensor of per-input scores, got "
                f"{type(s).__name__}; {fix}."
            )
        if s.dim() != 1 or s.numel() == 0:
            raise ValueError(
                f"Expected {name} of shape (M,) with M >= 1 (a non-empty set of inputs), got "
                f"shape {tuple(s.shape)}; pass one score per input and at least one input."
            )
        if s.is_complex():  # .to(float64) would drop the imaginary part with a warning
            raise TypeError(
                f"Expected real {name}, got dtype {s.dtype}; pass real per-input scores, e.g. "
                f"{name}.abs() or {name}.real, whichever ranks your inputs."
            )
        # integer scores rank exactly as int64 (in float64, those above 2**53 would tie)
        exact = not s.is_floating_point() and s.dtype != getattr(torch, "uint64", None)
        s = s.to(torch.int64) if exact else _float64(s)
        if not bool(torch.isfinite(s).all()):
            raise ValueError(f"Expected finite {name}, got NaN or inf; check the scores.")
        out.append(s)
    return out[0], out[1].to(out[0].device)


def carried_targets(
    targets: Any,
    predictions: Any,
    name: str = "targets",
    fix: str = "pass targets=(N,) labels, or Predictions that carry them (predict from a "
    "loader of (x, y) batches)",
) -> Any:
    """``targets``, else the ones ``predictions`` carry, else a ValueError: "No {name}: {fix}".
    A number given as ``targets`` (most often one meant for another parameter, passed in their
    place) is a TypeError that says so."""
    if isinstance(targets, numbers.Number):
        raise TypeError(
            f"Expected {name} to be a tensor of labels, one per input, got a number "
            f"({type(targets).__name__} {targets!r}) in their place. Pass the labels as a "
            f"tensor ({name}=torch.as_tensor(labels)), or leave {name} out to use those the "
            "predictions carry; a number meant for another parameter goes by that parameter's "
            "name."
        )
    if targets is None:
        targets = getattr(predictions, "targets", None)
    if targets is None:
        raise ValueError(f"No {name}: {fix}.")
    return targets


def check_same_draws(p: Tensor, ood_p: Tensor, what: str) -> None:
    """Refuse OOD probabilities ``(S', M, C)`` with another number of draws than the
    in-distribution ones ``(S, N, C)`` where ``what`` (a measure of how far the draws
    disagree) is compared."""
    if ood_p.shape[0] != p.shape[0]:
        raise ValueError(
            f"ood holds {ood_p.shape[0]} draw(s) per input and the in-distribution "
            f"predictions {p.shape[0]}: {what} measures how far the draws disagree, which "
            "depends on how many there are (with one draw it is 0), so it is comparable only "
            "between predictions with as many draws. Predict the OOD inputs with the same "
            "model and num_samples (an (N, C) tensor is one draw)."
        )


def warn_other_draws(p: Tensor, ood_p: Tensor, what: str) -> None:
    """Warn where ``what``, a score of the mean prediction (the entropy, 1 - max prob), compares
    OOD probabilities ``(S', M, C)`` with in-distribution ones ``(S, N, C)`` of another number
    of draws: the mean of more disagreeing draws is less certain, which biases the metrics (a
    mean-field MLP, one epoch from init_scale=0.1, MNIST vs Fashion-MNIST by entropy: AUROC
    0.676 with 32 draws each, 0.647 with 4 OOD draws, 0.447 with one; trained to a narrow
    posterior, 0.721 to 0.719). Not refused: an ``(N, C)`` tensor may be the mean of as many."""
    if ood_p.shape[0] != p.shape[0]:
        warn_caller(
            f"ood holds {ood_p.shape[0]} draw(s) per input and the in-distribution predictions "
            f"{p.shape[0]}: {what} scores the mean prediction, which is less certain the more "
            "draws it averages where they disagree, so the OOD metrics lean toward calling "
            "the set of more draws OOD. Predict the OOD inputs with the same model and "
            "num_samples; an (N, C) tensor counts as one draw (if it is the mean of as many "
            "draws as the other set, the scores compare and this warning can be ignored)."
        )


def label_shape_fix(
    shape: tuple[int, ...],
    n: int,
    c: int,
    name: str,
    dtype: torch.dtype | None = None,
    otherwise: str = "pass the labels of exactly the inputs that were predicted",
) -> str:
    """What to do with labels of ``shape`` (and ``dtype``) where ``(n,)`` labels of ``c``
    classes are expected: one-hot rows take their argmax (bool ones as long: torch has no
    argmax of bools); a column ``(n, 1)`` (or a row) of the n labels, or the one
    label of one input as a 0-d tensor (``y[i]``), a reshape (it was told to pass the labels of
    the inputs predicted, which it held); any other shape, ``otherwise``."""
    if tuple(shape) == (n, c):  # one-hot rows (torch: "argmax(): does not support bool input")
        rows = f"{name}.long()" if dtype == torch.bool else name
        return f"one-hot targets? pass their class indices, {rows}.argmax(-1)"
    if not tuple(shape) and n == 1:  # the label of the one input predicted, y[i]
        return f"one label as a 0-d tensor (y[i])? pass it as one dim, {name}.reshape(-1)"
    if len(shape) > 1 and math.prod(shape) == n and n in shape:  # (not (2, 3) for 6)
        return f"labels in a column (or a row)? pass them as one dim, {name}.reshape(-1)"
    return otherwise
