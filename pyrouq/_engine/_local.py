"""Local reparameterisation: one draw of a network's outputs in which the Linear and Conv
layers draw their pre-activations (:func:`run_local`), one noise per output and example, instead
of a weight shared by the batch."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pyrouq._engine._batch import check_outputs, kept_buffers, put_back
from pyrouq._engine._layer_calls import call, noise_scale, tensor_reads
from pyrouq._util import AsItCame, rng_state, set_rng_state

LOCAL_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""Layers whose pre-activations :func:`run_local` draws directly."""


def _apply(module: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if isinstance(module, nn.Linear):
        return F.linear(x, weight, bias)
    return module._conv_forward(x, weight, bias)  # type: ignore[operator, no-any-return]


def local_moments(
    module: nn.Module,
    x: Tensor,
    weight_loc: Tensor,
    weight_scale: Tensor,
    bias_loc: Tensor | None,
    bias_scale: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """Mean and variance of a Linear / Conv layer's outputs when its weight and bias are
    independent ``Normal(loc, scale)``: ``layer(x; loc)`` and ``layer(x^2; scale^2)``."""
    mean = _apply(module, x, weight_loc, bias_loc)
    var = _apply(
        module, x.square(), weight_scale.square(), None if bias_scale is None else bias_scale**2
    )
    return mean, var


@contextlib.contextmanager
def _local_forwards(
    net: nn.Module,
    layers: Mapping[str, tuple[str, str | None]],
    loc: Mapping[str, Tensor],
    scale: Mapping[str, Tensor],
    calls: dict[str, list[int]],
) -> Iterator[None]:
    """While active, each layer of ``layers`` (path -> (weight site, bias site)) draws its
    pre-activations ``mean + sqrt(var) * eps`` instead of applying a weight; ``calls[path]``
    gets the number of dims of each call's input."""
    patched = []
    try:
        for path, (w, b) in layers.items():
            module = net.get_submodule(path)

            def forward(
                h: Tensor, module: nn.Module = module, w: str = w, b: Any = b, path: str = path
            ) -> Tensor:
                calls[path].append(h.dim())
                mean, var = local_moments(
                    module,
                    h,
                    loc[w],
                    scale[w],
                    loc.get(b) if b else None,
                    scale.get(b) if b else None,
                )
                return torch.addcmul(mean, noise_scale(var), torch.randn_like(mean))

            module.forward = forward  # type: ignore[method-assign]
            patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward


_DRAWN_WHOLE: weakref.WeakKeyDictionary[nn.Module, frozenset[str]] = weakref.WeakKeyDictionary()
"""Per network, the layers local reparameterisation found it cannot draw by their
pre-activations (:func:`_drawn_whole`), drawn whole from then on."""


def _drawn_whole(net: nn.Module, calls: Mapping[str, list[int]]) -> set[str]:
    """The layers whose pre-activations are not one draw of the loss's: called more than once
    a forward (a shared weight would get independent noise at each call), never (its weight
    read as a tensor, e.g. ``F.linear(h, self.fc.weight)``, would find none), or a Linear on
    inputs of more than two dims (every token its own noise); :func:`run_local` adds those
    whose weight the first forward also reads as a tensor (:func:`tensor_reads`)."""
    return {
        path
        for path, dims in calls.items()
        if len(dims) != 1 or (dims[0] > 2 and isinstance(net.get_submodule(path), nn.Linear))
    }


def run_local(
    net: nn.Module,
    x: Tensor,
    loc: Mapping[str, Tensor],
    scale: Mapping[str, Tensor],
    layers: Mapping[str, tuple[str, str | None]],
    num_draws: int | None = None,
) -> Tensor:
    """One draw of the outputs by local reparameterisation (``(num_draws, B, D)`` with
    ``num_draws``): the ``layers`` draw their pre-activations, one noise per output and
    example; every other site's weight is drawn whole, ``loc + scale * eps``, as are the
    layers a forward shows cannot be drawn by their pre-activations (:func:`_drawn_whole`: the
    first forward that finds one is run again without it, from the random state, input and
    buffers (running statistics, a network's own counters) it found, and the network
    remembers it)."""

    checked = net in _DRAWN_WHOLE  # a forward has shown which layers it can draw
    # x as it came to every draw, and, until a forward has shown the layers, to one run again
    given = AsItCame(x, (num_draws or 1) + (0 if checked else 1))

    def once() -> Tensor:
        # what a forward run again must find as it was: the random state (a resumed run finds
        # its layers again, and must draw as the run that found them before) and the buffers
        # the first run may move: running statistics, and any the network's own forward
        # changes (a counter, a moving average of its activations); not the latent sites'
        # (a pattern that shows only later is found without)
        first = net not in _DRAWN_WHOLE
        state = rng_state(x.device) if first else None
        kept = kept_buffers(net, loc.keys()) if first else []
        while True:
            whole = _DRAWN_WHOLE.get(net, frozenset())
            local = {path: sites for path, sites in layers.items() if path not in whole}
            covered = {s for pair in local.values() for s in pair if s is not None}
            weights = {
                s: torch.addcmul(loc[s], scale[s], torch.randn_like(loc[s]))
                for s in loc
                if s not in covered
            }
            calls: dict[str, list[int]] = {path: [] for path in local}
            watched = {id(net.get_buffer(s)): s for s in covered} if first else {}
            with _local_forwards(net, local, loc, scale, calls), tensor_reads(watched) as read:
                out = check_outputs(call(net, weights, given()), net, x.shape[0])
            found = _drawn_whole(net, calls) | {p for p, two in local.items() if read & set(two)}
            _DRAWN_WHOLE[net] = whole | found
            if not found:
                return out
            if state is not None:
                set_rng_state(x.device, state)
            put_back(kept)

    if num_draws is None:
        return once()
    return torch.stack([once() for _ in range(num_draws)])
