"""Classification: :class:`Categorical`, logits observed against integer labels."""

from __future__ import annotations

from typing import Any

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from torch import Tensor

from pyrouq._metric_inputs import WIDE_UNSIGNED
from pyrouq.likelihoods._base import (
    Likelihood,
    along_inputs,
    check_batched,
    check_device,
    widened,
)

_NO_LABEL = -(2**63)
"""``ignore_index`` for ``F.cross_entropy``: no label is ignored (every one is checked)."""


def judged(outputs: Any, *, pooled: bool = False) -> bool:
    """Whether :func:`are_probabilities` can tell from ``outputs`` ``(..., B, C)``: floating,
    C >= 2, and enough inputs that logits are not taken for probabilities by chance: two
    (one row of honest float32 logits sums to 1 within the tolerance about once in 1e5 to
    1e6), four in a half-precision dtype (one row of 2 in bfloat16: 3 in 1,000). With
    ``pooled``, one input is enough: rows to be pooled with other batches' until they tell."""
    if not torch.is_tensor(outputs) or outputs.dim() < 2 or not outputs.is_floating_point():
        return False
    least = 1 if pooled else 4 if _half(outputs) else 2
    return outputs.shape[-1] >= 2 and outputs.shape[-2] >= least


def _half(outputs: Any) -> bool:
    """Whether ``outputs`` are floating, of a half-precision dtype (16 bits or fewer)."""
    return bool(
        torch.is_tensor(outputs)
        and outputs.is_floating_point()
        and torch.finfo(outputs.dtype).bits <= 16
    )


def _integer(y: Tensor) -> bool:
    """Whether ``y`` has an integer dtype (not bool): labels the fast NLL scores as they are."""
    return not (y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex())


def are_probabilities(outputs: Any, *, pooled: bool = False) -> bool:
    """Whether ``outputs`` ``(..., B, C)`` are class probabilities rather than logits:
    floating, C >= 2, every row in [0, 1] and summing to 1 to within rounding (a softmax's, or
    a ``probs``). Summed in float32 at least: a softmax's rounding to the dtype moves the sum
    by at most a few of its eps (bfloat16's 0.0078), its computation and this sum by ~C eps of
    float32's (16 C eps of a half dtype, 0.25 for bfloat16 and C = 2, took ReLU scores
    summing to 0.3 for probabilities). ``pooled``: of any number of inputs (see
    :func:`judged`), rows that a caller pools with other batches' before it tells."""
    if not judged(outputs, pooled=pooled):
        return False
    num_classes = outputs.shape[-1]
    rows = outputs.detach().reshape(-1, num_classes)
    if not bool(((rows >= 0) & (rows <= 1)).all()):
        return False
    wide = torch.promote_types(rows.dtype, torch.float32)
    tolerance = 16 * num_classes * torch.finfo(wide).eps + 4 * torch.finfo(rows.dtype).eps
    return bool(((rows.to(wide).sum(-1) - 1).abs() <= tolerance).all())


_UNBATCHED = (
    "Give them a batch dim: logits.unsqueeze(0) if they are one input's C logits (its label "
    "then y of shape (1,))."
)
"""How to give :meth:`Categorical.nll` logits without a batch dim one."""


