"""How ``pyrouq fit FACTORY --method bayesian`` warns of a factory's BatchEnsemble whose rank-1
factors get a ``Normal(0, --prior-scale)`` prior: :func:`pyrouq.bayesian` warns in Python's
words ("pass prior=dist.Normal(1.0, 0.1), or build it with pyrouq.rank1(net, M)"), which a
command-line user cannot follow; the command's way out is the plain network and
``--method rank1``.

Only the showing of that one warning is changed: while the command calls bayesian(),
``warnings.showwarning`` is a wrapper that passes every other warning to the previous one as it
came, and that one, in the command's words, through the filters again (the words its user sees
are those a ``-W ignore:factory`` matches). No other warning is caught and issued again, so the
filters and once-per-place registries decide on each as usual, with its own module and place,
before it is shown (a warning before bayesian() raises is shown then, one of exec'd code too)."""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TextIO

# bayesian()'s warning of a float prior on a BatchEnsemble's factors (convert/_rank1_factors.py)
_FACTOR_PRIOR = re.compile(r"^bayesian\(BatchEnsemble, prior=(.*?)\) puts a Normal\(0, ")


@contextmanager
def factor_prior_in_command_words(spec: str, network: str) -> Iterator[None]:
    """bayesian()'s warning of the rank-1 factors of the factory ``spec``'s BatchEnsemble
    (class ``network``), raised inside, said in the command's words; other warnings untouched.

    The filters match that warning by its category and the place it names (the command's call
    of bayesian(), module ``pyrouq.cli._build``), and by bayesian()'s words and then by the
    command's: a filter on either ignores it or makes it an error. Where a filter makes
    bayesian()'s words an error (``python -W error``, ``PYTHONWARNINGS=error``), the error
    bayesian() raises is raised again in the command's words; other warnings' errors pass as
    they came. A warning's ``source`` object (tracemalloc's allocation traceback of a
    ResourceWarning) does not reach a replaced showwarning: Python passes it only to its own.
    Where showwarning was replaced again inside (``logging.captureWarnings(True)``), that one
    is kept on leaving and the wrapper, still under it, passes every warning on unchanged."""
    previous = warnings.showwarning
    inside = True

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        found = _FACTOR_PRIOR.match(str(message)) if inside else None
        place = None if found is None else _frame_at(filename, lineno)
        if found is None or place is None:
            previous(message, category, filename, lineno, file, line)
            return
        globals_ = place.f_globals  # (the module and registry warnings.warn() took)
        warnings.warn_explicit(
            _in_command_words(spec, network, found[1]), category, filename, lineno,
            module=globals_.get("__name__", "<string>"),
            registry=globals_.setdefault("__warningregistry__", {}),
        )  # fmt: skip

    warnings.showwarning = show
    try:
        yield
    except Warning as raised:  # (a filter's "error")
        found = _FACTOR_PRIOR.match(str(raised))
        if found is None:
            raise
        raise type(raised)(_in_command_words(spec, network, found[1])) from None
    finally:
        inside = False
        if warnings.showwarning is show:
            warnings.showwarning = previous


def _frame_at(filename: str, lineno: int) -> FrameType | None:
    """The frame on the stack running line ``lineno`` of ``filename``: the place a warning
    being shown names, None where that warning came from another thread."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename, frame.f_lineno) != (filename, lineno):
        frame = frame.f_back
    return frame


def _in_command_words(spec: str, network: str, scale: str) -> str:
    """The warning of a ``Normal(0, scale)`` prior on the factors, for the command's user."""
    from pyrouq.convert import DEFAULT_RANK1_PRIOR_SCALE

    return (
        f"factory {spec!r}, --method bayesian: puts a Normal(0, {scale}) prior (--prior-scale "
        f"{scale}) on the rank-1 factors of the {network} it returned, which start near 1 and "
        "scale the shared weights: that prior pulls them to 0. --method rank1 gives them "
        f"Normal(1, {DEFAULT_RANK1_PRIOR_SCALE}): make the factory return the plain network the "
        "ensemble was made from and pick --method rank1."
    )
