"""Review 6: fit() under torch.distributed compares the ranks' parameters with rank 0's,
infinite values included (a tensor that is infinite on rank 0 was taken as equal to any
value of the other ranks: the tolerance, relative to rank 0's value, was infinite too)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import ArrayLoader, Gaussian, bayesian, fit, mean_field_guide

WORLD = 2


class _Clamp(nn.Module):
    """Clamps its input from above at a bound held in a buffer (inf: no bound)."""

    def __init__(self, bound: float):
        super().__init__()
        self.register_buffer("bound", torch.tensor([bound, 1.0]))

    def forward(self, x):
        return x.clamp(max=float(self.bound[0]))


def _build(bound: float):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), _Clamp(bound), nn.Linear(4, 1))
    model = bayesian(net, likelihood=Gaussian(1.0))
    return model, mean_field_guide(model)


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    outcomes: dict = {}
    try:
        x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
        y = torch.randn(8, generator=torch.Generator().manual_seed(1))
        inf = float("inf")
        bounds = {"inf, 5": (inf, 5.0), "5, inf": (5.0, inf), "inf, -inf": (inf, -inf),
                  "inf, inf": (inf, inf)}  # fmt: skip
        for name, per_rank in bounds.items():
            try:
                fit(*_build(per_rank[rank]), ArrayLoader(x, y, 4, seed=0), epochs=1,
                    progress=False, seed=0)  # fmt: skip
                outcomes[name] = "ran"
            except Exception as err:  # what each rank saw, compared below
                outcomes[name] = f"{type(err).__name__}: {err}"
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_tensor_infinite_on_rank_0_and_not_on_another_is_refused(tmp_path):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)), world=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    refusal = (
        "ValueError: fit(): the model and guide parameters differ between ranks, first at "
        "'model: net.1.bound', where rank 1 holds other values than rank 0."
    )
    for r in ranks:
        for name in ("inf, 5", "5, inf", "inf, -inf"):
            assert r[name].startswith(refusal), (name, r[name])
        assert r["inf, inf"] == "ran", r["inf, inf"]  # alike on the ranks: no refusal
