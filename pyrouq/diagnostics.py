"""Posterior diagnostics with arviz: ``InferenceData`` export, PSIS-LOO and the PSIS check of a
variational fit.

The only pyrouq module that uses arviz, and it imports it inside its functions, so
``import pyrouq`` stays fast and works without it.

Shape convention: S posterior draws or ensemble members, N inputs, C classes. Guide draws are
independent, so an export holds one chain of S draws; ``az.loo`` and ``az.waic`` work on it,
while R-hat and the MCMC effective sample sizes carry no information about it.

* :func:`to_inference_data` -- ``arviz.InferenceData`` with the posterior (guide draws of the
  latent sites), the posterior predictive, the pointwise log-likelihood and the observed data.
* :func:`psis_diagnostic` -- the Pareto k-hat of the importance ratios ``p(w, D) / q(w)`` over
  guide draws (Yao et al. 2018, "Yes, but did it work?: Evaluating variational inference").
* :func:`summary` -- ``az.summary(kind="stats")`` of an export.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer.util import is_validation_enabled
from pyro.poutine.util import site_is_subsample
from torch import Tensor, nn

from pyrouq._util import check_count, check_int, has_latent_sites, module_device
from pyrouq.predictive import _is_ensemble

if TYPE_CHECKING:
    import arviz
    import pandas

__all__ = [
    "DEFAULT_IDATA_SAMPLES",
    "DEFAULT_PSIS_SAMPLES",
    "K_HAT_GOOD",
    "K_HAT_OK",
    "PSISResult",
    "psis_diagnostic",
    "summary",
    "to_inference_data",
]

DEFAULT_IDATA_SAMPLES = 100
"""Guide draws S exported by :func:`to_inference_data` when ``num_samples`` is None."""

DEFAULT_PSIS_SAMPLES = 1000
"""Guide draws S used by :func:`psis_diagnostic` when ``num_samples`` is None."""

MIN_PSIS_SAMPLES = 25
"""Fewest draws :func:`psis_diagnostic` accepts: k-hat is fitted to the largest fifth of the
weights, and the fit needs at least five of them."""

K_HAT_GOOD = 0.5
"""Below this k-hat the importance ratios have finite variance: the guide is good."""

K_HAT_OK = 0.7
"""From this k-hat on, importance-weighted estimates with the guide are unreliable."""

_CONSTANT_WEIGHTS_RTOL = 1e-5
"""Log weights whose spread is below this (relative to their size) are taken as constant."""

_ARVIZ_HINT = "pip install 'arviz>=0.20,<1' (it comes with pyrouq's default dependencies)"


def _arviz() -> Any:
    """Import arviz (once), without its notice about the coming 1.0 refactor."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="ArviZ is undergoing", category=FutureWarning)
            import arviz
    except ImportError as e:  # pragma: no cover - arviz is a dependency
        raise ImportError(f"pyrouq.diagnostics needs arviz: {_ARVIZ_HINT}.") from e
    return arviz


# --------------------------------------------------------------------------------------------
# Argument checks and model helpers
# --------------------------------------------------------------------------------------------


def _check_data(fn: str, x: object, y: object) -> int:
    """N, after checking that x and y are tensors holding the same number of points."""
    for name, value in (("x", x), ("y", y)):
        if not torch.is_tensor(value):
            raise TypeError(
                f"{fn}: expected {name} to be a torch.Tensor, got {type(value).__name__}. "
                "Pass tensors holding every point (e.g. torch.cat over a loader's batches)."
            )
        if value.dim() == 0:
            raise ValueError(
                f"{fn}: expected {name} with a leading dimension of N points, got a scalar."
            )
    assert isinstance(x, Tensor) and isinstance(y, Tensor)
    if x.shape[0] != y.shape[0]:
        raise ValueError(
            f"{fn}: x and y must hold the same number of points, got x with "
            f"{x.shape[0]} (shape {tuple(x.shape)}) and y with {y.shape[0]} (shape "
            f"{tuple(y.shape)}). Pass one target per input."
        )
    if x.shape[0] == 0:
        raise ValueError(f"{fn}: x and y are empty. Pass at least one point.")
    return int(x.shape[0])


