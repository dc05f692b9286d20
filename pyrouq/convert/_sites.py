"""What :func:`~pyrouq.bayesian` makes a latent site of the parameters ``select`` picks: a tied
parameter once, under its first name; never an integer or boolean one. And the Pyro sites a
converted network records itself: refused (``PyroSample`` attributes), or hidden under the
model's own names (:func:`hiding_own_sites`)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyro
import torch
from torch import nn

from pyrouq._util import class_name, warn_caller
from pyrouq.convert._hints import HELD_LOOKED_AT, contents

__all__ = [
    "PLAIN_INSTEAD",
    "aliases_of",
    "check_no_pyro_samples",
    "check_own_names",
    "hiding_own_sites",
    "latent_embeddings",
    "latent_sites_of",
    "pyro_samples_held",
    "rebuilding_saved",
    "tied_names",
]


def aliases_of(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """``{first name: (its other names, ...)}`` of every parameter of ``module`` registered
    under several names (tied weights: an embedding and an output layer sharing one matrix; a
    layer registered twice), the first name being the one ``named_parameters()`` gives."""
    first: dict[int, str] = {}
    others: dict[str, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        if id(param) in first:
            others.setdefault(first[id(param)], []).append(name)
        else:
            first[id(param)] = name
    return {name: tuple(more) for name, more in others.items()}


def tied_names(module: nn.Module) -> dict[str, str]:
    """``{other name: first name}`` of every parameter of ``module`` registered under several
    names (:func:`aliases_of`)."""
    return {other: first for first, more in aliases_of(module).items() for other in more}


PLAIN_INSTEAD = (
    "a plain nn.Linear or nn.Conv2d in place of a PyroModule[...] or of "
    "pyrouq.nn.BayesianLinear / BayesianConv2d"
)
"""What a network holding sampled attributes is told to hold instead (the converters' and the
command line's refusals)."""


def pyro_samples_held(module: nn.Module) -> str:
    """The modules of ``module`` holding sampled attributes (``PyroSample``, kept in
    ``_pyro_samples``), with those attributes (``"'fc' (PyroLinear): weight"``); empty when
    none does."""
    held = [
        f"{repr(path) if path else 'the network itself'} ({type(owner).__name__}): "
        + ", ".join(samples)
        for path, owner in module.named_modules()
        if (samples := getattr(owner, "_pyro_samples", None))
    ]
    return "; ".join(held[:4]) + ("; ..." if len(held) > 4 else "")


def check_no_pyro_samples(module: object, caller: str, ensemble: bool = False) -> None:
    """Refuse a network holding Pyro modules with sampled attributes (``PyroSample``, kept in
    ``_pyro_samples``; ``caller``: ``"bayesian()"``, ...). Such a value is no parameter, so
    it would be no latent site of the converted model: its module would draw it from its
    prior at every run, outside the guide (fit() could not learn it, predict() would differ
    on every call, mcmc() would drop its draws); a BatchEnsemble (``ensemble``) would also
    keep one prior draw as a converted layer's shared weight."""
    if not isinstance(module, nn.Module):
        return  # (check_module says what came)
    _check_no_models_inside(module, caller)
    where = pyro_samples_held(module)
    if not where:
        return
    if ensemble:
        lost = (
            "so the conversion would lose its prior: a converted layer would keep one draw "
            "from it as its shared weight, and any other module would draw it anew at every "
            "run, outside the guide (fit() could not learn it, and one input would give other "
            "outputs on every call)"
        )
        choose = "convert that network"
    else:
        lost = (
            "so it would be no latent site of the converted model: its module would draw it "
            "from its prior at every run, outside the guide (fit() could not learn it, "
            "predict() would differ on every call, mcmc() would drop its draws)"
        )
        choose = "choose the latent ones with select= and prior="
    raise ValueError(
        f"{caller} got a {class_name(module)} holding Pyro modules with sampled attributes "
        f"(PyroSample): {where}. A PyroSample is not a parameter, {lost}. Make them ordinary "
        f"parameters ({PLAIN_INSTEAD}) and {choose}, or "
        "use the Pyro model as it is: fit(model, guide, ...) and predict(model, x, guide) "
        "take a Pyro model of one's own with its own guide (e.g. "
        "pyro.infer.autoguide.AutoNormal(model))."
    )


def _check_no_models_inside(module: nn.Module, caller: str) -> None:
    """Refuse a network holding a pyrouq model (a converted network, a front door such as
    ``BayesianMLP``) below its root: a Bayesian one would draw its own latent sites from their
    priors at every run, outside the guide of the model made here; a BatchEnsemble would
    return ``(M, B, D)`` outputs to the layer after it. (The root itself: check_module.)"""
    inside: list[tuple[str, nn.Module]] = []
    for path, owner in module.named_modules():
        if path and getattr(owner, "_pyrouq_model", False):
            if not any(path.startswith(f"{outer}.") for outer, _ in inside):
                inside.append((path, owner))
    if not inside:
        return
    held = ", ".join(f"{path!r} ({class_name(owner)})" for path, owner in inside[:3])
    more = ", ..." if len(inside) > 3 else ""
    raise ValueError(
        f"{caller} got a {class_name(module)} holding pyrouq models: {held}{more}. A model "
        "inside a network is run by the network's forward as a Pyro model of its own: a "
        "Bayesian one draws its latent sites from their priors at every run, outside the guide "
        "of the model made here (fit() could not learn them, and one input would give other "
        "outputs on every call); a BatchEnsemble returns its members' outputs (M, B, D) to "
        "the layer after it. Hold the plain network there instead (a Bayesian model's "
        "model.plain_network(), or the network it was made from) and convert the whole "
        "network once, choosing its latent parameters with select= and prior=."
    )


def hiding_own_sites(likelihood: Any, latent: Iterable[str] = ()) -> Any:
    """A Pyro handler hiding the sites a converted network records itself under its model's
    names (``latent``, a Bayesian model's latent sites; plates "data" and "members"; "obs"; the
    ``likelihood``'s output site), as a Pyro model of one's own converted records its "logits"
    or its "obs" in plate "data": they would clash with the model's own in a trace. Both
    converted models run their network under it at every forward (about 1 us)."""
    names = {*latent, "data", "members", "obs", likelihood.output_site}
    return pyro.poutine.block(hide_fn=lambda msg: msg["name"] in names)


def latent_sites_of(module: nn.Module, picked: Sequence[str], select: object) -> list[str]:
    """The latent sites of the parameters ``picked`` (any of their names), in
    ``named_parameters()`` order: a tied parameter is one site, named by its first name. A
    non-floating parameter (an integer table held as a frozen parameter) cannot be a random
    variable: a clear error."""
    canonical = tied_names(module)
    chosen = {canonical.get(name, name) for name in picked}
    sites = [name for name, _ in module.named_parameters() if name in chosen]
    _check_registered_once(module, sites)
    _check_not_held_elsewhere(module, sites)
    params = dict(module.named_parameters())
    discrete = [name for name in sites if not params[name].is_floating_point()]
    if discrete:
        dtypes = ", ".join(f"{name!r} ({params[name].dtype})" for name in discrete[:4])
        how = (
            "a callable that returns False for them"
            if callable(select)
            else "names or prefixes that leave them out"
        )
        raise ValueError(
            f"select= picked parameters of {class_name(module)} that are not floating-point: "
            f"{dtypes}. A latent site is a real-valued random variable (a Normal prior and "
            f"guide), so these can only stay as they are. Pass select= {how}."
        )
    return sites


def _check_registered_once(module: nn.Module, sites: Sequence[str]) -> None:
    """Refuse a site whose layer is registered under several names (``self.again = self.a``,
    ``nn.Sequential(block, block)``): ``torch.func.functional_call``, which runs the network
    with drawn weights, puts the draw in under every name and restores only one, so the layer
    would keep a draw as its weight."""
    aliases = aliases_of(module)
    for site in sites:
        seen: dict[tuple[int, str], str] = {}
        for name in (site, *aliases.get(site, ())):
            owner, _, attr = name.rpartition(".")
            slot = (id(module.get_submodule(owner)), attr)
            if slot in seen:
                first, again = seen[slot].rpartition(".")[0], owner
                factors = (
                    " (rank1() makes every layer's factors latent; to leave these out, build "
                    "pyrouq.bayesian(pyrouq.batchensemble(net, M, norms='shared'), select=[the "
                    "other layers' factors], prior=dist.Normal(1.0, 0.1)))"
                    if getattr(module.get_submodule(owner), "_is_batchensemble", False)
                    else ""
                )
                raise ValueError(
                    f"{site!r} belongs to a layer of {class_name(module)} registered under "
                    f"several names ({first!r} and {again!r} are one module), and pyrouq "
                    "cannot make such a layer's parameters latent yet: the weights drawn for "
                    "it would stay in it. Register the layer once and call it as often as "
                    f"forward needs ({_call_of(first)} twice; one draw serves every call), "
                    f"or leave it out of select={factors}."
                )
            seen[slot] = name


def _call_of(path: str) -> str:
    """How a forward calls the layer at ``path``: ``self.a(...)``, or ``one module called``
    where its name is no attribute (``seq.0``: an ``nn.Sequential``'s)."""
    attr = path.rpartition(".")[2]
    return f"self.{attr}(...)" if attr.isidentifier() else "one module called"


def _read_of(name: str) -> str:
    """How a forward reads the parameter ``name`` through its module: ``self.fc.weight``."""
    path, _, attr = name.rpartition(".")
    owner = path.rpartition(".")[2]
    if not path:
        return f"self.{attr}"
    return f"self.{owner}.{attr}" if owner.isidentifier() else f"its module's .{attr}"


_TORCH_HELD = {(nn.RNNBase, "_flat_weights")}
"""Attributes where torch's own modules hold their parameters again and refresh them from the
registered ones at every forward (so they read a draw put in place)."""


def _tensors_in(value: object, budget: int | None = None) -> list[torch.Tensor]:
    """The tensors inside ``value``, a tensor or a list, tuple (a namedtuple too), set or dict
    of them, nested to any depth, as :func:`~pyrouq.convert._hints.contents` reads them
    (``budget`` items at most; None: all; modules are not looked into: their parameters are
    registered)."""
    return [t for t in contents(value, budget) if isinstance(t, torch.Tensor)]


def _check_not_held_elsewhere(module: nn.Module, sites: Sequence[str]) -> None:
    """Refuse a site whose parameter the network also holds outside torch's registry, in an
    attribute of its own (``self.weights = [self.fc.weight]``): the network runs with each draw
    in place of the registered tensor, so a forward reading it there would read the initial
    value, never a draw, and training would never move it. Each attribute's containers are
    looked into up to :data:`~pyrouq.convert._hints.HELD_LOOKED_AT` items."""
    params = dict(module.named_parameters())
    wanted = {id(params[site]): site for site in sites}
    for path, owner in module.named_modules():
        for attr, value in vars(owner).items():
            if attr in ("_parameters", "_buffers", "_modules") or any(
                isinstance(owner, kind) and attr == name for kind, name in _TORCH_HELD
            ):
                continue
            held = [wanted[id(t)] for t in _tensors_in(value, HELD_LOOKED_AT) if id(t) in wanted]
            if held:
                where = f"{path}.{attr}" if path else attr
                raise ValueError(
                    f"{held[0]!r} of {class_name(module)} is also held in {where!r} (a "
                    f"{type(value).__name__}), outside the module's registered parameters. "
                    "pyrouq runs the network with each draw in place of the registered "
                    "parameter, so a forward reading it there would use its initial value, "
                    f"never a draw. Read it through its module in forward ({_read_of(held[0])}), "
                    "or leave it out of select=."
                )


def latent_embeddings(module: nn.Module, sites: Sequence[str]) -> None:
    """Ready the ``nn.Embedding`` / ``nn.EmbeddingBag`` layers of ``module`` (the converted
    copy) whose weight is a latent site: one built with ``sparse=True`` computes dense
    gradients instead (the same values: the draw's gradient reaches the guide's dense
    location and scale, through which a sparse one cannot pass); one with a ``max_norm`` is
    refused (torch renormalises the rows it reads in place, on the weight: there, each
    posterior draw, a guide's, the caller's posterior_samples or MCMC's state; its message
    names none of them alone, as bayesian() and load() raise it before any is chosen); and one
    with a ``padding_idx`` is warned of, unless another layer shares its weight: torch gives
    that row no gradient from the data, so its guide follows the KL alone, toward the prior."""
    tied = tied_names(module)
    latent = set(sites) | {other for other, first in tied.items() if first in sites}
    found: list[tuple[str, str]] = []
    holders: dict[str, bool] = {}  # site: every layer holding it is an embedding that pads
    for path, layer in module.named_modules():
        name = f"{path}.weight" if path else "weight"
        if name not in latent:
            continue
        embedding = isinstance(layer, (nn.Embedding, nn.EmbeddingBag))
        site = tied.get(name, name)
        holders[site] = holders.get(site, True) and embedding and layer.padding_idx is not None
        if not embedding:
            continue
        if layer.max_norm is not None:
            raise ValueError(
                f"bayesian(): the embedding weight {name!r} of {class_name(module)} would be "
                f"latent, but it has max_norm={layer.max_norm}, and torch renormalises the rows "
                "it reads in place, on the weight: every posterior draw the network runs with "
                "would be changed under it, one's own posterior_samples too. Leave the "
                "embedding a point estimate (a select= without it), or build it with "
                "max_norm=None and bound the vectors in forward: h = self.emb(x); "
                "h = h * (m / h.norm(dim=-1, keepdim=True).clamp(min=m)), with m the max_norm."
            )
        layer.sparse = False
        if layer.padding_idx is not None:
            found.append((site, f"{name!r} (padding_idx={layer.padding_idx})"))
    padded = [text for site, text in found if holders[site]]  # (a tied decoder's gradient)
    if padded:
        warn_caller(
            f"bayesian(): the embedding weight {', '.join(padded)} of {class_name(module)} is "
            "latent, but torch gives its padding row no gradient from the data, so the guide "
            "learns that row from the KL alone, toward the prior: the draws give padding tokens "
            "random vectors. Keep the forward from reading padding positions (mask them, or "
            "pack the sequences), or leave the embedding a point estimate (a select= without "
            "it)."
        )


def check_own_names(
    module: nn.Module, sites: Sequence[str], likelihood: Any, members: int | None
) -> None:
    """Refuse a latent site of the network (a top-level parameter of ``module`` selected,
    ``self.sigma``) named as one of the model's own sites: the ``likelihood``'s latent sites
    (``"sigma"``, a noise scale with a prior), its output site, ``"obs"``, the plate
    ``"data"`` and, of a rank-1 network (``members`` set), the plate ``"members"``. The model
    would record two sites under one name: one value would stand for both in fit(), and
    Pyro's trace (SVI, Predictive, NUTS) refuses them. Under :func:`rebuilding_saved` (a
    checkpoint saved so before the refusal, loaded) it is warned of instead."""
    named = type(likelihood).__name__
    own = {
        site: f"a latent site of the likelihood {named} (its noise scale, from its prior)"
        for site in likelihood.latent_sites()
    }
    own[likelihood.output_site] = "the site where the model records its outputs"
    own["obs"] = "the site where the model observes the targets"
    own["data"] = "the model's plate of data points"
    if members is not None:
        own["members"] = "the rank-1 model's plate of members"
    clash = [site for site in sites if site in own]
    if clash and _REBUILDING.get():
        site = clash[0]
        lost = (
            "one draw stands for both, the network's parameter and the noise scale"
            if site in likelihood.latent_sites()
            else "Pyro's trace (mcmc(), to_inference_data(), pyro.infer.Predictive) refuses "
            "two sites under one name"
        )
        warn_caller(
            f"load(): the checkpoint's network {class_name(module)} has a latent site "
            f"{site!r}, named as {own[site]}, which bayesian() refuses since 2026-12-06. It "
            f"loads as it was trained, but {lost}. Rename the network's parameter "
            f"(self.{site} -> e.g. self.{site}_net) and fit it anew."
        )
        return
    if clash:
        site = clash[0]
        raise ValueError(
            f"bayesian(): the parameter {site!r} of {class_name(module)} would be a latent "
            f"site named {site!r}, which is already {own[site]}. A model cannot hold two "
            "sites under one name (one draw would stand for both; Pyro's trace refuses "
            f"them). Rename the network's parameter (self.{site} -> e.g. self.{site}_net) or "
            "leave it out of select=."
        )


_REBUILDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "pyrouq_rebuilding_saved", default=False
)


@contextlib.contextmanager
def rebuilding_saved() -> Iterator[None]:
    """Within it (:func:`pyrouq.load` rebuilding a saved model), :func:`check_own_names` warns
    of a clash instead of refusing it: a checkpoint written before such names were refused,
    whose pyrouq fit() and predict() ran, loads as it was trained."""
    token = _REBUILDING.set(True)
    try:
        yield
    finally:
        _REBUILDING.reset(token)
