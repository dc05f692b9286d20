"""Whether the system can look a path up, the check made before a path is used by the command's
options (``--data-root``, ``--out``, ``RUN_DIR``), the data loaders' ``root`` and the
checkpoints' paths, each refusing in its own words: a name of more than 255 bytes, a folder on
the way that may not be entered, a loop of links make ``os.stat`` raise an OSError, which
pathlib's ``exists()`` / ``is_file()`` / ``is_dir()`` raise bare (before Python 3.13). A missing
path can be looked up: it is made, or told, later."""

from __future__ import annotations

import errno
import os

__all__ = ["lookup_error", "name_too_long"]


def lookup_error(path: str | os.PathLike[str]) -> OSError | None:
    """The OSError the system raises looking ``path`` up, or None where it can (a missing path
    too, or one below a file)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        return err
    return None


def name_too_long(err: OSError) -> bool:
    """Whether ``err`` is a name of more than 255 bytes (the fix: a shorter path)."""
    return err.errno == errno.ENAMETOOLONG
