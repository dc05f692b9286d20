"""``bayesian()``: the selected parameters of any network as latent Pyro sites."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor, nn

from pyrouq import _engine
from pyrouq._autocast import autocast_dtype
from pyrouq._input_cast import cast_call
from pyrouq._param_store import (
    hold_params,
    register_children,
)
from pyrouq._untraced import untraced
from pyrouq._util import check_flag, model_input, module_device, module_dtype
from pyrouq.convert._batchensemble import BatchEnsembleNetwork
from pyrouq.convert._copying import NamedInStore, copy_network, detached_memo
from pyrouq.convert._hints import refuse_types
from pyrouq.convert._rank1_factors import NO_LOCAL_RANK1, factor_names, warn_factor_priors
from pyrouq.convert._select import (
    COUNTER,
    DEFAULT_PRIOR_SCALE,
    PriorSpec,
    SelectSpec,
    SitePrior,
    _names_list,
    _owner,
    check_module,
    check_num_data,
    computes_its_own_way,
    module_record,
    resolve_priors,
    select_parameters,
    weight_readers,
)
from pyrouq.convert._sites import (
    aliases_of,
    check_no_pyro_samples,
    check_own_names,
    hiding_own_sites,
    latent_embeddings,
    latent_sites_of,
)
from pyrouq.likelihoods import Likelihood, LikelihoodName, get_likelihood

__all__ = ["BayesianNetwork", "bayesian"]


class BayesianNetwork(NamedInStore, PyroModule):
    """A network whose selected parameters are latent Pyro sites: what :func:`bayesian` returns.

    ``forward(x, y=None)`` samples every latent site from its prior (or replays it under a
    guide, ``poutine.condition``, ...), named by its dotted path, runs the network with those
    weights, records the outputs (``"logits"`` for ``Categorical``, ``"outputs"`` for
    ``Gaussian``) and observes ``y`` at ``"obs"`` through the likelihood, scaled N/B. Weights
    with leading sample dims S give outputs ``(*S, B, D)``.

    Made from a BatchEnsemble (:func:`pyrouq.batchensemble`, or :func:`pyrouq.rank1`), it is
    a rank-1 Bayesian network: the latent sites are the members' factors (by default), the
    outputs are ``(M, B, D)`` per draw (``(*S, M, B, D)`` under S draws), ``"obs"`` is observed
    for every member inside a ``"members"`` plate (dim -2) as for the BatchEnsemble, and
    :func:`pyrouq.predict` flattens draws and members into S * M draws, draw-major.

    Point-estimate parameters live in :attr:`net`; as a ``PyroModule`` child it is registered
    in Pyro's param store (``pyro.module``) under a prefix unique to this model (a
    ``copy.deepcopy`` gets its own) whenever ``forward`` runs, so Pyro's ``SVI`` trains them
    too; values loaded into the store under those names (``pyro.get_param_store().load(path)``)
    are taken.

    Attributes
    ----------
    net : nn.Module
        The converted copy of the network: the selected parameters are replaced by buffers
        holding their initial values (``net(x)`` runs the network with them; checkpoints keep
        them, so a loaded model's :meth:`template` and :meth:`plain_network` are the saved
        model's).
    likelihood : pyrouq.likelihoods.Likelihood
    num_data : int or None
        Training-set size N (set by :func:`pyrouq.fit`).
    module_record : dict
        Class and parameter shapes of the original module (checked against a skeleton when a
        checkpoint is loaded).
    num_members : int or None
        M for a rank-1 network made from a BatchEnsemble, else None.
    ensemble_options : dict or None
        That BatchEnsemble's conversion options (``use_base_weights``, ``init``, ...).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> from pyrouq import bayesian
    >>> model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    >>> type(model).__name__, model.latent_sites()["2.weight"]
    ('BayesianNetwork', torch.Size([3, 8]))
    >>> x = torch.randn(5, 4)
    >>> draws = {site: prior.sample((2,)) for site, prior in model.priors().items()}  # S = 2
    >>> model.outputs(x, draws).shape  # (S, B, D)
    torch.Size([2, 5, 3])
    >>> torch.allclose(model.outputs(x, model.template()), model.plain_network()(x))
    True
    >>> model(x).shape  # forward(): one draw from the priors (from the guide, under one)
    torch.Size([5, 3])
    """

    num_classes: int | None = None
    _pyrouq_model = True

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
        super().__init__(name=f"{type(self).__name__}_{next(COUNTER)}")
        ensemble = module if isinstance(module, BatchEnsembleNetwork) else None
        if ensemble is None:
            check_module(module, "make Bayesian")
        check_no_pyro_samples(module if ensemble is None else ensemble.net, "bayesian()")
        local_reparameterization = check_flag("local_reparameterization", local_reparameterization)
        if ensemble is not None and isinstance(likelihood, str) and likelihood == "categorical":
            likelihood = ensemble.likelihood  # the default: the ensemble's own
        self.likelihood = get_likelihood(likelihood)
        self.num_data = check_num_data(num_data)
        self.given_num_data = self.num_data  # fit()'s N for a loader of unknown size
        self.num_members: int | None = None
        self.ensemble_options: dict[str, Any] | None = None
        # fit()'s kl_weight when none is given (None: the likelihood's); rank-1: the exact ELBO
        self.default_kl_weight: float | None = None if ensemble is None else 1.0
        if ensemble is not None:
            if local_reparameterization:
                raise ValueError(NO_LOCAL_RANK1)
            self.num_members = int(ensemble.num_members)
            self.ensemble_options = dict(ensemble.options)
            self.module_record = dict(ensemble.module_record)
            net = copy.deepcopy(ensemble.net, detached_memo(ensemble.net))
            select = factor_names(net, select)
        else:
            self.module_record = module_record(module)
            refuse_types(module, select)  # (before the copy: a layer given is named there)
            net = copy_network(module, "make it Bayesian")
        sites = latent_sites_of(net, select_parameters(net, select), select)
        check_own_names(net, sites, self.likelihood, self.num_members)  # ("sigma", "obs")
        latent_embeddings(net, sites)
        params = dict(net.named_parameters())
        # a tied parameter is one site, named by its first name; every name holds its value
        tied = {site: more for site, more in aliases_of(net).items() if site in sites}
        every_name = [name for name, _ in net.named_parameters(remove_duplicate=False)]
        priors = resolve_priors(prior, {s: params[s] for s in sites}, every_name, tied)
        if ensemble is not None:
            warn_factor_priors(net, sites, prior, priors)
        for site in sites:
            value = params[site].detach()
            for name in (site, *tied.get(site, ())):
                owner = net.get_submodule(_owner(name))
                attr = name.rpartition(".")[2]
                del owner._parameters[attr]  # (a layer registered twice was refused)
                # saved under the site's name: the guide's start (its other names are the
                # same tensor, not saved again)
                owner.register_buffer(attr, value, persistent=name == site)
        # a new model starts in training mode throughout, as a torch module does, whatever
        # modes the network was left in (fit() and predict() leave eval)
        self.net = _engine.prepare(net.train())
        self._sites = {s: torch.Size(params[s].shape) for s in sites}
        device = module_device(self)  # (the network's, its latent weights before its buffers)
        held = [
            t
            for t in itertools.chain(self.likelihood.parameters(), self.likelihood.buffers())
            if not nn.parameter.is_lazy(t)  # a learned scale is made on the outputs' device
        ]
        if device is not None and any(t.device != device for t in held):
            self.likelihood.to(device)  # a noise prior made on the CPU, the network on a GPU
        dtype = module_dtype(self)  # a float32 noise prior of a float64 network: its dtype
        if dtype is not None and any(t.is_floating_point() and t.dtype != dtype for t in held):
            self.likelihood.to(dtype)
        self._tied = tied
        self.site_priors = nn.ModuleList([priors[s] for s in sites])
        self._local = local_reparameterization
        # load_state_dict(assign=True) puts the loaded tensor in under the site's name only
        self.register_load_state_dict_post_hook(_retie_after_load)
        hold_params(self, self._pyro_name)

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("_tied", {})  # a model pickled before tied sites existed has none
        super().__setstate__(state)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # torch casts and moves each module's buffers on its own (.to(), .double()): a tied
        # site's other names are then given its new tensor again
        out = super()._apply(fn, recurse)
        self._retie()
        return out

    def _retie(self) -> None:
        """Give every other name of a tied site the site's own tensor again, where something
        that replaces buffers one by one (a cast, a restore) made it a copy."""
        for site, others in self._tied.items():
            value = self.net.get_buffer(site)
            for name in others:
                owner = self.net.get_submodule(_owner(name))
                attr = name.rpartition(".")[2]
                if owner._buffers.get(attr) is not value:
                    owner._buffers[attr] = value

    # -- structure ----------------------------------------------------------------------------

    def latent_sites(self) -> dict[str, torch.Size]:
        """Names and shapes of the latent sites: the network's, in ``named_parameters()``
        order, then the likelihood's (a noise scale with a prior, ``"sigma"``)."""
        return {**self._sites, **self.likelihood.latent_sites()}

    def network_sites(self) -> dict[str, torch.Size]:
        """Names and shapes of the network's latent sites (its selected parameters)."""
        return dict(self._sites)

    def event_dims(self) -> dict[str, int]:
        """Number of dims of one draw of every site."""
        return {s: len(shape) for s, shape in self.latent_sites().items()}

    def prior_of(self, site: str) -> SitePrior:
        """The :class:`SitePrior` of ``site`` (a KeyError names the sites, for another)."""
        if site not in self._sites:
            likelihood: Likelihood = self._modules["likelihood"]  # type: ignore[assignment]
            if site not in likelihood.latent_sites():
                raise KeyError(
                    f"{site!r} is not a latent site of this model; its latent sites are "
                    f"{_names_list(list(self.latent_sites()))}."
                )
            return likelihood.noise_prior  # type: ignore[return-value]
        return self.site_priors[list(self._sites).index(site)]  # type: ignore[return-value]

    def priors(self) -> dict[str, dist.TorchDistribution]:
        """The prior of every latent site, of the site's shape (one event)."""
        network = {
            site: prior.distribution()  # type: ignore[operator]
            for site, prior in zip(self._sites, self.site_priors, strict=True)
        }
        # read past PyroModule's attribute hook, which under Pyro registers the likelihood's
        # parameters, a learned noise scale included, before the outputs have given it a shape
        likelihood: Likelihood = self._modules["likelihood"]  # type: ignore[assignment]
        return {**network, **likelihood.priors()}

    def template(self) -> dict[str, Tensor]:
        """The initial value of every latent site (the converted module's parameters, and the
        likelihood's start for its own sites)."""
        buffers = dict(self.net.named_buffers(remove_duplicate=False))
        return {**{site: buffers[site] for site in self._sites}, **self.likelihood.template()}

    def plain_network(self) -> nn.Module:
        """A plain copy of the network with the template values as ordinary parameters (and
        torch's own modules where the engine put faster ones)."""
        plain = _engine.unprepare(copy.deepcopy(self.net, detached_memo(self.net)))
        buffers = dict(plain.named_buffers(remove_duplicate=False))
        for site in self._sites:
            param = nn.Parameter(buffers[site].clone())
            for name in (site, *self._tied.get(site, ())):  # tied weights stay tied
                owner = plain.get_submodule(_owner(name))
                attr = name.rpartition(".")[2]
                del owner._buffers[attr]
                owner.register_parameter(attr, param)
        return plain

    @property
    def local_reparameterization(self) -> bool:
        """Whether :class:`pyrouq.KLWeightedELBO` trains this model by local
        reparameterisation (with a :class:`pyrouq.MeanFieldGuide`): every ``nn.Linear`` /
        ``nn.Conv{1,2,3}d`` whose weight (and bias, if any) are latent then draws its
        pre-activations ``Normal(layer(h; loc), layer(h^2; scale^2))`` instead of one weight
        draw per minibatch. It changes the training path only, never :meth:`forward`. A
        rank-1 network (made from a BatchEnsemble) refuses True, as its constructor does."""
        return self._local

    @local_reparameterization.setter
    def local_reparameterization(self, value: bool) -> None:
        value = check_flag("local_reparameterization", value)
        if value and getattr(self, "num_members", None) is not None:  # rank-1, as in __init__
            raise ValueError(NO_LOCAL_RANK1)
        self._local = value
        if hasattr(self, "config"):
            self.config["local_reparameterization"] = self._local  # (np.bool_ True: True)

    def local_layers(self) -> dict[str, tuple[str, str | None]]:
        """``{module path: (weight site, bias site or None)}`` of the layers that local
        reparameterisation draws directly: not those inside a module that reads their weights
        as tensors instead of calling them (``nn.MultiheadAttention``'s ``out_proj``, Swin's
        attention), nor subclasses with a computation of their own (a weight-standardised
        convolution), whose sites are drawn whole. Training also draws whole those a forward
        shows it cannot draw by their pre-activations: called more than once a forward, never
        (the weight read as a tensor), or besides a forward reading the weight as a tensor (a
        tied decoder's ``F.linear(h, self.enc.weight.t())``; tensors made from it, such as
        ``x.to(self.enc.weight)``, count too), or a Linear on inputs of more than two dims."""
        self._retie()  # (a cast of the inner network, model.net.double(), unties them)
        readers = weight_readers()
        # a tied weight is drawn whole: one draw for every layer that reads it
        tied = {n for site, more in self._tied.items() for n in (site, *more)}
        inside = [f"{p}." for p, m in self.net.named_modules() if isinstance(m, readers)]
        layers: dict[str, tuple[str, str | None]] = {}
        for path, module in self.net.named_modules():
            if not isinstance(module, _engine.LOCAL_TYPES) or computes_its_own_way(module):
                continue  # (a subclass computing its own way runs its forward, drawn whole)
            if any(path.startswith(prefix) for prefix in inside):
                continue
            prefix = f"{path}." if path else ""  # a bare layer's sites: 'weight', 'bias'
            weight, bias = f"{prefix}weight", f"{prefix}bias"
            has_bias = bias in self._sites or getattr(module, "bias", None) is not None
            if weight in tied or bias in tied:
                continue
            if weight in self._sites and (bias in self._sites or not has_bias):
                layers[path] = (weight, bias if bias in self._sites else None)
        return layers

    # -- the model ------------------------------------------------------------------------------

    def _input(self, x: Any) -> Tensor:
        """``x`` in the network's dtype (floating inputs are cast; integer ones refused)."""
        x = model_input(x, self, type(self).__name__)
        self._check_input(x)
        return x

    def _check_input(self, x: Tensor) -> None:
        """A front door's checks of the input's shape (none for a converted network)."""

    def outputs(self, x: Tensor, weights: Mapping[str, Tensor]) -> Tensor:
        """The network's outputs with explicit weights ``{site: value}``, one for every latent
        site of the network (values may carry leading sample dims; other keys, such as a
        likelihood's sites, are ignored): ``(*S, B, D)``, no Pyro statements."""
        if torch.jit.is_tracing():  # torch's own error names neither the cause nor a way out
            raise RuntimeError(
                f"{type(self).__name__} runs its network with torch.func.functional_call, which "
                "torch.jit.trace refuses, as Pyro's JitTrace_ELBO, JitTraceMeanField_ELBO and "
                "NUTS / HMC with jit_compile=True use it. Use Trace_ELBO, TraceMeanField_ELBO "
                "or pyrouq.KLWeightedELBO, and NUTS(model) without jit_compile (pyrouq.mcmc)."
            )
        x = self._input(x)
        missing = [site for site in self._sites if site not in weights]
        if missing:  # the network would read its initial value there, not a weight given
            raise ValueError(
                f"{type(self).__name__}.outputs() got no weights for {_names_list(missing)} "
                f"(it got {_names_list(list(weights))}); pass a value for every latent site "
                "(their names and shapes: model.template())."
            )
        self._retie()
        network = {site: weights[site] for site in weights if site in self._sites}
        dims = {site: len(shape) for site, shape in self._sites.items()}
        # read past PyroModule's hook, which under Pyro records it (pyro.module): forward
        # records it untraced
        net: nn.Module = self._modules["net"]  # type: ignore[assignment]
        self._check_priors_dtype(net, network, x)
        return _engine.run_draws(net, x, network, dims, self.num_members)

    def _check_priors_dtype(self, net: nn.Module, network: Mapping[str, Tensor], x: Tensor) -> None:
        """Refuse the priors' draws in another dtype than the network's, where the network was
        cast alone (``model.net.double()``): torch's "mat1 and mat2 must have the same dtype"
        names neither. One site's dtypes compared (O(1)); the priors read only then."""
        site = next(iter(self._sites), None)
        if site is None or site not in network:
            return
        held, given = net.get_buffer(site).dtype, network[site].dtype
        if held == given or autocast_dtype(x.device.type) is not None:  # (it casts both)
            return
        priors = module_dtype(self._modules["site_priors"])
        if priors != given:  # (draws of another source: torch's words, at the layer)
            return
        raise TypeError(
            f"{type(self).__name__}'s priors are {priors}, but its network is {held} (the "
            f"network was cast alone, e.g. model.net.double()), so the weights they draw do "
            f"not fit it. Cast the whole model, {cast_call('model', held)}, which casts the "
            "priors with the network."
        )

    def _recorded(self, x: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """``x`` checked and the latent sites drawn, the point estimates put in Pyro's param
        store and recorded as param sites: forward's statements of one name each, which
        torch.compile runs untraced (:func:`~pyrouq._untraced.untraced`)."""
        register_children(self, record=False)
        self.net  # noqa: B018 (under Pyro, PyroModule's hook records it: pyro.module)
        x = self._input(x)
        return x, {site: pyro.sample(site, prior) for site, prior in self.priors().items()}

    def _hiding_own_sites(self, latent: Iterable[str]) -> Any:
        """:func:`~pyrouq.convert._sites.hiding_own_sites` of this model (``latent``: its
        latent sites): forward() runs the network under it; mcmc() checks under it which sites
        of the network NUTS would see."""
        return hiding_own_sites(self._modules["likelihood"], latent)

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
        x, weights = untraced(self._recorded, x)
        with self._hiding_own_sites(weights):
            outputs = self.outputs(x, weights)
        # the likelihood read past PyroModule's attribute hook, as in priors()
        likelihood: Likelihood = self._modules["likelihood"]  # type: ignore[assignment]
        likelihood.prepare(outputs)
        latent = {site: weights[site] for site in self.likelihood.latent_sites()}
        return self.likelihood.observe(
            outputs,
            y,
            self.num_data,
            type(self).__name__,
            members=self.num_members,
            latent=latent or None,
        )

    def extra_repr(self) -> str:
        members = "" if self.num_members is None else f", num_members={self.num_members}"
        return f"sites={len(self._sites)}{members}, likelihood={self.likelihood}"


def _retie_after_load(module: nn.Module, incompatible_keys: Any) -> None:
    """A load_state_dict post hook: a tied site's other names hold the loaded tensor too."""
    module._retie()  # type: ignore[operator]


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

    Given a BatchEnsemble (:func:`pyrouq.batchensemble`), it makes the rank-1 Bayesian network
    (see :func:`pyrouq.rank1`, its front door): ``select=None`` then picks the rank-1 factors
    ``r`` and ``s`` of every BatchEnsemble layer, and the likelihood defaults to the
    ensemble's.

    Parameters
    ----------
    module : nn.Module
        The network (its current parameters become the initial guide locations of
        :func:`pyrouq.mean_field_guide`), or a BatchEnsemble network.
    prior : float, Distribution, dict or callable, default 1.0
        The prior of each latent site: a float s is ``Normal(0, s)``; a univariate
        ``pyro.distributions`` distribution is expanded to every site; a dict
        ``{name or prefix: float | Distribution}`` gives each site the value of its longest
        matching key (``"layer4"`` covers ``"layer4.1.conv2.weight"``), sites matching no key
        getting ``Normal(0, 1)`` (two equally long keys that give one tied site, under two of
        its names, other priors are an error); a callable
        ``(name, param) -> float | Distribution`` is asked for every site (a distribution class
        itself, ``dist.Normal``, is refused: pass an instance); a distribution subclass with a
        constructor of its own is such a callable, called with ``(name, param)``. Of a
        BatchEnsemble, whose factors start near 1, a float, or a dict or callable that leaves
        factors with a prior centred on 0, warns: it pulls them to 0.
    select : None, "last_layer", list of str or callable, default None
        Which parameters are latent: ``None``, the weights and biases of every ``nn.Linear``
        (``nn.Bilinear`` too) and convolution that are not frozen (``requires_grad=False``; of
        a BatchEnsemble: its layers' factors ``r`` and ``s``); ``"last_layer"``, those of the
        last ``nn.Linear`` or ``nn.Bilinear`` registered (of a BatchEnsemble: the factors of
        its last converted ``nn.Linear``; in
        ``named_modules()`` order: for a network whose head is defined before its body, name
        the head instead, ``select=["head"]``); a list of module names or
        dotted prefixes; a callable ``(name, param) -> bool``. Only ``None`` skips frozen
        parameters: ``"last_layer"``, a list and a callable take what they pick, frozen or not
        (a frozen last layer is made latent, and its guide is trained like any other; a
        callable can test ``param.requires_grad``). The others (BatchNorm,
        LayerNorm, anything unselected; with ``None``, weights outside a Linear or convolution
        too: ``nn.MultiheadAttention``'s ``in_proj_weight``, a ViT's class token, ConvNeXt's
        layer scales, RNN and embedding weights) stay point estimates, trained by
        :func:`pyrouq.fit` unless frozen, as in torch: freezing a pretrained backbone
        (``backbone.requires_grad_(False)``) before converting leaves its weights fixed and
        makes the rest Bayesian. Buffers (running statistics) behave as in torch, train vs
        eval. A tied parameter (one tensor under several names: an output layer sharing an
        embedding's matrix, as language models do) is one latent site, named by its first
        name in ``named_parameters()`` (``"emb.weight"``), picked, and matched by prior keys,
        under any of its names (so ``select=None`` makes such an embedding matrix latent
        too); every name reads the same draw, and :meth:`~BayesianNetwork.plain_network`
        keeps it tied. A layer registered under two names (``self.again = self.a``) cannot
        have latent parameters yet (a clear error): register it once and call it twice. A
        parameter that is not floating-point cannot be latent (an error names it). A latent
        ``nn.Embedding(sparse=True)`` computes dense gradients (the same values).
    likelihood : {"categorical", "gaussian"} or Likelihood, default "categorical"
        How the outputs meet the targets (:mod:`pyrouq.likelihoods`).
    num_data : int, optional
        Training-set size N for the N/B scaling (set by :func:`pyrouq.fit`).
    local_reparameterization : bool, default False
        Train by local reparameterisation (see :attr:`BayesianNetwork.local_reparameterization`).

    Returns
    -------
    BayesianNetwork
        Hooks go on its ``net`` (the converted copy) or its layers: :func:`pyrouq.fit` and
        :func:`pyrouq.predict` run those, so a hook registered on the BayesianNetwork itself
        (``model.register_forward_pre_hook``) runs on a direct ``model(x)`` call only.

    Raises
    ------
    ValueError
        A module with nothing to select (a ``select`` that finds only layers holding no
        parameter of their own too), a ``select`` entry or prior key that matches nothing,
        a prior that does not fit its site, a non-floating or twice-registered parameter
        selected, or one the network also holds in an attribute of its own (a list or dict,
        in its first 10,000 items: its forward would read the initial value there, never a
        draw), or a network holding
        Pyro modules with ``PyroSample`` attributes (no parameters, so no latent sites: fit()
        and predict() take such a Pyro model as it is, with its own guide), or holding a
        pyrouq model (a converted network inside it, which would draw its own sites from their
        priors outside the guide: hold its ``plain_network()``). On the first run with
        gradients in each mode (training or eval), a forward that runs layers with latent
        weights inside ``torch.utils.checkpoint`` (torchvision's DenseNet with
        ``memory_efficient=True``): the backward pass would run them again with the initial
        weights, not the draw. (Checkpointing switched on after that run, or a checkpointed
        function reading the weights as tensors, is not caught.) A latent ``nn.Embedding`` /
        ``nn.EmbeddingBag`` with ``max_norm`` (torch would renormalise the draws in place).
        A selected parameter named as one of the model's own sites (``self.sigma`` beside a
        noise prior's ``"sigma"``; ``"obs"``, the output site, ``"data"``; of a rank-1
        network, ``"members"``): rename it or leave it out of ``select``.

    Warns
    -----
    UserWarning
        On the first run with gradients in training mode (fit(), Pyro's ``SVI``) and in
        mcmc()'s first pass, a forward that runs layers with latent weights only under
        ``torch.no_grad()``: their draws get no gradient from the data (the guide would follow
        the KL to the prior; NUTS would miss their gradient). Not warned of: a layer whose
        latent weights the forward also reads as tensors with gradients, runs in eval mode
        outside mcmc(). A backbone fine-tuned after some fixed steps is warned of at the first
        step (ignore it there).
        A latent embedding with a ``padding_idx`` (not one tied to an output layer, whose
        gradient reaches that row): torch gives its padding row no gradient from the data, so
        the guide learns it from the KL alone, toward the prior.
        Layers or parameters held in plain Python lists, tuples or dicts (not registered:
        never latent, trained or saved; hold them in ``nn.ModuleList`` / ``nn.ModuleDict``),
        in the first 10,000 items of each attribute's containers.

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
