"""The ``pyrouq`` command: thin, it parses arguments, calls the library and prints.

``pyrouq fit MODEL`` trains on the bundled MNIST (or on Fashion-MNIST with ``--dataset``),
printing each epoch's line as the epoch ends, evaluates on the test split with the other data
set as out-of-distribution data, prints the metric tables and writes a run directory
(``metrics.json``, ``config.json``, ``checkpoint.pt``, plots). MODEL is a built-in name or
``package.module:factory``, an importable callable returning the user's ``nn.Module``, made
Bayesian, last-layer Bayesian, a BatchEnsemble, a rank-1 Bayesian BatchEnsemble or left plain by
``--method`` (:mod:`pyrouq.cli._build`; the options are parsed in :mod:`pyrouq.cli._parser`, the
metrics and plots written by :mod:`pyrouq.cli._report`). ``pyrouq evaluate RUN_DIR`` reloads a
run (calling the recorded factory for the skeleton) and evaluates it again, optionally on
rotated images (:mod:`pyrouq.cli._evaluate`). Bad input is a one-line ``pyrouq: error: ...`` on
stderr and exit code 2 (``pyrouq`` alone prints its help and exits 0, as ``--help`` does); an
interrupted training saves the partial run and exits with 130 (SIGTERM, how a cluster's
scheduler preempts a job, is handled as Ctrl-C and exits with 143); a closed stdout or stderr
(``pyrouq fit MODEL 2>&1 | head -1``) silences the printing only: the command writes its files,
then exits quietly with 141.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import os
import re
import shlex
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pyrouq import __version__
from pyrouq._util import shard_size
from pyrouq.cli._build import (
    FACTORY_RECIPE,
    MODELS,
    CommandError,
    build,
    factory_root,
    method_of,
)
from pyrouq.cli._evaluate import _cmd_evaluate, _device, _missing_data
from pyrouq.cli._fit_words import (
    batchnorm_in_command_words,
    grey_in_command_words,
    unfit_training_in_command_words,
)
from pyrouq.cli._made_folders import remove_made
from pyrouq.cli._parser import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    _build_parser,
)
from pyrouq.cli._report import EpochLines, _evaluate, _save_plots, _write_metrics
from pyrouq.cli._run_dir import (
    claim,
    earlier_epochs,
    out_dir,
    read_run,
    recorded_factory_root,
    recorded_sites,
    resume_command,
    trained_in_full,
    trained_run,
)
from pyrouq.cli._terminal import (
    OutputFailed,
    closable_streams,
    output_failure,
    printable_streams,
)
from pyrouq.cli._torchrun import _process_group, _rank_gpu, _world_size, quiet_rank


def _cmd_data(args: argparse.Namespace) -> int:
    from pyrouq.data import load_mnist

    start = time.perf_counter()
    try:
        train, test = load_mnist(root=args.data_root, seed=0)
    except FileNotFoundError as err:
        raise _missing_data(err, "mnist", bundled=True, root=args.data_root) from None
    n_batches = sum(1 for _ in train)
    seconds = time.perf_counter() - start
    counts = train.labels.bincount(minlength=10).tolist()
    print(
        f"MNIST: train {len(train.dataset)} / test {len(test.dataset)} images, "
        f"{n_batches} batch{'es' if n_batches != 1 else ''} of {train.batch_size}, "
        f"mean raw pixel {train.images.double().mean().item():.3f}/255, "
        f"train label counts {counts}, loaded in {seconds:.2f} s"
    )
    return 0


def _load_data(dataset: str, batch_size: int, args: argparse.Namespace, device: Any) -> Any:
    import pyrouq

    load = pyrouq.load_mnist if dataset == "mnist" else pyrouq.load_fashion_mnist
    try:
        return load(
            batch_size=batch_size,
            root=args.data_root,
            seed=args.seed,
            device=device,
            train_size=args.train_size,
        )
    except ValueError as err:
        if not str(err).startswith("Expected train_size"):
            raise
        raise CommandError(  # in the command's words
            str(err)
            .replace("Expected train_size", "Expected --train-size")
            .replace("Pass None for the whole", "Leave --train-size out for the whole")
            .rstrip(".")
        ) from None
    except FileNotFoundError as err:
        if (
            dataset == "fashion-mnist"
            and args.data_root is None
            and not os.environ.get("PYROUQ_DATA")
        ):
            raise CommandError(
                "--dataset fashion-mnist trains on the Fashion-MNIST train split, which pyrouq "
                "does not bundle; pass --data-root DIR holding FashionMNIST/raw/train-* and t10k-* "
                "(both splits: the run is evaluated on the test split of the same folder)"
            ) from None
        bundled = dataset == "mnist"
        raise _missing_data(err, dataset, bundled=bundled, root=args.data_root) from None


def _data_folder(data_root: str | None) -> str | None:
    """The folder the training data came from, as config.json records it: --data-root, else
    $PYROUQ_DATA, made absolute (readable from any folder); None for the bundled copy."""
    folder = data_root if data_root is not None else os.environ.get("PYROUQ_DATA") or None
    return None if folder is None else os.path.abspath(os.path.expanduser(folder))


def _norms_of(model: Any) -> str | None:
    """Whether an ensemble's members share its normalisation layers ("shared", "per_member")."""
    options = getattr(model, "options", None) or getattr(model, "ensemble_options", None) or {}
    return options.get("norms")


