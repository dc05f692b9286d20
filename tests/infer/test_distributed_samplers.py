"""fit() on 2 processes (gloo, CPU), eighth audit: against independent references, on
DataLoaders with a DistributedSampler (the earlier audits used pyrouq's own loaders): a plain
network with BatchNorm trained as a hand-written DDP loop trains it (all_reduce of the
gradients, of the running statistics at each epoch's end), a Bayesian network with identical
draws as one process on the concatenated batches (the KL once, N the whole set's), per-example
noise (local reparameterisation) apart from it by the gap the docs give; a run stopped and
resumed from rank 0's checkpoint (rank 0 alone writes) is the one never stopped; a rank-1
network with shared BatchNorm repeats to the bit; sparse gradients (nn.Embedding(sparse=True))
are averaged (they failed in the flattening: "reshape is not implemented for sparse tensors")
and handed back sparse; fit() on one process warns of a DistributedSampler's lone share."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import TrainingInterrupted, bayesian, fit, mean_field_guide, rank1

WORLD = 2
N = 16
data = torch.utils.data


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, generator=g), torch.arange(N) % 3


def _loader(batch_size: int, shuffle: bool = False, x=None, y=None):
    """Batches of ``batch_size``: this rank's share (a DistributedSampler) inside a process
    group, else the whole set in order (the concatenation of the ranks' unshuffled shares)."""
    dataset = data.TensorDataset(*((x, y) if x is not None else _data()))
    if dist.is_initialized():
        sampler = data.DistributedSampler(dataset, shuffle=shuffle, seed=0)
        return data.DataLoader(dataset, batch_size, sampler=sampler)
    return data.DataLoader(dataset, batch_size)


def _state(model, guide=None):
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    if guide is not None:
        state.update({f"guide.{k}": v.detach().clone() for k, v in guide.state_dict().items()})
    return state


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05)


def _bayesian(norm: bool = False, local: bool = False):
    torch.manual_seed(0)
    layers = [nn.Linear(3, 8), *([nn.BatchNorm1d(8)] if norm else []), nn.Tanh(), nn.Linear(8, 3)]
    model = bayesian(nn.Sequential(*layers), local_reparameterization=local)
    return model, mean_field_guide(model)


def _identical(batch_size: int, epochs: int, norm: bool = False, local: bool = False):
    """SGD with identical draws on unshuffled shares (one process: the whole set in order)."""
    model, guide = _bayesian(norm, local)
    result = fit(model, guide, _loader(batch_size), epochs=epochs, optim=_sgd, kl_weight=0.5,
                 lr_schedule="constant", progress=False, seed=0,
                 distributed_draws="identical")  # fmt: skip
    return _state(model, guide), [(r.loss, r.nll, r.kl) for r in result.history]


def _plain_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))


def _hand_written_ddp(epochs: int):
    """The DDP recipe written out: each rank's loss -(N / B) sum log p on its share, gradients
    summed by all_reduce and divided by the ranks, SGD; running statistics averaged at the end
    of each epoch; the epoch's loss the mean of the ranks' mean losses."""
    net = _plain_net()
    optimizer = _sgd(net.parameters())
    loader = _loader(4, shuffle=True)
    losses = []
    for epoch in range(1, epochs + 1):  # fit() numbers its epochs from 1
        loader.sampler.set_epoch(epoch)
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y, reduction="sum") * (N / len(y))
            loss.backward()
            for p in net.parameters():
                dist.all_reduce(p.grad)
                p.grad /= WORLD
            optimizer.step()
            total += loss.item()
        for buffer in (net[1].running_mean, net[1].running_var):
            dist.all_reduce(buffer)
            buffer /= WORLD
        mean = torch.tensor([total / len(loader)], dtype=torch.float64)
        dist.all_reduce(mean)
        losses.append(mean.item() / WORLD)
    return _state(net), losses


def _stop_at_2(record):
    if record.epoch == 2:
        raise KeyboardInterrupt


def _resumed(rank: int, out: Path):
    """Identical draws on shuffled shares: 4 epochs, against 2 (stopped, checkpointed to a
    file of this rank's name) resumed from rank 0's file to 4."""
    model, guide = _bayesian()
    fit(model, guide, _loader(4, shuffle=True), epochs=4, progress=False, seed=0,
        distributed_draws="identical")  # fmt: skip
    never = _state(model, guide)
    model, guide = _bayesian()
    try:
        fit(model, guide, _loader(4, shuffle=True), epochs=4, progress=False, seed=0,
            distributed_draws="identical", checkpoint=out / f"run{rank}.pt",
            callbacks=[_stop_at_2])  # fmt: skip
    except TrainingInterrupted as err:
        stopped = len(err.result.history)
    dist.barrier()  # rank 0 has written its file
    model, guide = _bayesian()
    fit(model, guide, _loader(4, shuffle=True), epochs=4, progress=False, seed=0,
        distributed_draws="identical", resume_from=out / "run0.pt")  # fmt: skip
    return never, _state(model, guide), stopped


