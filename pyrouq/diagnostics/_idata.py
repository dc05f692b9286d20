"""``to_inference_data``: draws, predictions and pointwise log-likelihoods as arviz data."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.infer.util import is_validation_enabled
from torch import Tensor

from pyrouq._batchnorm import alone_in_its_batch
from pyrouq._default_device import under_cpu_default
from pyrouq._meta_device import real_device
from pyrouq._one_at_a_time import one_at_a_time
from pyrouq._own_models import name_of
from pyrouq._runners import is_ensemble as _is_ensemble
from pyrouq._seeded import draw_devices, seeded
from pyrouq._util import (
    check_count,
    check_int,
    has_latent_sites,
    module_device,
    module_dtype,
)
from pyrouq._words import ensemble_draws
from pyrouq._wrappers import given_model
from pyrouq.infer._elbo_checks import refuse_handlers_around
from pyrouq.infer._mask_or_scale import refuse_mask_or_scale_around
from pyrouq.infer._site_checks import check_draws
from pyrouq.infer.guide import check_guide
from pyrouq.likelihoods import Categorical, Likelihood, likelihood_of
from pyrouq.mcmc import MCMCResult

if TYPE_CHECKING:
    import arviz
from pyrouq.diagnostics._common import (
    DEFAULT_IDATA_SAMPLES,
    ENSEMBLE_MEMBERS,
    GUIDE_DRAWS,
    _arviz,
    _check_callables,
    _check_data,
    _check_guide_finite,
    _check_outputs,
    _check_result,
    _check_result_data,
    _check_var_names,
    _numpy,
    _prepared,
    _result_lacking,
    _typed,
    _warn_not_finite,
    _warn_one_draw,
    _weight_dims,
    num_samples_words,
)
from pyrouq.diagnostics._export_pyro import _export_pyro
from pyrouq.diagnostics._own_forward import (
    ObservedDensity,
    conditioned_sites,
    draw_stream,
    exported_forward,
    exported_sites,
    forward_outputs,
)
from pyrouq.diagnostics._own_model import refuse_own_model
from pyrouq.diagnostics._replay import _explain_inputs, _latent_sites
from pyrouq.diagnostics._store import _LATENT, _Draws, _sample_obs, _store_logits

# --------------------------------------------------------------------------------------------
# to_inference_data()
# --------------------------------------------------------------------------------------------


@one_at_a_time
@under_cpu_default
@torch.no_grad()
def to_inference_data(
    model: Any,
    guide: Any = None,
    x: Tensor | None = None,
    y: Tensor | None = None,
    num_samples: int | None = None,
    *,
    var_names: str | Sequence[str] | None = None,
    batch_size: int = 1024,
    seed: int | None = None,
) -> arviz.InferenceData:
    """Export draws, predictions and pointwise log-likelihoods as ``arviz.InferenceData``.

    Groups (one chain: the draws of a guide are independent):

    * ``posterior`` -- S guide draws of every latent site (or of those in ``var_names``),
      shaped ``(chain=1, draw=S, *site_shape)``. Weight and bias sites get named dims in
      torch's layout: ``fc1.weight`` is ``(fc1_out, fc1_in)``, ``conv1.weight``
      ``(conv1_out, conv1_in, conv1_kh, conv1_kw)``, ``fc1.bias`` ``(fc1_out,)``; a grouped
      convolution's second weight dim is ``<layer>_in_per_group`` (``_out_per_group`` for a
      transposed one), a network that is a single layer has ``(out, in)``; a rank-1
      network's factors ``fc1.r`` and ``fc1.s`` are ``(fc1_member, fc1_in)`` and
      ``(fc1_member, fc1_out)``. Where two layers' names would meet (``block.fc`` and
      ``block_fc``), theirs keep the dots: ``block.fc_out``.
    * ``posterior_predictive`` -- ``obs``: ``(1, S, N)`` labels (or targets, shaped as ``y``)
      drawn from each draw's predictive distribution; ``probs``: ``(1, S, N, C)`` those
      distributions (classifiers); ``loc`` and ``scale``: ``(1, S, N, D)`` their means and
      standard deviations (``Gaussian`` likelihoods; a latent noise scale ``sigma`` is in the
      posterior group like any site). Read them as ``posterior_predictive["loc"]``: the
      attribute ``.loc`` is xarray's label indexer. ``probs``, ``loc`` and ``scale`` are
      float32, float64 for a model that computes in float64.
    * ``log_likelihood`` -- ``obs``: ``(1, S, N)``, ``log p(y_n | x_n, w_s)`` (unscaled,
      float64), so ``az.loo`` and ``az.waic`` work (from two draws on: with one, ``az.loo``
      fails, and the export warns).
    * ``observed_data`` -- ``obs``: ``y``, ``(N,)`` (``(N, D)`` for multi-output regression).
    * ``sample_stats`` -- for an :class:`pyrouq.MCMCResult` only, whose C chains replace the
      one chain above (``(chain=C, draw=S, ...)`` in every group): ``diverging``,
      ``step_size``, ``tree_depth``, ``energy``, ``lp`` (minus the potential energy) and
      ``acceptance_rate``, each ``(C, S)``, as ``az.bfmi``, ``az.plot_energy`` and arviz's
      divergence plots read them (see :class:`pyrouq.MCMCResult`).

    Every per-point variable has the dim ``obs_id`` (coordinates ``0..N-1``); ``probs`` also
    has ``class`` (``0..C-1``), ``loc`` and ``scale`` ``output`` (``0..D-1``).

    A regression model fitted on standardised targets (:class:`pyrouq.Standardizer`) is
    exported in those units: pass ``y`` standardised, and ``obs``, ``loc``, ``scale``, a latent
    ``sigma`` and ``log_likelihood`` (so ``az.loo``'s elpd) are of the standardised targets.
    :meth:`Standardizer.inverse <pyrouq.tabular.Standardizer.inverse>` rescales predictions,
    not this export: for the targets' units, take ``loc`` and ``obs`` times ``y_std`` plus
    ``y_mean``, ``scale`` and ``sigma`` times ``y_std``, and each log-likelihood minus
    ``log(y_std).sum()``.

    A rank-1 network (:func:`pyrouq.rank1`) exports its factors' draws; each draw's M members
    are mixed with equal weights, so ``log_likelihood`` and ``posterior_predictive`` are those of
    the draw's member mixture: its class probabilities, or for a ``Gaussian`` likelihood the
    mixture's mean and standard deviation as ``loc`` and ``scale``, with ``obs`` drawn from the
    mixture itself (a member per point, then its Normal).

    A BatchEnsemble has no guide and no latent variables: its M members take the place of the
    draws (S = M) in ``posterior_predictive`` and ``log_likelihood``, and there is **no
    posterior group**, since the members are not draws from a posterior over any variable (the
    shared weights and rank-1 factors are point estimates). ``az.loo`` then treats the members
    as S = M equally weighted draws; without a posterior it cannot estimate their relative
    efficiency, so call it as ``az.loo(idata, reff=1.0)``, and with a handful of members its
    Pareto k warnings are expected. ``az.compare``, which computes each model's LOO itself,
    fails on it for the same reason: pass it ``az.loo(idata, pointwise=True, reff=1.0)``.

    Memory: the posterior group holds ``S * (number of weights)`` values in the guide's dtype
    (float32): for ``BayesianLeNet`` (44k weights) and S = 100 about 18 MB, for the default
    784-256-10 ``BayesianMLP`` (204k weights) about 81 MB. ``var_names`` exports a subset;
    only one draw of the other sites is held at a time. The predictive groups take
    ``S * N * (C + 3)`` values more. Inputs are evaluated ``batch_size`` at a time.

    Parameters
    ----------
    model : PyroModule or callable
        A pyrouq Bayesian model (made by :func:`pyrouq.bayesian`, ``BayesianLeNet``, ...:
        its network runs with each draw's weights; a ``BayesianNetwork`` with a ``forward``
        of its own, a subclass's, runs that forward conditioned on each draw, as
        :func:`pyrouq.predict` does, and the sites it samples beside the weights, a
        temperature, are latent sites like them; its log-likelihood is the density of the
        ``"obs"`` it draws, with a warning where that is not its likelihood's), a
        BatchEnsemble (``guide=None``), or any Pyro model ``model(x, y)`` whose observed
        site ``"obs"`` lies, unmasked, in a plate over the N points (its pointwise
        ``log_prob`` is ``(N,)``) and whose latent variables are global; such a model is
        run on all of ``x`` once per draw. Or an :class:`pyrouq.MCMCResult`
        (``guide`` left None): its chains become the posterior's ``chain`` dim, its sampler
        statistics the ``sample_stats`` group, and the predictive groups are computed on the
        data the chains ran on (on ``x`` and ``y`` where given). The network runs on copies
        of its draws: one that changes its weight in place (a ``clamp_``) leaves
        ``result.samples`` as they were.
    guide : callable or None
        The fitted guide (``mean_field_guide(model)``, an autoguide, ...), called as
        ``guide(x, y)`` once per draw (on the first ``batch_size`` points for a pyrouq
        model); None for a BatchEnsemble.
    x : torch.Tensor
        ``(N, ...)`` inputs; floating ones are cast to the model's dtype, as by ``predict()``.
    y : torch.Tensor
        ``(N,)`` targets (class labels for the pyrouq models).
    num_samples : int, optional
        Draws S from the guide (>= 1, default 100). Must stay None for a BatchEnsemble, whose
        S is its number of members, and for an MCMCResult, whose draws are all exported.
    var_names : str or sequence of str, optional
        Latent sites exported to the posterior group (default: all). The predictive groups
        always use every site.
    batch_size : int, default 1024
        Inputs per forward pass (pyrouq models).
    seed : int, optional
        In ``[0, 2**32 - 1]``. Given, the export's draws (the guide's, and the ``obs`` of
        ``posterior_predictive``, which an MCMCResult's or a BatchEnsemble's export draws too)
        come from torch's streams seeded with it, those of the CPU and of the model's device,
        as ``pyro.set_rng_seed(seed)`` before the call would seed them, inside a fork of the
        random state: two exports with one seed hold the same values to the bit, and torch's
        global streams are left as they were. None (default): the draws come from the global
        streams, which the call advances.

    Returns
    -------
    arviz.InferenceData

    Raises
    ------
    TypeError
        x or y not a tensor; an MCMCResult given as the guide, or with a guide; a guide
        passed as the model (the two swapped); integer, bool or complex x for a pyrouq model
        (but the indices of a network holding an ``nn.Embedding``; a Pyro model of one's own
        takes them as they are); x of another float dtype than the priors of one's own model
        whose autoguide is not fitted.
    ValueError
        x and y of different lengths, num_samples < 1, unknown var_names, labels outside
        ``[0, C)`` (or a Pyro model's ``"obs"`` values outside its distribution's support),
        no guide for a model with latent sites, a guide (or num_samples, var_names) for a
        BatchEnsemble, a mask leaving points of a Pyro model's ``"obs"`` out, its recorded
        ``"logits"`` not those of the ``Categorical`` it draws ``"obs"`` from, a guide draw
        outside the support of its latent site; a guide whose
        parameters hold NaN or inf, a pyrouq model's outputs NaN or inf at a draw; an
        MCMCResult whose sites or sample stats differ in (chain, draw), that holds no draws,
        or whose draws hold NaN or inf, or whose sites do not fit ``result.model``; draws
        (a guide's, an MCMC run's) without a site that a subclass's own forward samples; a latent
        site (or sample stat) named as a dim of its group (``chain``, ``draw``, another
        site's ``fc1_out``), which arviz would drop; x the network does not take (torch's
        shape error, restated naming x); a batch of one input (x of one, or a batch_size
        leaving one) that a BatchNorm built without running statistics refuses (its
        statistics are its batch's); a vectorised ``pyro.plate`` around the call of a pyrouq
        model (which has its own plate ``"data"``), or a ``pyro.poutine.condition()`` or
        ``pyro.poutine.do()`` fixing one of its latent sites; around any model's call a
        ``poutine.mask`` or ``poutine.scale`` (but one keeping every point, or of ones), which
        the export would not apply (its log-likelihood is every point's, unscaled); a model
        on the meta device (shapes, no values), or its guide there.

    Warns
    -----
    RuntimeWarning
        Where the pointwise log-likelihood is NaN or +inf, or -inf (``az.loo`` is then NaN).
    UserWarning
        Where a single draw is exported (S = 1): ``az.loo`` fails on it.

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
    model, guide = given_model(model), given_model(guide)  # (DDP-, DataParallel-, compile-wrapped)
    if seed is not None:  # the whole call in a seeded fork of torch's random state
        run = model if isinstance(model, MCMCResult) else None  # (its model, its data)
        on = (run.model, x if x is not None else run.x) if run is not None else (model, x)
        with seeded(seed, fn, draw_devices(on[0], guide, on[1])):
            return to_inference_data(
                model, guide, x, y, num_samples, var_names=var_names, batch_size=batch_size
            )
    az = _arviz()
    for what, value in (("model", model), ("guide", guide)):
        if isinstance(value, pyro.infer.MCMC):
            raise TypeError(
                f"{fn}: got a pyro.infer.MCMC run as the {what}; it exports pyrouq's "
                "MCMCResult (pyrouq.mcmc(model, x, y)) as to_inference_data(result). For a "
                "pyro.infer.MCMC run use arviz.from_pyro(mcmc) (under torch.no_grad() for a "
                "model with point estimates, whose recorded outputs carry gradients; then "
                "az.loo(idata, var_name='obs'), as it exports the 'logits' / 'outputs' site "
                "too), or predict its draws with pyrouq.predict(model, x, posterior_samples=mcmc)."
            )
    if isinstance(guide, MCMCResult):
        raise TypeError(
            f"{fn}: got an MCMCResult as the guide; an MCMC run is exported alone, "
            "to_inference_data(result): its draws are the posterior, and its model and data "
            "come with it."
        )
    result = model if isinstance(model, MCMCResult) else None
    if result is not None and guide is not None:
        raise TypeError(
            f"{fn}: got an MCMCResult and a guide ({type(guide).__name__}); an MCMC run's "
            "draws are the posterior, with no guide. Call to_inference_data(result), or "
            "to_inference_data(model, guide, x, y) for the guide's draws."
        )
    if result is not None:
        given = "x" if y is None and x is not None else "y" if x is None and y is not None else None
        model, x, y = result.model, result.x if x is None else x, result.y if y is None else y
        missing = [name for name, v in (("model", model), ("x", x), ("y", y)) if v is None]
        if missing:  # all that is needed, in one message (the model's, then the data's)
            raise ValueError(_result_lacking(fn, missing))
        _check_result_data(fn, given, x, y)
        _check_result(result, fn)
    real_device(fn, model, guide)  # (no values to run on: before anything)
    refuse_handlers_around(model, fn, None, trace=False)  # (plate, condition: before anything)
    refuse_mask_or_scale_around(fn)  # (the export would not apply them)
    _check_callables(fn, model, guide)
    n = _check_data(fn, x, y)
    assert isinstance(x, Tensor) and isinstance(y, Tensor)
    batch_size = check_int("batch_size", batch_size, hint="Pass e.g. batch_size=256.")
    if num_samples is not None:
        check_count("num_samples", num_samples, num_samples_words(model, guide, result))
    device = module_device(model, guide)
    xd = _typed(x if device is None else x.to(device), model, guide, fn)
    yd = y if device is None else y.to(device)
    posterior_dims: dict[str, list[str]] = {}  # a BatchEnsemble has no posterior

    chains = 1
    keep: list[str]
    if result is not None:
        if num_samples is not None:
            raise ValueError(
                f"{fn}: num_samples={num_samples!r} given for an MCMCResult: its "
                f"{result.num_chains} x {result.num_samples} draws are exported, S is the "
                "number of MCMC draws. Leave num_samples None (thin with "
                "idata.sel(draw=slice(None, None, k)))."
            )
        keep = _check_var_names(var_names, exported_sites(model, xd, n))
        draws = result.draws()
        total = result.num_chains * result.num_samples
        # copies, as predict()'s: a network that changes its weight in place (a clamp_) as it
        # runs changes them, not result.samples (views of which draws() returns)
        weights = (
            {k: v[i].to(device or "cpu", copy=True) for k, v in draws.items()} for i in range(total)
        )
        chains = result.num_chains
        out = _export_weights(model, weights, xd, yd, n, total, keep, batch_size, chains)
        posterior_dims = _named_dims(model, keep, out)
    elif guide is None:
        if has_latent_sites(model):
            raise ValueError(
                f"{fn}: {type(model).__name__} has latent sites but guide is None. Pass its "
                "fitted guide, e.g. to_inference_data(model, guide, x, y) with guide = "
                "mean_field_guide(model) after fit()."
            )
        if not _is_ensemble(model):  # a Pyro model of the user's own: its latent sites named
            refuse_own_model(fn, model, xd, yd, n)
            raise ValueError(
                f"{fn}: {type(model).__name__} has no posterior to export: no latent sites "
                "(a plain network) and no ensemble members. Export a Bayesian model with its "
                "guide (bayesian(net), then fit), or a BatchEnsemble; a plain network's "
                "predictions are predict(net, x)."
            )
        for name, value in (("num_samples", num_samples), ("var_names", var_names)):
            if value is not None:
                raise ValueError(
                    f"{fn}: {name}={value!r} given for a BatchEnsemble "
                    f"({type(model).__name__}): its {ensemble_draws(model.num_members)}, "
                    "and it has no posterior group. Leave it None."
                )
        out = _export_ensemble(model, xd, yd, n, batch_size)
        keep = []
    else:
        check_guide(model, guide, fn)
        _check_guide_finite(guide, fn)
        if _is_ensemble(model):
            raise ValueError(
                f"{fn}: a guide was given for a BatchEnsemble ({type(model).__name__}), which "
                f"has no latent sites: its {model.num_members} members take the place of "
                "posterior draws. Pass guide=None."
            )
        s = num_samples if num_samples is not None else DEFAULT_IDATA_SAMPLES
        if has_latent_sites(model) and callable(getattr(model, "outputs", None)):
            keep = _check_var_names(var_names, exported_sites(model, xd, n))
            out = _export_bayesian(model, guide, xd, yd, n, s, keep, batch_size)
        else:
            out, keep = _export_pyro(model, guide, xd, yd, n, s, var_names)
        posterior_dims = _named_dims(model, keep, out)

    _warn_not_finite(out.values["log_lik"], fn)
    if out.num_draws == 1:
        how = "export two or more guide draws: num_samples >= 2 (the default is 100)"
        if result is not None or guide is None:
            how = "run two or more draws" if result is not None else "use two or more members"
        _warn_one_draw(fn, how)
    coords: dict[str, Any] = {"obs_id": np.arange(n)}
    dims: dict[str, list[str]] = {"obs": ["obs_id"]}  # the predictions' dims
    predictive = {"obs": out.numpy("obs", chains)}
    if "probs" in out.values:
        predictive["probs"] = out.numpy("probs", chains)
        coords["class"] = np.arange(out.values["probs"].shape[-1])
        dims["probs"] = ["obs_id", "class"]
    for name in ("loc", "scale"):  # a Gaussian's predictive means and standard deviations
        if name in out.values:
            predictive[name] = out.numpy(name, chains)
            coords["output"] = np.arange(out.values[name].shape[-1])
            dims[name] = ["obs_id", "output"]
    if "loc" in out.values and y.dim() == 2:
        dims["obs"] = ["obs_id", "output"]
    stats = None
    if result is not None:
        stats = {name: value.numpy() for name, value in result.sample_stats.items()}
    with warnings.catch_warnings():  # arviz's guess at a transposed layout, where C > S:
        warnings.filterwarnings("ignore", message="More chains", category=UserWarning)
        idata = az.from_dict(  # these arrays are (chain, draw, ...) by construction
            posterior_predictive=predictive,
            log_likelihood={"obs": out.numpy("log_lik", chains)},
            sample_stats=stats,
            observed_data={"obs": _numpy(y)},
            coords=coords,
            dims=dims,
        )
        _check_kept(fn, idata, "sample_stats", list(stats or {}), [])
        if keep:  # apart: a latent site "probs" or "scale" is not the predictions' (obs_id, ..)
            posterior = {name: out.numpy(_LATENT + name, chains) for name in keep}
            idata, predictions = az.from_dict(posterior, dims=posterior_dims), idata
            _check_kept(fn, idata, "posterior", keep, keep)
            idata.extend(predictions)
    from pyrouq import __version__

    attrs = {
        "inference_library": "pyro",
        "inference_library_version": pyro.__version__,
        "creation_library": "pyrouq",
        "creation_library_version": __version__,
        "model": name_of(model),
        "draws": (
            f"{chains} MCMC chain{'s' if chains > 1 else ''} ({result.kernel})"
            if result is not None
            else ENSEMBLE_MEMBERS
            if guide is None
            else GUIDE_DRAWS
        ),
    }
    for group in idata.groups():
        idata[group].attrs.update(attrs)
    return idata


def _check_kept(fn: str, idata: Any, group: str, names: list[str], keep: list[str]) -> None:
    """Refuse variables that arviz left out of ``group``: one named as a dim of the group
    (``chain``, ``draw``, another site's ``fc1_out``) becomes that dim's coordinate, and its
    values are lost without a word. ``keep``: the latent sites that var_names may choose."""
    held = idata[group] if group in idata.groups() else None  # (none kept: no group)
    lost = [name for name in names if held is None or name not in held.data_vars]
    if not lost:
        return
    rest = [name for name in keep if name not in lost]
    what, where = ("latent site(s)", "the model") if group == "posterior" else ("stats", "")
    where = where or "result.sample_stats"
    dims = ", ".join(map(str, held.dims)) if held is not None else "chain, draw, ..."
    leave = f", or leave them out with var_names={rest}" if rest else ""
    raise ValueError(
        f"{fn}: the {what} {lost} share their name with a dim of the {group} group "
        f"({dims}): arviz makes such a variable that dim's coordinate, and its values "
        f"would be lost. Rename them in {where}{leave}."
    )


def _likelihood(model: Any) -> Likelihood:
    return likelihood_of(model) or Categorical()


def _named_dims(model: Any, keep: list[str], out: Any) -> dict[str, list[str]]:
    """The named dims of the exported sites (:func:`_weight_dims`), each name one layer's:
    where two layers' names meet (``block.fc`` and ``block_fc`` both give ``block_fc_out``,
    and xarray would pad the smaller with NaN), theirs keep the dots (``block.fc_out``)."""
    named = {}
    for name in keep:
        site_dims = _weight_dims(model, name, tuple(out.values[_LATENT + name].shape[1:]))
        if site_dims is not None:
            named[name] = site_dims
    owners: dict[str, set[str]] = {}
    for site, site_dims in named.items():
        for dim in site_dims:
            owners.setdefault(dim, set()).add(site.rpartition(".")[0])
    shared = {dim for dim, layers in owners.items() if len(layers) > 1}
    for site, site_dims in named.items():
        layer = site.rpartition(".")[0]
        flat = layer.replace(".", "_") + "_"
        named[site] = [
            layer + "_" + dim[len(flat) :] if dim in shared and layer else dim for dim in site_dims
        ]
    return named


def _batches(n: int, batch_size: int) -> Iterator[slice]:
    for start in range(0, n, batch_size):
        yield slice(start, min(start + batch_size, n))


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
    first = slice(0, min(batch_size, n))

    def draws() -> Iterator[dict[str, Tensor]]:
        for s in range(num_samples):
            # The first draw runs under the caller's validation setting, the rest without.
            with pyro.validation_enabled(s == 0 and is_validation_enabled()):
                trace = poutine.trace(guide).get_trace(x[first], y[first])
            yield {name: site["value"] for name, site in _latent_sites(trace).items()}

    return _export_weights(model, draws(), x, y, n, num_samples, keep, batch_size, guide=guide)


def _export_weights(
    model: Any,
    draws: Iterator[dict[str, Tensor]],
    x: Tensor,
    y: Tensor,
    n: int,
    num_samples: int,
    keep: list[str],
    batch_size: int,
    chains: int | None = None,
    guide: Any = None,
) -> _Draws:
    """A pyrouq Bayesian model run with each of ``num_samples`` given weight draws (``guide``'s
    draws, or the draws of ``chains`` MCMC chains, chain after chain): its network alone, or
    its own forward conditioned on the draw (:func:`exported_forward`)."""
    out = _Draws(num_samples)
    forward, sites = exported_forward(model), []  # (a subclass's forward: its sites)
    observed = ObservedDensity(forward)
    # draws of another dtype (an MCMC run's float32 for a float16 model) run in the model's,
    # as in predict(); the posterior group keeps them as they came
    dtype = module_dtype(model) or (x.dtype if x.is_floating_point() else None)
    with _prepared(model, n):
        for s, weights in enumerate(draws):
            if s == 0:
                drawn = {name: value[None] for name, value in weights.items()}
                source = "result.samples" if chains else "the guide"  # (MCMC draws: no guide)
                if forward is None:
                    check_draws(model, drawn, "to_inference_data()", source, guide)
                else:  # its latent sites, those its forward samples beside the weights too
                    fn = "to_inference_data()"
                    sites = conditioned_sites(forward, weights, x, fn, source, guide)
            for name in keep:
                out.put(_LATENT + name, s, weights[name])
            weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
            own = {site: weights[site] for site in model.likelihood.latent_sites()}
            with draw_stream(x.device, forward, s):  # (its batches take the stream in turn)
                for index, cols in enumerate(_batches(n, batch_size)):
                    obs = None  # (the own forward's "obs" site: the density it observes)
                    try:
                        if forward is None:
                            logits = model.outputs(x[cols], weights)
                        else:
                            drawn = {site: weights[site] for site in sites}
                            first = s == 0 and index == 0
                            logits, obs = forward_outputs(forward, x[cols], drawn, first)
                    except (ValueError, RuntimeError) as err:  # torch's words, as predict()'s
                        fn = "to_inference_data()"
                        alone = alone_in_its_batch(err, x[cols], index, x, batch_size, fn, "export")
                        if alone:  # a BatchNorm without running statistics, on one input
                            raise ValueError(alone) from err
                        if s == 0:  # a shape (an InstanceNorm's is a ValueError)
                            _explain_inputs(err, model, x, fn)
                        raise
                    per = num_samples // chains if chains else 0
                    where = f"chain {s // per}, draw {s % per}" if per else f"guide draw {s}"
                    fn = "to_inference_data()"
                    _check_outputs(logits, f"at {where}", cols, fn, model.likelihood)
                    mixture = getattr(model, "num_members", None) is not None  # rank-1
                    at = None if obs is None else partial(observed, obs, cols)
                    likelihood = model.likelihood
                    _store_logits(out, s, cols, logits, y, n, likelihood, own or None, mixture, at)
    _sample_obs(out, y)
    return out


def _export_ensemble(model: Any, x: Tensor, y: Tensor, n: int, batch_size: int) -> _Draws:
    """A BatchEnsemble: the M members are the draws (a forward of its own is refused)."""
    exported_forward(model)
    out = _Draws(int(model.num_members))
    with _prepared(model, n), pyro.validation_enabled(False):
        for cols in _batches(n, batch_size):
            outputs = model(x[cols])
            _check_outputs(
                outputs, "in its members", cols, "to_inference_data()", _likelihood(model)
            )
            _store_logits(out, slice(None), cols, outputs, y, n, _likelihood(model))
    _sample_obs(out, y)
    return out
