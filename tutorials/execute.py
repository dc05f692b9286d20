"""Run the tutorials in full mode and store their outputs in them.

    python tutorials/execute.py                       # every tutorials/*.ipynb, one at a time
    python tutorials/execute.py 03_uncertainty_and_ood.ipynb

Each notebook runs top to bottom in a fresh kernel (the current interpreter's ``python3``
kernel) with ``CI`` removed from its environment, so it takes the full, not the smoke, path.
The outputs are written back with the volatile metadata dropped: execution timings, widget
state and the kernel's version details. ``make test-tutorials`` runs the smoke path instead and
writes nothing.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent

#: Notebook metadata kept after a run; everything else (widgets, versions) is dropped.
KEEP_LANGUAGE_INFO = ("name", "pygments_lexer")


#: A tqdm progress bar as text ("predict:  50%|█████     | 5/10 [00:02<00:02, 2.08batch/s]").
PROGRESS_BAR = re.compile(r"^[^|]*\d+%\|.*\|")


def is_progress(output: nbformat.NotebookNode) -> bool:
    """A stderr stream holding nothing but progress bars (and the blanks that clear them)."""
    if output.get("output_type") != "stream" or output.get("name") != "stderr":
        return False
    lines = re.split(r"[\r\n]", output.get("text", ""))
    return all(not line.strip() or PROGRESS_BAR.match(line) for line in lines)


def scrub(nb: nbformat.NotebookNode) -> None:
    """Drop what changes from run to run but says nothing about the results: timings, widget
    state, version details and progress bars (a long ``predict`` shows one)."""
    nb.metadata.pop("widgets", None)
    info = nb.metadata.get("language_info", {})
    nb.metadata["language_info"] = {k: info[k] for k in KEEP_LANGUAGE_INFO if k in info}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not is_progress(o)]


def execute(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=3600,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - start
    scrub(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return seconds


def main(names: list[str]) -> None:
    paths = [HERE / name for name in names] if names else sorted(HERE.glob("*.ipynb"))
    for path in paths:
        print(f"{path.name}: {execute(path):.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
