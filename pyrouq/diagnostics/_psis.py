"""``psis_diagnostic`` (Pareto k-hat of a variational fit)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.poutine.util import site_is_subsample
from torch import Tensor

from pyrouq._default_device import under_cpu_default
from pyrouq._distribution_parts import is_discrete
from pyrouq._meta_device import real_device
from pyrouq._one_at_a_time import one_at_a_time
from pyrouq._own_models import check_traces_match, name_of
from pyrouq._seeded import draw_devices, seeded
from pyrouq._util import check_count, check_int
from pyrouq._wrappers import given_model
from pyrouq.convert import BayesianNetwork
from pyrouq.diagnostics._common import (
    _CONSTANT_WEIGHTS_RTOL,
    DEFAULT_PSIS_SAMPLES,
    K_HAT_GOOD,
    K_HAT_OK,
    MIN_PSIS_SAMPLES,
    _arviz,
    _check_callables,
    _check_data,
    _check_guide_finite,
    _masked,
    _outside,
    _outside_support,
    _prepared,
    _typed,
)
from pyrouq.diagnostics._replay import _latent_sites, _replayed_draws
from pyrouq.infer._elbo_checks import refuse_handlers_around
from pyrouq.infer._mask_or_scale import refuse_mask_or_scale_around
from pyrouq.infer.guide import check_guide
from pyrouq.mcmc import MCMCResult

# --------------------------------------------------------------------------------------------
# psis_diagnostic()
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PSISResult:
    """The Pareto k-hat check of a guide (Yao et al. 2018).

    Attributes
    ----------
    k_hat : float
        Estimated shape of the generalized Pareto distribution fitted to the largest
        importance ratios. ``-inf`` when the ratios are constant to numerical precision (the
        guide is the posterior up to normalisation), ``inf`` when no tail could be fitted.
    interpretation : str
        The usual reading: below 0.5 good, 0.5 to 0.7 usable, above 0.7 unreliable; from
        ``min(1 - 1/log10(S), 0.7)`` on (below 0.7 for S < 2155), it adds that S draws are too
        few for reliable PSIS estimates at that k-hat (Vehtari et al. 2024, as ``az.loo``).
    log_weights : torch.Tensor
        ``(S,)`` float64, the raw log importance ratios ``log p(w_s, D) - log q(w_s)``.
    smoothed_log_weights : torch.Tensor
        ``(S,)`` float64, the Pareto-smoothed log weights, normalised (their ``logsumexp``
        is 0), for importance-weighted estimates ``sum_s exp(lw_s) f(w_s)``.

    Examples
    --------
    >>> import pyro, torch
    >>> from pyrouq import BayesianMLP, mean_field_guide
    >>> pyro.set_rng_seed(0)
    >>> x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> result = psis_diagnostic(model, mean_field_guide(model), x, y, num_samples=100, seed=0)
    >>> result.k_hat > 0.7, result.interpretation.split()[0]  # an untrained guide
    (True, 'bad')
    >>> result.smoothed_log_weights.shape, abs(result.smoothed_log_weights.logsumexp(0)) < 1e-9
    (torch.Size([100]), tensor(True))
    """

    k_hat: float
    interpretation: str
    log_weights: Tensor
    smoothed_log_weights: Tensor

    @property
    def num_samples(self) -> int:
        """S, the number of guide draws."""
        return int(self.log_weights.shape[0])

    @property
    def reliable(self) -> bool:
        """Whether ``k_hat < min(1 - 1/log10(S), 0.7)``: importance-weighted estimates with
        these S draws can be used (Vehtari et al. 2024; ``az.loo`` warns from there on). The
        threshold is 0.7 from S = 2155 on, 0.5 at S = 100 and 0.28 at S = 25."""
        return self.k_hat < _good_k(self.num_samples)

    def __repr__(self) -> str:
        limit = K_HAT_GOOD if self.k_hat < K_HAT_GOOD else K_HAT_OK  # (0.4996 read "0.500")
        k_hat = _below(self.k_hat, limit, 3) if self.k_hat < K_HAT_OK else f"{self.k_hat:.3f}"
        return f"PSISResult(k_hat={k_hat}, S={self.num_samples}): {self.interpretation}"


def _below(k_hat: float, limit: float, first: int = 2) -> str:
    """``k_hat`` to ``first`` decimals, or to as many more as it takes to stay below ``limit``
    (0.498 shown as "0.50 < 0.5" read as a contradiction)."""
    for digits in range(first, 7):
        text = f"{k_hat:.{digits}f}"
        if float(text) < limit:
            return text
    return repr(k_hat)


def _good_k(num_samples: int) -> float:
    """``min(1 - 1/log10(S), 0.7)``: the k-hat below which S draws give reliable PSIS estimates
    (Vehtari et al. 2024, "Pareto smoothed importance sampling"; ``az.loo``'s ``good_k``)."""
    if num_samples < 2:  # (a hand-made result: log10(1) = 0)
        return -math.inf
    return min(1.0 - 1.0 / math.log10(num_samples), K_HAT_OK)


def _interpret(k_hat: float, num_samples: int) -> str:
    reading = _reading(k_hat)
    good = _good_k(num_samples)
    if good <= k_hat < K_HAT_OK:  # a k-hat arviz's az.loo warns of at this S
        needed = math.floor(10 ** (1.0 / (1.0 - k_hat))) + 1
        reading += (
            f" But S = {num_samples} draws are too few at this k-hat: PSIS estimates are "
            f"reliable below min(1 - 1/log10(S), 0.7) = {good:.2f} (Vehtari et al. 2024; az.loo "
            f"warns above it), which takes S > 10^(1/(1 - k-hat)), {needed:,} draws or more."
        )
    return reading


def _reading(k_hat: float) -> str:
    if k_hat == -math.inf:
        return (
            "good: the importance ratios are constant to numerical precision, so the guide "
            "equals the posterior up to normalisation."
        )
    if math.isnan(k_hat):
        return "unknown: the generalized Pareto fit failed; draw more samples."
    if k_hat < K_HAT_GOOD:
        return (
            f"good (k-hat {_below(k_hat, K_HAT_GOOD)} < {K_HAT_GOOD}): the guide is close to "
            "the posterior; importance-weighted estimates converge quickly."
        )
    if k_hat < K_HAT_OK:
        return (
            f"ok ({K_HAT_GOOD} <= k-hat {_below(k_hat, K_HAT_OK)} < {K_HAT_OK}): "
            "importance-weighted (PSIS) estimates are usable but converge slowly."
        )
    return (
        f"bad (k-hat {k_hat:.2f} >= {K_HAT_OK}): the variational approximation is unreliable "
        "for importance-weighted estimates, and Pareto smoothing does not fix it."
    )


def _unvalidated(fn: Any) -> list[tuple[Any, Any]]:
    """Switch torch's support check off on ``fn`` and the distributions it wraps (one built
    under validation, the first draw's, raises outside the support); what to restore."""
    chain, inner = [], fn  # the distribution and those it wraps (Independent, Expanded, ...)
    while isinstance(inner, torch.distributions.Distribution) and inner not in chain:
        chain.append(inner)
        inner = getattr(inner, "base_dist", None)
    saved = [(d, d.__dict__.get("_validate_args")) for d in chain]
    for d in chain:
        d._validate_args = False
    return saved


def _restore(saved: list[tuple[Any, Any]]) -> None:
    for d, was in saved:
        if was is None:
            d.__dict__.pop("_validate_args", None)
        else:
            d._validate_args = was


def _log_density(trace: poutine.Trace, observed_factor: float = 1.0) -> Tensor:
    """``sum`` of the (scaled, masked) log densities of a trace, float64; observed sites times
    ``observed_factor``, deterministic and subsample sites skipped; -inf where a latent value
    lies outside its support, whatever the other sites give (NaN, from a scale < 0 drawn)."""
    total, impossible = torch.zeros((), dtype=torch.float64), False
    site: Any
    for site in trace.nodes.values():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["is_observed"] and site["infer"].get("_deterministic"):
            continue
        fn, value = site["fn"], site["value"]
        saved = _unvalidated(fn)
        try:
            outside = None if _masked(site) else _outside(fn, value)
            if outside and site["is_observed"]:  # (before log_prob: a label out of range fails)
                raise ValueError(f"psis_diagnostic(): {_outside_support(site, outside)}")
            log_p = fn.log_prob(value)
        finally:
            _restore(saved)
        log_p = scale_and_mask(log_p, site["scale"], site["mask"])
        if outside:  # a guide draw the model cannot produce: weight 0, as importance sampling
            log_p = torch.full_like(torch.as_tensor(log_p), -math.inf)  # reads it
            impossible = True
        log_p = torch.as_tensor(log_p).double().sum().cpu()
        total = total + (log_p * observed_factor if site["is_observed"] else log_p)
    return torch.tensor(-math.inf, dtype=torch.float64) if impossible else total


def _check_all_points(trace: poutine.Trace, n: int, fn: str) -> None:
    """Refuse a model that observes a random subsample of the ``n`` points given (a plate's
    ``subsample_size`` smaller than N): each draw's log joint would then be that of other
    points, scaled up, and its noise would pass for a heavy tail of the ratios."""
    for site in trace.nodes.values():
        if site["type"] != "sample" or not site["is_observed"] or site_is_subsample(site):
            continue
        for frame in site["cond_indep_stack"]:
            full = frame.full_size
            if full is not None and frame.size < full and frame.size != n:
                raise ValueError(
                    f"{fn}: the model observes {site['name']!r} in plate {frame.name!r} "
                    f"subsampled to {frame.size} of {full}, on a data set of N = {n} points: "
                    "each guide draw would be weighed on other points, scaled by "
                    f"{full}/{frame.size}, and that noise would pass for the tail of the "
                    "importance ratios. Run the model on all of x: a subsample_size of "
                    "len(x) (or none) in the diagnostic."
                )


def _continuous_draws(trace: poutine.Trace) -> dict[str, Tensor]:
    """The values of a guide trace's latent sites of a continuous support."""
    draws = {}
    for name, site in _latent_sites(trace).items():
        if not is_discrete(site["fn"]) and torch.is_tensor(site["value"]):
            draws[name] = site["value"].detach().clone()
    return draws


def _check_spread(first: dict[str, Tensor], second: dict[str, Tensor], fn: str) -> None:
    """Refuse a guide whose first two draws are equal at every continuous latent site: a point
    mass (AutoDelta, a MAP fit), whose importance ratios are constant by construction."""
    if not first or first.keys() != second.keys():
        return
    if all(torch.equal(first[name], second[name]) for name in first):
        raise ValueError(
            f"{fn}: the guide draws the same value of every latent site each time "
            f"({', '.join(list(first)[:3])}{', ...' if len(first) > 3 else ''}): a point mass "
            "(AutoDelta, AutoLaplaceApproximation before its laplace_approximation(), a MAP "
            "fit), which has no density q(w). Its importance ratios are constant by "
            "construction, so a k-hat of -inf would say nothing about the fit. Check a guide "
            "that spreads its draws: AutoNormal, or guide.laplace_approximation(x, y) of an "
            "AutoLaplaceApproximation."
        )


@one_at_a_time
@under_cpu_default
@torch.no_grad()
def psis_diagnostic(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    *,
    num_samples: int | None = None,
    num_data: int | None = None,
    seed: int | None = None,
) -> PSISResult:
    """Pareto k-hat of the importance ratios ``p(w, D) / q(w)`` over draws of the guide.

    Draws ``w_s ~ q`` (``poutine.trace`` of the guide), replays the model on them
    (``poutine.replay``) and fits a generalized Pareto distribution to the largest ratios
    ``r_s = p(w_s, D) / q(w_s)`` (``az.psislw``, relative efficiency 1: the draws are
    independent). Its shape k-hat tells how heavy the tail of the ratios is, hence how far q
    is from the posterior where it matters for importance sampling (Yao, Vehtari, Simpson and
    Gelman 2018, "Yes, but did it work?: Evaluating variational inference"):

    * k-hat < 0.5: good; the ratios have finite variance.
    * 0.5 <= k-hat < 0.7: usable; PSIS estimates converge, slowly.
    * k-hat >= 0.7: the variational approximation is unreliable for importance-weighted
      estimates (and likely in its posterior expectations too).

    These readings are Yao et al.'s, of the guide. Whether S draws suffice for PSIS estimates
    is the sample-size threshold ``min(1 - 1/log10(S), 0.7)`` of Vehtari et al. (2024) that
    ``az.loo`` warns from (0.5 at S = 100, 0.28 at S = 25): ``PSISResult.reliable`` is
    ``k_hat`` below it, and the interpretation says so where a k-hat below 0.7 is above it.

    The log joint is ``log p(w) + sum_n log p(y_n | x_n, w)`` on the data given: ``x, y`` are
    taken to be the whole data set D, and the observed sites enter with the model's own
    scale, with a pyrouq model's ``num_data`` set to N = ``len(x)`` meanwhile (so its N/B
    scale is 1; the attribute is restored afterwards). ``num_data=M`` instead treats ``x, y``
    as a sample of a data set of M points: every observed site is multiplied by ``M / N``.

    A guide draw outside the support of a latent site weighs 0 (log ratio -inf; every draw
    outside is an error, with no tail to fit), and observed data outside their distribution's
    support are refused: both are checked entry by entry where the support is declared,
    whatever Pyro's validation setting, but not for sites a mask leaves entries of
    (``poutine.mask``, ``.mask()``) nor for mixtures.

    .. warning:: For full-size networks (the MNIST MLP or LeNet under a mean-field guide)
       k-hat is expected to be large, often far above 1: with tens of thousands of weights and
       60k observations the log ratios spread over hundreds of nats, and no mean-field guide
       matches that posterior closely enough for importance sampling. That is an honest
       result, not a bug: it says the guide is a useful approximation for prediction, not one
       to reweight. The diagnostic is informative for models with few latent variables (the
       example below, a last layer, a small network on small data).

    Parameters
    ----------
    model : callable
        A Pyro model ``model(x, y)`` (pyrouq model or any other) with the data observed.
        Its observed sites must not subsample: run it on all of ``x`` (see Raises).
    guide : callable
        A guide of ``model``, called as ``guide(x, y)``, that samples every latent site. A
        point mass (``AutoDelta``, a MAP fit: the same value of every site at each draw) has
        no density q(w) and is refused, and so is a guide whose parameters hold NaN or inf (a
        fit that diverged).
    x, y : torch.Tensor
        ``(N, ...)`` inputs and targets, the data set D (floating inputs are cast to the
        model's dtype, as by ``predict()``).
    num_samples : int, optional
        Draws S from the guide (>= 25, default 1000). Each costs one run of the model on all
        of x.
    num_data : int, optional
        Size M of the data set that ``x, y`` stand for (the likelihood is scaled by M / N);
        default N (no scaling).
    seed : int, optional
        In ``[0, 2**32 - 1]``. Given, the guide's draws come from torch's streams seeded with
        it, those of the CPU and of the model's device, as ``pyro.set_rng_seed(seed)`` before
        the call would seed them, inside a fork of the random state: two calls with one seed
        give the same k-hat and log weights to the bit, and torch's global streams are left
        as they were. None (default): the draws come from the global streams, which the call
        advances.

    Returns
    -------
    PSISResult

    Raises
    ------
    TypeError
        x or y not a tensor; a model or guide that is not callable (a FitResult); an
        MCMCResult as the guide or the model (MCMC draws have no density q(w)); a guide passed
        as the model (the two swapped); integer, bool or complex x for a pyrouq model; x of
        another float dtype than the priors of one's own model whose autoguide is not fitted.
    ValueError
        x and y empty or of different lengths, NaN/inf inputs, num_samples < 25, num_data < 1, no
        guide, the model as its own guide; labels outside ``[0, C)`` (or observed values outside
        their distribution's support); a guide of another model, a point mass (``AutoDelta``) or one
        whose parameters hold NaN or inf; a model or guide on the meta device, a model without
        latent sites or one observing a plate subsampling fewer points than ``len(x)``; around
        the call of a pyrouq model (which has its own plate ``"data"``), a vectorised
        ``pyro.plate`` or a ``pyro.poutine.condition()`` or ``pyro.poutine.do()`` fixing one of
        its latent sites (or a condition() giving one None); around any model's call a
        ``poutine.mask`` or ``poutine.scale`` (but of True or 1: they weigh model and guide
        alike, latent sites too: other ratios); log ratios NaN or +inf, or all -inf.

    Examples
    --------
    Bayesian linear regression with a known noise scale, whose posterior is Gaussian and
    known in closed form, checked with the exact posterior as the guide and with a wrong one:

    >>> import pyro, torch
    >>> import pyro.distributions as dist
    >>> pyro.set_rng_seed(0)
    >>> x = torch.randn(30, 2, dtype=torch.float64)
    >>> y = x @ torch.tensor([1.0, -2.0], dtype=torch.float64) + 0.5 * torch.randn(30).double()
    >>> def model(x, y):
    ...     w = pyro.sample("w", dist.Normal(torch.zeros(2).double(), 1.0).to_event(1))
    ...     with pyro.plate("data", len(x)):
    ...         pyro.sample("obs", dist.Normal(x @ w, 0.5), obs=y)
    >>> precision = x.T @ x / 0.25 + torch.eye(2).double()
    >>> cov = torch.linalg.inv(precision)
    >>> mean, tril = cov @ x.T @ y / 0.25, torch.linalg.cholesky(cov)
    >>> def exact(x, y):
    ...     pyro.sample("w", dist.MultivariateNormal(mean, scale_tril=tril))
    >>> def wrong(x, y):
    ...     pyro.sample("w", dist.Normal(mean + 0.2, 0.05).to_event(1))
    >>> psis_diagnostic(model, exact, x, y).k_hat < 0.5
    True
    >>> psis_diagnostic(model, wrong, x, y).k_hat > 0.7
    True
    """
    fn = "psis_diagnostic()"
    model, guide = given_model(model), given_model(guide)  # (DDP-, DataParallel-, compile-wrapped)
    if seed is not None:  # the whole call in a seeded fork of torch's random state
        with seeded(seed, fn, draw_devices(model, guide, x)):
            return psis_diagnostic(model, guide, x, y, num_samples=num_samples, num_data=num_data)
    az = _arviz()
    n = _check_data(fn, x, y)
    hint = (
        f"k-hat is fitted to the largest fifth of the importance ratios; use a few hundred "
        f"draws or more (default {DEFAULT_PSIS_SAMPLES})."
    )
    num_samples = check_int(
        "num_samples",
        DEFAULT_PSIS_SAMPLES if num_samples is None else num_samples,
        MIN_PSIS_SAMPLES,
        hint,
    )
    factor = 1.0
    if num_data is not None:
        factor = check_count("num_data", num_data, "It is the size of the full data set.") / n
    if isinstance(guide, MCMCResult) or isinstance(model, MCMCResult):
        raise TypeError(
            f"{fn}: got an MCMCResult; the diagnostic weighs a guide's draws by their density "
            "q(w), which MCMC draws have none of. Check MCMC chains on their export, "
            "idata = to_inference_data(result), with az.rhat(idata), az.ess(idata) and "
            "az.loo(idata); check a guide with psis_diagnostic(model, guide, x, y)."
        )
    if guide is None:
        raise ValueError(
            f"{fn}: guide is None. The diagnostic compares a guide q(w) with the posterior; "
            "pass the fitted guide (a BatchEnsemble has neither: use to_inference_data() and "
            "az.loo for it)."
        )
    _check_callables(fn, model, guide)
    # (before the guide check, not to tell to move the guide; reused below)
    device = real_device(fn, model, guide)
    refuse_handlers_around(model, fn, "log density", trace=False)  # (plate, condition)
    refuse_mask_or_scale_around(fn)  # (weighing the model and the guide alike)
    check_guide(model, guide, fn)
    _check_guide_finite(guide, fn)
    if device is not None:
        x, y = x.to(device), y.to(device)
    x = _typed(x, model, guide, fn)
    if isinstance(model, BayesianNetwork):  # its refusal of x's shape, as predict() words it
        model._check_input(x)  # (raised inside Pyro's trace, it came with Pyro's site table)
    log_weights = torch.empty(num_samples, dtype=torch.float64)
    first: dict[str, Tensor] = {}
    with _prepared(model, n):
        draws = _replayed_draws(model, guide, x, y, num_samples, fn, replay_outside=True)
        for s, guide_trace, model_trace in draws:
            if s == 0:
                check_traces_match(model_trace, guide_trace, fn, model, guide)
                if not _latent_sites(model_trace):
                    raise ValueError(
                        f"{fn}: {name_of(model)} has no latent sites, so there is no "
                        "posterior to compare the guide with."
                    )
                _check_all_points(model_trace, n, fn)
                first = _continuous_draws(guide_trace)
            elif s == 1:
                _check_spread(first, _continuous_draws(guide_trace), fn)
            log_weights[s] = _log_density(model_trace, factor) - _log_density(guide_trace)
    if torch.isnan(log_weights).any() or (log_weights == math.inf).any():
        bad = int((torch.isnan(log_weights) | (log_weights == math.inf)).sum())
        raise ValueError(
            f"{fn}: {bad} of {num_samples} log importance ratios are NaN or +inf. Check that "
            "the guide's support lies inside the model's and that the model's densities are "
            "finite at the guide's draws."
        )
    finite = log_weights[torch.isfinite(log_weights)]
    if finite.numel() == 0:  # (az.psislw: NaN weights, numpy's warnings, k-hat inf)
        raise ValueError(
            f"{fn}: all {num_samples} log importance ratios are -inf (weight 0): every guide "
            "draw lies outside the support of a latent site of the model, or gives the data "
            "zero likelihood, so there is no tail to fit. Use a guide that draws inside the "
            "model's support (AutoNormal and mean_field_guide transform to it)."
        )
    spread = float(finite.max() - finite.min()) if finite.numel() else 0.0
    size = float(finite.abs().max()) if finite.numel() else 0.0
    if finite.numel() == num_samples and spread <= _CONSTANT_WEIGHTS_RTOL * max(1.0, size):
        k_hat = -math.inf
        smoothed = torch.full_like(log_weights, -math.log(num_samples))
    else:
        lw, k = az.psislw(log_weights.numpy().copy(), reff=1.0)
        k_hat = float(k)
        smoothed = torch.as_tensor(np.asarray(lw, dtype=np.float64))
    return PSISResult(
        k_hat=k_hat,
        interpretation=_interpret(k_hat, num_samples),
        log_weights=log_weights,
        smoothed_log_weights=smoothed,
    )
