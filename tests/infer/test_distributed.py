"""fit() on 2 processes (gloo, CPU), spawned from the test: the averaged gradient is one
process's, ranks stay identical, each rank sees a disjoint half of every epoch; for a Bayesian
MLP and a BatchEnsemble alike."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pyro
import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import (
    ArrayLoader,
    Gaussian,
    TrainingInterrupted,
    batchensemble,
    bayesian,
    fit,
    mean_field_guide,
)

WORLD = 2
N = 16


class RecordingLoader(ArrayLoader):
    """An ArrayLoader that remembers the targets of every batch it served."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[torch.Tensor] = []

    def __iter__(self):
        for x, y in super().__iter__():
            self.seen.append(y.clone())
            yield x, y


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=g)
    return x, torch.arange(N, dtype=torch.float32)  # targets double as example ids


def _build(kind: str):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    if kind == "bayesian":
        model = bayesian(net, likelihood=Gaussian(1.0))
        return model, mean_field_guide(model)
    return batchensemble(net, 2, likelihood=Gaussian(1.0)), None


def _state(model, guide):
    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    if guide is not None:
        state.update({f"guide.{k}": v.clone() for k, v in guide.state_dict().items()})
    return state


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05)


def _one_step(loader, kind, **kwargs):
    model, guide = _build(kind)
    fit(model, guide, loader, epochs=1, optim=_sgd, lr_schedule="constant", progress=False,
        seed=0, **kwargs)  # fmt: skip
    return _state(model, guide)


