"""Variational inference: the mean-field guide, the KL-weighted ELBO and ``fit()``.

The objective, on a minibatch of B of N training points, for a guide q and prior p::

    loss = -(N/B) * sum_batch E_q[log p(y | x, w)]  +  kl_weight * KL(q || p)

``kl_weight = 1`` is the exact (unbiased) negative ELBO; ``kl_weight < 1`` down-weights the
prior. Code that writes the loss per example, ``mean CE + k * KL`` (the torch-uncertainty seed
tutorial uses k = 1/10000), corresponds to ``kl_weight = k * N``: multiply that loss by N.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.distributions.util import scale_and_mask
from pyro.infer import ELBO
from pyro.infer.util import is_validation_enabled
from pyro.poutine.util import site_is_subsample
from pyro.util import check_model_guide_match
from torch import nn

from pyrouq._training import (
    InterruptFlag,
    TrainingInterrupted,
    check_batch,
    check_loader_inputs,
    loader_rng_state,
    restore_rng_states,
    rng_states,
    training_state,
)
from pyrouq._util import check_count, check_positive_float, has_latent_sites, module_device
from pyrouq.nn import forget_params

__all__ = [
    "EpochRecord",
    "FitResult",
    "KLWeightedELBO",
    "MeanFieldGuide",
    "TrainingInterrupted",
    "fit",
    "mean_field_guide",
]

LRSchedule = Literal["warmup_cosine", "cosine", "constant"]

WARMUP_FRACTION = 0.2
"""Share of the steps over which ``lr_schedule="warmup_cosine"`` ramps the learning rate up."""

TRAIN_ACC_EXAMPLES = 1024
"""Training examples on which :func:`fit` measures each epoch's ``train_acc``."""

DEFAULT_INIT_SCALE = 1e-2
"""Default initial standard deviation of every guide site."""


# --------------------------------------------------------------------------------------------
# Mean-field guide
# --------------------------------------------------------------------------------------------

_GUIDE_COUNTER = itertools.count()


def _inverse_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


def _key(site: str) -> str:
    return site.replace(".", "__")


