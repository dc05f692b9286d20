"""``batchensemble()``: every linear and convolution layer of any network as a BatchEnsemble
layer."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Literal

import torch
from pyro.nn import PyroModule
from torch import Tensor, nn
from torch.nn.utils import parametrize

from pyrouq import _engine
from pyrouq._param_store import (
    hold_params,
    register_children,
)
from pyrouq._untraced import untraced
from pyrouq._util import carry_hooks, check_flag, class_name, model_input, warn_caller
from pyrouq._words import slip_hint
from pyrouq.convert._conversion_warnings import (
    CALLER,
    made,
    warn_bilinear,
    warn_kept_tied,
    warn_parametrized,
)
from pyrouq.convert._copying import NamedInStore, copy_network, hook_fix, weight_hooks
from pyrouq.convert._nothing_converted import nothing_converted
from pyrouq.convert._select import (
    COUNTER,
    check_module,
    check_num_data,
    computes_its_own_way,
    module_record,
    weight_readers,
)
from pyrouq.convert._sites import check_no_pyro_samples, hiding_own_sites
from pyrouq.likelihoods import Likelihood, LikelihoodName, get_likelihood
from pyrouq.nn._batchensemble import (
    BATCHENSEMBLE_LAYERS,
    NORM_LAYERS,
    BatchEnsembleNorm,
    FactorInit,
)
from pyrouq.nn._batchensemble_checks import (
    NORMAL_DEFAULTS,
    _check_factor_init,
    _check_members,
    warn_unread_by_random_sign,
)

__all__ = ["BatchEnsembleNetwork", "batchensemble"]

Norms = Literal["shared", "per_member"]


def _check_norms(norms: object) -> None:
    if norms not in ("shared", "per_member"):
        hint = slip_hint(norms, ("shared", "per_member"))
        raise ValueError(
            f"Unknown norms {norms!r}{hint}: expected 'shared' (one normalisation layer for all "
            "members, BatchNorm statistics over the folded batch) or 'per_member' (a copy per "
            "member, statistics over that member's rows)."
        )


def _replace_children(
    net: nn.Module,
    replacement: Callable[[nn.Module], nn.Module | None],
    keep_inside: type | tuple[type, ...],
) -> int:
    """Put ``replacement(child)`` in place of every child module of ``net`` (nested) for which
    it is not None, leaving the insides of ``keep_inside`` modules alone; the number replaced.
    A module registered under several names gets one replacement, put under all of them."""
    kept = {id(m) for k in net.modules() if isinstance(k, keep_inside) for m in k.modules()}
    made: dict[int, nn.Module | None] = {}
    for module in list(net.modules()):
        if id(module) in kept:
            continue
        for name, child in list(module._modules.items()):  # named_children() skips repeats
            if child is None:
                continue
            if id(child) not in made:
                made[id(child)] = replacement(child)
            new = made[id(child)]
            if new is not None:
                setattr(module, name, new)
    return sum(new is not None for new in made.values())


#: Transformer layers whose linear layers see sequence-first activations unless batch_first.
SEQUENCE_FIRST_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)
#: Stacks of such layers, whose final ``norm`` sees the activations their layers do.
SEQUENCE_FIRST_STACKS = (nn.TransformerEncoder, nn.TransformerDecoder)


def _sequence_first(layer: nn.Module) -> bool:
    """Whether ``layer`` (a transformer layer) takes sequence-first activations."""
    return not getattr(getattr(layer, "self_attn", None), "batch_first", True)


def _convert_layers(
    net: nn.Module, num_members: int, options: dict[str, Any], reset: bool = False
) -> int:
    """Replace every Linear / Conv{1,2,3}d / ConvTranspose{1,2,3}d of ``net`` (nested) by its
    BatchEnsemble version; the number replaced. Attention modules that read their layers'
    weights directly keep them plain (:func:`~pyrouq.convert._select.weight_readers`).
    ``reset``: re-initialise each converted layer first (torch's default initialisation), the
    frozen ones apart; the layers kept plain keep their weights, as the other shared ones do."""
    parametrized: list[str] = []
    own_way: list[str] = []  # layers of subclasses with their own computation: kept plain
    uses: dict[int, int] = {}  # how many names each parameter has (tied weights: several)
    biases: dict[int, nn.Parameter] = {}  # a tied bias's per-member biases, made once
    for _, param in net.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1

    def counterpart(child: nn.Module) -> nn.Module | None:
        layer_type = next((t for t in BATCHENSEMBLE_LAYERS if isinstance(child, t)), None)
        if layer_type is None or getattr(child, "_is_batchensemble", False):
            return None
        if computes_its_own_way(child):
            own_way.append(type(child).__name__)
            return None
        if parametrize.is_parametrized(child):
            parametrized.append(type(child).__name__)
        base = child
        if reset and child.weight.requires_grad:  # a frozen layer would stay random
            bias: Any = child.bias
            kept = None if bias is None or bias.requires_grad else bias.detach().clone()
            base = _reset(child)
            if kept is not None:  # a frozen bias too: it keeps its values
                with torch.no_grad():
                    base.bias.copy_(kept)  # type: ignore[operator]
        ensemble_type: Any = BATCHENSEMBLE_LAYERS[layer_type]
        layer = ensemble_type.from_module(base, num_members, **options)
        carry_hooks(child, layer)  # the user's hooks on the layer stay on it
        weight = child.weight
        if isinstance(weight, nn.Parameter) and uses[id(weight)] > 1:
            layer.weight = weight  # tied weights stay tied (the members share W anyway)
        bias = child.bias
        if isinstance(bias, nn.Parameter) and uses[id(bias)] > 1:  # a tied bias: its layers
            layer.bias = biases.setdefault(id(bias), layer.bias)  # share the members' biases
            originals.append(bias)  # (kept alive: its id is looked up after the replacing)
        return layer  # type: ignore[no-any-return]

    originals: list[nn.Parameter] = []
    count = _replace_children(net, counterpart, weight_readers())
    warn_kept_tied(net, originals)
    if parametrized:
        warn_parametrized(len(parametrized), reset)
    if own_way:
        kinds = ", ".join(sorted(set(own_way)))
        warn_caller(
            f"{CALLER.get()}: {len(own_way)} layer(s) of {kinds}, subclasses with a forward of "
            "their own, are kept as they are, one layer the members share: a BatchEnsemble "
            "layer would run torch's computation on their weights and drop theirs.",
        )
    return count


def _reset(layer: nn.Module) -> nn.Module:
    """``layer`` re-initialised by its ``reset_parameters`` (torch's default initialisation):
    in place, or, for a parametrized layer, whose ``reset_parameters`` would write into a
    computed weight and change nothing, as a plain stand-in holding the new weight and bias
    (its BatchEnsemble layer trains W without the parametrization)."""
    if not parametrize.is_parametrized(layer):
        layer.reset_parameters()  # type: ignore[operator]
        return layer
    own: Any = next(t for t in type(layer).__mro__ if t.__module__ != parametrize.__name__)
    # the layer's settings (attributes read, never written) and fresh tensors to initialise
    stand_in = own.__new__(own)

    def fresh(tensor: Any) -> nn.Parameter | None:
        if tensor is None:
            return None
        return nn.Parameter(torch.empty_like(tensor.detach()), tensor.requires_grad)

    stand_in.__dict__ = {**layer.__dict__, "weight": fresh(layer.weight), "bias": fresh(layer.bias)}
    own.reset_parameters(stand_in)
    return stand_in  # type: ignore[no-any-return]


def _mark_sequence_first(net: nn.Module) -> None:
    """Tell the BatchEnsemble layers and per-member norms inside a ``batch_first=False``
    transformer layer, and the final norm of a stack of them, that their activations are
    ``(T, M * B, F)``: the members on dim 1."""
    for module in net.modules():
        inside: nn.Module | None = None
        if isinstance(module, SEQUENCE_FIRST_LAYERS) and _sequence_first(module):
            inside = module
        elif isinstance(module, SEQUENCE_FIRST_STACKS) and len(module.layers):
            if _sequence_first(module.layers[0]):
                inside = module.norm  # None without a final norm
        for inner in inside.modules() if inside is not None else ():
            if getattr(inner, "_is_batchensemble", False) or isinstance(inner, BatchEnsembleNorm):
                inner._sequence_first = True  # type: ignore[assignment]


def _check_held_members(module: nn.Module, num_members: int) -> None:
    """Refuse a network holding BatchEnsemble layers or per-member norms (from an earlier
    conversion) of another number of members: they would split the folded batch otherwise."""
    other = [
        (name or "the network itself", m.num_members)
        for name, m in module.named_modules()
        if getattr(m, "_is_batchensemble", False) or getattr(m, "_is_member_norm", False)
        if m.num_members != num_members
    ]
    if other:
        held = ", ".join(f"{name!r} ({count} members)" for name, count in other[:3])
        raise ValueError(
            f"{class_name(module)} already holds BatchEnsemble layers of another size than "
            f"num_members={num_members}: {held}{', ...' if len(other) > 3 else ''}. They would "
            "mix the members of the folded batch. Convert the plain network they were made "
            f"from, or pass num_members={other[0][1]}."
        )


def _copy_norms(net: nn.Module, num_members: int) -> None:
    """Replace every normalisation layer of ``net`` (nested) by per-member copies; a tensor
    that two of them share (``n2.weight = n1.weight``) stays shared by each member's copies."""
    memos: list[dict[int, Any]] = [{} for _ in range(num_members)]  # one deepcopy per member

    def copies(child: nn.Module) -> nn.Module | None:
        if not isinstance(child, NORM_LAYERS):
            return None
        layer = BatchEnsembleNorm(child, num_members)  # (its copies: one per norm, apart)
        layer.norms = nn.ModuleList(copy.deepcopy(child, memo) for memo in memos)
        return layer

    _replace_children(net, copies, BatchEnsembleNorm)


class BatchEnsembleNetwork(NamedInStore, PyroModule):
    """BatchEnsemble version of any network: a deterministic Pyro module (what
    :func:`batchensemble` returns).

    Every ``nn.Linear``, ``nn.Conv{1,2,3}d`` and ``nn.ConvTranspose{1,2,3}d`` of the network,
    nested ones included, is a BatchEnsemble layer (shared weight W, per-member rank-1 factors
    and biases, effective weight ``diag(s_i) W diag(r_i)``). Inputs are plain ``(B, ...)``
    batches; the input is repeated once per member (folded batch ``(M * B, ...)``,
    member-major) and the outputs come back as ``(M, B, D)``, recorded (``"logits"``, or
    ``"outputs"`` for ``Gaussian``) with ``"obs"`` observed for every member inside a
    ``"members"`` plate (dim -2) and the ``"data"`` plate (dim -1), scaled N/B.

    Every member sees every input, in training and in prediction. On CPU, unless a
    normalisation layer the members share needs all their rows in one call (with
    ``norms="shared"``, a BatchNorm or an InstanceNorm tracking running statistics, in
    training), the network's forward runs once per member on the ``(B, ...)`` batch with that
    member's weights (the same function, faster there); on accelerators it runs once on the
    folded batch. What a forward of your own does besides computing (a buffer or a counter it
    updates, a forward hook on one of its layers) then happens M times a call, on B inputs
    each, on CPU, and once, on M * B inputs, on accelerators.

    By default (``norms="per_member"``) every normalisation layer (BatchNorm, InstanceNorm,
    GroupNorm, LayerNorm, RMSNorm) becomes a :class:`~pyrouq.nn.BatchEnsembleNorm`: one copy per
    member, with its own affine parameters and statistics, as if each member were its own
    network, as in the BatchEnsemble authors' implementation (edward2's
    ``ensemble_batchnorm``). With
    ``norms="shared"`` the members share them: a BatchNorm in training normalises with
    statistics over the whole folded batch and keeps one set of running statistics. On a
    residual CNN with BatchNorm (Fashion-MNIST, 3 epochs from scratch) per-member norms
    measured better in accuracy, NLL and ECE (see the docs' measured figures; the README's
    BatchEnsemble section gives the NLLs). Other parameterised layers
    (embeddings, attention; ``nn.Bilinear`` too, with a warning) are shared: the projections
    of an ``nn.MultiheadAttention`` and of torchvision's Swin attention stay plain (their
    forwards read them as tensors), as do subclasses of Linear or a convolution with a
    computation of their own (a weight-standardised convolution: a BatchEnsemble layer would
    drop it; a warning names them), while the
    feed-forward layers of an ``nn.TransformerEncoderLayer`` are converted (torch's fused eval
    path is switched off while the members run, so that they are called). The members differ
    only where the forward calls the converted layers: one that reads a layer's weight as a
    tensor (``F.linear(x, self.fc.weight)``) meets the shared W, and the network's first run
    warns, naming every BatchEnsemble layer it did not call; one that reads its bias too meets
    the per-member biases ``(M, out)`` and fails, the error noting the layers not yet called.
    Tied weights stay tied (their layers share one W, as the members do; a tied bias, one set
    of per-member biases, but a warning where it is tied to a parameter left as it is, e.g. an
    attention projection's bias, which the per-member biases cannot be), and a layer
    registered under several names becomes one BatchEnsemble layer. The folded batch must
    stay on dim 0 of every converted layer's and norm's input (merging windows or tokens into
    it keeps it there); only inside an ``nn.TransformerEncoderLayer`` / ``DecoderLayer`` with
    ``batch_first=False`` (and in the final ``norm`` of an ``nn.TransformerEncoder`` /
    ``Decoder`` of such layers) is it read on dim 1. A layer applied to other sequence-first
    activations ``(T, M * B, F)`` would split T among the members (an error unless T is a
    multiple of M * B): write such a network batch-first.

    There are no latent sites: fit it with ``fit(model, None, loader)`` (the loss is the
    members' summed negative log-likelihood) or plain ``pyro.infer.SVI`` with an empty guide.
    Its parameters are registered in Pyro's param store under a name unique to this instance
    (values loaded into the store under those names are taken).

    Parameters
    ----------
    module : nn.Module
        The network to convert, deep-copied; its weights are kept when ``use_base_weights``.
    num_members : int
        Ensemble size M (>= 1).
    use_base_weights : bool, default True
        Copy W and the biases from ``module``; False re-initialises every converted layer
        (torch's default initialisation) but the frozen ones (``requires_grad=False``), which
        keep their weights: they would not train away from a random start (nor does a frozen
        bias, kept too). Layers kept plain (attention projections, subclasses with a
        computation of their own) keep theirs.
    init, r_mean, r_std, s_mean, s_std
        Factor initialisation, see :class:`~pyrouq.nn.BatchEnsembleLinear` (with
        ``init="random_sign"``, a mean or std other than its default is warned of: unread).
    norms : {"per_member", "shared"}, default "per_member"
        A copy of every normalisation layer per member, or one for all members (see above).
    num_data : int, optional
        Training-set size N (set by ``fit()``).
    likelihood : {"categorical", "gaussian"} or Likelihood, default "categorical"

    Examples
    --------
    >>> import torch
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> model = BatchEnsembleNetwork(net, 2, init="random_sign")
    >>> x = torch.randn(5, 4)
    >>> out = model(x)  # (M, B, D): member 1 is its BatchEnsemble layers run alone
    >>> first, last = model.net[0], model.net[2]
    >>> h = torch.relu(nn.functional.linear(x, first.effective_weight(1), first.bias[1]))
    >>> mine = nn.functional.linear(h, last.effective_weight(1), last.bias[1])
    >>> out.shape, torch.allclose(out[1], mine, atol=1e-6)
    (torch.Size([2, 5, 3]), True)
    """

    num_classes: int | None = None
    _pyrouq_model = True

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
        norms: Norms = "per_member",
        num_data: int | None = None,
        likelihood: LikelihoodName | Likelihood = "categorical",
    ):
        super().__init__(name=f"{type(self).__name__}_{next(COUNTER)}")
        num_members = _check_members(num_members, made())
        use_base_weights = check_flag("use_base_weights", use_base_weights)
        _check_factor_init(init, r_mean, r_std, s_mean, s_std)
        normal = dict(r_mean=r_mean, r_std=r_std, s_mean=s_mean, s_std=s_std)
        warn_unread_by_random_sign(init, normal)
        _check_norms(norms)
        check_module(module, f"convert into {made()}")
        check_no_pyro_samples(module, "batchensemble()", ensemble=True)
        self.num_members = num_members
        self.num_data = check_num_data(num_data)
        self.given_num_data = self.num_data  # fit()'s N for a loader of unknown size
        self.likelihood = get_likelihood(likelihood)
        self.module_record = module_record(module)
        self.options = dict(
            use_base_weights=use_base_weights,
            init=init,
            r_mean=r_mean,
            r_std=r_std,
            s_mean=s_mean,
            s_std=s_std,
            norms=norms,
        )
        _check_held_members(module, num_members)
        net = copy_network(module, f"convert it into {made()}")
        hooked = weight_hooks(net)
        if hooked:  # its hook would read tensors a BatchEnsemble layer does not hold
            names = ", ".join(f"{name!r} ({what})" for name, what in hooked[:3])
            raise ValueError(
                f"A BatchEnsemble cannot be built of layers whose weight a hook recomputes "
                f"(its members' layers hold no tensors for it to read): {names}. "
                f"{hook_fix(hooked)}"
            )
        if isinstance(net, tuple(BATCHENSEMBLE_LAYERS)):  # a bare layer: convert it as a child
            net = nn.Sequential(net)
        # (random_sign's layers read no mean or std: the defaults, not warned of again)
        factors = dict(init=init, **(NORMAL_DEFAULTS if init == "random_sign" else normal))
        if not _convert_layers(net, num_members, factors, reset=not use_base_weights):
            raise ValueError(nothing_converted(net, class_name(module)))
        warn_bilinear(net, num_members)
        if norms == "per_member":
            _copy_norms(net, num_members)
        _mark_sequence_first(net)
        # a new model starts in training mode throughout, as a torch module does, whatever
        # modes the network was left in (fit() and predict() leave eval)
        self.net = _engine.prepare(net.train())
        hold_params(self, self._pyro_name)

    def _input(self, x: Any) -> Tensor:
        """``x`` in the network's dtype (floating inputs are cast; integer ones refused)."""
        x = model_input(x, self, type(self).__name__)
        self._check_input(x)
        return x

    def _check_input(self, x: Tensor) -> None:
        """A front door's checks of the input's shape (none for a converted network)."""

    def outputs(self, x: Tensor) -> Tensor:
        """Every member's outputs on every input, ``(M, B, D)``, no Pyro statements."""
        return self._members(self._input(x))

    def _members(self, x: Tensor) -> Tensor:
        """:meth:`outputs` of ``x`` checked and cast (:meth:`_input`)."""
        # read past PyroModule's hook, which under Pyro records it (pyro.module): forward
        # records it untraced
        net: nn.Module = self._modules["net"]  # type: ignore[assignment]
        return _engine.run_members(net, x, self.num_members)

    def _recorded(self, x: Tensor) -> Tensor:
        """``x`` checked, the network's parameters put in Pyro's param store and recorded
        as its param sites: forward's statements of one name each, which torch.compile runs
        untraced (:func:`~pyrouq._untraced.untraced`)."""
        register_children(self, record=False)
        self.net  # noqa: B018 (under Pyro, PyroModule's hook records it: pyro.module)
        return self._input(x)

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """Outputs ``(M, B, D)`` of every member on every input; observes ``y`` if given."""
        x = untraced(self._recorded, x)
        likelihood: Likelihood = self._modules["likelihood"]  # type: ignore[assignment]
        with hiding_own_sites(likelihood):  # its own "logits", "obs" (once per member), ...
            outputs = self._members(x)  # (x checked once, untraced, by _recorded)
        # a learned noise scale takes its shape from the outputs before PyroModule's attribute
        # hook registers it with Pyro (self.likelihood below)
        likelihood.prepare(outputs)
        return self.likelihood.observe(
            outputs, y, self.num_data, type(self).__name__, members=self.num_members
        )

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}, likelihood={self.likelihood}"


