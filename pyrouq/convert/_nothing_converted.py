"""Why ``batchensemble()`` found no layer to convert: the message that names the cause and
what to do."""

from __future__ import annotations

from torch import nn

from pyrouq.convert._conversion_warnings import made_layers
from pyrouq.convert._select import _names_list, computes_its_own_way, weight_readers
from pyrouq.nn._batchensemble import BATCHENSEMBLE_LAYERS


def nothing_converted(net: nn.Module, name: str) -> str:
    """Why ``net`` (``name``: its class) got no BatchEnsemble layer: its layers are
    BatchEnsemble layers already (a BatchEnsemble's own network), it has no Linear or
    convolution, or all it has are kept plain (read as tensors by attention, or subclasses
    computing their own way), which the message names, with what to do."""
    converted = [p for p, m in net.named_modules() if getattr(m, "_is_batchensemble", False)]
    if converted:  # (of this size: another one is refused before)
        which = (
            "it is a BatchEnsemble layer itself"
            if converted == [""]
            else f"its layers {_names_list(converted, 4)} are BatchEnsemble layers already"
        )
        return (
            f"{name} has no plain nn.Linear or convolution layer to turn into {made_layers()}: "
            f"{which} (the network of a BatchEnsemble, ensemble.net, or a part of it). "
            "Pass the original plain network the ensemble was made from (batchensemble(net, "
            "M) and rank1(net, M) convert a copy and leave it as it was); to make an "
            "existing BatchEnsemble's factors latent, use pyrouq.bayesian(ensemble)."
        )
    layers = tuple(BATCHENSEMBLE_LAYERS)
    inside = [p for p, m in net.named_modules() if isinstance(m, weight_readers())]
    read = [
        p
        for p, m in net.named_modules()
        if isinstance(m, layers) and any(p.startswith(f"{q}.") for q in inside)
    ]
    own = [
        f"{p!r} ({type(m).__name__})"
        for p, m in net.named_modules()
        if isinstance(m, layers) and p not in read and computes_its_own_way(m)
    ]
    if not read and not own:
        return (
            f"{name} has no nn.Linear or convolution layer to turn into {made_layers()}. "
            "Pass a network with such layers."
        )
    why = []
    if read:
        why.append(
            f"{_names_list(read, 4)} inside a module that reads its layers' weights as tensors "
            "(nn.MultiheadAttention, Swin attention), kept shared"
        )
    if own:
        why.append(
            f"{', '.join(own[:4])}: subclasses with a forward of their own, which a "
            "BatchEnsemble layer would drop, kept as they are"
        )
    return (
        f"{name} has no nn.Linear or convolution layer a BatchEnsemble can convert, so its "
        f"members would all be one network; its layers are {'; '.join(why)}. Give the "
        "network a plain nn.Linear / convolution that its forward calls (a head, or the "
        "subclass's extra computation moved outside the layer), or use pyrouq.bayesian(net)."
    )
