"""Sphinx configuration of the pyrouq docs (`make docs`).

Two kinds of pages are written here, at build time, before Sphinx reads the sources:

* ``api/<module>.rst``, one autodoc page per public module, for the modules whose file exists
  (modules still being written are left out without a warning), with the constants and type
  aliases its module imports, which autodoc leaves out (``_data_members.py``), plus
  ``api/index.rst`` mapping every name of ``pyrouq.__all__`` to the page that documents it;
* ``tutorials/*.ipynb``, copies of ``../tutorials/*.ipynb``, rendered by myst-nb from the outputs
  stored in them: nothing is executed.

Both are generated (git ignores them); ``tutorials/index.md`` globs the notebooks. ``setup()``
links the names ``import pyrouq`` re-exports (``:func:`pyrouq.fit```) to the module page that
documents them, and keeps private classes out of the "Bases:" lines (``_links.py``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))

import _data_members  # noqa: E402
import _links  # noqa: E402

import pyrouq  # noqa: E402

# -- Project ------------------------------------------------------------------------------------

project = "pyrouq"
author = "pyrouq developers"
copyright = "pyrouq developers"
version = release = pyrouq.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # serves MathJax from _static/: the formulae render offline
    "sphinx.ext.viewcode",
    "myst_nb",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "_*.md", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []
html_theme = "furo"
html_title = f"pyrouq {release}"
html_static_path: list[str] = []

# Warnings are errors (`sphinx-build -W`); unresolved cross-references (to torch, Pyro, ...) are
# not warnings because nitpicky mode stays off.
nitpicky = False
# Notebooks are written by hand: a heading level skipped in a tutorial is not worth a red build.
suppress_warnings = ["myst.header"]

# -- autodoc / napoleon -------------------------------------------------------------------------

autodoc_member_order = "bysource"  # class members in source order; module members as in __all__
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_inherit_docstrings = False
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes" as fields, not a second description of each dataclass field

# -- MyST / myst-nb -----------------------------------------------------------------------------

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # render the stored outputs; never start a kernel
nb_merge_streams = True

# -- Generated pages ----------------------------------------------------------------------------

#: The API pages, in navigation order (data flows this way through the package).
API_MODULES = [
    "data",
    "likelihoods",
    "nn",
    "convert",
    "models",
    "infer",
    "mcmc",
    "predictive",
    "regression",
    "rotation",
    "tabular",
    "uncertainty",
    "metrics",
    "calibration",
    "diagnostics",
    "plotting",
    "checkpoint",
    "cli",
]


def _module_exists(name: str) -> bool:
    pkg = Path(pyrouq.__file__).parent
    return (pkg / f"{name}.py").is_file() or (pkg / name / "__init__.py").is_file()


def _write_if_changed(path: Path, text: str) -> None:
    """Write only on change, so Sphinx's incremental build does not reread every page."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _heading(title: str, char: str = "=") -> str:
    return f"{title}\n{char * len(title)}\n"


def _cli_usage() -> str:
    """The ``--help`` text of ``pyrouq`` and of each of its subcommands, as literal blocks."""
    from pyrouq import cli

    def help_of(argv: list[str]) -> str:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
            cli.main([*argv, "--help"])
        return buffer.getvalue().rstrip()

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"  # argparse wraps to this width
    try:
        top = help_of([])
        match = re.search(r"\{([\w,-]+)\}", top)
        commands = match.group(1).split(",") if match else []
        blocks = [("pyrouq --help", top)] + [(f"pyrouq {c} --help", help_of([c])) for c in commands]
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    out = [_heading("Usage", "-")]
    for command, text in blocks:
        body = "\n".join(f"   {line}" if line else "" for line in text.splitlines())
        out.append(f".. code-block:: text\n\n   $ {command}\n{body}\n")
    return "\n".join(out)


def _summary(module: str) -> str:
    """The first paragraph of a module's docstring, on one line."""
    doc = importlib.import_module(f"pyrouq.{module}").__doc__ or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _write_api_pages() -> list[str]:
    """Write ``api/<module>.rst`` for the modules that exist and ``api/index.rst``."""
    api = DOCS / "api"
    present = [m for m in API_MODULES if _module_exists(m)]
    for stale in api.glob("*.rst"):
        if stale.stem != "index" and stale.stem not in present:
            stale.unlink()
    for module in present:
        text = _heading(f"pyrouq.{module}") + f"\n.. automodule:: pyrouq.{module}\n"
        if data := _data_members.entries(module):  # the constants autodoc leaves out
            text += "\n" + data
        if module == "cli":
            text += "\n" + _cli_usage()
        _write_if_changed(api / f"{module}.rst", text)

    # Where each top-level name is documented: the first module page whose __all__ has it.
    rows = []
    for name, module in _links.documented_in(present).items():
        rows.append(f"   * - :py:obj:`pyrouq.{name} <pyrouq.{module}.{name}>`")
        rows.append(f"     - :doc:`{module}`")
    toc = "\n".join(f"   {m}" for m in present)
    summary = "\n".join(f"* :doc:`{m}`: {_summary(m)}" for m in present)
    index = (
        _heading("API reference")
        + "\nShape convention throughout: S posterior draws or ensemble members, N inputs, "
        + "C classes.\n\nOne page per module:\n\n"
        + summary
        + "\n\n.. toctree::\n   :hidden:\n\n"
        + toc
        + "\n\n"
        + _heading("Top-level names", "-")
        + "\n``import pyrouq`` re-exports these; each is documented on its module's page.\n\n"
        + ".. list-table::\n   :header-rows: 1\n\n   * - name\n     - module\n"
        + "\n".join(rows)
        + "\n"
    )
    _write_if_changed(api / "index.rst", index)
    return present


#: Written into ``tutorials/`` while there is no notebook, so that the glob has a match.
_NO_TUTORIALS = "none.md"


def _copy_tutorials() -> list[str]:
    """Mirror ``../tutorials/*.ipynb`` into ``tutorials/`` (stored outputs, not executed)."""
    source, target = ROOT / "tutorials", DOCS / "tutorials"
    notebooks = sorted(source.glob("*.ipynb")) if source.is_dir() else []
    names = {nb.name for nb in notebooks}
    for stale in target.glob("*.ipynb"):
        if stale.name not in names:
            stale.unlink()
    for nb in notebooks:
        copy = target / nb.name
        if not copy.exists() or copy.read_bytes() != nb.read_bytes():
            shutil.copyfile(nb, copy)
    placeholder = target / _NO_TUTORIALS
    if notebooks:
        placeholder.unlink(missing_ok=True)
    else:
        _write_if_changed(
            placeholder,
            "# No tutorials yet\n\nNo notebook has been committed to `tutorials/` yet.\n",
        )
    return sorted(names)


api_modules = _write_api_pages()
tutorial_notebooks = _copy_tutorials()


def setup(app):  # type: ignore[no-untyped-def]
    """Link ``pyrouq.fit`` (and a bare ``predict`` from another module) to the page documenting
    it, and show no private pyrouq class under a class's "Bases:" (see ``_links.py``)."""
    pages = _links.documented_in(api_modules)
    app.connect(
        "missing-reference",
        lambda app, env, node, contnode: _links.resolve(app, env, node, contnode, pages),
    )
    app.connect(
        "autodoc-process-bases",
        lambda app, name, obj, options, bases: bases.__setitem__(
            slice(None), _links.public_bases(bases)
        ),
    )
    return {"parallel_read_safe": True}
