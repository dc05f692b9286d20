"""Bring your own network: :func:`bayesian` and :func:`batchensemble` for any ``nn.Module``.

Both deep-copy the module (the original is never changed) and walk its parameters, not its
layer classes, so nested containers, residual connections, normalisation layers and
torchvision models convert as they are:

* :func:`bayesian` makes the selected parameters latent Pyro sites named by their dotted path
  (``layer1.0.conv1.weight``), each with a prior; the others (normalisation layers, anything not
  selected) stay ordinary parameters, trained by :func:`pyrouq.fit` as point estimates. The
  network then runs with sampled weights through :func:`torch.func.functional_call`.
* :func:`batchensemble` puts a BatchEnsemble layer (:mod:`pyrouq.nn`) in place of every
  ``nn.Linear`` and convolution, nested ones included; members are folded into the batch, and
  normalisation layers are shared by the members.

Both results follow the pyrouq model contract (DESIGN.md): ``forward(x, y=None)`` returns
outputs ``(B, D)`` (``(*S, B, D)`` under stacked weight draws) or ``(M, B, D)`` (ensembles),
records them (``"logits"`` for classification) and observes ``y`` at ``"obs"`` inside
``pyro.plate("data")``, scaled N/B, through the model's likelihood.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from pyrouq import _engine
from pyrouq._util import check_int, check_positive_float, forget_params
from pyrouq.likelihoods import Likelihood, LikelihoodName, get_likelihood
from pyrouq.nn import BATCHENSEMBLE_LAYERS, FactorInit, _check_factor_init, _check_members

__all__ = [
    "DEFAULT_PRIOR_SCALE",
    "BatchEnsembleNetwork",
    "BayesianNetwork",
    "PriorSpec",
    "SelectSpec",
    "batchensemble",
    "bayesian",
]

DEFAULT_PRIOR_SCALE = 1.0
"""Standard deviation of the default ``Normal(0, s)`` prior of every latent site."""

PriorValue = float | dist.Distribution
PriorSpec = (
    float | dist.Distribution | Mapping[str, PriorValue] | Callable[[str, nn.Parameter], PriorValue]
)
"""What ``prior=`` accepts (see :func:`bayesian`)."""

SelectSpec = None | Literal["last_layer"] | Sequence[str] | Callable[[str, nn.Parameter], bool]
"""What ``select=`` accepts (see :func:`bayesian`)."""

WEIGHTED_TYPES = (nn.Linear, nn.modules.conv._ConvNd)
"""Layers whose weight and bias ``select=None`` makes latent."""

_COUNTER = itertools.count()


# --------------------------------------------------------------------------------------------
# Selecting parameters
# --------------------------------------------------------------------------------------------


def _matches(name: str, key: str) -> bool:
    """Whether the dotted ``name`` is ``key`` or lies under it (``layer1`` covers
    ``layer1.0.conv1.weight``, not ``layer10.weight``)."""
    return name == key or name.startswith(key + ".")


def _owner(name: str) -> str:
    return name.rpartition(".")[0]


def _names_list(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def select_parameters(module: nn.Module, select: SelectSpec) -> list[str]:
    """The dotted names of the parameters of ``module`` that ``select`` picks, in
    ``named_parameters()`` order (see :func:`bayesian` for the accepted values)."""
    params = dict(module.named_parameters())
    if not params:
        raise ValueError(
            f"{type(module).__name__} has no parameters, so there is nothing to make Bayesian. "
            "Pass a network with weights (e.g. nn.Linear / nn.Conv2d layers)."
        )
    if select is None:
        weighted = {name for name, m in module.named_modules() if isinstance(m, WEIGHTED_TYPES)}
        chosen = [n for n in params if _owner(n) in weighted]
        if not chosen:
            raise ValueError(
                f"{type(module).__name__} has no nn.Linear or convolution layer, so select=None "
                f"picks nothing. Its parameters are {_names_list(list(params))}; pass select= a "
                "list of names or prefixes, or a callable (name, param) -> bool."
            )
        return chosen
    if isinstance(select, str):
        if select != "last_layer":
            raise ValueError(
                f"Unknown select {select!r}: expected None (every Linear and convolution), "
                "'last_layer', a list of module names or prefixes, or a callable "
                "(name, param) -> bool. For one module, pass a list: select=[name]."
            )
        linears = [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError(
                f"select='last_layer' needs an nn.Linear, and {type(module).__name__} has none. "
                "Pass select= the names of the parameters to make Bayesian."
            )
        return [n for n in params if _owner(n) == linears[-1]]
    if callable(select):
        chosen = [n for n, p in params.items() if select(n, p)]
        if not chosen:
            raise ValueError(
                f"The select callable returned False for every parameter of "
                f"{type(module).__name__} ({_names_list(list(params))}); it must pick at least "
                "one."
            )
        return chosen
    if isinstance(select, Sequence) and select and all(isinstance(k, str) for k in select):
        for key in select:
            if not any(_matches(n, key) for n in params):
                raise ValueError(
                    f"select entry {key!r} matches no parameter of {type(module).__name__}. "
                    f"Its parameters are {_names_list(list(params))}; give module names "
                    "(e.g. 'fc') or dotted prefixes of these."
                )
        return [n for n in params if any(_matches(n, k) for k in select)]
    raise TypeError(
        f"Expected select to be None, 'last_layer', a non-empty list of names or a callable "
        f"(name, param) -> bool, got {select!r}."
    )


# --------------------------------------------------------------------------------------------
# Priors
# --------------------------------------------------------------------------------------------


class SitePrior(nn.Module):
    """The prior of one latent site: a ``pyro.distributions`` family and its parameters.

    The parameters are buffers, so they move with ``.to(device)`` and are saved in the model's
    ``state_dict``; a distribution that cannot be rebuilt from its parameters is held as is
    (``opaque``; such a model cannot be saved).
    """

    def __init__(
        self,
        family: str | None,
        params: Mapping[str, Tensor],
        shape: torch.Size,
        opaque: Any = None,
    ):
        super().__init__()
        self.family = family
        self.shape = torch.Size(shape)
        self.opaque = opaque
        self._names = tuple(params)
        for key, value in params.items():
            self.register_buffer(key, value.detach().clone())

    def base(self) -> dist.TorchDistribution:
        """The univariate distribution, before expansion to the site's shape."""
        if self.opaque is not None:
            return self.opaque
        cls = getattr(dist, str(self.family))
        return cls(**{key: getattr(self, key) for key in self._names})  # type: ignore[no-any-return]

    def distribution(self) -> dist.TorchDistribution:
        """The site's prior, of the site's shape, all of it one event."""
        base = self.base()
        if base.batch_shape != self.shape:
            base = base.expand(self.shape)
        return base.to_event(len(self.shape)) if len(self.shape) else base

    def extra_repr(self) -> str:
        if self.opaque is not None:
            return f"opaque={self.opaque}"
        values = []
        for key in self._names:
            value = getattr(self, key)
            values.append(f"{key}={value.item():g}" if value.numel() == 1 else f"{key}=tensor")
        return f"{self.family}({', '.join(values)})"


