"""fit()'s data-parallel gradient average on 2 processes (gloo, CPU) of a sparse embedding's
gradient (``nn.Embedding(..., sparse=True)``), against one process's run of the same global
batches: the same weights, the same warnings.

The ranks hand the averaged gradient back sparse, holding the rows some rank looked up, which
a second ``all_reduce`` gathers. That sparse tensor was built leaving torch's invariant checks
implicit, so the first step of every rank warned "Sparse invariant checks are implicitly
disabled. Memory errors (e.g. SEGFAULT) will occur ..." at pyrouq's code, where one process
running ``SparseAdam`` warns of nothing. And a rank whose every gradient was dense (a batch
that used the embedding's weight whole) skipped that second ``all_reduce`` while a rank with
the sparse gradient entered it: gloo aborted both ("Received data size doesn't match expected
size. Is there a distributed collective mismatch in your code?"), where one process trains."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import ArrayLoader, fit

WORLD = 2
TOKENS = torch.tensor([2, 1, 2, 4, 2, 1, 2, 4])
# example 1 (rank 1's first, in the first global batch of 4) uses the embedding's weight whole
WHOLE = torch.tensor([0, 1, 0, 0, 0, 0, 0, 0])
TARGETS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])


class _Bag(nn.Module):
    """Logits from a sparse embedding of the token in x[:, 0], plus, for a batch where some
    x[:, 1] is not 0, x[:, 1] times the mean of its rows: then its gradient is dense."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(6, 3, sparse=True)

    def forward(self, x):
        logits = self.embedding(x[:, 0].long())
        if bool(x[:, 1].any()):
            logits = logits + x[:, 1:2] * self.embedding.weight.mean(0)
        return logits


def _fitted(batch_size: int, optim, whole=False) -> tuple[torch.Tensor, list[str]]:
    """The embedding after one epoch, and every warning the run gave."""
    torch.manual_seed(0)
    net = _Bag()
    x = torch.stack([TOKENS, WHOLE * whole], 1).float()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fit(net, None, ArrayLoader(x, TARGETS, batch_size, shuffle=False), epochs=1,
            optim=lambda params: optim(list(params), lr=0.1), lr_schedule="constant",
            progress=False, seed=0)  # fmt: skip
    return net.embedding.weight.detach().clone(), [str(w.message) for w in record]


def _runs(batch_size: int) -> dict:
    return {  # (the first: torch gives its sparse-invariant warning once in a process)
        "SparseAdam": _fitted(batch_size, torch.optim.SparseAdam),
        "dense on one rank": _fitted(batch_size, torch.optim.SGD, whole=True),
    }


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        torch.save(_runs(2), Path(out) / f"rank{rank}.pt")  # 2 ranks x 2 examples a step
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_sparse_gradients_on_ranks_train_and_warn_as_one_process(tmp_path):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for name, (weight, messages) in _runs(4).items():  # one process, global batches of 4
        assert not any("Sparse invariant" in m for m in messages), messages
        for r in ranks:
            theirs, their_messages = r[name]
            assert their_messages == messages, name
            torch.testing.assert_close(theirs, weight, rtol=0, atol=1e-6)
            assert torch.equal(theirs, ranks[0][name][0]), name
    torch.manual_seed(0)  # the dense step moved the rows no batch looked up (0, 3, 5) too
    start = _Bag().embedding.weight.detach()
    moved = (ranks[0]["dense on one rank"][0] - start).abs().sum(1) > 0
    assert moved.all()
