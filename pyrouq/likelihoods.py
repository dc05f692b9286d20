"""Likelihoods: how a network's outputs meet the targets.

One object owns, for one kind of target, everything that used to be hard-coded as softmax and
cross-entropy across the package:

* how the targets are observed in a Pyro model (the ``"obs"`` site inside ``pyro.plate("data")``,
  scaled N/B, with the outputs recorded as a deterministic site);
* the fast negative log-likelihood that :func:`pyrouq.fit` back-propagates;
* the target checks (shape, dtype, range) with their error messages;
* how outputs become predictive distributions (:func:`pyrouq.predict`, the diagnostics).

Shape convention: outputs are ``(*S, B, D)``: leading sample dims S (weight draws or ensemble
members, possibly none), B inputs, D outputs (C classes for :class:`Categorical`).

Models take a likelihood as ``likelihood="categorical"`` or as an instance;
:func:`get_likelihood` maps the strings onto classes.
"""

from __future__ import annotations

from typing import Any, Literal

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from torch import Tensor

__all__ = ["Categorical", "Likelihood", "LikelihoodName", "get_likelihood"]

LikelihoodName = Literal["categorical"]


class Likelihood:
    """Base class of pyrouq likelihoods (see the module docstring for the contract).

    Subclasses set :attr:`name` (the string a user types) and :attr:`output_site` (the
    deterministic site holding the network's outputs) and implement the methods below.
    """

    name: str = ""
    output_site: str = "outputs"

    def check_targets(self, y: Any, outputs: Tensor, where: str) -> None:  # pragma: no cover
        """Raise a ``TypeError`` / ``ValueError`` naming ``where`` if ``y`` cannot be the
        targets of ``outputs`` ``(*S, B, D)``."""
        raise NotImplementedError

    def distribution(self, outputs: Tensor) -> dist.TorchDistribution:  # pragma: no cover
        """The observation distribution of every input, batch shape ``(*S, B)``."""
        raise NotImplementedError

    def nll(self, outputs: Tensor, y: Tensor) -> Tensor:  # pragma: no cover
        """``-sum log p(y | outputs)`` over the batch (and over S), unscaled: a scalar."""
        raise NotImplementedError

    def predictive(self, outputs: Tensor) -> Tensor:  # pragma: no cover
        """What :func:`pyrouq.predict` collects per draw (class probabilities for classifiers)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """A JSON description that :func:`get_likelihood` turns back into this likelihood."""
        return {"name": self.name}

    # ---------------------------------------------------------------------------------------

    def scale(self, num_data: int | None, batch: int, where: str) -> float:
        """N/B, the factor of a minibatch's log-likelihood, or a clear error when N is unset."""
        if num_data is None:
            raise ValueError(
                f"{where}.num_data is not set: the likelihood of a minibatch of B points is "
                "scaled by N/B, with N the training-set size. Pass num_data=N to the "
                "constructor, set model.num_data = N, or train with pyrouq.fit(), which sets it."
            )
        return num_data / max(batch, 1)

    def observe(
        self,
        outputs: Tensor,
        y: Tensor | None,
        num_data: int | None,
        where: str,
        members: int | None = None,
    ) -> Tensor:
        """Record ``outputs`` at :attr:`output_site` and observe ``y`` at ``"obs"``.

        The observation lies in ``pyro.plate("data", B)`` (dim -1) and, for ensembles, in
        ``pyro.plate("members", M)`` (dim -2); it is scaled by N/B so that a minibatch
        estimates the full-data log-likelihood. Without ``y`` nothing is scaled (prediction).
        Returns ``outputs``.
        """
        batch = outputs.shape[-2]
        scale = 1.0
        if y is not None:
            self.check_targets(y, outputs, where)
            scale = self.scale(num_data, batch, where)
        with pyro.plate("data", batch, dim=-1):
            if members is not None:
                with pyro.plate("members", members, dim=-2):
                    self._sample(outputs, y, scale)
            else:
                self._sample(outputs, y, scale)
        return outputs

    def _sample(self, outputs: Tensor, y: Tensor | None, scale: float) -> None:
        pyro.deterministic(self.output_site, outputs, event_dim=1)
        with pyro.poutine.scale(scale=scale):
            pyro.sample("obs", self.distribution(outputs), obs=y)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Categorical(Likelihood):
    """Classification: outputs are logits ``(*S, B, C)``, targets integer labels ``(B,)`` in
    ``[0, C)``.

    The observation is ``Categorical(logits=outputs)``; the fast NLL is
    ``F.cross_entropy(..., reduction="sum")``; predictions are ``softmax(outputs)``.

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

    def check_targets(self, y: Any, outputs: Tensor, where: str) -> None:
        batch, num_classes = outputs.shape[-2], outputs.shape[-1]
        if not torch.is_tensor(y):
            raise TypeError(
                f"{where}: expected labels y as a torch.Tensor, got {type(y).__name__}."
            )
        if y.shape != (batch,):
            raise ValueError(
                f"{where}: expected labels y of shape ({batch},) to match the {batch} inputs, got "
                f"shape {tuple(y.shape)}. Pass one integer label per input."
            )
        problem = self.label_problem(y, num_classes if is_validation_enabled() else None)
        if problem is not None:
            raise ValueError(
                f"{where}: {problem}. Check the targets (y.long() for class indices) or the "
                "model's number of classes."
            )

    @staticmethod
    def label_problem(y: Tensor, num_classes: int | None) -> str | None:
        """What is wrong with ``y`` as class labels of ``num_classes`` classes (its dtype, or
        values outside ``[0, C)``; the range is not checked when ``num_classes`` is None), or
        None: the one label check that models, :func:`pyrouq.fit` and the diagnostics share."""
        if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
            return f"labels of dtype {y.dtype}, expected an integer dtype (class indices)"
        if y.numel() and num_classes is not None:
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= num_classes:
                return (
                    f"labels in [{low}, {high}], expected class indices in "
                    f"[0, {num_classes - 1}] for a model with {num_classes} classes"
                )
        return None

    def distribution(self, outputs: Tensor) -> dist.TorchDistribution:
        return dist.Categorical(logits=outputs)

    def nll(self, outputs: Tensor, y: Tensor) -> Tensor:
        flat = outputs.reshape(-1, outputs.shape[-1])
        target = y.expand(outputs.shape[:-1]).reshape(-1)
        return F.cross_entropy(flat, target, reduction="sum")

    def predictive(self, outputs: Tensor) -> Tensor:
        return torch.softmax(outputs.float(), dim=-1)


_LIKELIHOODS: dict[str, type[Likelihood]] = {"categorical": Categorical}


def get_likelihood(spec: str | Likelihood | dict[str, Any]) -> Likelihood:
    """The likelihood named by ``spec``: a name (``"categorical"``), an instance (returned as is)
    or the :meth:`Likelihood.describe` dict of a checkpoint.

    Examples
    --------
    >>> get_likelihood("categorical")
    Categorical()
    """
    if isinstance(spec, Likelihood):
        return spec
    name = spec.get("name") if isinstance(spec, dict) else spec
    if not isinstance(name, str) or name not in _LIKELIHOODS:
        raise ValueError(
            f"Unknown likelihood {spec!r}: expected one of {sorted(_LIKELIHOODS)} or a "
            "pyrouq.likelihoods.Likelihood instance (e.g. pyrouq.likelihoods.Categorical())."
        )
    return _LIKELIHOODS[name]()
