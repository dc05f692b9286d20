"""Reading the MNIST-format IDX files of a split: from ``root=``, ``$PYROUQ_DATA`` or the copy
bundled in the package (plain or gzip-compressed, torchvision's layout), checked and cached."""

from __future__ import annotations

import contextlib
import gzip
import os
import zlib
from pathlib import Path

import torch

from pyrouq._arguments import check_folder
from pyrouq._lookup import lookup_error, name_too_long
from pyrouq._words import slip_hint

_BUNDLED_ROOT = Path(__file__).parent / "_data"
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
_LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension


class DataError(ValueError):
    """A data file is missing, corrupt or inconsistent."""


# --------------------------------------------------------------------------------------------
# IDX files
# --------------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # truncated: EOFError; garbled: zlib.error
        raise DataError(
            f"Could not read {path}: {e}. The file is corrupt or truncated; delete it and copy "
            "or download it again (or pass another root=)."
        ) from e


def _read_idx(path: Path, expected_magic: int) -> torch.Tensor:
    """Read an unsigned-byte IDX file into a uint8 tensor, checking its header and length."""
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(
            f"{path} is truncated: {len(raw)} bytes, not even an IDX header. "
            "Copy or download the file again."
        )
    magic = int.from_bytes(raw[:4], "big")
    if magic != expected_magic:
        kind = "images" if expected_magic == _IMAGES_MAGIC else "labels"
        raise DataError(
            f"{path} is not an IDX {kind} file: expected magic number "
            f"0x{expected_magic:08x}, got 0x{magic:08x}. Check that the path points at the "
            f"MNIST {kind} file, or copy it again."
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated inside its header. Copy or download it again.")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    expected = header + _prod(dims)
    if len(raw) != expected:
        raise DataError(
            f"{path} is truncated or padded: its header declares shape {tuple(dims)} "
            f"({expected} bytes in all) but the file holds {len(raw)} bytes. "
            "Copy or download it again."
        )
    if expected == header:  # torch.frombuffer refuses an empty buffer with its own words
        raise DataError(
            f"{path} holds no data: its header declares shape {tuple(dims)}. "
            "Copy or download it again."
        )
    data = torch.frombuffer(bytearray(raw[header:]), dtype=torch.uint8)
    return data.reshape(dims)


def _prod(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


# --------------------------------------------------------------------------------------------
# Locating files
# --------------------------------------------------------------------------------------------


def _candidates(root: Path, folder: str, name: str) -> list[Path]:
    return [
        root / folder / "raw" / name,
        root / folder / "raw" / f"{name}.gz",
    ]


def _find(root: Path, folder: str, name: str) -> Path | None:
    for path in _candidates(root, folder, name):
        if path.is_file():
            return path
    return None


def _resolve_root(root: str | os.PathLike[str] | None) -> tuple[Path, str]:
    if root is not None:
        hint = "Pass e.g. root='data' (holding data/MNIST/raw/...), or None for the default."
        check_folder("root", root, hint)
        if isinstance(root, str) and not root.strip():  # (the command refuses --data-root "")
            what = (  # (pathlib reads '' as '.', and ' ' as a folder of that name)
                "an empty one, which pathlib reads as the current folder "
                "(root=os.environ.get('DATA', '') with DATA unset?)"
                if not root
                else "a blank one (whitespace only), which pathlib takes for a folder of that name"
            )
            raise ValueError(
                f"Expected root to be a folder's name, got {root!r}, {what}. "
                "Pass a folder in torchvision layout, e.g. root='data' (holding data/MNIST/raw/"
                "...), or root=None for $PYROUQ_DATA or the bundled copy."
            )
        return Path(root).expanduser(), "root="
    env = os.environ.get("PYROUQ_DATA")
    if env and not env.strip():  # (as root=" " is refused: not a folder named " " looked up)
        raise DataError(
            f"Expected $PYROUQ_DATA to be a folder's name, got {env!r}, a blank one (whitespace "
            "only), which pathlib takes for a folder of that name. Point it at a folder in "
            "torchvision layout (DIR/MNIST/raw/...), or unset it (or set it empty) for the "
            "bundled copy."
        )
    if env:
        return Path(env).expanduser(), "$PYROUQ_DATA"
    return _BUNDLED_ROOT, "the bundled copy"


def _looked_up(base: Path, origin: str, folder: str) -> None:
    """Refuse a data folder the system cannot look up (a name of more than 255 bytes, a folder
    on the way that may not be entered), where pathlib's ``is_file()`` raises a bare OSError
    (before Python 3.13). A missing one is told later, with the files it lacks."""
    err = lookup_error(base)
    if err is not None:
        fix = "a shorter path" if name_too_long(err) else "a folder you can read"
        given = f"{origin.rstrip('=')}={str(base)!r}"  # root=... or $PYROUQ_DATA=...
        raise DataError(
            f"Expected a data folder that can be looked up, got {given} ({err.strerror}). "
            f"Pass {fix}, in torchvision layout (<root>/{folder}/raw/...)."
        )


def _locate(
    folder: str,
    split: str,
    root: str | os.PathLike[str] | None,
    download: bool | None,
    both: bool = False,
) -> tuple[Path, Path]:
    """The split's two files; ``download`` None: the caller has no download option (the
    message then does not offer one). ``both``: the caller reads both splits from this root
    (the loaders), so root=None helps only where both are bundled (Fashion-MNIST's train split
    is not: leaving root=None out of a loader's call fails on it)."""
    if split not in _FILES:
        hint = slip_hint(split, _FILES)
        raise ValueError(
            f"Unknown split {split!r}{hint}: expected 'train' or 'test'. Pass split='train' or "
            "split='test'."
        )
    base, origin = _resolve_root(root)
    _looked_up(base, origin, folder)
    names = _FILES[split]
    found = [_find(base, folder, n) for n in names]
    if (
        any(p is None for p in found)
        and download
        and origin != "the bundled copy"
        and not _root_above(base, folder, names)  # no copy nested inside the data set's
    ):
        _download(folder, base, origin)
        found = [_find(base, folder, n) for n in names]
    for name, path in zip(names, found, strict=True):
        if path is None:
            where = Path(os.path.abspath(base))  # a relative root, from the working folder
            expected = _candidates(where, folder, name)[0]
            if origin == "the bundled copy" and not _BUNDLED_ROOT.is_dir():
                hint = (  # (not "bundles only MNIST and ...": MNIST's own files are missing)
                    f"the bundled copy is not a folder on disk: {_packed_in()}; pass root= (or "
                    f"set $PYROUQ_DATA) to a folder in torchvision layout (<root>/{folder}/raw/"
                    "...), or install pyrouq as a folder (pip install)"
                )
            elif origin == "the bundled copy":
                hint = (
                    f"pyrouq bundles only MNIST and the Fashion-MNIST test split; for the "
                    f"{folder} {split} split pass root= (or set $PYROUQ_DATA) to a folder in "
                    f"torchvision layout (<root>/{folder}/raw/...)"
                )
                if download:
                    hint += "; download=True downloads into that root, never into the package"
            elif above := _root_above(base, folder, names):
                verb = "pass root=" if origin == "root=" else "set it to "
                hint = f"{origin} is the folder above {folder}/: {verb}{str(above)!r}"
            elif base.is_file():  # e.g. root= one of the IDX files themselves
                above = _root_above(base.parent, folder, names)
                verb = "pass" if origin == "root=" else "set it to"
                hint = f"{origin} names a file, not a folder: {verb} the folder that holds " + (
                    f"{folder}/, {str(above)!r}" if above else f"{folder}/raw/"
                )
            else:
                layout = f"pass a root= in torchvision layout (<root>/{folder}/raw/{name}[.gz])"
                others = []
                splits = _FILES if both else {split: names}
                if all(  # the split is bundled, and so is any other the caller reads
                    _find(_BUNDLED_ROOT, folder, n) for files in splits.values() for n in files
                ):
                    others.append(
                        "unset $PYROUQ_DATA to use the bundled copy"
                        if origin == "$PYROUQ_DATA"
                        else "leave root=None to use the bundled copy"
                        + (" (and unset $PYROUQ_DATA)" if os.environ.get("PYROUQ_DATA") else "")
                    )
                if download is not None:
                    others.append("pass download=True")
                hint = layout + "".join(
                    f"{', ' if k < len(others) - 1 else ' or '}{o}" for k, o in enumerate(others)
                )
            missing = "" if base.exists() else " That folder does not exist."
            raise FileNotFoundError(
                f"{folder} {split} file not found: expected {expected} or {expected}.gz "
                f"(looked under {origin}: {where}).{missing} To fix: {hint}."
            )
    return found[0], found[1]  # type: ignore[return-value]


def _packed_in() -> str:
    """Why the bundled folder is missing: the archive pyrouq was imported from (a zip on
    ``sys.path``, which ``Path`` cannot read inside), or an install without its data files."""
    for parent in _BUNDLED_ROOT.parents:
        if parent.is_file():
            return f"pyrouq was imported from inside the file {str(parent)!r} (a zip archive)"
        if parent.is_dir():
            break
    return "pyrouq was installed without its data files"


def _root_above(base: Path, folder: str, names: tuple[str, ...]) -> Path | None:
    """The root above ``base`` where ``root=`` named the data set's own folder, or its
    ``raw/`` (torchvision's usual mix-up), and that root holds the split's files ``names``;
    else None."""
    base = Path(os.path.abspath(base))  # root="." or ".." inside MNIST/ (links kept as named)
    if base.name == folder:
        above = base.parent
    elif base.name == "raw" and base.parent.name == folder:
        above = base.parent.parent
    else:
        return None
    return above if all(_find(above, folder, n) for n in names) else None


def _download(folder: str, root: Path, origin: str) -> None:
    """Fetch the data set's two splits into ``root`` through torchvision. A failed fetch (no
    network, the servers down, a file that fails its checksum) says where the files were to go
    and what to do, not torchvision's words alone (which name neither)."""
    from torchvision import datasets

    cls = {"MNIST": datasets.MNIST, "FashionMNIST": datasets.FashionMNIST}[folder]
    made = _missing_folders(Path(os.path.abspath(root)) / folder / "raw")
    for train in (True, False):
        try:
            cls(str(root), train=train, download=True)
        except (RuntimeError, OSError) as err:
            for path in made:  # the folders torchvision made for it, while they are empty
                with contextlib.suppress(OSError):
                    path.rmdir()
            raw = Path(os.path.abspath(root)) / folder / "raw"
            said = " ".join(str(err).split())  # (torchvision's lines, one per mirror tried)
            # (root= or $PYROUQ_DATA named the folder; root=None reads $PYROUQ_DATA where set)
            unset = "unset $PYROUQ_DATA" if os.environ.get("PYROUQ_DATA") else ""
            leave = "leave root=None" if origin == "root=" else ""
            bundled = (
                f"{' and '.join(w for w in (leave, unset) if w)} to use the bundled copy"
                if folder == "MNIST"
                else "for its test split alone, bundled, "
                f"{unset + ' and ' if unset else ''}use fashion_mnist_arrays() or ood_loader()"
            )
            raise RuntimeError(
                f"download=True could not fetch {folder} into {raw} ({type(err).__name__}: "
                f"{said}). Where there is no network, copy the files there (torchvision's "
                f"layout: train-images-idx3-ubyte[.gz] and the others), or {bundled}."
            ) from err


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing


def _stamp(path: Path) -> tuple[int, int, int]:
    """What changes when ``path``'s content may have: its mtime, ctime and size."""
    st = path.stat()
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size


# (images path, labels path) -> (the files' stamps, images, labels)
_CACHE: dict[tuple[Path, Path], tuple[tuple[int, ...], torch.Tensor, torch.Tensor]] = {}


def _arrays(
    folder: str,
    split: str,
    root: str | os.PathLike[str] | None,
    download: bool | None = None,
    both: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    images_path, labels_path = _locate(folder, split, root, download, both)
    key = (images_path.resolve(), labels_path.resolve())
    # ctime too: a file rewritten in place with its mtime restored (cp -p, os.utime) has a new
    # one, which no one can set back, and a stale cache would serve the old pixels silently
    stamp = tuple(v for p in key for v in _stamp(p))
    cached = _CACHE.get(key)
    if cached is not None and cached[0] == stamp:  # shared: callers hand out copies
        return cached[1], cached[2]
    images = _read_idx(images_path, _IMAGES_MAGIC)
    labels = _read_idx(labels_path, _LABELS_MAGIC).long()
    if images.dim() != 3:
        raise DataError(f"{images_path} holds a {images.dim()}-d array; expected (N, 28, 28).")
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{folder} {split}: {images.shape[0]} images in {images_path} but "
            f"{labels.shape[0]} labels in {labels_path}; the two files must hold the same "
            "number of examples. One of them is from another split or data set: copy both again."
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) > 9):
        raise DataError(
            f"{labels_path} holds labels from {int(labels.min())} to {int(labels.max())}; "
            "MNIST and Fashion-MNIST labels are 0 to 9. It is not a labels file of either data "
            "set: copy it again."
        )
    _CACHE[key] = (stamp, images, labels)
    return images, labels
