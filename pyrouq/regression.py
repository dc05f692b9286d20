"""Gaussian predictions: S draws (or M members) of a mean and a standard deviation per input and
output, their mixture, its uncertainty decomposition and its proper scores.

The predictive distribution of one input and output is the equal-weight mixture of the S
Gaussians ``N(mu_s, sigma_s^2)``; every metric here is computed from that mixture exactly (its
density, CDF, quantiles and CRPS), not from a Gaussian fitted to it.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from pyrouq import _gaussian_moments as moments
from pyrouq._gaussian_moments import in_own_dtype, warn_of_overflow
from pyrouq._meta_device import refuse_meta as _refuse_meta
from pyrouq._metric_inputs import carried_targets
from pyrouq._mixture_terms import (
    cdf_gap,
    cdf_gap_work,
    crps_pair_mean,
    crps_pair_work,
    crps_term,
    mixture_mean,
)
from pyrouq._numbers import (
    finite_float,
    is_array_like,
    is_one_number,
    is_real,
    one_number,
    shown,
    text_hint,
)
from pyrouq._regression_targets import check_regression_targets
from pyrouq._to_args import device_and_dtype
from pyrouq._words import slip_hint
from pyrouq.uncertainty import Decomposition

__all__ = [
    "CALIBRATION_LEVELS",
    "INTERVAL_LEVELS",
    "GaussianPredictions",
    "mixture_crps",
]

#: The central intervals :meth:`GaussianPredictions.evaluate` scores (coverage and width).
INTERVAL_LEVELS: tuple[float, ...] = (0.5, 0.9, 0.95)

#: The quantile levels of the calibration error: 0.05, 0.10, ..., 0.95.
CALIBRATION_LEVELS: tuple[float, ...] = tuple(round(0.05 * j, 2) for j in range(1, 20))

_SQRT2 = math.sqrt(2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True, eq=False)
class GaussianPredictions:
    """Predictive means and standard deviations of S draws or members on N inputs, D outputs.

    Attributes
    ----------
    loc, scale : torch.Tensor
        ``(S, N, D)``: draw s predicts ``N(loc[s, n, d], scale[s, n, d]^2)`` for output d of
        input n. float16 and bfloat16 ones are kept as float32, as :func:`pyrouq.predict`
        makes them: their moments would overflow (a float16 standard deviation of 300 has the
        variance inf) or keep 3 digits.
    targets : torch.Tensor or None
        ``(N, D)`` real targets, when :func:`pyrouq.predict` read them from a loader of
        ``(x, y)`` batches. Given as ``(N,)`` when D = 1, they are kept as a column ``(N, 1)``
        (compare them with ``mean``, ``(N, D)``, not with ``(N,)`` tensors, which broadcast).

    Examples
    --------
    >>> import torch
    >>> p = GaussianPredictions(torch.tensor([[[0.0]], [[2.0]]]), torch.ones(2, 1, 1))
    >>> p.mean, p.variance  # law of total variance: 1 (aleatoric) + 1 (epistemic)
    (tensor([[1.]]), tensor([[2.]]))
    >>> d = p.uncertainty()
    >>> d.total.item(), d.aleatoric.item(), d.epistemic.item()
    (2.0, 1.0, 1.0)
    """

    loc: Tensor
    scale: Tensor
    targets: Tensor | None = field(default=None)

    def __post_init__(self) -> None:
        for name, value in (("loc", self.loc), ("scale", self.scale)):
            if not isinstance(value, Tensor) or not value.is_floating_point():
                got = (
                    f"a tensor of dtype {value.dtype}"
                    if isinstance(value, Tensor)
                    else type(value).__name__
                )
                raise TypeError(
                    f"Expected {name} to be a floating torch.Tensor (S, N, D), got {got}; pass "
                    f"torch.as_tensor({name}).float()."
                )
            if value.dim() != 3 or value.numel() == 0:
                raise ValueError(
                    f"Expected {name} of shape (S, N, D) with S, N, D >= 1, got shape "
                    f"{tuple(value.shape)}; predict() returns them so."
                )
            _refuse_meta(
                value,
                name,
                "there are no predictions to check. Pass the model's predictions, made with its "
                "weights loaded on a real device.",
            )
            if not bool(torch.isfinite(value).all()):  # which inputs, as Predictions says
                rows = (~torch.isfinite(value)).any(-1).any(0).nonzero()[:, 0]
                shown = ", ".join(map(str, rows[:5].tolist())) + (", ..." if len(rows) > 5 else "")
                raise ValueError(
                    f"Expected finite {name}, got NaN or inf at inputs [{shown}] ({len(rows)} of "
                    f"{value.shape[1]} inputs); check the model outputs there (did the fit "
                    "diverge?)."
                )
        if self.loc.shape != self.scale.shape:
            raise ValueError(
                f"Expected loc and scale of one shape, got {tuple(self.loc.shape)} and "
                f"{tuple(self.scale.shape)}."
            )
        if self.loc.dtype != self.scale.dtype or self.loc.device != self.scale.device:
            raise ValueError(
                f"Expected loc and scale of one dtype on one device, got {self.loc.dtype} on "
                f"{self.loc.device} and {self.scale.dtype} on {self.scale.device} (the "
                "decomposition's parts would come out in different dtypes); pass "
                "scale.to(loc) or loc.to(scale)."
            )
        if self.loc.dtype in (torch.float16, torch.bfloat16):  # as predict() makes them
            # in half precision the moments overflow (a float16 variance above 65504, a
            # standard deviation above 256, is inf) or keep 3 digits (bfloat16)
            object.__setattr__(self, "loc", self.loc.float())
            object.__setattr__(self, "scale", self.scale.float())
        if not bool((self.scale > 0).all()):
            bad = int((self.scale <= 0).sum())
            raise ValueError(
                f"Expected scale > 0 everywhere: they are standard deviations; got {bad} "
                f"value(s) <= 0, the smallest {float(self.scale.min()):g}. Pass standard "
                "deviations (not log-scales), floored above 0."
            )
        if self.targets is not None:
            object.__setattr__(self, "targets", self._check_targets(self.targets))

    def _check_targets(self, targets: object, name: str = "targets") -> Tensor:
        n, d = self.num_inputs, self.num_outputs
        return check_regression_targets(targets, n, d, name).to(self.loc.device)

    # -- shape ---------------------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """S, the number of draws or members."""
        return int(self.loc.shape[0])

    @property
    def num_inputs(self) -> int:
        """N, the number of inputs."""
        return int(self.loc.shape[1])

    @property
    def num_outputs(self) -> int:
        """D, the number of outputs per input."""
        return int(self.loc.shape[2])

    # -- moments -------------------------------------------------------------------------------

    @property
    def mean(self) -> Tensor:
        """The predictive mean ``(N, D)``: the mean of the draws' means, kept within their
        range (S identical draws give their value, not their sum / S, which can be an ulp off)."""
        return mixture_mean(self.loc)

    @property
    def aleatoric_variance(self) -> Tensor:
        """``mean_s sigma_s^2`` ``(N, D)``: the expected noise variance."""
        out = in_own_dtype(moments.aleatoric, self.loc, self.scale)
        warn_of_overflow(out, "aleatoric variance")
        return out

    @property
    def epistemic_variance(self) -> Tensor:
        """``var_s mu_s`` ``(N, D)`` (over the S draws, divided by S): the spread of the means."""
        out = in_own_dtype(moments.epistemic, self.loc, self.scale)
        warn_of_overflow(out, "epistemic variance")
        return out

    @property
    def variance(self) -> Tensor:
        """The predictive variance ``(N, D)`` by the law of total variance: aleatoric plus
        epistemic. Like the other moments, in the dtype of ``loc``: a float32 one above
        float32's largest number (3.4e38: scales past about 1.8e19) is inf, with a warning
        (``double()``'s moments have it)."""
        out = in_own_dtype(moments.total, self.loc, self.scale)
        warn_of_overflow(out, "variance")
        return out

    @property
    def stddev(self) -> Tensor:
        """The predictive standard deviation ``(N, D)`` (finite in float32 where its variance
        is above float32's largest number but it is not: taken from the float64 variance)."""
        out = in_own_dtype(moments.stddev, self.loc, self.scale)
        warn_of_overflow(out, "standard deviation")
        return out

    def uncertainty(self, measure: str = "variance") -> Decomposition:
        """Variances per input ``(N,)``: total = aleatoric + epistemic, each summed over the D
        outputs (the trace of the predictive covariance; one output: its variances).
        ``measure`` is there for the signature of :meth:`Predictions.uncertainty`; the variance
        is the one measure of a regression's draws."""
        if measure != "variance":
            why = slip_hint(measure, ("variance",))  # (did you mean 'variance'? ...)
            why = why or " (entropy and zero-one loss are classification measures)"
            raise ValueError(
                f"GaussianPredictions decompose the predictive variance only, got measure="
                f"{measure!r}{why}. Call uncertainty() or uncertainty('variance')."
            )
        loc, scale = self.loc, self.scale
        aleatoric = in_own_dtype(lambda *ls: moments.aleatoric(*ls).sum(-1), loc, scale)
        epistemic = in_own_dtype(lambda *ls: moments.epistemic(*ls).sum(-1), loc, scale)
        warn_of_overflow(total := aleatoric + epistemic, "total variance")
        return Decomposition(total, aleatoric, epistemic)

    # -- the mixture ---------------------------------------------------------------------------

    def log_prob(self, targets: Tensor | None = None) -> Tensor:
        """``log p(y_n)`` ``(N,)`` under the S-component mixture, the D outputs of one draw
        independent: ``logsumexp_s sum_d log N(y_d | mu_sd, sigma_sd) - log S``."""
        y = self._targets(targets).to(torch.float64)
        loc, scale = self.loc.double(), self.scale.double()
        z = (y - loc) / scale
        per_draw = (-0.5 * z.square() - scale.log() - _LOG_SQRT_2PI).sum(-1)  # (S, N)
        return torch.logsumexp(per_draw, 0) - math.log(self.num_samples)

    def cdf(self, value: Tensor | float) -> Tensor:
        """The mixture's CDF at ``value`` ``(N, D)`` (``(N,)`` when D = 1, or one number),
        per input and output: ``(N, D)``."""
        n, d = self.num_inputs, self.num_outputs
        if not (torch.is_tensor(value) or is_array_like(value) or is_real(value)):
            raise TypeError(
                f"Expected cdf's value to be one number or a tensor of shape ({n}, {d}), one per "
                f"input and output, got {type(value).__name__}; pass e.g. cdf(0.0) or cdf(y)."
            )
        _refuse_meta(
            value,
            "cdf's value",
            "there are no values to evaluate the CDF at. Pass the values themselves (on the "
            "cpu, or the device of loc).",
        )
        value = torch.as_tensor(value, dtype=torch.float64, device=self.loc.device)
        if value.dim() == 1 and d == 1 and value.shape[0] == n:
            value = value.unsqueeze(-1)
        if value.dim() and tuple(value.shape) != (n, d):
            raise ValueError(
                f"Expected cdf values of shape ({n}, {d})"
                + (f" or ({n},)" if d == 1 else "")
                + f", one per input and output, or one number, got shape {tuple(value.shape)}."
            )
        z = (value - self.loc.double()) / self.scale.double()
        return (0.5 * torch.erfc(-z / _SQRT2)).mean(0)  # (1 + erf) loses the lower tail

    def quantile(self, level: float) -> Tensor:
        """The mixture's ``level`` quantile ``(N, D)``, found by bisection on its CDF (to
        1e-12 of the bracket), not by a Gaussian approximation. Where the CDF is within
        rounding of a level k / S (between components far apart), the bisection compares
        its components' tails in log space, not the CDF rounded to k / S: the median of
        N(0, 1) and N(100, 1) is 50, not 8.29, where the rounded CDF first reads 0.5. Its
        gradient in ``loc`` and ``scale`` is the implicit one, ``dq = -dF(q) / f(q)`` (0
        where the density is 0)."""
        level = _level(level, "a quantile level")
        loc, scale = self.loc.double(), self.scale.double()
        graph = torch.is_grad_enabled() and (loc.requires_grad or scale.requires_grad)
        with torch.no_grad():  # the bisection's own graph ran through the bracket's ends
            lo = (loc - 40 * scale).amin(0)
            hi = (loc + 40 * scale).amax(0)
            # (in place in scale's float64 copy, when it is one and no gradient reads it)
            own = not graph and scale is not self.scale
            spread = scale.mul_(_SQRT2) if own else scale * _SQRT2
            target = level * self.num_samples  # a whole k where level is k / S but for rounding
            whole = round(target)  # (not 0 or S: a level near 0 or 1 is a tail's, not a tie)
            close = abs(target - whole) <= 8 * sys.float_info.epsilon * target
            if 0 < whole < self.num_samples and close:
                target = float(whole)  # (0.05 * 20 is 0.9999999999999998)
            work = cdf_gap_work(loc)  # (S, N, D) buffers for the 64 steps
            for _ in range(64):
                mid = 0.5 * (lo + hi)
                below = cdf_gap(loc, spread, mid, target, work) < 0
                lo = torch.where(below, mid, lo)
                hi = torch.where(below, hi, mid)
            q = 0.5 * (lo + hi)
            del work
        if not graph:
            return q
        # dq = sum_i w_i (dloc_i + z_i dscale_i), w_i the components' shares of the density
        # at q, taken in log space (a density that underflows still has its shares)
        z = ((q - loc) / scale).detach()
        log_density = -0.5 * z.square() - scale.detach().log()  # (but for a constant)
        w = torch.softmax(log_density.nan_to_num(-math.inf, -math.inf, -math.inf), dim=0)
        w = torch.where(torch.isfinite(w), w, 0.0)  # no density anywhere (scales of 0)
        moved = loc + torch.where(torch.isfinite(z), z, 0.0) * scale
        return q + (w * (moved - moved.detach())).sum(0)  # the value: q

    def interval(self, level: float) -> tuple[Tensor, Tensor]:
        """The central ``level`` interval ``(lo, hi)`` of the mixture, each ``(N, D)``."""
        tail = (1.0 - _level(level, "an interval level")) / 2
        return self.quantile(tail), self.quantile(1.0 - tail)

    def crps(self, targets: Tensor | None = None) -> Tensor:
        """The continuous ranked probability score ``(N,)`` of the mixture (closed form,
        Grimit et al. 2006), averaged over the D outputs; lower is better."""
        return mixture_crps(self.loc, self.scale, self._targets(targets)).mean(-1)

    # -- evaluation ----------------------------------------------------------------------------

    def evaluate(self, targets: Tensor | None = None) -> dict[str, float]:
        """The regression metrics, in the targets' units, averaged over inputs (and, except
        ``nll``, over the D outputs).

        Keys: ``rmse`` and ``mae`` of the predictive mean; ``nll``, the mean over inputs of
        ``-log p(y_n)`` under the mixture, ``y_n`` all D outputs of input n (a joint density,
        summed over the outputs' logs); ``crps``; ``coverage_50/90/95``, the fraction of
        targets inside the mixture's central intervals, and ``width_50/90/95``, their mean
        width; ``calibration_error``, the quantile calibration error of Kuleshov et al.
        (2018): ``mean_j (p_j - phat_j)^2`` over the levels :data:`CALIBRATION_LEVELS`, where
        ``phat_j`` is the fraction of targets with ``F(y) <= p_j``.
        """
        with torch.no_grad():  # floats out: no graph (nor torch's warning per float())
            return self._evaluate(targets)

    def _evaluate(self, targets: Tensor | None) -> dict[str, float]:
        y = self._targets(targets).to(torch.float64)
        error = self.double().mean - y  # a float32 mean of ~1000 is off by ~6e-5
        out = {
            "rmse": float(error.square().mean().sqrt()),
            "mae": float(error.abs().mean()),
            "nll": float(-self.log_prob(y).mean()),
            "crps": float(self.crps(y).mean()),
        }
        for level in INTERVAL_LEVELS:
            lo, hi = self.interval(level)
            inside = (y >= lo) & (y <= hi)
            key = round(100 * level)
            out[f"coverage_{key}"] = float(inside.double().mean())
            out[f"width_{key}"] = float((hi - lo).mean())
        expected, observed = self.calibration_curve(y)  # on the predictions' device
        out["calibration_error"] = float((observed - expected).square().mean())
        return out

    def calibration_curve(self, targets: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(expected, observed)``: the levels :data:`CALIBRATION_LEVELS` and the fraction of
        targets whose predictive CDF value is at most each level (calibrated: equal)."""
        pit = self.cdf(self._targets(targets)).flatten()
        levels = _levels().to(pit.device)
        observed = (pit.unsqueeze(0) <= levels.unsqueeze(1)).double().mean(1)
        return levels, observed

    def _targets(self, targets: Tensor | None, name: str = "targets") -> Tensor:
        if targets is None:  # the ones carried, checked when these predictions were made
            fix = (
                f"pass {name}=(N, D) values, or predict from a loader of (x, y) batches so "
                "that the predictions carry them"
            )
            return carried_targets(None, self, name, fix)  # type: ignore[no-any-return]
        return self._check_targets(targets, name)

    # -- conversions ---------------------------------------------------------------------------

    def rescale(self, mean: Tensor | float, std: Tensor | float) -> GaussianPredictions:
        """The predictions in other units, ``y = mean + std * y_standardised`` (per output):
        means shifted and scaled, standard deviations scaled, targets alike.

        Python numbers keep the predictions' dtype; float64 tensors (a :class:`Standardizer`
        fitted on float64 targets) make them float64, for a float32 mean of values near
        123456 is only good to ~0.004 (its spacing is 0.0078), whatever the model's
        accuracy in standardised units."""
        d = self.num_outputs
        dtype = self.loc.dtype
        for value in (mean, std):
            if torch.is_tensor(value) and value.is_floating_point():
                dtype = torch.promote_types(dtype, value.dtype)
        values = []
        for name, value in (("mean", mean), ("std", std)):
            got = f"a {value.dtype} tensor" if isinstance(value, Tensor) else type(value).__name__
            if (  # a real tensor (a bool one was taken as 0 and 1) or a real number
                value.dtype == torch.bool or value.is_complex()
                if isinstance(value, Tensor)
                else not is_real(value)
            ):
                fix = (  # numpy's (a scikit-learn scaler's mean_): float64 kept, as documented
                    f"pass torch.as_tensor({name})"
                    if is_array_like(value) and not isinstance(value, (Tensor, np.generic))
                    else "pass a real number, or a tensor of real numbers (a Standardizer's "
                    "y_mean and y_std)"
                )
                raise TypeError(
                    f"Expected rescale's {name} to be a float or a tensor of one value per "
                    f"output, got {got}; {fix}."
                )
            _refuse_meta(
                value,
                f"rescale's {name}",
                "there are no statistics to rescale with. Pass a Standardizer's y_mean and "
                "y_std, on any real device (they are moved to the predictions').",
            )
            try:
                t = torch.as_tensor(value, dtype=dtype, device=self.loc.device)
            except OverflowError:  # an int beyond every float (10**400): refused as not finite
                t = torch.tensor(math.inf, dtype=dtype, device=self.loc.device)
            if t.numel() not in (1, d) or t.dim() > 1:
                raise ValueError(
                    f"rescale's {name} has shape {tuple(t.shape)}, but the predictions have "
                    f"{d} output(s): pass one value, or one per output, ({d},). A Standardizer "
                    "rescales the predictions of a model trained on the targets it was fitted "
                    "on."
                )
            values.append(t.reshape(-1) if t.dim() else t)
        mean_t, std_t = values
        if bool((std_t <= 0).any()) or not bool(torch.isfinite(std_t).all()):
            raise ValueError(f"rescale's std must be finite and > 0, got {shown(std)}.")
        if not bool(torch.isfinite(mean_t).all()):  # else refused below as the model's NaN
            raise ValueError(
                f"rescale's mean must be finite, got {shown(mean)}: a Standardizer's y_mean, or "
                "the targets' mean in their units."
            )
        targets = None
        if self.targets is not None:  # in float64 if they or the statistics are
            wide = torch.promote_types(self.targets.dtype, dtype)
            targets = self.targets.to(wide) * std_t.to(wide) + mean_t.to(wide)
        loc, scale = self.loc.to(dtype), self.scale.to(dtype)
        return GaussianPredictions(loc * std_t + mean_t, scale * std_t, targets)

    def to(
        self,
        device: torch.device | str | torch.dtype | Tensor | None = None,
        dtype: torch.dtype | None = None,
    ) -> GaussianPredictions:
        """A copy on ``device`` and/or with the moments and targets in ``dtype``,
        ``torch.float32`` or ``torch.float64``, given as :meth:`Predictions.to
        <pyrouq.Predictions.to>` takes them: ``to("cuda")``, ``to(torch.float64)``,
        ``to("cuda", torch.float64)``, ``to(dtype=torch.float64)``, or ``to(tensor)`` (its
        device and dtype)."""
        where, into, came = device_and_dtype("GaussianPredictions.to()", device, dtype)
        if into is not None and into not in (torch.float32, torch.float64):
            raise TypeError(
                f"GaussianPredictions.to() takes torch.float32 or torch.float64 for the moments "
                f"and targets, got {came}{into!r}: the moments are computed in float32 or "
                "float64 (in half precision a variance above 65504 is inf) and the targets would "
                "be rounded. Pass torch.float32, torch.float64, or a device."
            )
        moved = {"device": where, "dtype": into}
        targets = None if self.targets is None else self.targets.to(**moved)
        return GaussianPredictions(self.loc.to(**moved), self.scale.to(**moved), targets)

    def double(self) -> GaussianPredictions:
        """The same predictions in float64 (their moments are then computed in float64:
        :meth:`evaluate` and the conformal intervals use it)."""
        targets = None if self.targets is None else self.targets.double()
        return GaussianPredictions(self.loc.double(), self.scale.double(), targets)

    def __repr__(self) -> str:
        return (
            f"GaussianPredictions(S={self.num_samples}, N={self.num_inputs}, "
            f"D={self.num_outputs}, targets={'yes' if self.targets is not None else 'no'})"
        )


def _level(level: object, what: str) -> float:
    """``level`` as a float in (0, 1), or a clear error."""
    _refuse_meta(level, what, "there is no level to read. Pass it as a number, e.g. 0.9.")
    if is_one_number(level) and not is_real(level):  # tensor(0.9), np.array(0.9): as a float
        level = one_number(level)
    if not (isinstance(level, numbers.Real) and not isinstance(level, bool)):
        raise TypeError(
            f"Expected {what} in (0, 1), one number, got {type(level).__name__}"
            f"{text_hint(level, 'level', 0, 1)}; e.g. 0.9."
        )
    number = finite_float(level)  # (None for 10**400, which float() refuses)
    if number is None or not 0.0 < number < 1.0:
        raise ValueError(
            f"Expected {what} in (0, 1), got {shown(level)}; e.g. 0.9"
            + (" (a 90 % interval)." if "interval" in what else " (the 90 % quantile).")
        )
    return number


def _levels() -> Tensor:
    return torch.tensor(CALIBRATION_LEVELS, dtype=torch.float64, device="cpu")


#: Values of one pairwise temporary of :func:`mixture_crps` (S * S * inputs * D, float64):
#: the inputs are taken in chunks that keep each within it (32 MB).
CRPS_PAIR_VALUES = 2**22


def mixture_crps(loc: Tensor, scale: Tensor, y: Tensor, chunk: int = 1024) -> Tensor:
    """CRPS ``(N, D)`` of the equal-weight mixture of ``N(loc[s], scale[s]^2)`` ``(S, N, D)``
    at ``y`` ``(N, D)`` (or ``(N,)`` when D = 1; ``(S, N)`` draws of one output give ``(N,)``):
    ``E|X - y| - E|X - X'| / 2`` in closed form (Grimit et al. 2006). A zero scale is a point
    mass: with all scales 0 it is the ensemble CRPS ``mean_s |x_s - y| - mean_st |x_s - x_t| / 2``.

    An infinite ``loc`` or ``scale`` among finite targets, or an infinite target among
    finite components, scores inf (the limit: the CRPS grows with the scale); both at once,
    NaN. NaN in ``loc`` or ``y`` is refused.

    The pairwise term costs S^2 per input and output: inputs are taken ``chunk`` (an int >=
    1) at a time, fewer when S is large, so that memory stays bounded
    (:data:`CRPS_PAIR_VALUES`); where no gradient is taken, every chunk works in one set of
    buffers (the same values)."""
    for name, value in (("loc", loc), ("scale", scale), ("y", y)):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"mixture_crps(): expected {name} as a tensor, got {type(value).__name__}; "
                f"convert it with torch.as_tensor({name})."
            )
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral) or chunk < 1:
        raise ValueError(
            f"mixture_crps(): expected chunk, the inputs scored at a time, an int >= 1, got "
            f"{chunk!r}."
        )
    for name, value in (("loc", loc), ("y", y)):
        if bool(value.isnan().any()):
            raise ValueError(
                f"mixture_crps(): {name} holds {int(value.isnan().sum())} NaN value(s); remove "
                "or repair those inputs (a NaN has no CRPS)."
            )
    if loc.dim() not in (2, 3) or scale.shape != loc.shape:
        raise ValueError(
            "mixture_crps(): expected loc and scale of one shape (S, N, D), or (S, N) for one "
            f"output, got {tuple(loc.shape)} and {tuple(scale.shape)}."
        )
    if loc.shape[0] == 0:  # the pairs' count below would divide by 0
        raise ValueError(
            f"mixture_crps(): expected at least one draw, got loc of shape {tuple(loc.shape)} "
            "(S = 0): the CRPS of a mixture of no components is undefined."
        )
    if scale.numel() and not bool((scale >= 0).all()):  # NaN included
        bad = scale[~(scale >= 0)]
        raise ValueError(
            f"mixture_crps(): expected scale >= 0 (standard deviations; 0 for point "
            f"predictions), got {bad.numel()} value(s) below 0 or NaN, e.g. {float(bad[0]):g}. "
            "Pass the components' standard deviations, not log-scales or variances."
        )
    if loc.dim() == 2:  # one output, and a CRPS (N,) per input
        if y.shape not in (loc.shape[1:], (loc.shape[1], 1)):  # not any y of N values
            raise ValueError(
                f"mixture_crps(): expected y of shape ({loc.shape[1]},) (or ({loc.shape[1]}, "
                f"1)), one target per input, as loc's {tuple(loc.shape)} (S, N), got "
                f"{tuple(y.shape)}."
            )
        return mixture_crps(loc[..., None], scale[..., None], y.reshape(-1, 1), chunk)[:, 0]
    if y.shape == loc.shape[1:2] and loc.shape[2] == 1:
        y = y[:, None]  # (N,) targets of one output
    if y.shape != loc.shape[1:]:
        raise ValueError(
            f"mixture_crps(): expected y of shape {tuple(loc.shape[1:])} (N, D), one target per "
            f"input and output, as loc's {tuple(loc.shape)}, got {tuple(y.shape)}."
        )
    loc, scale, y = loc.double(), scale.double(), y.double()
    pairs = loc.shape[0] ** 2 * max(1, math.prod(loc.shape[2:]))
    chunk = max(1, min(int(chunk), CRPS_PAIR_VALUES // pairs))
    graph = torch.is_grad_enabled() and (loc.requires_grad or scale.requires_grad)
    work = None if graph else crps_pair_work(loc, min(chunk, loc.shape[1]))
    out = []
    for start in range(0, loc.shape[1], chunk):
        m, s, t = (
            loc[:, start : start + chunk],
            scale[:, start : start + chunk],
            y[start : start + chunk],
        )
        var = s.square()
        first = crps_term(t - m, var).mean(0)
        if work is not None:  # one set of buffers for every chunk, the same values
            pair = crps_pair_mean(m, var, work)
        else:
            pair = crps_term(m.unsqueeze(0) - m.unsqueeze(1), var.unsqueeze(0) + var.unsqueeze(1))
            pair = pair.mean((0, 1))
        out.append(first - 0.5 * pair)
    if not out:  # N = 0: no inputs, no scores
        return y.new_zeros(y.shape)
    crps = torch.cat(out)
    wild = (loc.isinf() | scale.isinf()).any(0)  # inf - inf above: NaN, where the limit is inf
    return torch.where(wild != y.isinf(), math.inf, crps)
