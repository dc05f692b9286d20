"""The ``pyrouq`` command's argument parser: its subcommands, their options and the one-line
errors of bad values (exit code 2, pointing to the subcommand's ``--help``)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from pyrouq import __version__
from pyrouq._lookup import lookup_error, name_too_long
from pyrouq._numbers import check_at_most
from pyrouq._util import MAX_SEED
from pyrouq._words import DATASET_WORDS, close_hint, empty_name
from pyrouq.cli._build import (
    DEFAULT_MEMBERS,
    DEFAULT_NUM_SAMPLES,
    METHODS,
    MODELS,
    is_factory,
)

DATASETS = ("mnist", "fashion-mnist")

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM: handled as Ctrl-C (the run saved), told apart by the code
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader is gone


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), exit code 2; an unknown option is
    reported by the subcommand it was given to, whose ``--help`` lists the options."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.subcommands: Mapping[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        command = " ".join(["pyrouq", *self.prog.split()[1:2], "--help"])  # the subcommand's
        self.exit(EXIT_USAGE, f"pyrouq: error: {message} (see `{command}`)\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        """argparse's refusal of a value outside an option's choices, with the question of
        :func:`~pyrouq._words.close_hint` (`--dataset fashion`: did you mean 'fashion-mnist'?)."""
        choices = action.choices
        if isinstance(value, str) and choices is not None and value not in choices:
            hint = close_hint(value, [str(c) for c in choices], DATASET_WORDS)
            if hint:  # (argparse's own words, the question after the value)
                shown = ", ".join(map(repr, choices))
                message = f"invalid choice: {value!r}{hint} (choose from {shown})"
                raise argparse.ArgumentError(action, message)
        super()._check_value(action, value)

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            owner = self.subcommands.get(getattr(parsed, "command", None) or "", self)
            owner.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed


def _positive_int(name: str) -> Callable[[str], int]:
    """An argparse type: a count in ``[1, 2**63 - 1]``, the library's bound and words
    (:func:`~pyrouq._numbers.check_at_most`), refused here, before the command prints or
    starts anything (fit() refused ``--epochs 10**20`` after the "fitting ..." line)."""
    parse = _integer(name, 1)

    def bounded(text: str) -> int:
        value = parse(text)
        try:
            check_at_most(name, value, f"Pass a smaller {name}.")
        except ValueError as err:  # (no full stop: "(see `pyrouq fit --help`)" follows)
            raise argparse.ArgumentTypeError(str(err).rstrip(".")) from None
        return value

    return bounded


def _integer(name: str, low: int, high: int | None = None, shown: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]`` (``shown`` writes ``high``), or a
    one-line error naming the option."""
    expected = "a positive integer" if (low, high) == (1, None) else "an integer"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            within = expected if high is None else f"in [{low}, {shown or high}]"
            raise argparse.ArgumentTypeError(f"{name} must be {within}, got {value}")
        return value

    return parse


_seed = _integer("--seed", 0, MAX_SEED, "2**32 - 1")
"""--seed: an integer in [0, 2**32 - 1], what every generator pyrouq seeds takes."""