class Categorical(Likelihood):
    """Classification: outputs are logits ``(*S, B, C)``, targets integer labels ``(B,)`` in
    ``[0, C)``.

    The observation is ``Categorical(logits=outputs)``; the fast NLL is
    ``F.cross_entropy(..., reduction="sum")``; predictions are ``softmax(outputs)``; all three
    in float32 for half-precision logits (float64 stays).

    Examples
    --------
    >>> import torch
    >>> lik = Categorical()
    >>> logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    >>> round(lik.nll(logits, torch.tensor([0, 1])).item(), 4)
    0.4402
    >>> lik.predictive(logits).argmax(-1)
    tensor([0, 1])
    """

    name = "categorical"
    output_site = "logits"
    default_kl_weight = 0.02
    _outputs_checked = False  # prepare() refuses class probabilities once, when it can tell

    def prepare(self, outputs: Tensor) -> None:
        """Refuse, on the first outputs of enough inputs to tell (:func:`pyrouq.fit` shows it
        a couple of training examples before it trains), class probabilities in place of
        logits: see :meth:`refuse_probabilities`. Later calls (every step) check nothing."""
        if not self._outputs_checked:
            self._outputs_checked = self.refuse_probabilities(outputs, "The network")

    def __getstate__(self) -> dict[str, Any]:
        # a copy checks again: bayesian(other_net, likelihood=model.likelihood) deep-copies a
        # likelihood that saw another network's outputs (and so does pickling)
        state = dict(super().__getstate__())
        state.pop("_outputs_checked", None)
        return state

    @staticmethod
    def refuse_probabilities(outputs: Any, who: str) -> bool:
        """Raise a ``ValueError`` if ``outputs`` ``(..., B, C)`` are class probabilities, not
        logits: floating, C >= 2, every row in [0, 1] and summing to 1 to within rounding (a
        forward that ends in a softmax). The likelihood applies the softmax itself, so such
        a network would be trained on a softmax of its probabilities and predict() would
        flatten them towards uniform. Log-probabilities (``nn.LogSoftmax``) are logits.
        ``who`` begins the message (``"predict(): ResNet"``). Returns whether the outputs
        were enough to tell (:func:`judged`: too few inputs are not checked)."""
        if not are_probabilities(outputs):
            return judged(outputs)
        raise ValueError(
            f"{who} returned class probabilities, not logits: every row of its "
            f"outputs of shape {tuple(outputs.shape)} is in [0, 1] and sums to 1 (does its "
            "forward end in a softmax, or in a sigmoid of 2 outputs?). The categorical "
            "likelihood applies the softmax itself: fit() would train on a softmax of the "
            "probabilities and predict() would flatten them towards uniform. Return the "
            "logits: drop the final nn.Softmax / torch.softmax (or nn.Sigmoid; "
            "log-probabilities, nn.LogSoftmax, are fine)."
        )

    def check_targets(self, y: Any, outputs: Tensor, where: str) -> None:
        check_batched(outputs, where, "logits", "C", _UNBATCHED)
        if not self._outputs_checked and _half(outputs):  # fit() probes 2 examples, which
            self.prepare(outputs)  # half-precision outputs need 4 of (its steps skip prepare)
        batch, num_classes = outputs.shape[-2], outputs.shape[-1]
        if not torch.is_tensor(y):
            raise TypeError(
                f"{where}: expected labels y as a torch.Tensor, got {type(y).__name__}. Convert "
                "them with torch.as_tensor(y)."
            )
        check_device(y, outputs, where)
        if y.shape != (batch,):
            one_hot = ""
            if y.shape == (batch, num_classes) and num_classes > 1:
                cast = ".long()" if y.dtype == torch.bool else ""  # (no argmax of bools)
                one_hot = f" (one-hot labels: y{cast}.argmax(-1))"
            elif y.shape == (batch, 1):
                one_hot = " (a column of labels: y.squeeze(-1))"
            raise ValueError(
                f"{where}: expected labels y of shape ({batch},) to match the {batch} inputs, got "
                f"shape {tuple(y.shape)}. Pass one integer label per input{one_hot}."
            )
        problem = self.label_problem(y, num_classes if is_validation_enabled() else None)
        if problem is not None:
            raise ValueError(
                f"{where}: {problem}. Check the targets or the model's number of classes."
            )
        if num_classes < 2:  # labels all 0: every log-likelihood is 0, nothing would be learned
            raise ValueError(
                f"{where}: got logits of one class (outputs of shape {tuple(outputs.shape)}): "
                "every probability is 1 and every log-likelihood 0, so nothing would be "
                "learned, and predict() refuses such logits. A classifier needs C >= 2 logits "
                "(a binary task: give the last layer 2 outputs); a regression model takes a "
                "Gaussian likelihood, e.g. bayesian(net, likelihood='gaussian')."
            )

    @staticmethod
    def label_problem(y: Tensor, num_classes: int | None) -> str | None:
        """What is wrong with ``y`` as class labels of ``num_classes`` classes (its dtype, or
        values outside ``[0, C)``; the range is not checked when ``num_classes`` is None), or
        None: the one label check that models, :func:`pyrouq.fit` and the diagnostics share."""
        if (y.dtype.is_floating_point or y.dtype == torch.bool) and _one_hot(y, num_classes):
            pick = "y.long().argmax(dim=1)" if y.dtype == torch.bool else "y.argmax(dim=1)"
            return (  # (y.long() would be refused next for its shape; argmax takes no bool)
                f"one-hot labels of dtype {y.dtype} and shape {tuple(y.shape)}, expected class "
                f"indices of shape ({y.shape[0]},) in an integer dtype: pass {pick}"
            )
        if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
            regression = (
                "; real-valued targets are regression, for a model built with "
                "likelihood='gaussian' (bayesian(net, likelihood='gaussian') or "
                "batchensemble(net, M, likelihood='gaussian'))"
                if y.dtype.is_floating_point
                else ""
            )
            return (
                f"labels of dtype {y.dtype}, expected an integer dtype (class indices: "
                f"y.long(){regression})"
            )
        if y.dtype in WIDE_UNSIGNED:  # torch's "min_all" not
            return (  # implemented, or "Promotion ... not supported" when compared to guesses
                f"labels of dtype {y.dtype}, which torch can neither take the minimum of nor "
                "compare with int64 predictions, expected int64 class indices: pass y.long()"
            )
        if y.numel() and num_classes is not None:
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= num_classes:
                one = (
                    " (a network with one output is a single logit: the Categorical likelihood "
                    "takes one output per class, so give its last layer 2 outputs for a binary "
                    "task)"
                    if num_classes == 1
                    else ""
                )
                return (
                    f"labels in [{low}, {high}], expected class indices in "
                    f"[0, {num_classes - 1}] for a model with {num_classes} classes{one}"
                )
        return None

    def target_problem(self, y: Tensor, num_outputs: int | None) -> str | None:
        return self.label_problem(y, num_outputs)

    def distribution(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> dist.TorchDistribution:
        return dist.Categorical(logits=widened(outputs))

    def nll(self, outputs: Tensor, y: Tensor, latent: dict[str, Tensor] | None = None) -> Tensor:
        if (
            not torch.is_tensor(y)
            or outputs.dim() < 2
            or y.shape != outputs.shape[-2:-1]
            or not _integer(y)  # float labels were truncated to classes by .long() below
            or outputs.shape[-1] < 2
        ):
            # labels (1,) would expand silently: one label for every input; (C,) logits of
            # one input are refused too (a scalar label would score them)
            self.check_targets(y, outputs, "Categorical.nll()")  # says what to pass
        flat = widened(outputs).reshape(-1, outputs.shape[-1])
        target = y.expand(outputs.shape[:-1]).reshape(-1)
        if target.dtype != torch.long:  # int32 / int16 labels (numpy's, often): the check let
            target = target.long()  # them through, and cross_entropy takes int64 or uint8 only
        try:  # no ignored label: cross_entropy's default (-100) would drop such rows silently
            return F.cross_entropy(flat, target, reduction="sum", ignore_index=_NO_LABEL)
        except IndexError as err:  # torch's "Target 2 is out of bounds." named no range
            # read from the int64 copy: torch has no min() of uint16 / uint32 / uint64 labels
            problem = self.label_problem(target, outputs.shape[-1])
            wrapped = y.dtype == getattr(torch, "uint64", None)  # (torch >= 2.3) by .long()
            if wrapped and bool((target < 0).any()):
                problem = (
                    f"labels of dtype torch.uint64 of 2**63 or more, expected class indices "
                    f"in [0, {outputs.shape[-1] - 1}] for a model with {outputs.shape[-1]} "
                    "classes"
                )
            if problem is None:
                raise
            raise ValueError(
                f"Categorical.nll(): {problem}. Check the targets or the model's number of classes."
            ) from err

    def predictive(self, outputs: Tensor, latent: dict[str, Tensor] | None = None) -> Tensor:
        if outputs.shape[-1] < 2:
            raise ValueError(
                f"predict() got logits of one class (outputs of shape {tuple(outputs.shape)}): "
                "every probability would be 1. A classifier needs C >= 2 logits; a regression "
                "model takes a Gaussian likelihood, e.g. bayesian(net, likelihood='gaussian'), "
                "and predict() then returns GaussianPredictions."
            )
        # half-precision logits are promoted to float32 (a stable softmax); float64 stays
        return torch.softmax(widened(outputs), -1)

    def predictions(self, parts: list[Any], targets: Tensor | None) -> Any:
        from pyrouq.predictive import Predictions

        return Predictions(along_inputs(parts), targets)


def _one_hot(y: Tensor, num_classes: int | None) -> bool:
    """Whether ``y`` holds one-hot rows ``(N, C)`` (C the model's classes, where known; 2 or
    more): 0 and 1 only, one 1 per row."""
    if y.dim() != 2 or not y.shape[0] or y.shape[1] < 2:
        return False
    if num_classes is not None and y.shape[1] != num_classes:
        return False
    ones = y == 1
    return bool((ones | (y == 0)).all()) and bool((ones.sum(1) == 1).all())
