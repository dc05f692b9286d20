"""fit() on 2 processes (gloo, CPU), sixth audit: the steps' check is one collective on every
rank whatever its loader (a rank whose loader had no length skipped it, and its first step's
gradient all_reduce met the other rank's check: gloo aborted the process), epochs compared
for loaders without a length too; a DDP-wrapped network unwrapped to the one fit() trains;
identical draws over 3 epochs of Adam, shuffled, equal to one process on the global batches."""

from __future__ import annotations

import datetime
import math
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import ArrayLoader, bayesian, fit, mean_field_guide

WORLD = 2
N = 16


class _NoLength:
    """A loader of no length over a ``DistributedSampler`` (batches of 4 of its indices)."""

    def __init__(self, dataset):
        self.dataset = dataset
        self.sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)

    def __iter__(self):
        indices = list(self.sampler)
        for start in range(0, len(indices), 4):
            yield self.dataset[indices[start : start + 4]]


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, generator=g), torch.arange(N) % 3


def _build():
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3)))
    return model, mean_field_guide(model)


def _state(model, guide):
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    state.update({f"guide.{k}": v.detach().clone() for k, v in guide.state_dict().items()})
    return state


def _adam_epochs(batch_size: int, **kwargs):
    model, guide = _build()
    x, y = _data()
    result = fit(model, guide, ArrayLoader(x, y, batch_size, seed=0), epochs=3, progress=False,
                 seed=0, **kwargs)  # fmt: skip
    return _state(model, guide), [(r.loss, r.nll, r.kl, r.train_acc) for r in result.history]


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    outcomes: dict = {}
    try:
        x, y = _data()
        dataset = torch.utils.data.TensorDataset(x, y)
        sized = torch.utils.data.DataLoader(
            dataset, 4, sampler=torch.utils.data.DistributedSampler(dataset, shuffle=False)
        )
        attempts = {  # (loader, epochs) on this rank
            "length on rank 0 only": ((sized, _NoLength(dataset))[rank], 1),
            "no length, epochs differ": (_NoLength(dataset), 1 + rank),
            "no length, in step": (_NoLength(dataset), 2),
        }
        for name, (loader, epochs) in attempts.items():
            try:
                result = fit(*_build(), loader, epochs=epochs, num_data=N, progress=False,
                             lr_schedule="constant", seed=0)  # fmt: skip
                outcomes[name] = f"ran {result.steps} steps"
            except ValueError as err:
                outcomes[name] = str(err)
        # a network wrapped in DDP, trained as its module: a label that fails one rank's
        # forward pass stops both ranks together (behind DDP's own reduction, the other
        # rank's backward pass met this one's stop and gloo aborted the processes)
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
        wrapped = nn.parallel.DistributedDataParallel(net)
        labels = torch.where(torch.arange(N) == 5, 7, torch.arange(N) % 3)
        try:
            fit(wrapped, None, ArrayLoader(x, labels, 4, shuffle=False), epochs=1,
                check_inputs=False, progress=False)  # fmt: skip
            outcomes["ddp"] = "ran"
        except Exception as err:
            outcomes["ddp"] = type(err).__name__
        outcomes["adam"] = _adam_epochs(4, distributed_draws="identical")
        for name, value in (
            ("kl_weight", (0.02, 0.1)),
            ("num_particles", (1, 2)),
            ("num_data", (N, 2 * N)),
            ("lr_schedule", ("cosine", "constant")),
            ("vectorize_particles", (False, True)),
        ):
            try:  # the arguments the docs say are compared, one differing at a time
                fit(*_build(), ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False, seed=0,
                    **{"num_particles": 2, name: value[rank]})  # fmt: skip
                outcomes[name] = "ran"
            except ValueError as err:
                outcomes[name] = str(err)
        # independent draws: two runs resumed from one checkpoint are the same run
        checkpoint = Path(out) / "run.pt"
        fit(*_build(), ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False, seed=0,
            checkpoint=checkpoint)  # fmt: skip
        dist.barrier()  # rank 0 has written it
        resumed = []
        for _ in range(2):
            model, guide = _build()
            fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=3, progress=False, seed=0,
                resume_from=checkpoint)  # fmt: skip
            resumed.append(_state(model, guide))
        outcomes["resumed"] = resumed
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_the_steps_check_is_collective_whatever_the_loader_and_ddp_is_unwrapped(tmp_path):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for rank, outcome in enumerate(ranks):
        message = outcome["length on rank 0 only"]
        assert message.startswith(
            "fit() runs on 2 ranks, but train_loader has a length (len()) on some ranks and "
            f"none on others ({('a length', 'none')[rank]} on rank {rank}): "
        ), message
        assert message.endswith("Build the same kind of loader on every rank."), message
        message = outcome["no length, epochs differ"]
        assert message.startswith(
            "fit() runs on 2 ranks, but they would take different numbers of steps: 1 to 2 "
            f"epochs ({1 + rank} on this rank). "
        ), message
        assert outcome["no length, in step"] == "ran 4 steps"  # 2 epochs of 8 / 4 batches
        for name in ("kl_weight", "num_particles", "num_data", "lr_schedule",
                     "vectorize_particles"):  # fmt: skip
            assert outcome[name].startswith(
                f"fit(): the arguments differ between ranks: {name}. Pass the same lr, "
            ), outcome[name]
        first, again = outcome["resumed"]
        for key, value in first.items():  # repeated, and alike on the ranks
            assert torch.equal(value, again[key]), key
            assert torch.equal(value, ranks[0]["resumed"][0][key]), key
    # the rank whose forward pass failed raises its own error, the other says it stopped
    assert sorted(r["ddp"] for r in ranks) == ["FloatingPointError", "ValueError"]  # (label 7)
    # identical draws: 3 epochs of Adam under the warm-up schedule, shuffled shards of 4 on
    # each rank, are one process's on batches of 8 (6.0e-8 apart), the records too
    single, history = _adam_epochs(8)
    for key, value in single.items():
        torch.testing.assert_close(ranks[0]["adam"][0][key], value, rtol=0, atol=1e-6)
        assert torch.equal(ranks[0]["adam"][0][key], ranks[1]["adam"][0][key]), key
    for ours, theirs in zip(ranks[0]["adam"][1], history, strict=True):
        assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(ours, theirs, strict=True))