def _worker(rank: int, kind: str, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        x, y = _data()
        # (1) one step on 2 x B/2 with the same draws everywhere
        one = _one_step(ArrayLoader(x, y, N // WORLD, shuffle=False), kind,
                        distributed_draws="identical")  # fmt: skip
        # (2) independent draws, 20 steps (10 epochs of 2 steps), shuffled shards
        model, guide = _build(kind)
        loader = RecordingLoader(x, y, 4, seed=0)
        fit(model, guide, loader, epochs=10, progress=False, seed=0)
        after_20 = _state(model, guide)
        # (3) a DataLoader with a DistributedSampler: fit() calls its set_epoch every epoch
        dataset = torch.utils.data.TensorDataset(x, y)
        sampler = torch.utils.data.DistributedSampler(dataset, seed=0)
        data_loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
        model, guide = _build(kind)
        sampled: list[list[int]] = []
        fit(model, guide, data_loader, epochs=3, progress=False, seed=0,
            callbacks=[lambda record: sampled.append(list(sampler))])  # fmt: skip
        # (4) rank 0 checkpoints 2 epochs; every rank resumes from that file to epoch 4
        checkpoint = Path(out) / "run.pt"
        model, guide = _build(kind)
        first = fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=2, progress=False,
                    seed=0, checkpoint=checkpoint)  # fmt: skip
        at_2 = _state(model, guide)
        dist.barrier()  # the checkpoint is written before any rank reads it
        model, guide = _build(kind)
        resumed = fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=4, progress=False,
                      seed=0, resume_from=checkpoint)  # fmt: skip
        resumed_state = _state(model, guide)
        # (5) no seed: the ranks, seeded alike for one initial model, get streams of their own
        # while fit() runs (read in a callback: they are joined again after it)
        model, guide = _build(kind)
        drawn: list[torch.Tensor] = []
        fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False,
            callbacks=[lambda record: drawn.append(torch.rand(4))])  # fmt: skip
        torch.save(
            {"one_step": one, "after_20": after_20, "seen": loader.seen, "len": len(loader),
             "sampled": sampled, "at_2": at_2, "resumed": resumed_state,
             "losses": [(r.loss, r.seconds) for r in first.history],
             "resumed_losses": [(r.loss, r.seconds) for r in resumed.history],
             "unseeded_stream": drawn[0]},
            Path(out) / f"rank{rank}.pt",
        )  # fmt: skip
    finally:
        dist.destroy_process_group()
    exit_quietly()


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_two_ranks_train_as_one_process(kind, tmp_path):
    spawn_ranks(_worker, (kind, str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    x, y = _data()
    single = _one_step(ArrayLoader(x, y, N, shuffle=False), kind)
    for r in ranks:  # the averaged gradient of 2 x B/2 is the one-process gradient of B
        for key, value in single.items():
            torch.testing.assert_close(r["one_step"][key], value, rtol=0, atol=1e-6)
    start = _build(kind)
    moved = False
    for key, value in ranks[0]["after_20"].items():  # identical on every rank, bit for bit
        assert torch.equal(value, ranks[1]["after_20"][key]), key
        moved |= not torch.equal(value, _state(*start)[key])
    assert moved
    assert ranks[0]["len"] == math.ceil(N / 4)  # after fit() the loader serves all again
    for epoch in range(3):  # the DistributedSampler's epochs: disjoint, each one reshuffled
        assert set(ranks[0]["sampled"][epoch]).isdisjoint(ranks[1]["sampled"][epoch])
    assert ranks[0]["sampled"][0] != ranks[0]["sampled"][1]  # set_epoch was called
    for key, value in ranks[0]["resumed"].items():  # resumed from rank 0's file: in step
        assert torch.equal(value, ranks[1]["resumed"][key]), key
    assert any(not torch.equal(v, ranks[0]["at_2"][k]) for k, v in ranks[0]["resumed"].items())
    for r in ranks:  # the resumed history starts with the epochs rank 0 checkpointed (its
        assert len(r["resumed_losses"]) == 4  # timings too: they are read, not measured again)
        assert r["resumed_losses"][:2] == ranks[0]["losses"]
    # every rank reports the same records: the means of the figures, the slowest rank's seconds
    # (measured per rank before 2026-12-05, so a callback stopping on time stopped one rank)
    assert ranks[0]["losses"] == ranks[1]["losses"]
    assert ranks[0]["resumed_losses"] == ranks[1]["resumed_losses"]
    assert not torch.equal(ranks[0]["unseeded_stream"], ranks[1]["unseeded_stream"])
    # the 2 ranks' run resumed in one process: its ranks' shards of 2 batches are not this
    # loader's 4, and the warning names the ranks, not the loader (before 2026-12-07 it said
    # "Resume with the run's loader", the loader the run had)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(*_build(kind), ArrayLoader(x, y, 4, seed=0), epochs=4, progress=False,
            resume_from=tmp_path / "run.pt")  # fmt: skip
    told = [str(w.message) for w in caught if "continues" in str(w.message)]
    assert told == [
        "fit(resume_from=...) continues in one process a run trained on 2 ranks: its epochs "
        "are split otherwise than the run's: an epoch takes 4 steps where the run took 2 on "
        "each of 2 ranks, so the learning-rate schedule, planned over the run's steps, no "
        "longer matches; every step sees other batches than the run's would have. Resume on "
        "2 ranks (torchrun --nproc_per_node 2), with the run's loader, to continue it as it "
        "was, or give this loader batch_size=8, whose steps then see the run's batches."
    ]
    for epoch in range(10):  # each epoch: disjoint halves that cover the data
        halves = [torch.cat(r["seen"][2 * epoch : 2 * epoch + 2]) for r in ranks]
        assert set(halves[0].tolist()).isdisjoint(halves[1].tolist())
        assert sorted(torch.cat(halves).tolist()) == y.tolist()


def _batchnorm_worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        x, y = _data()
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
        model = bayesian(net, likelihood=Gaussian(1.0))
        guide = mean_field_guide(model)
        fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=2, progress=False, seed=0)
        torch.save(_state(model, guide), Path(out) / f"bn{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_ranks_end_every_epoch_with_the_same_batchnorm_statistics(tmp_path):
    # each rank updates BatchNorm's running statistics on its own shard; fit() averages them
    spawn_ranks(_batchnorm_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"bn{r}.pt", weights_only=True) for r in range(WORLD)]
    for key, value in ranks[0].items():
        assert torch.equal(value, ranks[1][key]), key
    assert not torch.equal(ranks[0]["model.net.1.running_mean"], torch.zeros(8))  # they moved
    assert ranks[0]["model.net.1.num_batches_tracked"] == 4  # 2 epochs of 2 local steps


