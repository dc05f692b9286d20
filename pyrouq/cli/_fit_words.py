"""fit()'s refusals told in ``pyrouq fit``'s words: of a training batch too small for a
BatchNorm, fit()'s advice is for a user's DataLoader (``drop_last``, ``batch_size``); the
command's loader is made from ``--batch-size`` and ``--train-size``, split among the ranks under
torchrun (each trains on ``ceil(train_size / world)`` of the images, in batches of
``--batch-size``). Of a factory's network for colour images, the advice to repeat the grey
channel is the input's, which the command loads itself (MNIST or
Fashion-MNIST, one channel). Of a run's checkpoint whose training state fit() did not write,
the advice is fit()'s (a new fit() from pyrouq.load(path)); the command's is --overwrite."""

from __future__ import annotations

import re

from pyrouq._batchnorm import BatchTooSmall

# A first layer's advice for greyscale images to a network for colour ones
# (pyrouq/_first_layer_fix.py: input_fix(), channel_fix())
_GREY = re.compile(
    r"Repeat the grey channel, x\.expand\(-1, \d+(?:, -1)*\), or build the network for 1 "
    r"input channel"
)


def grey_in_command_words(message: str, dataset: str | None = "mnist") -> str:
    """``message`` with a first layer's advice for the command's greyscale images (MNIST's, or
    Fashion-MNIST's under ``--dataset fashion-mnist``) to a factory's network for colour ones
    (repeat the grey channel, x.expand(...), which the command's user cannot do) put in the
    command's words: the factory's network must change."""
    data = "Fashion-MNIST" if dataset == "fashion-mnist" else "MNIST"
    return _GREY.sub(
        f"The command's images are {data}'s, of 1 channel: make the factory return a network "
        "for 1 input channel",
        message,
    )


_ONE_BATCH = " --batch-size 1 makes every batch one input: pass a --batch-size of 2 or more."


def batchnorm_in_command_words(
    error: BaseException, batch_size: int | None, world: int
) -> str | None:
    """fit()'s advice for a batch of one input under a BatchNorm in training mode (``error``, a
    :class:`~pyrouq._batchnorm.BatchTooSmall`; None for any other error), in one line, put in
    the command's words, for ``--batch-size`` ``batch_size`` on ``world`` ranks. A last batch
    of one is the remainder of the whole data set on one process, of each rank's shard on
    several (the ranks and the shard fit() tells win over ``world``). A first batch of one on a
    rank whose shard holds one image is told the ``--train-size`` that gives each rank two,
    with ``--batch-size 1`` the batch size too (a larger batch alone does not help)."""
    if not isinstance(error, BatchTooSmall):
        return None
    head = " ".join(error.head.split())  # (one line, as the command prints every error)
    if not error.first:  # usually the last batch of an epoch
        if batch_size == 1:
            return head + _ONE_BATCH
        if error.world < 2:
            return head + (
                " That is the last batch of the epoch: pick a --batch-size (or --train-size) "
                "that leaves no remainder of 1."
            )
        return head + _shard_advice(error, batch_size)
    # a first batch of one input: of --batch-size 2 or more on ranks, it means a shard of one
    # image, as fit() counts it too where it tells the shard
    shard_of_one = error.share is not None and error.share < 2
    alone = world > 1 and (batch_size != 1 or shard_of_one)
    if batch_size == 1 and not alone:
        return head + _ONE_BATCH
    if alone:  # each rank's shard is one image: --train-size is at most world
        both = batch_size == 1  # (then every batch is one input too)
        lead = " --batch-size 1 makes every batch one input, and the" if both else " The"
        return head + (
            f"{lead} command splits the --train-size images among its {world} ranks, "
            f"ceil(--train-size / {world}) on each, which leaves one image on this rank: "
            f"pass a --train-size of {world + 1} or more"
            f"{' and a --batch-size of 2 or more' if both else ''} (or start fewer ranks)."
        )
    return head + " --train-size 1 leaves one example: pass a --train-size of 2 or more."


def _shard_advice(error: BatchTooSmall, batch_size: int | None) -> str:
    """The command's words for a last batch of one on ``error.world`` ranks: the remainder is
    that of each rank's shard, ``ceil(train_size / world)`` images (counted where fit() tells
    them), not of the whole data set."""
    world = error.world
    batches = f" {batch_size}" if batch_size is not None else ""
    if error.share is None:
        share = f"ceil(--train-size / {world})"
        shard = f"its shard of the images, {share} of them"
    else:
        share = f"ceil({error.total} / {world}) = {error.share}"
        shard = f"its shard of the {error.total} images, {share} of them"
    return (
        f" The command runs on {world} ranks: each trains on {shard}, in batches of "
        f"--batch-size{batches} (per rank), so the remainder that counts is the shard's, not "
        "the whole data set's. That is the last batch of each rank's shard in the epoch: pick "
        f"a --batch-size (or --train-size) that leaves no remainder of 1 from the {share} "
        "images of each rank."
    )


# fit()'s refusal of a training state it did not write (checkpoint/_resume.py: check_training)
_UNFIT = re.compile(
    r"^resume_from=.* holds a training state that fit\(\) did not write \((.*)\): "
    r"save\(training=\.\.\.\) is fit\(\)'s to fill"
)


def unfit_training_in_command_words(message: str, out: str) -> str | None:
    """fit()'s refusal (``message``, one line) of the training state of the checkpoint.pt of
    the run in ``out``, which ``--resume`` read, in the command's words; None for any other
    message. fit()'s advice, a new fit() from ``pyrouq.load(path)``, is Python's (and load()
    takes no factory's network without its skeleton)."""
    found = _UNFIT.match(message)
    if found is None:
        return None
    return (
        f"--resume: the run in {out!r} has a checkpoint.pt whose training state pyrouq fit did "
        f"not write ({found[1]}): the file was edited. Start the run anew there with "
        "--overwrite."
    )