def _check_labels(fn: str, y: Tensor, num_classes: int) -> None:
    if y.dim() != 1 or y.dtype.is_floating_point or y.dtype == torch.bool:
        raise ValueError(
            f"{fn}: expected y as (N,) integer class labels, got shape {tuple(y.shape)} and "
            f"dtype {y.dtype}. Use y.long()."
        )
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= num_classes:
        raise ValueError(
            f"{fn}: labels must lie in [0, {num_classes}), got values in [{lo}, {hi}]. Check "
            "the targets or the model's number of classes."
        )


def _check_var_names(var_names: str | Sequence[str] | None, valid: Sequence[str]) -> list[str]:
    """The requested latent sites, in the model's order; every site when ``var_names`` is None."""
    if var_names is None:
        return list(valid)
    names = [var_names] if isinstance(var_names, str) else list(var_names)
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise ValueError(
            f"Unknown var_names {unknown}: the latent sites are {list(valid)}. Pass a subset "
            "of these, or var_names=None for all of them."
        )
    return [n for n in valid if n in names]


def _latent_sites(trace: poutine.Trace) -> dict[str, Any]:
    return {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and not site_is_subsample(site)
    }


def _replayed_draws(
    model: Any, guide: Any, x: Tensor, y: Tensor, num_samples: int
) -> Iterator[tuple[int, Any, Any]]:
    """``(s, guide_trace, model_trace)`` for S guide draws, the model replayed on each.

    The first draw runs under the caller's validation setting, the rest without (speed).
    """
    validate = is_validation_enabled()
    for s in range(num_samples):
        with pyro.validation_enabled(s == 0 and validate):
            guide_trace = poutine.trace(guide).get_trace(x, y)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
        yield s, guide_trace, model_trace


def _check_guide_covers(model_trace: poutine.Trace, guide_trace: poutine.Trace) -> None:
    missing = [n for n in _latent_sites(model_trace) if n not in guide_trace.nodes]
    if missing:
        raise ValueError(
            f"The model's latent site(s) {missing} are missing from the guide, so they would "
            "be drawn from the prior. Build the guide for this model (mean_field_guide(model) "
            "or pyro.infer.autoguide.AutoNormal(model))."
        )


@contextlib.contextmanager
def _prepared(model: Any, num_points: int) -> Iterator[None]:
    """Evaluation mode, and a pyrouq model's ``num_data`` set to ``num_points`` (scale N/B = 1),
    both restored on exit."""
    training = model.training if isinstance(model, nn.Module) else None
    has_num_data = hasattr(model, "num_data")
    saved = getattr(model, "num_data", None)
    if isinstance(model, nn.Module):
        model.eval()
    if has_num_data:
        model.num_data = num_points
    try:
        yield
    finally:
        if has_num_data:
            model.num_data = saved
        if training:
            model.train()


def _weight_dims(site: str, ndim: int) -> list[str] | None:
    """Named dims of a weight or bias site, torch's layout: ``(out, in[, kh, kw])``."""
    layer, _, kind = site.rpartition(".")
    if not layer:
        return None
    prefix = layer.replace(".", "_")
    if kind == "weight" and ndim == 2:
        return [f"{prefix}_out", f"{prefix}_in"]
    if kind == "weight" and ndim == 4:
        return [f"{prefix}_out", f"{prefix}_in", f"{prefix}_kh", f"{prefix}_kw"]
    if kind == "bias" and ndim == 1:
        return [f"{prefix}_out"]
    return None


# --------------------------------------------------------------------------------------------
# to_inference_data()
# --------------------------------------------------------------------------------------------


