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

Models take a likelihood as ``likelihood="categorical"`` / ``"gaussian"`` or as an instance
(``Gaussian(scale="learned")``); :func:`get_likelihood` maps the strings onto classes.
"""

from __future__ import annotations

import copy
import math
import numbers
from typing import Any, Literal

import numpy as np
import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from torch import Tensor, nn

from pyrouq._util import support_of

__all__ = ["Categorical", "Gaussian", "Likelihood", "LikelihoodName", "get_likelihood"]

LikelihoodName = Literal["categorical", "gaussian"]


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
        """``-sum log p(y | outputs)`` over the batch (and over S), unscaled: a scalar."""
        raise NotImplementedError

    def predictive(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> Any:  # pragma: no cover
        """What :func:`pyrouq.predict` collects per draw and batch (class probabilities
        ``(S, B, C)`` for classifiers, ``(loc, scale)`` for Gaussians)."""
        raise NotImplementedError

    def predictions(self, parts: list[Any], targets: Tensor | None) -> Any:  # pragma: no cover
        """The predictions object of the batches' :meth:`predictive` results (concatenated
        along the inputs)."""
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
        latent: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """Record ``outputs`` at :attr:`output_site` and observe ``y`` at ``"obs"``.

        The observation lies in ``pyro.plate("data", B)`` (dim -1) and, for ensembles, in
        ``pyro.plate("members", M)`` (dim -2); it is scaled by N/B so that a minibatch
        estimates the full-data log-likelihood. Without ``y`` nothing is scaled (prediction).
        Returns ``outputs``.
        """
        if outputs.dim() < 2:
            raise ValueError(
                f"{where}: the outputs have shape {tuple(outputs.shape)}, expected (B, D): one "
                "row per input, D outputs each (a single output: (B, 1), e.g. "
                "outputs.unsqueeze(-1))."
            )
        batch = outputs.shape[-2]
        scale = 1.0
        if y is not None:
            self.check_targets(y, outputs, where)
            scale = self.scale(num_data, batch, where)
            y = self.shape_targets(y, outputs)
        with pyro.plate("data", batch, dim=-1):
            if members is not None:
                with pyro.plate("members", members, dim=-2):
                    self._sample(outputs, y, scale, latent)
            else:
                self._sample(outputs, y, scale, latent)
        return outputs

    def _sample(
        self, outputs: Tensor, y: Tensor | None, scale: float, latent: dict[str, Tensor] | None
    ) -> None:
        pyro.deterministic(self.output_site, outputs, event_dim=1)
        with pyro.poutine.scale(scale=scale):
            pyro.sample("obs", self.distribution(outputs, latent), obs=y)

    def extra_repr(self) -> str:
        return ""


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
    default_kl_weight = 0.02

    def check_targets(self, y: Any, outputs: Tensor, where: str) -> None:
        batch, num_classes = outputs.shape[-2], outputs.shape[-1]
        if not torch.is_tensor(y):
            raise TypeError(
                f"{where}: expected labels y as a torch.Tensor, got {type(y).__name__}."
            )
        if y.shape != (batch,):
            one_hot = " (one-hot labels: y.argmax(-1))" if y.shape == (batch, num_classes) else ""
            raise ValueError(
                f"{where}: expected labels y of shape ({batch},) to match the {batch} inputs, got "
                f"shape {tuple(y.shape)}. Pass one integer label per input{one_hot}."
            )
        problem = self.label_problem(y, num_classes if is_validation_enabled() else None)
        if problem is not None:
            raise ValueError(
                f"{where}: {problem}. Check the targets or the model's number of classes."
            )

    @staticmethod
    def label_problem(y: Tensor, num_classes: int | None) -> str | None:
        """What is wrong with ``y`` as class labels of ``num_classes`` classes (its dtype, or
        values outside ``[0, C)``; the range is not checked when ``num_classes`` is None), or
        None: the one label check that models, :func:`pyrouq.fit` and the diagnostics share."""
        if y.dtype.is_floating_point or y.dtype == torch.bool or y.is_complex():
            regression = (
                "; real-valued targets are regression, for a model built with "
                "bayesian(net, likelihood=pyrouq.Gaussian(...))"
                if y.dtype.is_floating_point
                else ""
            )
            return (
                f"labels of dtype {y.dtype}, expected an integer dtype (class indices: "
                f"y.long(){regression})"
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
        return dist.Categorical(logits=outputs)

    def nll(self, outputs: Tensor, y: Tensor, latent: dict[str, Tensor] | None = None) -> Tensor:
        flat = outputs.reshape(-1, outputs.shape[-1])
        target = y.expand(outputs.shape[:-1]).reshape(-1)
        if target.dtype != torch.long:  # int32 / int16 labels (numpy's, often): the check let
            target = target.long()  # them through, and cross_entropy takes int64 or uint8 only
        # no ignored label: cross_entropy's default (-100) would drop such rows silently
        return F.cross_entropy(flat, target, reduction="sum", ignore_index=_NO_LABEL)

    def predictive(self, outputs: Tensor, latent: dict[str, Tensor] | None = None) -> Tensor:
        if outputs.shape[-1] < 2:
            raise ValueError(
                f"predict() got logits of one class (outputs of shape {tuple(outputs.shape)}): "
                "every probability would be 1. A classifier needs C >= 2 logits; a regression "
                "model takes a Gaussian likelihood, e.g. bayesian(net, likelihood='gaussian'), "
                "and predict() then returns GaussianPredictions."
            )
        # half-precision logits are promoted to float32 (a stable softmax); float64 stays
        return torch.softmax(outputs.to(torch.promote_types(outputs.dtype, torch.float32)), -1)

    def predictions(self, parts: list[Any], targets: Tensor | None) -> Any:
        from pyrouq.predictive import Predictions

        return Predictions(torch.cat(parts, dim=1), targets)


#: The latent site of a noise scale with a prior.
NOISE_SITE = "sigma"

NoiseSpec = float | Literal["learned", "heteroscedastic"] | torch.distributions.Distribution


class Gaussian(Likelihood):
    """Regression: outputs are means ``(*S, B, D)``, targets real ``(B, D)`` (or ``(B,)`` when
    D = 1), observed as ``Normal(mean, scale)``, independent over the D outputs.

    Parameters
    ----------
    scale : float, "learned", "heteroscedastic" or Distribution, default 0.5
        The noise standard deviation:

        * a float: known noise;
        * ``"learned"``: one positive parameter per output (``softplus`` of a free one,
          starting at 1.0), a point estimate trained by :func:`pyrouq.fit`, saved with the model;
        * a ``pyro.distributions`` distribution with positive support (e.g.
          ``HalfNormal(1.0)``): its prior; the noise is then the latent site ``"sigma"`` that
          the guide fits beside the weights, of the distribution's batch shape (``()``: one
          noise for all outputs; ``(D,)``: one per output). :func:`pyrouq.mean_field_guide`
          fits priors on (0, inf) (HalfNormal, Gamma, ...); a bounded one (Uniform(0.1, 2))
          is for :func:`pyrouq.mcmc`;
        * ``"heteroscedastic"``: the network outputs 2D values per input, D means then D raw
          scales, mapped to ``min_scale + softplus(raw)``.
    min_scale : float, default 1e-3
        The floor of the heteroscedastic scales (keeps the likelihood bounded).

    Examples
    --------
    >>> import torch
    >>> lik = Gaussian(scale=0.5)
    >>> y = torch.tensor([0.5])  # one target, z = 1: NLL = 1/2 + log 0.5 + log(2 pi) / 2
    >>> round(lik.nll(torch.zeros(1, 1), y).item(), 4)
    0.7258
    """

    name = "gaussian"
    output_site = "outputs"
    default_kl_weight = 1.0

    def __init__(self, scale: NoiseSpec = 0.5, *, min_scale: float = 1e-3):
        super().__init__()
        self.min_scale = _positive("min_scale", min_scale, "It floors the heteroscedastic scales.")
        self.noise_prior: Any = None
        self.raw_scale: Any = None
        if isinstance(scale, torch.distributions.Distribution):
            from pyrouq.convert._select import _site_prior

            if support_of(scale) not in ("positive", "nonnegative"):
                raise ValueError(
                    f"Expected a noise prior with positive support (HalfNormal, LogNormal, "
                    f"Gamma, HalfCauchy, ...), got {scale} with support {scale.support}."
                )
            if scale.event_shape:
                raise ValueError(
                    f"Expected a univariate noise prior (batch shape () or (D,)), got {scale} "
                    f"with event shape {tuple(scale.event_shape)}."
                )
            self.mode = "latent"
            self.noise_prior = _site_prior(scale, NOISE_SITE, scale.batch_shape, None)
        elif isinstance(scale, str):
            if scale not in ("learned", "heteroscedastic"):
                raise ValueError(
                    f"Unknown noise scale {scale!r}: expected a float > 0, 'learned', "
                    "'heteroscedastic' or a pyro.distributions prior such as HalfNormal(1.0)."
                )
            self.mode = scale
            if scale == "learned":
                self.raw_scale = nn.UninitializedParameter()
        elif _one_number(scale):  # a float, a numpy scalar, a tensor of one value
            self.fixed = _positive(
                "the Gaussian noise scale",
                _as_float(scale),
                "Pass the noise standard deviation, e.g. 0.5.",
            )
            self.mode = "fixed"
        else:
            got = type(scale).__name__
            if torch.is_tensor(scale):
                got = f"a {scale.dtype} tensor of shape {tuple(scale.shape)}"
                if scale.numel() > 1:  # one scale per output: learned, or a prior of (D,)
                    got += (
                        "; for one noise scale per output pass 'learned', or a prior of batch "
                        "shape (D,), e.g. dist.HalfNormal(torch.ones(D))"
                    )
            raise TypeError(
                f"Expected the Gaussian noise scale to be a float > 0, 'learned', "
                f"'heteroscedastic' or a pyro.distributions prior, got {got}."
            )

    # -- latent noise --------------------------------------------------------------------------

    def latent_sites(self) -> dict[str, torch.Size]:
        if self.noise_prior is None:
            return {}
        return {NOISE_SITE: torch.Size(self.noise_prior.shape)}

    def priors(self) -> dict[str, dist.TorchDistribution]:
        if self.noise_prior is None:
            return {}
        return {NOISE_SITE: self.noise_prior.distribution()}  # type: ignore[operator]

    def template(self) -> dict[str, Tensor]:
        if self.noise_prior is None:
            return {}
        prior = self.noise_prior.distribution()  # type: ignore[operator]
        mean = prior.mean
        if not bool(torch.isfinite(mean).all()):  # e.g. HalfCauchy: start at the median-ish 1
            mean = torch.ones_like(mean)
        return {NOISE_SITE: mean.detach().clone()}

    # -- learned noise -------------------------------------------------------------------------

    def prepare(self, outputs: Tensor) -> None:
        if self.mode == "learned" and isinstance(self.raw_scale, nn.UninitializedParameter):
            with torch.no_grad():
                self.raw_scale.materialize(
                    (outputs.shape[-1],), device=outputs.device, dtype=outputs.dtype
                )
                self.raw_scale.fill_(math.log(math.expm1(1.0)))  # softplus(raw) = 1

    def _load_from_state_dict(self, state_dict, prefix, *args: Any) -> None:  # type: ignore[no-untyped-def]
        key = prefix + "raw_scale"
        if isinstance(self.raw_scale, nn.UninitializedParameter) and key in state_dict:
            self.raw_scale.materialize(state_dict[key].shape, dtype=state_dict[key].dtype)
        super()._load_from_state_dict(state_dict, prefix, *args)

    # -- the observation -----------------------------------------------------------------------

    def num_outputs(self, outputs: Tensor, where: str = "Gaussian") -> int:
        """D: the outputs' last dim (half of it, heteroscedastic)."""
        size = outputs.shape[-1]
        if self.mode == "heteroscedastic":
            if size % 2:
                raise ValueError(
                    f"{where}: Gaussian(scale='heteroscedastic') needs a network with 2D "
                    f"outputs (D means, then D raw scales), got {size} outputs, an odd number. "
                    "Give the last layer twice as many outputs as there are targets."
                )
            return size // 2
        if self.mode == "latent" and tuple(self.noise_prior.shape) not in ((), (size,)):
            raise ValueError(
                f"{where}: the noise prior has batch shape {tuple(self.noise_prior.shape)}, "
                f"expected () (one noise for all outputs) or ({size},) (one per output) for a "
                f"network with {size} output(s). Build the prior with that shape, e.g. "
                f"HalfNormal(torch.ones({size}))."
            )
        return size

    def loc_scale(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """The means and standard deviations ``(*S, B, D)`` of the outputs."""
        if self.mode == "heteroscedastic":
            d = self.num_outputs(outputs)
            loc, raw = outputs[..., :d], outputs[..., d:]
            return loc, self.min_scale + F.softplus(raw)
        if self.mode == "fixed":
            return outputs, torch.full_like(outputs, self.fixed)
        if self.mode == "learned":
            self.prepare(outputs)
            assert self.raw_scale is not None
            return outputs, F.softplus(self.raw_scale).expand_as(outputs)
        if latent is None or NOISE_SITE not in latent:
            raise ValueError(
                f"The Gaussian noise is the latent site {NOISE_SITE!r}: pass its value (a "
                "model built with this likelihood samples it)."
            )
        self.num_outputs(outputs)  # the noise prior's shape fits D
        noise = latent[NOISE_SITE]
        event = len(self.noise_prior.shape)
        lead = noise.shape[: noise.dim() - event]
        shape = (
            *lead,
            *([1] * (outputs.dim() - len(lead) - 1)),
            *noise.shape[noise.dim() - event :],
        )
        if not event:
            shape = (*shape, 1)
        return outputs, noise.reshape(shape).expand_as(outputs)

    def shape_targets(self, y: Tensor, outputs: Tensor) -> Tensor:
        return y.unsqueeze(-1) if y.dim() == 1 else y

    def target_problem(self, y: Tensor, num_outputs: int | None) -> str | None:
        if not y.dtype.is_floating_point:
            return (
                f"targets of dtype {y.dtype}, expected real values (a floating dtype): class "
                "labels belong to a Categorical likelihood; for real targets use y.float()"
            )
        if y.dim() == 0:
            return (
                f"a 0-d target tensor ({float(y):g}), expected one target per input, (N,) or "
                "(N, D); a single input's target is y.reshape(1)"
            )
        if y.numel() and not bool(torch.isfinite(y).all()):
            bad = (~torch.isfinite(y.reshape(y.shape[0], -1))).any(-1).nonzero().flatten()
            return f"NaN or inf targets at rows {bad[:5].tolist()}; remove or repair them"
        if num_outputs is not None and y.dim() >= 1:
            shape = tuple(y.shape[1:])
            if shape not in ((num_outputs,),) and not (shape == () and num_outputs == 1):
                given = int(math.prod(shape))
                hint = (
                    " (if it outputs a mean and a scale per target, pass "
                    "likelihood=Gaussian(scale='heteroscedastic'))"
                    if self.mode != "heteroscedastic" and num_outputs == 2 * given
                    else ""
                )
                if self.mode == "heteroscedastic":  # its outputs: D means, then D scales
                    return (
                        f"targets of shape {tuple(y.shape)}, expected (N, {num_outputs})"
                        + (" or (N,)" if num_outputs == 1 else "")
                        + f": the network has {2 * num_outputs} outputs, read as "
                        f"{num_outputs} mean(s) then {num_outputs} scale(s) "
                        "(Gaussian(scale='heteroscedastic')); for targets (N, D) its last "
                        "layer needs 2D outputs"
                    )
                return (
                    f"targets of shape {tuple(y.shape)}, expected (N, {num_outputs})"
                    + (" or (N,)" if num_outputs == 1 else "")
                    + f" for a network with {num_outputs} output(s){hint}"
                )
        return None

    def check_targets(self, y: Any, outputs: Tensor, where: str) -> None:
        batch, d = outputs.shape[-2], self.num_outputs(outputs, where)
        if not torch.is_tensor(y):
            raise TypeError(
                f"{where}: expected targets y as a torch.Tensor, got {type(y).__name__}."
            )
        problem = self.target_problem(y, d)
        if problem is None and y.shape[0] != batch:
            problem = f"{y.shape[0]} targets for {batch} inputs"
        if problem is not None:
            raise ValueError(f"{where}: {problem}.")

    def distribution(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> dist.TorchDistribution:
        loc, scale = self.loc_scale(outputs, latent)
        return dist.Normal(loc, scale).to_event(1)

    def nll(self, outputs: Tensor, y: Tensor, latent: dict[str, Tensor] | None = None) -> Tensor:
        loc, scale = self.loc_scale(outputs, latent)
        z = (self.shape_targets(y, outputs) - loc) / scale
        return (0.5 * z.square() + scale.log()).sum() + 0.5 * math.log(2 * math.pi) * z.numel()

    def predictive(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        loc, scale = self.loc_scale(outputs, latent)
        dtype = torch.promote_types(loc.dtype, torch.float32)  # half to float32; float64 stays
        return loc.to(dtype), scale.to(dtype)

    def predictions(self, parts: list[Any], targets: Tensor | None) -> Any:
        from pyrouq.regression import GaussianPredictions

        loc = torch.cat([p[0] for p in parts], dim=1)
        scale = torch.cat([p[1] for p in parts], dim=1)
        return GaussianPredictions(loc, scale, targets)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "min_scale": self.min_scale}
        if self.mode == "fixed":
            out["scale"] = self.fixed
        elif self.mode == "latent":
            prior = self.noise_prior
            params = {k: list(getattr(prior, k).shape) for k in prior._names}  # type: ignore[union-attr]
            out["scale"] = {"family": prior.family, "params": params}  # type: ignore[union-attr]
        else:
            out["scale"] = self.mode
        if self.mode == "learned" and not isinstance(self.raw_scale, nn.UninitializedParameter):
            out["num_outputs"] = int(self.raw_scale.shape[0])  # type: ignore[union-attr]
        return out

    @classmethod
    def from_description(cls, spec: dict[str, Any]) -> Gaussian:
        """The likelihood :meth:`describe` wrote (a prior's parameters are placeholders until
        the model's state dict is loaded: 1, 2, ... in their order, which every family pyrouq
        takes accepts, ``Uniform(low=1, high=2)`` included)."""
        scale = spec.get("scale", 0.5)
        if isinstance(scale, dict):
            params = {
                k: torch.full(shape, float(i + 1))
                for i, (k, shape) in enumerate(scale["params"].items())
            }
            scale = getattr(dist, scale["family"])(**params)
        lik = cls(scale, min_scale=float(spec.get("min_scale", 1e-3)))
        if "num_outputs" in spec:
            lik.prepare(torch.zeros(1, int(spec["num_outputs"])))
        return lik

    def extra_repr(self) -> str:
        if self.mode == "fixed":
            return f"scale={self.fixed:g}"
        if self.mode == "latent":
            return f"scale={self.noise_prior.extra_repr()}"  # type: ignore[union-attr]
        return f"scale={self.mode!r}"


def _one_number(value: Any) -> bool:
    """Whether ``value`` is one real number: a Python or numpy scalar, or a floating tensor
    holding one value (``noise / scaler.y_std`` is a 0-d tensor)."""
    if isinstance(value, bool):
        return False
    if torch.is_tensor(value):
        return value.numel() == 1 and not value.is_complex() and value.dtype != torch.bool
    if isinstance(value, np.ndarray):
        return value.size == 1 and value.dtype.kind in "fiu"
    return isinstance(value, numbers.Real)


def _as_float(value: Any) -> float:
    """The number :func:`_one_number` accepted, as a float (a tensor's detached)."""
    if torch.is_tensor(value):
        return float(value.detach().reshape(()))
    if isinstance(value, np.ndarray):
        return float(value.reshape(()))
    return float(value)


def _positive(name: str, value: Any, hint: str) -> float:
    from pyrouq._util import check_positive_float

    return check_positive_float(name, value, hint)


_LIKELIHOODS: dict[str, type[Likelihood]] = {"categorical": Categorical, "gaussian": Gaussian}


_NO_LABEL = -(2**63)
"""``ignore_index`` for ``F.cross_entropy``: no label is ignored (every one is checked)."""


def get_likelihood(spec: str | Likelihood | dict[str, Any]) -> Likelihood:
    """The likelihood named by ``spec``: a name (``"categorical"``, ``"gaussian"`` with its
    default scale), an instance (copied: each model owns its likelihood)
    or the :meth:`Likelihood.describe` dict of a checkpoint.

    Examples
    --------
    >>> get_likelihood("categorical")
    Categorical()
    """
    if isinstance(spec, Likelihood):
        return copy.deepcopy(spec)  # each model owns its likelihood (and its parameters)
    name = spec.get("name") if isinstance(spec, dict) else spec
    if not isinstance(name, str) or name not in _LIKELIHOODS:
        raise ValueError(
            f"Unknown likelihood {spec!r}: expected one of {sorted(_LIKELIHOODS)} or a "
            "pyrouq.likelihoods.Likelihood instance (e.g. pyrouq.likelihoods.Gaussian(0.5))."
        )
    if isinstance(spec, dict) and name == "gaussian":
        return Gaussian.from_description(spec)
    return _LIKELIHOODS[name]()
