"""How :func:`pyrouq.predict` prepares the input batches it reads: each on the model's device,
cast to its dtype and checked (no NaN or inf, no meta tensors); the first batches of
``batchnorm_data`` (of two inputs or more) that each draw's BatchNorm statistics are estimated
on; and the progress bar over the batches of every pass over x."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from pyrouq._predict_batches import batches as _batches
from pyrouq._util import check_finite_inputs, model_input


def _prepared(x: Tensor, model: Any, device: Any, name: str = "x", first: int = 0) -> Tensor:
    """An input batch of ``name`` (its inputs from ``first`` on) on the model's device, cast
    to its dtype and checked (no NaN or inf)."""
    if x.is_meta:  # (torch's own errors, from a copy or a NaN check, say "no data")
        raise ValueError(f"predict(): {name} is on the meta device (shapes, no values). Pass "
                         f"{name} on a real device (cpu or cuda).")  # fmt: skip
    x = model_input(x if device is None else x.to(device), model, "predict()")
    check_finite_inputs(x, "predict()", name, first)
    return x


def _progress_bar(x: Tensor | Iterable, batch_size: int, passes: int = 1) -> Any:
    """A tqdm bar over the input batches (of every pass over x) that shows itself only after
    2 s."""
    from pyrouq._progress import tqdm

    if torch.is_tensor(x):
        total: int | None = -(-x.shape[0] // batch_size)
    else:
        try:
            total = len(x)  # type: ignore[arg-type]
        except TypeError:
            total = None
    total = None if total is None else total * passes
    return tqdm(total=total, desc="predict", unit="batch", leave=False, delay=2.0)


def _inputs_of(
    data: Tensor | Iterable, batch_size: int, count: int, model: Any, device: Any
) -> list[Tensor]:
    """The first ``count`` input batches of ``batchnorm_data`` of two inputs or more (a
    BatchNorm cannot take batch statistics of one; a norm shared by M members takes the M rows
    of one input, but their variance is the members' spread on that input, not the data's:
    about half the data's on a rank-1 network of 2 members), on the model's device and checked
    as predict() checks its inputs."""
    inputs, first = [], 0
    for x, _ in _batches(data, batch_size, "batchnorm_data"):
        first += x.shape[0]  # (inputs seen: a loader of empty batches holds none)
        if x.shape[0] < 2:
            continue
        inputs.append(_prepared(x, model, device, "batchnorm_data", first - x.shape[0]))
        if len(inputs) == count:
            break
    if not inputs:
        if first:
            raise ValueError(
                "predict() got batchnorm_data whose batches hold one input each: BatchNorm "
                "statistics need at least 2 inputs a batch. Pass training inputs in batches "
                "of 2 or more (a tensor is cut into batches of batch_size)."
            )
        raise ValueError(
            "predict() got batchnorm_data that holds no inputs: it is empty. Pass training "
            "inputs (a tensor (N, ...) or a loader of batches) whose BatchNorm statistics to "
            "re-estimate, or leave batchnorm_data=None to use the running statistics."
        )
    return inputs
