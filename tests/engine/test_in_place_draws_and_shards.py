"""The refusals that name a rank's shard, and the engine's draws taken by unbind: a first
batch of one input under ranks whose shard holds one example (no batch size helps), a batch
sampler's batch size, a loader that tells none, the one-process words kept; a network that
changes a drawn weight in place without gradients (with them: test_run_draws_in_place.py),
and predict() and to_inference_data() of it on draws of the caller's own, which they leave
as they were (predict() runs every input batch, and estimates BatchNorm statistics,
on them as given)."""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset

from pyrouq import ArrayLoader, MCMCResult, bayesian, fit, mean_field_guide, predict

WORLD = 2
BN = "(torch: 'Expected more than 1 value per channel')"


class _Batches:
    """A batch sampler of its own over a DistributedSampler: batches of 8, no batch_size."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        order = list(self.sampler)
        return iter([order[i : i + 8] for i in range(0, len(order), 8)])

    def __len__(self):
        return -(-len(self.sampler) // 8)


def _loader(kind: str, x, y):
    data = TensorDataset(x, y)
    if kind == "array":
        return ArrayLoader(x, y, 8, seed=0)
    if kind == "sampler":
        return DataLoader(data, 8, sampler=DistributedSampler(data, seed=0))
    if kind == "batch_sampler":
        return DataLoader(
            data, batch_sampler=BatchSampler(DistributedSampler(data, seed=0), 8, False)
        )
    return DataLoader(data, batch_sampler=_Batches(DistributedSampler(data, seed=0)))


def _bn_refusal(kind: str, n: int) -> str:
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)
    try:
        fit(model, mean_field_guide(model), _loader(kind, x, y), epochs=1, progress=False, seed=0)
    except ValueError as err:
        return str(err)
    return "no error"


CASES = [("array", 2), ("sampler", 2), ("batch_sampler", 34), ("own_batches", 34)]


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        told = {case: _bn_refusal(*case) for case in CASES}
        torch.save(told, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_a_batch_of_one_under_ranks_tells_the_shard_its_batch_size_and_no_wrong_fix(tmp_path):
    spawn_ranks(_worker, (str(tmp_path / "init"), str(tmp_path)))
    shard = (
        "fit() runs on 2 ranks (torch.distributed is initialised): each rank trains on its own "
        "shard of the 34 examples (17 on this rank), "
    )
    rest = (
        ", so the remainder that counts is the shard's, not the whole data set's. That is "
        "usually the last batch of this rank's shard in an epoch: drop it (DataLoader(..., "
        "drop_last=True)) or pick a batch size that leaves no remainder of 1 from this rank's "
        "17 examples."
    )
    for rank in range(WORLD):
        told = torch.load(tmp_path / f"rank{rank}.pt")
        for kind in ("array", "sampler"):  # one example per rank: "a larger batch_size" was told
            assert told[(kind, 2)] == (
                f"Batch 1 of epoch 1 holds 1 input of shape (3,), and a BatchNorm in training "
                f"mode needs 2 or more inputs per batch to normalise them {BN}. Give batches of "
                "2 or more inputs (more examples, or fewer ranks: fit() runs on 2 ranks "
                "(torch.distributed is initialised), each on its own shard of the 2 examples (1 "
                "on this rank), which no larger batch_size can make 2), or freeze the BatchNorm "
                "with .eval() (it then normalises with its running statistics; one built with "
                "track_running_stats=False takes its batch's statistics in eval mode too)."
            ), (rank, kind)
        head = (
            "Batch 3 of epoch 1 holds 1 input(s) of shape (3,), and a BatchNorm in training mode "
            f"needs more than one value per channel to normalise it {BN}. "
        )
        # a batch sampler's size was not read: "(17 on this rank), (the batch size is per rank)"
        assert told[("batch_sampler", 34)] == (
            f"{head}{shard}in batches of 8 (the batch size is per rank){rest}"
        ), rank
        assert told[("own_batches", 34)] == (
            f"{head}{shard}in the loader's batches (their size is per rank){rest}"
        ), rank


def test_one_process_keeps_its_words_for_a_batch_of_one():
    # N = 1: the first batch; N = 17 in batches of 8: the third batch holds one input
    assert _bn_refusal("array", 1).endswith(
        f"{BN}. Give batches of 2 or more inputs (more examples, or a larger batch_size), or "
        "freeze the BatchNorm with .eval() (it then normalises with its running statistics; one "
        "built with track_running_stats=False takes its batch's statistics in eval mode too)."
    )
    assert _bn_refusal("array", 17) == (  # (ArrayLoader has no drop_last to give)
        "Batch 3 of epoch 1 holds 1 input(s) of shape (3,), and a BatchNorm in training mode "
        f"needs more than one value per channel to normalise it {BN}. That is the last batch of "
        "the epoch: 17 examples in batches of 8 leave 1, and ArrayLoader has no drop_last: pass "
        "batch_size=7 or batch_size=9 (no batch of one), or leave one example out."
    )


class _Clipped(nn.Linear):
    """A layer that bounds its weight in place as it runs (a max-norm constraint)."""

    def forward(self, x):
        with torch.no_grad():
            self.weight.clamp_(-0.1, 0.1)
        return super().forward(x)


def test_draws_without_gradients_still_run_a_network_that_changes_them():
    # predict()'s draws (no gradient): unbind's views may be changed in place, as before
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(_Clipped(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    draws = {k: v + torch.randn(3, *v.shape) for k, v in model.template().items()}
    with torch.no_grad():
        out = model.outputs(torch.randn(5, 3), draws)
    assert out.shape == (3, 5, 2)
    assert float(draws["0.weight"].abs().max()) == pytest.approx(0.1)


@pytest.mark.parametrize("given", ["tensors", "numpy"])
def test_predict_leaves_the_callers_posterior_samples_as_they_were(given):
    """predict(model, x, posterior_samples=...) ran the network on the caller's tensors (numpy's
    arrays share theirs): its clamp_ bounded the caller's draws. Now it runs on copies; its
    predictions are those of the bounded draws, computed by hand."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(_Clipped(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    draws = {k: v + torch.randn(3, *v.shape) for k, v in model.template().items()}
    kept = {k: v.clone() for k, v in draws.items()}
    x = torch.randn(5, 3)
    given_draws = draws if given == "tensors" else {k: v.numpy() for k, v in draws.items()}
    probs = predict(model, x, posterior_samples=given_draws, progress=False).probs
    for name, value in draws.items():
        assert torch.equal(value, kept[name]), name
    hidden = torch.relu(x @ kept["0.weight"].clamp(-0.1, 0.1).mT + kept["0.bias"][:, None])
    expected = torch.softmax(hidden @ kept["2.weight"].mT + kept["2.bias"][:, None], -1)
    assert float(kept["0.weight"].abs().max()) > 0.5  # (the bound changes them)
    torch.testing.assert_close(probs, expected)


