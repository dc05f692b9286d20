"""fit() on 2 processes (gloo, CPU), fourth audit: float16 gradients averaged without
overflowing their sum, optimizers that differ between ranks refused (an ``optim=`` whose lr
fit() does not see), a rank-1 network and a regression with a learned noise trained as one
process on the global batches, and a run resumed with identical draws equal to the one never
stopped; fit() called on one rank alone explains the timeout it ends in."""

from __future__ import annotations

import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import (
    ArrayLoader,
    Gaussian,
    TrainingInterrupted,
    bayesian,
    fit,
    mean_field_guide,
    rank1,
)

WORLD = 2
N = 12


def _half_step(batch_size: int) -> torch.Tensor:
    """One SGD step of a float16 classifier on 8 examples of class 0, with N = 60,000: each
    rank's gradient of the class-0 weight is -2N/3 = -40,000 (float16 holds 65,504), and so is
    one process's on both shards together; the ranks' sum, -80,000, is not a float16."""
    net = nn.Linear(1, 3, bias=False).half()
    with torch.no_grad():
        net.weight.zero_()
    x, y = torch.ones(8, 1, dtype=torch.float16), torch.zeros(8, dtype=torch.long)
    fit(net, None, ArrayLoader(x, y, batch_size, seed=0), epochs=1, num_data=60_000,
        optim=lambda p: torch.optim.SGD(p, lr=1e-6), lr_schedule="constant", progress=False,
        seed=0)  # fmt: skip
    return net.weight.detach().clone()


def _build(kind: str):
    torch.manual_seed(0)
    if kind == "rank1":
        model = rank1(nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3)), 2)
    else:  # a regression whose noise scale is a parameter of the model
        net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
        model = bayesian(net, likelihood=Gaussian("learned"))
    return model, mean_field_guide(model)


def _state(model, guide):
    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    state.update({f"guide.{k}": v.clone() for k, v in guide.state_dict().items()})
    return state


def _loader(kind: str, batch_size: int) -> ArrayLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, 3, generator=g), torch.randn(N, generator=g)
    return ArrayLoader(x, torch.arange(N) % 3 if kind == "rank1" else y, batch_size, seed=0)


def _two_epochs(kind: str, batch_size: int, **kwargs):
    model, guide = _build(kind)
    result = fit(model, guide, _loader(kind, batch_size), epochs=2, progress=False, seed=0,
                 **kwargs)  # fmt: skip
    return _state(model, guide), [(r.loss, r.nll, r.kl) for r in result.history]


def _stop_at_2(record):
    if record.epoch == 2:
        raise KeyboardInterrupt


