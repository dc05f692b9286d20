"""fit() on 2 processes (gloo, CPU) against references computed in one process: a rank-1
network on DistributedSampler shards of an odd data set (the last step one example per rank,
rank 1's the sampler's padding) is one process on the global batches, with N the whole set's;
pyrouq's loader gives each epoch disjoint shards that cover the data, reshuffled every epoch,
and a seeded run repeats; ranks resuming from different points (resume_from on rank 0 alone)
are refused naming resume_from, not as models built otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import ArrayLoader, bayesian, fit, mean_field_guide, rank1

WORLD, N = 2, 33
data = torch.utils.data


def _dataset() -> data.TensorDataset:
    x = torch.randn(N, 3, generator=torch.Generator().manual_seed(0))
    return data.TensorDataset(x, (x[:, 0] > 0).long())


def _sgd(params):
    return torch.optim.SGD(params, lr=0.002)


def _rank1_run(loader, **kw):
    torch.manual_seed(0)
    model = rank1(nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2)), 2)
    guide = mean_field_guide(model)
    result = fit(model, guide, loader, epochs=2, optim=_sgd, lr_schedule="constant",
                 progress=False, seed=0, **kw)  # fmt: skip
    state = {f"model {k}": v.detach().clone() for k, v in model.state_dict().items()}
    state.update({f"guide {k}": v.detach().clone() for k, v in guide.state_dict().items()})
    return state, [r.loss for r in result.history], result.num_data


def _indexed():
    """Inputs whose first feature is the example's index, as the forward pass sees it."""
    x = torch.arange(N, dtype=torch.float32)[:, None].repeat(1, 3)
    return x, torch.arange(N) % 2


def _seen_run(epochs: int = 2, **kw):
    """The indices of the examples in each forward pass (the first: fit()'s set-up probe),
    and the guide's state after the run."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 2)))
    guide = mean_field_guide(model)
    seen: list[list[int]] = []
    model.net[0].register_forward_hook(lambda m, i, o: seen.append(i[0][:, 0].long().tolist()))
    x, y = _indexed()
    fit(model, guide, ArrayLoader(x, y, 8, seed=0), epochs=epochs, progress=False, seed=0,
        lr_schedule="constant", **kw)  # fmt: skip
    return seen, {k: v.detach().clone() for k, v in guide.state_dict().items()}


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        dataset = _dataset()
        sampler = data.DistributedSampler(dataset, shuffle=False)
        outcomes = {
            "rank1": _rank1_run(
                data.DataLoader(dataset, 4, sampler=sampler), distributed_draws="identical"
            ),
            "seen": _seen_run(checkpoint=f"{out}/run.pt"),
            "again": _seen_run(),
        }
        dist.barrier()  # rank 0 has written run.pt
        try:
            _seen_run(epochs=3, resume_from=f"{out}/run.pt" if rank == 0 else None)
            outcomes["resume on rank 0 alone"] = "no error"
        except ValueError as err:
            outcomes["resume on rank 0 alone"] = str(err)
        torch.save(outcomes, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    spawn_ranks(_worker, (str(out / "init"), str(out)), world=WORLD)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_a_rank1_network_on_padded_shards_is_one_process_on_the_global_batches(ranks):
    # DistributedSampler(shuffle=False) on 33 examples: rank r takes r, r + 2, ..., rank 1
    # padded with example 0; step j of both ranks together is one process's batch j
    order = [*range(N), 0]
    shards = [order[r::WORLD] for r in range(WORLD)]
    batches = [shards[0][j : j + 4] + shards[1][j : j + 4] for j in range(0, len(shards[0]), 4)]
    assert [len(b) for b in batches] == [8, 8, 8, 8, 2]
    state, losses, num_data = _rank1_run(data.DataLoader(_dataset(), batch_sampler=batches))
    assert num_data == N  # the whole set's N, not a shard's 17, scales the likelihood
    for r in ranks:
        ours, our_losses, our_num_data = r["rank1"]
        assert our_num_data == N
        torch.testing.assert_close(torch.tensor(our_losses), torch.tensor(losses), rtol=1e-6,
                                   atol=0)  # fmt: skip
        for key, value in state.items():
            torch.testing.assert_close(ours[key], value, rtol=0, atol=1e-6)
            assert torch.equal(ours[key], ranks[0]["rank1"][0][key]), key
    torch.manual_seed(0)
    start = rank1(nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2)), 2)
    moved = (state["model net.0.weight"] - start.net[0].weight.detach()).abs().max().item()
    assert moved > 1e-3  # the runs trained


def test_the_shards_of_every_epoch_are_disjoint_cover_the_data_and_reshuffle(ranks):
    per_epoch = 3  # ceil(33 / 2) = 17 examples a rank: batches of 8, 8 and 1
    epochs = []
    for e in range(2):
        shard = [
            [
                i
                for batch in r["seen"][0][1 + e * per_epoch : 1 + (e + 1) * per_epoch]
                for i in batch
            ]
            for r in ranks
        ]
        assert [len(s) for s in shard] == [17, 17]
        both = shard[0] + shard[1]
        assert sorted(set(both)) == list(range(N))  # every example, one of them twice (padding)
        assert len(set(shard[0])) == len(set(shard[1])) == 17
        epochs.append(shard)
    assert epochs[0][0] != epochs[1][0]  # set anew each epoch
    for r in ranks:  # the same seeds: the same run
        assert r["seen"][0] == r["again"][0]
        for key, value in r["seen"][1].items():
            assert torch.equal(value, r["again"][1][key]), key


def test_resume_from_on_rank_0_alone_is_refused_naming_resume_from(ranks):
    messages = [r["resume on rank 0 alone"] for r in ranks]
    for message in messages:
        assert message.startswith("fit(): the arguments differ between ranks: resume_from. "), (
            message
        )
        assert "Pass the same resume_from on every rank" in message
    assert "(rank 0 has a checkpoint after 6 steps (the end of epoch 2))" in messages[0]
    assert "(rank 1 has no resume_from)" in messages[1]
