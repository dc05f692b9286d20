"""The record of a module's structure that a checkpoint keeps (:func:`module_record`)."""

from __future__ import annotations

import numbers
from typing import Any

from torch import nn

from pyrouq._util import class_name
from pyrouq.convert._sites import tied_names

__all__ = ["LAYER_SETTINGS", "module_record"]


def module_record(module: nn.Module) -> dict[str, Any]:
    """The structure of ``module`` (class, the class name of every submodule, the settings of
    torch's layers, parameter and buffer names and shapes), which a checkpoint keeps to check
    the skeleton it is loaded into. The settings are those that change what the saved weights
    compute (:data:`LAYER_SETTINGS`: a convolution's stride and padding, a BatchNorm's eps, an
    activation's slope); modules of other libraries and the user's own are not read. A
    module with tied parameters (one tensor under several names) also has ``"tied"``:
    ``{other name: first name}``, which tells a skeleton tied otherwise (the same first
    names, another tensor read under one of them) from the saved one."""
    cls = type(module)
    settings = {n: _settings_of(m) for n, m in module.named_modules()}
    record = {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "modules": {n: type(m).__name__ for n, m in module.named_modules()},
        "settings": {n: values for n, values in settings.items() if values},
        "parameters": {n: list(p.shape) for n, p in module.named_parameters()},
        "buffers": {n: list(b.shape) for n, b in module.named_buffers()},
    }
    tied = tied_names(module)
    if tied:  # (absent otherwise: an untied module's record is as it always was)
        record["tied"] = tied
    return record


LAYER_SETTINGS = (
    "kernel_size", "stride", "padding", "dilation", "groups", "padding_mode", "output_padding",
    "eps", "affine", "track_running_stats", "normalized_shape", "elementwise_affine",
    "num_groups", "negative_slope", "alpha", "lambd", "beta", "threshold", "value",
    "approximate", "min_val", "max_val", "lower", "upper", "dim", "start_dim", "end_dim",
    "unflattened_size", "ceil_mode", "count_include_pad", "divisor_override", "return_indices",
    "output_size", "norm_type", "size", "k", "upscale_factor", "downscale_factor",
    "scale_factor", "mode", "align_corners", "max_norm", "batch_first", "num_heads",
    "norm_first", "bidirectional", "nonlinearity", "activation_relu_or_gelu", "add_zero_attn",
    "padding_idx", "include_last_offset", "output_ratio", "p", "norm", "keepdim",
)  # fmt: skip
"""Attributes of torch's layers that :func:`module_record` keeps: those that change the function
the saved weights compute (not training-only ones such as BatchNorm's momentum, nor dropout's
p, which is read for other layers: a distance's norm)."""


#: Settings a pooling layer or convolution takes as one number for every spatial dim.
_PER_DIM = ("kernel_size", "stride", "padding", "dilation", "output_size", "output_padding")


def _settings_of(module: nn.Module) -> dict[str, Any]:
    """The :data:`LAYER_SETTINGS` a torch layer has, as JSON values: numbers as Python's
    (numpy's too), tuples as lists, and a pooling layer's one number for every spatial dim
    spelled out (``MaxPool2d(2)`` is ``MaxPool2d((2, 2))``)."""
    if not type(module).__module__.startswith("torch.nn."):
        return {}
    suffix = class_name(module)[-2:]
    dims = int(suffix[0]) if suffix in ("1d", "2d", "3d") else None
    out: dict[str, Any] = {}
    dropout = isinstance(module, nn.modules.dropout._DropoutNd)
    for name in LAYER_SETTINGS:
        if not hasattr(module, name) or (dropout and name == "p"):
            continue
        value = getattr(module, name)
        many = isinstance(value, (tuple, list))
        values = [_number(v) for v in (value if many else [value])]
        if not all(isinstance(v, (bool, int, float, str, type(None))) for v in values):
            continue  # a module, a function, a tensor: not a setting this record reads
        if not many and dims is not None and name in _PER_DIM and isinstance(values[0], int):
            values, many = values * dims, True
        out[name] = values if many else values[0]
    return out


def _number(value: Any) -> Any:
    """A numpy (or other) integer or real as Python's own; anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)