def _fraction(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not 0 < value < 1:
            raise argparse.ArgumentTypeError(
                f"{name} must lie in (0, 1) (the allowed miscoverage, e.g. 0.1), got {text}"
            )
        return value

    return parse


def _positive_float(name: str, allow_zero: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise argparse.ArgumentTypeError(f"{name} must be a finite number {bound}, got {text}")
        return value + 0.0  # -0 as 0 (in config.json)

    return parse


def _data_root(text: str) -> str:
    """--data-root: a folder's name, not an empty one (``--data-root "$DATA"`` with DATA unset),
    which pathlib reads as the current folder: the data found there were trained on, or the
    refusal named that folder as the --data-root given; nor a blank one (whitespace only), a
    folder of that name to pathlib (the loaders' refusal of a blank ``root=``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"--data-root is {text!r}, {empty_name(text)}; pass a folder in torchvision layout "
            "(DIR/MNIST/raw/..., DIR/FashionMNIST/raw/...), or leave --data-root out for "
            "$PYROUQ_DATA or the bundled copy"
        )
    return _looked_up("--data-root", text, "a folder you can read")


def _looked_up(option: str, text: str, usable: str) -> str:
    """A path the system can look up (a missing one too: made, or refused, later): a name of
    more than 255 bytes, a folder on the way that may not be entered, a loop of links are
    refused here in one line, where pathlib's ``exists()`` / ``is_file()`` raise their OSError
    (before Python 3.13), which the command would meet as a traceback."""
    err = lookup_error(os.path.expanduser(text))
    if err is not None:
        fix = "a shorter path" if name_too_long(err) else usable
        raise argparse.ArgumentTypeError(
            f"{option} {text!r} cannot be looked up ({err.strerror}); pass {fix}"
        )
    return text


def _out(text: str) -> str:
    return _looked_up("--out", text, "a folder you can write to")


def _run_dir(text: str) -> str:
    return _looked_up("RUN_DIR", text, "a folder of `pyrouq fit` you can read")


def _model_name(text: str) -> str:
    if text not in MODELS and not is_factory(text):
        raise argparse.ArgumentTypeError(
            f"unknown model {text!r}; choose one of: {', '.join(MODELS)}, or give "
            "package.module:factory, an importable callable returning your nn.Module"
        )
    return text


def _build_parser() -> _Parser:
    parser = _Parser(prog="pyrouq", description="Bayesian uncertainty for PyTorch, built on Pyro.")
    parser.add_argument("--version", action="version", version=f"pyrouq {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    parser.subcommands = sub.choices

    data = sub.add_parser(
        "data",
        help="load MNIST and print a one-line summary",
        description="Load MNIST's train and test splits (from --data-root, else $PYROUQ_DATA, "
        "else the bundled copy) and print one line: the number of images in each, the "
        "training batches and their size, the mean raw pixel and the train label counts.",
    )
    data.add_argument(
        "--data-root", type=_data_root, default=None,
        help="folder in torchvision layout (default: $PYROUQ_DATA, else the bundled copy)",
    )  # fmt: skip

    fit = sub.add_parser(
        "fit",
        help="train a model on MNIST, evaluate it (Fashion-MNIST as OOD), write a run folder",
        description="Train MODEL on MNIST (or --dataset fashion-mnist), evaluate it on the "
        "test split with the other data set as out-of-distribution data, print the metric "
        "tables, and write metrics.json, config.json, checkpoint.pt and PNG plots into --out.",
    )
    fit.add_argument(
        "model", type=_model_name, metavar="MODEL",
        help=f"{', '.join(MODELS)}, or package.module:factory (a callable returning your "
        "nn.Module, converted by --method)",
    )  # fmt: skip
    fit.add_argument(
        "--method", choices=METHODS, default=None,
        help="for a factory: bayesian (default), last-layer, batchensemble, rank1 or plain",
    )  # fmt: skip
    fit.add_argument(
        "--dataset", choices=DATASETS, default="mnist",
        help="training data; fashion-mnist needs --data-root with its train and test splits "
        "(OOD: MNIST)",
    )  # fmt: skip
    fit.add_argument("--epochs", type=_positive_int("--epochs"), help="default per model")
    fit.add_argument("--batch-size", type=_positive_int("--batch-size"), help="default per model")
    fit.add_argument("--lr", type=_positive_float("--lr"), help="Adam learning rate")
    fit.add_argument(
        "--kl-weight",
        type=_positive_float("--kl-weight", allow_zero=True),
        default=None,
        help="weight of the KL term (default fit()'s: 0.02, 1.0 for rank-1; 1 is the exact ELBO)",
    )
    fit.add_argument(
        "--num-particles", type=_positive_int("--num-particles"), default=1,
        help="weight draws per step for the ELBO (Bayesian models; default 1)",
    )  # fmt: skip
    fit.add_argument(
        "--members", type=_positive_int("--members"), default=None,
        help=f"members M of a BatchEnsemble or rank-1 network (default {DEFAULT_MEMBERS})",
    )  # fmt: skip
    fit.add_argument(
        "--norms", choices=("shared", "per_member"), default=None,
        help="for --method batchensemble / rank1: each member has a copy of the normalisation "
        "layers or the members share them (default: per_member for batchensemble, shared for "
        "rank1)",
    )  # fmt: skip
    fit.add_argument(
        "--prior-scale", type=_positive_float("--prior-scale"), default=None,
        help="prior sd: of Normal(0, s) weights (default 1.0), of Normal(1, s) rank-1 factors "
        "(default 0.1)",
    )  # fmt: skip
    fit.add_argument(
        "--num-samples", type=_positive_int("--num-samples"), default=None,
        help=f"posterior draws for evaluation (Bayesian models; default {DEFAULT_NUM_SAMPLES}, "
        f"rank-1: {DEFAULT_NUM_SAMPLES} / members, each running every member)",
    )  # fmt: skip
    fit.add_argument(
        "--seed", type=_seed, default=0,
        help="seeds the initial weights, the data order and the draws: a run repeats exactly "
        "(on as many torch threads: OMP_NUM_THREADS)",
    )  # fmt: skip
    fit.add_argument(
        "--data-root", type=_data_root, default=None,
        help="folder in torchvision layout (default: $PYROUQ_DATA, else the bundled MNIST)",
    )  # fmt: skip
    fit.add_argument(
        "--train-size", type=_integer("--train-size", 1), default=None,  # (the loader tells
        # its bound, the split's size, before anything starts)
        help="train on the first N of the 60000 images (quick trials)",
    )  # fmt: skip
    fit.add_argument(
        "--out", type=_out, default=None, help="run folder (default runs/MODEL-TIMESTAMP)"
    )
    fit.add_argument(
        "--overwrite", action="store_true", help="reuse a non-empty --out, removing its earlier run"
    )
    fit.add_argument(
        "--resume", action="store_true",
        help="continue the interrupted run in --out from its checkpoint.pt: the command that "
        "started it, with --resume added (in one process, the run then ends as if never "
        "interrupted); left out, --num-samples is the run's, given, it may differ; --device "
        "moves the run to another device (a default one other than the run's is refused)",
    )  # fmt: skip
    fit.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if present)")
    fit.add_argument("--no-progress", action="store_true", help="no progress bars")

    ev = sub.add_parser(
        "evaluate",
        help="reload a run folder and evaluate it again",
        description=(
            "Reload RUN_DIR/checkpoint.pt and evaluate it on the test split of its data set; "
            "--calibrate and --conformal fit on a seeded half of it and report the other half."
        ),
    )
    ev.add_argument("run_dir", type=_run_dir, metavar="RUN_DIR")
    ev.add_argument(
        "--num-samples", type=_positive_int("--num-samples"), default=None,
        help="posterior draws (Bayesian models; default: the run's own --num-samples)",
    )  # fmt: skip
    ev.add_argument(
        "--ood", choices=("auto", "fashion-mnist", "mnist", "none"), default="auto",
        help="out-of-distribution set; auto: the other data set of the run",
    )  # fmt: skip
    ev.add_argument(
        "--shift", choices=("rotate",), default=None,
        help="add a sweep of rotated test images of the run's data set",
    )  # fmt: skip
    ev.add_argument(
        "--calibrate", choices=("temperature",), default=None,
        help="fit a temperature on a seeded half of the test set, report the other half",
    )  # fmt: skip
    ev.add_argument(
        "--conformal", type=_fraction("--conformal"), default=None, metavar="ALPHA",
        help="conformal prediction sets (LAC, APS, RAPS) at miscoverage ALPHA, same split; "
        "with --calibrate, calibrated on the temperature-scaled predictions",
    )  # fmt: skip
    ev.add_argument(
        "--seed", type=_seed, default=None,
        help="seeds the draws and the split of --calibrate / --conformal (default: the run's "
        "own --seed, so that evaluate repeats the figures fit printed)",
    )  # fmt: skip
    ev.add_argument(
        "--data-root", type=_data_root, default=None,
        help="folder in torchvision layout (default: $PYROUQ_DATA, else the bundled test splits)",
    )  # fmt: skip
    ev.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if present)")
    ev.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


# --------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------
