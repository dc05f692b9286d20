"""How ``pyrouq fit FACTORY --method bayesian`` warns of a factory's BatchEnsemble whose rank-1
factors get a ``Normal(0, --prior-scale)`` prior: :func:`pyrouq.bayesian` warns in Python's
words ("pass prior=dist.Normal(1.0, 0.1), or build it with pyrouq.rank1(net, M)"), which a
command-line user cannot follow; the command's way out is the plain network and
``--method rank1``.

Only the showing of that one warning is changed: while the command calls bayesian(),
``warnings.showwarning`` is a wrapper that gives the previous one that warning in the command's
words and every other warning as it came. No warning is caught and issued again, so the filters
and once-per-place registries decide on each as usual, with its own module and place, before
it is shown (a warning before bayesian() raises is shown then, one of exec'd code too)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

# bayesian()'s warning of a float prior on a BatchEnsemble's factors (convert/_rank1_factors.py)
_FACTOR_PRIOR = re.compile(r"^bayesian\(BatchEnsemble, prior=(.*?)\) puts a Normal\(0, ")


@contextmanager
def factor_prior_in_command_words(spec: str, network: str) -> Iterator[None]:
    """bayesian()'s warning of the rank-1 factors of the factory ``spec``'s BatchEnsemble
    (class ``network``), raised inside, said in the command's words; other warnings untouched.

    The filters match that warning by bayesian()'s words, its category and the place it names
    (the command's call of bayesian(), module ``pyrouq.cli._build``). Where a filter makes it
    an error (``python -W error``, ``PYTHONWARNINGS=error``), the error bayesian() raises is
    raised again in the command's words; other warnings' errors pass as they came. A warning's
    ``source`` object (tracemalloc's allocation traceback of a ResourceWarning) does not reach
    a replaced showwarning: Python passes it only to its own."""
    previous = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        found = _FACTOR_PRIOR.match(str(message))
        if found is not None:
            message = category(_in_command_words(spec, network, found[1]))
        previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    except Warning as raised:  # (a filter's "error")
        found = _FACTOR_PRIOR.match(str(raised))
        if found is None:
            raise
        raise type(raised)(_in_command_words(spec, network, found[1])) from None
    finally:
        warnings.showwarning = previous


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