def _refusing_worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    messages = []
    try:
        x, y = _data()
        torch.manual_seed(rank)  # built without a common seed: the ranks' models differ
        model = bayesian(nn.Linear(3, 1), likelihood=Gaussian(1.0))
        attempts = [
            (model, mean_field_guide(model), ArrayLoader(x, y, 4, seed=0)),
            (*_build("bayesian"), [(x, y)]),  # the same model; a list: the same data everywhere
        ]
        # models built apart whose guides start from one trained network train together: the
        # latent sites' start values, which differ, are the guide's, not trained
        torch.manual_seed(0)
        trained = nn.Linear(3, 1)
        torch.manual_seed(rank)
        apart = bayesian(nn.Linear(3, 1), likelihood=Gaussian(1.0))
        attempts.append(
            (apart, mean_field_guide(apart, init_from=trained), ArrayLoader(x, y, 4, seed=0))
        )
        # ... but a guide of one's own (a function), whose parameters are not compared, does
        # not make their start values the guide's: refused
        torch.manual_seed(rank)
        fresh = bayesian(nn.Linear(3, 1), likelihood=Gaussian(1.0))
        starts = {k: v.clone() for k, v in fresh.template().items()}

        def own_guide(x=None, y=None):
            for site, value in starts.items():
                loc = pyro.param(f"own_{site}", value.clone())
                pyro.sample(site, pyro.distributions.Normal(loc, 0.1).to_event(value.dim()))

        attempts.append((fresh, own_guide, ArrayLoader(x, y, 4, seed=0)))

        class ParamGuide(nn.Module):  # a guide module keeping its state in pyro.param
            def forward(self, x=None, y=None):
                own_guide(x, y)

        attempts.append((fresh, ParamGuide(), ArrayLoader(x, y, 4, seed=0)))
        for model_, guide_, loader in attempts:
            try:
                fit(model_, guide_, loader, epochs=1, num_data=N, progress=False, seed=0)
                messages.append("trained")
            except ValueError as err:
                messages.append(str(err))
        torch.save(messages, Path(out) / f"refused{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_ranks_that_differ_or_share_data_are_refused(tmp_path):
    spawn_ranks(_refusing_worker, (str(tmp_path / "init"), str(tmp_path)))
    messages = torch.load(tmp_path / "refused0.pt", weights_only=True)
    assert "the model and guide parameters differ between ranks, first at" in messages[0]
    assert "cannot tell whether it gives every rank the same data or each" in messages[1]
    assert messages[2] == "trained"
    assert "parameters differ between ranks, first at 'model: net.weight'" in messages[3]
    assert "parameters differ between ranks, first at 'model: net.weight'" in messages[4]


def _three_rank_worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=3)
    messages = []
    try:
        x, y = _data()  # 16 examples on 3 ranks, batches of 5: shards of 6, 5 and 5 examples
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        model = bayesian(net, prior=0.9, likelihood=Gaussian(1.0))
        guide = mean_field_guide(model)
        loader = RecordingLoader(x, y, 5, seed=0)
        checkpoint = Path(out) / "run3.pt"
        fit(model, guide, loader, epochs=2, progress=False, seed=0, checkpoint=checkpoint)
        scale = model.state_dict()["site_priors.0.scale"].clone()
        dist.barrier()  # rank 0 has written the checkpoint
        torch.manual_seed(0)
        again = bayesian(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)),
                         prior=0.9, likelihood=Gaussian(1.0))  # fmt: skip
        fit(again, mean_field_guide(again), ArrayLoader(x, y, 5, seed=0), epochs=3,
            progress=False, seed=0, resume_from=checkpoint)  # fmt: skip
        dataset = torch.utils.data.TensorDataset(x, y)
        sampler = torch.utils.data.DistributedSampler(dataset, seed=rank)
        attempts = [
            (torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler), 1),
            (ArrayLoader(x, y, 4, seed=0), 1 + rank),
        ]
        for data, epochs in attempts:
            try:
                fit(model, guide, data, epochs=epochs, progress=False)
            except ValueError as err:
                messages.append(str(err))
        torch.save({"seen": loader.seen, "scale": scale, "messages": messages},
                   Path(out) / f"three{rank}.pt")  # fmt: skip
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_three_ranks_take_shards_of_one_size_keep_constants_and_refuse_mismatches(tmp_path):
    spawn_ranks(_three_rank_worker, (str(tmp_path / "init"), str(tmp_path)), world=3)
    ranks = [torch.load(tmp_path / f"three{r}.pt", weights_only=True) for r in range(3)]
    for epoch in range(2):  # 2 batches (5 + 1) on every rank; together all 16, 2 repeated
        shards = [torch.cat(r["seen"][2 * epoch : 2 * epoch + 2]).tolist() for r in ranks]
        assert [len(s) for s in shards] == [6, 6, 6]
        assert sorted({i for shard in shards for i in shard}) == list(range(N))
    # the prior's scale, alike on every rank, is not averaged (three 0.9s average to
    # 0.89999992 in float32), so resuming from the checkpoint found the prior unchanged
    for r in ranks:
        assert r["scale"].item() == torch.tensor(0.9).item()
    sampler, epochs = ranks[1]["messages"]
    assert ("the loaders (their seeds or samplers) differ between ranks, first at "
            "\"the DistributedSampler's seed, shuffle and drop_last\"") in sampler  # fmt: skip
    assert epochs.startswith(
        "fit() runs on 3 ranks, but they would take different numbers of steps: 2 to 2 "
        "batches per epoch (2 on this rank), 1 to 3 epochs (2 on this rank)."
    )


