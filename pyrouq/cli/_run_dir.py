"""The run folder of ``pyrouq fit``: which folder (``--out`` or ``runs/MODEL-TIMESTAMP``),
claiming it with the run's ``config.json``, clearing an earlier run (``--overwrite``) and
continuing an interrupted one (``--resume``: the same command, the same folder, its
``checkpoint.pt``)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

from pyrouq.cli._build import CommandError
from pyrouq.cli._report import RUN_PLOTS

#: config.json entries a resumed run may differ in: how it was typed, the libraries' versions.
_NOT_COMPARED = ("command", "versions")


def out_dir(args: argparse.Namespace) -> Path:
    """The run folder: ``--out``, checked before anything is built, or a new folder under
    ``runs/`` named after the model and the time (made unique by :func:`claim`). With
    ``--resume``, the folder of the interrupted run, which must hold its config and
    checkpoint."""
    if args.resume:
        return _resumed_dir(args)
    if args.out is None:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        name = args.model.replace(":", "-").replace(".", "-")
        return Path("runs") / f"{name}-{stamp}"
    out = _given_out(args)
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {str(out)!r} is a file; pass a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        if (out / "checkpoint.pt").is_file() and not (out / "metrics.json").exists():
            raise CommandError(
                f"--out {str(out)!r} holds an interrupted run (a checkpoint.pt, no "
                "metrics.json); pass --resume to continue it, --overwrite to start anew, or "
                "another folder"
            )
        raise CommandError(
            f"--out {str(out)!r} exists and is not empty; pass --overwrite or another folder"
        )
    return out


def _given_out(args: argparse.Namespace) -> Path:
    if not args.out.strip():  # an unset shell variable, `--out "$RUN"`: not the current folder
        raise CommandError(
            f"--out is {args.out!r}, an empty name; pass a folder, or leave --out out for "
            "runs/MODEL-TIMESTAMP"
        )
    return Path(os.path.expanduser(args.out))  # as --data-root: no shell expands --out=~/runs


def _resumed_dir(args: argparse.Namespace) -> Path:
    if args.out is None:
        raise CommandError(
            "--resume continues the interrupted run in --out, but no --out was given; pass "
            "--out RUN_DIR, the folder the interrupted run printed"
        )
    if args.overwrite:
        raise CommandError(
            "--resume continues the run in --out and --overwrite removes it; pass one of them"
        )
    out = _given_out(args)
    if not (out / "config.json").is_file():
        raise CommandError(
            f"--resume: {str(out)!r} holds no config.json, so no run of `pyrouq fit` to "
            "continue (a run stopped before its first epoch leaves none); start it anew "
            "without --resume"
        )
    if (out / "metrics.json").exists():
        raise CommandError(
            f"--resume: the run in {str(out)!r} finished (it wrote metrics.json), so there is "
            f"nothing to resume; evaluate it with `pyrouq evaluate {shlex.quote(str(out))}`, "
            "or train longer in another --out with more --epochs"
        )
    if not (out / "checkpoint.pt").is_file():
        raise CommandError(
            f"--resume: {str(out)!r} holds no checkpoint.pt to continue from; start the run "
            "anew there with --overwrite"
        )
    return out


def claim(out: Path, args: argparse.Namespace, config: dict[str, Any]) -> tuple[Path, bool]:
    """Make the run folder ``out`` and write its ``config.json``, which no other run may have
    written first: ``(the folder, whether this run created it)``. A default folder taken by
    another run started in the same second gets a suffix (``-2``, ``-3``, ...); an ``--out``
    that another run has claimed since the check is refused (with --overwrite, the earlier
    run's files are removed first). With ``--resume`` the folder is the interrupted run's,
    whose ``config.json`` must record the same run as ``config``."""
    if args.resume:
        check_same_run(out, config)
        return out, False
    text = json.dumps(config, indent=2) + "\n"
    default = args.out is None
    for number in range(1, 10_000):
        folder = out if number == 1 or not default else out.with_name(f"{out.name}-{number}")
        try:
            fresh = not folder.exists()
            if default:
                try:
                    folder.mkdir(parents=True)
                except FileExistsError:
                    continue  # another run's, started in the same second
            else:
                folder.mkdir(parents=True, exist_ok=True)
                if args.overwrite:
                    clear_run(folder)
            with open(folder / "config.json", "x") as file:
                file.write(text)
            return folder, fresh
        except FileExistsError:
            raise CommandError(
                f"--out {str(folder)!r} was claimed by another run while this one started (it "
                "holds a config.json now); pass another folder"
            ) from None
        except OSError as err:
            what = f"{str(folder)!r} (the default)" if default else f"--out {str(folder)!r}"
            raise CommandError(
                f"cannot write the run folder {what}: {err.strerror or err}; pass "
                f"{'--out ' if default else ''}a folder you can write to"
            ) from None
    raise CommandError(f"runs/ holds 10,000 runs named {out.name}-*; pass --out")


def check_same_run(out: Path, config: dict[str, Any]) -> None:
    """Refuse ``--resume`` of a command that would train another run than the one recorded in
    ``out/config.json`` (another model, data, seed, number of epochs, ...); else record in
    ``config`` the command that started the run, as config.json does."""
    path = out / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CommandError(f"--resume: cannot read {str(path)!r}: {err}") from None
    if not isinstance(saved, dict):
        raise CommandError(f"--resume: {str(path)!r} is not a run's config (a JSON object)")
    keys = [k for k in {**saved, **config} if k not in _NOT_COMPARED]
    differ = [k for k in keys if saved.get(k, "(none)") != config.get(k, "(none)")]
    if differ:
        shown = "; ".join(
            f"{k} {json.dumps(saved.get(k))} there, {json.dumps(config.get(k))} now"
            for k in differ[:3]
        )
        raise CommandError(
            f"--resume continues the run in {str(out)!r} as it was started, but this command "
            f"trains another ({shown}); run the recorded command with --resume: "
            f"{resume_command(saved, out)}"
        )
    config["command"] = saved.get("command", config.get("command"))


def resume_command(config: dict[str, Any], out: Path) -> str:
    """The command that continues the run of ``config`` in ``out``: the recorded one with
    ``--resume`` (and ``--out``, when the run took the default folder), without its
    ``--overwrite`` (typed in full or shortened, as argparse takes ``--ov``), under
    ``torchrun`` on as many ranks when the run had several (its world size is compared)."""
    words = shlex.split(str(config.get("command", "pyrouq fit ...")))
    if not any(w == "--out" or w.startswith("--out=") for w in words):
        words += ["--out", str(out)]
    words = [w for w in words if not (len(w) >= 4 and "--overwrite".startswith(w))]
    if "--resume" not in words:
        words.append("--resume")
    world = config.get("world_size")
    if isinstance(world, int) and world > 1 and words[:1] == ["pyrouq"]:
        return f"torchrun --standalone --nproc_per_node {world} -m {shlex.join(words)}"
    return shlex.join(words)


def clear_run(out: Path) -> None:
    """Remove an earlier run's files from ``out`` (--overwrite, once the new run is built):
    none of them may stay beside the new run's, which could fail or be interrupted. Files of
    the user's own are kept."""
    names = ["config.json", "checkpoint.pt", "metrics.json", "metrics-evaluate.json"]
    names += [f"{plot}.png" for plot in RUN_PLOTS]
    names += [f"{plot}-evaluate.png" for plot in (*RUN_PLOTS, "rotation")]
    for name in names:
        (out / name).unlink(missing_ok=True)
    for leftover in out.glob(".checkpoint.pt.*.tmp"):  # of a run killed while it saved
        leftover.unlink(missing_ok=True)
