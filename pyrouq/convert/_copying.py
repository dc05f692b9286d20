"""The converters' copy of the user's network (they convert a copy and leave the network as it
is), what they say of one that cannot be copied, and the copy of a converted model whose
network cached a computed tensor (:func:`detached_memo`), or its cached tensors detached while
it is sent to another process (:func:`computed_detached`)."""

from __future__ import annotations

import contextlib
import copy
import keyword
from collections.abc import Iterator
from typing import Any, TypeVar

from torch import Tensor, nn

from pyrouq._param_store import copy_renamed, hold_restored, set_supermodule, shared_copy
from pyrouq._util import class_name
from pyrouq._words import article
from pyrouq.convert._hints import names_list
from pyrouq.convert._sites import _tensors_in

__all__ = [
    "computed_detached",
    "computed_tensors",
    "copy_network",
    "detached_memo",
    "hook_fix",
    "uncopyable",
    "weight_hooks",
]


def copy_network(module: nn.Module, what: str) -> nn.Module:
    """A deep copy of the user's ``module`` (converting never changes it), or a clear error
    for one that cannot be copied: ``copy.deepcopy`` refuses a tensor computed from others
    with gradients (a non-leaf tensor), which torch's legacy ``weight_norm`` /
    ``spectral_norm`` and ``torch.nn.utils.prune`` keep as the weight, and which a network
    of one's own may hold in an attribute (a value a forward with gradients cached, one
    computed from the parameters in ``__init__``)."""
    try:
        return copy.deepcopy(module)
    except TypeError as err:  # "cannot pickle 'generator' object": an attribute's
        refused = uncopyable(module)
        if not refused:
            raise
        kinds = list(dict.fromkeys(kind for _, kind in refused))  # (as the names go)
        holds = (
            f"holds {article(kinds[0])} {kinds[0]} object"
            if len(refused) == 1
            else f"hold {' / '.join(kinds)} objects"
        )
        raise TypeError(
            f"{class_name(module)} cannot be copied, so pyrouq cannot {what} (it converts a "
            f"copy and leaves your network as it is): {names_list([n for n, _ in refused], 4)} "
            f"{holds}, which copy.deepcopy refuses ({err}). Make such a value in forward, or "
            f"delete it before converting ({_deletion(module, refused[0][0])}), or hold it in a "
            "form that copies"
            + (" (a generator's values as a list, list(gen))" if "generator" in kinds else "")
            + "."
        ) from None
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


def _deletion(module: nn.Module, path: str) -> str:
    """The Python that deletes the attribute at the dotted ``path`` of ``module`` (``net``),
    reaching each submodule as its container is indexed: a Sequential's or ModuleList's index
    as ``[0]`` (``del net[0].noise``; ``net.0.noise`` is no Python), a ModuleDict's key as
    ``["0"]`` or ``["a-b"]`` (whatever its form), a name no attribute syntax takes (``"a-b"``,
    ``"class"``) by ``getattr`` / ``delattr``."""
    *parents, attr = path.split(".")
    reached, owner = "net", module
    for part in parents:
        if isinstance(owner, nn.ModuleDict):
            reached += f"[{part!r}]"
        elif isinstance(owner, (nn.Sequential, nn.ModuleList)) and part.isdigit():
            reached += f"[{part}]"
        elif _plain(part):
            reached += f".{part}"
        else:
            reached = f"getattr({reached}, {part!r})"
        owner = owner._modules[part]  # type: ignore[assignment]
    return f"del {reached}.{attr}" if _plain(attr) else f"delattr({reached}, {attr!r})"


def _plain(name: str) -> bool:
    """Whether ``name`` can follow a dot in Python (an identifier, not a keyword)."""
    return name.isidentifier() and not keyword.iskeyword(name)


def uncopyable(module: nn.Module) -> list[tuple[str, str]]:
    """``(dotted attribute name, type name)`` of the plain attributes of the modules of
    ``module`` (not their parameters, buffers or submodules) that ``copy.deepcopy`` refuses
    with a TypeError: a generator object, a lock, an open file."""
    found = []
    for path, owner in module.named_modules():
        for attr, value in vars(owner).items():
            if attr in ("_parameters", "_buffers", "_modules"):
                continue
            try:
                copy.deepcopy(value)
            except TypeError:
                found.append((f"{path}.{attr}" if path else attr, type(value).__name__))
            except Exception:  # (refused otherwise: not what is asked)
                continue
    return found


def computed_tensors(module: nn.Module) -> list[str]:
    """The dotted names of the attributes of ``module`` (nested modules included) that hold a
    non-leaf tensor, alone or in a list, tuple, set or dict: what ``copy.deepcopy`` refuses."""
    return list(dict.fromkeys(name for _, _, name, _ in _computed(module)))


