"""The training mode fit() trains a model in, and the warning where a later fit() trains the
layers a run before kept frozen.

fit() trains a model in training mode with the modes its submodules have (a BatchNorm put in
eval mode stays frozen), and a model in eval mode in training mode throughout; it leaves the
model in eval mode. A second fit() of a model with a frozen layer then trains that layer (its
running statistics move) unless ``model.train()``, then ``layer.eval()``, came before it. The
layers each run kept in eval mode are remembered per model (weakly: nothing is added to the
model, nor kept alive), and a run that switches them to training mode warns of it.
"""

from __future__ import annotations

import weakref

from torch import nn

from pyrouq._util import warn_caller
from pyrouq._wrappers import held_name, held_paths

__all__ = ["train_for_fit"]

#: Per model, the names of the submodules its last fit() trained in eval mode.
_FROZEN: weakref.WeakKeyDictionary[nn.Module, tuple[str, ...]] = weakref.WeakKeyDictionary()


def train_for_fit(model: nn.Module, held: nn.Module | None = None) -> None:
    """Put ``model`` in the modes fit() trains it in (training mode throughout, for a model in
    eval mode), warning where that trains layers its last fit() kept in eval mode; the warning
    names them as ``held``, the wrapper fit() was given around ``model`` (DataParallel's
    ``'module.net.1'``), if any."""
    if not model.training:
        named = dict(model.named_modules())
        thawed = [name for name in _FROZEN.get(model, ()) if name in named]
        if thawed and not any(module.training for module in named.values()):
            _warn_of_thawed(model if held is None else held, model, thawed)
        model.train()
    _FROZEN[model] = tuple(name for name, m in model.named_modules() if not m.training)


def _warn_of_thawed(held: nn.Module, model: nn.Module, names: list[str]) -> None:
    paths = held_paths(held, model)
    names = [paths[name] for name in names]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    layer = f"model.get_submodule('{names[0]}').eval()" if names[0] else "model.eval()"
    warn_caller(
        f"fit() trains {held_name(held)}, in eval mode (as the last fit() left it), in "
        f"training mode throughout, and with it {shown}, which the last fit() trained in eval "
        "mode (frozen): they train now (a BatchNorm's running statistics move). To keep them "
        f"frozen, call model.train(), then .eval() on each (here {layer}), before fit(); to "
        "train them, call model.train() before fit()."
    )
