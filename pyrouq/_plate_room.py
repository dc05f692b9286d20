"""Room for a batch of inputs in the data plate of a Pyro model (or guide) of the user's
own while :func:`pyrouq.predict` runs it on that batch (so does the diagnostics' export of a
network's own forward, batch by batch): :func:`~pyrouq._own_models.room_for` raises a model's
``num_data``; a plate of a size written into the model, ``pyro.plate("data", 100,
subsample_size=len(x))``, cannot be raised, and Pyro's refusal of a larger batch is told in
pyrouq's words (:func:`batch_room`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from torch import nn

from pyrouq import _own_models as own_models
from pyrouq._wrappers import under_handlers

# Pyro's words (pyro.poutine.subsample_messenger) for a plate of size N given a subsample_size
# B > N: it draws the subsample torch.randperm(N)[:B], of N indices, and compares
_TOO_SMALL = re.compile(r"subsample_size does not match len\(subsample\), (\d+) vs (\d+)")


@contextlib.contextmanager
def batch_room(
    owner: Any, rows: int, caller: str = "predict()", *, guide: bool = False
) -> Iterator[None]:
    """Run ``owner`` (a model or guide of the user's own) on a batch of ``rows`` inputs: within
    :func:`~pyrouq._own_models.room_for`, and with Pyro's refusal of a plate smaller than the
    batch (its size written into the model) re-raised as a ``ValueError`` that names the
    plate's size, the batch's and the ways out (``batch_size=``, a ``num_data`` attribute),
    Pyro's error as its cause (for a ``guide``, whose ``num_data`` fit() does not set, the
    advice says to set it). Other errors pass untouched."""
    with own_models.room_for(owner, rows):
        try:
            yield
        except ValueError as err:
            found = _TOO_SMALL.match(str(err))
            if found is None or int(found[1]) != rows or int(found[2]) >= rows:
                raise
            size = int(found[2])
            plate = _plate_name(err)
            which = f'plate "{plate}"' if plate is not None else "data plate"
            written = f'"{plate if plate is not None else "data"}"'
            function = caller.removesuffix("()")
            # a model function reads the attribute off itself (fit() sets it there too)
            inner = under_handlers(owner)[0]  # (poutine.condition(model): the model's)
            holder = "self" if isinstance(inner, nn.Module) else own_models.name_of(inner)
            setter = "(the README's recipe; fit() sets it)"
            if guide:  # fit() sets the model's num_data alone
                setter = (
                    "(set the guide's num_data to the training set's size yourself: fit() "
                    "sets the model's, not the guide's)"
                )
            raise ValueError(
                f"{caller}: {own_models.name_of(owner)}'s {which} has size {size}, and "
                f"{caller} ran a batch of {rows} inputs, more than the plate holds (Pyro: "
                f"{found[0]}). Pass {function}(..., batch_size={size}) or less, or give the "
                "plate the data set's size through an attribute num_data, "
                f"pyro.plate({written}, {holder}.num_data, subsample_size=len(x)), which {caller} "
                f"raises for its batches {setter}."
            ) from err


def _plate_name(err: BaseException) -> str | None:
    """The name of the plate whose subsample Pyro refused in ``err`` (or the errors it was
    raised from, Pyro's trace re-raising it with the trace's shapes): read off the frame of
    Pyro's ``_subsample``, which its message does not name; None where not found."""
    seen: BaseException | None = err
    while seen is not None:
        tb = seen.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if (
                frame.f_code.co_name == "_subsample"
                and frame.f_globals.get("__name__") == "pyro.poutine.subsample_messenger"
            ):
                name = frame.f_locals.get("name")
                return name if isinstance(name, str) else None
            tb = tb.tb_next
        seen = seen.__cause__
    return None
