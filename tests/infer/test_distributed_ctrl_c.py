"""Ctrl-C under torch.distributed (2 processes, gloo, CPU): a SIGINT that reaches one rank, or
two ranks at different steps, stops every rank after the same step (the request rides on the
step's gradient all_reduce), rank 0 saves the partial run, and every rank raises
TrainingInterrupted naming the same epoch and step. Before, the interrupted rank stopped alone
and the other waited in its next step's all_reduce (here: until the group's 20 s timeout)."""

from __future__ import annotations

import datetime
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import ArrayLoader, TrainingInterrupted, bayesian, fit, load, mean_field_guide

WORLD, N, BATCH = 2, 16, 2  # 8 examples a rank: 4 steps an epoch


class SignalsAt(ArrayLoader):
    """An ArrayLoader that sends SIGINT to its own process while serving batch ``at`` (counted
    from 1 over the batches served once fit()'s Ctrl-C handler is installed; None: never)."""

    def __init__(self, at: int | None):
        x = torch.randn(N, 3, generator=torch.Generator().manual_seed(1))
        y = torch.randint(0, 3, (N,), generator=torch.Generator().manual_seed(0))
        super().__init__(x, y, BATCH, seed=0)
        self.at, self.served = at, 0

    def __iter__(self):
        for batch in super().__iter__():
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:  # in fit()
                self.served += 1
                if self.served == self.at:
                    os.kill(os.getpid(), signal.SIGINT)
            yield batch


class SignalsAtEpochEnd:
    """A callback sending SIGINT to its own process at the end of epoch ``epoch``."""

    def __init__(self, epoch: int | None):
        self.epoch = epoch

    def __call__(self, record) -> None:
        if record.epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGINT)


class SignalsInUpdate(torch.optim.SGD):
    """SGD sending SIGINT to its own process inside its update number ``at`` (after the
    step's gradient all_reduce, which carried no request then)."""

    at: int | None = None

    def step(self, closure=None):
        self.taken = getattr(self, "taken", 0) + 1
        if self.taken == self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return super().step(closure)


def _signal_in_forward(at: int | None):
    """A forward pre-hook sending SIGINT to its own process in the model's training-mode
    forward pass number ``at`` (None: never): inside a step, before its gradient all_reduce."""
    passes = []

    def hook(module, args):
        if module.training:
            passes.append(1)
            if len(passes) == at:
                os.kill(os.getpid(), signal.SIGINT)

    return hook


def _interrupted_fit(signals: tuple, checkpoint: Path) -> dict:
    at, epoch_end, in_update, *in_forward = signals
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3))
    net.register_forward_pre_hook(_signal_in_forward(in_forward[0] if in_forward else None))
    model = bayesian(net)
    guide = mean_field_guide(model)

    def optim(params):
        optimizer = SignalsInUpdate(params, lr=0.05)
        optimizer.at = in_update
        return optimizer

    try:
        result = fit(model, guide, SignalsAt(at), epochs=3, optim=optim, progress=False, seed=0,
                     checkpoint=checkpoint, callbacks=[SignalsAtEpochEnd(epoch_end)])  # fmt: skip
        outcome: dict = {"raised": None, "steps": result.steps}
    except TrainingInterrupted as err:
        outcome = {"raised": "TrainingInterrupted", "epoch": err.epoch, "step": err.step,
                   "steps": err.result.steps, "records": len(err.result.history),
                   "checkpoint": str(err.checkpoint)}  # fmt: skip
    except BaseException as err:  # the old code: a rank left in a collective
        return {"raised": f"{type(err).__name__}: {err}"}
    outcome["weights"] = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    return outcome


# per case and rank: the batch whose fetch sends SIGINT, the epoch whose end does, the update
CASES = {
    "rank 0, batch 6": ((6, None, None), (None, None, None)),
    "rank 0 at batch 3, rank 1 at batch 2": ((3, None, None), (2, None, None)),
    "rank 1, last batch of epoch 1": ((None, None, None), (4, None, None)),
    "rank 1, callback at epoch 1's end": ((None, None, None), (None, 1, None)),
    "rank 0, update 3": ((None, None, 3), (None, None, None)),
    "rank 1, update 4 (epoch 1's last)": ((None, None, None), (None, None, 4)),
    "rank 1, forward pass of step 3": ((None, None, None), (None, None, None, 3)),
}


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=20))  # fmt: skip
    outcomes = {}
    try:
        for i, (case, signals) in enumerate(CASES.items()):
            outcomes[case] = _interrupted_fit(signals[rank], Path(out) / f"case{i}.pt")
            if outcomes[case]["raised"] not in (None, "TrainingInterrupted"):
                break  # the group is broken: the later cases would only wait
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    spawn_ranks(_worker, (str(out / "init"), str(out)))
    return out, [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


# (epoch, its last completed step, steps taken, completed epochs) where every rank stops
STOPS = {
    "rank 0, batch 6": (2, 2, 6, 1),  # the step on the batch whose fetch saw the Ctrl-C
    "rank 0 at batch 3, rank 1 at batch 2": (1, 2, 2, 0),  # the first rank's request
    "rank 1, last batch of epoch 1": (1, 4, 4, 0),  # after the step, before the epoch's end
    "rank 1, callback at epoch 1's end": (1, 4, 4, 1),  # at the epoch's end
    # after the step's all_reduce: the next one carries it (one process: after step 3 itself)
    "rank 0, update 3": (1, 4, 4, 0),
    "rank 1, update 4 (epoch 1's last)": (1, 4, 4, 1),  # the epoch's end exchange carries it
    # inside the step, before its all_reduce: after that step, as one process stops (read as
    # the step began, the request stopped the ranks after step 4 before 2026-12-08)
    "rank 1, forward pass of step 3": (1, 3, 3, 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_rank_stops_after_the_same_step_and_rank_0_saves_it(ranks, case):
    out, outcomes = ranks
    for rank, outcome in enumerate(outcomes):
        assert case in outcome, f"rank {rank} stopped before this case"
        assert outcome[case]["raised"] == "TrainingInterrupted", (rank, outcome[case]["raised"])
    first, second = (outcome[case] for outcome in outcomes)
    epoch, step, steps, records = STOPS[case]
    for outcome in (first, second):
        got = (outcome["epoch"], outcome["step"], outcome["steps"], outcome["records"])
        assert got == (epoch, step, steps, records)
    path = out / f"case{list(CASES).index(case)}.pt"
    assert first["checkpoint"] == second["checkpoint"] == str(path)
    saved = load(path, module=nn.Sequential(nn.Linear(3, 3)))
    assert saved.training is not None
    assert saved.training["steps"] == steps
    assert (saved.training["epochs_done"], saved.training["epoch_steps"]) == (
        (records, 0) if records == epoch else (records, step)
    )
    weights = saved.guide.state_dict()
    assert first["weights"].keys() == second["weights"].keys() == weights.keys()
    for key, value in first["weights"].items():  # every rank holds the step's parameters
        assert torch.equal(value, second["weights"][key]), key
        assert torch.equal(value, weights[key]), key


def test_a_ctrl_c_inside_a_forward_pass_stops_one_process_after_that_step_too(tmp_path):
    # the reference of the ranks' case "rank 1, forward pass of step 3": one process
    outcome = _interrupted_fit((None, None, None, 3), tmp_path / "one.pt")
    assert outcome["raised"] == "TrainingInterrupted", outcome["raised"]
    assert (outcome["epoch"], outcome["step"], outcome["steps"]) == STOPS[
        "rank 1, forward pass of step 3"
    ][:3]