class _Draws:
    """``(S, ...)`` CPU tensors, filled one draw at a time."""

    def __init__(self, num_draws: int):
        self.num_draws = num_draws
        self.values: dict[str, Tensor] = {}

    def alloc(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        self.values[name] = torch.empty((self.num_draws, *shape), dtype=dtype)
        return self.values[name]

    def put(self, name: str, s: int, value: Tensor) -> None:
        """Store draw ``s`` of ``name`` (allocated on its first value)."""
        if name not in self.values:
            self.alloc(name, tuple(value.shape), value.dtype)
        self.values[name][s] = value.detach().cpu()

    def numpy(self, name: str) -> np.ndarray:
        return self.values[name].numpy()[None]  # (chain=1, draw=S, ...)


def _store_logits(
    out: _Draws, draws: int | slice, cols: slice, logits: Tensor, y: Tensor, n: int
) -> None:
    """Store probs ``(S, N, C)`` and the pointwise log-likelihood ``(S, N)`` of logits
    ``(B, C)`` (draw ``draws``) or ``(S, B, C)`` (every member, ``draws=slice(None)``) on the
    points ``cols`` of the labels ``y`` ``(N,)``."""
    if "probs" not in out.values:  # the first batch: C is known now
        _check_labels("to_inference_data()", y, logits.shape[-1])
        out.alloc("probs", (n, logits.shape[-1]), torch.float32)
        out.alloc("log_lik", (n,), torch.float64)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    out.values["probs"][draws, cols] = log_probs.exp().float().cpu()
    target = y[cols].expand(*log_probs.shape[:-1]).unsqueeze(-1)
    out.values["log_lik"][draws, cols] = log_probs.gather(-1, target).squeeze(-1).cpu()


@torch.no_grad()
def to_inference_data(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    *,
    num_samples: int | None = None,
    var_names: str | Sequence[str] | None = None,
    batch_size: int = 1024,
) -> arviz.InferenceData:
    """Export draws, predictions and pointwise log-likelihoods as ``arviz.InferenceData``.

    Groups (one chain: the draws of a guide are independent):

    * ``posterior`` -- S guide draws of every latent site (or of those in ``var_names``),
      shaped ``(chain=1, draw=S, *site_shape)``. Weight and bias sites get named dims in
      torch's layout: ``fc1.weight`` is ``(fc1_out, fc1_in)``, ``conv1.weight``
      ``(conv1_out, conv1_in, conv1_kh, conv1_kw)``, ``fc1.bias`` ``(fc1_out,)``.
    * ``posterior_predictive`` -- ``obs``: ``(1, S, N)`` labels drawn from each draw's
      predictive distribution; ``probs``: ``(1, S, N, C)`` those distributions (classifiers).
    * ``log_likelihood`` -- ``obs``: ``(1, S, N)``, ``log p(y_n | x_n, w_s)`` (unscaled,
      float64), so ``az.loo`` and ``az.waic`` work.
    * ``observed_data`` -- ``obs``: ``y``, ``(N,)``.

    Every per-point variable has the dim ``obs_id`` (coordinates ``0..N-1``); ``probs`` also
    has ``class`` (``0..C-1``).

    A BatchEnsemble has no guide and no latent variables: its M members take the place of the
    draws (S = M) in ``posterior_predictive`` and ``log_likelihood``, and there is **no
    posterior group**, since the members are not draws from a posterior over any variable (the
    shared weights and rank-1 factors are point estimates). ``az.loo`` then treats the members
    as S = M equally weighted draws; without a posterior it cannot estimate their relative
    efficiency, so call it as ``az.loo(idata, reff=1.0)``, and with a handful of members its
    Pareto k warnings are expected.

    Memory: the posterior group holds ``S * (number of weights)`` values in the guide's dtype
    (float32): for ``BayesianLeNet`` (44k weights) and S = 100 about 18 MB, for the default
    784-256-10 ``BayesianMLP`` (204k weights) about 81 MB. ``var_names`` exports a subset;
    only one draw of the other sites is held at a time. The predictive groups take
    ``S * N * (C + 3)`` values more. Inputs are evaluated ``batch_size`` at a time.

    Parameters
    ----------
    model : PyroModule or callable
        A pyrouq Bayesian model (made by :func:`pyrouq.bayesian`, ``BayesianLeNet``, ...:
        its network runs with each draw's weights), a BatchEnsemble (``guide=None``), or any
        Pyro model ``model(x, y)`` whose observed site ``"obs"`` lies in a plate over the N
        points (its pointwise ``log_prob`` is ``(N,)``) and whose latent variables are global;
        such a model is run on all of ``x`` once per draw.
    guide : callable or None
        The fitted guide (``mean_field_guide(model)``, an autoguide, ...), called as
        ``guide(x, y)`` once per draw (on the first ``batch_size`` points for a pyrouq
        model); None for a BatchEnsemble.
    x : torch.Tensor
        ``(N, ...)`` inputs.
    y : torch.Tensor
        ``(N,)`` targets (class labels for the pyrouq models).
    num_samples : int, optional
        Draws S from the guide (>= 1, default 100). Must stay None for a BatchEnsemble, whose
        S is its number of members.
    var_names : str or sequence of str, optional
        Latent sites exported to the posterior group (default: all). The predictive groups
        always use every site.
    batch_size : int, default 1024
        Inputs per forward pass (pyrouq models).

    Returns
    -------
    arviz.InferenceData

    Raises
    ------
    TypeError
        x or y not a tensor.
    ValueError
        x and y of different lengths, num_samples < 1, unknown var_names, labels outside
        ``[0, C)``, no guide for a model with latent sites, a guide (or num_samples,
        var_names) for a BatchEnsemble.

    Examples
    --------
    >>> import pyro, torch
    >>> from pyrouq import BayesianMLP, mean_field_guide
    >>> pyro.set_rng_seed(0)
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> guide = mean_field_guide(model, init_scale=0.1)
    >>> x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
    >>> idata = to_inference_data(model, guide, x, y, num_samples=50)
    >>> idata.groups()
    ['posterior', 'posterior_predictive', 'log_likelihood', 'observed_data']
    >>> idata.posterior["fc1.weight"].dims
    ('chain', 'draw', 'fc1_out', 'fc1_in')
    >>> idata.log_likelihood["obs"].shape
    (1, 50, 20)
    """
    fn = "to_inference_data()"
    az = _arviz()
    n = _check_data(fn, x, y)
    batch_size = check_int("batch_size", batch_size)
    if num_samples is not None:
        check_count(
            "num_samples",
            num_samples,
            f"It is the number of guide draws S (default {DEFAULT_IDATA_SAMPLES}).",
        )
    device = module_device(model, guide)
    xd = x if device is None else x.to(device)
    yd = y if device is None else y.to(device)
    posterior_dims: dict[str, list[str]] = {}

    if guide is None:
        if has_latent_sites(model):
            raise ValueError(
                f"{fn}: {type(model).__name__} has latent sites but guide is None. Pass its "
                "fitted guide, e.g. to_inference_data(model, guide, x, y) with guide = "
                "mean_field_guide(model) after fit()."
            )
        if not _is_ensemble(model):
            raise ValueError(
                f"{fn}: guide is None, and {type(model).__name__} is not a BatchEnsemble. "
                "Pass the guide of the model's latent variables."
            )
        for name, value in (("num_samples", num_samples), ("var_names", var_names)):
            if value is not None:
                raise ValueError(
                    f"{fn}: {name}={value!r} given for a BatchEnsemble "
                    f"({type(model).__name__}): its {model.num_members} members are the "
                    "draws and it has no posterior group. Leave it None."
                )
        out = _export_ensemble(model, xd, yd, n, batch_size)
        keep: list[str] = []
    else:
        if _is_ensemble(model):
            raise ValueError(
                f"{fn}: a guide was given for a BatchEnsemble ({type(model).__name__}), which "
                f"has no latent sites: its {model.num_members} members take the place of "
                "posterior draws. Pass guide=None."
            )
        s = num_samples if num_samples is not None else DEFAULT_IDATA_SAMPLES
        if has_latent_sites(model) and callable(getattr(model, "outputs", None)):
            keep = _check_var_names(var_names, list(model.latent_sites()))
            out = _export_bayesian(model, guide, xd, yd, n, s, keep, batch_size)
        else:
            out, keep = _export_pyro(model, guide, xd, yd, n, s, var_names)
        for name in keep:
            site_dims = _weight_dims(name, out.values[name].dim() - 1)
            if site_dims is not None:
                posterior_dims[name] = site_dims

    coords: dict[str, Any] = {"obs_id": np.arange(n)}
    dims: dict[str, list[str]] = {"obs": ["obs_id"], **posterior_dims}
    predictive = {"obs": out.numpy("obs")}
    if "probs" in out.values:
        predictive["probs"] = out.numpy("probs")
        coords["class"] = np.arange(out.values["probs"].shape[-1])
        dims["probs"] = ["obs_id", "class"]
    idata = az.from_dict(
        posterior={name: out.numpy(name) for name in keep} or None,
        posterior_predictive=predictive,
        log_likelihood={"obs": out.numpy("log_lik")},
        observed_data={"obs": y.detach().cpu().numpy()},
        coords=coords,
        dims=dims,
    )
    from pyrouq import __version__

    attrs = {
        "inference_library": "pyro",
        "inference_library_version": pyro.__version__,
        "creation_library": "pyrouq",
        "creation_library_version": __version__,
        "model": type(model).__name__,
        "draws": "ensemble members" if guide is None else "independent guide draws",
    }
    for group in idata.groups():
        idata[group].attrs.update(attrs)
    return idata


def _batches(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, batch_size):
        yield slice(start, min(start + batch_size, n))


def _sample_obs(out: _Draws) -> None:
    """Draw ``obs`` from the stored ``(S, N, C)`` probabilities, one draw at a time (the random
    stream then does not depend on ``batch_size``)."""
    probs = out.values["probs"]
    for s in range(probs.shape[0]):
        out.put("obs", s, torch.distributions.Categorical(probs=probs[s]).sample())


def _export_bayesian(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    n: int,
    num_samples: int,
    keep: list[str],
    batch_size: int,
) -> _Draws:
    """A pyrouq Bayesian model: one guide draw at a time, its network run with the draw."""
    out = _Draws(num_samples)
    first = slice(0, min(batch_size, n))
    with _prepared(model, n):
        for s in range(num_samples):
            # The first draw runs under the caller's validation setting, the rest without.
            with pyro.validation_enabled(s == 0 and is_validation_enabled()):
                trace = poutine.trace(guide).get_trace(x[first], y[first])
            weights = {name: site["value"] for name, site in _latent_sites(trace).items()}
            missing = [name for name in model.latent_sites() if name not in weights]
            if missing:
                raise ValueError(
                    f"The guide did not sample the model's latent site(s) {missing}. Build "
                    "the guide for this model (mean_field_guide(model))."
                )
            for name in keep:
                out.put(name, s, weights[name])
            for cols in _batches(n, batch_size):
                logits = model.outputs(x[cols], weights)
                _store_logits(out, s, cols, logits, y, n)
    _sample_obs(out)
    return out


def _export_ensemble(model: Any, x: Tensor, y: Tensor, n: int, batch_size: int) -> _Draws:
    """A BatchEnsemble: the M members are the draws."""
    out = _Draws(int(model.num_members))
    with _prepared(model, n), pyro.validation_enabled(False):
        for cols in _batches(n, batch_size):
            _store_logits(out, slice(None), cols, model(x[cols]), y, n)
    _sample_obs(out)
    return out


def _export_pyro(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    n: int,
    num_samples: int,
    var_names: str | Sequence[str] | None,
) -> tuple[_Draws, list[str]]:
    """Any Pyro model: replay it on every guide draw and read its ``"obs"`` site."""
    out = _Draws(num_samples)
    keep: list[str] = []
    with _prepared(model, n):
        for s, guide_trace, model_trace in _replayed_draws(model, guide, x, y, num_samples):
            if s == 0:
                _check_guide_covers(model_trace, guide_trace)
                keep = _check_var_names(var_names, list(_latent_sites(model_trace)))
            site = model_trace.nodes.get("obs")
            if site is None or site["type"] != "sample" or not site["is_observed"]:
                raise ValueError(
                    f"{type(model).__name__} has no observed site 'obs': to_inference_data() "
                    "reads the pointwise log-likelihood there. Observe y as "
                    "pyro.sample('obs', ..., obs=y) inside pyro.plate('data', N)."
                )
            log_lik = site["fn"].log_prob(site["value"])
            if log_lik.shape != (n,):
                raise ValueError(
                    f"The pointwise log-likelihood of 'obs' has shape {tuple(log_lik.shape)}, "
                    f"expected ({n},), one value per point. Put 'obs' inside "
                    "pyro.plate('data', N) (dim -1) and run the model on all of x, without "
                    "subsampling."
                )
            for name in keep:
                out.put(name, s, model_trace.nodes[name]["value"])
            out.put("log_lik", s, log_lik.double())
            out.put("obs", s, site["fn"].sample())
            logits = model_trace.nodes.get("logits")
            if logits is not None and logits["value"].shape[-2:-1] == (n,):
                out.put("probs", s, logits["value"].softmax(-1).float())
    return out, keep


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
        The usual reading: below 0.5 good, 0.5 to 0.7 usable, above 0.7 unreliable.
    log_weights : torch.Tensor
        ``(S,)`` float64, the raw log importance ratios ``log p(w_s, D) - log q(w_s)``.
    smoothed_log_weights : torch.Tensor
        ``(S,)`` float64, the Pareto-smoothed log weights, normalised (their ``logsumexp``
        is 0), for importance-weighted estimates ``sum_s exp(lw_s) f(w_s)``.
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
        """Whether ``k_hat < 0.7``: importance-weighted estimates with the guide can be used."""
        return self.k_hat < K_HAT_OK

    def __repr__(self) -> str:
        return f"PSISResult(k_hat={self.k_hat:.3f}, S={self.num_samples}): {self.interpretation}"


def _interpret(k_hat: float) -> str:
    if k_hat == -math.inf:
        return (
            "good: the importance ratios are constant to numerical precision, so the guide "
            "equals the posterior up to normalisation."
        )
    if math.isnan(k_hat):
        return "unknown: the generalized Pareto fit failed; draw more samples."
    if k_hat < K_HAT_GOOD:
        return (
            f"good (k-hat {k_hat:.2f} < {K_HAT_GOOD}): the guide is close to the posterior; "
            "importance-weighted estimates converge quickly."
        )
    if k_hat < K_HAT_OK:
        return (
            f"ok ({K_HAT_GOOD} <= k-hat {k_hat:.2f} < {K_HAT_OK}): importance-weighted "
            "(PSIS) estimates are usable but converge slowly."
        )
    return (
        f"bad (k-hat {k_hat:.2f} >= {K_HAT_OK}): the variational approximation is unreliable "
        "for importance-weighted estimates, and Pareto smoothing does not fix it."
    )


def _log_density(trace: poutine.Trace, observed_factor: float = 1.0) -> Tensor:
    """``sum`` of the (scaled, masked) log densities of a trace, float64; observed sites times
    ``observed_factor``, deterministic and subsample sites skipped."""
    total = torch.zeros((), dtype=torch.float64)
    site: Any
    for site in trace.nodes.values():
        if site["type"] != "sample" or site_is_subsample(site):
            continue
        if site["is_observed"] and site["infer"].get("_deterministic"):
            continue
        log_p = scale_and_mask(site["fn"].log_prob(site["value"]), site["scale"], site["mask"])
        log_p = torch.as_tensor(log_p).double().sum().cpu()
        total = total + (log_p * observed_factor if site["is_observed"] else log_p)
    return total


@torch.no_grad()
def psis_diagnostic(
    model: Any,
    guide: Any,
    x: Tensor,
    y: Tensor,
    *,
    num_samples: int | None = None,
    num_data: int | None = None,
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

    The log joint is ``log p(w) + sum_n log p(y_n | x_n, w)`` on the data given: ``x, y`` are
    taken to be the whole data set D, and the observed sites enter with the model's own
    scale, with a pyrouq model's ``num_data`` set to N = ``len(x)`` meanwhile (so its N/B
    scale is 1; the attribute is restored afterwards). ``num_data=M`` instead treats ``x, y``
    as a sample of a data set of M points: every observed site is multiplied by ``M / N``.

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
        Its observed sites must not subsample: run it on all of ``x``.
    guide : callable
        A guide of ``model``, called as ``guide(x, y)``, that samples every latent site.
    x, y : torch.Tensor
        ``(N, ...)`` inputs and targets, the data set D.
    num_samples : int, optional
        Draws S from the guide (>= 25, default 1000). Each costs one run of the model on all
        of x.
    num_data : int, optional
        Size M of the data set that ``x, y`` stand for (the likelihood is scaled by M / N);
        default N (no scaling).

    Returns
    -------
    PSISResult

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
    if guide is None:
        raise ValueError(
            f"{fn}: guide is None. The diagnostic compares a guide q(w) with the posterior; "
            "pass the fitted guide (a BatchEnsemble has neither: use to_inference_data() and "
            "az.loo for it)."
        )
    device = module_device(model, guide)
    if device is not None:
        x, y = x.to(device), y.to(device)
    log_weights = torch.empty(num_samples, dtype=torch.float64)
    with _prepared(model, n):
        for s, guide_trace, model_trace in _replayed_draws(model, guide, x, y, num_samples):
            if s == 0:
                _check_guide_covers(model_trace, guide_trace)
                if not _latent_sites(model_trace):
                    raise ValueError(
                        f"{fn}: {type(model).__name__} has no latent sites, so there is no "
                        "posterior to compare the guide with."
                    )
            log_weights[s] = _log_density(model_trace, factor) - _log_density(guide_trace)
    if torch.isnan(log_weights).any() or (log_weights == math.inf).any():
        bad = int((torch.isnan(log_weights) | (log_weights == math.inf)).sum())
        raise ValueError(
            f"{fn}: {bad} of {num_samples} log importance ratios are NaN or +inf. Check that "
            "the guide's support lies inside the model's and that the model's densities are "
            "finite at the guide's draws."
        )
    finite = log_weights[torch.isfinite(log_weights)]
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
        interpretation=_interpret(k_hat),
        log_weights=log_weights,
        smoothed_log_weights=smoothed,
    )


