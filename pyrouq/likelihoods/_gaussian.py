"""Regression: :class:`Gaussian`, outputs observed as means, with a fixed, learned,
heteroscedastic or latent noise scale."""

from __future__ import annotations

import math
from typing import Any, Literal

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pyrouq._distribution_parts import support_of
from pyrouq._numbers import is_one_number, is_real, one_number, text_hint
from pyrouq._words import close_hint
from pyrouq.likelihoods._base import (
    Likelihood,
    along_inputs,
    check_batched,
    check_device,
    widened,
)

#: The latent site of a noise scale with a prior.
NOISE_SITE = "sigma"

NoiseSpec = float | Literal["learned", "heteroscedastic"] | torch.distributions.Distribution


#: Other words users write for a noise scale's name (in any case), and its name here.
_SCALE_WORDS = {"heteroskedastic": "heteroscedastic", "hetero": "heteroscedastic"}

_UNBATCHED = (
    "Give them a batch dim: outputs.unsqueeze(-1) if they are B inputs of one output each, "
    "outputs.unsqueeze(0) if they are one input's D outputs."
)
"""How to give :meth:`Gaussian.nll` outputs without a batch dim one."""


class Gaussian(Likelihood):
    """Regression: outputs are means ``(*S, B, D)``, targets real ``(B, D)`` (or ``(B,)`` when
    D = 1), observed as ``Normal(mean, scale)``, independent over the D outputs.

    Parameters
    ----------
    scale : float, "learned", "heteroscedastic" or Distribution, default 0.5
        The noise standard deviation:

        * a float: known noise, in the units of the targets the model trains on: for targets
          standardised by :class:`pyrouq.Standardizer`, pass the sd known in the original
          units divided by ``scaler.y_std``, ``float(sd / scaler.y_std)`` for one output (one
          float serves every output: for several, whose y_std differ, use ``"learned"``);
          ``scaler.inverse`` scales the predictions back;
        * ``"learned"``: one positive parameter per output (``softplus`` of a free one,
          starting at 1.0), a point estimate trained by :func:`pyrouq.fit`, saved with the model;
          the members of a BatchEnsemble or rank-1 network share it (with
          ``"heteroscedastic"`` each member computes its own scales). It has no floor but its
          dtype's smallest normal number (1.2e-38 in float32), where a raw value below about
          -87 rounds; a scale that trains towards 0 (targets the network fits exactly) stops
          fit() once the NLL overflows (below 5.4e-20 in float32), with an error naming it:
          give such a model a fixed scale or ``"heteroscedastic"`` with its ``min_scale``;
        * a ``pyro.distributions`` distribution with positive support (e.g.
          ``HalfNormal(1.0)``): its prior; the noise is then the latent site ``"sigma"`` that
          the guide fits beside the weights, of the distribution's batch shape (``()``: one
          noise for all outputs; ``(D,)``: one per output). :func:`pyrouq.mean_field_guide`
          fits priors on (0, inf) (HalfNormal, Gamma, ...); a bounded one (Uniform(0.1, 2))
          is for :func:`pyrouq.mcmc`;
        * ``"heteroscedastic"``: the network outputs 2D values per input, D means then D raw
          scales, mapped to ``min_scale + softplus(raw)``.
    min_scale : float, default 1e-3
        The floor of the heteroscedastic scales (keeps the likelihood bounded), in the units
        of the targets the model trains on. It (or a float ``scale``) must be at least the
        smallest normal number of the dtype the scales are computed in, else a clear error:
        the outputs' (1.2e-38 in float32, 2.2e-308 in float64), float32 for float16 and
        bfloat16 outputs (widened to float32 there). A floor below ``max ** (-1/3)`` of that
        dtype (1.4e-13 in float32, 1.8e-103 in float64) trains while the scales stay above
        it, but scales that reach it overflow the NLL's gradient in the scale
        (``1 / min_scale**3`` for a target 1 away from the mean): fit() then stops on its
        "Non-finite loss" error, which names the floor and the value to raise it to. A
        float ``scale`` must leave ``1 / scale**2`` (the NLL's ``z**2``) finite where targets
        are scored (fit(), :meth:`nll`, a model given ``y``): scale >= 5.4e-20 in float32,
        7.5e-155 in float64, else a clear error before training.

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
    target_words = ("targets", "target")
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
            if len(scale.batch_shape) > 1:  # the noise of a (B, D) output: () or (D,) only
                raise ValueError(
                    f"Expected a noise prior of batch shape () (one noise for all outputs) or "
                    f"(D,) (one per output), got {scale} with batch shape "
                    f"{tuple(scale.batch_shape)}. Build it with one of them, e.g. "
                    "HalfNormal(1.0) or HalfNormal(torch.ones(D))."
                )
            self.mode = "latent"
            self.noise_prior = _site_prior(scale, NOISE_SITE, scale.batch_shape, None)
        elif isinstance(scale, str):
            if scale not in ("learned", "heteroscedastic"):
                # a slip of case, another spelling ('heteroskedastic'), or a typo: the one meant
                hint = close_hint(scale, ("learned", "heteroscedastic"), _SCALE_WORDS)
                hint = hint or text_hint(scale, "scale", 0)  # '0.5': scale=0.5
                raise ValueError(
                    f"Unknown noise scale {scale!r}{hint}: expected a float > 0, 'learned', "
                    "'heteroscedastic' or a pyro.distributions prior such as HalfNormal(1.0)."
                )
            self.mode = scale
            if scale == "learned":
                self.raw_scale = nn.UninitializedParameter()
        elif is_one_number(scale):  # a float, a numpy scalar, a tensor of one value
            self.fixed = _positive(
                "the Gaussian noise scale",
                scale if is_real(scale) else one_number(scale),  # (10**400: no float, refused)
                "Pass the noise standard deviation, e.g. 0.5.",
            )
            self.mode = "fixed"
        else:
            got = type(scale).__name__
            if isinstance(scale, type):  # the class, dist.HalfNormal, not an instance
                got = f"the class {scale.__name__} itself"
                if issubclass(scale, torch.distributions.Distribution):  # (not float, a module)
                    got += "; pass an instance with its parameters, e.g. dist.HalfNormal(1.0)"
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
        try:
            mean = prior.mean
        except NotImplementedError:  # no closed form (a folded or transformed family): 1
            mean = torch.ones(prior.batch_shape + prior.event_shape)
        if not bool(torch.isfinite(mean).all()):  # e.g. HalfCauchy: start at the median-ish 1
            mean = torch.ones_like(mean)
        return {NOISE_SITE: mean.detach().clone()}

    # -- learned noise -------------------------------------------------------------------------

    def prepare(self, outputs: Tensor) -> None:
        if self.mode == "learned" and isinstance(self.raw_scale, nn.UninitializedParameter):
            # a normal tensor even when the first run is inside torch.inference_mode() (a
            # predict() there): a later fit() trains it; set, not filled in place (which a
            # scale created inside inference_mode, Gaussian("learned") there, refuses here)
            shape, device, dtype = (outputs.shape[-1],), outputs.device, outputs.dtype
            with torch.inference_mode(False), torch.no_grad():
                self.raw_scale.materialize(shape, device=device, dtype=dtype)
                one = math.log(math.expm1(1.0))  # softplus(raw) = 1
                self.raw_scale.data = torch.full(shape, one, device=device, dtype=dtype)

    def _load_from_state_dict(self, state_dict, prefix, *args: Any) -> None:  # type: ignore[no-untyped-def]
        key = prefix + "raw_scale"
        if isinstance(self.raw_scale, nn.UninitializedParameter) and key in state_dict:
            self.raw_scale.materialize(state_dict[key].shape, dtype=state_dict[key].dtype)
        super()._load_from_state_dict(state_dict, prefix, *args)

    # -- the observation -----------------------------------------------------------------------

    def num_outputs(
        self, outputs: Tensor, where: str = "Gaussian", targets: Tensor | None = None
    ) -> int:
        """D: the outputs' last dim (half of it, heteroscedastic). A noise prior of another
        shape than D's is refused, but where ``targets`` are given that do not fit D either:
        D is returned, for the check of the targets that follows to name the fix (a network
        of 2 outputs on targets (N,): heteroscedastic, or one output), not a prior of (2,),
        which would then fail on the targets."""
        size = outputs.shape[-1]
        if self.mode == "heteroscedastic":
            if size % 2:
                raise ValueError(
                    f"{where}: Gaussian(scale='heteroscedastic') needs a network with 2D "
                    f"outputs (D means, then D raw scales), got {size} outputs, an odd number. "
                    "Give the last layer twice as many outputs as there are targets."
                )
            return size // 2
        learned = self.raw_scale
        if self.mode == "learned" and not isinstance(learned, nn.UninitializedParameter):
            if int(learned.shape[0]) != size:
                raise ValueError(
                    f"{where}: Gaussian('learned') holds {int(learned.shape[0])} noise "
                    f"scale(s), one per output of the network it was first called on, got a "
                    f"network with {size} output(s). Give each network its own "
                    "Gaussian('learned')."
                )
        if self.mode == "latent" and tuple(self.noise_prior.shape) not in ((), (size,)):
            if targets is not None and self.target_problem(targets, size) is not None:
                return size  # (the targets' check, next, refuses them)
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
        """The means and standard deviations ``(*S, B, D)`` of the outputs, in float32 for
        half-precision outputs (float64 stays)."""
        if self.mode == "learned":
            self.prepare(outputs)  # the learned noise takes the network's dtype, as in fit()
        outputs = widened(outputs)
        if self.mode == "heteroscedastic":
            d = self.num_outputs(outputs)
            loc, raw = outputs[..., :d], outputs[..., d:]
            _representable("min_scale", self.min_scale, outputs.dtype)
            return loc, self.min_scale + F.softplus(raw)
        if self.mode == "fixed":
            _representable("scale", self.fixed, outputs.dtype)
            return outputs, torch.full_like(outputs, self.fixed)
        if self.mode == "learned":
            self.num_outputs(outputs)  # the learned scales fit D
            assert self.raw_scale is not None
            scale = F.softplus(widened(self.raw_scale))
            # held at its dtype's smallest normal number, not rounded to 0 (float32 softplus of
            # a raw value below -103): an NLL of inf, not NaN, and predictions of that scale
            return outputs, scale.clamp_min(torch.finfo(scale.dtype).tiny).expand_as(outputs)
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
        return outputs, widened(noise.reshape(shape)).expand_as(outputs)

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
        check_batched(outputs, where, "outputs", "D", _UNBATCHED)
        targets = y if torch.is_tensor(y) else None
        batch, d = outputs.shape[-2], self.num_outputs(outputs, where, targets)
        self._check_scored(outputs, where)
        if not torch.is_tensor(y):
            raise TypeError(
                f"{where}: expected targets y as a torch.Tensor, got {type(y).__name__}. "
                "Convert them with torch.as_tensor(y, dtype=torch.float32)."
            )
        check_device(y, outputs, where)
        problem = self.target_problem(y, d)
        if problem is None and y.shape[0] != batch:
            problem = (
                f"expected targets y of {batch} rows to match the {batch} inputs, got shape "
                f"{tuple(y.shape)}. Pass one target per input (a row of each batch's y for "
                "each row of its x)"
            )
        if problem is not None:
            raise ValueError(f"{where}: {problem}.")

    def _check_scored(self, outputs: Tensor, where: str) -> None:
        """Refuse, where targets are scored, a fixed noise whose z**2 of a target 1 away from
        the mean overflows the dtype the scales are computed in (predictions of it are fine:
        :meth:`predictive` does not call this). A heteroscedastic floor is not refused here:
        only scales sitting at it overflow, which fit()'s "Non-finite loss" error names
        (:func:`floor_advice`)."""
        if self.mode == "fixed":
            dtype = torch.promote_types(outputs.dtype, torch.float32)  # as widened() computes in
            _scorable(self.fixed, dtype, where)

    def distribution(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> dist.TorchDistribution:
        loc, scale = self.loc_scale(outputs, latent)
        return dist.Normal(loc, scale).to_event(1)

    def nll(self, outputs: Tensor, y: Tensor, latent: dict[str, Tensor] | None = None) -> Tensor:
        check_batched(outputs, "Gaussian.nll()", "outputs", "D", _UNBATCHED)
        loc, scale = self.loc_scale(outputs, latent)
        if not torch.is_tensor(y):
            self.check_targets(y, outputs, "Gaussian.nll()")  # says what to pass
        target = self.shape_targets(y, outputs)
        if target.shape != loc.shape[-2:] or not y.dtype.is_floating_point:
            # (1, B) targets, or (B,) of D > 1 outputs, would broadcast: B^2 or B D terms;
            # integer targets (class labels) were scored as reals
            self.check_targets(y, outputs, "Gaussian.nll()")  # says what to pass
        self._check_scored(outputs, "Gaussian.nll()")
        z = (target - loc) / scale
        return (0.5 * z.square() + scale.log()).sum() + 0.5 * math.log(2 * math.pi) * z.numel()

    def predictive(
        self, outputs: Tensor, latent: dict[str, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        # half outputs are promoted before the scales are made (as Categorical's logits before
        # the softmax): a fixed 0.3 in bfloat16 is 0.30078, 1e-8 in float16 is 0, 1e5 overflows
        dtype = torch.promote_types(outputs.dtype, torch.float32)  # float64 stays
        self.prepare(outputs)  # a learned noise still takes the network's dtype, as in fit()
        loc, scale = self.loc_scale(outputs.to(dtype), latent)
        # copies: the loc may be the network's output itself (its input, a tensor it keeps),
        # which the predictions would otherwise share (along_inputs takes one part as it is)
        return loc.to(dtype, copy=True), scale.to(dtype, copy=True)

    def predictions(self, parts: list[Any], targets: Tensor | None) -> Any:
        from pyrouq.regression import GaussianPredictions

        loc = along_inputs([p[0] for p in parts])
        scale = along_inputs([p[1] for p in parts])
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
    def _unused_settings(cls, spec: dict[str, Any]) -> set[str]:
        # min_scale floors heteroscedastic scales only
        return set() if spec.get("scale") == "heteroscedastic" else {"min_scale"}

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


def _positive(name: str, value: Any, hint: str) -> float:
    from pyrouq._util import check_positive_float

    return check_positive_float(name, value, hint)


def _dtype_words(dtype: torch.dtype) -> tuple[str, str]:
    """The refusals' name for ``dtype`` and, short of float64, the wider dtype to offer."""
    wider = "" if dtype == torch.float64 else ", or use float64 outputs (model.double())"
    return str(dtype).replace("torch.", ""), wider


