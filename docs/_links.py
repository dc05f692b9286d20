"""Where the API pages' cross-references and class bases lead (used by ``conf.py``).

Every public object is documented once, on its module's page (``pyrouq.infer.fit``), while the
docstrings name many by the path a user types (``:func:`pyrouq.fit```), or by the bare name
from another module (``:func:`predict``` in ``pyrouq.rotation``). Sphinx finds neither, and with
nitpicky mode off it says nothing: the name is printed without its link. ``resolve`` gives such
a reference the object's documented path, for the names ``import pyrouq`` re-exports.

A class whose base is private (``pyrouq.nn._batchensemble._BatchEnsembleConv``, a class of a
private module such as ``pyrouq._util.ShardedOrder``) would show that base under "Bases:", a
name documented nowhere; ``public_bases`` puts the base's own public bases in its place.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

import pyrouq


def documented_in(modules: Iterable[str]) -> dict[str, str]:
    """For each name of ``pyrouq.__all__``, the first of ``modules`` (``"infer"``) whose
    ``__all__`` holds the same object, i.e. the page that documents it."""
    found: dict[str, str] = {}
    loaded = [(m, importlib.import_module(f"pyrouq.{m}")) for m in modules]
    for name in pyrouq.__all__:
        if name.startswith("__"):
            continue
        obj = getattr(pyrouq, name)
        for module, mod in loaded:
            if name in getattr(mod, "__all__", ()) and getattr(mod, name, None) is obj:
                found[name] = module
                break
    return found


def documented_target(target: str, pages: dict[str, str]) -> str | None:
    """The documented path of a reference Sphinx did not find, or None where it is not one of
    the re-exported names: ``pyrouq.fit`` and ``fit`` give ``pyrouq.infer.fit``,
    ``pyrouq.Predictions.to`` gives ``pyrouq.predictive.Predictions.to``."""
    head, _, rest = target.removeprefix("pyrouq.").partition(".")
    module = pages.get(head)
    if module is None:
        return None
    return f"pyrouq.{module}.{head}" + (f".{rest}" if rest else "")


def resolve(app: Any, env: Any, node: Any, contnode: Any, pages: dict[str, str]) -> Any:
    """A ``missing-reference`` handler: the link to the documented object, with the role's own
    kind (a ``:meth:`` finds no function), or None to leave the reference as it was."""
    if node.get("refdomain") != "py":
        return None
    target = documented_target(node["reftarget"], pages)
    if target is None:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], target, node, contnode
    )


def is_private(cls: type) -> bool:
    """A pyrouq class of a private module, or of a private name."""
    module = getattr(cls, "__module__", "") or ""
    if module.split(".")[0] != "pyrouq":
        return False
    parts = [*module.split("."), *getattr(cls, "__qualname__", "").split(".")]
    return any(part.startswith("_") for part in parts)


def public_bases(bases: list[Any]) -> list[Any]:
    """``bases`` with every private pyrouq class replaced by its own bases, in turn (duplicates
    dropped, order kept); a class of private bases alone gets ``object``, as Sphinx shows it."""
    out: list[Any] = []
    for base in bases:
        for kept in public_bases(list(base.__bases__)) if is_private(base) else [base]:
            if kept not in out:
                out.append(kept)
    if len(out) > 1 and object in out:
        out.remove(object)
    return out
