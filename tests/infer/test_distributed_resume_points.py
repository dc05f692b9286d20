"""Review of three fixes: fit() on 2 processes (gloo, CPU) refuses ranks that resume from
different points of a run, or from different runs at the same step, naming resume_from and
each rank's point as the run counts its epochs; one checkpoint read from two paths resumes;
plot_uncertainty_distributions' refusal of too many bins tells its cost truly."""

from __future__ import annotations

import os
import shutil
import signal

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

from pyrouq import ArrayLoader, TrainingInterrupted, bayesian, fit, mean_field_guide
from pyrouq.plotting import plot_uncertainty_distributions

WORLD, N = 2, 24  # batches of 8: 3 steps an epoch


def _data():
    x = torch.randn(N, 3, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long()


class _SigintAtBatch(ArrayLoader):
    """Sends this process a SIGINT while serving its ``at``-th batch (0-based, over epochs)."""

    at = -1
    served = 0

    def __iter__(self):
        for batch in super().__iter__():
            if self.served == self.at:
                os.kill(os.getpid(), signal.SIGINT)
            self.served += 1
            yield batch


def _run(loader, seed: int, **kw):
    torch.manual_seed(seed)
    model = bayesian(nn.Sequential(nn.Linear(3, 2)))
    guide = mean_field_guide(model)
    return fit(model, guide, loader, progress=False, seed=seed, lr_schedule="constant", **kw)


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        cases = {
            "one checkpoint, two paths": ("end.pt", "end copy.pt"),
            "mid-epoch against an epoch's end": ("mid.pt", "end.pt"),
            "another run at the same step": ("end.pt", "other run.pt"),
        }
        outcomes = {}
        for case, paths in cases.items():
            try:
                result = _run(
                    ArrayLoader(*_data(), 8, seed=0), 0, epochs=3,
                    resume_from=f"{out}/{paths[rank]}",
                )  # fmt: skip
                outcomes[case] = f"trained to {result.steps} steps"
            except ValueError as err:
                outcomes[case] = str(err)
        torch.save(outcomes, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume")
    x, y = _data()
    _run(ArrayLoader(x, y, 8, seed=0), 0, epochs=2, checkpoint=out / "end.pt")
    shutil.copy(out / "end.pt", out / "end copy.pt")
    _run(ArrayLoader(x, y, 8, seed=1), 1, epochs=2, checkpoint=out / "other run.pt")
    loader = _SigintAtBatch(x, y, 8, seed=0)
    loader.at = 4  # the second batch of epoch 2: the run stops after step 5
    with pytest.raises(TrainingInterrupted) as stopped:
        _run(loader, 0, epochs=3, checkpoint=out / "mid.pt")
    assert (stopped.value.epoch, stopped.value.step) == (2, 2)
    assert stopped.value.result.steps == 5
    spawn_ranks(_worker, (str(out / "init"), str(out)), world=WORLD)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


_HEAD = (
    "fit(): the arguments differ between ranks: resume_from. The ranks would resume from "
    "different points of a run, or from different runs "
)


def test_one_checkpoint_read_from_two_paths_resumes_on_both_ranks(ranks):
    # 6 steps resumed, then epoch 3 on shards of 12 examples: 2 steps of 8 and 4
    assert [r["one checkpoint, two paths"] for r in ranks] == ["trained to 8 steps"] * 2


def test_a_mid_epoch_checkpoint_is_told_at_its_step_of_the_epoch_it_stopped_in(ranks):
    # 5 steps of 3 an epoch: epoch 1 done, then 2 steps of epoch 2 (not "epoch 1, step 2")
    messages = [r["mid-epoch against an epoch's end"] for r in ranks]
    assert messages[0].startswith(_HEAD), messages[0]
    assert "(rank 0 has a checkpoint after 5 steps (step 2 of epoch 2))" in messages[0]
    assert "(rank 1 has a checkpoint after 6 steps (the end of epoch 2))" in messages[1]
    assert "Pass the same resume_from on every rank" in messages[1]


def test_checkpoints_of_two_runs_at_the_same_step_are_refused_naming_resume_from(ranks):
    # (it was told as models built otherwise: "the model and guide parameters differ")
    for r, rank in enumerate(ranks):
        message = rank["another run at the same step"]
        assert message.startswith(_HEAD), message
        assert f"(rank {r} has a checkpoint after 6 steps (the end of epoch 2))" in message


def test_the_bins_refusal_tells_what_more_bins_cost_truly():
    probs = torch.softmax(torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0)), -1)
    with pytest.raises(ValueError) as refused:
        plot_uncertainty_distributions(probs, bins=1001)
    message = str(refused.value)
    # 1001 bins do not take minutes (10**4 took 10 s, 10**5 over a minute)
    assert "take minutes" not in message
    assert "more bins are thinner than a pixel, and 10**5 of them take over a minute" in message
    assert message.endswith(
        "got 1001. Pass fewer bins, e.g. bins=30, or kind='ecdf', which has no bins."
    )
