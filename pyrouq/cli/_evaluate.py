"""``pyrouq evaluate RUN_DIR``: reload a run of ``pyrouq fit`` (calling its recorded factory for
the skeleton) and evaluate it again; with the steps the two commands share (the device, the
test split, the data loaders' errors told in the command's words)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyrouq import __version__
from pyrouq._util import MAX_SEED
from pyrouq._words import as_typed, empty_name
from pyrouq.cli._build import (
    DEFAULT_NUM_SAMPLES,
    MODELS,
    CommandError,
    call_factory,
    initialise_lazy,
    is_factory,
)
from pyrouq.cli._report import RUN_PLOTS, _calibrate, _evaluate, _save_plots, _write_metrics
from pyrouq.cli._run_dir import load_run, resume_command
from pyrouq.cli._torchrun import other_rank


def _device(name: str | None) -> Any:
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CommandError(f"--device {name!r} is not a torch device (e.g. cpu, cuda)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandError(f"--device {name} asked for CUDA, but torch sees no GPU; use cpu")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and device.index is not None and device.index >= count:
        shown = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise CommandError(  # torch's "invalid device ordinal" is not a build without CUDA
            f"--device {name}: torch sees {count} GPU{'s' if count != 1 else ''} here "
            f"({shown}); pass one of them, or cuda"
        )
    if device.type == "meta":
        raise CommandError(f"--device {name} holds no data (a meta device); use cpu or cuda")
    try:
        torch.zeros(1, device=device).item()  # a device this torch build can use
    except (RuntimeError, AssertionError):
        raise CommandError(
            f"--device {name}: this torch build cannot use {device.type} devices here; use cpu"
            + (" or cuda" if torch.cuda.is_available() else "")
        ) from None
    return device


def _load_test(dataset: str, batch_size: int, args: argparse.Namespace, device: Any) -> Any:
    """The test split alone (bundled for both data sets): evaluating needs no training data."""
    from pyrouq.data import TensorLoader, fashion_mnist_arrays, mnist_arrays

    arrays = mnist_arrays if dataset == "mnist" else fashion_mnist_arrays
    try:
        images, labels = arrays("test", root=args.data_root)
    except FileNotFoundError as err:
        raise _missing_data(err, dataset, bundled=True, root=args.data_root) from None
    return TensorLoader(  # as the test loader of load_mnist / load_fashion_mnist
        images.to(device), labels.to(device), batch_size,
        shuffle=False, flatten=False, normalize=True, seed=0,
    )  # fmt: skip


def _missing_data(
    err: FileNotFoundError, dataset: str, *, bundled: bool, root: str | None
) -> CommandError:
    """The data loaders' error told in the command's words (--data-root, not root=), the fix
    naming what chose the folder: --data-root, or $PYROUQ_DATA when it was left out."""
    what, _, hint = str(err).partition(" To fix: ")
    what = what.rstrip(".").replace("under root=:", "under --data-root")
    hint = hint.rstrip(".")
    if hint.startswith(("root= ", "$PYROUQ_DATA ")) and (
        " is the folder above " in hint or " names a file, not a folder" in hint
    ):  # the loaders' own fix for a folder inside the data set's, or a file: the folder to give
        if hint.startswith("root= "):  # its words only: the folder it names may hold "root="
            hint = "--data-root " + hint[len("root= ") :].replace(
                ": pass root=", ": pass --data-root ", 1
            )
        return CommandError(f"{what}. To fix: {hint}")
    folder = "MNIST" if dataset == "mnist" else "FashionMNIST"
    layout = f"in torchvision layout (DIR/{folder}/raw/...)"
    if root is None and os.environ.get("PYROUQ_DATA"):
        fix = f"point $PYROUQ_DATA (or --data-root) at a folder {layout}"
        if bundled:
            fix += " or unset $PYROUQ_DATA to use the bundled copy"
    else:
        fix = f"pass a --data-root {layout}"
        if bundled:
            fix += " or leave --data-root out to use the bundled copy"
    return CommandError(f"{what}. To fix: {fix}")


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from pyrouq.checkpoint import read
    from pyrouq.checkpoint._file import ReadFile

    if other_rank():  # under torchrun: rank 0 evaluates, alone, as `pyrouq fit`'s rank 0 does
        return 0
    if not args.run_dir.strip():  # an unset shell variable: not the current folder
        raise CommandError(
            f"RUN_DIR is {args.run_dir!r}, {empty_name(args.run_dir)}; "
            "pass a folder of `pyrouq fit`"
        )
    run = Path(os.path.expanduser(args.run_dir))  # as --data-root (a quoted "~/runs/x")
    checkpoint = run / "checkpoint.pt"
    if run.is_file() and run.name == "checkpoint.pt":  # the run's: its folder is the RUN_DIR
        raise CommandError(
            f"RUN_DIR {str(run)!r} is a file; pass the run's folder, {str(run.parent)!r}"
        )
    if run.is_file():  # (its folder holds no run, as likely as not: named only for one)
        raise CommandError(
            f"RUN_DIR {str(run)!r} is a file; pass a folder of `pyrouq fit` (the folder "
            "holding its checkpoint.pt)"
        )
    if not run.is_dir():
        raise CommandError(f"RUN_DIR {str(run)!r} is not a folder; pass a folder of `pyrouq fit`")
    if not checkpoint.is_file():
        raise CommandError(f"{str(run)!r} has no checkpoint.pt; pass a folder of `pyrouq fit`")
    device = _device(args.device)
    file = ReadFile(checkpoint)  # read once: its config here, its model by load_run's load()
    config = _recorded_config(read(file), checkpoint)
    if not os.access(run, os.W_OK):  # before the evaluation, not after it
        raise CommandError(_unwritable(run, "permission denied"))
    _check_outputs(run, args)
    factory = config.get("factory")
    paths = list(sys.path)
    try:  # the folder the factory was found in when the run trained, if it is not found now
        skeleton = None
        if factory:
            skeleton = call_factory(factory, config.get("factory_root"))
            initialise_lazy(skeleton, factory)
        return _evaluate_run(args, run, file, skeleton, config, device)
    finally:
        sys.path[:] = paths


def _recorded_config(raw: dict[str, Any], checkpoint: Path) -> dict[str, Any]:
    """The config `pyrouq fit` recorded in the metadata of the ``checkpoint`` read into
    ``raw``; one it cannot have written (an MCMC result, damaged or edited metadata) refused."""
    if "metadata" not in raw:
        raise CommandError(
            f"{str(checkpoint)!r} holds an MCMC result, not a fitted run; load it in Python "
            "with pyrouq.load and pass it to predict(..., posterior_samples=...)"
        )
    try:
        metadata = json.loads(raw["metadata"])
    except (json.JSONDecodeError, TypeError):
        metadata = None
    config = metadata.get("config", {}) if isinstance(metadata, dict) else None
    if not isinstance(config, dict):
        raise CommandError(
            f"{str(checkpoint)!r} has damaged metadata (not the JSON `pyrouq fit` writes); "
            "run `pyrouq fit` again, or load the file in Python with pyrouq.load"
        ) from None
    _check_config(config, checkpoint)
    return config


def _run_model(config: dict[str, Any], model: Any) -> str:
    """The run's model as `pyrouq fit` was given it (``batchensemble-mlp``, a factory with its
    ``--method``), as its refusals name it; the class of ``model`` for a run that records
    none."""
    name, method = config.get("model"), config.get("method")
    if not isinstance(name, str) or not name:
        return type(model).__name__
    return f"{name} --method {method}" if isinstance(method, str) and method else name


def _evaluate_run(
    args: argparse.Namespace,
    run: Path,
    checkpoint: os.PathLike[str],
    skeleton: Any,
    config: dict[str, Any],
    device: Any,
) -> int:
    import pyro

    import pyrouq

    saved = load_run(checkpoint, skeleton, config, device)
    assert isinstance(saved, pyrouq.Checkpoint)
    from pyrouq._util import has_latent_sites
    from pyrouq.checkpoint._stopped import stopped_run

    if saved.guide is None and has_latent_sites(saved.model):  # predict() asked for guide
        raise CommandError(
            f"{str(checkpoint)!r} holds {type(saved.model).__name__}, a Bayesian model, without "
            "its guide (`pyrouq fit` saves both), so there is no posterior to draw from; "
            "evaluate a run of `pyrouq fit`, or save the model with its fitted guide"
        )
    if saved.guide is None and args.num_samples is not None:
        raise CommandError(
            f"--num-samples {args.num_samples} applies to a Bayesian model, which has posterior "
            f"draws; the run's model, {_run_model(config, saved.model)}, has fixed members (or "
            "is one network). Leave --num-samples out"
        )
    num_samples = None
    if saved.guide is not None:
        num_samples = args.num_samples or config.get("num_samples") or DEFAULT_NUM_SAMPLES
    dataset = config.get("dataset", "mnist")
    if args.ood == dataset:
        other = "fashion-mnist" if dataset == "mnist" else "mnist"
        raise CommandError(
            f"--ood {args.ood} is the run's own data set, which cannot be out of distribution; "
            f"pass --ood {other} (what auto picks) or none"
        )
    test = _load_test(dataset, config.get("batch_size", 512), args, device)
    if args.conformal is not None:  # before the evaluation, not after it
        _check_conformal(args.conformal, test.labels.shape[0] // 2)
    if args.seed is None:  # the run's own: evaluate repeats the figures fit printed
        args.seed = config.get("seed", 0)
    pyro.set_rng_seed(args.seed)
    print(f"pyrouq {__version__}: evaluating {type(saved.model).__name__} from {checkpoint}")
    partial = stopped_run(saved.training)
    if partial is not None:
        resume = (  # the command's run: its command with --resume; else fit()'s own
            resume_command(config, run)
            if "command" in config
            else "in Python, saving it in the run: pyrouq.fit(..., resume_from=path, "
            f"checkpoint=path), path = {str(checkpoint)!r}"
        )
        print(
            f"(an interrupted run: its weights after {partial['epochs_done']} of "
            f"{partial['epochs']} epochs and {partial['steps']} "
            f"step{'s' if partial['steps'] != 1 else ''}; resume the training: {resume})"
        )
    metrics, figures, preds = _evaluate(
        saved.model, saved.guide, test, num_samples, dataset, args.ood, args
    )
    metrics["seed"] = args.seed  # of the draws and the split: --seed, else the run's own
    if partial is not None:
        metrics["interrupted_run"] = partial
    if args.calibrate is not None or args.conformal is not None:
        metrics["calibration"] = _calibrate(
            preds, test.labels.cpu(), args, config.get("factory") or None
        )
    if args.shift == "rotate":
        x = test.transform(test.images)
        rows = pyrouq.evaluate_rotations(
            saved.model,
            x,
            test.labels,
            saved.guide,
            num_samples=num_samples,
            progress=not args.no_progress,
            seed=args.seed,  # the table's draws: the row at 0 degrees repeats its figures
        )
        name = "MNIST" if dataset == "mnist" else "Fashion-MNIST"
        print(f"\nRotated {name} (test split)")
        print(pyrouq.format_rotation_table(rows))
        metrics["rotation"] = rows
        from pyrouq.plotting import plot_rotation

        figures["rotation"] = plot_rotation(rows)
    with _writing(run):
        _write_metrics(run, metrics, name="metrics-evaluate.json")
        # beside fit's own figures, which stay: as metrics-evaluate.json beside metrics.json;
        # an earlier evaluate's figure that this one does not draw (--shift rotate) goes
        for name in (*RUN_PLOTS, "rotation"):
            if name not in figures:
                (run / f"{name}-evaluate.png").unlink(missing_ok=True)
        written = _save_plots({f"{name}-evaluate": fig for name, fig in figures.items()}, run)
    print(f"\nwrote {run}/metrics-evaluate.json, {', '.join(p.name for p in written)}")
    return 0


def _check_conformal(alpha: float, n: int) -> None:
    """Refuse, before evaluating, a ``--conformal`` alpha too small for the ``n`` test images
    it calibrates on (half the test split): their conformal threshold would be infinite."""
    import math

    from pyrouq._conformal_scores import conformal_rank

    if conformal_rank(n, alpha) <= n:
        return
    least = 1 / (n + 1)  # (n + 1)(1 - alpha) <= n, rounded up to two significant digits
    scale = 10.0 ** (math.floor(math.log10(least)) - 1)
    least = math.ceil(least / scale) * scale
    while conformal_rank(n, least) > n:
        least += scale
    raise CommandError(
        f"--conformal {as_typed(alpha)} is too small for the {n} test images it calibrates on "
        f"(half the test split), whose conformal threshold would be infinite; pass --conformal "
        f"{least:.2g} or more"
    )


# what a run's recorded config holds, as `pyrouq fit` writes it: key -> (its check, in words)
_CONFIG_CHECKS: dict[str, tuple[Any, str]] = {
    "model": (lambda v: isinstance(v, str) and (v in MODELS or is_factory(v)), "a model name"),
    "factory": (lambda v: v is None or (isinstance(v, str) and is_factory(v)),
                "package.module:factory or null"),
    "factory_root": (lambda v: v is None or isinstance(v, str), "a folder or null"),
    "dataset": (lambda v: v in ("mnist", "fashion-mnist"), "mnist or fashion-mnist"),
    "batch_size": (lambda v: type(v) is int and v > 0, "a positive integer"),
    "num_samples": (lambda v: v is None or (type(v) is int and v > 0),
                    "a positive integer or null"),
    "seed": (lambda v: type(v) is int and 0 <= v <= MAX_SEED, "an integer in [0, 2**32 - 1]"),
}  # fmt: skip


def _check_config(config: dict[str, Any], checkpoint: Path) -> None:
    """Refuse a recorded config that `pyrouq fit` cannot have written (a damaged or edited
    checkpoint): a wrong value would fail deep inside, or evaluate on the wrong data."""
    for key, (ok, expected) in _CONFIG_CHECKS.items():
        if key in config and not ok(config[key]):
            raise CommandError(
                f"{str(checkpoint)!r} has damaged metadata: its config's {key!r} is "
                f"{config[key]!r}, where `pyrouq fit` writes {expected}; run `pyrouq fit` "
                "again, or load the file in Python with pyrouq.load"
            )


def _unwritable(run: Path, why: str) -> str:
    return (
        f"cannot write the evaluation into RUN_DIR {str(run)!r} ({why}); evaluate a copy of "
        "the run folder in a folder you can write to"
    )


def _check_outputs(run: Path, args: argparse.Namespace) -> None:
    """Refuse, before evaluating, a file evaluate would overwrite that cannot be (read-only,
    or a folder in its place): a copy of the run folder would hold it as it is."""
    plots = [name for name in RUN_PLOTS if name != "training_curves"]  # fit's alone
    if args.shift == "rotate":
        plots.append("rotation")
    for name in ("metrics-evaluate.json", *(f"{plot}-evaluate.png" for plot in plots)):
        path = run / name
        if path.is_dir():
            why, fix = "a folder", "remove it"
        elif path.exists() and not os.access(path, os.W_OK):
            why, fix = "read-only", "make it writable or remove it"
        else:
            continue
        raise CommandError(
            f"cannot write the evaluation into RUN_DIR {str(run)!r}: {name} there is {why}; "
            f"{fix} (evaluate writes it) and evaluate again"
        )


@contextlib.contextmanager
def _writing(run: Path) -> Iterator[None]:
    """Writes into a run folder: a failure (a read-only folder, a full disk, a directory in a
    file's place) is a one-line error naming the folder, not a traceback."""
    try:
        yield
    except OSError as err:
        raise CommandError(_unwritable(run, f"{err.strerror or err}: {err.filename}")) from None
