"""The ``pyrouq`` command: thin, it parses arguments, calls the library and prints."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from pyrouq import __version__


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyrouq",
        description="Bayesian uncertainty for PyTorch, built on Pyro.",
    )
    parser.add_argument("--version", action="version", version=f"pyrouq {__version__}")
    sub = parser.add_subparsers(dest="command")
    data = sub.add_parser("data", help="load MNIST and print a one-line summary")
    data.add_argument("--data-root", default=None, help="folder in torchvision layout")
    return parser


def _cmd_data(args: argparse.Namespace) -> int:
    from pyrouq.data import load_mnist

    start = time.perf_counter()
    train, test = load_mnist(root=args.data_root, seed=0)
    n_batches = sum(1 for _ in train)
    seconds = time.perf_counter() - start
    counts = train.labels.bincount(minlength=10).tolist()
    print(
        f"MNIST: train {len(train.dataset)} / test {len(test.dataset)} images, "
        f"{n_batches} batches of {train.batch_size}, "
        f"mean raw pixel {train.images.double().mean().item():.3f}/255, "
        f"train label counts {counts}, loaded in {seconds:.2f} s"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pyrouq`` console script; returns the exit code."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "data":
            return _cmd_data(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"pyrouq: error: {e}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
