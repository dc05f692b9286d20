"""The mean-field guide: an independent Normal for every latent site of a pyrouq model."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.infer.autoguide import AutoGuide, AutoMessenger
from torch import nn

from pyrouq._distribution_parts import (
    innermost_distribution,
    is_discrete,
    refuse_undecided_support,
    support_of,
)
from pyrouq._meta_device import real_device
from pyrouq._param_store import (
    copy_renamed,
    hold_params,
    hold_restored,
    prototype_shapes,
    register_params,
    shared_copy,
)
from pyrouq._util import check_count, check_positive_float, warn_caller
from pyrouq._wrappers import given_model, unwrapped
from pyrouq.checkpoint import register_guide
from pyrouq.infer._draws import draw
from pyrouq.infer._init_from import (
    expected_init_from,
    held_state,
    warn_extra_state,
    warn_unshared_point_estimates,
)
from pyrouq.infer._initial_scales import check_initial_scales, held, inverse_softplus
from pyrouq.infer._site_checks import check_drawable, model_sites, refuse, site_mismatch
from pyrouq.likelihoods import likelihood_of

__all__ = ["DEFAULT_INIT_SCALE", "MeanFieldGuide", "draw", "mean_field_guide"]

DEFAULT_INIT_SCALE = 1e-2
"""Default initial standard deviation of every guide site."""


class _Default(float):
    """A default that knows it was not passed: ``mean_field_guide(init_scale=1e-2)`` is. Any
    instance is the default (a copy or an unpickled one, from a signature's defaults forwarded)."""


_INIT_SCALE_UNSET = _Default(DEFAULT_INIT_SCALE)  # shows as 0.01 in the signature

MIN_RELATIVE_SCALE = 1e-6
"""Smallest initial standard deviation ``init_scale_relative`` gives (to a weight that is 0)."""

_LOAD_FILLS = "_pyrouq_load_fills_values"  # (MeanFieldGuide._built_for_load: no start values)
_ONE_SCALE_ENTRIES = 64  # a one-scale site's inverse softplus runs on these (torch's vector code)

_GUIDE_COUNTER = itertools.count()


def _keys(sites: Iterable[str]) -> dict[str, str]:
    """Each site's key in the guide's ``loc`` / ``rho`` (which take no dots): ``fc1.weight`` is
    ``fc1__weight``. Where two sites would meet (``block.fc.weight`` and
    ``block__fc.weight``), every ``_`` is first written ``_0``, so no two keys are one."""
    keys = {site: site.replace(".", "__") for site in sites}
    if len(set(keys.values())) < len(keys):
        keys = {site: site.replace("_", "_0").replace(".", "__") for site in keys}
    return keys


@register_guide
class MeanFieldGuide(nn.Module):
    """Diagonal Normal guide ``q(w) = prod_site Normal(loc, softplus(rho))`` for a pyrouq model.

    Every latent site of the model gets a ``Normal(loc, scale).to_event(...)`` of the site's
    exact shape, so ``KL(q || p)`` is analytic for Normal priors (both in
    :class:`~pyrouq.KLWeightedELBO` and in Pyro's ``TraceMeanField_ELBO``).

    Parameters live in this module (``loc`` and ``rho`` parameter dicts, keys are site names
    with ``.`` replaced by ``__``) and are registered in Pyro's param store under a prefix unique
    to this guide (``guide.name``; a ``copy.deepcopy`` gets its own, and so does one unpickled
    beside a live guide of its name), so Pyro optimizers see them while two guides never share
    or overwrite parameters; the entries are removed when the guide is garbage collected.
    Values loaded into the store under those names (``pyro.get_param_store().load(path)``) are
    taken at the guide's next use (a run, ``predict()``, ``fit()``).

    .. warning:: Mean-field: the guide ignores every correlation between weights, and it is
       known to underestimate posterior variance.

    Examples
    --------
    >>> import torch
    >>> from pyrouq import BayesianMLP
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> guide = MeanFieldGuide(model, init_scale=0.01)
    >>> guide.sites
    ('fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias')
    >>> {site: tuple(w.shape) for site, w in guide(torch.randn(5, 4)).items()}  # one draw
    {'fc1.weight': (8, 4), 'fc1.bias': (8,), 'fc2.weight': (3, 8), 'fc2.bias': (3,)}
    >>> torch.allclose(guide.scales()["fc1.bias"], torch.full((8,), 0.01))
    True
    """

    def __init__(
        self,
        model: Any,
        init_scale: float = DEFAULT_INIT_SCALE,
        init_from: nn.Module | None = None,
        *,
        init_scale_relative: float | None = None,
    ):
        values = not vars(self).pop(_LOAD_FILLS, False)  # False: load() puts the saved ones
        super().__init__()
        init_scale = check_positive_float(
            "init_scale",
            init_scale,
            "It is the initial standard deviation of every guide site; the default is 1e-2.",
        )
        if init_scale_relative is not None:
            init_scale_relative = check_positive_float(
                "init_scale_relative",
                init_scale_relative,
                "Each site then starts at a standard deviation of init_scale_relative * |loc| "
                "(MOPED: 0.1); pass None for the absolute init_scale.",
            )
            if init_scale != DEFAULT_INIT_SCALE:
                _refuse_both(init_scale, init_scale_relative)
        model = given_model(model)  # (a DDP-, DataParallel- or compile-wrapped pyrouq model)
        latent_sites = getattr(model, "latent_sites", None)
        template = getattr(model, "template", None)
        if not callable(latent_sites) or not callable(template):
            raise TypeError(
                f"mean_field_guide() needs a pyrouq Bayesian model (made by pyrouq.bayesian(), "
                f"BayesianMLP, BayesianLeNet), got {type(model).__name__}. For other Pyro "
                "models use pyro.infer.autoguide.AutoNormal; BatchEnsemble models need no "
                "guide (pass guide=None to fit)."
            )
        sites: dict[str, torch.Size] = latent_sites()
        if not sites:
            raise ValueError(
                f"mean_field_guide() needs a model with latent sites, got "
                f"{type(model).__name__}, which has none: it needs no guide. Pass guide=None "
                "(to fit(), predict() or KLWeightedELBO)."
            )
        if init_from is None:
            state = template()
        else:
            if not isinstance(init_from, nn.Module):
                fix = (  # a state dict, from torch.load, most likely
                    "load it into a network of the model's structure first, "
                    "net.load_state_dict(state), and pass init_from=net"
                    if isinstance(init_from, Mapping)
                    else "pass the trained network itself"
                )
                raise TypeError(
                    f"Expected init_from to be a trained plain nn.Module, got "
                    f"{type(init_from).__name__}: {fix}."
                )
            inner = unwrapped(init_from)  # torch.compile(net)'s, DDP(net)'s module
            if callable(getattr(inner, "latent_sites", None)):
                raise TypeError(
                    f"init_from is a Bayesian model ({type(inner).__name__}): its weights "
                    "are drawn from its guide, not held. Pass a trained network that holds "
                    "them: the plain module (for rank1(), a trained batchensemble() of it)."
                )
            state = held_state(init_from)
            own: dict[str, Any] = getattr(likelihood_of(model), "latent_sites", dict)()
            missing = [s for s in sites if s not in state and s not in own]
            if missing and inner is not init_from:  # (its names: "_orig_mod."..., "module."...)
                state, init_from = held_state(inner), inner
                missing = [s for s in sites if s not in state and s not in own]
            if missing:
                raise ValueError(
                    f"init_from ({type(init_from).__name__}) has no parameter(s) "
                    f"{missing[:5]}; expected a network of the model's structure, with "
                    f"parameters {list(sites)[:5]}... ({expected_init_from(model)})."
                )
            warn_unshared_point_estimates(model, state)
            warn_extra_state(model, init_from, state)
        own_values = template()
        device = next(iter(own_values.values())).device
        priors = model.priors() if callable(getattr(model, "priors", None)) else {}
        for site, prior in priors.items():
            if site in sites and support_of(prior) not in ("real", "positive"):
                base = innermost_distribution(prior)  # the family itself
                if is_discrete(base):  # (mcmc() cannot sample it either)
                    raise ValueError(
                        f"mean_field_guide(): the prior of site {site!r} ({type(base).__name__}) "
                        f"is discrete (support {base.support}); the guide fits a continuous "
                        "Normal or LogNormal to it. Give the site a continuous prior, "
                        "pyrouq.bayesian(net, prior=...) (Normal, Laplace, StudentT), or leave it "
                        "out of select= (a point estimate)."
                    )
                why = "the guide fits a Normal (on the real line) or a LogNormal (on (0, inf))"
                refuse_undecided_support("mean_field_guide()", site, base, why)  # (mcmc() too)
                raise ValueError(
                    f"mean_field_guide(): the prior of site {site!r} ({type(base).__name__}) "
                    f"has support {base.support}; the guide fits a Normal (on the real line) or a "
                    "LogNormal (on (0, inf)), whose KL to a prior with other bounds is "
                    "infinite. Use a prior on the real line (Normal, Laplace, StudentT) or on "
                    "(0, inf) (HalfNormal, Gamma, LogNormal), or sample it by mcmc()."
                )
        self.positive = tuple(s for s in sites if s in priors and positive_support(priors[s]))
        if init_from is not None:  # the likelihood's own sites start where the model says
            state = {**own_values, **state}
        self.loc = nn.ParameterDict()
        self.rho = nn.ParameterDict()
        self._keys = _keys(sites)
        clamped: list[str] = []  # positive sites whose values were not all positive
        for site, shape in sites.items():
            value = state[site].detach()
            if site in self.positive:  # a LogNormal guide: its location is log-space
                below = int((value <= 0).sum())
                if below:
                    clamped.append(f"{site!r} ({below} of {value.numel()})")
                value = value.clamp_min(1e-6).log()
            if value.shape != shape:
                raise ValueError(
                    f"init_from parameter {site!r} has shape {tuple(value.shape)}, expected "
                    f"{tuple(shape)}: the network's configuration differs from the model's "
                    f"({expected_init_from(model)})."
                )
            dtype = own_values[site].dtype  # the model's, whatever init_from holds
            if values:  # contiguous, as Pyro's param store keeps a copy of another layout
                value = value.clone(memory_format=torch.contiguous_format)  # (channels-last)
                loc = value.to(device, dtype)  # that SVI would train
            else:
                loc = torch.empty(shape, dtype=dtype, device=device)
            self.loc[self._keys[site]] = nn.Parameter(loc)
            fill = init_scale_relative is None or site in self.positive  # one scale for all
            if init_scale_relative is not None and not fill:  # per entry
                scale = (init_scale_relative * value.abs().double()).clamp_min(MIN_RELATIVE_SCALE)
            else:  # (a positive site's: a relative spread of the value itself) computed once,
                # on entries enough for torch's vector code (as a site's were), then filled
                one = init_scale if init_scale_relative is None else init_scale_relative
                scale = torch.full((_ONE_SCALE_ENTRIES,), one, dtype=torch.float64, device="cpu")
            rho = inverse_softplus(scale, device, dtype)
            # the checks: every entry (one more for a fill, through torch's scalar code)
            sp = held(rho, fill)
            if fill:
                sp = sp if shape.numel() else sp[:0]  # (an empty site checks nothing)
                first, rho = rho[0], torch.empty(shape, dtype=dtype, device=device)
                if values:
                    rho.fill_(first)
            option = "init_scale" if init_scale_relative is None else "init_scale_relative"
            check_initial_scales(site, scale, sp, dtype, option, DEFAULT_INIT_SCALE)
            self.rho[self._keys[site]] = nn.Parameter(rho)
        if clamped:
            warn_caller(
                "mean_field_guide(): sites with a prior on (0, inf) get a LogNormal guide, "
                "started at their values clamped to 1e-6, and some values are not positive: "
                f"{', '.join(clamped)}; the network starts changed. Start those weights "
                "positive, or give the sites a prior on the real line (Normal, Laplace)."
            )
        self.sites = tuple(sites)
        self.init_scale = init_scale
        self.init_scale_relative = init_scale_relative
        self.name = f"MeanFieldGuide_{next(_GUIDE_COUNTER)}"
        hold_params(self, self.name)

    @classmethod
    def _built_for_load(cls, model: Any, **config: Any) -> MeanFieldGuide:
        """A guide :func:`pyrouq.load` fills with the saved state (``load_state_dict``, every
        entry): built and checked as ``cls(model, **config)``, its initial values left out."""
        if cls is not MeanFieldGuide:  # a subclass's constructor may do more
            return cls(model, **config)
        guide = cls.__new__(cls)
        vars(guide)[_LOAD_FILLS] = True  # read, and dropped, by __init__
        MeanFieldGuide.__init__(guide, model, **config)
        return guide

    def __deepcopy__(self, memo: dict[int, Any]) -> MeanFieldGuide:
        """An independent copy: its own parameters, under a name of its own in Pyro's param
        store, ``<name>_copy<k>`` (the store holds both guides' values, and fitting one never
        touches the other's; the guides built after it are named as without it)."""
        return copy_renamed(self, memo)  # (renamed in __setstate__)

    def __copy__(self) -> MeanFieldGuide:
        """A shallow copy: the same parameters, under the same name in Pyro's param store."""
        return shared_copy(self)

    def __getstate__(self) -> dict[str, Any]:
        for param in self.parameters():  # (Pyro's param store gave them weak references,
            param.__dict__.pop("unconstrained", None)  # which pickle refuses: as PyroModule)
        return super().__getstate__()  # type: ignore[no-any-return]

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # unpickled or deep-copied: the original's name, unless a live guide holds it
        self.name = hold_restored(self, self.name)

    def site_loc(self, site: str) -> torch.Tensor:
        """Location of ``site``: its posterior mean (of its logarithm for a positive site)."""
        return self.loc[self._key(site)]

    def site_scale(self, site: str) -> torch.Tensor:
        """Standard deviation of ``site`` (``softplus(rho)``)."""
        return F.softplus(self.rho[self._key(site)])

    def _key(self, site: str) -> str:
        """The parameters' key of ``site``, or a KeyError naming the guide's sites (a bare
        ``KeyError: '0.wieght'`` named none)."""
        try:
            return self._keys[site]
        except (KeyError, TypeError):  # (TypeError: an unhashable site, such as a list)
            names = ", ".join(repr(s) for s in self.sites)
            raise KeyError(
                f"{site!r} is not a site of this guide; its sites are {names}. Pass one of "
                "these names (guide.sites lists them)."
            ) from None

    def means(self) -> dict[str, torch.Tensor]:
        """Posterior means of every site, detached (for ``poutine.condition``); medians
        ``exp(loc)`` of the positive sites."""
        return {
            s: self.site_loc(s).detach().exp() if s in self.positive else self.site_loc(s).detach()
            for s in self.sites
        }

    def scales(self) -> dict[str, torch.Tensor]:
        """Posterior standard deviations of every site, detached (of the logarithm, for the
        positive sites)."""
        return {s: self.site_scale(s).detach() for s in self.sites}

    def get_distributions(self) -> dict[str, dist.Distribution]:
        """``Normal(loc, scale).to_event(...)`` of every site (``LogNormal`` of the positive
        ones)."""
        out = {}
        for s in self.sites:
            family = dist.LogNormal if s in self.positive else dist.Normal
            out[s] = family(self.site_loc(s), self.site_scale(s)).to_event(self.site_loc(s).dim())
        return out

    def sample(self, num_samples: int | None = None) -> dict[str, torch.Tensor]:
        """Reparameterised draws ``loc + scale * eps`` of every site (``exp`` of it for the
        positive ones), site by site in the guide's order, ``(num_samples, *shape)`` with
        ``num_samples``: the standard-normal draws Pyro makes for :meth:`forward` (one draw)
        or under a particle plate."""
        if num_samples is not None:
            num_samples = check_count(
                "num_samples", num_samples, "None gives one draw, of each site's shape."
            )
        loc = {s: self.site_loc(s) for s in self.sites}
        scale = {s: self.site_scale(s) for s in self.sites}
        return draw(loc, scale, num_samples, self.positive)

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Sample every site from q; the model's arguments are accepted and ignored."""
        register_params(self.name, self)
        return {s: pyro.sample(s, d) for s, d in self.get_distributions().items()}  # type: ignore[arg-type]

    def checkpoint_config(self) -> dict[str, Any]:
        """The constructor arguments a checkpoint stores (JSON) to rebuild this guide."""
        return {"init_scale": self.init_scale, "init_scale_relative": self.init_scale_relative}

    def extra_repr(self) -> str:
        if self.init_scale_relative is not None:
            init = f"init_scale_relative={self.init_scale_relative:g}"
        else:
            init = f"init_scale={self.init_scale:g}"
        return f"name={self.name!r}, sites={len(self.sites)}, {init}"


def _refuse_both(init_scale: float, init_scale_relative: float) -> None:
    raise ValueError(
        f"mean_field_guide() got init_scale={init_scale:g} and "
        f"init_scale_relative={init_scale_relative:g}: the initial scales are "
        "either absolute or relative to |loc|. Pass one of them."
    )


def positive_support(prior: Any) -> bool:
    """Whether ``prior`` lives on (0, inf) (a noise scale): its guide is LogNormal."""
    return support_of(prior) == "positive"


def mean_field_guide(
    model: nn.Module,
    init_scale: float = _INIT_SCALE_UNSET,
    init_from: nn.Module | None = None,
    *,
    init_scale_relative: float | None = None,
) -> MeanFieldGuide:
    """Mean-field Normal guide for a pyrouq Bayesian model.

    Parameters
    ----------
    model : BayesianNetwork
        A model made by :func:`pyrouq.bayesian` (or ``BayesianMLP`` / ``BayesianLeNet``).
    init_scale : float, default 1e-2
        Initial standard deviation of every site (> 0, and neither 0 nor inf in the model's
        dtype: in float16 a scale below its smallest normal number, 6.1e-05, is held with
        fewer digits down to 5.96e-08, its smallest positive one, and is 0 below about half of
        that). Small, so that training starts like the plain network; the KL term then grows
        the scales where the data allow.
    init_from : nn.Module, optional
        A trained plain network of the model's structure (the module given to
        :func:`pyrouq.bayesian`, an ``MLP`` / ``LeNet`` of the same configuration) whose
        parameters become the initial locations. Default: the model's own initial values,
        i.e. the converted module's parameters (a fresh torch initialisation for the front
        doors, not draws from the prior). One lacking a site is refused; one holding
        parameters or buffers the model's network lacks (a layer more) is warned of, naming
        them, as are the model's point estimates whose values it does not share. For a
        rank-1 model (:func:`pyrouq.rank1`), a trained :func:`pyrouq.batchensemble` of the
        same network starts the factors.
    init_scale_relative : float, optional
        MOPED's initial scales (Krishnan et al., AAAI 2020): every weight starts at a standard
        deviation of ``init_scale_relative * |loc|`` (at least 1e-6; do not pass
        ``init_scale`` with it), so a trained network passed as ``init_from`` sets both the
        means and, in proportion, the scales (MOPED's delta: 0.1); a positive site (a
        LogNormal noise scale) starts at ``init_scale_relative`` in log space, a relative
        spread of its value. Not the default: see the README's "Starting from a trained
        network" for what it measured.

    Returns
    -------
    MeanFieldGuide
        A Normal per site whose prior lives on the real line, a LogNormal per site whose
        prior lives on (0, inf) (a noise scale).

    Raises
    ------
    ValueError
        A site whose prior has other bounds (a ``Uniform``, a ``Beta``, a ``Pareto``): the KL
        of either family to it is infinite. :func:`pyrouq.mcmc` samples such priors. A
        discrete prior (a ``Poisson``, a ``Categorical``), which neither samples. An
        initial scale that is 0 or inf in the model's dtype (its KL would be infinite). A
        model on the meta device (shapes, no values: built under
        ``torch.set_default_device('meta')``).

    Examples
    --------
    >>> from pyrouq.models import BayesianMLP
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> guide = mean_field_guide(model, init_scale=0.05)
    >>> guide.sites
    ('fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias')
    >>> round(guide.site_scale("fc1.bias")[0].item(), 6)
    0.05
    """
    unset = isinstance(init_scale, _Default)  # (not `is`: a deep copy is another object)
    if not unset and init_scale_relative is not None:
        _refuse_both(
            check_positive_float("init_scale", init_scale),
            check_positive_float("init_scale_relative", init_scale_relative),
        )
    init_scale = DEFAULT_INIT_SCALE if unset else init_scale
    real_device("mean_field_guide()", model)  # (its priors have no values)
    return MeanFieldGuide(
        model, init_scale=init_scale, init_from=init_from, init_scale_relative=init_scale_relative
    )


# --------------------------------------------------------------------------------------------
# Does a guide belong to a model?
# --------------------------------------------------------------------------------------------


_IN_ORDER = {
    "fit()": "fit(model, guide, train_loader, ...)",
    "predict()": "predict(model, x, guide)",
    "KLWeightedELBO": "elbo.loss(model, guide, x, y), SVI(model, guide, optim, elbo)",
    "psis_diagnostic()": "psis_diagnostic(model, guide, x, y)",
    "to_inference_data()": "to_inference_data(model, guide, x, y, ...)",
}
"""How each caller of :func:`refuse_guide_as_model` takes the model and its guide."""


def refuse_guide_as_model(model: Any, caller: str) -> None:
    """Refuse a guide (a :class:`MeanFieldGuide`, a Pyro autoguide) passed as the model, the
    two swapped: it observes nothing, and the model passed as its guide would be replayed on
    it (``KLWeightedELBO`` and ``psis_diagnostic()`` gave a number under Pyro's warnings, fit()
    told the guide to observe its targets)."""
    if isinstance(model, (MeanFieldGuide, AutoGuide, AutoMessenger)):
        order = _IN_ORDER.get(caller, "the model first, then its guide")
        raise TypeError(
            f"{caller} expected the model first, got a guide ({type(model).__name__}) in its "
            f"place (the model and its guide swapped?). Pass them in order: {order}."
        )


def check_guide(model: Any, guide: Any, caller: str) -> None:
    """Refuse a guide whose sites differ from the latent sites of a pyrouq model.

    Decided without drawing for a :class:`MeanFieldGuide` (its sites) and for a Pyro autoguide
    that has been built (its prototype trace); other guides are checked on their draws
    (:func:`check_draws`). The message names the first differing site, in the model's order.
    A guide that is not callable is refused (but by save(), which names what it can store);
    so is a guide passed as the model (:func:`refuse_guide_as_model`), except by save(), which
    writes a guide given alone as a network (``load(path, module=guide)`` reads it back).
    """
    if caller != "save()":
        refuse_guide_as_model(model, caller)
    if guide is not None and not callable(guide) and caller != "save()":
        raise TypeError(  # (fit() went on to "'str' object is not callable", from its probe)
            f"{caller}: expected the guide to be callable (mean_field_guide(model), a Pyro "
            f"autoguide or a guide function), got {type(guide).__name__}. Pass guide="
            "mean_field_guide(model), or guide=None for a model without latent sites."
        )
    if guide is not None and guide is model:  # its draws would be the prior's, silently
        check_drawable(model, "a guide", caller)  # (an ensemble: none; a plain network: none)
        build = "mean_field_guide(model), fitted with fit(model, guide, data)"
        if model_sites(model) is None:  # a Pyro model of one's own: no mean_field_guide
            fitter = "fit(model, guide, data)" if isinstance(model, nn.Module) else "Pyro's SVI"
            build = f"pyro.infer.autoguide.AutoNormal(model), fitted with {fitter}"
        raise ValueError(
            f"{caller}: the model ({type(model).__name__}) was passed as its own guide, which "
            "would draw the weights from the prior, not from a posterior. Pass the guide built "
            f"for it, guide = {build}."
        )
    expected = model_sites(model)
    if expected is None or guide is None:
        return
    got: dict[str, tuple[int, ...]] | None = None
    strict = False
    if isinstance(guide, MeanFieldGuide):
        got = {site: tuple(guide.site_loc(site).shape) for site in guide.sites}
        strict = True
    else:
        got = prototype_shapes(guide)
    if got is not None:
        refuse(model, site_mismatch(expected, got, strict), caller)
    if isinstance(guide, MeanFieldGuide) and caller != "save()":  # (saving a pair moves none)
        check_guide_tensors(model, guide, caller)


def check_guide_tensors(
    model: Any, guide: MeanFieldGuide, caller: str, first: bool = False
) -> None:
    """Refuse a :class:`MeanFieldGuide` whose locations are of another dtype or on another
    device than the model's network sites (a model cast or moved after its guide was built:
    the run would fail deep in a layer); ``first``: the first site only."""
    net = getattr(model, "net", None)
    network = getattr(model, "network_sites", None)
    if not isinstance(net, nn.Module) or not callable(network):
        return
    for site in itertools.islice(network(), 1 if first else None):
        held, loc = net.get_buffer(site), guide.site_loc(site)
        if held.dtype != loc.dtype or held.device != loc.device:
            raise ValueError(
                f"{caller}: the guide's site {site!r} is {loc.dtype} on {loc.device}, the "
                f"model's {held.dtype} on {held.device}: one of them was cast or moved after the "
                f"guide was built. Cast or move the guide as the model (guide.to("
                f"{str(held.device)!r}, {held.dtype})), or build it again: mean_field_guide(model)."
            )