# A group with no CPU backend ("cuda:gloo" here, as nccl): fit() reduces on the model's GPU and
# refuses a model on the CPU, whose tensors such a group cannot reduce (nccl raised "No backend
# type associated with device type cpu" from fit()'s start-up checks before 2026-12-04).


@pytest.mark.parametrize(
    "backend, on_gpu", [("gloo", False), ("cpu:gloo,cuda:gloo", False), ("cuda:gloo", True)]
)
def test_collectives_run_on_the_models_gpu_when_the_group_has_no_cpu_backend(backend, on_gpu):
    from pyrouq.infer import _distributed

    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        gpu = torch.device("cuda", 1)
        assert _distributed.current(gpu).device == (gpu if on_gpu else None)
    finally:
        dist.destroy_process_group()


def _gpu_only_worker(rank: int, init: str, out: str) -> None:
    dist.init_process_group("cuda:gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        model, guide = _build("bayesian")  # on the CPU
        x, y = _data()
        try:
            fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False)
            error = "no error"
        except Exception as err:  # the message is the test's to read
            error = f"{type(err).__name__}: {err}"
        Path(out, f"rank{rank}.txt").write_text(error)
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_cpu_model_in_a_gpu_only_group_is_refused_with_what_to_do(tmp_path):
    spawn_ranks(_gpu_only_worker, (str(tmp_path / "init"), str(tmp_path)))
    for rank in range(WORLD):
        error = (tmp_path / f"rank{rank}.txt").read_text()
        assert error.startswith("ValueError: fit() runs on 2 ranks in a process group whose "
                                "backend (cuda:gloo) reduces GPU tensors only"), error  # fmt: skip
        assert "model.to('cuda')" in error and "init_process_group('gloo')" in error