def _site_prior(value: Any, site: str, shape: torch.Size, device: Any) -> SitePrior:
    """A :class:`SitePrior` of ``site`` from a float (the scale of a zero-mean Normal) or a
    univariate distribution (expanded to the site's shape)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        scale = check_positive_float(
            f"the prior scale of {site!r}",
            value,
            "A float prior is the standard deviation s of Normal(0, s); pass e.g. 1.0.",
        )
        params = {
            "loc": torch.tensor(0.0, device=device),
            "scale": torch.tensor(scale, device=device),
        }
        return SitePrior("Normal", params, shape)
    if not isinstance(value, torch.distributions.Distribution):
        raise TypeError(
            f"The prior of {site!r} must be a float (the scale of Normal(0, s)) or a "
            f"pyro.distributions distribution, got {type(value).__name__}."
        )
    base = value
    while isinstance(base, torch.distributions.Independent):
        base = base.base_dist
    if isinstance(base, dist.ExpandedDistribution):
        base = base.base_dist
    if base.event_shape:
        raise ValueError(
            f"The prior of {site!r} must be univariate (event_shape ()), expanded to the site's "
            f"shape {tuple(shape)} by pyrouq; got {base} with event_shape "
            f"{tuple(base.event_shape)}. Pass e.g. dist.Normal(0.0, 1.0)."
        )
    try:
        broadcast = torch.broadcast_shapes(base.batch_shape, shape)
    except RuntimeError:
        broadcast = None
    if broadcast != shape:
        raise ValueError(
            f"The prior of {site!r} has batch_shape {tuple(base.batch_shape)}, which does not "
            f"broadcast to the site's shape {tuple(shape)}. Pass a scalar distribution or one "
            "of the site's shape."
        )
    family = type(base).__name__
    params = {k: getattr(base, k) for k in base.arg_constraints}
    try:
        params = {k: torch.as_tensor(v, device=device) for k, v in params.items()}
        rebuilt = getattr(dist, family)(**params)
        if type(rebuilt).__name__ != family or rebuilt.batch_shape != base.batch_shape:
            raise TypeError
    except Exception:  # not rebuildable from its parameters: keep the object itself
        return SitePrior(None, {}, shape, opaque=base)
    return SitePrior(family, params, shape)


def resolve_priors(
    prior: PriorSpec, params: Mapping[str, nn.Parameter], all_names: Sequence[str]
) -> dict[str, SitePrior]:
    """One :class:`SitePrior` per latent site (``params``: ``{site: template parameter}``)."""
    out: dict[str, SitePrior] = {}
    if isinstance(prior, Mapping):
        for key in prior:
            if not isinstance(key, str) or not any(_matches(s, key) for s in params):
                unselected = [n for n in all_names if isinstance(key, str) and _matches(n, key)]
                why = (
                    f"it names parameters that are not latent ({_names_list(unselected)}; widen "
                    "select= to make them Bayesian)"
                    if unselected
                    else "it matches no parameter"
                )
                raise ValueError(
                    f"prior key {key!r} matches no latent site: {why}. The latent sites are "
                    f"{_names_list(list(params))}; use these names or their dotted prefixes."
                )
    for site, param in params.items():
        if isinstance(prior, Mapping):
            keys = sorted((k for k in prior if _matches(site, k)), key=len)
            value: Any = prior[keys[-1]] if keys else DEFAULT_PRIOR_SCALE
        elif callable(prior) and not isinstance(prior, torch.distributions.Distribution):
            value = prior(site, param)
        else:
            value = prior
        out[site] = _site_prior(value, site, param.shape, param.device)
    return out


# --------------------------------------------------------------------------------------------
# Bayesian networks
# --------------------------------------------------------------------------------------------


def module_record(module: nn.Module) -> dict[str, Any]:
    """The structure of ``module`` (class, parameter and buffer names and shapes), which a
    checkpoint keeps to check the skeleton it is loaded into."""
    cls = type(module)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "parameters": {n: list(p.shape) for n, p in module.named_parameters()},
        "buffers": {n: list(b.shape) for n, b in module.named_buffers()},
    }


def _check_untied(module: nn.Module, names: Sequence[str]) -> None:
    seen: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in seen and (name in names or seen[id(param)] in names):
            raise ValueError(
                f"Parameters {seen[id(param)]!r} and {name!r} are the same tensor (tied "
                "weights); pyrouq cannot make a tied parameter latent yet. Leave it out of "
                "select=."
            )
        seen.setdefault(id(param), name)


def _check_num_data(num_data: int | None) -> int | None:
    return None if num_data is None else check_int("num_data", num_data)


class BayesianNetwork(PyroModule):
    """A network whose selected parameters are latent Pyro sites: what :func:`bayesian` returns.

    ``forward(x, y=None)`` samples every latent site from its prior (or replays it under a
    guide, ``poutine.condition``, ...), named by its dotted path, runs the network with those
    weights, records the outputs (``"logits"``) and observes ``y`` at ``"obs"`` through the
    likelihood, scaled N/B. Weights with leading sample dims S give outputs ``(*S, B, D)``.

    Point-estimate parameters live in :attr:`net`; as a ``PyroModule`` child it is registered
    in Pyro's param store (``pyro.module``) under a prefix unique to this model whenever
    ``forward`` runs, so Pyro's ``SVI`` trains them too.

    Attributes
    ----------
    net : nn.Module
        The converted copy of the network: the selected parameters are replaced by
        non-persistent buffers holding their initial values (``net(x)`` runs the network with
        them).
    likelihood : pyrouq.likelihoods.Likelihood
    num_data : int or None
        Training-set size N (set by :func:`pyrouq.fit`).
    module_record : dict
        Class and parameter shapes of the original module (checked against a skeleton when a
        checkpoint is loaded).
    """

    num_classes: int | None = None

    def __init__(
        self,
        module: nn.Module,
        *,
        prior: PriorSpec = DEFAULT_PRIOR_SCALE,
        select: SelectSpec = None,
        likelihood: LikelihoodName | Likelihood = "categorical",
        num_data: int | None = None,
        local_reparameterization: bool = False,
    ):
        super().__init__(name=f"{type(self).__name__}_{next(_COUNTER)}")
        if not isinstance(module, nn.Module):
            raise TypeError(f"Expected an nn.Module to make Bayesian, got {type(module).__name__}.")
        if isinstance(module, (BayesianNetwork, BatchEnsembleNetwork)):
            raise TypeError(
                f"{type(module).__name__} is already a pyrouq model; pass the plain network "
                "it was made from."
            )
        if not isinstance(local_reparameterization, bool):
            raise TypeError(
                "Expected local_reparameterization to be True or False, got "
                f"{local_reparameterization!r}."
            )
        self.likelihood = get_likelihood(likelihood)
        self.num_data = _check_num_data(num_data)
        self.module_record = module_record(module)
        net = copy.deepcopy(module)
        sites = select_parameters(net, select)
        _check_untied(net, sites)
        params = dict(net.named_parameters())
        priors = resolve_priors(prior, {s: params[s] for s in sites}, list(params))
        for site in sites:
            owner = net.get_submodule(_owner(site))
            attr = site.rpartition(".")[2]
            value = owner._parameters.pop(attr)
            assert value is not None
            owner.register_buffer(attr, value.detach(), persistent=False)
        self.net = _engine.prepare(net)
        self._sites = {s: torch.Size(params[s].shape) for s in sites}
        self.site_priors = nn.ModuleList([priors[s] for s in sites])
        self._local = local_reparameterization
        weakref.finalize(self, forget_params, self._pyro_name)

    # -- structure ----------------------------------------------------------------------------

    def latent_sites(self) -> dict[str, torch.Size]:
        """Names and shapes of the latent sites, in ``named_parameters()`` order."""
        return dict(self._sites)

    def event_dims(self) -> dict[str, int]:
        """Number of dims of one draw of every site."""
        return {s: len(shape) for s, shape in self._sites.items()}

    def prior_of(self, site: str) -> SitePrior:
        """The :class:`SitePrior` of ``site``."""
        return self.site_priors[list(self._sites).index(site)]  # type: ignore[return-value]

    def priors(self) -> dict[str, dist.TorchDistribution]:
        """The prior of every latent site, of the site's shape (one event)."""
        return {
            site: prior.distribution()  # type: ignore[operator]
            for site, prior in zip(self._sites, self.site_priors, strict=True)
        }

    def template(self) -> dict[str, Tensor]:
        """The initial value of every latent site (the converted module's parameters)."""
        buffers = dict(self.net.named_buffers())
        return {site: buffers[site] for site in self._sites}

    def plain_network(self) -> nn.Module:
        """A plain copy of the network with the template values as ordinary parameters."""
        plain = copy.deepcopy(self.net)
        for site in self._sites:
            owner = plain.get_submodule(_owner(site))
            attr = site.rpartition(".")[2]
            value = owner._buffers.pop(attr)
            assert value is not None
            owner._non_persistent_buffers_set.discard(attr)
            owner.register_parameter(attr, nn.Parameter(value.clone()))
        return plain

    @property
    def local_reparameterization(self) -> bool:
        """Whether :class:`pyrouq.KLWeightedELBO` trains this model by local
        reparameterisation (with a :class:`pyrouq.MeanFieldGuide`): every ``nn.Linear`` /
        ``nn.Conv{1,2,3}d`` whose weight (and bias, if any) are latent then draws its
        pre-activations ``Normal(layer(h; loc), layer(h^2; scale^2))`` instead of one weight
        draw per minibatch. It changes the training path only, never :meth:`forward`."""
        return self._local

    @local_reparameterization.setter
    def local_reparameterization(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(
                f"Expected local_reparameterization to be True or False, got {value!r}."
            )
        self._local = value
        if hasattr(self, "config"):
            self.config["local_reparameterization"] = value

    def local_layers(self) -> dict[str, tuple[str, str | None]]:
        """``{module path: (weight site, bias site or None)}`` of the layers that local
        reparameterisation draws directly."""
        layers: dict[str, tuple[str, str | None]] = {}
        for path, module in self.net.named_modules():
            if not isinstance(module, _engine.LOCAL_TYPES):
                continue
            weight, bias = f"{path}.weight", f"{path}.bias"
            has_bias = bias in self._sites or getattr(module, "bias", None) is not None
            if weight in self._sites and (bias in self._sites or not has_bias):
                layers[path] = (weight, bias if bias in self._sites else None)
        return layers

    # -- the model ------------------------------------------------------------------------------

    def _check_input(self, x: Any) -> None:
        if not torch.is_tensor(x):
            raise TypeError(
                f"{type(self).__name__} expects a torch.Tensor input, got {type(x).__name__}."
            )

    def outputs(self, x: Tensor, weights: Mapping[str, Tensor]) -> Tensor:
        """The network's outputs with explicit weights ``{site: value}`` (values may carry
        leading sample dims): ``(*S, B, D)``, no Pyro statements."""
        self._check_input(x)
        return _engine.run_draws(self.net, x, weights, self.event_dims())

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """Outputs ``(B, D)`` (``(*S, B, D)`` when the weights carry sample dims S).

        Parameters
        ----------
        x : torch.Tensor
            A batch of B inputs.
        y : torch.Tensor, optional
            Targets (``(B,)`` class labels for ``Categorical``), observed at ``"obs"`` with
            scale N/B.
        """
        self._check_input(x)
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        outputs = self.outputs(x, weights)
        return self.likelihood.observe(outputs, y, self.num_data, type(self).__name__)

    def extra_repr(self) -> str:
        return f"sites={len(self._sites)}, likelihood={self.likelihood}"


def bayesian(
    module: nn.Module,
    *,
    prior: PriorSpec = DEFAULT_PRIOR_SCALE,
    select: SelectSpec = None,
    likelihood: LikelihoodName | Likelihood = "categorical",
    num_data: int | None = None,
    local_reparameterization: bool = False,
) -> BayesianNetwork:
    """Make any ``nn.Module`` a Bayesian Pyro model.

    The module is deep-copied, never changed. It may be any network whose ``forward`` takes one
    tensor and returns the outputs ``(B, D)``: nested containers, residual connections,
    BatchNorm / LayerNorm, Linear, Conv1d/2d/3d (grouped and depthwise), torchvision models.

    Parameters
    ----------
    module : nn.Module
        The network (its current parameters become the initial guide locations of
        :func:`pyrouq.mean_field_guide`).
    prior : float, Distribution, dict or callable, default 1.0
        The prior of each latent site: a float s is ``Normal(0, s)``; a univariate
        ``pyro.distributions`` distribution is expanded to every site; a dict
        ``{name or prefix: float | Distribution}`` gives each site the value of its longest
        matching key (``"layer4"`` covers ``"layer4.1.conv2.weight"``), sites matching no key
        getting ``Normal(0, 1)``; a callable ``(name, param) -> float | Distribution`` is asked
        for every site.
    select : None, "last_layer", list of str or callable, default None
        Which parameters are latent: ``None``, the weights and biases of every ``nn.Linear``
        and convolution; ``"last_layer"``, those of the last ``nn.Linear``; a list of module
        names or dotted prefixes; a callable ``(name, param) -> bool``. The others (BatchNorm,
        LayerNorm, anything unselected) stay point estimates, trained by :func:`pyrouq.fit`;
        buffers (running statistics) behave as in torch, train vs eval.
    likelihood : {"categorical"} or Likelihood, default "categorical"
        How the outputs meet the targets (:mod:`pyrouq.likelihoods`).
    num_data : int, optional
        Training-set size N for the N/B scaling (set by :func:`pyrouq.fit`).
    local_reparameterization : bool, default False
        Train by local reparameterisation (see :attr:`BayesianNetwork.local_reparameterization`).

    Returns
    -------
    BayesianNetwork

    Raises
    ------
    ValueError
        A module with nothing to select, a ``select`` entry or prior key that matches nothing,
        a prior that does not fit its site.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    >>> model = bayesian(net, prior={"3": 0.1})
    >>> list(model.latent_sites())
    ['0.weight', '0.bias', '3.weight', '3.bias']
    >>> [n for n, _ in model.named_parameters()]  # BatchNorm: point estimates
    ['net.1.weight', 'net.1.bias']
    >>> model(torch.randn(5, 4)).shape
    torch.Size([5, 3])
    """
    return BayesianNetwork(
        module,
        prior=prior,
        select=select,
        likelihood=likelihood,
        num_data=num_data,
        local_reparameterization=local_reparameterization,
    )


# --------------------------------------------------------------------------------------------
# BatchEnsemble networks
# --------------------------------------------------------------------------------------------


def _convert_layers(net: nn.Module, num_members: int, options: dict[str, Any]) -> int:
    """Replace every Linear / Conv{1,2,3}d of ``net`` (nested) by its BatchEnsemble version;
    the number replaced. Attention modules keep theirs (they read their weights directly)."""
    count = 0
    for module in list(net.modules()):
        if isinstance(module, nn.MultiheadAttention):
            continue
        for name, child in list(module.named_children()):
            if isinstance(module, nn.MultiheadAttention):
                continue
            layer_type = next((t for t in BATCHENSEMBLE_LAYERS if isinstance(child, t)), None)
            if layer_type is None or getattr(child, "_is_batchensemble", False):
                continue
            setattr(
                module,
                name,
                BATCHENSEMBLE_LAYERS[layer_type].from_module(  # type: ignore[attr-defined]
                    child, num_members, **options
                ),
            )
            count += 1
    return count


class BatchEnsembleNetwork(PyroModule):
    """BatchEnsemble version of any network: a deterministic Pyro module (what
    :func:`batchensemble` returns).

    Every ``nn.Linear`` / ``nn.Conv{1,2,3}d`` of the network, nested ones included, is a
    BatchEnsemble layer (shared weight W, per-member rank-1 factors and biases, effective
    weight ``diag(s_i) W diag(r_i)``). Inputs are plain ``(B, ...)`` batches; the input is
    repeated once per member (folded batch ``(M * B, ...)``, member-major) and the outputs come
    back as ``(M, B, D)``, recorded (``"logits"``) with ``"obs"`` observed for every member
    inside a ``"members"`` plate (dim -2) and the ``"data"`` plate (dim -1), scaled N/B.

    Normalisation layers are shared by the members: a BatchNorm in training normalises with
    statistics over the whole folded batch and keeps one set of running statistics. Other
    parameterised layers (embeddings, attention) are shared too.

    There are no latent sites: fit it with ``fit(model, None, loader)`` (the loss is the
    members' summed negative log-likelihood) or plain ``pyro.infer.SVI`` with an empty guide.
    Its parameters are registered in Pyro's param store under a name unique to this instance.

    Parameters
    ----------
    module : nn.Module
        The network to convert, deep-copied; its weights are kept when ``use_base_weights``.
    num_members : int
        Ensemble size M (>= 1).
    use_base_weights : bool, default True
        Copy W and the biases from ``module``; False re-initialises every converted layer
        (torch's default initialisation).
    init, r_mean, r_std, s_mean, s_std
        Factor initialisation, see :class:`~pyrouq.nn.BatchEnsembleLinear`.
    num_data : int, optional
        Training-set size N (set by ``fit()``).
    likelihood : {"categorical"} or Likelihood, default "categorical"
    """

    num_classes: int | None = None

    def __init__(
        self,
        module: nn.Module,
        num_members: int,
        *,
        use_base_weights: bool = True,
        init: FactorInit = "normal",
        r_mean: float = 1.0,
        r_std: float = 0.5,
        s_mean: float = 1.0,
        s_std: float = 0.5,
        num_data: int | None = None,
        likelihood: LikelihoodName | Likelihood = "categorical",
    ):
        super().__init__(name=f"{type(self).__name__}_{next(_COUNTER)}")
        _check_members(num_members)
        _check_factor_init(init, r_std, s_std)
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"Expected an nn.Module to convert into a BatchEnsemble, got "
                f"{type(module).__name__}."
            )
        if isinstance(module, (BayesianNetwork, BatchEnsembleNetwork)):
            raise TypeError(
                f"{type(module).__name__} is already a pyrouq model; pass the plain network "
                "it was made from."
            )
        self.num_members = num_members
        self.num_data = _check_num_data(num_data)
        self.likelihood = get_likelihood(likelihood)
        self.module_record = module_record(module)
        self.options = dict(
            use_base_weights=use_base_weights,
            init=init,
            r_mean=r_mean,
            r_std=r_std,
            s_mean=s_mean,
            s_std=s_std,
        )
        net = copy.deepcopy(module)
        if not use_base_weights:
            for layer in net.modules():
                if isinstance(layer, tuple(BATCHENSEMBLE_LAYERS)):
                    layer.reset_parameters()  # type: ignore[operator]
        factors = dict(init=init, r_mean=r_mean, r_std=r_std, s_mean=s_mean, s_std=s_std)
        if not _convert_layers(net, num_members, factors):
            raise ValueError(
                f"{type(module).__name__} has no nn.Linear or convolution layer to turn into "
                "BatchEnsemble layers. Pass a network with such layers."
            )
        self.net = _engine.prepare(net)
        weakref.finalize(self, forget_params, self._pyro_name)

    def _check_input(self, x: Any) -> None:
        if not torch.is_tensor(x):
            raise TypeError(
                f"{type(self).__name__} expects a torch.Tensor input, got {type(x).__name__}."
            )

    def outputs(self, x: Tensor) -> Tensor:
        """Every member's outputs on every input, ``(M, B, D)``, no Pyro statements."""
        self._check_input(x)
        return _engine.run_members(self.net, x, self.num_members)

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """Outputs ``(M, B, D)`` of every member on every input; observes ``y`` if given."""
        self._check_input(x)
        outputs = self.outputs(x)
        return self.likelihood.observe(
            outputs, y, self.num_data, type(self).__name__, members=self.num_members
        )

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, likelihood={self.likelihood}"


