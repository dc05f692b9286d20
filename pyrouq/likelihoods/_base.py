"""The base class of pyrouq's likelihoods (the contract: :mod:`pyrouq.likelihoods`)."""

from __future__ import annotations

import math
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from torch import Tensor, nn

from pyrouq._numbers import is_one_number, one_number
from pyrouq.likelihoods._conditioned import check_conditioned_shape, conditioned_value


def widened(outputs: Tensor) -> Tensor:
    """``outputs`` in float32 at least (float64 stays): half-precision outputs are scored,
    and made predictions, in float32, since a float16 sum of a batch's log-likelihood scaled
    by N/B overflows (past 65,504: a float16 model on MNIST met an inf loss at its first
    step) and a bfloat16 one keeps 3 digits (a fixed noise of 0.3 is 0.30078 there)."""
    return outputs.to(torch.promote_types(outputs.dtype, torch.float32))


def check_device(y: Any, outputs: Tensor, where: str) -> None:
    """Refuse targets ``y`` on another device than the ``outputs`` (torch's gather error
    otherwise). Every route that checks targets calls it (through :meth:`check_targets`):
    ``observe``, and the fast NLL of fit() and KLWeightedELBO."""
    if torch.is_tensor(y) and y.device != outputs.device:
        raise ValueError(
            f"{where}: the targets y are on {y.device}, the outputs on {outputs.device}; "
            f"expected both on one device: move the targets with y.to({str(outputs.device)!r})."
        )


def check_batched(outputs: Tensor, where: str, name: str, last: str, hint: str) -> None:
    """Refuse ``outputs`` without a batch dim (0-d or 1-d: no inputs to match targets to, and
    ``outputs.shape[-2]`` an IndexError). ``name`` is what they are called (outputs, logits),
    ``last`` their last dim (D, C); ``hint`` says how to give 1-d ones a batch dim."""
    if outputs.dim() < 2:
        if not outputs.dim():  # (no dim to unsqueeze into a batch of inputs)
            hint = f"Pass the {name} of a batch of inputs, shaped (B, {last})."
        raise ValueError(
            f"{where}: expected {name} of shape (B, {last}) or (S, B, {last}) (B inputs, S "
            f"draws), got shape {tuple(outputs.shape)}. {hint}"
        )


def along_inputs(parts: list[Tensor]) -> Tensor:
    """The batches' parts ``(S, B, ...)`` joined along the inputs (dim 1). One part that owns
    its storage whole is the result as it is: a second copy of a predict()'s probabilities
    would double its peak memory. The parts are :meth:`Likelihood.predictive`'s, which makes
    them anew (never the network's outputs themselves, which may be its input)."""
    if len(parts) == 1:
        one = parts[0]
        storage = one.untyped_storage().nbytes()
        if one.is_contiguous() and storage == one.numel() * one.element_size():
            return one
    return torch.cat(parts, dim=1)