# --------------------------------------------------------------------------------------------
# summary()
# --------------------------------------------------------------------------------------------


def summary(
    idata: arviz.InferenceData,
    var_names: str | Sequence[str] | None = None,
    *,
    group: str = "posterior",
    hdi_prob: float | None = None,
    **kwargs: Any,
) -> pandas.DataFrame:
    """``az.summary(idata, kind="stats")``: mean, sd and HDI of each variable.

    The diagnostics columns that ``az.summary`` adds by default (R-hat, bulk and tail ESS,
    MCSE) are left out on purpose: they measure the mixing of Markov chains, and the draws of
    a guide (or the members of an ensemble) are independent, so they would tell nothing.

    Parameters
    ----------
    idata : arviz.InferenceData
        E.g. from :func:`to_inference_data`.
    var_names : str or sequence of str, optional
        Variables to summarise (default all; one row per scalar, so a whole network gives
        one row per weight).
    group : str, default "posterior"
        Group to summarise; an ensemble export has no posterior, use
        ``"posterior_predictive"`` there.
    hdi_prob : float, optional
        Probability mass of the HDI (arviz's default, 0.94, when None).
    **kwargs
        Passed on to ``az.summary`` (``round_to``, ``coords``, ...), except ``kind``.

    Returns
    -------
    pandas.DataFrame
        One row per scalar; columns ``mean``, ``sd``, ``hdi_3%``, ``hdi_97%`` (for 0.94).
    """
    az = _arviz()
    if "kind" in kwargs:
        raise TypeError(
            f"summary() always uses kind='stats', got kind={kwargs['kind']!r}: R-hat and ESS "
            "mean nothing for independent draws. Call az.summary directly for other kinds."
        )
    groups = idata.groups()
    if group not in groups:
        raise ValueError(
            f"idata has no {group!r} group; it has {groups}. A BatchEnsemble export has no "
            "posterior: pass group='posterior_predictive'."
        )
    return az.summary(
        idata, var_names=var_names, group=group, kind="stats", hdi_prob=hdi_prob, **kwargs
    )