def _representable(name: str, value: float, dtype: torch.dtype) -> None:
    """Refuse a noise floor (or a fixed noise) below the smallest normal number of ``dtype``,
    the one the scales are computed in (the widened outputs'): it rounds to 0 or to a
    subnormal, and the likelihood to NaN or inf."""
    tiny = torch.finfo(dtype).tiny
    if value < tiny:
        kind, wider = _dtype_words(dtype)
        raise ValueError(
            f"Gaussian({name}={value:g}) is below the smallest normal {kind} number "
            f"({tiny:.3g}): the noise scales, computed in {kind}, would round to 0 (or lose "
            f"their precision) and the likelihood would be NaN or inf. Pass {name} >= "
            f"{tiny:.3g} (e.g. 1e-3){wider}."
        )


def _scorable(value: float, dtype: torch.dtype, where: str) -> None:
    """Refuse a fixed noise ``scale`` that ``dtype`` holds (:func:`_representable`) but whose
    NLL overflows it when a target 1 away from the mean is scored: ``z**2 = 1 / scale**2``,
    for every target and every step (fit() stopped on "Non-finite loss" with generic advice)."""
    _representable("scale", value, dtype)
    limit = torch.finfo(dtype).max ** (-1 / 2)
    if value >= limit:
        return
    kind, wider = _dtype_words(dtype)
    raise ValueError(
        f"{where}: Gaussian(scale={value:g}) is too small to score targets in {kind}: a "
        f"target 1 away from the mean has z = 1/scale = {1 / value:.3g}, and the NLL's z**2 "
        f"(1/scale**2) overflows {kind} (an inf or NaN loss) for any scale below "
        f"{limit:.3g}. Pass scale >= {limit:.3g}, better well above it (e.g. 0.5, a noise sd "
        f"in the targets' units){wider}."
    )


