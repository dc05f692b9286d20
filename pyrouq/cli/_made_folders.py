"""The folders ``pyrouq fit`` makes for its run folder (the folder and the parents it lacked),
and their removal when the run is refused before it trained: a refused command leaves no
folder behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist, deepest first: the folders that
    ``folder.mkdir(parents=True)`` makes."""
    missing = []
    for path in (folder, *folder.parents):
        if os.path.lexists(path):  # (False, not an error, for a name too long)
            break
        missing.append(path)
    return missing


def remove_made(made: list[Path]) -> None:
    """Remove the folders of :func:`missing_folders` that a run made: the run folder with
    what it holds, then each parent made with it while it is empty (one that another run has
    written into since stays, and so do those above it)."""
    if not made:
        return
    shutil.rmtree(made[0], ignore_errors=True)
    for parent in made[1:]:
        try:
            parent.rmdir()
        except OSError:
            return
