"""The KL-weighted ELBO.

On a minibatch of B of N training points, for a guide q and prior p::

    loss = -(N/B) * sum_batch E_q[log p(y | x, w)]  +  kl_weight * KL(q || p)

``kl_weight = 1`` is the exact (unbiased) negative ELBO; ``kl_weight < 1`` down-weights the
prior. Code that writes the loss per example, ``mean CE + k * KL`` (the torch-uncertainty seed
tutorial uses k = 1/10000), corresponds to ``kl_weight = k * N``: multiply that loss by N.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import ELBO
from pyro.infer.util import is_validation_enabled
from torch import Tensor

from pyrouq import _engine
from pyrouq._forwards import own_forward
from pyrouq._param_store import register_params, register_point_estimates
from pyrouq._util import AsItCame, check_count, check_flag
from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork
from pyrouq.infer._elbo_checks import (
    PARTICLES_HINT,
    check_kl_weight,
    check_traces,
    check_unguided_trace,
    handlers_active,
    is_empty_guide,
    lacks_labels,
    local_owner,
    model_inputs,
    needs_labels,
    plain_network_error,
    refuse_plate_around,
    refuse_unbuilt_without_labels,
    set_known_plate_nesting,
    traced_guide,
    warn_local,
)
from pyrouq.infer._normal_kl import draw_with_normal_kl, kl_dtype, normal_kl
from pyrouq.infer._particles import particle_by_particle
from pyrouq.infer._site_checks import site_mismatch
from pyrouq.infer._site_kl import (
    check_float16_gradients,
    check_max_plate_nesting,
    float32_zero,
    guide_site_kl,
    traced_terms,
)
from pyrouq.infer._site_priors import _normal_prior, _priors, _scalar_normal_sites
from pyrouq.infer.guide import MeanFieldGuide, check_guide_tensors, draw

__all__ = ["ELBOTerms", "KLWeightedELBO"]

_ANY_GUIDE = "pyro.infer.autoguide.AutoNormal(model)"
_CALL = "the ELBO (elbo.loss(...), svi.step(...), fit())"


@dataclass(frozen=True)
class ELBOTerms:
    """The parts of one evaluation of :class:`KLWeightedELBO`.

    Attributes
    ----------
    loss : torch.Tensor
        Differentiable scalar ``nll + kl_weight * kl``.
    nll : torch.Tensor
        Scalar, ``-(N/B) * sum_batch log p(y | x, w)`` averaged over particles.
    kl : torch.Tensor
        Scalar, ``KL(q || p)`` (unweighted) averaged over particles.
    outputs : torch.Tensor or None
        The model's outputs (logits), detached, when recorded: ``(B, D)`` of the first
        particle, or those of every particle when they are vectorised.
    """

    loss: Tensor
    nll: Tensor
    kl: Tensor
    outputs: Tensor | None = None


def _samples_directly(model: Any, guide: Any, anyway: bool = False) -> bool:
    """Whether :class:`KLWeightedELBO` may draw the weights from ``guide``'s locations and
    scales and run the network through the engine instead of tracing both: a
    :class:`MeanFieldGuide` and a :class:`~pyrouq.BayesianNetwork` whose ``forward`` is not
    overridden (:func:`~pyrouq._forwards.own_forward`: the user's own is traced: it runs),
    with no Pyro effect handler around the call (:func:`handlers_active`; ``anyway``: with
    one too)."""
    return (
        (anyway or not handlers_active())
        and isinstance(guide, MeanFieldGuide)
        and type(guide).forward is MeanFieldGuide.forward
        and isinstance(model, BayesianNetwork)
        and not own_forward(model)  # (m.forward compiled is not the user's own)
    )


def _deterministic(model: Any, guide: Any) -> bool:
    """A BatchEnsemble (no latent sites) with no guide, and no Pyro effect handler around the
    call (:func:`handlers_active`): its outputs are computed directly."""
    return (
        not handlers_active()
        and (guide is None or is_empty_guide(guide))
        and isinstance(model, BatchEnsembleNetwork)
        and not own_forward(model)  # (a subclass's, or one set on the instance)
    )


def observed_nll(
    model: Any, outputs: Tensor, y: Tensor, weights: dict[str, Tensor] | None = None
) -> Tensor:
    """``-(N/B) * sum log p(y | outputs)``: the value a trace of the model gives its ``"obs"``
    site, computed by the model's likelihood (its fast NLL) with the likelihood's own sites
    taken from ``weights``; the targets checked first."""
    where = type(model).__name__
    likelihood = model.likelihood
    model.likelihood.check_targets(y, outputs, where)
    scale = likelihood.scale(model.num_data, outputs.shape[-2], where)
    own = likelihood.latent_sites()
    latent = {s: weights[s] for s in own} if own and weights is not None else None
    return likelihood.nll(outputs, y, latent) * scale


class KLWeightedELBO(ELBO):
    """Negative ELBO with a weight on the KL term, for mean-field guides.

    On a minibatch of B of N points::

        loss = -(N/B) * sum_batch E_q[log p(y | x, w)]  +  kl_weight * KL(q || p)

    The N/B factor comes from the model (pyrouq models scale ``"obs"`` by it). The KL is
    analytic for each latent site where ``torch.distributions.kl_divergence`` knows the pair
    (Normal guide and Normal prior), the model and guide weigh the site alike (scale and
    mask) and the guide draws it after every site the model draws before it (the order of
    Pyro's ``TraceMeanField_ELBO``: a prior hanging on a site the guide draws later, given
    this one, would bias the closed form), and a Monte Carlo estimate ``log q(w) - log p(w)``
    otherwise, each side with its own site's scale and mask (an autoguide's ``Delta`` sites
    always: torch's KL for them leaves out their log-Jacobian); guide sites without
    ``rsample`` are refused (no score-function term); ``log q`` includes the guide's own
    sites (an ``AutoNormal``'s ``*_unconstrained``, an ``AutoDiagonalNormal``'s joint latent,
    of which the model's sites are Delta transforms; a ``pyro.factor(..., has_rsample=True)``),
    so ``kl_weight=1`` is the loss of Pyro's ``Trace_ELBO``.
    ``kl_weight`` multiplies the latent sites' contribution, which is the same as
    scaling those sites in both model and guide (``kl_weight = 0`` drops the KL without Pyro's
    scale handler, which rejects 0). The expectation over q is estimated with
    ``num_particles`` draws, sequential or vectorised.

    Conversion: a per-example loss ``mean CE + k * KL`` equals ``loss / N`` with
    ``kl_weight = k * N``.

    With a :class:`~pyrouq.MeanFieldGuide` and a model made by :func:`pyrouq.bayesian` (or a
    front door such as ``BayesianLeNet``), no trace is taken: each particle draws every weight
    by reparameterisation, ``loc + scale * eps``, in the order Pyro's guide would (one particle
    gives the network outputs of the traced path bit for bit, the loss and its gradients up to
    rounding, tested), runs the network with them and takes the likelihood's fast NLL; the KL
    term is the analytic ``KL(q || p)`` of every site, computed once (for a scalar Normal
    prior from three sums per site, with its gradient written out, in the autograd node that
    draws the site's weights for the first particle). A BatchEnsemble without a
    guide is run directly too. Any other guide (an ``AutoNormal``, a hand-written guide), a
    model subclass overriding ``forward``, or a call under a Pyro effect handler
    (``poutine.scale``, ``mask``, ``condition``; not ``SVI.step``'s parameter capture,
    ``poutine.seed``, nor one outside a ``poutine.block()`` hiding every site, as ``SVI.run``'s)
    is traced, so that the handler applies as to Pyro's ELBOs: the guide
    is run and the model replayed against it. A vectorised ``pyro.plate`` around the call of
    a pyrouq model is refused (``ValueError``): the model has its own ``pyro.plate("data")``
    over the batch, which it would duplicate or collide with; call the ELBO outside it (scale
    the loss with ``poutine.scale``). A sequential plate (``for i in pyro.plate(...)``), or one
    with a hide-all ``poutine.block()`` inside it, around the call, is let through.
    :meth:`terms_and_grads` (what :func:`pyrouq.fit` and SVI call) back-propagates several
    weight-sampling particles one at a time, with the same draws and gradients. As in
    :func:`pyrouq.fit`, a guide built for another model, the model as its own guide, a guide
    passed as the model (the two swapped: ``TypeError``), a
    :class:`~pyrouq.MeanFieldGuide` with a BatchEnsemble, and ``guide=None`` for a model with
    latent sites, one that observes nothing or a plain torch network are refused (``None`` is
    the guide of a model without latent sites), as is a call without the labels whose guide
    is a Pyro autoguide that has never run (built then, it would take the model's ``"obs"``
    site for a latent one) or a ``GuideMessenger`` whose model samples ``"obs"`` on x alone
    (it runs the model at every call). Traced under Pyro's validation (its default;
    not in fit()), the traces are checked as ``Trace_ELBO`` checks them, site shapes included
    (``poutine.mask`` of one entry per data point around a model masks its weights: refused).

    Local reparameterisation. For a model with ``local_reparameterization=True`` and a
    :class:`~pyrouq.MeanFieldGuide`, every ``nn.Linear`` / ``nn.Conv{1,2,3}d`` whose weight
    (and bias) are latent draws its pre-activations ``Normal(mean, var)`` for the current
    input h instead, with ``mean = layer(h; loc)`` and ``var = layer(h^2; scale^2)``, one
    standard-normal noise per unit and example, so the gradients reach ``loc`` and ``rho``
    through ``mean + sqrt(var) * eps``; other latent sites are drawn whole, as are layers
    with a site drawn LogNormal (a prior on (0, inf)) and layers called more than once a
    forward, never (their weight read as a tensor), or, for a Linear, on inputs of more than
    two dims. The KL term is as without it, its Monte Carlo part over ``num_particles`` draws:
    for the LogNormal-guided sites and the likelihood's (a noise scale), the draws the NLL
    took; for the others (say a Normal guide under a scale-mixture prior), fresh draws. For
    linear layers this is an unbiased estimate of the same loss with lower variance; for
    convolutions it approximates it (outputs at different positions get independent noise).
    Any other guide warns and falls back to weight sampling.

    Parameters
    ----------
    kl_weight : float, default 1.0
        Weight of the KL term (>= 0, finite). 1 gives the exact ELBO.
    num_particles : int, default 1
    vectorize_particles : bool, default False
        Draw all particles at once (under a particle plate when traced; see
        :meth:`terms_and_grads` for how they run on CPU).
    max_plate_nesting : int, optional
        As in Pyro (an int >= 0); if not given (None, or Pyro's ``float("inf")``), guessed
        from one trace when vectorising, but for a pyrouq model (with a ``MeanFieldGuide``, an
        autoguide or none), whose plates are known: ``"data"``, and ``"members"`` in ensembles.

    Examples
    --------
    >>> import pyro, torch
    >>> from pyrouq import BayesianMLP, mean_field_guide
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3, num_data=10)
    >>> guide = mean_field_guide(model)
    >>> svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), KLWeightedELBO(0.5))
    >>> loss = svi.step(torch.randn(10, 4), torch.randint(0, 3, (10,)))
    """

    def __init__(
        self,
        kl_weight: float = 1.0,
        num_particles: int = 1,
        vectorize_particles: bool = False,
        max_plate_nesting: float | None = float("inf"),
    ):
        num_particles = check_count("num_particles", num_particles, PARTICLES_HINT)
        vectorize_particles = check_flag("vectorize_particles", vectorize_particles)
        max_plate_nesting = check_max_plate_nesting(max_plate_nesting)
        self.kl_weight = kl_weight  # (checked by the property)
        super().__init__(
            num_particles=num_particles,
            vectorize_particles=vectorize_particles,
            max_plate_nesting=max_plate_nesting,
        )

    # set by fit() for the steps of an epoch after its first (between which no code of the
    # caller's runs but the loader's and the network's): the parameters of the model and the
    # guide, registered in Pyro's param store by that first step (not again: each call would
    # find them there) and walked once for check_float16_gradients; None (SVI, any other
    # caller, an epoch's first step): registered and walked at every call
    _registered: list[Tensor] | None = None

    @property
    def kl_weight(self) -> float:
        """Weight of the KL term (a float >= 0); setting it (a KL annealing schedule between
        steps) checks the value as the constructor does."""
        return self._kl_weight

    @kl_weight.setter
    def kl_weight(self, value: float) -> None:
        self._kl_weight = check_kl_weight(value)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle; a state saved before ``kl_weight`` was a property holds ``"kl_weight"``,
        which is loaded as the setter takes it (checked)."""
        state = dict(state)
        if "kl_weight" in state:
            state["_kl_weight"] = check_kl_weight(state.pop("kl_weight"))
        self.__dict__.update(state)

    # -- the traced path --------------------------------------------------------------------

    def _get_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
            *args, **kwargs
        )
        if is_validation_enabled():  # (Trace_ELBO's checks of the sites, their shapes too)
            check_traces(model_trace, guide_trace, self.max_plate_nesting)
        return model_trace, guide_trace

    def terms(self, model, guide, *args, **kwargs) -> ELBOTerms:
        """Differentiable loss and its (detached) NLL and KL parts, averaged over particles."""
        # under a torch.autocast entered around fit() or SVI's steps, a parameter's cast is
        # cached until the context exits: the point estimates updated in place since (a
        # select= network's other layers) would run as they were at the first step
        torch.clear_autocast_cache()
        refuse_plate_around(model, "KLWeightedELBO", _CALL)
        if _samples_directly(model, guide):
            return self._direct_terms(model, guide, *model_inputs(args, kwargs))
        if _deterministic(model, guide):
            return self._ensemble_terms(model, *model_inputs(args, kwargs))
        unguided = guide is None
        guide = traced_guide(model, guide)  # (None: one that draws none)
        local = local_owner(model)
        if local is not None:
            warn_local(local, model, guide, _samples_directly(model, guide, anyway=True))
        nll_total: Tensor | float = 0.0
        kl_total: Tensor | float = 0.0
        outputs = None
        labelled = not lacks_labels(model, args, kwargs)
        refuse_unbuilt_without_labels(guide, labelled, model_inputs(args, kwargs)[0])
        ours = isinstance(model, BayesianNetwork)
        # the network's own priors are fixed: analytic in any order (not a subclass's sites)
        fixed = set(model.latent_sites()) if ours else set()
        fix = "mean_field_guide(model)" if ours else _ANY_GUIDE
        set_known_plate_nesting(self, model, guide)  # (no guessing trace for ours)
        try:
            for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
                if unguided:  # (its trace, read as fit() reads its first)
                    check_unguided_trace(model, model_trace, labelled)
                nll, kl = traced_terms(model_trace, guide_trace, labelled, fix, fixed)
                nll_total = nll_total + nll
                kl_total = kl_total + kl
                if outputs is None:  # as predict() reads them: the "logits" site, else the return
                    node = model_trace.nodes.get("logits") or model_trace.nodes.get("_RETURN")
                    value = None if node is None else node["value"]
                    if torch.is_tensor(value) and value.dim() >= 2:
                        outputs = value.detach()
        except TypeError as err:  # a plain network called with the labels it cannot take
            refusal = plain_network_error(model, err) if unguided else None
            if refusal is None:
                raise
            raise refusal from err
        nll_t = torch.as_tensor(nll_total) / self.num_particles
        kl_t = torch.as_tensor(kl_total) / self.num_particles
        loss = nll_t + self._weighted(kl_t)
        return ELBOTerms(loss=loss, nll=nll_t.detach(), kl=kl_t.detach(), outputs=outputs)

    def _weighted(self, kl: Tensor) -> Tensor:
        """``kl_weight * kl``; with ``kl_weight = 0``, zeros: the KL dropped from the loss,
        even where it is infinite (a scale that underflowed to 0, as scales shrink without a
        prior), where ``0 * inf`` would make the loss NaN."""
        return self.kl_weight * kl if self.kl_weight else torch.zeros_like(kl)

    # -- the direct paths -------------------------------------------------------------------

    def _guide_moments(
        self, model: BayesianNetwork, guide: MeanFieldGuide
    ) -> tuple[dict, dict, bool]:
        """The guide's locations and scales, site by site, checked against the model, and
        whether a lazy point estimate (a learned noise scale) is left to register later."""
        lazy = False
        if self._registered is None:  # (fit() registered them at the epoch's first step)
            register_params(guide.name, guide)  # so that SVI's parameter capture sees them
            lazy = register_point_estimates(model)
        sites = model.latent_sites()
        loc = {s: guide.site_loc(s) for s in guide.sites}
        if set(sites) != set(loc) or any(loc[s].shape != sites[s] for s in sites):
            shapes = {s: tuple(v.shape) for s, v in loc.items()}
            differ = site_mismatch({s: tuple(v) for s, v in sites.items()}, shapes, strict=True)
            raise ValueError(
                f"KLWeightedELBO: the guide does not belong to {type(model).__name__}, its sites "
                f"differ from the model's latent sites: {differ}. Pass the guide built for this "
                "model (mean_field_guide(model)) and fitted with it."
            )
        check_guide_tensors(model, guide, "KLWeightedELBO", first=True)  # (its sites: the model's)
        scale = {s: guide.site_scale(s) for s in guide.sites}
        return loc, scale, lazy

    @staticmethod
    def _kl(
        model: BayesianNetwork,
        loc: dict,
        scale: dict,
        draws: list[dict[str, Tensor]],
        positive: tuple[str, ...] = (),
        skip: Container[str] = (),
    ) -> Tensor:
        """``KL(q || p)`` summed over the sites but those in ``skip``: analytic where torch
        knows the pair, else the Monte Carlo mean of ``log q(w) - log p(w)`` over ``draws``
        (for a site they lack, over as many fresh draws, at least one). q is Normal, LogNormal
        for the ``positive`` sites; both in float32 for a half site (:func:`guide_site_kl`)."""
        total = float32_zero(next(iter(loc.values())).device)
        network = model.network_sites()
        others = [site for site in model.latent_sites() if site not in network]  # likelihood's
        for site, known in zip(network, _priors(model), strict=True):
            if site in skip:
                continue
            if not _normal_prior(site, known, positive):
                others.append(site)
                continue
            total = total + normal_kl(loc[site], scale[site], known.loc, known.scale)
        priors = model.priors() if others else {}
        for site in others:
            prior = priors[site]
            family = dist.LogNormal if site in positive else dist.Normal
            wide = kl_dtype(loc[site].dtype)  # a half-precision site's sums: float32
            q = family(loc[site].to(wide), scale[site].to(wide)).to_event(loc[site].dim())
            values = [w[site].to(wide) for w in draws if site in w]
            total = total + guide_site_kl(q, prior, values, len(draws))
        return total

    def _draws_and_kl(
        self, model: BayesianNetwork, loc: dict, scale: dict, positive: tuple[str, ...] = ()
    ) -> tuple[list[dict[str, Tensor]], dict | None, Tensor]:
        """The particles' weights, as :meth:`terms` draws them (every particle at once site by
        site when vectorised, also returned stacked, each particle's weights then views of the
        stack; else one particle after another), and :meth:`_kl`. With particles one after
        another, the first particle's draw of each site whose prior is a scalar Normal is taken
        with that site's KL in one autograd node (:func:`draw_with_normal_kl`; the same draws,
        in the same order)."""
        if self.vectorize_particles:
            stacked = draw(loc, scale, self.num_particles, positive)
            # one view per particle (unbind): indexing the stack would back-propagate a zero
            # tensor of all S particles for every particle (S^2 weights in the backward pass)
            views = zip(*(w.unbind(0) for w in stacked.values()), strict=True)
            draws = [dict(zip(stacked, particle, strict=True)) for particle in views]
            return draws, stacked, self._kl(model, loc, scale, draws, positive)
        # (not with kl_weight = 0: the fused node's backward would take 0 / scale, NaN where
        # a scale underflowed to 0, for a KL that is not in the loss)
        fused = _scalar_normal_sites(model, positive) if self.kl_weight else {}
        first: dict[str, Tensor] = {}
        kl: Tensor | None = None
        for site in loc:
            known = fused.get(site)
            if known is None:
                first[site] = draw({site: loc[site]}, {site: scale[site]}, None, positive)[site]
                continue
            first[site], site_kl = draw_with_normal_kl(
                loc[site], scale[site], known.loc, known.scale
            )
            kl = site_kl if kl is None else kl + site_kl
        draws = [first] + [draw(loc, scale, None, positive) for _ in range(self.num_particles - 1)]
        rest = self._kl(model, loc, scale, draws, positive, skip=fused)
        return draws, None, rest if kl is None else kl + rest

    def _direct_terms(self, model: BayesianNetwork, guide: MeanFieldGuide, x, y) -> ELBOTerms:
        """:meth:`terms` without traces (see the class docstring)."""
        needs_labels(y)
        loc, scale, lazy = self._guide_moments(model, guide)
        positive = guide.positive
        count = self.num_particles
        draws: list[dict[str, Tensor]] = []
        if model.local_reparameterization:
            x = model._input(x)
            network = model.network_sites()
            own = [s for s in loc if s not in network]
            # a site with a LogNormal guide (a prior on (0, inf)) is drawn whole, exp(loc +
            # scale * eps), before the run (which then adds 0 * noise), and its layers with it;
            # the particles then run one after another, each with its own draw
            logn = [s for s in network if s in positive]
            layers = {
                path: pair
                for path, pair in model.local_layers().items()
                if not any(s in logn for s in pair if s is not None)
            }
            num = count if self.vectorize_particles and not logn else None
            runs: list[Tensor] = []
            nll: Tensor | float = 0.0
            inputs = AsItCame(x, 1 if num else count)  # as it came to every particle
            for _ in range(1 if num else count):
                net_loc = {s: loc[s] for s in network}
                net_scale = {s: scale[s] for s in network}
                whole = draw({s: loc[s] for s in logn}, {s: scale[s] for s in logn}, None, positive)
                for site, value in whole.items():
                    net_loc[site], net_scale[site] = value, torch.zeros_like(value)
                out = _engine.run_local(model.net, inputs(), net_loc, net_scale, layers, num)
                noise = draw({s: loc[s] for s in own}, {s: scale[s] for s in own}, num, positive)
                nll = nll + observed_nll(model, out, y, noise)
                runs.append(out)
                # the KL's Monte Carlo part takes the draws the NLL took, particle by particle
                drawn = {**whole, **noise}  # (whole is empty when vectorised: num needs no logn)
                draws += [{s: v[i] for s, v in drawn.items()} for i in range(num or 0)] or [drawn]
            first = torch.stack(runs) if self.vectorize_particles and num is None else runs[0]
            kl = self._kl(model, loc, scale, draws, positive)
        else:
            draws, stacked, kl = self._draws_and_kl(model, loc, scale, positive)
            if stacked is not None:
                first = model.outputs(x, stacked)
                nll = observed_nll(model, first, y, stacked)
            else:
                inputs = AsItCame(x, len(draws))  # as it came to every particle
                outs = [model.outputs(inputs(), weights) for weights in draws]
                nll = 0.0
                for out, weights in zip(outs, draws, strict=True):
                    nll = nll + observed_nll(model, out, y, weights)
                first = outs[0]
        nll_t = torch.as_tensor(nll) / count
        loss = nll_t + self._weighted(kl)
        if lazy:  # a learned noise scale, sized by the run
            register_point_estimates(model)
        return ELBOTerms(loss=loss, nll=nll_t.detach(), kl=kl.detach(), outputs=first.detach())

    def _ensemble_terms(self, model: BatchEnsembleNetwork, x, y) -> ELBOTerms:
        """A BatchEnsemble's loss: its members' summed negative log-likelihood, scaled N/B."""
        needs_labels(y)
        lazy = register_point_estimates(model) if self._registered is None else False
        outputs = model.outputs(x)
        nll = observed_nll(model, outputs, y)
        if lazy:  # a learned noise scale, sized by the run
            register_point_estimates(model)
        zero = float32_zero(nll.device)
        return ELBOTerms(loss=nll, nll=nll.detach(), kl=zero, outputs=outputs.detach())

    def terms_and_grads(self, model, guide, *args, **kwargs) -> ELBOTerms:
        """:meth:`terms`, after back-propagating the loss into the parameters (``loss`` is
        returned detached). What :func:`pyrouq.fit` and :meth:`loss_and_grads` call.

        The gradients are those of ``terms(...).loss``. With a :class:`~pyrouq.MeanFieldGuide`,
        a model sampling weights and several particles (sequential, or vectorised on CPU,
        where vectorised particles run one draw at a time anyway), the particles are
        back-propagated one at a time: every particle's weights are drawn first (the draws
        :meth:`terms` makes), then each particle's NLL is run forward and backward into its
        weight draw before the next particle runs, and the draws are back-propagated into the
        guide with the KL term. One particle's activations are held at a time instead of all
        of them. A network run in float16 whose gradients overflow (inf / NaN) while the loss
        is finite raises ``FloatingPointError`` naming the fix (bfloat16 or float32).
        Called under ``torch.no_grad()`` or ``torch.inference_mode()``, it still computes the
        gradients (as :func:`pyrouq.fit` does, it runs outside them: back-propagating is what it
        is for), where Pyro's ``Trace_ELBO.loss_and_grads`` silently leaves them unset.
        """
        with torch.inference_mode(False), torch.enable_grad():
            return self._terms_and_grads(model, guide, *args, **kwargs)

    def _terms_and_grads(self, model, guide, *args, **kwargs) -> ELBOTerms:
        x, y = model_inputs(args, kwargs)
        torch.clear_autocast_cache()  # see terms()
        refuse_plate_around(model, "KLWeightedELBO", _CALL)
        if (
            self.num_particles > 1
            and _samples_directly(model, guide)
            and not model.local_reparameterization
            and torch.is_tensor(x)
            and y is not None
            and (not self.vectorize_particles or x.device.type == "cpu")
        ):
            terms = particle_by_particle(self, model, guide, x, y)
        else:
            terms = self.terms(model, guide, *args, **kwargs)
            if terms.loss.requires_grad:
                terms.loss.backward()
        params = self._registered  # (fit()'s, walked at the epoch's first step)
        check_float16_gradients([model, guide], terms.loss.detach(), terms.outputs, params)
        return dataclasses.replace(terms, loss=terms.loss.detach())

    # -- Pyro's ELBO interface ----------------------------------------------------------------

    def differentiable_loss(self, model, guide, *args, **kwargs) -> Tensor:
        """The loss as a differentiable scalar tensor."""
        return self.terms(model, guide, *args, **kwargs).loss

    def loss(self, model, guide, *args, **kwargs) -> float:
        """The loss as a float (no gradients)."""
        with torch.no_grad():
            return float(self.terms(model, guide, *args, **kwargs).loss)

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """The loss as a float, after back-propagating it into the parameters (through
        :meth:`terms_and_grads`, so under ``torch.no_grad()`` and ``torch.inference_mode()``
        too)."""
        return float(self.terms_and_grads(model, guide, *args, **kwargs).loss)

    def __repr__(self) -> str:
        return (
            f"KLWeightedELBO(kl_weight={self.kl_weight:g}, num_particles={self.num_particles}, "
            f"vectorize_particles={self.vectorize_particles})"
        )