def detached_memo(module: nn.Module, memo: dict[int, Any] | None = None) -> dict[int, Any]:
    """``memo`` (a new one if None) for ``copy.deepcopy(module, memo)``, given a detached copy
    of every non-leaf tensor that the modules of ``module`` hold, which ``copy.deepcopy``
    refuses: the weight a hook of torch.nn.utils.prune or of the legacy weight_norm /
    spectral_norm last computed, and a value a forward with gradients cached (``self.last =
    h``, alone or in a list, tuple, namedtuple, set or dict, nested, as attention maps kept for
    a plot are). The copy holds their values, detached; ``module`` is not changed (a graph
    built from them, a loss read after the copy, still backpropagates)."""
    memo = {} if memo is None else memo
    for _, _, _, tensor in _computed(module):
        if id(tensor) not in memo:
            memo[id(tensor)] = tensor.detach().clone()
            memo.setdefault(id(memo), []).append(tensor)  # (as copy keeps memo's keys alive)
    return memo


def _computed(module: nn.Module) -> Iterator[tuple[dict[str, Any], str, str, Tensor]]:
    """``(holder, key, dotted attribute name, tensor)`` for every non-leaf tensor the modules
    of ``module`` hold: in a buffer (``holder`` the module's ``_buffers``), or in an attribute
    (``holder`` its ``__dict__``), alone or in the containers :func:`_tensors_in` looks into
    (``holder[key]`` the container)."""
    for path, owner in module.named_modules():
        for attr, value in vars(owner).items():
            if attr in ("_parameters", "_modules"):
                continue
            if attr == "_buffers":  # a buffer under its own name
                holder = value
                items = [(name, b) for name, b in value.items() if b is not None]
            else:
                holder = vars(owner)
                items = [(attr, t) for t in _tensors_in(value)]
            for name, tensor in items:
                if isinstance(tensor, Tensor) and tensor.grad_fn is not None:
                    yield holder, name, (f"{path}.{name}" if path else name), tensor


@contextlib.contextmanager
def computed_detached(module: nn.Module) -> Iterator[None]:
    """``module`` holding a detached copy of every non-leaf tensor :func:`detached_memo` finds
    in it (in a buffer, an attribute, a container of any nesting) while the block runs, then
    its own tensors again, graphs and all: what torch's process pickler takes, which refuses a
    non-leaf tensor ("Cowardly refusing to serialize ..."), where a deep copy of a converted
    model would be a new model in Pyro's param store. A container is replaced by a copy of
    its own containers, everything else in it (modules, leaf tensors) the same objects."""
    memo = detached_memo(module)
    swapped: dict[tuple[int, str], tuple[dict[str, Any], str, Any]] = {}
    for holder, key, _, _ in _computed(module):
        if (id(holder), key) not in swapped:
            swapped[id(holder), key] = holder, key, holder[key]
            _keep_leaves(holder[key], memo, set())
    try:
        for holder, key, value in swapped.values():
            holder[key] = copy.deepcopy(value, memo)
        yield
    finally:
        for holder, key, value in swapped.values():
            holder[key] = value


def _keep_leaves(value: object, memo: dict[int, Any], seen: set[int]) -> None:
    """Put in ``memo`` everything in the containers of ``value`` (as :func:`_tensors_in` sees
    them, dict keys too) that is no container, as itself, unless memo maps it already: a
    ``copy.deepcopy(value, memo)`` copies the containers alone."""
    if not isinstance(value, (list, tuple, set, frozenset, dict)):
        memo.setdefault(id(value), value)
        return
    if id(value) in seen:
        return
    seen.add(id(value))
    for item in [*value.keys(), *value.values()] if isinstance(value, dict) else value:
        _keep_leaves(item, memo, seen)


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


_Named = TypeVar("_Named", bound="NamedInStore")


class NamedInStore:
    """How a pyrouq model (``BayesianNetwork``, ``BatchEnsembleNetwork``) is named in Pyro's
    param store when it is nested, copied or unpickled: nested in a user's ``PyroModule``, under
    Pyro's name for it; a ``copy.copy``, sharing the original's name and tensors; a
    ``copy.deepcopy``, as ``<name>_copy<k>`` with the values a forward cached detached; an
    unpickled one, under the original's name unless a live model holds it."""

    _pyro_set_supermodule = set_supermodule  # nested: Pyro's name for it held

    def __copy__(self: _Named) -> _Named:
        """A shallow copy: the same modules and tensors, under the same name in Pyro's store."""
        return shared_copy(self)  # type: ignore[type-var]

    def __deepcopy__(self: _Named, memo: dict[int, Any]) -> _Named:
        """An independent copy, named ``<name>_copy<k>`` in Pyro's param store."""
        memo = detached_memo(self, memo)  # type: ignore[arg-type]  # (a cached value: detached)
        return copy_renamed(self, memo)  # type: ignore[type-var]

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        # unpickled or deep-copied: the original's name, unless a live model holds it
        hold_restored(self, self._pyro_name)  # type: ignore[attr-defined]
