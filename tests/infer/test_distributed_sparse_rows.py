"""fit()'s data-parallel gradient average on 2 processes (gloo, CPU) of a sparse embedding's
gradient, stepped by ``SparseAdam``, against a one-process reference written by hand with plain
torch.

One process's ``nn.Embedding(..., sparse=True)`` gradient holds every row its batch looked up,
zeros included (a token masked out of the loss), and ``SparseAdam`` moves such a row on its
moments. The ranks' average handed the gradient back holding only the rows whose mean was not
zero, so a masked token's row stood still where one process moved it (by 0.067 here)."""

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
# token ids and masks of 8 examples: token 2 counts in the first global batch (examples 0-3)
# and is looked up but masked out in the second (4-7), where its gradient row is zero
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


def _fitted(batch_size: int) -> torch.Tensor:
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


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        torch.save(_fitted(2), Path(out) / f"rank{rank}.pt")  # 2 ranks x 2 examples a step
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_masked_tokens_sparse_row_steps_on_its_moments_as_in_one_process(tmp_path):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    want, start = _by_hand()
    torch.testing.assert_close(_fitted(4), want, rtol=0, atol=1e-6)  # one process, fit()
    # the masked row moved on its first step's moments at the second step (in one process)
    assert float((want[2] - start[2]).abs().min()) > 0.15
    for weight in ranks:  # rank 0 serves examples 0, 2, 4, 6; rank 1 examples 1, 3, 5, 7
        torch.testing.assert_close(weight, want, rtol=0, atol=1e-6)
        assert torch.equal(weight, ranks[0])
    assert torch.equal(ranks[0][[0, 3, 5]], start[[0, 3, 5]])  # rows never looked up
