"""The module constants and type aliases of the API pages (used by ``conf.py``).

autodoc documents a data member of a module's ``__all__`` (``DEFAULT_PRIOR_SCALE``,
``PriorSpec``) only where its doc (a ``#:`` comment or a string after it) is in that module's
own source: the names a page's module imports from a private one (``K_HAT_GOOD`` of
``pyrouq.diagnostics``, written in ``pyrouq/diagnostics/_common.py``) it leaves off the
pages, silently, and ``:data:`` references to them would lead nowhere. ``imported_data`` finds
each such name's doc where it is written, and ``conf.py`` puts it on the page as a
``py:data`` entry.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from typing import Any

from sphinx.pycode import ModuleAnalyzer


def _is_data(obj: Any) -> bool:
    return not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj))


@functools.cache
def _docs(module: str) -> dict[str, list[str]]:
    """The module-level data docs written in ``module``'s source, by name."""
    try:
        found = ModuleAnalyzer.for_module(module).find_attr_docs()
    except Exception:  # (a module without a source file)
        return {}
    return {name: list(lines) for (scope, name), lines in found.items() if not scope}


def imported_data(module: str) -> dict[str, list[str] | None]:
    """For each data member of ``pyrouq.<module>.__all__`` whose doc is not in that module's
    own source (autodoc leaves it out), the lines of its doc where the same object is written
    with one, or None where no module documents it."""
    mod = importlib.import_module(f"pyrouq.{module}")
    own = _docs(mod.__name__)
    wanted = [
        name
        for name in getattr(mod, "__all__", ())
        if _is_data(getattr(mod, name)) and name not in own and not name.startswith("__")
    ]
    if not wanted:
        return {}
    found: dict[str, list[str] | None] = dict.fromkeys(wanted)
    # where each is written: a pyrouq module the page's module has imported, holding the same
    # object under that name, whose source documents it
    loaded = [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "pyrouq" and m]
    for name in wanted:
        holders = [m for m in loaded if getattr(m, name, None) is getattr(mod, name)]
        docs = (_docs(m.__name__).get(name) for m in holders)
        found[name] = next((lines for lines in docs if lines), None)
    return found


def shown_value(obj: Any) -> str:
    """A data member's value as its page shows it: numbers as Python writes them, type aliases
    without the ``typing.`` prefixes and module paths of their parts."""
    text = repr(obj).replace("typing.", "")
    return re.sub(r"\b(?:[a-z_]\w*\.)+([A-Z]\w*)", r"\1", text)


def entries(module: str) -> str:
    """``py:data`` entries for :func:`imported_data`'s names of ``pyrouq.<module>``, under a
    rubric; "" where there are none. A name no module documents is an error: document it
    where it is written."""
    found = imported_data(module)
    undocumented = [name for name, lines in found.items() if lines is None]
    if undocumented:
        raise ValueError(
            f"pyrouq.{module}.__all__ holds {undocumented}, documented nowhere: give each a "
            "docstring (a string after it) where it is written"
        )
    if not found:
        return ""
    mod = importlib.import_module(f"pyrouq.{module}")
    out = [".. rubric:: Constants and type aliases\n"]
    for name, lines in found.items():
        value = shown_value(getattr(mod, name))
        body = "\n".join(f"   {line}" if line else "" for line in lines or [])
        out.append(
            f".. py:data:: {name}\n   :module: pyrouq.{module}\n   :value: {value}\n\n{body}\n"
        )
    return "\n".join(out)