class _Rows(torch.utils.data.Dataset):
    """Rows of two tensors, read one by one (not checked up front, as a TensorDataset is)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _build_classifier():
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3)))
    return model, mean_field_guide(model)


def _failing_on(rank: int, failing: int):
    """A callback that raises on rank ``failing`` only."""

    def callback(record):
        if rank == failing:
            raise RuntimeError(f"the callback failed at epoch {record.epoch}")

    return callback


def _blocking_the_folder(rank: int, out: str):
    """A callback that, on rank 0, puts a file where the checkpoint's folder was: rank 0's
    next checkpoint write fails."""

    def callback(record):
        folder = Path(out, "run")
        if rank == 0 and folder.is_dir():
            for child in folder.iterdir():
                child.unlink()
            folder.rmdir()
            folder.write_text("not a folder")

    return callback


def _interrupting_on(rank: int, stopping: int):
    """A callback that stops the run (KeyboardInterrupt, as documented) on rank ``stopping``
    only."""

    def callback(record):
        if rank == stopping:
            raise KeyboardInterrupt

    return callback


def _stopping_worker(rank: int, init: str, out: str) -> None:
    """Failures that only one rank meets, and arguments that differ between ranks: every rank
    must stop at the same point with an error (not wait in the next collective)."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    data = torch.utils.data
    outcomes = []
    try:
        x, y = _data()
        huge = y.clone()
        huge[5] = 1e30  # one example whose Gaussian loss overflows: on one rank's shard only
        nan_x = x.clone()
        nan_x[5, 0] = math.nan
        dataset = _Rows(nan_x, y)
        attempts = {
            "lr": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0), epochs=1,
                              lr=0.01 * (1 + rank), progress=False),
            "overflow": lambda: fit(*_build("bayesian"), ArrayLoader(x, huge, 4, shuffle=False),
                                    epochs=1, progress=False),
            "nan batch": lambda: fit(*_build("bayesian"), data.DataLoader(
                dataset, 4, sampler=data.DistributedSampler(dataset, shuffle=False)), epochs=1,
                progress=False),
            "nan batch, float64 targets": lambda: fit(*_build("bayesian"), data.DataLoader(
                _Rows(nan_x, y.double()), 4,
                sampler=data.DistributedSampler(dataset, shuffle=False)), epochs=1,
                progress=False),
            "seed": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0), epochs=1,
                                seed=2_000_000_000 + rank, distributed_draws="identical",
                                progress=False),
            "draws": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0), epochs=1,
                                 seed=0, progress=False,
                                 distributed_draws=("identical", "independent")[rank]),
            "label out of range": lambda: fit(*_build_classifier(), ArrayLoader(
                x, torch.where(torch.arange(N) == 5, 7, torch.arange(N) % 3), 4, shuffle=False),
                epochs=1, check_inputs=False, progress=False),
            "float64 on one rank": lambda: fit(
                *(lambda m: (m, None))(
                    _build("batchensemble")[0].to((torch.float32, torch.float64)[rank])),
                ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False),
            "identical without a seed": lambda: fit(
                *_build("bayesian"), ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False,
                distributed_draws="identical", seed=(0, None)[rank]),
            # each rank's own dataset (14 and 12 examples): refused as num_data passed
            # otherwise, though none was passed, and passing one would have trained on both
            "datasets": lambda: fit(*_build("bayesian"), data.DataLoader(
                data.TensorDataset(x[: N - 2 - 2 * rank], y[: N - 2 - 2 * rank]), 4,
                sampler=data.DistributedSampler(data.TensorDataset(x[: N - 2 - 2 * rank]))),
                epochs=1, progress=False),
            # num_data passed on rank 0 alone: the same dataset, so no word of datasets
            "num_data on one rank": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0),
                                                num_data=(30, None)[rank], epochs=1,
                                                progress=False),
            "sampler rank": lambda: fit(*_build("bayesian"), data.DataLoader(
                data.TensorDataset(x, y), 4,
                sampler=data.DistributedSampler(data.TensorDataset(x, y), 2, 0)), epochs=1,
                progress=False),
            # a checkpoint that one rank cannot read (written on another node): the others,
            # past their own set-up, waited in its first collective before 2026-12-05
            "resume on one rank": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0),
                                              epochs=1, progress=False,
                                              resume_from=(None, Path(out, "missing.pt"))[rank]),
            # rank 0 alone writes the checkpoints; a callback may fail on one rank only: the
            # others waited in the next epoch's first collective before 2026-12-05
            "callback on one rank": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0),
                                                epochs=2, progress=False,
                                                callbacks=[_failing_on(rank, 1)]),
            "checkpoint write": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0),
                                            epochs=2, progress=False,
                                            checkpoint=Path(out, "run", "last.pt"),
                                            callbacks=[_blocking_the_folder(rank, out)]),
            # a callback stopping the run on one rank: the other waited in the epoch's end
            # collective (until the first one's process ended) before 2026-12-05
            "interrupt on one rank": lambda: fit(*_build("bayesian"), ArrayLoader(x, y, 4, seed=0),
                                                 epochs=3, progress=False,
                                                 checkpoint=Path(out, "stopped.pt"),
                                                 callbacks=[_interrupting_on(rank, 1)]),
            # the epoch's end takes one collective on every rank, given a checkpoint or
            # callbacks there or not (rank 0 alone may be given them)
            "rank 0's checkpoint and callback": lambda: fit(
                *_build("bayesian"), ArrayLoader(x, y, 4, seed=0), epochs=2, progress=False,
                checkpoint=(Path(out, "rank0.pt"), None)[rank],
                callbacks=([lambda record: None], [])[rank]),
        }  # fmt: skip
        for name, attempt in attempts.items():
            try:
                attempt()
                outcomes.append((name, "ran", ""))
            except TrainingInterrupted as err:
                outcomes.append((name, "TrainingInterrupted", (len(err.result.history),
                                                               err.checkpoint)))  # fmt: skip
            except Exception as err:
                outcomes.append((name, type(err).__name__, str(err)))
        inner = data.BatchSampler(data.DistributedSampler(data.TensorDataset(x, y)), 4, False)
        loader = data.DataLoader(data.TensorDataset(x, y), batch_sampler=inner)
        fit(*_build("bayesian"), loader, epochs=2, progress=False)  # refused before
        ids = sorted(int(v) for _, yb in loader for v in yb)
        outcomes.append(("batch_sampler", "ran", ids))
        torch.save(outcomes, Path(out) / f"stopped{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_every_rank_stops_together_and_agrees_on_the_arguments(tmp_path):
    spawn_ranks(_stopping_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"stopped{r}.pt", weights_only=False) for r in range(WORLD)]
    by_rank = [{name: (kind, message) for name, kind, message in r} for r in ranks]
    for outcome in by_rank:
        kind, message = outcome["lr"]
        assert kind == "ValueError", message
        assert "fit(): the arguments differ between ranks: lr. Pass the same lr, " in message
        assert outcome["overflow"][0] == "FloatingPointError"
        assert outcome["sampler rank"][0] == "ValueError"
    for rank, outcome in enumerate(by_rank):
        # the note says what to do, not "Pass the same ... num_data on every rank"
        assert outcome["datasets"] == ("ValueError", (
            "fit(): the arguments differ between ranks: num_data. num_data was left out on "
            f"this rank, so N = {14 - 2 * rank} was counted from train_loader (the examples of "
            "its dataset): the ranks' datasets differ. Build the same dataset on every rank "
            "(DistributedSampler(dataset) gives each rank its own shard of it)."
        ))  # fmt: skip
        # one rank's num_data against the other's count: the datasets are the same (rank 1
        # was told they differ, as if no rank had passed num_data)
        assert outcome["num_data on one rank"] == ("ValueError", (
            "fit(): the arguments differ between ranks: num_data. Pass the same lr, lr_schedule,"
            " kl_weight, num_particles, vectorize_particles, num_data and distributed_draws on "
            "every rank (and the same seed with distributed_draws='identical'): the ranks train "
            "one model."
        ))  # fmt: skip
    overflow = sorted(outcome["overflow"][1] for outcome in by_rank)
    assert overflow[0].startswith("Another rank stopped at epoch 1, step ")
    assert overflow[1].startswith("Non-finite loss (inf) on rank 1 of 2 at epoch 1, step ")
    for case in ("nan batch", "nan batch, float64 targets"):  # a float64 loss: same buffer
        nan_batch = sorted((outcome[case] for outcome in by_rank), key=lambda o: o[0])
        assert [kind for kind, _ in nan_batch] == ["FloatingPointError", "ValueError"], case
        assert nan_batch[0][1].startswith("Another rank stopped at epoch 1, step ")
        assert "NaN" in nan_batch[1][1]
    assert by_rank[1]["identical without a seed"][1].startswith(
        "distributed_draws='identical' needs seed=..."
    )
    set_up = "fit() stopped on every rank: rank 1 failed (fit()'s set-up, before training: "
    assert by_rank[0]["identical without a seed"][1].startswith(set_up)
    kind, message = by_rank[1]["resume on one rank"]  # its own error
    assert kind == "CheckpointError" and message.startswith("No checkpoint at "), message
    kind, message = by_rank[0]["resume on one rank"]
    assert kind == "ValueError" and message.startswith(set_up), message
    assert message.endswith("its error says what to change.")
    kind, message = by_rank[1]["callback on one rank"]  # its own error
    assert kind == "RuntimeError" and message == "the callback failed at epoch 1", message
    epoch_end = "fit() stopped on every rank: rank {} failed (writing the checkpoint or running "
    kind, message = by_rank[0]["callback on one rank"]
    assert kind == "ValueError" and message.startswith(epoch_end.format(1)), message
    assert "a callback at the end of epoch 1)" in message
    kind, message = by_rank[1]["checkpoint write"]
    assert kind == "ValueError" and message.startswith(epoch_end.format(0)), message
    assert "at the end of epoch 2)" in message
    assert by_rank[0]["checkpoint write"][0] != "ValueError", by_rank[0]["checkpoint write"]
    for outcome in by_rank:  # every rank stops at the epoch's end, with the checkpoint
        assert outcome["interrupt on one rank"] == (
            "TrainingInterrupted",
            (1, tmp_path / "stopped.pt"),
        )
        assert outcome["rank 0's checkpoint and callback"] == ("ran", "")
    assert torch.load(tmp_path / "stopped.pt", weights_only=False)["training"] is not None
    label = sorted((outcome["label out of range"] for outcome in by_rank), key=lambda o: o[0])
    assert label[0][0] == "FloatingPointError", label  # the rank whose forward failed: its own
    assert label[0][1].startswith("Another rank stopped at epoch 1, step ")
    for outcome in by_rank:
        kind, message = outcome["float64 on one rank"]
        assert kind == "ValueError" and "parameters differ between ranks, first at" in message
    for outcome in by_rank:  # seeds compared exactly; another distributed_draws named
        assert outcome["seed"][1].startswith("fit(): the arguments differ between ranks: seed.")
        assert outcome["draws"][1].startswith(
            "fit(): the arguments differ between ranks: distributed_draws, seed."
        )
    assert "is set for rank 0 of 2, but this process is rank 1" in by_rank[1]["sampler rank"][1]
    assert by_rank[0]["sampler rank"][1].startswith("fit() stopped on every rank: rank 1 failed")
    # a DistributedSampler inside batch_sampler= shards the data: disjoint halves
    halves = [outcome["batch_sampler"][1] for outcome in by_rank]
    assert sorted(halves[0] + halves[1]) == list(range(N))


