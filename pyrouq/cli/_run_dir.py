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

from pyrouq._words import article, empty_name
from pyrouq.cli._build import CommandError
from pyrouq.cli._made_folders import missing_folders, remove_made
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
    if out.is_symlink() and not out.exists():  # (mkdir's FileExistsError: "claimed by another run")
        # the folder to make: a relative link's target is read from the link's folder, not
        # from the working folder (os.readlink's "../gone" named neither)
        target = os.path.realpath(out)
        raise CommandError(
            f"--out {str(out)!r} is a symbolic link to {target!r}, which does not "
            "exist; make that folder first, or pass another --out"
        )
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {str(out)!r} is a file; pass a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        if _interrupted_run(out):
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
            f"--out is {args.out!r}, {empty_name(args.out)}; pass a folder, or leave --out out for "
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
    if not (out / "config.json").is_file() and (out / "checkpoint.pt").is_file():
        raise CommandError(  # (not a folder of the command's: "start it anew" was refused)
            f"--resume: {str(out)!r} holds a checkpoint.pt but no config.json, the record of "
            "the run that --resume checks this command against; start the run anew there with "
            "--overwrite, or pass another --out"
        )
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


def _interrupted_run(out: Path) -> bool:
    """Whether ``out`` holds a run of the command that --resume continues: its config.json and
    checkpoint.pt, no metrics.json."""
    files = (out / "checkpoint.pt").is_file() and (out / "config.json").is_file()
    return files and not (out / "metrics.json").exists()


def recorded_factory_root(out: Path) -> str | None:
    """The folder the run in ``out`` found its factory's module in (config.json's
    ``factory_root``), where ``--resume`` looks for it when it is not importable here, as
    ``pyrouq evaluate`` does; None where config.json records none or cannot be read (which
    :func:`check_same_run` tells)."""
    try:
        root = json.loads((out / "config.json").read_text(encoding="utf-8")).get("factory_root")
    except (OSError, ValueError, AttributeError):
        return None
    return root if isinstance(root, str) else None


def read_run(checkpoint: Path) -> os.PathLike[str]:
    """The interrupted run's ``checkpoint`` read once (a
    :class:`~pyrouq.checkpoint._file.ReadFile`), for every use ``--resume`` makes of it:
    :func:`recorded_sites`, :func:`trained_in_full`, :func:`earlier_epochs`, :func:`trained_run`
    and fit()'s ``resume_from`` take it where they took the path, and read() gives them what was
    read here (each loaded the file anew before: a check of every byte and a torch.load). The
    path itself where it cannot be read, for fit() or load() to refuse in their words."""
    from pyrouq.checkpoint import CheckpointError
    from pyrouq.checkpoint._file import ReadFile

    try:
        return ReadFile(checkpoint)
    except CheckpointError:
        return checkpoint


