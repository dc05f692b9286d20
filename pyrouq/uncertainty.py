"""Uncertainty decompositions of predictive distributions (pure torch: tensors in, tensors out).

Shape convention, used throughout: ``probs`` is an ``(S, N, C)`` tensor of probabilities, with
S posterior draws or ensemble members, N inputs and C classes. ``p_s`` is the predictive
distribution of draw ``s`` on one input and ``p̄ = mean_s p_s`` the mean predictive distribution.

Each measure splits the total uncertainty of ``p̄`` into an aleatoric part (the uncertainty the
draws have on average: noise in the data) and an epistemic part (the disagreement between draws:
uncertainty about the weights), with ``total = aleatoric + epistemic``.

This module never imports Pyro, arviz, matplotlib or the models: it works on any probabilities.

Examples
--------
>>> import torch
>>> probs = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # two confident members that disagree
>>> d = decompose(probs, base=2)
>>> d.total.tolist(), d.aleatoric.tolist(), d.epistemic.tolist()
([1.0], [0.0], [1.0])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from pyrouq._meta_device import refuse_meta
from pyrouq._mixture_terms import mixture_mean
from pyrouq._numbers import is_integer, is_real, tensor_hint
from pyrouq._words import slip_hint

__all__ = [
    "Decomposition",
    "Measure",
    "decompose",
    "entropy",
    "expected_entropy",
    "mutual_information",
]

Measure = Literal["entropy", "variance", "zero_one", "zero-one"]
"""The uncertainty measure of :func:`decompose`.

* ``"entropy"``: Shannon entropy; the epistemic part is the mutual information (BALD).
* ``"variance"``: the Gini impurity ``sum_c p_c (1 - p_c)``; the epistemic part is the summed
  variance over draws of the class probabilities.
* ``"zero_one"`` (or ``"zero-one"``): the expected 0-1 loss of the Bayes-optimal decision,
  ``1 - max_c p_c``.