class _TemperedRegression(pyro.nn.PyroModule):
    """A Pyro model of one's own whose forward draws a pyro.param's start value at random."""

    def __init__(self):
        super().__init__()
        self.linear = pyro.nn.PyroModule[nn.Linear](3, 1)
        self.linear.weight = pyro.nn.PyroSample(
            pyro.distributions.Normal(0.0, 1.0).expand([1, 3]).to_event(2)
        )

    def forward(self, x, y=None):
        scale = pyro.param("noise", lambda: torch.rand(()) + 0.5,
                           constraint=pyro.distributions.constraints.positive)  # fmt: skip
        mean = self.linear(x).squeeze(-1)
        with pyro.plate("data", self.num_data, subsample_size=len(x)):
            pyro.sample("obs", pyro.distributions.Normal(mean, scale), obs=y)


def _param_store_worker(rank: int, init: str, out: str) -> None:
    """Pyro's param store compared across ranks; the largest seed taken on every rank."""
    from pyro.infer.autoguide import AutoNormal

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    outcomes = {}
    try:
        x, y = _data()

        def attempt(name, model, guide, **kwargs):
            try:
                fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False, **kwargs)
                outcomes[name] = "trained"
            except ValueError as err:
                outcomes[name] = str(err)

        torch.manual_seed(0)
        model = bayesian(nn.Linear(3, 1), likelihood=Gaussian(1.0))
        shapes = {site: value.shape for site, value in model.template().items()}

        def own_guide(x=None, y=None):  # a guide written as a function: random start values
            for site, shape in shapes.items():
                loc = pyro.param(f"loc_{site}", lambda shape=shape: torch.randn(shape))
                pyro.sample(site, pyro.distributions.Normal(loc, 0.1).to_event(len(shape)))

        torch.manual_seed(100 + rank)  # the ranks' generators differ from here on
        attempt("function guide", model, own_guide)
        pyro.clear_param_store()
        attempt("function guide, seed", model, own_guide, seed=0)  # drawn after seeding: alike
        outcomes["site"] = next(iter(shapes))
        outcomes["seeded loc"] = pyro.param(f"loc_{outcomes['site']}").detach().clone()
        pyro.clear_param_store()
        torch.manual_seed(0)
        regression = _TemperedRegression()
        guide = AutoNormal(regression)  # its start values (init_to_feasible) do not draw
        torch.manual_seed(100 + rank)
        attempt("model's pyro.param", regression, guide)
        pyro.clear_param_store()
        # the largest seed: rank 1 seeds (2**32 - 1 + 1) % 2**32 = 0 (numpy refused 2**32)
        attempt(
            "largest seed",
            *_build("bayesian"),
            seed=2**32 - 1,
            callbacks=[lambda record: outcomes.update({"initial seed": torch.initial_seed()})],
        )
        torch.save(outcomes, Path(out) / f"store{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_the_datasets_note_is_for_an_n_counted_from_the_loader_alone():
    """The note that the ranks' datasets differ is for an N counted from train_loader: an N the
    model was built with (bayesian(net, num_data=30), a loader of batches that counts none)
    or one of resume_from's run was not counted from it, and is not told so."""
    from pyrouq.infer._num_data import counted_num_data_note

    x, y = torch.randn(N, 4), torch.randint(0, 3, (N,))
    note = counted_num_data_note(None, N, ArrayLoader(x, y, 4))
    assert note["num_data"].startswith(f"num_data was left out on this rank, so N = {N} was ")
    assert counted_num_data_note(None, 30, [(x, y)]) == {}  # the model's N, not the loader's
    assert counted_num_data_note(N, N, ArrayLoader(x, y, 4)) == {}  # passed: no note


def test_param_store_parameters_are_compared_and_the_largest_seed_wraps(tmp_path):
    spawn_ranks(_param_store_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"store{r}.pt", weights_only=True) for r in range(WORLD)]
    differ = "fit(): the model and guide parameters differ between ranks, first at "
    for r in ranks:  # trained apart, silently, before 2026-12-05
        assert r["function guide"].startswith(f"{differ}'param store: loc_{r['site']}'")
        assert r["model's pyro.param"].startswith(differ + "'param store: noise'")
        assert "pass the same fit(seed=...) on every rank" in r["model's pyro.param"]
        assert r["function guide, seed"] == "trained"
        assert r["largest seed"] == "trained"
    assert torch.equal(ranks[0]["seeded loc"], ranks[1]["seeded loc"])
    assert [r["initial seed"] for r in ranks] == [2**32 - 1, 0]


