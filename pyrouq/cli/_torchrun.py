"""How ``pyrouq fit`` runs under torchrun: the world size ``WORLD_SIZE`` asks for, the process
group it initialises (unless the caller has) and each rank's GPU (``LOCAL_RANK``), the
environment's missing or malformed variables refused in words; the ranks other than 0, which
train quietly and leave ``pyrouq evaluate`` to rank 0."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from pyrouq.cli._build import CommandError
from pyrouq.cli._parser import EXIT_INTERRUPTED


def _rank_gpu() -> Any:
    """This torchrun rank's GPU: ``cuda:LOCAL_RANK``, or the one GPU a launcher that shows
    each rank its own makes visible (``LOCAL_RANK`` not read); more ranks than GPUs on a node
    is refused (nccl takes one GPU per rank)."""
    import torch

    count = torch.cuda.device_count()
    if count == 1:
        return torch.device("cuda", 0)
    local = _local_rank()
    if local >= count:
        raise CommandError(
            f"this rank's LOCAL_RANK is {local}, but only {count} GPUs are visible here: nccl "
            "takes one GPU per rank. Start at most as many ranks per node as it has GPUs "
            "(torchrun --nproc_per_node), or train on the CPU (--device cpu)."
        )
    return torch.device("cuda", local)


def _local_rank() -> int:
    """torchrun's ``LOCAL_RANK`` (0 where it is unset), refused in words where it is no index
    (int()'s "invalid literal for int() with base 10: ''" said neither the variable nor what
    to do)."""
    value = os.environ.get("LOCAL_RANK", "0")
    try:
        local = int(value)
    except ValueError:
        local = -1
    if local < 0:
        raise CommandError(
            f"$LOCAL_RANK is {value!r} in the environment, but a training process under "
            "torchrun takes it as its index on the node (0, 1, ...: its GPU). Start the command "
            "with torchrun, which sets it, or set LOCAL_RANK to a whole number from 0 (or unset "
            "it: 0)."
        )
    return local


def _world_size() -> int:
    """torchrun's ``WORLD_SIZE``; 1 where it is unset, empty or not a count."""
    value = os.environ.get("WORLD_SIZE", "").strip()
    return int(value) if _is_count(value) else 1


def quiet_rank(train: Callable[[], Any]) -> int:
    """``pyrouq fit`` on a rank other than 0: ``train()`` (its shard's fit()), quietly; the
    exit code. A first Ctrl-C stops every rank with ``TrainingInterrupted``, which rank 0 tells
    (where the run stopped, how to resume it) as it writes the run: this rank exits with 130
    and prints nothing (a bare "pyrouq: interrupted" of its own, once). Errors
    are its own, and told as in one process."""
    from pyrouq import TrainingInterrupted

    try:
        train()
    except TrainingInterrupted:
        return EXIT_INTERRUPTED
    return 0


def other_rank() -> bool:
    """Whether this process is a torchrun rank other than 0 (``WORLD_SIZE`` > 1, ``RANK`` from
    1): one that leaves a command of one process's work, ``pyrouq evaluate``, to rank 0, which
    does it as it does after ``pyrouq fit``'s training (every rank would do it all, and write
    the same files)."""
    return _world_size() > 1 and _is_count(os.environ.get("RANK", "").strip())


def _is_count(value: str) -> bool:
    """Whether ``value`` is a count from 1 in ASCII digits (str.isdigit() takes '0', no
    count, and '²', which int() refuses)."""
    return value.isascii() and value.isdigit() and int(value) >= 1


@contextlib.contextmanager
def _process_group(device: Any) -> Iterator[tuple[int, int]]:
    """Under torchrun (``WORLD_SIZE`` > 1), initialise torch.distributed (nccl on CUDA, gloo
    otherwise) unless the caller has; yields ``(rank, world size)``. A group initialised here
    is destroyed on the way out, on every rank: a rank that exits holding it can abort in
    Python's shutdown (gloo's worker threads still reference tensors) while rank 0 evaluates."""
    import torch.distributed as dist

    given = os.environ.get("WORLD_SIZE", "").strip()
    grouped = dist.is_available() and dist.is_initialized()  # (the caller's: its size holds)
    if given and not grouped and not _is_count(given):  # (read as 1: one silent process)
        raise CommandError(
            f"$WORLD_SIZE is {given!r} in the environment, but torchrun sets it to the number "
            "of training processes, a count from 1. Start the command with torchrun, or unset "
            "WORLD_SIZE to train in one process."
        )
    world = _world_size()
    created = False
    if world > 1 and dist.is_available() and not dist.is_initialized():
        unset = [f"${v}" for v in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if unset:  # (torch's words: "environment variable RANK expected, but not set")
            raise CommandError(
                f"$WORLD_SIZE is {world} in the environment, which asks for {world} training "
                f"processes, but {', '.join(unset)} {'is' if len(unset) == 1 else 'are'} not "
                "set (torchrun sets them all). Start the command with torchrun (torchrun "
                f"--standalone --nproc_per_node {world} -m pyrouq fit ...), or unset WORLD_SIZE "
                "to train in one process."
            )
        if device.type == "cuda":
            import torch

            torch.cuda.set_device(_rank_gpu())
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        created = True
    try:
        if dist.is_available() and dist.is_initialized():
            yield dist.get_rank(), dist.get_world_size()
        else:
            yield 0, 1
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
