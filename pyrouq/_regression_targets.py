"""The checks of a Gaussian regression's real targets (:class:`pyrouq.GaussianPredictions`'s
and :func:`pyrouq.conformal`'s): a tensor on a real device, floating, one value per input and
output, finite; each refusal names the argument the targets came as and says what to do."""

from __future__ import annotations

import math

from torch import Tensor

from pyrouq._meta_device import refuse_meta


def check_regression_targets(targets: object, n: int, d: int, name: str = "targets") -> Tensor:
    """``targets`` as an ``(n, d)`` floating tensor (``(n,)`` taken for ``d = 1``), or a
    TypeError / ValueError naming ``name``, the argument they came as."""
    if not isinstance(targets, Tensor):
        raise TypeError(
            f"Expected {name} to be a torch.Tensor, got {type(targets).__name__}; wrap "
            "them with torch.as_tensor(...)."
        )
    refuse_meta(  # (torch's own error: "register_meta function for torch.nonzero()")
        targets,
        name,
        f"there are no {name} to check. Pass the targets themselves (on the cpu, or the "
        "device of loc).",
    )
    if not targets.is_floating_point():
        raise TypeError(
            f"Expected real {name} (a floating dtype), got {targets.dtype}: class labels "
            f"belong to a classifier's Predictions; for real targets use {name}.float()."
        )
    shaped = targets.unsqueeze(-1) if targets.dim() == 1 and d == 1 else targets
    if tuple(shaped.shape) != (n, d):
        raise ValueError(
            f"Expected {name} of shape ({n}, {d})"
            + (f" or ({n},)" if d == 1 else "")
            + f", one per input and output, got shape {tuple(targets.shape)}"
            + _shape_fix(tuple(targets.shape), n, d, name)
            + "."
        )
    bad = (~shaped.isfinite()).any(-1).nonzero()[:, 0]
    if bad.numel():
        raise ValueError(
            f"Expected finite {name}, got NaN or inf in {bad.numel()} of {n} rows (rows "
            f"{bad[:5].tolist()}); remove or repair them."
        )
    return shaped


def _shape_fix(shape: tuple[int, ...], n: int, d: int, name: str) -> str:
    """What to do with targets of ``shape`` where ``(n, d)`` ones go: those of the inputs
    transposed (a row of one output's, too), ``.T``; the one target of one input as a 0-d
    tensor, a reshape; a row per input holding its ``d`` values in more dims (``(n, d, 1)``),
    a reshape; a row per input of another number of values, the outputs the model predicts;
    else to pass those of the inputs predicted."""
    if n != d and shape == (d, n):
        return (
            f". They hold an input per column: pass {name}.T (one row per input, one column "
            "per output)"
        )
    if shape == () and n == d == 1:
        return f". Pass it as one dim, {name}.reshape(-1)"
    if len(shape) > 2 and shape[0] == n and math.prod(shape[1:]) == d:
        return f". Pass them as one row per input, {name}.reshape({n}, {d})"
    if len(shape) in (1, 2) and shape[0] == n:  # a row per input, but not d values in it
        per_input = 1 if len(shape) == 1 else shape[1]
        return (
            f". They hold {per_input} value{'s' * (per_input != 1)} per input, the predictions "
            f"{d} output{'s' * (d != 1)}: pass the targets of the outputs the model predicts, "
            "one column per output"
        )
    return ". Pass the targets of exactly the inputs predicted, one row per input"