class _FailsOnRank1(torch.utils.data.Dataset):
    """16 examples; on rank 1, fetching example 9 raises an OSError (an unreadable file)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.x, self.y = _data()

    def __len__(self):
        return N

    def __getitem__(self, i):
        if self.rank == 1 and i == 9:
            raise OSError("cannot read example 9")
        return self.x[i], self.y[i]


def _fetch_worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        dataset = _FailsOnRank1(rank)
        loader = torch.utils.data.DataLoader(
            dataset, 2, sampler=torch.utils.data.DistributedSampler(dataset, shuffle=False)
        )
        start = time.monotonic()
        try:
            fit(*_build(), loader, epochs=1, progress=False, seed=0)
            outcome = "ran"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        torch.save((outcome, time.monotonic() - start), Path(out) / f"fetch{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_batch_one_rank_cannot_fetch_stops_every_rank_at_that_step(tmp_path):
    # rank 1's shard is examples 1, 3, 5, ... in batches of 2: its third, (9, 11), fails, and
    # rank 0 stops at that step too, at once (it waited in the step's collective until the
    # group's timeout)
    spawn_ranks(_fetch_worker, (str(tmp_path / "init"), str(tmp_path)))
    (zero, seconds0), (one, seconds1) = (
        torch.load(tmp_path / f"fetch{r}.pt", weights_only=False) for r in range(WORLD)
    )
    assert one == "OSError: cannot read example 9", one
    assert zero.startswith("FloatingPointError: Another rank stopped at epoch 1, step 3 "), zero
    assert max(seconds0, seconds1) < 30  # (it waited for the 60 s timeout before)


def test_predict_on_one_ranks_share_says_so():
    import warnings

    from pyrouq import predict

    x, y = _data()
    x, y = x[:15], y[:15]  # padded to 8 a share
    dataset = torch.utils.data.TensorDataset(x, y)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
    share = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
    with pytest.warns(UserWarning) as record:
        preds = predict(net, torch.utils.data.DataLoader(dataset, 4, sampler=share))
    assert str(record[0].message) == (
        "predict(): x's DistributedSampler serves rank 1's share of 2 (8 of 15 examples, 1 "
        "repeated to even the shares): the predictions, and the figures evaluated on them, are "
        "that share's. To predict the whole set, pass DataLoader(dataset, batch_size)."
    )
    assert record[0].filename == __file__
    assert preds.probs.shape == (1, 8, 3)
    dropped = torch.utils.data.DistributedSampler(
        dataset, num_replicas=2, rank=0, shuffle=False, drop_last=True
    )
    with pytest.warns(UserWarning, match=r"share of 2 \(7 of 15 examples, 1 in no share\): "):
        predict(net, torch.utils.data.DataLoader(dataset, 4, sampler=dropped))
    whole = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(net, torch.utils.data.DataLoader(dataset, 4, sampler=whole))


class _FailsAfterItsShare(torch.utils.data.DistributedSampler):
    """On rank 1, asking for an index after its share's last raises an OSError (an index file
    that fails to close)."""

    def __iter__(self):
        yield from super().__iter__()
        if self.rank == 1:
            raise OSError("cannot close the shard")


def _end_worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=5))  # fmt: skip
    try:
        dataset = torch.utils.data.TensorDataset(*_data())
        loader = torch.utils.data.DataLoader(
            dataset, 4, sampler=_FailsAfterItsShare(dataset, shuffle=False)
        )
        try:
            fit(*_build(), loader, epochs=1, progress=False, seed=0)
            outcome = "ran"
        except Exception as err:
            outcome = type(err).__name__
        torch.save(outcome, Path(out) / f"end{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_loader_failing_after_its_last_batch_raises_its_own_error():
    # the other rank has stepped on every batch and waits at the epoch's end: the stop's step
    # collective met that one there (gloo: a collective mismatch) and aborted both processes
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        spawn_ranks(_end_worker, (f"{tmp}/init", tmp))
        outcomes = [torch.load(f"{tmp}/end{r}.pt", weights_only=False) for r in range(WORLD)]
    assert outcomes[1] == "OSError"
    assert outcomes[0] in ("RuntimeError", "DistBackendError")  # its wait timed out (5 s)


class _ShortLength:
    """A loader over a ``DistributedSampler`` (batches of 2) whose length is a hint one batch
    short (as an iterable dataset's may be); on rank 1 its fourth batch, beyond the hint,
    fails to load."""

    def __init__(self, dataset, rank: int):
        self.dataset, self.rank = dataset, rank
        self.sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False)

    def __len__(self):
        return len(self.sampler) // 2 - 1

    def __iter__(self):
        indices = list(self.sampler)
        for start in range(0, len(indices), 2):
            if self.rank == 1 and start == 6:
                raise OSError("cannot read the fourth batch")
            yield self.dataset[indices[start : start + 2]]


def _short_worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=20))  # fmt: skip
    try:
        loader = _ShortLength(torch.utils.data.TensorDataset(*_data()), rank)
        try:
            fit(*_build(), loader, epochs=1, progress=False, seed=0, lr_schedule="constant")
            outcome = "ran"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        torch.save(outcome, Path(out) / f"short{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_loader_whose_length_is_a_hint_still_stops_every_rank(tmp_path):
    # the stop was sent only for the first len() batches: the others, stepping on a fourth
    # batch, met a rank that had gone (gloo: connection closed) or waited for its timeout
    spawn_ranks(_short_worker, (str(tmp_path / "init"), str(tmp_path)))
    zero, one = (torch.load(tmp_path / f"short{r}.pt", weights_only=False) for r in range(WORLD))
    assert one == "OSError: cannot read the fourth batch"
    assert zero.startswith("FloatingPointError: Another rank stopped at epoch 1, step 4 "), zero
