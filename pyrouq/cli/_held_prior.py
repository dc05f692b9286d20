"""How ``pyrouq fit`` tells a ``--prior-scale`` that the dtype of the network's weights holds as
0 or inf, from :func:`pyrouq._util.check_held`'s refusal (Python's words, naming
``prior_scale=``, ``prior=`` or a site's prior, and whose dtype refused it)."""

from __future__ import annotations

import re

from pyrouq._words import as_typed

# pyrouq._util.check_held's error, naming prior_scale= or a site's prior (Python's words), and
# whose dtype refused it (the prior's, the rank-1 factors', a site's: of a network of two dtypes)
_HELD = re.compile(
    r"Expected (prior_scale|prior=|the prior scale of .*?) to be a positive finite (torch\.\w+) "
    r"\((.*?); at most ([^)]*)\), got \S+, which \S+ holds as (\S+?)\."
)


def _held_where(name: str, whose: str) -> str:
    """What holds a --prior-scale in the dtype that refused it, in the command's words, from
    check_held's ``name`` and ``whose``: the site it names (a converted network's, whose layers
    may be of two dtypes), the rank-1 factors, else the network's weights (a built-in model's,
    of torch's default dtype, the prior's)."""
    if whose.startswith("the dtype of site "):
        return whose.removeprefix("the dtype of ")
    if whose == "the site's dtype":
        return "site " + name.removeprefix("the prior scale of ")
    if whose == "the factors' dtype":
        return "the rank-1 factors"
    return "the network's weights"


def is_held_refusal(text: str) -> bool:
    """Whether ``text`` (an error's words on one line) is check_held's refusal."""
    return _HELD.match(text) is not None


def held_prior_words(text: str, prior_scale: float, default: float) -> str | None:
    """The command's words for check_held's refusal ``text`` of ``--prior-scale prior_scale``
    (naming what holds it in the dtype that refused it, and the ``default`` to pass instead),
    else None (another error)."""
    held = _HELD.match(text)
    if held is None:
        return None
    name, dtype, whose, most, value = held.groups()
    return (
        f"--prior-scale {as_typed(prior_scale)} is {value} in {dtype}, the precision of "
        f"{_held_where(name, whose)} (at most {most}); pass a --prior-scale it holds, e.g. the "
        f"default {default:g}"
    )
