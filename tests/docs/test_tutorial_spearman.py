"""Audit of the docs and tutorials against the code: what a tutorial computes is what its prose
says it computes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"


def _functions_of(notebook: str, *names: str) -> dict:
    """The top-level functions ``names`` of a notebook's code cells, defined in a namespace
    with torch (nothing else of the notebook runs)."""
    cells = json.loads((TUTORIALS / notebook).read_text(encoding="utf-8"))["cells"]
    namespace: dict = {"torch": torch}
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse("".join(cell["source"]))
        wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
        exec(compile(ast.Module(body=wanted, type_ignores=[]), notebook, "exec"), namespace)
    return {name: namespace[name] for name in names}


def test_tutorial_03_spearman_gives_tied_values_their_mean_rank():
    # The zero-one epistemic part is exactly 0 on most inputs: Spearman's rho ranks those ties
    # alike (scipy.stats.rankdata's "average"), not by their position in the tensor.
    f = _functions_of("03_uncertainty_and_ood.ipynb", "ranks", "spearman")
    v = torch.tensor([0.0, 0.3, 0.0, 0.0, 0.1, 0.3])
    assert f["ranks"](v).tolist() == [2.0, 5.5, 2.0, 2.0, 4.0, 5.5]
    # rho of (1..6) with a vector that is 0 but for its last two entries: the ranks of b are
    # (2.5, 2.5, 2.5, 2.5, 5, 6), so rho = 12.5 / sqrt(17.5 * 12.5) = 0.84515, by hand
    a = torch.arange(6.0)
    b = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5, 0.7])
    assert abs(f["spearman"](a, b) - 0.8451542547285166) < 1e-12
    # ties reordered: the same rho (ranks by position gave 1.0 above and 0.43 here)
    assert abs(f["spearman"](a.flip(0), b.flip(0)) - 0.8451542547285166) < 1e-12