def batchensemble(
    module: nn.Module,
    num_members: int,
    use_base_weights: bool = True,
    r_mean: float = 1.0,
    r_std: float = 0.5,
    s_mean: float = 1.0,
    s_std: float = 0.5,
    *,
    init: FactorInit = "normal",
    norms: Norms = "per_member",
    likelihood: LikelihoodName | Likelihood = "categorical",
    num_data: int | None = None,
) -> BatchEnsembleNetwork:
    """Convert any (e.g. pre-trained) network into a BatchEnsemble of ``num_members``.

    ``MLP`` becomes :class:`~pyrouq.BatchEnsembleMLP`, ``LeNet``
    :class:`~pyrouq.BatchEnsembleLeNet`, any other module a :class:`BatchEnsembleNetwork`. With
    ``use_base_weights`` (the default) the shared weights W and every member's bias are copies
    of the module's, so the two-phase recipe is two calls: pre-train the plain network, then
    ``fit(batchensemble(net, M), None, loader, ...)``. The module itself is left untouched.
    Frozen parameters (``requires_grad=False``) stay frozen: a frozen layer's W and biases are
    frozen in its BatchEnsemble layer, so freezing the pre-trained network before converting
    trains only the factors ``r`` and ``s`` (and whatever else is not frozen).

    Parameters
    ----------
    module : nn.Module
        Any network whose forward takes one tensor and returns the outputs ``(B, D)``.
    num_members : int
        Ensemble size M (>= 1).
    use_base_weights : bool, default True
        Copy W and biases from ``module``; False re-initialises them (torch's default init),
        frozen layers' and frozen biases apart (layers kept plain keep their weights).
    r_mean, r_std, s_mean, s_std : float, default 1.0, 0.5, 1.0, 0.5
        With ``init="normal"``: r ~ N(r_mean, r_std), s ~ N(s_mean, s_std).
    init : {"normal", "random_sign"}, default "normal"
        ``"random_sign"`` sets every factor entry to +-1, reading no mean or std: one other
        than its default is warned of (ignored).
    norms : {"per_member", "shared"}, default "per_member"
        One copy of every normalisation layer per member (its own affine parameters and
        statistics, as in the BatchEnsemble authors' implementation; on CPU the members then
        also train as separate passes, which measures faster: see ``benchmarks/results.md``),
        or layers shared by the members (BatchNorm statistics over all members' rows).
        Per-member norms measured better on a residual CNN (the docs' measured figures: 91.67 %
        against 91.21 % accuracy, NLL 0.2356 against 0.2431, ECE 0.39 % against 0.50 %, seed
        0). Networks without normalisation layers are unaffected.
    likelihood : {"categorical", "gaussian"} or Likelihood, default "categorical"
    num_data : int, optional
        Training-set size N, by which a minibatch of B targets passed to the model (or given
        its ``"obs"`` by ``pyro.poutine.condition``) is scaled, N/B: set by ``fit()``; a
        Pyro loop of one's own (``SVI``) needs it here or as ``model.num_data = N``.

    Returns
    -------
    BatchEnsembleNetwork
        Hooks go on its ``net`` (the converted copy) or its layers: :func:`pyrouq.fit` and
        :func:`pyrouq.predict` run those, so a hook registered on the BatchEnsembleNetwork
        itself (``model.register_forward_pre_hook``) runs on a direct ``model(x)`` call only.

    Warns
    -----
    UserWarning
        Layers or parameters held in plain Python lists, tuples or dicts (not registered:
        never converted, trained or saved; hold them in ``nn.ModuleList`` / ``nn.ModuleDict``),
        in the first 10,000 items of each attribute's containers.
        An ``nn.Bilinear`` layer, which has no BatchEnsemble version: it stays one layer every
        member shares. A parameter left as it is but tied to the bias of a converted layer: the
        tie breaks (the layer's per-member biases replace that bias in the layer only, and the
        two train apart; :func:`pyrouq.bayesian` keeps every tie).
        ``init="random_sign"`` with ``r_mean``, ``r_std``, ``s_mean`` or ``s_std`` other than
        the default (unread).

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
    latent = get_likelihood(likelihood).latent_sites()
    if latent:
        raise ValueError(
            f"batchensemble() got a likelihood whose noise is a latent site ({sorted(latent)}, "
            "from a prior), but a BatchEnsemble is deterministic: nothing would sample it. Use "
            "Gaussian('learned') for a noise trained as a point estimate, or rank1(module, M, "
            "likelihood=...) for a rank-1 Bayesian network, whose guide fits the noise too."
        )
    return _batchensemble(
        module,
        num_members,
        use_base_weights=use_base_weights,
        r_mean=r_mean,
        r_std=r_std,
        s_mean=s_mean,
        s_std=s_std,
        init=init,
        norms=norms,
        likelihood=likelihood,
        num_data=num_data,
    )


def _batchensemble(
    module: nn.Module,
    num_members: int,
    *,
    use_base_weights: bool,
    r_mean: float,
    r_std: float,
    s_mean: float,
    s_std: float,
    init: FactorInit,
    norms: Norms,
    likelihood: LikelihoodName | Likelihood,
    num_data: int | None = None,
) -> BatchEnsembleNetwork:
    """:func:`batchensemble` without its check of the likelihood: :func:`pyrouq.rank1` builds
    its BatchEnsemble with a latent noise, which its guide then fits."""
    options: dict[str, Any] = dict(
        use_base_weights=check_flag("use_base_weights", use_base_weights),
        init=init,
        r_mean=r_mean,
        r_std=r_std,
        s_mean=s_mean,
        s_std=s_std,
        num_data=num_data,
    )
    from pyrouq.models import MLP, BatchEnsembleLeNet, BatchEnsembleMLP, LeNet

    _check_norms(norms)
    check_no_pyro_samples(module, "batchensemble()", ensemble=True)  # (MLP, LeNet)
    default_likelihood = isinstance(likelihood, str) and likelihood == "categorical"
    if type(module) is MLP and default_likelihood:
        return BatchEnsembleMLP(base=module, num_members=num_members, **options)
    if type(module) is LeNet and default_likelihood:
        return BatchEnsembleLeNet(base=module, num_members=num_members, **options)
    return BatchEnsembleNetwork(module, num_members, norms=norms, likelihood=likelihood, **options)