"""

_MEASURES: tuple[str, ...] = get_args(Measure)

#: Relative tolerance on ``sum_c p_c = 1`` in the input checks (float32 softmax outputs pass).
_SUM_TOL = 1e-3

#: The epistemic parts are >= 0 mathematically; a negative value is float round-off, clamped to
#: 0. Anything more negative than this (in nats) is not round-off but a bug, and raises.
_ROUNDOFF_TOL = 1e-6

_SHAPE_NAMES = {1: "(N,)", 2: "(N, C)", 3: "(S, N, C)"}


@dataclass(frozen=True, eq=False)
class Decomposition:
    """A split of predictive uncertainty into its aleatoric and epistemic parts.

    ``total = aleatoric + epistemic`` holds for every input (up to the rounding of one float
    addition). All three parts are ``>= 0``. Equality is identity (``eq=False``): compare the
    fields with :func:`torch.allclose`.

    Attributes
    ----------
    total : Tensor
        ``(N,)`` uncertainty of the mean predictive distribution ``p̄``.
    aleatoric : Tensor
        ``(N,)`` average uncertainty of the individual draws ``p_s``.
    epistemic : Tensor
        ``(N,)`` the difference: disagreement between the draws (exactly ``0`` when S = 1 or
        when all draws agree).

    Examples
    --------
    >>> import torch
    >>> probs = torch.tensor([[[0.9, 0.1]], [[0.1, 0.9]]])  # S = 2 confident draws disagree
    >>> decompose(probs, "zero_one")  # total 1 - 0.5, aleatoric mean(1 - 0.9)
    Decomposition(total=[0.5], aleatoric=[0.1], epistemic=[0.4])

    Its repr is one short line: up to 4 inputs' values (to 4 significant digits); for more,
    their number and each part's mean and range (the attributes hold every value):

    >>> a = torch.linspace(0.5, 1.0, 41, dtype=torch.float64)  # from agreeing to opposed
    >>> probs = torch.stack([torch.stack([a, 1 - a], -1), torch.stack([1 - a, a], -1)])
    >>> decompose(probs, "zero_one")  # doctest: +NORMALIZE_WHITESPACE
    Decomposition(N=41, total=<mean 0.5, 0.5 to 0.5>, aleatoric=<mean 0.25, 0 to 0.5>,
                  epistemic=<mean 0.25, 0 to 0.5>)
    """

    total: Tensor
    aleatoric: Tensor
    epistemic: Tensor

    def __post_init__(self) -> None:
        parts = {"total": self.total, "aleatoric": self.aleatoric, "epistemic": self.epistemic}
        for name, part in parts.items():
            if not isinstance(part, Tensor):
                raise TypeError(
                    f"Expected {name} to be a torch.Tensor, got {type(part).__name__}; a "
                    "Decomposition is made by decompose() or Predictions.uncertainty()."
                )
        shapes = {name: tuple(part.shape) for name, part in parts.items()}
        if len(set(shapes.values())) > 1:
            raise ValueError(
                f"Expected total, aleatoric and epistemic of one shape (N,), got {shapes}; a "
                "Decomposition is made by decompose() or Predictions.uncertainty()."
            )

    def __repr__(self) -> str:
        # (each value for up to 4 inputs; for more, their number and each part's mean and
        # range: one short line where the dataclass's shows three whole tensors)
        parts = {"total": self.total, "aleatoric": self.aleatoric, "epistemic": self.epistemic}
        shape = tuple(self.total.shape)
        lead = f"N={shape[0]}, " if len(shape) == 1 and shape[0] > _REPR_VALUES else ""
        if len(shape) != 1:  # (made by hand of another shape: shown by it)
            lead = f"shape={shape}, "
        shown = ", ".join(f"{name}={_shown_part(part)}" for name, part in parts.items())
        return f"Decomposition({lead}{shown})"


#: Inputs up to which a Decomposition's repr shows each value.
_REPR_VALUES = 4


def _shown_part(part: Tensor) -> str:
    """``[v, ...]`` for up to :data:`_REPR_VALUES` values of a 1-D part, else ``<mean m, lo to
    hi>``; ``<meta>`` for a part on the meta device, which holds no values to show."""
    if part.is_meta:
        return "<meta>"
    values = part.detach().to("cpu", torch.float64)
    if values.ndim == 1 and values.numel() <= _REPR_VALUES:
        return "[" + ", ".join(f"{v:.4g}" for v in values.tolist()) + "]"
    if not values.numel():
        return "<empty>"
    mean, lo, hi = values.mean().item(), values.min().item(), values.max().item()
    return f"<mean {mean:.4g}, {lo:.4g} to {hi:.4g}>"


def decompose(probs: Tensor, measure: Measure = "entropy", base: float = math.e) -> Decomposition:
    r"""Decompose the uncertainty of S predictive distributions on N inputs.

    With ``p_s`` the S distributions of one input and ``p̄`` their mean over S:

    * ``"entropy"``: total ``= H(p̄)``, aleatoric ``= mean_s H(p_s)`` (expected entropy),
      epistemic ``= H(p̄) - mean_s H(p_s)``, the mutual information between the label and the
      draw. ``H(p) = -sum_c p_c log p_c`` with ``0 log 0 = 0``, in nats (``base=e``) or bits
      (``base=2``): every entropy is divided by ``log(base)``. The epistemic part is computed in
      the equivalent form ``mean_s KL(p_s || p̄)``, which does not lose precision when the draws
      nearly agree.
    * ``"variance"``: total ``= sum_c p̄_c (1 - p̄_c)``, aleatoric
      ``= mean_s sum_c p_sc (1 - p_sc)``, epistemic ``= sum_c Var_s(p_sc)`` (population variance,
      divided by S).
    * ``"zero_one"``: total ``= 1 - max_c p̄_c``, aleatoric ``= mean_s (1 - max_c p_sc)``,
      epistemic ``= mean_s max_c p_sc - max_c p̄_c``.

    The aleatoric and epistemic parts are computed, and ``total`` is their sum, so the identity
    ``total = aleatoric + epistemic`` holds up to one rounding; ``total`` matches the direct
    formula above to float precision. The epistemic part is ``>= 0`` mathematically; negative
    round-off (at most ``1e-6`` nats) is clamped to 0, and anything beyond that raises a
    ``RuntimeError`` (it would be a bug, not round-off).

    Parameters
    ----------
    probs : Tensor
        ``(S, N, C)`` probabilities, float32 or float64, each row summing to 1 (within 1e-3).
        The result has the same dtype and device.
    measure : {"entropy", "variance", "zero_one"}, default "entropy"
        The uncertainty measure, see above (``"zero-one"`` is ``"zero_one"``).
    base : float, default math.e
        Logarithm base of the entropies (``2`` for bits). Must be ``> 1`` (below 1 every
        entropy would be negative); used only by ``"entropy"``.

    Returns
    -------
    Decomposition
        ``total``, ``aleatoric`` and ``epistemic``, each of shape ``(N,)``.

    Examples
    --------
    >>> probs = torch.tensor([[[0.9, 0.1], [0.5, 0.5]], [[0.1, 0.9], [0.5, 0.5]]])  # S=2, N=2
    >>> d = decompose(probs, "variance")
    >>> [round(v, 4) for v in d.epistemic.tolist()], [round(v, 4) for v in d.total.tolist()]
    ([0.32, 0.0], [0.5, 0.5])
    >>> [round(v, 4) for v in decompose(probs, "zero_one").aleatoric.tolist()]
    [0.1, 0.5]
    """
    _check_probs(probs)
    _check_measure(measure)
    _check_base(base)
    if measure == "entropy":
        log_probs = _clamped_log(probs)
        aleatoric = _negate((probs * log_probs).sum(-1)).mean(0)  # 0 log 0 = 0
        mean = mixture_mean(probs)
        # p̄_c > 0 wherever some p_sc > 0; the clamp only guards an underflow of the mean.
        log_mean = _clamped_log(mean)
        # mean_s KL(p_s || p̄), both logs by one kernel: draws that agree (S = 1, a plain
        # network) give exactly 0, not the rounding of two ways of computing p log p
        if log_probs.requires_grad:
            epistemic = (probs * (log_probs - log_mean)).sum(-1).mean(0)
        else:  # the same numbers in log_probs' place (two fewer tensors the size of probs)
            epistemic = log_probs.sub_(log_mean).mul_(probs).sum(-1).mean(0)
        epistemic = _clamp_roundoff(epistemic, measure)
        scale = math.log(base)
        aleatoric, epistemic = aleatoric / scale, epistemic / scale
    elif measure == "variance":
        aleatoric = (probs * (1 - probs)).sum(-1).mean(0)
        epistemic = _clamp_roundoff(probs.var(0, correction=0).sum(-1), measure)
    else:
        max_s = mixture_mean(probs.amax(-1))
        aleatoric = 1 - max_s
        epistemic = _clamp_roundoff(max_s - mixture_mean(probs).amax(-1), measure)
    return Decomposition(total=aleatoric + epistemic, aleatoric=aleatoric, epistemic=epistemic)


def entropy(probs: Tensor, dim: int = -1, base: float = math.e) -> Tensor:
    """Shannon entropy ``H(p) = -sum_c p_c log p_c / log(base)`` along ``dim`` (``0 log 0 = 0``).

    Parameters
    ----------
    probs : Tensor
        Probabilities of any shape, float32 or float64, summing to 1 (within 1e-3) along ``dim``.
    dim : int, default -1
        The class dimension, reduced away.
    base : float, default math.e
        Logarithm base: ``e`` for nats, ``2`` for bits.

    Returns
    -------
    Tensor
        ``probs`` with ``dim`` removed, same dtype and device.

    Examples
    --------
    >>> entropy(torch.tensor([[0.5, 0.5], [1.0, 0.0]]), base=2).tolist()
    [1.0, 0.0]
    """
    _check_probs(probs, ndim=None, dim=dim)
    _check_base(base)
    return _negate((probs * _clamped_log(probs)).sum(dim)) / math.log(base)


def expected_entropy(probs: Tensor, base: float = math.e) -> Tensor:
    """Aleatoric part of the entropy decomposition: ``mean_s H(p_s)``, shape ``(N,)``.

    Same as ``decompose(probs, "entropy", base).aleatoric``; see :func:`decompose`.

    Examples
    --------
    >>> expected_entropy(torch.tensor([[[0.5, 0.5]], [[1.0, 0.0]]]), base=2).tolist()
    [0.5]
    """
    return decompose(probs, "entropy", base).aleatoric


def mutual_information(probs: Tensor, base: float = math.e) -> Tensor:
    """Epistemic part of the entropy decomposition: ``H(p̄) - mean_s H(p_s)``, shape ``(N,)``.

    Same as ``decompose(probs, "entropy", base).epistemic``; see :func:`decompose`.

    Examples
    --------
    >>> probs = torch.tensor([[[0.5, 0.5]], [[1.0, 0.0]]], dtype=torch.float64)
    >>> mutual_information(probs, base=2).tolist()  # H([.75, .25]) - (1 + 0) / 2
    [0.31127812445913283]
    """
    return decompose(probs, "entropy", base).epistemic


# ---------------------------------------------------------------------------------------------
# Input checks, shared with pyrouq.metrics.


def _shape_name(ndim: int) -> str:
    return _SHAPE_NAMES.get(ndim, f"({ndim} dims)")


def _check_probs(
    probs: object,
    name: str = "probs",
    ndim: int | tuple[int, ...] | None = 3,
    *,
    dim: int = -1,
) -> None:
    """Check that ``probs`` is a float tensor of probabilities of the expected rank.

    Parameters
    ----------
    probs : object
        The value to check.
    name : str, default "probs"
        Its name in the messages.
    ndim : int or tuple of int or None, default 3
        The allowed number of dimensions (``None``: any rank >= 1).
    dim : int, default -1
        The class dimension, along which entries must sum to 1 (within 1e-3).

    Raises
    ------
    TypeError
        Not a tensor, or not float32 / float64.
    ValueError
        Wrong rank, empty, on the meta device, non-finite, negative, above 1 or not
        normalised.
    """
    if not isinstance(probs, Tensor):
        kind = type(probs).__name__
        if hasattr(probs, "loc") and hasattr(probs, "scale"):  # GaussianPredictions
            fix = (
                "a Gaussian likelihood's predictions: split their variance with "
                "predictions.uncertainty()"
            )
        elif isinstance(getattr(probs, "probs", None), Tensor):  # Predictions
            fix = f"pass its (S, N, C) tensor, {name}.probs, or call its .uncertainty(measure)"
        else:
            fix = "wrap it with torch.as_tensor(...)"
        raise TypeError(f"Expected {name} to be a torch.Tensor, got {kind}; {fix}.")
    if probs.dtype not in (torch.float32, torch.float64):
        raise TypeError(
            f"Expected {name} of dtype torch.float32 or torch.float64, got {probs.dtype}; "
            f"convert it with {name}.double() (or .float())."
        )
    shape = tuple(probs.shape)
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if probs.dim() not in allowed:
            wanted = " or ".join(f"{_shape_name(k)} ({k} dims)" for k in allowed)
            hint = (
                f" For the (N, C) probabilities of one draw pass {name}.unsqueeze(0)."
                if allowed == (3,) and probs.dim() == 2
                else ""
            )
            if _class_one(probs) and (2 in allowed or 3 in allowed):  # no class dim
                both = "torch.stack([1 - p, p], dim=-1)" + ("" if 2 in allowed else "[None]")
                hint = (
                    f" A binary classifier's (N,) probabilities p of class 1 (a sigmoid's)? "
                    f"Pass both classes, {both}."
                )
            raise ValueError(
                f"Expected {name} of shape {wanted}, got shape {shape}. "
                f"Stack the draws/members on dim 0 and the classes on the last dim.{hint}"
            )
    elif probs.dim() == 0:
        raise ValueError(f"Expected {name} with a class dimension, got a scalar (shape ()).")
    if not is_integer(dim) or not -probs.dim() <= dim < probs.dim():
        raise ValueError(
            f"Expected dim to be an integer in [{-probs.dim()}, {probs.dim() - 1}], a dimension "
            f"of {name} (shape {shape}), got {dim!r}. Pass its class dimension, e.g. dim=-1."
        )
    if probs.numel() == 0:
        raise ValueError(
            f"Expected a non-empty {name}, got shape {shape}; "
            "pass at least one draw, one input and one class."
        )
    refuse_meta(  # (torch's own error: "Tensor.item() cannot be called on meta tensors")
        probs,
        name,
        "there are no probabilities to check. Pass the model's predictions, made with its "
        "weights loaded on a real device.",
        got="them",
    )
    probs = probs.detach()  # read numbers off, nothing differentiated (torch warns otherwise)
    # NaN and +-inf show in the extremes: no mask the size of probs (isfinite's took 1.75x it)
    low, high = (float(v) for v in torch.aminmax(probs))
    if not (math.isfinite(low) and math.isfinite(high)):
        mask = ~torch.isfinite(probs)
        at = ""
        if probs.dim() in (2, 3) and dim in (-1, probs.dim() - 1):  # ((S,) N, C): inputs
            rows = mask.movedim(-2, 0).reshape(probs.shape[-2], -1).any(-1).nonzero()[:, 0]
            shown = ", ".join(map(str, rows[:5].tolist())) + (", ..." if len(rows) > 5 else "")
            at = f" of inputs [{shown}] ({len(rows)} of {probs.shape[-2]} inputs; "
        raise ValueError(
            f"Expected finite {name}, got {int(mask.sum())} NaN or inf entries; "
            f"check the model outputs{at or ' ('}did the fit diverge?)."
        )
    if probs.shape[dim] == 1 and (low < 1 - _SUM_TOL or high > 1 + _SUM_TOL):
        # one class: a binary classifier's one column, which the fixes below (a softmax, a
        # division by the sum) would make 1 everywhere, one certain class whatever the input
        given = (
            "probabilities p of class 1 (a sigmoid's)? Pass both classes, "
            f"torch.cat([1 - p, p], dim={dim})"
            if 0 <= low and high <= 1
            else "logits z of class 1 (one output)? Pass both classes' probabilities, "
            f"torch.cat([1 - p, p], dim={dim}) with p = torch.sigmoid(z)"
        )
        raise ValueError(
            f"Expected {name} over the classes, summing to 1 over the class dim {dim}, got one "
            f"class (shape {shape}) with values between {low:.6g} and {high:.6g}: a binary "
            f"classifier's {given}; a softmax over one class, or a division by its sum, would "
            "make every probability 1."
        )
    if low < 0:
        raise ValueError(
            f"Expected {name} to be non-negative probabilities, got a minimum of {low:.4g}. "
            "If these are logits or log-probabilities, apply torch.softmax(x, dim=-1) first."
        )
    sums = probs.sum(dim)
    lo, hi = float(sums.min()), float(sums.max())
    if lo < 1 - _SUM_TOL or hi > 1 + _SUM_TOL:
        raise ValueError(
            f"Expected {name} to sum to 1 over the class dim {dim} (tolerance {_SUM_TOL:g}), "
            f"got sums between {lo:.6g} and {hi:.6g}. If these are logits, apply "
            "torch.softmax(x, dim=-1); if they are unnormalised weights, divide by "
            "x.sum(-1, keepdim=True)."
        )
    if high > 1:  # rows within the sum tolerance may still hold one: negative entropies
        raise ValueError(
            f"Expected {name} to be probabilities of at most 1, got a maximum of {high:.6g}. "
            "Normalise them exactly: x / x.sum(-1, keepdim=True)."
        )


def _class_one(probs: Tensor) -> bool:
    """Whether ``probs`` may be a binary classifier's ``(N,)`` probabilities of class 1: one
    dim of values in [0, 1] that do not sum to 1 (those that do may be one input's)."""
    if probs.dim() != 1 or not probs.numel() or probs.is_meta:
        return False
    p = probs.detach()
    return bool(((p >= 0) & (p <= 1)).all()) and abs(float(p.sum()) - 1) > _SUM_TOL


def _check_measure(measure: object) -> None:
    if measure not in _MEASURES:
        hint = slip_hint(measure, _MEASURES)
        raise ValueError(
            f"Unknown measure {measure!r}{hint}; expected one of {', '.join(map(repr, _MEASURES))}."
        )


def _check_base(base: object) -> None:
    # comparisons, not math.isfinite: a huge int (10**400) is a valid base, and NaN fails them
    if not is_real(base) or not 1 < base < math.inf:
        why = tensor_hint(base) or _base_reason(base)
        raise ValueError(
            f"Expected a logarithm base > 1, got {base!r}{why}; use math.e for nats (the "
            "default) or 2 for bits."
        )


def _base_reason(base: object) -> str:
    if not is_real(base):
        return f" (a {type(base).__name__}, not a real number)"
    if base != base:
        return " (NaN)"
    if base == math.inf:
        return " (an infinite base makes every uncertainty 0)"
    if base == 1:
        return " (log 1 is 0: every uncertainty would divide by it)"
    if base <= 0:
        return " (a logarithm needs a positive base)"
    return " (a base below 1 makes every uncertainty negative)"


def _clamped_log(p: Tensor) -> Tensor:
    """``log max(p, tiny)``: ``p * _clamped_log(p)`` is ``p log p`` with ``0 log 0 = 0`` and a
    finite gradient at ``p = 0`` (``torch.xlogy(p, p)``'s is NaN there, and turns every
    gradient through a softmax that rounded a class to exactly 0 into NaN)."""
    clamped = p.clamp_min(torch.finfo(p.dtype).tiny)
    # in place where no gradient reads it: one tensor the size of p at a time, not two
    return torch.log(clamped) if clamped.requires_grad else clamped.log_()


def _negate(x: Tensor) -> Tensor:
    """``-x`` without negative zeros (``-0.0 + 0.0 == +0.0``), so zero entropies print as 0.0."""
    return x.neg().add_(0.0)


def _clamp_roundoff(epistemic: Tensor, measure: str) -> Tensor:
    """Clamp float round-off below 0 (at most ``_ROUNDOFF_TOL``) and raise on anything larger."""
    worst = float(epistemic.detach().min())  # (torch warns on a scalar read off a graph)
    if worst < -_ROUNDOFF_TOL:
        raise RuntimeError(
            f"Internal error: the epistemic part of the {measure!r} decomposition is {worst:.3g}, "
            f"below -{_ROUNDOFF_TOL:g}. It is >= 0 mathematically, so this is not round-off; "
            "please report it to the pyrouq developers together with the input probabilities."
        )
    return epistemic.clamp_min(0)
