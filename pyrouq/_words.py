"""How messages word what came, the same in every message that says it: :func:`article`,
"a" or "an" before a class name (an int, a dict, an ndarray), and :func:`name_slip`, which of
an option's names a string given for it only slipped from (its case, spaces around it, a hyphen
or a space for ``_``), and how, which :func:`slip_hint` words for the message refusing it, and
:func:`did_you_mean`, the one question every message asks of the names meant (a slip's, or the
close names :func:`close_hint` finds for a typo)."""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Collection, Mapping, Sequence

__all__ = [
    "CASE",
    "DATASET_WORDS",
    "JOINS",
    "SPACES",
    "article",
    "as_typed",
    "close_hint",
    "close_names",
    "did_you_mean",
    "empty_name",
    "ensemble_draws",
    "flag_fix",
    "name_slip",
    "slip_hint",
]

CASE = "case"
"""A slip of :func:`name_slip`: the name in another case (``"NUTS"``)."""
SPACES = "spaces"
"""A slip of :func:`name_slip`: spaces around the name (``"nuts "``)."""
JOINS = "joins"
"""A slip of :func:`name_slip`: a hyphen or spaces between the name's words where it has ``_``
(``"warmup-cosine"``)."""


def as_typed(value: float) -> str:
    """A command line's number as it was typed, or near it: an int as it is, a float by its
    shortest repr without a whole number's ``.0`` (``1``, ``0.1``, ``1e-50``, ``1234567``,
    ``0.123456789``, where ``:g`` keeps 6 digits: ``1.23457e+06``)."""
    text = repr(value)
    return text[:-2] if isinstance(value, float) and text.endswith(".0") else text


def article(word: str) -> str:
    """``"an"`` before a word said with a vowel's sound first (an int, an OrderedDict, an
    ndarray, said "en-dee-array", an UninitializedParameter), else ``"a"`` (a list, a UserDict,
    said "you-ser", a Union). Capitals first without a vowel are said letter by letter: an
    MLP ("em-el-pee"), an MCMCResult, an HTTPError, but a CNN; with a vowel they may be a
    word (a NUTS), and take the rule of words."""
    caps = len(word) - len(word.lstrip("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    initials = word[: caps - 1] if caps and word[caps : caps + 1].islower() else word[:caps]
    if len(initials) > 1 and not set(initials) & set("AEIOU"):
        return "an" if initials[0] in "FHLMNRSX" else "a"
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


_SLIP_WORDS = {
    CASE: "are lower case",
    SPACES: "have no spaces around them",
    JOINS: "join their words with '_'",
}
"""How :func:`slip_hint` tells each slip, in this order."""


def slip_hint(given: object, names: Collection[str]) -> str:
    """For the message refusing ``given`` as an option of ``names`` (lower case): where
    :func:`name_slip` finds the name it slipped from, `` (did you mean 'last_layer'? the names
    are lower case)``, put after the value shown; else ``""``. The slips of :data:`JOINS` count
    for names whose words ``_`` joins, not where a name has a hyphen (``"fashion-mnist"``)."""
    if not isinstance(given, str):
        return ""
    slip = name_slip(given, names, joins=not any("-" in name for name in names))
    if slip is None:
        return ""
    meant, slips = slip
    how = [_SLIP_WORDS[s] for s in slips]
    told = " and ".join([", ".join(how[:-1]), how[-1]] if len(how) > 1 else how)
    return did_you_mean([meant], f"the names {told}")


def did_you_mean(meant: Sequence[str], why: str = "") -> str:
    """The question a message refusing a name asks, put after the value shown: `` (did you
    mean 'round_to'?)``, `` (did you mean 'a' or 'b'?)`` for several, ``why`` after the
    question (`` (did you mean 'nuts'? the names are lower case)``); ``""`` for none. A name
    meant twice (``'paddin'`` and ``'padding_'`` both close to ``'padding'``) is asked once."""
    if not meant:
        return ""
    names = " or ".join(map(repr, dict.fromkeys(meant)))
    return f" (did you mean {names}?{f' {why}' if why else ''})"


def close_names(given: str, names: Collection[str], n: int = 1) -> list[str]:
    """The (at most ``n``) names of ``names`` closest to ``given`` by difflib, as written, else
    in any case (``"TINYNET"`` is close to ``"TinyNet"`` only so); ``[]`` where none is."""
    close = difflib.get_close_matches(given, list(names), n=n)
    if not close:
        folded = {name.lower(): name for name in names}
        close = [folded[name] for name in difflib.get_close_matches(given.lower(), folded, n=n)]
    return close


def close_hint(
    given: object, names: Collection[str], other_words: Mapping[str, str | None] | None = None
) -> str:
    """For the message refusing ``given`` as one of ``names`` (lower case): :func:`slip_hint`'s
    question where it only slipped from one of them, else :func:`did_you_mean` of the name
    that ``other_words`` gives for it (another word for a name, in any case: ``"normal"`` for
    ``"gaussian"``; no question where that is None or not one of ``names``: a word known to
    mean something else is not taken for a typo), else of the name closest to it (a typo:
    `` (did you mean 'round_to'?)``), else ``""`` (also for a ``given`` that is no string)."""
    if not isinstance(given, str):
        return ""
    words, key = other_words or {}, given.strip().lower()
    if key in words:  # another word: for one of names (asked), or for none of them (no question)
        other = words[key]
        meant = [other] if other is not None and other in names else []
        return slip_hint(given, names) or did_you_mean(meant)
    return slip_hint(given, names) or did_you_mean(close_names(given, names))


DATASET_WORDS: dict[str, str | None] = {
    **dict.fromkeys(("fmnist", "f-mnist", "f_mnist", "f mnist"), "fashion-mnist"),
    **dict.fromkeys(("kmnist", "emnist", "qmnist"), None),
}
"""Other words for the data sets' names (:func:`close_hint`'s ``other_words``): Fashion-MNIST's
short forms, which difflib finds closer to ``'mnist'``, and the MNIST-like data sets pyrouq
does not have, of which difflib would ask ``'mnist'`` (None: no question)."""


def ensemble_draws(members: object) -> str:
    """Why a BatchEnsemble takes no ``num_samples`` (predict(), to_inference_data()), in one
    wording: ``"4 members are fixed, not sampled, so S = 4"``."""
    return f"{members} members are fixed, not sampled, so S = {members}"


def empty_name(text: str) -> str:
    """How a refusal words a name with nothing in it: ``""`` as "an empty name" (a shell's
    unset variable, ``--out "$RUN"``), a name of spaces, tabs or newlines as "a blank name
    (whitespace only)"."""
    return "an empty name" if not text else "a blank name (whitespace only)"


def flag_fix(name: str, value: object) -> str:
    """What to pass for the flag ``name`` given ``value``, not True or False: the bool that
    ``0`` or ``1`` (Python's or numpy's) and ``"true"`` or ``"false"`` (in any case) stand for,
    else either bool."""
    if isinstance(value, numbers.Real) and value in (0, 1):
        return f"Pass {name}={bool(value)}."
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return f"Pass {name}={value.strip().lower() == 'true'}, a bool (not a string)."
    return f"Pass {name}=True or {name}=False."