def _cmd_fit(args: argparse.Namespace) -> int:
    from pyrouq import NoGradLayersWarning

    method = method_of(args)  # refused before any process group is joined
    device = _device(args.device)
    paths = list(sys.path)  # a resumed run's factory_root, put on it where it is needed
    try:
        with warnings.catch_warnings():
            # a factory whose forward runs latent layers only under no_grad: the command
            # never unfreezes them later (no staged fine-tuning), so it refuses the run
            warnings.filterwarnings("error", category=NoGradLayersWarning)
            with _process_group(device) as (rank, world):
                return _fit_on_rank(args, method, device, rank, world)
    except NoGradLayersWarning as warning:
        text = warning.finding + (
            " To keep them fixed, freeze them in the factory (layer.requires_grad_(False)) or "
            "pick --method last-layer; to make them Bayesian, run them with gradients."
        )
        raise CommandError(f"factory {args.model!r}, --method {method}: {text}") from None
    finally:
        sys.path[:] = paths


def _fit_on_rank(
    args: argparse.Namespace, method: str | None, device: Any, rank: int, world: int
) -> int:
    import pyro

    import pyrouq
    from pyrouq.checkpoint import library_versions

    recipe = MODELS[args.model] if method is None else FACTORY_RECIPE
    epochs = args.epochs or recipe["epochs"]
    batch_size = args.batch_size or recipe["batch_size"]
    lr = args.lr or recipe["lr"]
    if world > 1 and device.type == "cuda":
        device = _rank_gpu()  # as _process_group set it
    # rank 0 writes; the others read --out only to resume (as rank 0 does: ~ expanded)
    out = out_dir(args) if rank == 0 else Path(os.path.expanduser(args.out or "runs"))
    started = time.perf_counter()
    train, test = _load_data(args.dataset, batch_size, args, device)
    resumed = read_run(out / "checkpoint.pt") if args.resume else None  # read once, for all
    if resumed is not None and method is not None:  # the factory found where the run found
        args.factory_root = recorded_factory_root(out)  # it, as `pyrouq evaluate` finds it
        # the layers the run made latent, which another pyrouq's --method may not pick
        args.resume_sites = recorded_sites(resumed)
    pyro.set_rng_seed(args.seed)
    args.typed_num_samples = args.num_samples  # before build() fills in its default
    model, guide = build(args, method)
    model.to(device)
    if guide is not None:
        guide.to(device)
    ensemble = getattr(model, "num_members", None) is not None  # BatchEnsemble or rank-1
    if args.kl_weight is None:
        from pyrouq.infer.fit import default_kl_weight

        args.kl_weight = default_kl_weight(model)
    config = {
        "model": args.model,
        "factory": args.model if method is not None else None,
        "factory_root": factory_root(args.model) if method is not None else None,
        "method": method,
        "dataset": args.dataset,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "kl_weight": args.kl_weight if guide is not None else None,
        "num_particles": args.num_particles if guide is not None else None,
        "members": args.members if ensemble else None,
        "norms": _norms_of(model) if ensemble else None,
        "prior_scale": args.prior_scale if guide is not None else None,
        "num_samples": args.num_samples if guide is not None else None,
        "seed": args.seed,
        "train_size": args.train_size,
        "data_root": _data_folder(args.data_root),
        "device": str(device),
        "world_size": world,
        "command": shlex.join(["pyrouq", *args.argv]),  # quoted: it runs again as written
        "versions": library_versions(),
    }
    if rank != 0:  # the other ranks train their shards quietly; rank 0 reports and writes
        if resumed is not None and trained_in_full(resumed, epochs):
            return 0  # a run trained in full: rank 0 evaluates it (_run_fit)
        return quiet_rank(lambda: pyrouq.fit(model, guide, train, epochs=epochs, lr=lr,
            kl_weight=args.kl_weight, num_particles=args.num_particles, progress=False,
            seed=args.seed, resume_from=resumed))  # fmt: skip
    out, made = claim(out, args, config)
    try:
        return _run_fit(
            args, out, config, recipe, method, model, guide, train, test, started, resumed
        )
    except BaseException:  # Ctrl-C too
        # a run refused before it trained leaves no folder behind; one with a checkpoint stays
        if not (out / "checkpoint.pt").exists():
            if made:  # the folder, and the parents made for it
                remove_made(made)
            elif not args.overwrite:  # an empty --out that was there: empty again, or the
                (out / "config.json").unlink(missing_ok=True)  # fixed command is refused
        raise


