"""fit()'s refusals of a training batch too small for a BatchNorm, told in ``pyrouq fit``'s
words: fit()'s advice is for a user's DataLoader (``drop_last``, ``batch_size``); the command's
loader is made from ``--batch-size`` and ``--train-size``, split among the ranks under torchrun
(each trains on ``ceil(train_size / world)`` of the images, in batches of ``--batch-size``)."""

from __future__ import annotations

import re

_ONE_BATCH = " --batch-size 1 makes every batch one input: pass a --batch-size of 2 or more."


def batchnorm_in_command_words(message: str, batch_size: int | None, world: int) -> str:
    """``message`` (one line) with fit()'s advice for a batch of one input under a BatchNorm
    in training mode put in the command's words, for ``--batch-size`` ``batch_size`` on
    ``world`` ranks; any other message as it came. A last batch of one is the remainder of the
    whole data set on one process, of each rank's shard on several (fit()'s words name the
    ranks and the shard: they win over ``world``). A first batch of one on a rank whose shard
    holds one image is told the ``--train-size`` that gives each rank two, with ``--batch-size
    1`` the batch size too (a larger batch alone does not help)."""
    if "drop_last=True" in message:  # fit()'s advice for a loader's last batch
        ranks = re.search(r" fit\(\) runs on (\d+) ranks", message)
        if batch_size == 1:  # (fit()'s words of the ranks' shards go too)
            return message.split(" That is usually")[0].split(" fit() runs on ")[0] + _ONE_BATCH
        if ranks is None:
            return message.split(" That is usually")[0] + (
                " That is the last batch of the epoch: pick a --batch-size (or --train-size) "
                "that leaves no remainder of 1."
            )
        return message[: ranks.start()] + _shard_advice(message, int(ranks[1]), batch_size)
    if " Give batches of 2 or more inputs" in message:  # a first batch of one input
        head = message.split(" Give batches of 2")[0]
        # the shard of one image: fit() counts it ("(1 on this rank)"); of --batch-size 2 or
        # more, a first batch of one input means it too
        counted = re.search(r"\((\d+) on this rank\)", message)
        alone = world > 1 and (batch_size != 1 or (counted is not None and int(counted[1]) < 2))
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
    return message


def _shard_advice(message: str, world: int, batch_size: int | None) -> str:
    """The command's words for a last batch of one on ``world`` ranks: the remainder is that
    of each rank's shard, ``ceil(train_size / world)`` images (counted where fit() names
    them), not of the whole data set."""
    counted = re.search(r"shard of the (\d+) examples \((\d+) on this rank\)", message)
    batches = f" {batch_size}" if batch_size is not None else ""
    if counted is None:
        share = f"ceil(--train-size / {world})"
        shard = f"its shard of the images, {share} of them"
    else:
        total, count = counted[1], counted[2]
        share = f"ceil({total} / {world}) = {count}"
        shard = f"its shard of the {total} images, {share} of them"
    return (
        f" The command runs on {world} ranks: each trains on {shard}, in batches of "
        f"--batch-size{batches} (per rank), so the remainder that counts is the shard's, not "
        "the whole data set's. That is the last batch of each rank's shard in the epoch: pick "
        f"a --batch-size (or --train-size) that leaves no remainder of 1 from the {share} "
        "images of each rank."
    )
