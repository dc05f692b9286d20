"""What a network's input that is not a tensor is told: :func:`input_hint` (a layer's and a
network's words for an array or a list), :func:`not_a_tensor` (the whole refusal of
:func:`pyrouq._util.model_input` and of the plain networks' forward: a network runs on one
tensor input), :func:`several_inputs` (what fit() and predict() say of an ``(x, y)`` batch whose
x is several tensors or a dict of them) and :data:`WRAPPER`, the module to write around a
network of several inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pyrouq._numbers import is_array_like

__all__ = ["WRAPPER", "input_hint", "not_a_tensor", "several_inputs"]

WRAPPER = "a small nn.Module whose forward takes one tensor and builds {what} from it"
"""The wrapper every refusal of a network's several inputs (a dict, several tensors) tells to
write, ``{what}`` the inputs it builds."""

_WRAP = f"wrap the network in {WRAPPER}, and convert that wrapper (e.g. bayesian(Wrapped(net)))"


def input_hint(x: Any) -> str:
    """What to do about a network's input ``x`` that is not a tensor: torch.as_tensor for an
    array or a list of numbers, which it converts; not for a loader's ``[x, y]`` batch (a list
    of tensors, which it cannot convert), nor for None, a dict or a loader."""
    if isinstance(x, (list, tuple)) and any(torch.is_tensor(item) for item in x):
        return (
            " of tensors: for a loader's (x, y) batch, pass x alone (x, y = batch); for one "
            "tensor per input, torch.stack(...) them"
        )
    return "; convert it with torch.as_tensor(x)" if is_array_like(x) else ""


def not_a_tensor(x: Any, name: str) -> str:
    """``name``'s refusal of the input ``x`` that is not a tensor: what it expects (one tensor,
    a batch of inputs), what came, and what to do for each kind that comes: a dict or several
    tensors (a network of several inputs: wrap it), an array (torch.as_tensor), None."""
    came = f"{name} expects a torch.Tensor input, got {type(x).__name__}"
    if isinstance(x, dict):
        return (
            f"{came}: pyrouq runs networks of one tensor input (a batch of shape (B, ...)). "
            f"For a network whose forward takes a dict, {_WRAP.format(what='the dict')}."
        )
    hint = input_hint(x)
    if hint.startswith(" of tensors"):
        return (
            f"{came}{hint}. pyrouq runs networks of one tensor input: for a network whose "
            f"forward takes several tensors, {_WRAP.format(what='them')}."
        )
    if hint:
        return f"{came}{hint}."
    if x is None:
        return f"{came}: pass the batch of inputs, one tensor of shape (B, ...), not None."
    return f"{came}: pass the batch of inputs as one tensor of shape (B, ...)."


def several_inputs(x: Any, y: Any) -> str | None:
    """What an ``(x, y)`` batch is whose ``x`` is several tensors (or one in a tuple or list)
    or a dict of them, and what to serve instead, as ``"(dict of 2 entries, Tensor), and
    pyrouq runs ..."`` (fit() and predict() put their words before it); None for other
    batches."""
    if isinstance(x, (tuple, list)) and len(x) == 1 and torch.is_tensor(x[0]):
        return (  # one input in a tuple: no other inputs to compute or concatenate
            f"({type(x).__name__} of 1 tensor, {type(y).__name__}): the input tensor inside "
            f"a {type(x).__name__}, and pyrouq runs the network on the tensor itself. Serve "
            "it as x, not inside a tuple or list (x[0])."
        )
    if isinstance(x, (tuple, list)) and x and all(torch.is_tensor(t) for t in x):
        return (  # several inputs: (ids, padding mask), (features, lengths)
            f"({type(x).__name__} of {len(x)} tensors, {type(y).__name__}), and pyrouq runs "
            "the network on one input tensor x. Serve one tensor: compute the other inputs "
            "from x in forward (a padding mask: x == pad_id), or concatenate them into x and "
            "split it there."
        )
    if not isinstance(x, Mapping):
        return None
    # a network of named inputs, {"input_ids": ..., "attention_mask": ...}, whatever y is
    targets = "" if torch.is_tensor(y) else ", and y as one tensor of targets"
    came = f"{type(y).__name__} of {_entries(y)}" if isinstance(y, Mapping) else None
    return (
        f"({type(x).__name__} of {_entries(x)}, {came or type(y).__name__}), and pyrouq "
        f"runs the network on one input tensor x. Wrap the network in "
        f"{WRAPPER.format(what='the dict')}, convert that wrapper, and serve that tensor as "
        f"x{targets}."
    )


def _entries(mapping: Mapping) -> str:
    """ "1 entry", "2 entries"."""
    return f"{len(mapping)} {'entry' if len(mapping) == 1 else 'entries'}"