def floor_advice(likelihood: Any, dtype: torch.dtype) -> str:
    """A sentence for fit()'s "Non-finite loss" error when ``likelihood`` is a heteroscedastic
    Gaussian whose floor ``min_scale`` is below the smallest one whose NLL gradient in the
    scale at the floor, ``z**2 / min_scale = 1 / min_scale**3`` for a target 1 away from the
    mean, is finite in the dtype the scales are computed in (``dtype`` widened as
    :func:`widened` does); "" otherwise. Such a floor trains while the scales stay above it:
    only scales sitting at it overflow."""
    if not isinstance(likelihood, Gaussian) or likelihood.mode != "heteroscedastic":
        return ""
    dtype = torch.promote_types(dtype, torch.float32)
    limit = torch.finfo(dtype).max ** (-1 / 3)
    if likelihood.min_scale >= limit:
        return ""
    kind, wider = _dtype_words(dtype)
    return (
        f" The noise floor Gaussian(min_scale={likelihood.min_scale:g}) is below {limit:.3g}, "
        f"the smallest whose gradient at the floor (1/min_scale**3, for a target 1 away from "
        f"the mean) is finite in {kind}: scales that reach the floor make the loss or its "
        f"gradients inf or NaN. Raise min_scale to >= {limit:.3g} (1e-3 suggested){wider}."
    )