def _rank1_twice():
    """A rank-1 MLP with BatchNorm shared by its members, independent draws on
    shuffled shares, trained twice from the same seeds."""
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
        model = rank1(net, 2)
        guide = mean_field_guide(model)
        fit(model, guide, _loader(4, shuffle=True), epochs=2, progress=False, seed=0)
        runs.append(_state(model, guide))
    return runs


class _Bag(nn.Module):
    """Logits from a sparse embedding of the index in x[:, 0]; an index below 0 is no token
    (a batch of none leaves the embedding out of the pass: no gradient for it)."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(3))
        self.embedding = nn.Embedding(10, 3, sparse=True)

    def forward(self, x):
        index = x[:, 0].long()
        if bool((index < 0).all()):
            return self.bias.expand(len(index), 3)
        return self.embedding(index.clamp(min=0)) + self.bias


_SPARSE = {  # optimizers of sparse gradients (SparseAdam takes the embedding alone)
    "SGD": lambda p: torch.optim.SGD(p, lr=0.05),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.05),
    "SparseAdam": lambda p: torch.optim.SparseAdam([q for q in p if q.dim() == 2], lr=0.05),
}


def _sparse_runs(batch_size: int, indices: torch.Tensor):
    x, y = indices.float().reshape(-1, 1), torch.arange(len(indices)) % 3
    out = {}
    for name, make in _SPARSE.items():
        torch.manual_seed(0)
        net = _Bag()
        try:
            with warnings.catch_warnings():  # (SparseAdam leaves the bias untrained: told)
                warnings.filterwarnings("ignore", "optim returned an optimizer")
                fit(net, None, _loader(batch_size, x=x, y=y), epochs=2, optim=make,
                    lr_schedule="constant", progress=False, seed=0)  # fmt: skip
            out[name] = net.embedding.weight.detach().clone()
        except Exception as err:
            out[name] = f"{type(err).__name__}: {err}"
    return out


_INDICES = torch.randint(0, 10, (N,), generator=torch.Generator().manual_seed(0))
_HALF_NONE = torch.tensor([1, -1, 3, -1, 1, -1, 5, -1])  # rank 1's unshuffled share: none


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    outcomes: dict = {}
    try:
        net = _plain_net()
        result = fit(net, None, _loader(4, shuffle=True), epochs=3, optim=_sgd,
                     lr_schedule="constant", progress=False, seed=0)  # fmt: skip
        outcomes["fit"] = (_state(net), [r.loss for r in result.history])
        outcomes["hand-written"] = _hand_written_ddp(3)
        outcomes["identical"] = _identical(4, 2)
        outcomes["batchnorm"] = _identical(8, 1, norm=True)[0]  # one step
        outcomes["local"] = _identical(8, 1, local=True)[0]
        outcomes["resumed"] = _resumed(rank, Path(out))
        outcomes["written"] = sorted(p.name for p in Path(out).glob("run*.pt"))
        outcomes["rank1"] = _rank1_twice()
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def _sparse_worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        outcomes = {
            "sparse": _sparse_runs(4, _INDICES),
            "none on rank 1": _sparse_runs(4, _HALF_NONE)["SparseAdam"],
        }
        torch.save(outcomes, Path(out) / f"sparse{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    spawn_ranks(_worker, (str(out / "init"), str(out)))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _gap(ours: dict, theirs: dict) -> float:
    return max(float((ours[k].double() - v.double()).abs().max()) for k, v in theirs.items()
               if v.is_floating_point())  # fmt: skip


def test_a_plain_network_trains_as_a_hand_written_ddp_loop(ranks):
    for r in ranks:
        (ours, losses), (theirs, their_losses) = r["fit"], r["hand-written"]
        assert _gap(ours, theirs) <= 1e-6, _gap(ours, theirs)
        assert ours["model.1.num_batches_tracked"] == 6  # 3 epochs of 8 / 4 local batches
        assert not torch.equal(ours["model.1.running_var"], torch.ones(8))
        for a, b in zip(losses, their_losses, strict=True):
            assert math.isclose(a, b, rel_tol=1e-6), (losses, their_losses)
        for key, value in ours.items():  # every rank ends with the same network
            assert torch.equal(value, ranks[0]["fit"][0][key]), key


def test_identical_draws_on_distributed_samplers_are_one_process_on_the_whole_batches(ranks):
    # 2 ranks x 4 examples (every other one of 8, by the DistributedSampler) per step: one
    # process on the 8 examples in order, 2 epochs of SGD, kl_weight 0.5; N = 16 on each rank
    single, history = _identical(8, 2)
    for r in ranks:
        state, records = r["identical"]
        assert _gap(state, single) <= 1e-6, _gap(state, single)
        for ours, theirs in zip(records, history, strict=True):  # the KL counted once
            assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(ours, theirs, strict=True))
    # BatchNorm normalises each rank's batch of 8 by its own statistics (no SyncBN), so the
    # step differs from one process's on 16; the running means, averaged over the ranks after
    # that one step, are one process's (linear in the batch means), the variances are not
    single = _identical(16, 1, norm=True)[0]
    mean, var = "model.net.1.running_mean", "model.net.1.running_var"
    for r in ranks:
        assert torch.equal(r["batchnorm"][mean], ranks[0]["batchnorm"][mean])
        torch.testing.assert_close(r["batchnorm"][mean], single[mean], rtol=0, atol=1e-7)
        assert not torch.equal(single[mean], torch.zeros(8))
        assert float((r["batchnorm"][var] - single[var]).abs().max()) > 1e-3


def test_per_example_noise_under_identical_draws_is_apart_from_one_process_by_the_docs_gap(ranks):
    # local reparameterisation draws its noise per example, alike on both ranks: one SGD step
    # on 2 x 8 examples against one process's on 16, whose step moves the guide by 0.0875
    single = _identical(16, 1, local=True)[0]
    start = _state(*_bayesian(local=True))
    assert math.isclose(_gap(single, start), 0.0875, abs_tol=1e-4), _gap(single, start)
    for key, value in ranks[0]["local"].items():
        assert torch.equal(value, ranks[1]["local"][key]), key
    gap = _gap(ranks[0]["local"], single)
    assert math.isclose(gap, 4.7e-3, abs_tol=1e-4), gap  # docs/scaling_out.md's figure
    assert "(by 4.7e-3" in (Path(__file__).parents[2] / "docs" / "scaling_out.md").read_text()


def test_a_run_resumed_from_rank_0s_checkpoint_on_distributed_samplers_is_the_one_never_stopped(
    ranks,
):
    for r in ranks:
        never, resumed, stopped = r["resumed"]
        assert stopped == 2
        for key, value in never.items():
            assert torch.equal(resumed[key], value), key
        assert r["written"] == ["run0.pt"]  # rank 1 was given run1.pt: rank 0 alone writes


def test_a_rank1_network_with_shared_batchnorm_repeats_and_stays_alike_on_the_ranks(ranks):
    first, again = ranks[0]["rank1"]
    moved = False
    for key, value in first.items():
        assert torch.equal(value, again[key]), key  # the same seeds: the same run
        assert torch.equal(value, ranks[1]["rank1"][0][key]), key  # alike on both ranks
        moved |= "running_mean" in key and not torch.equal(value, torch.zeros_like(value))
    assert moved


@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")  # torch's Adagrad
def test_sparse_gradients_are_averaged_as_one_process_takes_them(tmp_path):
    spawn_ranks(_sparse_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"sparse{r}.pt", weights_only=False) for r in range(WORLD)]
    single = _sparse_runs(8, _INDICES)
    for name, weight in single.items():
        assert isinstance(weight, torch.Tensor), weight
        for r in ranks:
            ours = r["sparse"][name]
            assert isinstance(ours, torch.Tensor), ours  # (before: reshape on a sparse tensor)
            torch.testing.assert_close(ours, weight, rtol=0, atol=1e-6)
            assert torch.equal(ours, ranks[0]["sparse"][name]), name
    # rank 1's shares hold no token: no gradient there, a sparse one on rank 0; SparseAdam
    # (which refuses a dense gradient) steps both ranks alike, rows 1, 3 and 5 alone
    zero, one = (r["none on rank 1"] for r in ranks)
    assert isinstance(one, torch.Tensor), one
    assert torch.equal(zero, one)
    torch.manual_seed(0)
    moved = (zero - _Bag().embedding.weight.detach()).abs().sum(1) > 0
    assert moved.nonzero().flatten().tolist() == [1, 3, 5]


def test_fit_on_one_process_warns_of_a_distributed_samplers_share():
    x, y = _data()
    dataset = data.TensorDataset(x, y)
    share = data.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
    with pytest.warns(UserWarning) as record:
        result = fit(nn.Linear(3, 3), None, data.DataLoader(dataset, 4, sampler=share),
                     epochs=1, progress=False)  # fmt: skip
    messages = [str(w.message) for w in record if "DistributedSampler" in str(w.message)]
    assert messages == [
        "fit(): train_loader's DistributedSampler serves rank 1's share of 2 (8 of 16 "
        "examples), but fit() runs on one process (no process group of several ranks is "
        "initialised): it trains on that share alone. Initialise the group on every rank "
        "first (torchrun, then dist.init_process_group), or pass DataLoader(dataset, "
        "batch_size, shuffle=True) to train on the whole set."
    ]
    assert result.steps == 2  # 8 of the 16 examples, in batches of 4