def batchensemble(
    module: nn.Module,
    num_members: int,
    *,
    use_base_weights: bool = True,
    r_mean: float = 1.0,
    r_std: float = 0.5,
    s_mean: float = 1.0,
    s_std: float = 0.5,
    init: FactorInit = "normal",
    likelihood: LikelihoodName | Likelihood = "categorical",
) -> BatchEnsembleNetwork:
    """Convert any (e.g. pre-trained) network into a BatchEnsemble of ``num_members``.

    ``MLP`` becomes :class:`~pyrouq.BatchEnsembleMLP`, ``LeNet``
    :class:`~pyrouq.BatchEnsembleLeNet`, any other module a :class:`BatchEnsembleNetwork`. With
    ``use_base_weights`` (the default) the shared weights W and every member's bias are copies
    of the module's, so the two-phase recipe is two calls: pre-train the plain network, then
    ``fit(batchensemble(net, M), None, loader, ...)``. The module itself is left untouched.

    Parameters
    ----------
    module : nn.Module
        Any network whose forward takes one tensor and returns the outputs ``(B, D)``.
    num_members : int
        Ensemble size M (>= 1).
    use_base_weights : bool, default True
        Copy W and biases from ``module``; False re-initialises them (torch's default init).
    r_mean, r_std, s_mean, s_std : float, default 1.0, 0.5, 1.0, 0.5
        With ``init="normal"``: r ~ N(r_mean, r_std), s ~ N(s_mean, s_std).
    init : {"normal", "random_sign"}, default "normal"
    likelihood : {"categorical"} or Likelihood, default "categorical"

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
    ...                     nn.Linear(4 * 6 * 6, 3)).eval()
    >>> ensemble = batchensemble(net, 3, r_std=0.0, s_std=0.0).eval()
    >>> x = torch.randn(2, 1, 8, 8)
    >>> torch.allclose(ensemble(x), net(x).expand(3, 2, 3), atol=1e-6)
    True
    """
    options: dict[str, Any] = dict(
        use_base_weights=use_base_weights,
        init=init,
        r_mean=r_mean,
        r_std=r_std,
        s_mean=s_mean,
        s_std=s_std,
    )
    from pyrouq.models import MLP, BatchEnsembleLeNet, BatchEnsembleMLP, LeNet

    default_likelihood = isinstance(likelihood, str) and likelihood == "categorical"
    if type(module) is MLP and default_likelihood:
        return BatchEnsembleMLP(base=module, num_members=num_members, **options)
    if type(module) is LeNet and default_likelihood:
        return BatchEnsembleLeNet(base=module, num_members=num_members, **options)
    return BatchEnsembleNetwork(module, num_members, likelihood=likelihood, **options)