def learned_noise_advice(likelihood: Any) -> str:
    """A sentence for fit()'s "Non-finite loss" error when ``likelihood`` is a
    ``Gaussian("learned")`` whose scale is so small that the NLL's ``z**2`` of a target 1 away
    from the mean, ``1 / scale**2``, overflows its dtype; "" otherwise (read at the error, not
    at each step: the scale is the parameter of the last finite step)."""
    if not isinstance(likelihood, Gaussian) or likelihood.mode != "learned":
        return ""
    raw = likelihood.raw_scale
    if isinstance(raw, nn.UninitializedParameter) or raw is None:
        return ""
    raw = widened(raw.detach())
    scale = F.softplus(raw).clamp_min(torch.finfo(raw.dtype).tiny)  # as loc_scale() holds it
    limit = torch.finfo(scale.dtype).max ** (-1 / 2)
    if float(scale.min()) >= limit:
        return ""
    at = int(scale.argmin())
    kind, wider = _dtype_words(scale.dtype)
    return (
        f" The learned noise scale, Gaussian('learned'), has fallen to "
        f"{float(scale[at]):.3g} (softplus of raw_scale {float(raw[at]):.4g}, output {at}), "
        f"below {limit:.3g}: the NLL's z**2 (1/scale**2 for a target 1 away from the mean) "
        f"overflows {kind}. A learned scale falls towards 0 where the network fits the "
        "targets exactly; give the model a fixed noise scale (e.g. Gaussian(0.01)) or "
        f"Gaussian('heteroscedastic'), whose min_scale floors it{wider}."
    )
