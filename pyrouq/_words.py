"""How messages word what came, the same in every message that says it: :func:`article`,
"a" or "an" before a class name (an int, a dict, an ndarray), and :func:`name_slip`, which of
an option's names a string given for it only slipped from (its case, spaces around it, a hyphen
or a space for ``_``), and how."""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["CASE", "JOINS", "SPACES", "article", "name_slip"]

CASE = "case"
"""A slip of :func:`name_slip`: the name in another case (``"NUTS"``)."""
SPACES = "spaces"
"""A slip of :func:`name_slip`: spaces around the name (``"nuts "``)."""
JOINS = "joins"
"""A slip of :func:`name_slip`: a hyphen or spaces between the name's words where it has ``_``
(``"warmup-cosine"``)."""


def article(word: str) -> str:
    """``"an"`` before a word said with a vowel's sound first (an int, an OrderedDict, an
    ndarray, said "en-dee-array", an UninitializedParameter), else ``"a"`` (a list, a UserDict,
    said "you-ser", a Union)."""
    lower = word.lower()
    if lower.startswith(("nd", "unin")):  # ndarray, UninitializedParameter
        return "an"
    if lower.startswith(("use", "usa", "uni", "uin")):  # UserDict, UserList, uint8
        return "a"
    return "an" if lower[:1] in "aeiou" else "a"


def name_slip(
    given: str, names: Collection[str], joins: bool = False
) -> tuple[str, list[str]] | None:
    """The name of ``names`` (lower case, words joined by ``_``) that ``given`` slipped from,
    and its slips in this order: :data:`CASE`, :data:`SPACES` and, where ``joins``,
    :data:`JOINS`; None where ``given`` is one of ``names`` or slipped from none of them."""
    stripped = given.strip()
    meant = stripped.lower()
    if joins:
        meant = "_".join(meant.replace("-", " ").split())
    slips = [
        slip
        for slip, slipped in (
            (CASE, stripped.lower() != stripped),
            (SPACES, stripped != given),
            (JOINS, joins and ("-" in stripped or " " in stripped)),
        )
        if slipped
    ]
    return (meant, slips) if meant in names and slips else None
