"""How ``pyrouq fit FACTORY --method bayesian`` warns of a factory's BatchEnsemble whose rank-1
factors get a ``Normal(0, --prior-scale)`` prior: :func:`pyrouq.bayesian` warns in Python's
words ("pass prior=dist.Normal(1.0, 0.1), or build it with pyrouq.rank1(net, M)"), which a
command-line user cannot follow; the command's way out is the plain network and
``--method rank1``."""

from __future__ import annotations

import re
import sys
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# bayesian()'s warning of a float prior on a BatchEnsemble's factors (convert/_rank1_factors.py)
_FACTOR_PRIOR = re.compile(r"^bayesian\(BatchEnsemble, prior=(.*?)\) puts a Normal\(0, ")


@contextmanager
def factor_prior_in_command_words(spec: str, network: str) -> Iterator[None]:
    """Warnings raised inside pass on as they came (where the code inside raises too), but
    bayesian()'s of the rank-1 factors of the factory ``spec``'s BatchEnsemble (class
    ``network``), which is said in the command's words."""
    from pyrouq.convert import DEFAULT_RANK1_PRIOR_SCALE

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # (the filters outside decide, below)
            yield
    finally:  # (bayesian() raising too: what it warned of before is not dropped)
        for warning in caught:
            found = _FACTOR_PRIOR.match(str(warning.message))
            if found is None:
                _reissue(warning)
                continue
            warnings.warn(
                f"factory {spec!r}, --method bayesian: puts a Normal(0, {found[1]}) prior "
                f"(--prior-scale {found[1]}) on the rank-1 factors of the {network} it returned, "
                "which start near 1 and scale the shared weights: that prior pulls them to 0. "
                f"--method rank1 gives them Normal(1, {DEFAULT_RANK1_PRIOR_SCALE}): make the "
                "factory return the plain network the ensemble was made from and pick --method "
                "rank1.",
                warning.category,
                stacklevel=3,
            )


def _reissue(warning: warnings.WarningMessage) -> None:
    """``warning`` issued again as it came: its category and place, and the module and
    once-per-place registry of the module at that place where one is loaded from it (the
    filters that name a module match it; without, the module was the file's path)."""
    namespace = _loaded_from(warning.filename)
    found: dict[str, Any] = {}  # (an explicit module=None drops the warning: pass none)
    if namespace is not None:
        found["module"] = namespace["__name__"]
        found["registry"] = namespace.setdefault("__warningregistry__", {})
    warnings.warn_explicit(
        warning.message, warning.category, warning.filename, warning.lineno,
        source=warning.source, **found,
    )  # fmt: skip


def _loaded_from(filename: str) -> dict[str, Any] | None:
    """The namespace of a module in sys.modules loaded from ``filename``, None where none is.
    Read past the module's own attribute lookup: a lazily imported module (importlib.util's
    LazyLoader) would otherwise be imported here, and raise where its import fails; objects
    other than modules in sys.modules are passed over."""
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        namespace = object.__getattribute__(module, "__dict__")
        if namespace.get("__file__") == filename and isinstance(namespace.get("__name__"), str):
            return namespace  # type: ignore[no-any-return]
    return None