class _Shrinking(nn.Linear):
    """A layer that halves its weight in place after each run: not idempotent."""

    def forward(self, x):
        out = super().forward(x)
        with torch.no_grad():
            self.weight.mul_(0.5)
        return out


@pytest.mark.parametrize("parallel", [True, False])
def test_predict_runs_every_input_batch_on_the_posterior_samples_as_given(parallel):
    """predict() copied the caller's draws once per call and ran every input batch on that
    copy: a network halving its weight as it ran gave batch b the draws halved b times. Each
    batch runs on copies of the draws as given, its predictions computed by hand."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(_Shrinking(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    draws = {k: v + torch.randn(3, *v.shape) for k, v in model.template().items()}
    kept = {k: v.clone() for k, v in draws.items()}
    x = torch.randn(6, 3)
    probs = predict(
        model, x, posterior_samples=draws, batch_size=2, parallel=parallel, progress=False
    ).probs
    for name, value in draws.items():
        assert torch.equal(value, kept[name]), name
    hidden = torch.relu(x @ kept["0.weight"].mT + kept["0.bias"][:, None])
    expected = torch.softmax(hidden @ kept["2.weight"].mT + kept["2.bias"][:, None], -1)
    torch.testing.assert_close(probs, expected)


def test_batchnorm_statistics_are_estimated_on_the_posterior_samples_as_given():
    """predict(batchnorm_data=...) estimated each draw's statistics on one copy of it across
    the statistics' batches, which a network halving its weight as it ran halved each time,
    then predicted on the draws as given: the statistics were of other weights. Halving
    after its output, the network predicts as a plain Linear does on the same draws."""
    torch.manual_seed(0)
    data, x = torch.randn(16, 3), torch.randn(5, 3)
    probs = {}
    for layer in (nn.Linear, _Shrinking):
        torch.manual_seed(1)
        model = bayesian(nn.Sequential(layer(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)))
        torch.manual_seed(2)
        draws = {k: v + torch.randn(3, *v.shape) for k, v in model.template().items()}
        probs[layer] = predict(model, x, posterior_samples=draws, batchnorm_data=data,
                               batch_size=4, progress=False).probs  # fmt: skip
    torch.testing.assert_close(probs[_Shrinking], probs[nn.Linear])
    assert float((probs[nn.Linear] - 0.5).abs().min()) < 0.45  # (not all saturated)


def test_to_inference_data_leaves_an_mcmc_results_draws_as_they_were():
    """to_inference_data(result) ran the network on views of result.samples: its clamp_
    bounded the result's draws, and a second export's posterior group was the bounded ones."""
    pytest.importorskip("arviz")
    from pyrouq import to_inference_data

    torch.manual_seed(0)
    model = bayesian(nn.Sequential(_Clipped(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    samples = {k: v + torch.randn(1, 3, *v.shape) for k, v in model.template().items()}
    kept = {k: v.clone() for k, v in samples.items()}
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    stats = {"diverging": torch.zeros(1, 3, dtype=torch.bool)}
    result = MCMCResult(samples, stats, "nuts", 3, model=model, x=x, y=y)
    first, second = to_inference_data(result), to_inference_data(result)
    for name, value in kept.items():
        assert torch.equal(result.samples[name], value), name
    exported = torch.as_tensor(second.posterior["0.weight"].values)
    assert float(kept["0.weight"].abs().max()) > 0.5  # (the bound changes them)
    torch.testing.assert_close(exported, kept["0.weight"])
    assert (first.log_likelihood["obs"].values == second.log_likelihood["obs"].values).all()