def _stop_statistics_worker(rank: int, init: str, out: str) -> None:
    """A step refused on rank 1 (its 4th batch: a NaN input, then a target whose loss
    overflows) after 3 steps that updated BatchNorm's statistics on each rank's shard."""
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    data = torch.utils.data
    outcomes = {}
    try:
        x, y = _data()
        nan_x, huge = x.clone(), y.clone()
        nan_x[13, 0] = math.nan  # rank 1's 4th batch of 2 (shards unshuffled: every other one)
        huge[13] = 1e30
        rows = _Rows(nan_x, y)
        sampler: Any = data.DistributedSampler(rows, shuffle=False)
        loaders: dict[str, Any] = {  # the nan input is checked batch by batch (not in memory)
            "nan input": data.DataLoader(rows, 2, sampler=sampler),
            "overflow": ArrayLoader(x, huge, 2, shuffle=False),
        }
        for name, loader in loaders.items():
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 1))
            model = bayesian(net, likelihood=Gaussian(1.0))
            guide = mean_field_guide(model)
            error = "trained"
            try:
                fit(model, guide, loader, epochs=1, progress=False, seed=0)
            except (ValueError, FloatingPointError) as err:
                error = type(err).__name__
            outcomes[name] = (error, _state(model, guide))
        torch.save(outcomes, Path(out) / f"stats{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_ranks_stopped_within_an_epoch_end_with_the_same_statistics(tmp_path):
    spawn_ranks(_stop_statistics_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"stats{r}.pt", weights_only=True) for r in range(WORLD)]
    for name, errors in (("nan input", ["FloatingPointError", "ValueError"]),
                         ("overflow", ["FloatingPointError", "FloatingPointError"])):  # fmt: skip
        assert [r[name][0] for r in ranks] == errors, name
        states = [r[name][1] for r in ranks]
        # 3 steps' statistics, averaged as the ranks stopped (each kept its own before 2026-12-05)
        assert states[0]["model.net.1.num_batches_tracked"] == 3, name
        assert not torch.equal(states[0]["model.net.1.running_mean"], torch.zeros(8)), name
        for key, value in states[0].items():
            assert torch.equal(value, states[1][key]), (name, key)
