"""The paths a checkpoint is read from and written to: :func:`check_path_type` refuses what is
no path (a model given first, as ``torch.save`` takes it), :func:`check_target` a path a file
cannot be written to (a folder, one below a file, an unexpanded ``~``, an unwritable folder),
:func:`check_looked_up` one the system cannot look up (a name too long), for both."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from torch import nn

from pyrouq._lookup import lookup_error, name_too_long
from pyrouq._util import class_name
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.mcmc import MCMCResult

__all__ = ["check_looked_up", "check_path_type", "check_target"]


def check_path_type(path: Any, caller: str) -> None:
    """Refuse a path that is not a str or PathLike, naming what came: a model given first, as
    ``torch.save(obj, f)`` takes it, most likely."""
    if isinstance(path, (str, os.PathLike)):
        return
    fix = "pass the file pyrouq.save() wrote, e.g. load('model.pt')"
    if caller == "save()":
        fix = "pass e.g. save('model.pt', model)"
        if isinstance(path, (nn.Module, MCMCResult)):  # torch.save(obj, f)'s order
            fix = "the path comes first (torch.save takes the object first): " + fix[5:]
    raise TypeError(
        f"{caller} expects a file path (str or pathlib.Path) as path, got "
        f"{class_name(path)}; {fix}."
    )


def check_looked_up(path: str | os.PathLike[str], caller: str) -> None:
    """Refuse, as a :class:`CheckpointError` naming ``caller`` (``save()``, ...), a path the
    system cannot look up: a file or folder name of more than 255 bytes, or a whole path
    longer than the system takes (a folder on the way that may not be entered, a loop of
    links), where pathlib's ``is_file()`` / ``is_dir()`` raise a bare OSError (before
    Python 3.13). A name too long below a folder not made yet is refused too: the system
    says only that the folder is missing, and save() would make it, then fail on the name. A
    missing path of names that fit passes: save() makes it, load() tells it."""
    text = str(os.fspath(path))
    too_long = [name for name in Path(text).parts if len(os.fsencode(name)) > _NAME_MAX]
    problem = lookup_error(path)
    if problem is None:  # (a missing path too: one of a name too long is refused still)
        if not too_long:
            return
        problem = OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG))
    if not name_too_long(problem):
        fix = "another path"
    elif too_long:
        size = len(os.fsencode(too_long[0]))
        fix = f"a shorter path (each name at most {_NAME_MAX} bytes; one here is {size})"
    else:  # each name fits: the whole path is longer than the system looks up
        fix = f"a shorter path (this one is {len(os.fsencode(text))} bytes in all, its names "
        fix += f"each at most {_NAME_MAX}: fewer or shorter folders)"
    raise CheckpointError(
        f"Expected a path the system can look up, got {text!r} for {caller} "
        f"({problem.strerror}). Pass {fix}."
    ) from None


_NAME_MAX = 255
"""The bytes a file or folder name may take (ext4, XFS, btrfs, APFS, NTFS's 255 characters)."""


def check_target(path: str | os.PathLike[str], caller: str, example: str = "checkpoint.pt") -> None:
    """Refuse a path a checkpoint cannot be written to: a folder, one below a file, one
    starting with a '~' left unexpanded, or one in a folder not writable (a
    :class:`CheckpointError` naming ``caller``; ``example``, the file name its advice gives).
    Its missing folders are created when it is written."""
    given, path = str(os.fspath(path)), Path(path)
    check_looked_up(path, caller)  # (a name too long: the is_dir() below raised OSError)
    if os.path.expanduser(given) != given:  # "~/runs/c.pt" would make a folder named "~" here
        raise CheckpointError(
            f"{caller} got {given!r}, whose '~' is not expanded (it would name a folder or a "
            f"file '~' in the working directory); pass os.path.expanduser({given!r})."
        )
    # "runs/" or "runs/.", a folder yet to make (Path drops the "/" and the ".")
    slash = given.endswith(("/", os.sep)) or os.path.basename(given) in (".", "..")
    if path.is_dir() or slash:
        shown = given if slash else str(path)
        raise CheckpointError(
            f"{caller} needs a file path, got the folder {shown!r}; pass e.g. "
            f"{str(path / example)!r}."
        )
    above = next((parent for parent in path.parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        raise CheckpointError(
            f"{caller} cannot write {str(path)!r}: {str(above)!r} is a file, not a folder. "
            "Pass a path inside a folder (missing folders are created)."
        )
    if above is not None and not os.access(above, os.W_OK | os.X_OK):
        raise CheckpointError(
            f"{caller} cannot write {str(path)!r}: the folder {str(above)!r} is not writable. "
            "Pass a path in a folder you can write to."
        )