class Likelihood(nn.Module):
    """Base class of pyrouq likelihoods (see the module docstring for the contract).

    Subclasses set :attr:`name` (the string a user types) and :attr:`output_site` (the
    deterministic site holding the network's outputs) and implement the methods below. A
    likelihood is an ``nn.Module``, a child of the model: its parameters (a learned noise
    scale) are trained as point estimates and saved with the model, and its latent sites
    (a noise scale with a prior) are sampled by the model beside the weights.

    ``latent`` arguments are the values of :meth:`latent_sites` for the outputs at hand,
    ``{site: (*S, *shape)}`` with the outputs' leading sample dims; None when it has none.
    """

    name: str = ""
    output_site: str = "outputs"
    #: The ``kl_weight`` :func:`pyrouq.fit` uses when none is given (see its docs).
    default_kl_weight: float = 1.0
    #: What its targets are called in messages, plural then singular: class labels, or
    #: (regression) targets.
    target_words: tuple[str, str] = ("labels", "label")

    def latent_sites(self) -> dict[str, torch.Size]:
        """Names and shapes of the likelihood's own latent sites (none by default)."""
        return {}

    def priors(self) -> dict[str, dist.TorchDistribution]:
        """The prior of every latent site of the likelihood, one event each."""
        return {}

    def template(self) -> dict[str, Tensor]:
        """An initial value of every latent site of the likelihood."""
        return {}

    def prepare(self, outputs: Tensor) -> None:
        """See the outputs ``(*S, B, D)`` once before training (creates lazily sized
        parameters); nothing by default."""

    def check_targets(self, y: Any, outputs: Tensor, where: str) -> None:  # pragma: no cover
        """Raise a ``TypeError`` / ``ValueError`` naming ``where`` if ``y`` cannot be the
        targets of ``outputs`` ``(*S, B, D)``."""
        raise NotImplementedError

    def target_problem(self, y: Tensor, num_outputs: int | None) -> str | None:  # pragma: no cover
        """What is wrong with a whole column of targets ``y`` (a loader's), or None."""
        raise NotImplementedError

    def shape_targets(self, y: Tensor, outputs: Tensor) -> Tensor:
        """``y`` shaped as the observation site holds it."""
        return y

    def distribution(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> dist.TorchDistribution:  # pragma: no cover
        """The observation distribution of every input, batch shape ``(*S, B)``."""
        raise NotImplementedError

    def nll(
        self, outputs: Tensor, y: Tensor, latent: dict[str, Tensor] | None = None
    ) -> Tensor:  # pragma: no cover
        """``-sum log p(y | outputs)`` over the batch (and over S), unscaled: a scalar. ``y``
        of a shape and dtype :meth:`check_targets` takes; others are refused (never broadcast,
        nor cast: float labels are not truncated to classes, nor integer targets scored as
        reals)."""
        raise NotImplementedError

    def predictive(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> Any:  # pragma: no cover
        """What :func:`pyrouq.predict` collects per draw and batch (class probabilities
        ``(S, B, C)`` for classifiers, ``(loc, scale)`` for Gaussians), in tensors of its own:
        the predictions may hold them as they are."""
        raise NotImplementedError

    def predictions(self, parts: list[Any], targets: Tensor | None) -> Any:  # pragma: no cover
        """The predictions object of the batches' :meth:`predictive` results (concatenated
        along the inputs)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """A JSON description that :func:`get_likelihood` turns back into this likelihood."""
        return {"name": self.name}

    @classmethod
    def _unused_settings(cls, spec: dict[str, Any]) -> set[str]:
        """The entries of a :meth:`describe` output ``spec`` that the likelihood it describes
        does not use (resuming a run does not compare them)."""
        return set()

    # ---------------------------------------------------------------------------------------

    def scale(self, num_data: int | None, batch: int, where: str) -> float:
        """N/B, the factor of a minibatch's log-likelihood, or a clear error when N is unset or
        no positive finite number (``model.num_data`` is an attribute users may set)."""
        if num_data is None:
            raise ValueError(
                f"{where}.num_data is not set: the likelihood of a minibatch of B points is "
                "scaled by N/B, with N the training-set size. Pass num_data=N to the "
                "constructor, set model.num_data = N, or train with pyrouq.fit(), which sets it."
            )
        # model.num_data is a plain attribute: 0 met Pyro's "Expected scale > 0 but got 0.0"
        if not is_one_number(num_data) or not 0 < one_number(num_data) < math.inf:
            raise ValueError(
                f"{where}.num_data is {num_data!r}, expected the training-set size N, a positive "
                "number: the likelihood of a minibatch of B points is scaled by N/B. Set "
                "model.num_data = N, or train with pyrouq.fit(), which sets it."
            )
        return num_data / max(batch, 1)

    def observe(
        self,
        outputs: Tensor,
        y: Tensor | None,
        num_data: int | None,
        where: str,
        members: int | None = None,
        latent: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Record ``outputs`` at :attr:`output_site` and observe ``y`` at ``"obs"``.

        The observation lies in ``pyro.plate("data", B)`` (dim -1) and, for ensembles, in
        ``pyro.plate("members", M)`` (dim -2); it is scaled by N/B so that a minibatch
        estimates the full-data log-likelihood. Without ``y`` nothing is scaled (prediction),
        unless a ``pyro.poutine.condition()`` around the model gives ``"obs"`` its targets (the
        outermost such handler's, as Pyro applies it; none where a ``pyro.poutine.block()``
        between hides the site from it): they are scaled as ``y``. Returns ``outputs``.
        """
        if outputs.dim() < 2:
            raise ValueError(
                f"{where}: the outputs have shape {tuple(outputs.shape)}, expected (B, D): one "
                "row per input, D outputs each (a single output: (B, 1), e.g. "
                "outputs.unsqueeze(-1))."
            )
        batch = outputs.shape[-2]
        if batch == 0:  # pyro.plate("data", 0) would divide by it
            raise ValueError(
                f"{where}: got an empty batch (outputs of shape {tuple(outputs.shape)}), "
                "expected at least one input; leave empty batches out."
            )
        scale, fn = 1.0, None  # fn: the distribution, where built for a check (once)
        check_device(y, outputs, where)  # (pyrouq's check_targets do too; a subclass may not)
        if y is not None:
            self.check_targets(y, outputs, where)
            scale = self.scale(num_data, batch, where)
            y = self.shape_targets(y, outputs)
        elif (given := conditioned_value("obs")) is not None:
            # poutine.condition(model, data={"obs": y})(x) is model(x, y) to a Pyro user: the
            # same N/B (the values are Pyro's to check: a vectorised Predictive gives a draw's
            # "obs" per leading index), and last dims the site holds, (B, D) for a Gaussian of
            # D outputs: Pyro broadcasts others, (B, 1) against D = 2 silently.
            # Without N, 1 as before (a Predictive given draws holding "obs" runs unscaled)
            scale = 1.0 if num_data is None else self.scale(num_data, batch, where)
            fn = self.distribution(outputs, latent)  # its event shape, (B, D): a Gaussian's
            check_conditioned_shape(given, (batch, *fn.event_shape), outputs, where)
        with pyro.plate("data", batch, dim=-1):
            if members is not None:
                with pyro.plate("members", members, dim=-2):
                    self._sample(outputs, y, scale, latent, fn)
            else:
                self._sample(outputs, y, scale, latent, fn)
        return outputs

    def _sample(
        self,
        outputs: Tensor,
        y: Tensor | None,
        scale: float,
        latent: dict[str, Tensor] | None,
        fn: dist.TorchDistribution | None = None,
    ) -> None:
        """The output site and ``"obs"``, observed from ``fn`` (built here where None)."""
        pyro.deterministic(self.output_site, outputs, event_dim=1)
        if fn is None:
            fn = self.distribution(outputs, latent)
        with pyro.poutine.scale(scale=scale):
            pyro.sample("obs", fn, obs=y)

    def extra_repr(self) -> str:
        return ""
