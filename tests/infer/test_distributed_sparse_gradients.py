"""fit()'s data-parallel gradient average on 2 processes (gloo, CPU) of a sparse embedding's
gradient (``nn.Embedding(..., sparse=True)``), against one process's run of the same global
batches.

One process's gradient holds every row its batch looked up, zeros included (a token masked out
of the loss), and ``SparseAdam`` moves such a row on its moments. The ranks' average handed the
gradient back holding only the rows whose mean was not zero, so a masked token's row stood
still where one process moved it (by 0.067 here): checked against a reference written by hand
with plain torch.

The rows some rank looked up are gathered by a second ``all_reduce``. The sparse tensor it
builds left torch's invariant checks implicit, so the first step of every rank warned "Sparse
invariant checks are implicitly disabled. Memory errors (e.g. SEGFAULT) will occur ..." at
pyrouq's code, where one process running ``SparseAdam`` warns of nothing. And a rank whose
every gradient was dense (a batch that used the embedding's weight whole) skipped that second
``all_reduce`` while a rank with the sparse gradient entered it: gloo aborted both ("Received
data size doesn't match expected size. Is there a distributed collective mismatch in your
code?"), where one process trains."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn
from torch.nn import functional as F

from pyrouq import ArrayLoader, fit

WORLD, LR = 2, 0.1
# token ids and masks of 8 examples (the tokens and targets serve both tests): token 2 counts
# in the first global batch (examples 0-3) and is looked up but masked out in the second (4-7),
# where its gradient row is zero
TOKENS = torch.tensor([2, 1, 2, 4, 2, 1, 2, 4])
MASK = torch.tensor([1, 1, 1, 1, 0, 1, 0, 1])
TARGETS = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])


class MaskedBag(nn.Module):
    """Logits from a sparse embedding of the token in x[:, 0], times its mask x[:, 1]."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(3))
        self.embedding = nn.Embedding(6, 3, sparse=True)

    def forward(self, x):
        return self.embedding(x[:, 0].long()) * x[:, 1:2] + self.bias


def _inputs() -> torch.Tensor:
    return torch.stack([TOKENS, MASK], 1).float()


def _sparse_adam(params):
    return torch.optim.SparseAdam([p for p in params if p.dim() == 2], lr=LR)


def _masked_fitted(batch_size: int) -> torch.Tensor:
    torch.manual_seed(0)
    net = MaskedBag()
    with warnings.catch_warnings():  # (SparseAdam leaves the bias untrained: told)
        warnings.filterwarnings("ignore", "optim returned an optimizer")
        fit(net, None, ArrayLoader(_inputs(), TARGETS, batch_size, shuffle=False), epochs=1,
            optim=_sparse_adam, lr_schedule="constant", progress=False, seed=0)  # fmt: skip
    return net.embedding.weight.detach().clone()


def _by_hand() -> tuple[torch.Tensor, torch.Tensor]:
    """One process, plain torch: -(N / B) sum log p on each global batch of 4, SparseAdam.
    Returns the weights and the start weights."""
    torch.manual_seed(0)
    net = MaskedBag()
    start = net.embedding.weight.detach().clone()
    optimizer = torch.optim.SparseAdam([net.embedding.weight], lr=LR)
    x = _inputs()
    for rows in (slice(0, 4), slice(4, 8)):
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x[rows]), TARGETS[rows], reduction="sum") * (8 / 4)
        loss.backward()
        optimizer.step()
    return net.embedding.weight.detach().clone(), start


def _masked_worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        torch.save(_masked_fitted(2), Path(out) / f"rank{rank}.pt")  # 2 ranks x 2 examples a step
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_masked_tokens_sparse_row_steps_on_its_moments_as_in_one_process(tmp_path):
    spawn_ranks(_masked_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    want, start = _by_hand()
    torch.testing.assert_close(_masked_fitted(4), want, rtol=0, atol=1e-6)  # one process, fit()
    # the masked row moved on its first step's moments at the second step (in one process)
    assert float((want[2] - start[2]).abs().min()) > 0.15
    for weight in ranks:  # rank 0 serves examples 0, 2, 4, 6; rank 1 examples 1, 3, 5, 7
        torch.testing.assert_close(weight, want, rtol=0, atol=1e-6)
        assert torch.equal(weight, ranks[0])
    assert torch.equal(ranks[0][[0, 3, 5]], start[[0, 3, 5]])  # rows never looked up


# example 1 (rank 1's first, in the first global batch of 4) uses the embedding's weight whole
WHOLE = torch.tensor([0, 1, 0, 0, 0, 0, 0, 0])


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


def _bag_fitted(batch_size: int, optim, whole=False) -> tuple[torch.Tensor, list[str]]:
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
        "SparseAdam": _bag_fitted(batch_size, torch.optim.SparseAdam),
        "dense on one rank": _bag_fitted(batch_size, torch.optim.SGD, whole=True),
    }


def _bag_worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        torch.save(_runs(2), Path(out) / f"rank{rank}.pt")  # 2 ranks x 2 examples a step
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_sparse_gradients_on_ranks_train_and_warn_as_one_process(tmp_path):
    spawn_ranks(_bag_worker, (str(tmp_path / "init"), str(tmp_path)))
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
