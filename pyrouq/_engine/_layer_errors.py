"""A layer refusing its input, named by its paths in the network (:class:`LayersNamed`): a
BatchEnsemble layer's refusal, torch's words on shapes, channels or dtypes, or an
``nn.Embedding``'s bare "index out of range in self"."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pyrouq._first_layer_fix import input_fix
from pyrouq._mismatch import (
    input_mismatch,
    instance_norm_words,
    layer_added,
    layer_named,
)
from pyrouq._util import LayerInputError, class_name


class LayersNamed:
    """While a converted network ``net`` (a model's ``.net``) runs, a
    :class:`~pyrouq._util.LayerInputError` of one of its layers is re-raised as a ValueError
    naming the layer at each of its dotted paths in the model (a layer registered under two
    names is named at both), as ``'net.3.0'``; a layer not in ``net``, a refusal rebuilt from
    its message alone (no ``layer``), or anything failing while the paths are looked up, leaves
    the refusal as it came. Torch's own words on inputs a layer does not take (a
    RuntimeError; an affine InstanceNorm's ValueError on another channel count) get the layer
    added, their type kept (:func:`_name_failing_layer`). A run that succeeds pays for the
    ``with`` alone. ``x``: the input the model gave ``net``, for a
    refusal of it as it came (by its first layer), which says what to do about the input or
    that layer (``LayerInputError.input_detail``; after torch's words, a convolution's or
    Linear's of torch: :func:`_input_fix`), not about "the layer before it". ``plain``: ``net``
    is a plain network run as it is (``predict(net, x)``), its layers named at their paths in
    it (``'0' of the network``)."""

    def __init__(self, net: nn.Module, x: Any = None, plain: bool = False):
        self.net, self.x, self.plain = net, x, plain

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if isinstance(error, RuntimeError) or instance_norm_words(error):
            _name_failing_layer(self.net, error, traceback, self.x, self.plain)
            return
        if isinstance(error, IndexError):
            _name_failing_embedding(self.net, error, traceback, self.plain)
            return
        if not isinstance(error, LayerInputError) or error.layer is None:
            return
        try:
            where = _where(self.net, error.layer, self.plain)
            detail = error.detail
            if error.input_detail and _took_input(self.net, error.layer, self.x, traceback):
                detail = error.input_detail
            message = f"{error.label} {where} {detail}"
        except Exception:  # (the refusal as it came)
            return
        if where:
            raise ValueError(message).with_traceback(traceback) from None


def _where(net: nn.Module, layer: nn.Module, plain: bool = False) -> str:
    """Where ``layer`` is: at its dotted paths in the model whose network is ``net`` (``at
    'net.3.0' of the model``, joined with "and" for a layer registered under several names),
    or, ``plain``, in ``net`` itself (``at '3.0' of the network``). A layer of torch's or
    pyrouq's given as the network, ``net`` itself, is ``at 'net' of the model`` or ``given as
    the network``; empty for another ``net`` itself (its own forward failed, not a layer)."""
    if layer is net:
        if next(net.children(), None) is not None or not _a_layer(net):
            return ""
        return "given as the network" if plain else "at 'net' of the model"
    paths = [
        repr(name if plain else f"net.{name}")
        for name, module in net.named_modules(remove_duplicate=False)
        if module is layer and name
    ]
    if not paths:
        return ""
    joined = " and ".join([", ".join(paths[:-1]), paths[-1]] if len(paths) > 1 else paths)
    return f"at {joined} of {'the network' if plain else 'the model'}"


def _a_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a layer of torch's (``torch.nn``) or a BatchEnsemble layer."""
    return getattr(module, "_is_batchensemble", False) or type(module).__module__.startswith(
        "torch.nn."
    )


def _took_input(net: nn.Module, layer: nn.Module, x: Any, traceback: Any) -> bool:
    """Whether ``layer``, the first weighted layer of ``net`` (a BatchEnsemble layer, or a
    torch convolution or Linear of a converted Bayesian network), refused the model's input
    ``x`` as it came (repeated once per member in a folded batch): the input it was called
    with holds ``x``'s values, not only its shape. A later layer is never told so, even given
    values equal to ``x``'s (zeros through layers without biases: the first layer is not the
    one to change)."""
    if not torch.is_tensor(x) or x.dim() == 0 or x.shape[0] == 0:
        return False
    if _first_weighted(net) is not layer:
        return False
    found, inputs = _innermost(net, traceback)
    given = inputs[0] if found is layer and inputs else None
    if not torch.is_tensor(given) or given.dtype != x.dtype or given.shape[1:] != x.shape[1:]:
        return False
    return given.shape[0] % x.shape[0] == 0 and torch.equal(given[: x.shape[0]], x)


def _first_weighted(net: nn.Module) -> nn.Module | None:
    """The first layer of ``net``, in module order, that may take the model's input: a
    BatchEnsemble layer, a torch convolution or Linear (a BatchEnsemble layer's own inner
    layers come after it). Not one inside an ``nn.MultiheadAttention`` (or another module that
    reads its layers' weights as tensors), never called: its ``out_proj`` registered before
    the network's first layer made that layer a later one."""
    from pyrouq.convert._select import weight_readers  # (pyrouq.convert imports the engine)

    readers, stack = weight_readers(), [net]
    while stack:
        module = stack.pop()
        if isinstance(module, readers):
            continue
        if getattr(module, "_is_batchensemble", False) or isinstance(
            module, (nn.Linear, nn.modules.conv._ConvNd)
        ):
            return module
        stack.extend(reversed(list(module.children())))
    return None


def _name_failing_layer(
    net: nn.Module, error: RuntimeError, traceback: Any, x: Any = None, plain: bool = False
) -> None:
    """Add to torch's words on inputs a layer of ``net`` does not take (shapes, channels,
    dtypes: :func:`~pyrouq._mismatch.input_mismatch`) the layer that raised them, by its class,
    settings and paths in the model: torch's ``expected input[4, 2, 10, 10] to have 3
    channels`` named none, for a network of several such layers. The layer is the innermost
    module of ``net`` running where the error was raised (a block of the user's own whose
    forward failed outside its layers; a per-member norm's copy counts as the user's layer it
    copies; a layer given as the network is ``net`` itself); nothing is added for ``net``'s own
    forward, nor to an error pyrouq worded, nor twice (nested runs). ``plain``: as
    :class:`LayersNamed`'s. Where that layer is given the model's input ``x`` as it came, of other
    channels or features than it takes, what to do follows (:func:`_input_fix`). Its type and
    traceback stay torch's."""
    args = error.args
    if layer_added(error) or len(args) != 1 or not isinstance(args[0], str):
        return
    try:
        norm = instance_norm_words(error)  # (a ValueError: only an InstanceNorm's is named)
        if not norm and not input_mismatch(error):
            return
        layer, _ = _innermost(net, traceback)
        if layer is None or not (where := _where(net, layer, plain)):
            return
        if getattr(layer, "_is_member_norm", False):  # the copies' class and settings
            layer = layer.get_submodule("norms.0")
        if norm and not isinstance(layer, nn.modules.instancenorm._InstanceNorm):
            return
        try:
            settings = layer.extra_repr()
        except Exception:  # (a subclass's own extra_repr failing: its settings unsaid)
            settings = "..."
        label = f"{class_name(layer)}({settings})"
        fix = _input_fix(net, layer, x, traceback)
    except Exception:  # (the error as it came)
        return
    words = args[0].rstrip()  # (an InstanceNorm's ends with a full stop)
    named = f"{words.removesuffix('.') if norm else words} (in {label} {where})"
    layer_named(error, f"{named}: {fix}" if fix else named, told=fix is not None)


def _input_fix(net: nn.Module, layer: nn.Module, x: Any, traceback: Any) -> str | None:
    """What to do where a convolution or Linear of torch's (a converted Bayesian network's),
    refusing its input, was given the model's input ``x`` as it came, of other channels or
    features than it takes (as a BatchEnsemble layer says it:
    :func:`~pyrouq._first_layer_fix.input_fix`); None for other layers and inputs."""
    if not torch.is_tensor(x):
        return None
    if isinstance(layer, nn.modules.conv._ConvNd):
        dim, size = 1, layer.in_channels
        if x.dim() != len(layer.kernel_size) + 2:  # (an unbatched image: torch's words)
            return None
    elif isinstance(layer, nn.Linear):
        dim, size = -1, layer.in_features
    else:
        return None
    if x.dim() < 2 or x.shape[dim] == size or not _took_input(net, layer, x, traceback):
        return None
    return input_fix(x, dim, size, getattr(layer, "groups", 1))


def _innermost(net: nn.Module, traceback: Any) -> tuple[nn.Module | None, tuple[Any, ...]]:
    """The innermost module of ``net`` running where the error of ``traceback`` was raised,
    and the inputs it was called with. A per-member norm (``batchensemble(...,
    norms="per_member")``) counts as the innermost, not its copy for one member: the layer of
    the user's that it copies, at that layer's path (not ``'net.1.norms.0'``)."""
    modules = {id(module) for module in net.modules()}
    layer, inputs = None, ()
    while traceback is not None:  # outermost to innermost frame
        frame = traceback.tb_frame
        if frame.f_code.co_name == "_call_impl":  # (nn.Module.__call__'s)
            module = frame.f_locals.get("self")
            if id(module) in modules and not getattr(layer, "_is_member_norm", False):
                layer, inputs = module, frame.f_locals.get("args", ())
        traceback = traceback.tb_next
    return layer, inputs


def _name_failing_embedding(
    net: nn.Module, error: IndexError, traceback: Any, plain: bool = False
) -> None:
    """Add to torch's bare ``index out of range in self`` of an ``nn.Embedding`` given ids
    outside its table (a token unseen when the vocabulary was built, a padding id of V) the
    layer, the ids it took and what to do. Its type and traceback stay torch's."""
    if layer_added(error) or error.args != ("index out of range in self",):
        return
    try:
        layer, inputs = _innermost(net, traceback)
        if not isinstance(layer, nn.Embedding) or not (where := _where(net, layer, plain)):
            return
        size = layer.num_embeddings
        ids = inputs[0] if inputs and torch.is_tensor(inputs[0]) else None
        took = "" if ids is None else f" (ids from {int(ids.min())} to {int(ids.max())})"
        label = f"{class_name(layer)}({layer.extra_repr()})"
    except Exception:  # (the error as it came)
        return
    layer_named(
        error,
        f"index out of range in self: {label} {where} has rows for ids 0 to "
        f"{size - 1}, and its input held others{took}. Map ids outside the vocabulary to one "
        f"in [0, {size}) (an unknown-token id), or build the embedding with num_embeddings "
        "above the largest id.",
    )
