"""The tutorials run end to end in their smoke mode (`make test-tutorials`, part of `make test`).

Each notebook executes in a fresh kernel with ``CI=1`` in the kernel's environment, whatever
the caller's, so it takes its short path (``smoke_test = "CI" in os.environ``). The notebook is
read into memory and never written back: the committed outputs of the full run stay as they
are.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TUTORIALS = sorted((Path(__file__).resolve().parents[2] / "tutorials").glob("*.ipynb"))


def test_there_are_tutorials():
    assert TUTORIALS, "no notebook found in tutorials/"


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_each_tutorial_says_at_its_top_that_its_outputs_are_a_full_runs(path: Path):
    # before: only tutorial 01 said so, and none that the smoke run's figures differ (tutorial
    # 03's LeNet read 12.6 % accuracy in smoke mode, where its text discusses the full run's)
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    top = " ".join(next(c.source for c in nb.cells if c.cell_type == "markdown").split())
    assert "the outputs stored here come from a full run" in top.lower()
    assert "far less trained" in top and "need not hold there." in top


def test_the_tutorials_name_one_kernel_alike():
    # 09's kernelspec said "Python 3", the others "Python 3 (ipykernel)"
    specs = {p.stem: dict(nbformat.read(p, as_version=4).metadata.kernelspec) for p in TUTORIALS}
    expected = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    assert {stem: spec for stem, spec in specs.items() if spec != expected} == {}


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs_in_smoke_mode(path: Path):
    nb = nbformat.read(path, as_version=4)
    first_code = next(c.source for c in nb.cells if c.cell_type == "code")
    assert 'smoke_test = "CI" in os.environ' in first_code, "the smoke flag opens every tutorial"
    before = path.read_bytes()
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",  # the kernel of this interpreter's environment (ipykernel)
        timeout=600,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute(env={**os.environ, "CI": "1"})
    errors = [
        out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"
    ]
    assert not errors  # execute() raises on the first error; this guards allow_errors=True
    assert path.read_bytes() == before, "the smoke run must not touch the committed notebook"