class MeanFieldGuide(nn.Module):
    """Diagonal Normal guide ``q(w) = prod_site Normal(loc, softplus(rho))`` for a pyrouq model.

    Every latent site of the model gets a ``Normal(loc, scale).to_event(...)`` of the prior's
    exact shape, so ``KL(q || p)`` is analytic for Normal priors (both in
    :class:`KLWeightedELBO` and in Pyro's ``TraceMeanField_ELBO``).

    Parameters live in this module (``loc`` and ``rho`` parameter dicts, keys are site names
    with ``.`` replaced by ``__``) and are registered in Pyro's param store under a prefix unique
    to this guide (``guide.name``), so Pyro optimizers see them while two guides never share or
    overwrite parameters; the entries are removed when the guide is garbage collected.

    .. warning:: Mean-field: the guide ignores every correlation between weights, and it is
       known to underestimate posterior variance.
    """

    def __init__(
        self,
        model: Any,
        init_scale: float = DEFAULT_INIT_SCALE,
        init_from: nn.Module | None = None,
    ):
        super().__init__()
        init_scale = check_positive_float(
            "init_scale",
            init_scale,
            "It is the initial standard deviation of every guide site; the default is 1e-2.",
        )
        latent_sites = getattr(model, "latent_sites", None)
        if latent_sites is None:
            raise TypeError(
                f"mean_field_guide() needs a pyrouq Bayesian model (BayesianMLP, "
                f"BayesianLeNet), got {type(model).__name__}. For other Pyro models use "
                "pyro.infer.autoguide.AutoNormal; BatchEnsemble models need no guide (pass "
                "guide=None to fit)."
            )
        sites: dict[str, torch.Size] = latent_sites()
        if init_from is None:
            init_from = model.plain_network()  # a fresh torch initialisation
        state = init_from.state_dict()
        missing = [s for s in sites if s not in state]
        if missing:
            raise ValueError(
                f"init_from ({type(init_from).__name__}) has no parameter(s) {missing}; "
                f"expected a network with parameters {list(sites)} (e.g. "
                f"{type(model.plain_network()).__name__} with the same configuration)."
            )
        device = next((b.device for b in model.buffers()), torch.device("cpu"))
        rho = _inverse_softplus(float(init_scale))
        self.loc = nn.ParameterDict()
        self.rho = nn.ParameterDict()
        for site, shape in sites.items():
            value = state[site].detach()
            if value.shape != shape:
                raise ValueError(
                    f"init_from parameter {site!r} has shape {tuple(value.shape)}, expected "
                    f"{tuple(shape)}: the plain network's configuration differs from the model's."
                )
            self.loc[_key(site)] = nn.Parameter(value.clone().to(device))
            self.rho[_key(site)] = nn.Parameter(torch.full(shape, rho, device=device))
        self.sites = tuple(sites)
        self.init_scale = init_scale
        self.name = f"MeanFieldGuide_{next(_GUIDE_COUNTER)}"
        weakref.finalize(self, forget_params, self.name)

    def site_loc(self, site: str) -> torch.Tensor:
        """Location (posterior mean) of ``site``."""
        return self.loc[_key(site)]

    def site_scale(self, site: str) -> torch.Tensor:
        """Standard deviation of ``site`` (``softplus(rho)``)."""
        return F.softplus(self.rho[_key(site)])

    def means(self) -> dict[str, torch.Tensor]:
        """Posterior means of every site, detached (for ``poutine.condition``)."""
        return {s: self.site_loc(s).detach() for s in self.sites}

    def scales(self) -> dict[str, torch.Tensor]:
        """Posterior standard deviations of every site, detached."""
        return {s: self.site_scale(s).detach() for s in self.sites}

    def get_distributions(self) -> dict[str, dist.Distribution]:
        """``Normal(loc, scale).to_event(...)`` of every site."""
        return {
            s: dist.Normal(self.site_loc(s), self.site_scale(s)).to_event(self.site_loc(s).dim())
            for s in self.sites
        }

    def forward(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Sample every site from q; the model's arguments are accepted and ignored."""
        pyro.module(self.name, self)
        return {s: pyro.sample(s, d) for s, d in self.get_distributions().items()}  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return f"name={self.name!r}, sites={len(self.sites)}, init_scale={self.init_scale:g}"


def mean_field_guide(
    model: nn.Module,
    init_scale: float = DEFAULT_INIT_SCALE,
    init_from: nn.Module | None = None,
) -> MeanFieldGuide:
    """Mean-field Normal guide for a pyrouq Bayesian model.

    Parameters
    ----------
    model : BayesianMLP or BayesianLeNet
    init_scale : float, default 1e-2
        Initial standard deviation of every site (> 0).
    init_from : nn.Module, optional
        A trained plain network (``MLP`` / ``LeNet`` of the same configuration) whose
        parameters become the initial locations. Default: a freshly initialised plain network
        (torch's default initialisation, not draws from the prior).

    Returns
    -------
    MeanFieldGuide

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
    return MeanFieldGuide(model, init_scale=init_scale, init_from=init_from)


# --------------------------------------------------------------------------------------------
# The KL-weighted ELBO
# --------------------------------------------------------------------------------------------


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
    logits : torch.Tensor or None
        The model's ``"logits"``, detached, when recorded: ``(B, C)`` of the first particle,
        or those of every particle when they are vectorised.
    """

    loss: torch.Tensor
    nll: torch.Tensor
    kl: torch.Tensor
    logits: torch.Tensor | None = None


def _samples_directly(model: Any, guide: Any) -> bool:
    """Whether :class:`KLWeightedELBO` may run ``model.forward_sampled`` with ``guide``'s
    locations and scales instead of tracing both: a :class:`MeanFieldGuide` and a model whose
    ``forward`` is the one of the class defining ``forward_sampled`` (a subclass overriding
    ``forward`` alone is traced, so its own ``forward`` runs)."""
    if not isinstance(guide, MeanFieldGuide) or type(guide).forward is not MeanFieldGuide.forward:
        return False
    cls = type(model)
    owner = next((c for c in cls.__mro__ if "forward_sampled" in vars(c)), None)
    return owner is not None and getattr(cls, "forward", None) is getattr(owner, "forward", None)


def _model_inputs(args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """``(x, y)`` from the arguments of a pyrouq model's ``forward(x, y=None)``."""
    x = args[0] if args else kwargs.get("x")
    y = args[1] if len(args) > 1 else kwargs.get("y")
    return x, y


def _check_kl_weight(kl_weight: object) -> float:
    if isinstance(kl_weight, bool) or not isinstance(kl_weight, (int, float)):
        raise TypeError(f"Expected kl_weight to be a float >= 0, got {kl_weight!r}.")
    if not math.isfinite(kl_weight) or kl_weight < 0:
        raise ValueError(
            f"Expected kl_weight to be a finite float >= 0, got {kl_weight!r}. "
            "kl_weight = 1 is the exact ELBO; 0 <= kl_weight < 1 down-weights the prior."
        )
    return float(kl_weight)


class KLWeightedELBO(ELBO):
    """Negative ELBO with a weight on the KL term, for mean-field guides.

    On a minibatch of B of N points::

        loss = -(N/B) * sum_batch E_q[log p(y | x, w)]  +  kl_weight * KL(q || p)

    The N/B factor comes from the model (pyrouq models scale ``"obs"`` by it). The KL is
    analytic for each latent site where ``torch.distributions.kl_divergence`` knows the pair
    (Normal guide and Normal prior) and a single-sample Monte Carlo estimate
    ``log q(w) - log p(w)`` otherwise. ``kl_weight`` multiplies the latent sites' contribution,
    which is the same as scaling those sites in both model and guide (``kl_weight = 0`` drops
    the KL without Pyro's scale handler, which rejects 0). The expectation over q is estimated
    with ``num_particles`` draws, sequential or vectorised.

    Conversion: a per-example loss ``mean CE + k * KL`` equals ``loss / N`` with
    ``kl_weight = k * N``.

    With a :class:`MeanFieldGuide` and a pyrouq Bayesian model, no trace of the guide is
    taken: each particle runs ``model.forward_sampled`` with the guide's ``loc`` and
    ``scale = softplus(rho)``, which draws every weight by reparameterisation,
    ``loc + scale * eps``, in the order Pyro's guide would (one particle gives the numbers
    of the traced path bit for bit, tested), and the KL term is the analytic
    ``KL(q || p)`` of every site, computed once. Any other guide (an ``AutoNormal``, a
    hand-written guide), or a model subclass overriding ``forward``, is traced: the guide
    is run and the model replayed against it. :meth:`terms_and_grads` (what :func:`fit` and
    SVI call) back-propagates several weight-sampling particles one at a time, with the
    same draws and gradients.

    Local reparameterisation. For a model with ``local_reparameterization=True`` (pyrouq
    Bayesian models) and a :class:`MeanFieldGuide`, ``model.forward_sampled`` draws every
    Bayesian layer's pre-activations ``Normal(mean, var)`` for the current input h instead,
    with ``mean = layer(h; loc)`` and ``var = layer(h^2; scale^2)`` (weight and bias), one
    standard-normal noise per unit and example, so the gradients reach ``loc`` and ``rho``
    through ``mean + sqrt(var) * eps``. The NLL term is ``-(N/B) sum_batch log p(y | x,
    logits)`` on those logits; the KL term is unchanged. For linear layers this is an
    unbiased estimate of the same loss with lower variance; for convolutions it approximates
    it (outputs at different positions get independent noise). Any other guide warns and
    falls back to weight sampling. Vectorised particles draw ``num_particles`` noises in one
    pass.

    Parameters
    ----------
    kl_weight : float, default 1.0
        Weight of the KL term (>= 0, finite). 1 gives the exact ELBO.
    num_particles : int, default 1
    vectorize_particles : bool, default False
        Draw all particles at once (under a particle plate when traced; see
        :meth:`terms_and_grads` for how they run on CPU).
    max_plate_nesting : int, optional
        As in Pyro; guessed from one trace when vectorising if not given.

    Examples
    --------
    >>> import pyro, torch
    >>> from pyrouq.models import BayesianMLP
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
        max_plate_nesting: float = float("inf"),
    ):
        check_count("num_particles", num_particles)
        self.kl_weight = _check_kl_weight(kl_weight)
        super().__init__(
            num_particles=num_particles,
            vectorize_particles=vectorize_particles,
            max_plate_nesting=max_plate_nesting,
        )

    def _get_trace(self, model, guide, args, kwargs):
        guide_trace = poutine.trace(guide).get_trace(*args, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(
            *args, **kwargs
        )
        if is_validation_enabled():
            check_model_guide_match(model_trace, guide_trace, self.max_plate_nesting)
        return model_trace, guide_trace

    @staticmethod
    def _particle_terms(model_trace, guide_trace) -> tuple[torch.Tensor, torch.Tensor]:
        nll = torch.zeros(())
        kl = torch.zeros(())
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or site_is_subsample(site):
                continue
            if site["is_observed"]:
                if site["infer"].get("_deterministic"):
                    continue
                log_p = site["fn"].log_prob(site["value"])
                nll = nll - scale_and_mask(log_p, site["scale"], site["mask"]).sum()
                continue
            guide_site = None if guide_trace is None else guide_trace.nodes.get(name)
            if guide_site is None and name == "obs":
                raise ValueError(
                    'KLWeightedELBO needs the labels: the model\'s "obs" site was not '
                    "observed (y=None). Pass them, e.g. elbo.loss(model, guide, x, y)."
                )
            if guide_site is None:
                raise ValueError(
                    f"The model's latent site {name!r} is missing from the guide. Build the "
                    "guide for this model (mean_field_guide(model))."
                )
            q, p = guide_site["fn"], site["fn"]
            try:
                kl_site = torch.distributions.kl_divergence(q, p)
            except NotImplementedError:
                value = guide_site["value"]
                kl_site = q.log_prob(value) - p.log_prob(value)
            kl = kl + scale_and_mask(kl_site, guide_site["scale"], guide_site["mask"]).sum()
        return nll, kl

    def terms(self, model, guide, *args, **kwargs) -> ELBOTerms:
        """Differentiable loss and its (detached) NLL and KL parts, averaged over particles."""
        if _samples_directly(model, guide):
            return self._direct_terms(model, guide, args, kwargs)
        if getattr(model, "local_reparameterization", False):
            warnings.warn(
                f"{type(model).__name__} has local_reparameterization=True, which "
                "KLWeightedELBO applies with a MeanFieldGuide only (it needs the guide's "
                f"locations and scales), got {type(guide).__name__}: weights are sampled "
                "instead. Use pyrouq.mean_field_guide(model).",
                stacklevel=2,
            )
        nll_total: torch.Tensor | float = 0.0
        kl_total: torch.Tensor | float = 0.0
        logits = None
        for model_trace, guide_trace in self._get_traces(model, guide, args, kwargs):
            nll, kl = self._particle_terms(model_trace, guide_trace)
            nll_total = nll_total + nll
            kl_total = kl_total + kl
            if logits is None and "logits" in model_trace.nodes:
                logits = model_trace.nodes["logits"]["value"].detach()
        nll_t = torch.as_tensor(nll_total) / self.num_particles
        kl_t = torch.as_tensor(kl_total) / self.num_particles
        loss = nll_t + self.kl_weight * kl_t
        return ELBOTerms(loss=loss, nll=nll_t.detach(), kl=kl_t.detach(), logits=logits)

    @staticmethod
    def _guide_moments(model, guide: MeanFieldGuide) -> tuple[dict, dict, dict]:
        """The guide's locations and scales and the model's priors, site by site."""
        pyro.module(guide.name, guide)  # so that SVI's parameter capture sees them
        loc = {s: guide.site_loc(s) for s in guide.sites}
        scale = {s: guide.site_scale(s) for s in guide.sites}
        priors = model.priors()
        if set(priors) != set(loc):
            raise ValueError(
                f"The guide's sites {sorted(loc)} differ from the model's latent sites "
                f"{sorted(priors)}. Build the guide for this model (mean_field_guide(model))."
            )
        return loc, scale, priors

    @staticmethod
    def _analytic_kl(loc: dict, scale: dict, priors: dict) -> torch.Tensor:
        """``KL(q || p)`` summed over the sites of a mean-field Normal guide."""
        return torch.as_tensor(
            sum(
                torch.distributions.kl_divergence(
                    dist.Normal(loc[s], scale[s]).to_event(loc[s].dim()), priors[s]
                ).sum()
                for s in loc
            )
        )

    def _direct_terms(self, model, guide: MeanFieldGuide, args, kwargs) -> ELBOTerms:
        """:meth:`terms` through ``model.forward_sampled`` (see the class docstring)."""
        loc, scale, priors = self._guide_moments(model, guide)
        draws = self.num_particles if self.vectorize_particles else None
        nll: torch.Tensor | float = 0.0
        logits = None
        for _ in range(1 if draws else self.num_particles):
            trace = poutine.trace(model.forward_sampled).get_trace(
                *args, loc=loc, scale=scale, num_draws=draws, **kwargs
            )
            nll = nll + self._particle_terms(trace, None)[0]
            if logits is None:
                logits = trace.nodes["logits"]["value"].detach()
        kl_t = self._analytic_kl(loc, scale, priors)
        nll_t = torch.as_tensor(nll) / self.num_particles
        loss = nll_t + self.kl_weight * kl_t
        return ELBOTerms(loss=loss, nll=nll_t.detach(), kl=kl_t.detach(), logits=logits)

    def terms_and_grads(self, model, guide, *args, **kwargs) -> ELBOTerms:
        """:meth:`terms`, after back-propagating the loss into the parameters (``loss`` is
        returned detached). What :func:`fit` and :meth:`loss_and_grads` call.

        The gradients are those of ``terms(...).loss``. With a :class:`MeanFieldGuide`, a
        pyrouq Bayesian model sampling weights and several particles (sequential, or
        vectorised on CPU, where vectorised particles run one draw at a time anyway), the
        particles are back-propagated one at a time: every particle's weights are drawn first
        (the draws :meth:`terms` makes), then each particle's NLL is run forward and backward
        into its weight draw before the next particle runs, and the draws are
        back-propagated into the guide with the KL term. One particle's activations are held
        at a time instead of all of them, and the memory that the allocator would otherwise
        return to the system and fault back in on every step stays small.
        """
        x, y = _model_inputs(args, kwargs)
        if (
            self.num_particles > 1
            and _samples_directly(model, guide)
            and not model.local_reparameterization
            and torch.is_tensor(x)
            and y is not None
            and (not self.vectorize_particles or x.device.type == "cpu")
        ):
            return self._particle_by_particle(model, guide, x, y)
        terms = self.terms(model, guide, *args, **kwargs)
        if terms.loss.requires_grad:
            terms.loss.backward()
        return dataclasses.replace(terms, loss=terms.loss.detach())

    def _particle_by_particle(
        self, model, guide: MeanFieldGuide, x: torch.Tensor, y: torch.Tensor
    ) -> ELBOTerms:
        """:meth:`terms_and_grads` one particle at a time (see there)."""
        loc, scale, priors = self._guide_moments(model, guide)
        count = self.num_particles
        if self.vectorize_particles:  # site by site, every particle at once, as terms() does
            stacked = model.sample_weights(loc, scale, count)
            draws = [{s: w[i] for s, w in stacked.items()} for i in range(count)]
        else:
            draws = [model.sample_weights(loc, scale) for _ in range(count)]
        nll = torch.zeros((), device=x.device)
        outputs: list[torch.Tensor] = []
        output_grads: list[torch.Tensor] = []
        logits = []
        for draw in draws:
            leaves = {s: w.detach().requires_grad_() for s, w in draw.items()}
            particle_nll, particle_logits = model.nll_with(x, y, leaves)
            (particle_nll / count).backward()  # frees this particle's activations
            nll = nll + particle_nll.detach()
            logits.append(particle_logits.detach())
            for site, value in draw.items():
                grad = leaves[site].grad
                if grad is not None:
                    outputs.append(value)
                    output_grads.append(grad)
        kl = self._analytic_kl(loc, scale, priors)
        weighted_kl = self.kl_weight * kl
        torch.autograd.backward(
            [weighted_kl, *outputs], [torch.ones_like(weighted_kl), *output_grads]
        )
        nll_t = nll / count
        return ELBOTerms(
            loss=(nll_t + weighted_kl).detach(),
            nll=nll_t,
            kl=kl.detach(),
            logits=torch.stack(logits) if self.vectorize_particles else logits[0],
        )

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The loss as a differentiable scalar tensor."""
        return self.terms(model, guide, *args, **kwargs).loss

    def loss(self, model, guide, *args, **kwargs) -> float:
        """The loss as a float (no gradients)."""
        with torch.no_grad():
            return float(self.terms(model, guide, *args, **kwargs).loss)

    def loss_and_grads(self, model, guide, *args, **kwargs) -> float:
        """The loss as a float, after back-propagating it into the parameters (through
        :meth:`terms_and_grads`)."""
        return float(self.terms_and_grads(model, guide, *args, **kwargs).loss)

    def __repr__(self) -> str:
        return (
            f"KLWeightedELBO(kl_weight={self.kl_weight:g}, num_particles={self.num_particles}, "
            f"vectorize_particles={self.vectorize_particles})"
        )


# --------------------------------------------------------------------------------------------
# fit()
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpochRecord:
    """What one epoch of :func:`fit` measured.

    Attributes
    ----------
    epoch : int
        1-based.
    loss : float
        Mean over the epoch's steps of the minibatch loss (an estimate of the full-data
        negative ELBO, in nats, with the KL weighted).
    nll : float
        Mean of the expected negative log-likelihood term ``-(N/B) sum_batch log p(y|x,w)``.
    kl : float
        Mean of the (unweighted) ``KL(q || p)``; 0 for models without latent sites.
    train_acc : float
        Accuracy of the network at the guide mean (Bayesian; ``nan`` for a guide that has
        neither ``means()`` nor ``median()``) or of the member-mean prediction (ensemble),
        measured after the epoch on the first ``TRAIN_ACC_EXAMPLES`` (1024) training examples
        the epoch drew (a random subset when the loader shuffles).
    seconds : float
        Wall time of the epoch.
    """

    epoch: int
    loss: float
    nll: float
    kl: float
    train_acc: float
    seconds: float


@dataclass(frozen=True)
class FitResult:
    """The outcome of :func:`fit`.

    Attributes
    ----------
    history : tuple of EpochRecord
        One record per completed epoch.
    num_data : int
        Training-set size N used for the N/B scaling.
    kl_weight : float
    num_particles : int
    steps : int
        Optimizer steps taken.
    """

    history: tuple[EpochRecord, ...]
    num_data: int
    kl_weight: float
    num_particles: int
    steps: int

    @property
    def losses(self) -> list[float]:
        """Per-epoch mean loss."""
        return [r.loss for r in self.history]

    @property
    def seconds(self) -> float:
        """Total training time."""
        return sum(r.seconds for r in self.history)


def _num_examples(loader: Iterable) -> int | None:
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None


def fit(
    model: nn.Module,
    guide: nn.Module | Callable | None,
    train_loader: Iterable,
    *,
    epochs: int,
    lr: float = 2e-2,
    optim: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
    lr_schedule: LRSchedule = "warmup_cosine",
    kl_weight: float = 1.0,
    num_particles: int = 1,
    vectorize_particles: bool = False,
    num_data: int | None = None,
    progress: bool = True,
    seed: int | None = None,
    callbacks: Sequence[Callable[[EpochRecord], Any]] = (),
    checkpoint: str | os.PathLike[str] | None = None,
    resume_from: Any = None,
    metadata: dict[str, Any] | None = None,
    check_inputs: bool = True,
) -> FitResult:
    """Fit a pyrouq model by stochastic variational inference.

    Minimises :class:`KLWeightedELBO` with a torch optimizer (Adam by default) over the
    parameters of the guide and the model (BatchEnsemble models hold theirs), with Pyro's
    validation off in the loop.

    Parameters
    ----------
    model : PyroModule or nn.Module
        A model following the pyrouq contract (``BayesianMLP``, ``BayesianLeNet``,
        ``BatchEnsembleMLP``, ...). Its ``num_data`` is set to N. A plain torch network
        returning logits (``MLP``, ``LeNet``; ``guide=None``) is fitted by maximum likelihood,
        ``loss = -(N/B) sum_batch log p(y | x)``, with the same optimizer and schedule.
    guide : nn.Module or callable or None
        The variational distribution (``mean_field_guide(model)``); ``None`` for models
        without latent sites (BatchEnsemble), where the loss is the negative log-likelihood.
    train_loader : iterable of (x, y)
        Training batches, e.g. from :func:`pyrouq.load_mnist`.
    epochs : int
        Passes over ``train_loader`` (>= 1).
    lr : float, default 2e-2
        Learning rate of the default Adam optimizer.
    optim : callable, optional
        ``params -> torch.optim.Optimizer`` replacing the default Adam.
    lr_schedule : {"warmup_cosine", "cosine", "constant"}, default "warmup_cosine"
        Multiplies every learning rate of the optimizer, over the ``epochs *
        len(train_loader)`` steps of the run: ``"warmup_cosine"`` ramps it linearly from ~0
        to its value over the first 20 % of the steps, then decays it to 0 along a half
        cosine (a one-cycle policy: short runs converge much further, see the benchmarks);
        ``"cosine"`` decays from the start; ``"constant"`` leaves it alone.
    kl_weight : float, default 1.0
        Weight of the KL term (1 = the exact ELBO).
    num_particles : int, default 1
        Draws from the guide per step.
    vectorize_particles : bool, default False
        Draw every particle's weights at once, site by site as under a particle plate,
        rather than one particle after another. The particles then run as one batched pass
        on accelerators; on CPU, where oneDNN runs batched (grouped) convolutions slower
        than separate ones, each particle's forward and backward pass runs in turn (see
        :meth:`KLWeightedELBO.terms_and_grads`). The gradients are the same either way.
    num_data : int, optional
        Training-set size N; default ``len(train_loader.dataset)``.
    progress : bool, default True
        Show a tqdm progress bar (epoch, step, running loss).
    seed : int, optional
        Seeds Pyro/torch before training, so a run repeats exactly.
    callbacks : sequence of callables
        Each is called as ``callback(record)`` after every epoch. A callback may raise
        ``KeyboardInterrupt`` to stop the run (handled as Ctrl-C, below).
    checkpoint : str or PathLike, optional
        Write a checkpoint (:func:`pyrouq.save` format, with the optimizer and the resume state)
        to this file after every epoch and when the run is interrupted.
    resume_from : str, PathLike or Checkpoint, optional
        Continue the run saved there: the model and guide get its parameters, the optimizer its
        state, and the epoch count, learning-rate schedule, loss history and random-number
        states carry on, so an interrupted run resumed with the same arguments (``epochs`` is
        the run's total) ends with the same parameters and history as one that was never
        stopped. Exact for pyrouq's in-memory loaders (their generator state is stored) and for
        DataLoaders resumed at an epoch boundary; the model must be built with the same
        arguments (checked).
    metadata : dict, optional
        JSON values stored in the checkpoints.
    check_inputs : bool, default True
        Refuse NaN/inf inputs and labels outside ``[0, C)``: for in-memory loaders
        (``TensorLoader``, ``TensorDataset``) before training starts, naming the examples;
        for any other loader batch by batch, before the step on that batch.

    Returns
    -------
    FitResult

    Raises
    ------
    FloatingPointError
        When the loss turns non-finite; the parameters of the last finite step are kept.
    ValueError
        Bad arguments, NaN/inf inputs or bad labels (see ``check_inputs``), or a
        ``resume_from`` that does not fit the model (``CheckpointError``).
    TrainingInterrupted
        On Ctrl-C: the first press lets the current step finish, then fit stops with the
        parameters of that step, writes ``checkpoint`` if given, and raises this
        ``KeyboardInterrupt`` subclass carrying the partial :class:`FitResult`. A second press
        interrupts at once.
    """
    check_count("epochs", epochs)
    check_positive_float("lr", lr)
    if lr_schedule not in ("warmup_cosine", "cosine", "constant"):
        raise ValueError(
            f"Unknown lr_schedule {lr_schedule!r}: expected 'warmup_cosine', 'cosine' or "
            "'constant'."
        )
    # pyrouq models nest at most two plates ("members", "data"): no guessing trace needed
    elbo = KLWeightedELBO(kl_weight, num_particles, vectorize_particles, max_plate_nesting=2)
    if guide is None and has_latent_sites(model):
        raise ValueError(
            f"{type(model).__name__} has latent sites but guide is None. Pass "
            "guide=mean_field_guide(model)."
        )
    n = num_data if num_data is not None else _num_examples(train_loader)
    if n is None:
        raise ValueError(
            "Cannot tell the training-set size N from train_loader (it has no sized .dataset). "
            "Pass num_data=N: the minibatch likelihood is scaled by N/B."
        )
    if n < 1:
        raise ValueError(
            f"train_loader is empty (its dataset holds {n} examples). Pass a loader with data."
        )
    num_classes = getattr(model, "num_classes", None)
    # in-memory data is checked once here; other loaders batch by batch, before each step
    check_each_batch = check_inputs and not check_loader_inputs(train_loader, num_classes)
    resume = _resume_checkpoint(resume_from, model, guide, epochs)
    model.num_data = int(n)  # type: ignore[assignment]

    params = list(model.parameters())
    if isinstance(guide, nn.Module):
        params += list(guide.parameters())
    if not params:
        raise ValueError(
            f"Nothing to train: {type(model).__name__} and the guide have no parameters."
        )
    optimizer = optim(params) if optim is not None else torch.optim.Adam(params, lr=lr)
    base_lrs = [float(group["lr"]) for group in optimizer.param_groups]
    total_steps = epochs * _len_or_zero(train_loader)
    lr_factor = _lr_factor(lr_schedule, total_steps)
    scheduled = lr_schedule != "constant" and total_steps > 0  # unsized loader: no plan
    guide_fn = guide if guide is not None else _empty_guide
    plain = guide is None and not isinstance(model, pyro.nn.PyroModule)
    device = module_device(model, guide) or torch.device("cpu")

    if seed is not None:
        pyro.set_rng_seed(seed)

    history: list[EpochRecord] = []
    steps = 0
    first_epoch, skip = 1, 0
    sums = torch.zeros(3, dtype=torch.float64)
    if resume is not None:
        state = resume.training
        assert state is not None  # checked by _resume_checkpoint
        optimizer.load_state_dict(resume.optimizer_state)  # type: ignore[arg-type]
        base_lrs = [float(v) for v in state["base_lrs"]]
        history = [EpochRecord(**record) for record in state["history"]]
        steps = int(state["steps"])
        first_epoch = int(state["epochs_done"]) + 1
        skip = int(state["epoch_steps"])
        if skip:
            sums = state["sums"].clone().double()
        restore_rng_states(state["rng"], train_loader)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        per_epoch = max(_len_or_zero(train_loader), 1)
        bar = tqdm(total=epochs * per_epoch, initial=steps, leave=False, unit="step")

    def snapshot(epochs_done: int, epoch_steps: int, loader_state: Any) -> dict[str, Any]:
        return training_state(
            epochs=epochs,
            epochs_done=epochs_done,
            epoch_steps=epoch_steps,
            steps=steps,
            sums=sums,
            history=history,
            base_lrs=base_lrs,
            rng=rng_states(train_loader, loader_state),
        )

    def result() -> FitResult:
        return FitResult(
            history=tuple(history),
            num_data=int(n),
            kl_weight=elbo.kl_weight,
            num_particles=num_particles,
            steps=steps,
        )

    epoch, batches = first_epoch, skip
    loader_state = loader_rng_state(train_loader)
    model.train()
    try:
        with pyro.validation_enabled(False), InterruptFlag() as interrupt:
            for epoch in range(first_epoch, epochs + 1):
                start = time.perf_counter()
                held: list[tuple[torch.Tensor, torch.Tensor]] = []
                held_size = 0
                loader_state = loader_rng_state(train_loader)
                skip, batches = (skip, skip) if epoch == first_epoch else (0, 0)
                if not skip:
                    sums = torch.zeros(3, dtype=torch.float64)
                for step, (x, y) in enumerate(train_loader, start=1):
                    if step <= skip:  # resuming inside an epoch: these steps were taken
                        continue
                    if check_each_batch:
                        check_batch(x, y, epoch, step, num_classes)
                    x = x.to(device, non_blocking=True)
                    y = y.to(device, non_blocking=True)
                    if scheduled:
                        for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
                            group["lr"] = base * lr_factor(steps)
                    optimizer.zero_grad(set_to_none=True)
                    if plain:
                        terms = _plain_terms(model, x, y, int(n))
                        terms.loss.backward()
                    else:
                        terms = elbo.terms_and_grads(model, guide_fn, x, y)
                    loss = terms.loss.detach()
                    if not torch.isfinite(loss):
                        optimizer.zero_grad(set_to_none=True)
                        raise FloatingPointError(
                            f"Non-finite loss ({loss.item()}) at epoch {epoch}, step {step}; "
                            "training stopped and the parameters of the last finite step are "
                            "kept. Lower lr, check the inputs for NaN/inf, or use a smaller "
                            "init_scale."
                        )
                    optimizer.step()
                    steps += 1
                    batches += 1
                    sums += torch.stack([loss, terms.nll, terms.kl]).double().cpu()
                    if held_size < TRAIN_ACC_EXAMPLES:
                        held.append((x, y))
                        held_size += y.shape[0]
                    if bar is not None:
                        bar.update(1)
                        if step % 10 == 0:
                            bar.set_description(f"epoch {epoch}/{epochs}")
                            bar.set_postfix(loss=f"{sums[0].item() / batches:.4g}")
                    if interrupt.requested:
                        raise KeyboardInterrupt
                if batches == 0:
                    raise ValueError(
                        "train_loader yielded no batches. Pass a loader with at least one batch."
                    )
                means = (sums / batches).tolist()
                record = EpochRecord(
                    epoch=epoch,
                    loss=means[0],
                    nll=means[1],
                    kl=means[2],
                    train_acc=_point_accuracy(model, guide, held),
                    seconds=time.perf_counter() - start,
                )
                history.append(record)
                batches = 0
                if checkpoint is not None:
                    _save_run(
                        checkpoint,
                        model,
                        guide,
                        optimizer,
                        snapshot(epoch, 0, loader_rng_state(train_loader)),
                        metadata,
                    )
                for callback in callbacks:
                    callback(record)
                if interrupt.requested:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        # Between steps (a callback, or Ctrl-C seen by InterruptFlag): the parameters are those
        # of the last completed step. `batches` counts this epoch's completed steps.
        done = len(history)
        partial = batches if done < epoch else 0
        saved = None
        if checkpoint is not None:
            state = snapshot(
                done, partial, loader_state if partial else loader_rng_state(train_loader)
            )
            saved = _save_run(checkpoint, model, guide, optimizer, state, metadata)
        model.eval()
        raise TrainingInterrupted(result(), saved, epoch, partial) from None
    finally:
        if bar is not None:
            bar.close()
    model.eval()
    return result()


def _resume_checkpoint(resume_from: Any, model: nn.Module, guide: Any, epochs: int) -> Any:
    """Load ``resume_from`` into ``model``/``guide`` (checked); None when not resuming."""
    if resume_from is None:
        return None
    from pyrouq.checkpoint import Checkpoint, check_resumable, load

    saved = resume_from if isinstance(resume_from, Checkpoint) else load(resume_from)
    check_resumable(saved, model, guide)
    state = saved.training
    assert state is not None
    if int(state["epochs_done"]) >= epochs:
        raise ValueError(
            f"resume_from has already completed {state['epochs_done']} epochs, but epochs="
            f"{epochs}. Pass the total number of epochs of the run (more than "
            f"{state['epochs_done']}), e.g. epochs={state['epochs']}."
        )
    if saved.optimizer_state is None:
        raise ValueError("resume_from holds no optimizer state; it cannot continue a run.")
    model.load_state_dict(saved.model.state_dict())
    if guide is not None and saved.guide is not None:
        guide.load_state_dict(saved.guide.state_dict())
    return saved


def _save_run(
    path: Any, model: nn.Module, guide: Any, optimizer: Any, state: dict, metadata: Any
) -> Any:
    from pyrouq.checkpoint import save

    return save(path, model, guide, optimizer=optimizer, metadata=metadata, training=state)


def _lr_factor(lr_schedule: str, total_steps: int) -> Callable[[int], float]:
    warmup = int(WARMUP_FRACTION * total_steps) if lr_schedule == "warmup_cosine" else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(step - warmup, total_steps - warmup) / max(total_steps - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


@torch.no_grad()
def _point_accuracy(
    model: nn.Module, guide: Any, batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> float:
    """Accuracy at the guide mean (or of the member-mean prediction) on ``batches``."""
    point = None
    if guide is not None:
        summary = getattr(guide, "means", None) or getattr(guide, "median", None)
        if summary is None:
            return float("nan")
        point = summary()
    direct = getattr(model, "logits_with", None)
    correct = total = 0
    for x, y in batches:
        if point is None:
            logits = model(x) if not isinstance(model, pyro.nn.PyroModule) else model(x, y)
        elif direct is not None:
            logits = direct(x, point)
        else:
            logits = poutine.condition(model, data=point)(x, y)
        probs = logits.softmax(-1)
        if probs.dim() > 2:
            probs = probs.reshape(-1, *probs.shape[-2:]).mean(0)
        correct += int((probs.argmax(-1) == y).sum())
        total += y.shape[0]
    return correct / total if total else float("nan")


def _len_or_zero(loader: Iterable) -> int:
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        return 0


def _plain_terms(model: nn.Module, x: torch.Tensor, y: torch.Tensor, n: int) -> ELBOTerms:
    """Maximum likelihood for a plain torch network: ``-(N/B) sum_batch log p(y | x)``."""
    logits = model(x)
    nll = F.cross_entropy(logits, y, reduction="mean") * n
    return ELBOTerms(loss=nll, nll=nll.detach(), kl=torch.zeros(()), logits=logits.detach())


def _empty_guide(*args: Any, **kwargs: Any) -> None:
    """The guide of a model without latent sites."""
    return None
