"""docs/_links.py: where the API pages' references to re-exported names lead, and the bases they
show. Before it, ``:func:`pyrouq.fit``` (27 docstrings), ``pyrouq.bayesian``, ``pyrouq.predict``
and ``:func:`predict``` in pyrouq.rotation (about 150 references in all) found no target: the
objects are documented as ``pyrouq.infer.fit`` and so on, and with nitpicky mode off Sphinx
printed the names without a link and said nothing (``sphinx-build -n`` listed them). Four pages
showed private classes under "Bases:" (``_BatchEnsembleConv``, ``NamedInStore``,
``ShardedOrder``)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from pyro.nn import PyroModule
from torch import nn

import pyrouq
from pyrouq.convert._bayesian import BayesianNetwork

_PATH = Path(__file__).resolve().parents[2] / "docs" / "_links.py"
_SPEC = importlib.util.spec_from_file_location("_docs_links", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
links = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(links)


def _api_modules() -> list[str]:
    """``API_MODULES`` of docs/conf.py, read without running it (it writes the pages)."""
    tree = ast.parse((_PATH.parent / "conf.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "API_MODULES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("docs/conf.py has no API_MODULES")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return links.documented_in(_api_modules())


@pytest.mark.parametrize(
    ("target", "documented"),
    [
        ("pyrouq.fit", "pyrouq.infer.fit"),
        ("fit", "pyrouq.infer.fit"),  # :func:`fit` in pyrouq.mcmc
        ("predict", "pyrouq.predictive.predict"),  # :func:`predict` in pyrouq.rotation
        ("pyrouq.bayesian", "pyrouq.convert.bayesian"),
        ("pyrouq.Predictions.to", "pyrouq.predictive.Predictions.to"),
        ("pyrouq.GaussianPredictions.evaluate", "pyrouq.regression.GaussianPredictions.evaluate"),
        ("pyrouq.MeanFieldGuide", "pyrouq.infer.MeanFieldGuide"),
        ("sample_with", None),  # not a re-exported name: left as it is
        ("pyrouq.cli._build", None),
    ],
)
def test_a_reexported_name_leads_to_the_page_documenting_it(
    pages: dict[str, str], target: str, documented: str | None
) -> None:
    assert links.documented_target(target, pages) == documented


def test_every_top_level_name_has_a_page(pages: dict[str, str]) -> None:
    names = [n for n in pyrouq.__all__ if not n.startswith("__")]
    assert sorted(pages) == sorted(names)


def test_private_bases_give_way_to_their_public_ones() -> None:
    assert links.public_bases(list(pyrouq.nn.BatchEnsembleConv2d.__bases__)) == [nn.Module]
    assert links.public_bases(list(pyrouq.nn.BayesianLinear.__bases__)) == [PyroModule]
    assert links.public_bases(list(BayesianNetwork.__bases__)) == [PyroModule]
    assert links.public_bases(list(pyrouq.data.TensorLoader.__bases__)) == [object]
    assert links.public_bases([nn.Linear, PyroModule]) == [nn.Linear, PyroModule]