def recorded_sites(checkpoint: os.PathLike[str]) -> list[str] | None:
    """The latent sites of the Bayesian network (not rank-1) whose run ``checkpoint`` holds,
    which ``--resume`` converts the factory's network with: the layers the run's pyrouq picked
    (``--method bayesian`` / ``last-layer``; an earlier one left ``nn.Bilinear`` out), not
    those this one would. None where the file records none or cannot be read (fit() then
    tells what is wrong with it)."""
    from pyrouq.checkpoint import CheckpointError, read

    try:
        model = json.loads(read(checkpoint)["description"])["model"]
        config = model["config"]
        sites = config["sites"]
        rank1 = config.get("ensemble") is not None
    except (CheckpointError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if model.get("class") != "BayesianNetwork" or rank1 or not isinstance(sites, list):
        return None
    return sites if sites and all(isinstance(s, str) for s in sites) else None


def trained_in_full(checkpoint: os.PathLike[str], epochs: int) -> bool:
    """Whether the interrupted run's ``checkpoint`` holds all its ``epochs`` trained (the run was
    stopped while it evaluated, after its last epoch's checkpoint): ``--resume`` then finishes
    the run without training, where fit(resume_from=) refuses it. Its final checkpoint (written
    after the evaluation, with no training state) without a metrics.json is refused."""
    from pyrouq.checkpoint import CheckpointError, read

    try:
        payload = read(checkpoint)
        metadata = json.loads(payload.get("metadata") or "null")
    except (CheckpointError, ValueError, TypeError):
        return False  # fit()'s refusal tells what is wrong with the file
    training = payload.get("training")
    if training is None and isinstance(metadata, dict) and "metrics" in metadata:
        folder = Path(checkpoint).parent
        out = shlex.quote(str(folder))
        raise CommandError(
            f"--resume: the run in {str(folder)!r} trained and was evaluated (its "
            "checkpoint.pt is the final one, without the training state), but was stopped "
            f"before it wrote metrics.json; evaluate it with `pyrouq evaluate {out}`, or start "
            "it anew there with --overwrite"
        )
    if not isinstance(training, dict):
        return False
    try:
        done, planned = int(training["epochs_done"]), int(training["epochs"])
    except (KeyError, TypeError, ValueError):
        return False
    return done == planned == epochs


def earlier_epochs(checkpoint: os.PathLike[str]) -> list[Any]:
    """The records of the epochs the interrupted run's ``checkpoint`` finished (its training
    state's history), whose lines ``--resume`` prints before it trains on; none where the file
    holds no training state fit() wrote, which fit() (or :func:`trained_run`) then refuses in
    its words."""
    import pyrouq
    from pyrouq.checkpoint import read
    from pyrouq.checkpoint._resume import check_training

    try:
        payload = read(checkpoint)
        training = payload.get("training")
        check_training(training, payload.get("optimizer"), str(checkpoint))
    except Exception:  # (any: what fit() or trained_run() reads next tells it in its words)
        return []
    if not isinstance(training, dict):  # (none: a final checkpoint, refused before)
        return []
    return [pyrouq.EpochRecord(**record) for record in training["history"]]


def load_run(
    checkpoint: os.PathLike[str], skeleton: Any, config: dict[str, Any], device: Any
) -> Any:
    """``pyrouq.load()`` of a `pyrouq fit` run's ``checkpoint`` (``skeleton``: the network its
    recorded factory builds, or None), as `pyrouq evaluate` and ``fit --resume`` load it:
    load()'s refusals whose fix is not the user's to take in Python told in the command's
    words (a factory that now builds another network, a file of pyrouq.save())."""
    import warnings

    import pyrouq
    from pyrouq.checkpoint._wrapped_skeleton import wrapper_where
    from pyrouq.cli._build import factory_root

    try:
        with warnings.catch_warnings():  # a factory of pyrouq's own MLP: the skeleton is
            warnings.filterwarnings("ignore", message=r".* the module= skeleton")  # not needed
            saved = pyrouq.load(checkpoint, device=device, module=skeleton)
    except pyrouq.CheckpointError as err:
        if skeleton is not None and err.skeleton_mismatch is not None:
            # the skeleton is what the recorded factory builds now; load()'s fix is the user's
            detail = err.skeleton_mismatch
            fix = "make the factory build what it built when the run trained, or fit the run again"
            found, recorded = factory_root(config["factory"]), config.get("factory_root")
            if found and recorded and found != recorded:  # another module of that name here
                fix = (
                    f"it was imported from {found!r}, the run found it in {recorded!r}: "
                    f"evaluate from that folder (or {fix})"
                )
            raise CommandError(
                f"the factory {config['factory']!r}, called to rebuild the run's network, "
                f"now builds another network: {detail.rstrip('.')}; {fix}"
            ) from None
        wrapper = err.held_wrapper  # (a file of an earlier pyrouq holding the wrapper)
        wanting = err.held_class is not None or wrapper is not None  # (for want of a skeleton)
        if skeleton is not None or config.get("model") or not wanting:
            raise
        module, where, held = "make_net()", "", ""
        if wrapper is not None:  # (DDP's process group after the call, not inside it)
            module, where = f"{wrapper}(make_net())", wrapper_where(wrapper)
            held = f" (the file holds its {wrapper} wrapper, saved by an earlier pyrouq)"
        # what the file holds (a plain network, or one converted from one; a wrapper's: below)
        what, saved_class = "a network", err.held_class
        if saved_class is not None:
            kind = "a plain network," if err.held_plain else "a network converted from"
            what = f"{kind} {article(saved_class)} {saved_class}"
        raise CommandError(  # load()'s fix, module=, is not the command's to take
            f"{str(checkpoint)!r} holds {what}, written by pyrouq.save(), not `pyrouq fit` "
            "(no factory recorded to rebuild its skeleton from); evaluate it in "
            f"Python: pyrouq.load(path, module={module}){where}, then pyrouq.predict{held}"
        ) from None
    return saved


def trained_run(
    checkpoint: os.PathLike[str],
    args: argparse.Namespace,
    method: str | None,
    config: dict[str, Any],
) -> tuple[Any, Any, Any]:
    """The model, guide and fit() result of a run that trained all its epochs and was stopped
    while it evaluated, from its last epoch's checkpoint (as `pyrouq evaluate` loads it:
    :func:`load_run`): ``--resume`` evaluates it and writes the run as the uninterrupted run
    did."""
    import pyrouq
    from pyrouq.checkpoint._resume import check_training
    from pyrouq.cli._build import call_factory, initialise_lazy

    skeleton = None
    if method is not None:  # the factory's network, for load()'s skeleton
        skeleton = call_factory(args.model)
        initialise_lazy(skeleton, args.model)
    saved = load_run(checkpoint, skeleton, config, config["device"])
    assert isinstance(saved, pyrouq.Checkpoint)  # (trained_in_full read its training state)
    # one fit() did not write (a history of other keys: EpochRecord's TypeError; an N,
    # kl_weight or particles edited: int()'s and float()'s words), in fit()'s words
    check_training(saved.training, saved.optimizer_state, str(checkpoint))
    training = saved.training or {}
    settings = ("num_data", "kl_weight", "num_particles")  # (unsaved 2026-11-30 to 12-04)
    if unrecorded := [key for key in settings if key not in training]:
        # evaluate needs none of them: it evaluates the trained weights, as the run would have
        raise CommandError(
            f"--resume: the run in {str(Path(checkpoint).parent)!r} trained in full, but its "
            f"checkpoint.pt, written by an earlier pyrouq, records no "
            f"{', '.join(map(repr, unrecorded))} among its training settings, which --resume "
            "reads to finish the run; evaluate the trained run with `pyrouq evaluate "
            f"{shlex.quote(str(Path(checkpoint).parent))}` (metrics-evaluate.json and its plots), "
            "or start the run anew there with --overwrite to train it again"
        )
    result = pyrouq.FitResult(
        history=tuple(pyrouq.EpochRecord(**record) for record in training["history"]),
        num_data=int(training["num_data"]),
        kl_weight=float(training["kl_weight"]),
        num_particles=int(training["num_particles"]),
        steps=int(training["steps"]),
        _weighs_kl=saved.guide is not None,
    )
    return saved.model, saved.guide, result


def claim(out: Path, args: argparse.Namespace, config: dict[str, Any]) -> tuple[Path, list[Path]]:
    """Make the run folder ``out`` and write its ``config.json``, which no other run may have
    written first: ``(the folder, the folders this run made)``, the folder and its parents
    that were missing, deepest first (none for an ``--out`` that was there); refused, it
    leaves none of them behind. A default folder taken by
    another run started in the same second gets a suffix (``-2``, ``-3``, ...); an ``--out``
    that another run has claimed since the check is refused (with --overwrite, the earlier
    run's files are removed first). With ``--resume`` the folder is the interrupted run's,
    whose ``config.json`` must record the same run as ``config``."""
    if args.resume:
        check_same_run(out, config, args)
        return out, []
    text = json.dumps(config, indent=2) + "\n"
    default = args.out is None
    for number in range(1, 10_000):
        folder = out if number == 1 or not default else out.with_name(f"{out.name}-{number}")
        try:
            made = missing_folders(folder)
            if default:
                try:
                    folder.mkdir(parents=True)
                except FileExistsError:
                    continue  # another run's, started in the same second
            else:
                folder.mkdir(parents=True, exist_ok=True)
                if args.overwrite:
                    clear_run(folder)
            with open(folder / "config.json", "x", encoding="utf-8") as file:
                file.write(text)
            return folder, made
        except FileExistsError:
            raise CommandError(
                f"--out {str(folder)!r} was claimed by another run while this one started (it "
                "holds a config.json now); pass another folder"
            ) from None
        except OSError as err:
            remove_made(made)  # `new/` of `--out new/<a name too long>`
            what = f"{str(folder)!r} (the default)" if default else f"--out {str(folder)!r}"
            raise CommandError(
                f"cannot write the run folder {what}: {err.strerror or err}; pass "
                f"{'--out ' if default else ''}a folder you can write to"
            ) from None
    raise CommandError(f"runs/ holds 10,000 runs named {out.name}-*; pass --out")


def check_same_run(out: Path, config: dict[str, Any], args: argparse.Namespace) -> None:
    """Refuse ``--resume`` of a command that would train another run than the one recorded in
    ``out/config.json`` (another model, data, seed, number of epochs, ...; the data folder as
    found, by --data-root or $PYROUQ_DATA); else record in ``config`` the command that started
    the run, as config.json does. ``--num-samples`` (the evaluation's draws) may differ, and a
    ``--device`` given may move the run to another device (a default one that differs from
    the run's is refused): the run goes on with this command's, which then becomes the
    recorded command, ``config.json`` recording its values."""
    path = out / "config.json"
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CommandError(
            f"--resume: cannot read {str(path)!r} ({err}), the record of the run that --resume "
            "checks this command against; start the run anew there with --overwrite"
        ) from None
    if not isinstance(saved, dict):
        raise CommandError(
            f"--resume: {str(path)!r} is not a run's config (a JSON object), the record that "
            "--resume checks this command against; start the run anew there with --overwrite"
        )
    _check_same_pyrouq(path, saved, config)
    typed = {"num_samples": getattr(args, "typed_num_samples", None), "device": args.device}
    if typed["num_samples"] is None and _draws(saved.get("num_samples")):  # the run's own
        config["num_samples"] = args.num_samples = saved["num_samples"]
    free = ["num_samples", *(["device"] if args.device is not None else [])]
    keys = [k for k in {**saved, **config} if k not in (*_NOT_COMPARED, *free)]
    differ = [k for k in keys if saved.get(k, "(none)") != config.get(k, "(none)")]
    if differ == ["device"]:
        then, now = saved.get("device"), config.get("device")
        move = (
            f"--device {now} to go on on {now} (the weights and training state load on any "
            "device, but the later steps then differ from the uninterrupted run's)"
        )
        if _usable(then):
            fix = f"pass --device {then} to go on on {then} as the run started, or {move}"
        else:
            fix = f"resume it where {then} is available, or pass {move}"
        raise CommandError(
            f"--resume: the run in {str(out)!r} trained on {then}, but this command (no "
            f"--device) would train it on {now}, this machine's default; {fix}"
        )
    if differ:
        shown = "; ".join(
            f"{k} {json.dumps(saved.get(k))} there, {json.dumps(config.get(k))} now"
            for k in differ[:3]
        )
        unset = ""
        if "data_root" in differ and saved.get("data_root") is None and args.data_root is None:
            unset = " (the run read the bundled copy; $PYROUQ_DATA names a folder now: unset it)"
        if "factory_root" in differ and isinstance(saved.get("factory_root"), str):
            module = str(config.get("factory", "")).partition(":")[0]
            unset += (
                f" (a module {module!r} is imported from another folder here: resume from "
                f"{saved['factory_root']!r}, the run's, or put it first on PYTHONPATH)"
            )
        raise CommandError(
            f"--resume continues the run in {str(out)!r} as it was started, but this command "
            f"trains another ({shown}){unset}; run the recorded command with --resume: "
            f"{resume_command(saved, out)}"
        )
    command = str(saved.get("command", config.get("command")))
    changed = {k: config.get(k) for k in free if saved.get(k, "(none)") != config.get(k)}
    if changed:  # the run goes on with this command's; config.json and its command say so
        words = _in_full(shlex.split(command))
        for key in changed:
            if typed[key] is not None:  # as typed: each rank of torchrun picks its own cuda:N
                value = str(typed[key])
                option = "--" + key.replace("_", "-")
                words = _with_option(words, option, value, lambda given, v=value: given == v)
        command = shlex.join(words)
        _rewrite(path, {**saved, **changed, "command": command}, list(changed))
    config["command"] = command


def _check_same_pyrouq(path: Path, saved: dict[str, Any], config: dict[str, Any]) -> None:
    """Refuse a config.json of another pyrouq than this one, whose entries it cannot compare:
    entries that a later pyrouq records and this one does not know, or that this one records
    and an earlier one did not (comparing them, a run was refused as another, "null there, null
    now", telling to run the command just run)."""
    unknown = [k for k in saved if k not in config and k not in _NOT_COMPARED]
    missing = [k for k in config if k not in saved and k not in _NOT_COMPARED]
    if not unknown and not missing:
        return
    versions = saved.get("versions")
    then = versions.get("pyrouq") if isinstance(versions, dict) else None
    now = config["versions"]["pyrouq"]
    what = (
        f"records {', '.join(unknown)}, which this pyrouq ({now}) does not know"
        if unknown
        else f"does not record {', '.join(missing)}, which this pyrouq ({now}) records"
    )
    if isinstance(then, str) and then != now:
        fix = f"resume it with pyrouq {then}, which started it, or start it anew"
    else:  # the same pyrouq's: an edited record, or one of an earlier build of this version
        fix = (
            "not the record this pyrouq's `pyrouq fit` writes (edited, or of an earlier build); "
            "start the run anew"
        )
    raise CommandError(f"--resume: {str(path)!r} {what}: {fix} there with --overwrite")


def _usable(device: Any) -> bool:
    """Whether the recorded ``device`` can train here (the CPU always can)."""
    from pyrouq.cli._evaluate import _device

    if not isinstance(device, str):
        return False
    try:
        _device(device)
    except (CommandError, RuntimeError, ValueError):  # a config.json edited by hand too
        return False
    return True


def _draws(value: Any) -> bool:
    """Whether a recorded ``num_samples`` is a number of draws (not null, not edited wrong)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _rewrite(path: Path, config: dict[str, Any], keys: list[str]) -> None:
    """Replace ``config.json`` at ``path`` whole (never half written)."""
    part = path.with_name(f".config.json.{os.getpid()}.tmp")
    try:
        part.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        os.replace(part, path)
    except OSError as err:
        part.unlink(missing_ok=True)
        raise CommandError(
            f"--resume: cannot record the new {', '.join(keys)} in {str(path)!r}: "
            f"{err.strerror or err}; make the run folder writable, or resume with the run's own "
            f"{', '.join(keys)} (as config.json records them)"
        ) from None


def resume_command(config: dict[str, Any], out: Path) -> str:
    """The command that continues the run of ``config`` in ``out``, which works from any folder
    and without the environment it started in: the recorded one with its options written in
    full (argparse took ``--ou`` for ``--out``), with ``--resume``, without its
    ``--overwrite``; ``--out`` naming ``out`` and ``--data-root`` the run's data folder
    (``$PYROUQ_DATA``'s, where the run took it from there) by absolute paths, unless written
    as the same folder from the root or with a ``~``; under ``torchrun`` on as many ranks
    when the run had several (its world size is compared)."""
    words = _in_full(shlex.split(str(config.get("command", "pyrouq fit ..."))))
    words = _with_path(words, "--out", os.path.abspath(os.path.expanduser(out)))
    if isinstance(config.get("data_root"), str):
        words = _with_path(words, "--data-root", config["data_root"])
    options, positional = _split_at_dashes(words)
    options = [w for w in options if w != "--overwrite"]
    if "--resume" not in options:
        options.append("--resume")
    words = options + positional
    world = config.get("world_size")
    if isinstance(world, int) and world > 1 and words[:1] == ["pyrouq"]:
        return f"torchrun --standalone --nproc_per_node {world} -m {shlex.join(words)}"
    return shlex.join(words)


def _in_full(words: list[str]) -> list[str]:
    """A recorded command's words with each option that argparse took shortened (``--ou``,
    ``--overw``, ``--data-r=DIR``) written in full."""
    from pyrouq.cli._parser import _build_parser

    fit = _build_parser().subcommands["fit"]
    names = [s for action in fit._actions for s in action.option_strings if s.startswith("--")]
    full: list[str] = []
    for i, word in enumerate(words):
        if word == "--":  # positional arguments only, from here on
            return full + words[i:]
        name, equals, value = word.partition("=")
        found = [n for n in names if n.startswith(name)] if name.startswith("--") else []
        if name not in names and len(found) == 1:
            word = found[0] + equals + value
        full.append(word)
    return full


def _with_option(words: list[str], option: str, value: str, keep: Any) -> list[str]:
    """``words`` with each value of ``option`` (``--out X`` or ``--out=X``) that ``keep`` does
    not accept replaced by ``value``, or with ``option value`` added where the command gave
    none (before a ``--``, after which every word is a positional argument)."""
    words, positional = _split_at_dashes(words)
    result, found, i = [], False, 0
    while i < len(words):
        word = words[i]
        if word == option and i + 1 < len(words):
            given = words[i + 1]
            result += [word, given if keep(given) else value]
            found, i = True, i + 2
            continue
        if word.startswith(option + "="):
            given = word[len(option) + 1 :]
            word, found = f"{option}={given if keep(given) else value}", True
        result.append(word)
        i += 1
    return (result if found else [*result, option, value]) + positional


def _split_at_dashes(words: list[str]) -> tuple[list[str], list[str]]:
    """``words`` up to its first ``--`` (options), and from it on (positional arguments)."""
    at = words.index("--") if "--" in words else len(words)
    return words[:at], words[at:]


def _with_path(words: list[str], option: str, folder: str) -> list[str]:
    """``words`` with ``option`` naming the absolute ``folder``: a value that names it from the
    root or with a leading ``~`` is kept, a relative one (read from another folder than the
    run started in, it names another place) replaced."""

    def same(given: str) -> bool:
        expanded = os.path.expanduser(given)
        return os.path.isabs(expanded) and os.path.abspath(expanded) == folder

    return _with_option(words, option, folder, same)


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