def _optimizer_outcomes(rank: int) -> dict[str, str]:
    """fit(optim=...) on each rank: ``lr`` is then ignored, and the optimizers' own settings
    were not compared (an lr scaled by the rank: the ranks' weights 0.233 apart after an
    epoch)."""
    sgd, adam = torch.optim.SGD, torch.optim.Adam
    cases = {
        "same": lambda p: sgd(p, lr=0.1, momentum=0.9),
        "lr by rank": lambda p: sgd(p, lr=0.1 * (1 + rank)),
        "tensor lr by rank": lambda p: sgd(p, lr=torch.tensor(0.1 * (1 + rank))),
        "betas": lambda p: adam(p, lr=0.1, betas=(0.9, (0.999, 0.99)[rank])),
        "tensor betas": lambda p: adam(p, lr=0.1, foreach=False,
                                       betas=(torch.tensor(0.9), torch.tensor((0.999, 0.5)[rank]))),
        "foreach by rank": lambda p: sgd(p, lr=0.1, foreach=(None, True)[rank]),
        "class": lambda p: (sgd, adam)[rank](p, lr=0.1),
        "groups": lambda p: sgd([{"params": p}] if rank == 0 else
                                [{"params": p[:1]}, {"params": p[1:]}], lr=0.1),
    }  # fmt: skip
    outcomes = {}
    for name, make in cases.items():
        model, guide = _build("learned")
        try:
            fit(model, guide, _loader("learned", 3), epochs=1, progress=False, seed=0,
                optim=make)  # fmt: skip
            outcomes[name] = "ok"
        except ValueError as err:
            outcomes[name] = str(err)
    return outcomes


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    outcomes: dict = {}
    try:
        outcomes["half"] = _half_step(4)
        for kind in ("rank1", "learned"):
            outcomes[kind] = _two_epochs(kind, 3, distributed_draws="identical")
        # identical draws: 4 epochs, against 2 (stopped by a callback) resumed to 4
        model, guide = _build("learned")
        fit(model, guide, _loader("learned", 3), epochs=4, progress=False, seed=0,
            distributed_draws="identical")  # fmt: skip
        outcomes["never stopped"] = _state(model, guide)
        checkpoint = Path(out) / "run.pt"
        model, guide = _build("learned")
        try:
            fit(model, guide, _loader("learned", 3), epochs=4, progress=False, seed=0,
                distributed_draws="identical", checkpoint=checkpoint,
                callbacks=[_stop_at_2])  # fmt: skip
        except TrainingInterrupted as err:
            outcomes["stopped after"] = len(err.result.history)
        dist.barrier()  # rank 0 has written the checkpoint
        model, guide = _build("learned")
        fit(model, guide, _loader("learned", 3), epochs=4, progress=False, seed=0,
            distributed_draws="identical", resume_from=checkpoint)  # fmt: skip
        outcomes["resumed"] = _state(model, guide)
        outcomes["optimizers"] = _optimizer_outcomes(rank)
    finally:
        dist.destroy_process_group()
    # fit() on rank 0 alone, in a group timing out after 5 s: it waited there for rank 1
    # and raised gloo's own "Timed out waiting 5000ms for recv operation" (30 minutes by
    # default), which said nothing of why
    dist.init_process_group("gloo", init_method=f"file://{init}2", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=5))  # fmt: skip
    done = Path(out) / "alone.txt"
    try:
        if rank == 0:
            try:
                fit(nn.Linear(3, 2), None, ArrayLoader(torch.randn(8, 3), torch.arange(8) % 2, 4),
                    epochs=1, progress=False)  # fmt: skip
                outcomes["alone"] = "ran"
            except RuntimeError as err:
                outcomes["alone"] = str(err)
            done.write_text("done")
        else:
            deadline = time.monotonic() + 60
            while not done.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_two_ranks_average_float16_gradients_refuse_other_optimizers_and_resume_exactly(
    tmp_path,
):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    # float16: the ranks summed their gradients in float16 before dividing by 2, to -inf, and
    # the step wrote inf into the weight, silently (before 2026-12); one process: lr * 2N/3
    single = _half_step(8)  # = 0.04 (float16's lr, 1.013e-6, makes it 0.0405)
    assert abs(single[0, 0].item() - 0.04) < 1e-3, single
    for r in ranks:
        assert torch.equal(r["half"], single), r["half"]
    # 2 ranks with identical draws on 2 x 3 examples train as one process on 6: a rank-1
    # network (its point-estimate weights and latent factors), a learned noise scale
    for kind in ("rank1", "learned"):
        state, history = _two_epochs(kind, 6)
        for r in ranks:
            for key, value in state.items():
                torch.testing.assert_close(r[kind][0][key], value, rtol=0, atol=1e-6)
            for ours, theirs in zip(r[kind][1], history, strict=True):  # the KL counted once
                torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    for r in ranks:  # identical draws: the resumed run is the one never stopped, bit for bit
        assert r["stopped after"] == 2
        for key, value in r["never stopped"].items():
            assert torch.equal(r["resumed"][key], value), key
    # resumed in one process on batches of 6, the 2 ranks' 3 each: the run's batches, and
    # with identical draws the run never stopped, to float rounding (the warning said "every
    # step sees other batches than the run's would have" before 2026-12-08)
    model, guide = _build("learned")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, guide, _loader("learned", 6), epochs=4, progress=False, seed=0,
            resume_from=tmp_path / "run.pt")  # fmt: skip
    for key, value in ranks[0]["never stopped"].items():
        torch.testing.assert_close(_state(model, guide)[key], value, rtol=0, atol=1e-6)
    assert [str(w.message) for w in caught if "continues" in str(w.message)] == [
        "fit(resume_from=...) continues in one process a run trained on 2 ranks: its steps "
        "see the run's batches (6 examples a step: 3 on each of 2 ranks in the run, 6 in one "
        "process here), but split otherwise: a step's gradient is taken at one draw of the "
        "weights where the run's averaged 2, one per rank (drawn alike on every rank with "
        "distributed_draws='identical': the run then continues as it was, to float rounding). "
        "Resume on 2 ranks (torchrun --nproc_per_node 2), with the run's loader, to continue "
        "it as it was."
    ]
    fix = ". Build the same optimizer on every rank (optim=...: the same class, parameter groups"
    for rank, r in enumerate(ranks):
        said = r["optimizers"]
        assert said["same"] == said["foreach by rank"] == "ok"  # the numbers are the same
        for case in ("lr by rank", "tensor lr by rank"):
            assert said[case].startswith(
                f"fit(): the optimizers (SGD) differ between ranks: param group 0's lr{fix}"
            ), said[case]
        for case in ("betas", "tensor betas"):  # (tensor betas were compared by type)
            assert said[case].startswith(
                f"fit(): the optimizers (Adam) differ between ranks: param group 0's betas{fix}"
            ), said[case]
        assert said["class"].startswith(
            "fit(): the optimizers differ between ranks: their class or parameter groups "
            f"({('SGD', 'Adam')[rank]} with 1 parameter group(s) on rank {rank}){fix}"
        ), said["class"]
        assert said["groups"].startswith(
            "fit(): the optimizers differ between ranks: their class or parameter groups "
            f"(SGD with {1 + rank} parameter group(s) on rank {rank}){fix}"
        ), said["groups"]
    assert ranks[0]["alone"].startswith(
        "fit() on rank 0 of 2 waited for the other ranks in vain (fit()'s set-up, before "
        "training), until the process group's timeout: every rank of the group must call fit()"
    ), ranks[0]["alone"]
    assert "dist.destroy_process_group()" in ranks[0]["alone"]
