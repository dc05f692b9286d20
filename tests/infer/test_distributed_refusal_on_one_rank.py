"""fit() on 2 processes (gloo, CPU), second audit: a loader refused on one rank only stops
every rank in step (the others waited in the steps' check, whose all_reduce then met the
refused rank's next collective and read its numbers), so does a model on the meta device on
one rank only (refused before the set-up's collective, it left rank 0 waiting there), ranks
that differ are named, and an uneven N is sharded into equal, covering shards, reshuffled
every epoch and repeated with the seed."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from _toy import StopAfter
from torch import nn

from pyrouq import ArrayLoader, Gaussian, TrainingInterrupted, bayesian, fit, load, mean_field_guide

WORLD = 2
N = 11  # not divisible by 2: shards of 6, one example repeated


class _Recording(ArrayLoader):
    """An ArrayLoader that remembers the targets (example ids) of every batch it served."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[list[int]] = []

    def __iter__(self):
        for x, y in super().__iter__():
            self.seen.append([int(v) for v in y])
            yield x, y


def _build(seed: int = 0, hidden: int = 8, layers: int = 2):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    if layers == 3:
        net.append(nn.Linear(1, 1))
    model = bayesian(net, likelihood=Gaussian(1.0))
    return model, mean_field_guide(model)


def _worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    outcomes: dict = {}
    try:
        x = torch.randn(N, 3, generator=torch.Generator().manual_seed(0))
        y = torch.arange(N, dtype=torch.float32)  # targets double as example ids

        def attempt(name, *args, **kwargs):
            try:
                fit(*args, epochs=kwargs.pop("epochs", 1), progress=False, seed=0, **kwargs)
                outcomes[name] = "ran"
            except ValueError as err:
                outcomes[name] = str(err)

        # a list on rank 0 (refused), an unshuffled ArrayLoader on rank 1: the loaders'
        # states (none) agree, so only the shards' check tells
        loader = [(x, y)] if rank == 0 else ArrayLoader(x, y, 4, shuffle=False)
        attempt("list on rank 0", *_build(), loader, num_data=N)
        attempt("then", *_build(), ArrayLoader(x, y, 4, seed=0))  # in step again
        attempt("model", *_build(seed=rank), ArrayLoader(x, y, 4, seed=0))
        attempt("layers", *_build(layers=2 + rank), ArrayLoader(x, y, 4, seed=0))
        # an interrupted run's checkpoint (written before the ranks started): models that
        # differ are refused before its warning; raised as an error on rank 1, it stops both
        stopped = str(Path(out) / "stopped.pt")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            attempt("model, checkpoint", *_build(seed=rank), ArrayLoader(x, y, 4, seed=0),
                    checkpoint=stopped)  # fmt: skip
        told = [str(w.message) for w in caught]
        outcomes["warned"] = [m for m in told if "holds an interrupted run" in m]
        with warnings.catch_warnings():
            if rank == 1:
                warnings.filterwarnings("error", message=".*holds an interrupted run")
            try:
                attempt("warning as error", *_build(), ArrayLoader(x, y, 4, seed=0),
                        checkpoint=stopped)  # fmt: skip
            except UserWarning as warned:
                outcomes["warning as error"] = f"raised: {str(warned)[:60]}"
        attempt("hidden", *_build(hidden=8 + rank), ArrayLoader(x, y, 4, seed=0))
        model, guide = _build()  # float64 on rank 1
        attempt("dtype", *((model.double(), guide.double()) if rank else (model, guide)),
                ArrayLoader(x, y, 4, seed=0))  # fmt: skip
        model, guide = _build()  # a skeleton on the meta device on rank 1 (left unloaded)
        attempt("meta", model.to("meta") if rank else model, guide, ArrayLoader(x, y, 4, seed=0))
        runs = []
        for _ in range(2):  # uneven N: shards of ceil(11 / 2) = 6; repeated with the seed
            recording = _Recording(x, y, 4, seed=0)
            model, guide = _build()
            fit(model, guide, recording, epochs=3, progress=False, seed=0)
            runs.append((recording.seen, model.num_data, dict(guide.state_dict())))
        outcomes["runs"] = runs
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_refusals_on_one_rank_keep_the_ranks_in_step_and_name_the_rank(tmp_path):
    x, y = torch.randn(N, 3), torch.arange(N, dtype=torch.float32)
    with pytest.raises(TrainingInterrupted):  # an interrupted run's checkpoint: 1 of 3 epochs
        fit(*_build(), ArrayLoader(x, y, 4, seed=0), epochs=3, progress=False,
            checkpoint=tmp_path / "stopped.pt", callbacks=[StopAfter(1)])  # fmt: skip
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for r in ranks:  # refused by the models' check, before the warning (it came first)
        assert "differ between ranks, first at" in r["model, checkpoint"], r["model, checkpoint"]
        assert r["warned"] == [], r["warned"]
    assert ranks[1]["warning as error"].startswith("raised: fit(checkpoint="), ranks[1]
    assert ranks[0]["warning as error"].startswith(
        "fit() stopped on every rank: rank 1 failed (fit()'s set-up"
    ), ranks[0]["warning as error"]
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    assert load(tmp_path / "stopped.pt", module=net).training["epochs_done"] == 1  # kept
    told = ranks[0]["list on rank 0"]
    assert "cannot tell whether it gives every rank the same data or each rank its own" in told
    assert ranks[1]["list on rank 0"].startswith(
        "fit() stopped on every rank: rank 0 failed (its train_loader does not shard the data "
        "for its rank)"
    ), ranks[1]["list on rank 0"]
    assert ranks[1]["meta"].startswith("fit(): the model is on the meta device"), ranks[1]
    assert ranks[0]["meta"].startswith("fit() stopped on every rank: rank 1 failed"), ranks[0]
    for r in ranks:
        assert r["then"] == "ran", r["then"]
        assert "differ between ranks, first at 'guide: loc.0__weight', where rank 1 holds " \
            "other values than rank 0." in r["model"], r["model"]  # fmt: skip
        assert "differ between ranks: rank 1 holds 24 tensors, rank 0 holds 16." in r["layers"], r[
            "layers"
        ]
        # a layer of 9 units on rank 1: its sizes, not its values (seeds) differ (it said
        # "where rank 1 holds other values than rank 0" before 2026-12-08)
        assert "differ between ranks, first at 'guide: loc.0__weight', where rank 1 holds 27 " \
            "values where rank 0 holds 24. Build them" in r["hidden"], r["hidden"]  # fmt: skip
    for rank, r in enumerate(ranks):
        dtype = ("torch.float32", "torch.float64")[rank]
        assert "where rank 1 holds values of another dtype than rank 0 " \
            f"({dtype} on rank {rank})." in r["dtype"], r["dtype"]  # fmt: skip
    first, again = ranks[0]["runs"]
    for r in ranks:
        assert r["runs"][0][1] == N  # the likelihood scales by the whole N, not the shard
    for epoch in range(3):  # batches of 4 + 2 on every rank; together all 11, one repeated
        batches = [r["runs"][0][0][2 * epoch : 2 * epoch + 2] for r in ranks]
        assert [[len(b) for b in rank_batches] for rank_batches in batches] == [[4, 2], [4, 2]]
        shards = [first + second for first, second in batches]
        assert sorted(set(shards[0] + shards[1])) == list(range(N))
    assert first[0][:2] != first[0][2:4]  # reshuffled every epoch
    assert first[0] == again[0]  # ... in the same way with the same seed
    for key, value in first[2].items():  # independent draws: repeated with the seed
        assert torch.equal(value, again[2][key]), key
        assert torch.equal(value, ranks[1]["runs"][0][2][key]), key  # and alike on the ranks
