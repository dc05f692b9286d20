"""The converters' copy of the user's network (they convert a copy and leave the network as it
is), and what they say of one that cannot be copied."""

from __future__ import annotations

import copy

from torch import Tensor, nn

from pyrouq._util import class_name
from pyrouq.convert._hints import names_list
from pyrouq.convert._sites import _tensors_in

__all__ = ["computed_tensors", "copy_network", "detach_computed", "hook_fix", "weight_hooks"]


def copy_network(module: nn.Module, what: str) -> nn.Module:
    """A deep copy of the user's ``module`` (converting never changes it), or a clear error
    for one that cannot be copied: ``copy.deepcopy`` refuses a tensor computed from others
    with gradients (a non-leaf tensor), which torch's legacy ``weight_norm`` /
    ``spectral_norm`` and ``torch.nn.utils.prune`` keep as the weight, and which a network
    of one's own may hold in an attribute (a value a forward with gradients cached, one
    computed from the parameters in ``__init__``)."""
    try:
        return copy.deepcopy(module)
    except RuntimeError as err:
        if "deepcopy protocol" not in str(err):
            raise
        hooked = weight_hooks(module)
        held = computed_tensors(module)
        if held and not hooked:
            what_held = "holds a tensor" if len(held) == 1 else "hold tensors"
            raise ValueError(
                f"{class_name(module)} cannot be copied, so pyrouq cannot {what} (it converts "
                f"a copy and leaves your network as it is): {names_list(held, 4)} "
                f"{what_held} computed from others with gradients (non-leaf: a value a forward "
                "cached, or one computed from the parameters in __init__), which "
                "copy.deepcopy refuses. Hold such a value detached (self.cache = "
                "value.detach()), compute it in forward, or delete it before converting."
            ) from None
        why = (
            f"{hooked[0][0]!r} is {hooked[0][1]}"
            if hooked
            else "a tensor in it was computed, "
            "not created, as torch.nn.utils.prune and the legacy weight_norm do"
        )
        raise ValueError(
            f"{class_name(module)} cannot be copied, so pyrouq cannot {what} (it converts "
            f"a copy and leaves your network as it is): {why}, and its hook keeps the weight "
            f"as a computed tensor. {hook_fix(hooked)}"
        ) from None


def computed_tensors(module: nn.Module) -> list[str]:
    """The dotted names of the attributes of ``module`` (nested modules included) that hold a
    non-leaf tensor, alone or in a list, tuple, set or dict: what ``copy.deepcopy`` refuses."""
    found = []
    for path, owner in module.named_modules():
        for attr, value in vars(owner).items():
            if attr in ("_parameters", "_modules"):
                continue
            if attr == "_buffers":  # a buffer under its own name
                items = [(name, b) for name, b in value.items() if b is not None]
            else:
                items = [(attr, t) for t in _tensors_in(value)]
            for name, tensor in items:
                if isinstance(tensor, Tensor) and tensor.grad_fn is not None:
                    found.append(f"{path}.{name}" if path else name)
    return list(dict.fromkeys(found))


def detach_computed(net: nn.Module) -> None:
    """Detach the non-leaf tensors that the modules of ``net`` (a converted model's own copy)
    hold, which ``copy.deepcopy`` refuses: the weight a hook of torch.nn.utils.prune or of
    the legacy weight_norm / spectral_norm last computed, and a value a forward with gradients
    cached (``self.last = h``, alone or in a list, tuple or dict, as attention maps kept for a
    plot are). The next forward computes them anew; a graph built from them is not touched."""
    for owner in net.modules():
        for name, buffer in owner._buffers.items():
            if buffer is not None and buffer.grad_fn is not None:
                owner._buffers[name] = buffer.detach()
        for attr, value in list(vars(owner).items()):
            if attr not in ("_parameters", "_buffers", "_modules"):
                detached = _detached(value)
                if detached is not value:
                    setattr(owner, attr, detached)


def _detached(value: object, depth: int = 3) -> object:
    """``value`` with its non-leaf tensors detached: a tensor's detached view, a list or dict
    changed in place (the module may hold it elsewhere too), a tuple rebuilt; nested up to
    ``depth``."""
    if isinstance(value, Tensor):
        return value.detach() if value.grad_fn is not None else value
    if depth == 0:
        return value
    if isinstance(value, (list, dict)):
        keys = range(len(value)) if isinstance(value, list) else list(value)
        for key in keys:
            item = value[key]  # type: ignore[index]
            new = _detached(item, depth - 1)
            if new is not item:
                value[key] = new  # type: ignore[index]
    elif type(value) is tuple:
        items = tuple(_detached(item, depth - 1) for item in value)
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    return value


def hook_fix(hooked: list[tuple[str, str]]) -> str:
    """What to do about the layers :func:`weight_hooks` found (all fixes when none is)."""
    pruned = any("prune" in what for _, what in hooked) or not hooked
    legacy = any("legacy" in what for _, what in hooked) or not hooked
    fixes = []
    if pruned:
        fixes.append("make the pruning permanent first, torch.nn.utils.prune.remove(layer, name)")
    if legacy:
        fixes.append(
            "use torch.nn.utils.parametrizations.weight_norm / spectral_norm instead of the "
            "legacy torch.nn.utils.weight_norm / spectral_norm"
        )
    text = "; ".join(fixes)
    return text[0].upper() + text[1:] + "."


def weight_hooks(module: nn.Module) -> list[tuple[str, str]]:
    """``(layer name, what)`` for every layer whose weight a forward pre-hook recomputes from
    other tensors: torch.nn.utils.prune (``weight_orig * weight_mask``) and the legacy
    ``weight_norm`` / ``spectral_norm``."""
    from torch.nn.utils import prune
    from torch.nn.utils.spectral_norm import SpectralNorm
    from torch.nn.utils.weight_norm import WeightNorm

    kinds = (
        (prune.BasePruningMethod, "pruned by torch.nn.utils.prune"),
        (WeightNorm, "under the legacy torch.nn.utils.weight_norm"),
        (SpectralNorm, "under the legacy torch.nn.utils.spectral_norm"),
    )
    found = []
    for name, layer in module.named_modules():
        for hook in layer._forward_pre_hooks.values():
            what = next((text for kind, text in kinds if isinstance(hook, kind)), None)
            if what is not None:
                found.append((name, what))
    return found
