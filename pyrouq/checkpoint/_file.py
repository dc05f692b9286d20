"""A checkpoint file: written whole or not at all (:func:`_write`), and read without running
code: what torch wrote, intact, in a format version this pyrouq reads (:func:`read`)."""

from __future__ import annotations

import collections
import errno
import io
import os
import pickle
import pickletools
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch

from pyrouq._arguments import check_device
from pyrouq._util import class_name
from pyrouq._words import article
from pyrouq.checkpoint._error import CheckpointError
from pyrouq.checkpoint._paths import check_looked_up

FORMAT = "pyrouq.checkpoint"
#: The format of a saved :class:`~pyrouq.mcmc.MCMCResult` (draws and sampler statistics).
MCMC_FORMAT = "pyrouq.mcmc"
MCMC_FORMAT_VERSION = 1
FORMAT_VERSION = 3
"""The version of the checkpoint format :func:`~pyrouq.checkpoint.save` writes (the file's
``"format_version"``); :func:`~pyrouq.checkpoint.load` reads it and the earlier ones."""
# version 1: before networks were converted (pyrouq 0.1 runs); 2: without a Bayesian network's
# latent-site start values (a loaded one takes the skeleton's)
_READABLE_VERSIONS = (1, 2, 3)


def read(path: str | os.PathLike[str], *, release: bool = False) -> dict[str, Any]:
    """Read and validate the raw checkpoint dict (tensors only; no code runs); a
    :class:`ReadFile` gives the dict it was read into, without reading the file again, and
    with ``release`` lets go of it (for the caller rebuilding the run from it, load() or
    fit()'s restore: the file's tensors, once copied into the model and guide, are freed
    with that caller's last reference; a read() after that reads the file again)."""
    if isinstance(path, ReadFile):
        payload = path.payload
        if release:
            path.payload = None
        if payload is not None:
            return payload
        path = path.path  # (released: read as its path is)
    given, path = str(os.fspath(path)), Path(path)
    # (a name too long: is_file() raised a bare OSError)
    check_looked_up(path, "reading a checkpoint")
    if not path.is_file():
        what = "the path is a folder" if path.is_dir() else "the file does not exist"
        if os.path.expanduser(given) != given:  # save() refuses it too: "~/runs/c.pt"
            what += f" (its '~' is not expanded: pass os.path.expanduser({given!r}))"
        raise CheckpointError(
            f"No checkpoint at {str(path)!r}: {what}. Pass the path that "
            "pyrouq.save() or `pyrouq fit --out DIR` wrote (DIR/checkpoint.pt)."
        )
    if not os.access(path, os.R_OK):  # (was a PermissionError's traceback in the command)
        raise CheckpointError(
            f"{str(path)!r} cannot be read: permission denied. Ask its owner to make it "
            "readable (chmod +r), or load a copy you can read."
        )
    foreign = _not_written_by_torch(path)
    if foreign:
        raise CheckpointError(
            f"{str(path)!r} is not a pyrouq checkpoint: {foreign}, not a file torch.save() "
            "writes. Pass the file that pyrouq.save() or `pyrouq fit --out DIR` wrote "
            "(DIR/checkpoint.pt)."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's weights-only unpickler names what it refused after "WeightsUnpickler error:";
        # a global (a class or function to import and call) means a pickled Python object,
        # anything else (an unknown opcode, ...) a damaged file.
        reason = str(err).partition("WeightsUnpickler error:")[2].strip() or str(err)
        damaged = _damaged_entry(path)  # a flipped byte in a global's name: damage, no object
        if damaged:
            raise CheckpointError(_corrupt(path, damaged)) from None
        if "global" in reason.lower() or _plain_pickle_with_objects(path):
            raise CheckpointError(
                f"{str(path)!r} contains pickled Python objects, which pyrouq refuses to load "
                "because unpickling can run arbitrary code. Load checkpoints written by "
                "pyrouq.save(); if you trust this file, read it with torch.load yourself."
            ) from None
        raise CheckpointError(_corrupt(path, reason)) from None
    except Exception as err:  # torch's unpickler fails on damaged bytes in many ways
        raise CheckpointError(_corrupt(path, err)) from None
    damaged = _damaged_entry(path)
    if damaged:
        raise CheckpointError(_corrupt(path, damaged))
    if isinstance(payload, dict) and payload.get("format") == MCMC_FORMAT:
        version = payload.get("format_version")
        if type(version) is not int or version != MCMC_FORMAT_VERSION:  # (True == 1)
            raise CheckpointError(
                f"{str(path)!r} has MCMC result format version {version!r}; this pyrouq reads "
                f"version {MCMC_FORMAT_VERSION}. Load it with the pyrouq version that wrote it."
            )
        return payload
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(
            f"{str(path)!r} is not a pyrouq checkpoint: expected a dict with "
            f"format={FORMAT!r}, got {_kind(payload)}. {_advice(payload)}"
        )
    version = payload.get("format_version")
    if type(version) is not int and version in _READABLE_VERSIONS:  # True == 1, 3.0 == 3
        raise CheckpointError(
            f"{str(path)!r} has checkpoint format version {version!r} "
            f"({type(version).__name__}), not the int that pyrouq.save() writes: the file "
            "was edited or is damaged. Re-save the model with pyrouq.save()."
        )
    if version not in _READABLE_VERSIONS:
        raise CheckpointError(
            f"{str(path)!r} has checkpoint format version {version!r}; this pyrouq reads "
            f"versions {list(_READABLE_VERSIONS)}. Load it with the pyrouq version that wrote it."
        )
    missing = [k for k in ("description", "model", "metadata") if k not in payload]
    if missing:
        raise CheckpointError(
            f"{str(path)!r} lacks the entries {missing}: the file is damaged. Re-save it."
        )
    return payload


class ReadFile(os.PathLike[str]):
    """A checkpoint file :func:`read` once, passed where its path goes (``fit(resume_from=)``,
    :func:`pyrouq.load`, ``--resume``'s looks at the run, `pyrouq evaluate`'s at its config):
    read() gives back the dict read here rather than loading and checking the file again. Its
    ``str()`` is the path, as the messages name it. It holds the file's tensors (in host
    memory) until load() or fit()'s restore, which rebuild the run from them, take them
    (``payload`` is then None): the weights are not held twice while the run trains on or is
    evaluated."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.payload: dict[str, Any] | None = read(path)  # (refused here as read() refuses it)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"ReadFile({str(self.path)!r})"


_OBJECT_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX"}


def _not_written_by_torch(path: Path) -> str | None:
    """What ``path`` is instead of a file of :func:`torch.save`, or None: torch writes a zip
    archive holding a ``data.pkl`` (or, before torch 1.6, a pickle, opening with byte 0x80)."""
    if _is_zip(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except _ZIP_ERRORS:
            return None  # a damaged archive: torch.load says what is wrong
        if any(name.endswith("data.pkl") for name in names):
            return None
        shown = ", ".join(names[:3]) or "nothing"
        return f"it is a zip archive of {shown}"
    with open(path, "rb") as f:
        head = f.read(12)
    if not head:
        return "it is empty"
    if head[:1] == b"\x80" and not _legacy_torch(path) and not _plain_pickle_with_objects(path):
        return "it is a Python pickle (written by pickle.dump)"  # (objects: refused below)
    if head[:1] == b"\x80" or head[:2] == b"PK":  # a pickle, or a truncated archive
        return None
    return f"it begins with {head!r}"


_FRAMING = ("PROTO", "FRAME")


def _legacy_torch(path: Path) -> bool:
    """Whether the pickle ``path`` opens as torch.save's format before torch 1.6 does: with
    torch's magic number, pickled alone (a damaged one counts, for torch.load to tell)."""
    try:
        with open(path, "rb") as f:  # (the first value read, not the whole file)
            values = (arg for op, arg, _ in pickletools.genops(f) if op.name not in _FRAMING)
            return next(values, None) == torch.serialization.MAGIC_NUMBER
    except Exception:  # cut short or no pickle: torch.load says what is wrong
        return True


#: What :mod:`zipfile` raises on a damaged archive: a bad header, a name that is not UTF-8 (a
#: flipped bit in it), an unknown version or compression, an "encrypted" flag, a short read.
_ZIP_ERRORS = (zipfile.BadZipFile, ValueError, NotImplementedError, RuntimeError, EOFError, OSError)

#: The MS-DOS folder bit of a zip entry's external attributes: torch's reader (miniz) takes an
#: entry with it for a folder and gives its tensor uninitialised memory, whatever its bytes.
_FOLDER_BIT = 0x10


def _is_zip(path: Path) -> bool:
    """Whether ``path`` is a zip archive (a damaged end record, which
    :func:`zipfile.is_zipfile` raises on rather than answers, counts as one)."""
    try:
        return zipfile.is_zipfile(path)
    except _ZIP_ERRORS:
        return True


def _damaged_entry(path: Path) -> str | None:
    """Why the zip archive ``path`` is damaged (its first entry whose bytes fail their CRC-32,
    or that cannot be read, or that torch would read as a folder), or None (torch.load checks
    none of it: a flipped byte in a tensor loads as another value). Entries written without a
    CRC (``torch.serialization.set_crc32_options(False)``: 0) pass that check."""
    if not _is_zip(path):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.external_attr & _FOLDER_BIT or info.is_dir():
                    return f"its entry {info.filename!r} is marked as a folder"
                if info.CRC == 0:
                    continue
                try:
                    with archive.open(info) as entry:  # checks the CRC once read to the end
                        while entry.read(1 << 24):
                            pass
                except zipfile.BadZipFile as err:
                    if "CRC" in str(err):
                        return f"its entry {info.filename!r} fails its checksum"
                    return f"its entry {info.filename!r} is unreadable ({err})"
                except _ZIP_ERRORS as err:
                    return f"its entry {info.filename!r} is unreadable ({type(err).__name__})"
    except _ZIP_ERRORS as err:
        return f"the archive is unreadable ({type(err).__name__}: {err})"
    return None


def _plain_pickle_with_objects(path: Path) -> bool:
    """Whether ``path`` is a bare pickle (not torch's zip format) that builds Python objects.

    Read with :mod:`pickletools` (which parses opcodes and executes nothing).
    """
    if _is_zip(path):
        return False
    try:
        with open(path, "rb") as f:
            return any(op.name in _OBJECT_OPCODES for op, _, _ in pickletools.genops(f))
    except Exception:  # not a pickle at all: a damaged file
        return False


def _corrupt(path: Path, err: BaseException | str) -> str:
    """The message for a file that is no readable checkpoint, with the first line of why (not
    torch's advice to load it without ``weights_only``, which pyrouq never does)."""
    text = str(err).strip()
    reason = text.splitlines()[0] if text else getattr(type(err), "__name__", "unreadable")
    return (
        f"{str(path)!r} is not a readable checkpoint: it is truncated or corrupted ({reason}). "
        "Use an intact copy, or write it again: save() the model anew, or rerun the training "
        "that wrote it (a run keeps one checkpoint, its last epoch's, and no earlier one)."
    )


def _kind(value: Any) -> str:
    if _state_dict(value):
        return (
            f"a dict of {len(value)} tensors and no 'format' entry: a state_dict() (of a model "
            "or a guide) or an MCMCResult's samples, saved with torch.save"
        )
    if isinstance(value, dict):
        return f"a dict with format={value.get('format')!r}"
    return f"a {type(value).__name__}"


def _state_dict(value: Any) -> bool:
    """Whether ``value`` is a ``state_dict()`` (or an MCMCResult's ``samples``) saved with
    torch.save: tensors by name."""
    return (
        isinstance(value, dict)
        and bool(value)
        and "format" not in value
        and all(isinstance(k, str) and torch.is_tensor(v) for k, v in value.items())
    )


def _advice(value: Any) -> str:
    """What to do with a file :func:`read` refuses as no checkpoint (for load() and for
    ``fit(resume_from=...)``, which both read it)."""
    if _state_dict(value):  # torch.save(x.state_dict(), path): no description to rebuild from
        return (
            "It holds tensors, not the description pyrouq.save() writes to rebuild the model: "
            "build the model (and guide) as for training, call x.load_state_dict("
            "torch.load(path, weights_only=True)) on the one it came from, then "
            "pyrouq.save(path, model, guide) writes a checkpoint (load it with module= for a "
            "converted network). An autoguide (AutoNormal) makes its parameters on its first "
            "run: call guide(x, y) once before loading into it (pyrouq.save() stores "
            "mean_field_guide() guides only). An MCMCResult's samples: save the result itself, "
            "pyrouq.save(path, result). A run to resume needs the checkpoint "
            "fit(checkpoint=...) writes."
        )
    return "Write checkpoints with pyrouq.save()."


def _write(path: Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to a temporary file beside ``path`` (beside the file a symbolic link
    points to, which is written as torch.save would, the link kept), flush it to the disk,
    then rename it there: a crash, of the process or of the machine, leaves the file before
    or after, never a truncated one (renamed unflushed, a power cut could leave the name on
    an empty file, the previous checkpoint lost). The file replaced keeps its permissions (a
    private checkpoint stays private), as torch.save would keep them; a new one gets the usual
    mode. torch.save is given the open file, not its name: it names the archive's folder
    after a file's name (the random temporary one), an open file's ``archive/``, so that the
    same payload gives the same bytes. A full disk is an OSError (ENOSPC) naming ``path``,
    not torch's RuntimeError "unexpected pos" (:func:`_disk_error`). A device or a pipe
    (``/dev/null``, a FIFO) is written into, as torch.save writes it: renamed over, the
    temporary file would take its place (as root, ``/dev/null`` replaced by a regular file).
    Looked up through its links, as open() follows them: ``/dev/stdout`` of a piped process
    leads to ``/proc/self/fd/1``, whose target (``pipe:[...]``) is no path realpath can
    resolve."""
    try:
        found = os.stat(path).st_mode
    except OSError:  # a new file: the mode _create gives it (0o666 less the umask)
        found = None
    if found is not None and not (stat.S_ISREG(found) or stat.S_ISDIR(found)):
        _dump(path, payload, path)  # a device or a pipe (/dev/null, a FIFO): written into
        return path  # as torch.save writes it, not replaced by a file of the temporary's
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = None if found is None else found & 0o777
    handle, tmp = _create(target, 0o666 if mode is None else 0o600)  # (private until chmod)
    try:
        _dump(handle, payload, target)
        if mode is not None:  # after the writes: a read-only file's mode (0o444) forbids them
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _dump(file: int | Path, payload: dict[str, Any], target: Path) -> None:
    """torch.save ``payload`` into ``file`` (an open descriptor, or a device or pipe's path),
    flushed to the disk; a full disk (or quota, size limit) is an OSError naming ``target``."""
    try:
        with open(file, "wb") as out:
            try:
                torch.save(payload, out)
            except RuntimeError as err:  # torch's writer took the file's OSError (ENOSPC,
                disk = _disk_error(err, target)  # EFBIG): "unexpected pos"
                if disk is None:
                    raise
                raise disk from None
            out.flush()
            try:
                os.fsync(out.fileno())
            except OSError as err:  # a file system that cannot flush (some FUSE mounts), a
                if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):  # device
                    raise
    except OSError as err:  # a small archive's bytes meet the disk at the flush or close
        if err.filename is None and err.errno in _DISK_ERRORS:
            raise OSError(err.errno, err.strerror or str(err), str(target)) from None
        raise


def _create(target: Path, mode: int) -> tuple[int, str]:
    """A new temporary file beside ``target``, open for writing: (its descriptor, its name).
    Created with ``mode``, which the operating system reduces by the process's umask (and a
    folder's default ACL) as for any new file: 0o666 gives a new checkpoint the usual mode
    without reading the umask (``os.umask`` can only read it by setting it: for that instant
    a file another thread creates would get mode 0o666); 0o600 keeps the file that replaces
    an existing one private until it takes that one's mode (a private checkpoint's contents
    are never readable by others). Its name is ``target``'s, cut to fit the file system's 255
    bytes with the random part: any name that torch.save takes can be saved to."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    stem = target.name
    while len(os.fsencode(f".{stem}.{0:012x}.tmp")) > 255 and stem:
        stem = stem[:-1]
    for _ in range(100):  # random names, tried as mkstemp tries them
        tmp = os.path.join(target.parent, f".{stem}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "No usable temporary file name found", str(target))


_DISK_ERRORS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO}
"""The errors of a write that fails for the disk's sake (full, a file-size limit, a quota,
the device): those torch.save's writer reports as its own "unexpected pos"."""


def _disk_error(err: RuntimeError, target: Path) -> OSError | None:
    """The disk's OSError behind torch.save's RuntimeError (its writer meets a write that
    failed, then reports the archive's position: "unexpected pos 2432 vs 2326"), naming
    ``target``; None for any other RuntimeError (one of a tensor's or an object's own
    pickling, even if an OSError of its own came before it), which is raised as it came."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, OSError):  # (a context hidden by
        hidden = cause.__suppress_context__  # "raise ... from None" is not its cause)
        cause = cause.__cause__ or (None if hidden else cause.__context__)
    if cause is None or cause.errno not in _DISK_ERRORS:
        return None
    return OSError(cause.errno, cause.strerror or str(cause), str(target))


def _cpu(value: Any) -> Any:
    """``value`` with every tensor moved to the CPU (dicts, lists and tuples walked). A view
    of a larger tensor (thinned draws, ``samples[:, ::10]``) is copied out: torch.save would
    write all of the memory it views, the file as large as before the thinning."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if (
            value.layout == torch.strided  # (a sparse tensor has no one storage)
            and value.untyped_storage().nbytes() > value.numel() * value.element_size()
        ):
            value = value.clone()
        return value
    if isinstance(value, dict):
        out = {k: _cpu(v) for k, v in value.items()}
        if not hasattr(value, "_metadata"):
            return out
        # a state_dict's module versions, which a module's _load_from_state_dict may read
        # (torchvision's MNASNet refuses a state without them); torch.load keeps them
        state = collections.OrderedDict(out)
        state._metadata = value._metadata  # type: ignore[attr-defined]
        return state
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


_PLAIN = (bool, int, float, complex, str, dict, collections.OrderedDict, list, tuple)
_AT_ONCE = _PLAIN[:5]
"""What :func:`unreadable` passes at once, beside None and tensors."""


def unreadable(value: Any, where: str) -> tuple[str, str] | None:
    """Where in ``value`` the first value lies that ``torch.load(weights_only=True)`` refuses,
    and its class name: tensors, None and these very types (dicts, lists and tuples walked)
    pass at once; a subclass (an IntEnum, numpy's float64, a namedtuple) or another value
    (a torch.Size, a dtype, an object) is written and read back."""
    if value is None or torch.is_tensor(value) or type(value) in _AT_ONCE:
        return None
    if type(value) in _PLAIN:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and type(key) not in _AT_ONCE and unreadable(key, where):
                return f"{where} key {key!r}", _qualified(key)
            if item is None or type(item) in _AT_ONCE or torch.is_tensor(item):
                continue  # (no path written for it: save() walks fit()'s history every epoch)
            found = unreadable(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
    except Exception:
        return where, _qualified(value)
    return None


def _qualified(value: Any) -> str:
    """The class of ``value`` with its module (``numpy.longdouble``), Python's own bare."""
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"


def check_read_back(model: Any) -> None:
    """Refuse a model whose state holds a value that :func:`read` would refuse to unpickle (a
    module's ``get_extra_state()`` returning an object of its own): save() would write a file
    that load() refuses, as holding pickled Python objects. Tensors, numbers, strings, and
    lists, tuples and dicts of them pass at once; any other value is written and read back
    (:func:`unreadable`)."""
    if not isinstance(model, torch.nn.Module):
        return
    state = model.state_dict(keep_vars=True)  # (a lazy parameter cannot be detached)
    for key, value in state.items():
        found = unreadable(value, key)
        if found:
            returns = "what its module's get_extra_state() returns"
            what = (  # the value itself, or one inside the dict, list or tuple it returns
                f"is {article(class_name(value))} {class_name(value)} ({returns})"
                if found[0] == key
                else f"({returns}) holds {article(found[1])} {found[1]} at {found[0]}"
            )
            raise CheckpointError(
                f"save() cannot write {class_name(model)}: its state entry {key!r} {what}, "
                "which load() would refuse to unpickle, as any Python object. Make "
                "get_extra_state() return tensors, numbers, strings, lists or dicts of them, "
                "or save model.state_dict() with torch.save yourself."
            )


def checked_device(device: Any) -> Any:
    """``load(device=...)``: ``device`` if torch can put tensors there (None: the default), or
    a ValueError saying what to pass (torch's errors came after the whole file was rebuilt,
    and the meta device took the model silently, its saved values dropped)."""
    check_device(device, "load()", "the saved values would be dropped")
    return device