#: pyrouq.fit()'s refusal of a factory's activation checkpointing (told in the command's words).
_CHECKPOINTED = re.compile(r"^\S+ runs '.*' inside torch\.utils\.checkpoint \(activation")


def _run_fit(
    args: argparse.Namespace,
    out: Path,
    config: dict[str, Any],
    recipe: dict[str, Any],
    method: str | None,
    model: Any,
    guide: Any,
    train: Any,
    test: Any,
    started: float,
    resumed: os.PathLike[str] | None,
) -> int:
    import pyro

    import pyrouq
    from pyrouq.infer import TrainingInterrupted

    epochs, batch_size, lr = config["epochs"], config["batch_size"], config["lr"]
    checkpoint = out / "checkpoint.pt"
    n_params = sum(p.numel() for p in model.parameters())
    if guide is not None:
        n_params += sum(p.numel() for p in guide.parameters())
    what = recipe["class"] if method is None else f"{args.model} ({method})"
    data = "MNIST" if args.dataset == "mnist" else "Fashion-MNIST"
    world = config["world_size"]
    with train.sharded(0, world):  # what each rank runs (one shard of every epoch)
        batches = len(train)
    if batches == 1:  # the one batch holds the shard: fewer images than --batch-size
        batch_size = min(batch_size, shard_size(len(train.dataset), world))
    ranks = f" on each of {world} ranks" if world > 1 else ""
    print(
        f"pyrouq {__version__}: fitting {what} ({n_params:,} parameters) on "
        f"{len(train.dataset)} {data} images, {epochs} epoch{'s' if epochs != 1 else ''} of "
        f"{batches} batch{'es' if batches != 1 else ''} of {batch_size}{ranks}, device "
        f"{config['device']}"
    )
    # a run trained in full, stopped while it evaluated: finished without training
    finished = resumed is not None and trained_in_full(resumed, epochs)
    lines = EpochLines()  # each epoch's line as it ends (rank 0's; the others print none)
    if resumed is not None:  # the epochs of the run before it stopped, printed once fit()
        lines.hold(earlier_epochs(resumed))  # or trained_run() took the run (not refused)
    try:
        with _writing_run(out, checkpoint, lines.release):  # each epoch's checkpoint
            if finished and resumed is not None:
                model, guide, result = trained_run(resumed, args, method, config)
                lines.release()
            else:
                result = pyrouq.fit(
                    model,
                    guide,
                    train,
                    epochs=epochs,
                    lr=lr,
                    kl_weight=args.kl_weight,
                    num_particles=args.num_particles,
                    progress=not args.no_progress,
                    seed=args.seed,
                    checkpoint=checkpoint,
                    metadata={"config": config},
                    resume_from=resumed,
                    callbacks=[lines],
                )
    except TrainingInterrupted as stop:  # (step 0: as fit() says it)
        lines.history(stop.result.history)  # (an epoch stopped before its callback ran)
        when = (
            f"at the end of epoch {stop.epoch}"
            if stop.epoch_complete
            else f"in epoch {stop.epoch} after step {stop.step}"
            if stop.step
            else f"in epoch {stop.epoch} before its first step"
        )
        print(
            f"\npyrouq: interrupted {when}; the partial run "
            f"is saved at {checkpoint} (resume it: {resume_command(config, out)})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except OutputFailed as failed:  # (> /dev/full: the run stops; main() says what it left)
        failed.kept = _kept_run(checkpoint, config, out)
        raise
    except KeyboardInterrupt:  # a second Ctrl-C inside a step: fit() saved nothing of it
        if not checkpoint.exists():
            raise  # no epoch finished: the run folder goes, as before training
        lines.release()
        print(
            f"\npyrouq: interrupted inside a training step, which is not saved; {checkpoint} "
            f"holds the run after its last finished epoch (resume it: "
            f"{resume_command(config, out)})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except FloatingPointError as err:  # (training ran: fit()'s checks passed)
        lines.release()
        raise CommandError(_non_finite(err, out, guide is not None, method)) from None
    except ValueError as err:  # a factory's activation checkpointing, in the command's words
        text = " ".join(str(err).split())
        if (unfit := unfit_training_in_command_words(text, str(out))) is not None:
            raise CommandError(unfit) from None  # (--resume of an edited checkpoint.pt)
        if method is None or not _CHECKPOINTED.match(text):
            raise
        other = (
            ", or pick --method last-layer if the checkpointed layers are not the last nn.Linear"
        )
        text = text.replace("before converting the network", "in the factory").replace(
            ", or, with bayesian(), leave the layers it runs out of select=",
            "" if method == "last-layer" else other,
        )
        raise CommandError(f"factory {args.model!r}, --method {method}: {text}") from None
    lines.history(result.history)  # (printed already, by fit()'s callback or from --resume's file)
    num_samples = args.num_samples if guide is not None else None
    pyro.set_rng_seed(args.seed)  # as `pyrouq evaluate` does: it repeats these numbers
    try:
        metrics, figures, _ = _evaluate(
            model, guide, test, num_samples, args.dataset, "auto", args, result
        )
    except KeyboardInterrupt:
        print(
            f"\npyrouq: interrupted while evaluating; the trained run is saved at {checkpoint} "
            f"(evaluate it with: pyrouq evaluate {shlex.quote(str(out))}; or finish the run, "
            f"its metrics.json and plots, without training: {resume_command(config, out)})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except OutputFailed as failed:  # (trained in full: --resume only evaluates it)
        failed.kept = _kept_run(checkpoint, config, out, trained=True)
        raise
    metrics["seed"] = args.seed  # of the draws, as metrics-evaluate.json records evaluate's
    metrics["train_seconds"] = result.seconds
    with _writing_run(out, checkpoint):
        pyrouq.save(
            checkpoint, model, guide, metadata={"config": config, "metrics": metrics}
        )  # the final checkpoint: no resume state, the metrics instead
        _write_metrics(out, metrics)
        written = _save_plots(figures, out)
    total = time.perf_counter() - started
    print(
        f"\nwrote {out}/: metrics.json, config.json, checkpoint.pt, "
        f"{', '.join(p.name for p in written)} ({total:.1f} s in all)"
    )
    return 0


_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG, errno.EIO}


@contextlib.contextmanager
def _writing_run(
    out: Path, checkpoint: Path, wrote: Callable[[], None] | None = None
) -> Iterator[None]:
    """fit's writes into the run folder (each epoch's checkpoint, the final one, the metrics
    and plots): a failed write (a full disk, a folder made read-only) is one line naming the
    folder and what it keeps, not a traceback; ``wrote`` is called first (a resumed run's
    held epoch lines: a write means fit() took the run and trained)."""
    try:
        yield
    except OSError as err:
        if isinstance(err.filename, (str, bytes, os.PathLike)):
            named = Path(os.path.abspath(os.fsdecode(err.filename)))
            if Path(os.path.abspath(out)) not in named.parents:
                raise  # not the run's file (a data set's, a factory's): the error as it came
        elif err.filename is None and err.errno not in _WRITE_ERRORS:
            raise  # of no file, and not one a write meets (a descriptor's, an int: the save's)
        if wrote is not None:
            wrote()
        what = f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")
        kept = ""
        if checkpoint.exists():  # the last epoch's, written whole (else the folder goes)
            kept = (
                f"; {checkpoint} holds the run after its last saved epoch (pyrouq evaluate "
                f"{shlex.quote(str(out))})"
            )
        raise CommandError(
            f"cannot write the run into {str(out)!r} ({what}){kept}; free space on its disk "
            "(or make it writable), or pass --out another folder"
        ) from None


def _kept_run(checkpoint: Path, config: dict[str, Any], out: Path, trained: bool = False) -> str:
    """What a run stopped by a stdout it could not write left: its last saved epoch, which
    --resume continues, or, ``trained`` in full, the trained run, which --resume evaluates
    without training; or nothing before the first epoch."""
    if not checkpoint.exists():
        return ""
    command, stopped = resume_command(config, out), f"the run stopped: {checkpoint} holds"
    if trained:
        return f"{stopped} the trained run (resume it to evaluate: {command})"
    return f"{stopped} it after its last saved epoch (resume it: {command})"


def _non_finite(err: FloatingPointError, out: Path, bayesian: bool, method: str | None) -> str:
    """fit()'s error for a non-finite loss in the command's words: what the run folder keeps
    (fit() keeps the last finite step's weights in the model, which the command drops), and
    at the first step, the untrained model's loss, a cause other than --lr; a KL term that
    overflowed it with the figures the error holds (its ``overflow``)."""
    message = " ".join(str(err).split())
    head = message.split(";")[0]  # Non-finite loss (nan)[ on rank r of w] at epoch E, step S
    if not head.startswith("Non-finite loss") or ";" not in message:
        return message
    first = head.endswith(" at epoch 1, step 1")
    kept = ""
    if (out / "checkpoint.pt").exists():
        kept = (
            f" ({out / 'checkpoint.pt'} holds its weights after its last finished epoch: "
            f"pyrouq evaluate {shlex.quote(str(out))})"
        )
    overflow = getattr(err, "overflow", None)  # fit()'s KLOverflowError: its figures, kept
    if overflow is not None:
        before = ", before any update" if first else f"; training stopped{kept}"
        return (
            f"{head}{before}: the KL term overflowed it: --kl-weight * KL = "
            f"{overflow.figures}. Pass a smaller --kl-weight (1 is the exact ELBO)"
        )
    causes = ["a smaller --kl-weight or a larger --prior-scale"] if bayesian else []
    if method is not None:  # a factory's network
        causes.append("a network that gives finite outputs on the images")
    if first and causes:
        return (
            f"{head}: the loss of the untrained model, before any update (--lr is not the "
            f"cause); try {', or '.join(causes)}"
        )
    return f"{head}; training stopped{kept}. Lower --lr."


@contextlib.contextmanager
def _sigterm_as_ctrl_c(received: list[int]) -> Iterator[None]:
    """While a command runs, SIGTERM (how a cluster's scheduler preempts a job, ``kill PID``)
    is handled as Ctrl-C: it goes to the SIGINT handler of the moment (fit()'s, which lets the
    step finish and saves the run; else a ``KeyboardInterrupt``) and is noted in ``received``.
    Not installed outside the main thread, where SIGTERM is ignored (``trap '' TERM``), nor
    under torchrun (whose agent stops the ranks with SIGTERM, at once); the previous handler
    is put back after."""
    if (
        threading.current_thread() is not threading.main_thread()
        or _world_size() > 1
        or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    ):
        yield
        return

    def handle(signum: int, frame: Any) -> None:
        received.append(signum)
        on_ctrl_c = signal.getsignal(signal.SIGINT)
        if not callable(on_ctrl_c):  # SIGINT ignored (a background job) or left to the OS
            raise KeyboardInterrupt
        on_ctrl_c(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyrouq`` console script; returns the exit code. What stdout or
    stderr cannot encode (the tables' box drawing in an ASCII locale) is written in ASCII. A
    stdout or stderr whose reader has gone (``pyrouq fit MODEL 2>&1 | head -1``) silences the
    printing, not the command, which writes its files and then exits with 141 (or its own
    error's code); a stdout that cannot be written (``> /dev/full``) stops the command, which
    says so in one line on stderr (with what a run it stopped left) and exits with 2; a stderr
    that cannot be written is dropped, and the command, its files written, exits with 2."""
    kept = ""  # what a run that a failed stdout stopped left
    with printable_streams(), closable_streams() as streams:
        try:
            code = _main(argv)
        except OutputFailed as failed:  # (its line below, on the streams put back)
            code, kept = EXIT_USAGE, failed.kept
    failure = output_failure(streams, kept)
    if failure is not None:  # (on a failed stderr itself: dropped, its descriptor on null)
        with contextlib.suppress(OSError):
            print(failure, file=sys.stderr)
        return code or EXIT_USAGE
    gone = any(stream.reader_gone for stream in streams)
    return EXIT_BROKEN_PIPE if code == 0 and gone else code


def _main(argv: Sequence[str] | None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # recorded in config.json
    if args.command is None:
        parser.print_help()
        return 0
    commands = {"data": _cmd_data, "fit": _cmd_fit, "evaluate": _cmd_evaluate}
    # as under `python -m`, the modules of the current folder are found while the command
    # runs (a factory's, and any its network imports as it trains)
    here = os.getcwd()
    added = "" not in sys.path and here not in sys.path
    if added:
        sys.path.insert(0, here)
    terminated: list[int] = []  # a SIGTERM came: exit with 143, as a shell reports it
    try:
        with _sigterm_as_ctrl_c(terminated):
            code = commands[args.command](args)
        return EXIT_TERMINATED if terminated and code == EXIT_INTERRUPTED else code
    except (CommandError, ValueError, TypeError, FileNotFoundError, FloatingPointError) as e:
        message = " ".join(str(e).split())  # one line
        if isinstance(e, FloatingPointError) and " Lower lr" in message:
            # fit()'s advice in the command's words: its data and guide are the command's
            message = message.split(" Lower lr")[0] + " Lower --lr."
        # fit()'s advice for a loader, in the words of the command's (sharded) loader
        worded = batchnorm_in_command_words(e, getattr(args, "batch_size", None), _world_size())
        message = message if worded is None else worded
        message = grey_in_command_words(message, getattr(args, "dataset", None))
        print(f"pyrouq: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # a pipe's reader gone (closable_streams() keeps ours quiet)
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # before training, or in `evaluate` (training saves its run)
        print(
            f"\npyrouq: {'terminated (SIGTERM)' if terminated else 'interrupted'}", file=sys.stderr
        )
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        if added and here in sys.path:
            sys.path.remove(here)


def console() -> NoReturn:
    """The ``pyrouq`` console script (and ``python -m pyrouq``): :func:`main`, then a quick exit.

    After :func:`main` returns, the :mod:`atexit` handlers run and stdout and stderr are flushed
    as in a normal exit; the process then ends with :func:`os._exit`, skipping the interpreter's
    teardown of every imported module (torch, Pyro, matplotlib), which frees nothing the
    operating system does not and measured 0.5-0.9 s of a 20 s ``make demo`` on 2 CPU cores.
    Every file of a run is closed before :func:`main` returns. Call :func:`main` instead to stay
    in the interpreter (it returns the exit code). The command writes its plots to files and
    shows none: matplotlib draws them with Agg, whatever ``$MPLBACKEND`` names."""
    os.environ["MPLBACKEND"] = "agg"  # (another one named there, a GUI's, could fail the run)
    code = main()
    atexit._run_exitfuncs()  # what a normal exit runs first (CPython has no public call)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or detached stream
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    console()
