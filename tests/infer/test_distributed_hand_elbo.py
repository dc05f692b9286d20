"""fit() on 2 processes (gloo, CPU), tenth audit, against references written by hand in one
process with plain torch: the KL-weighted ELBO's step and epoch figures (the likelihood scaled
by N / B_local on each rank's DistributedSampler shard, last batches of one example included,
the KL counted once) and a BatchEnsemble's step (one process on the concatenated batches); the
weight draws as the docs give them (rank r seeded with seed + r, a run repeating to the bit,
identical draws alike); and an epoch with no batch on the ranks, whose message named a
DataLoader's batch_size above N where the DistributedSampler's shard was the cause (and a
batch_sampler='s batch size, which it left out)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn
from torch.nn import functional as F

from pyrouq import ArrayLoader, batchensemble, bayesian, fit, mean_field_guide

WORLD, N, LR, KL_WEIGHT, PRIOR = 2, 10, 0.05, 0.3, 0.5
data = torch.utils.data


def _targets() -> torch.Tensor:
    return torch.randint(0, 3, (N,), generator=torch.Generator().manual_seed(0))


def _inputs() -> torch.Tensor:
    return torch.randn(N, 3, generator=torch.Generator().manual_seed(1))


def _samplers(dataset) -> list:
    """Each rank's DistributedSampler, as fit() gets it on that rank (for the hand-written
    reference, all in one process)."""
    return [data.DistributedSampler(dataset, WORLD, r, shuffle=True, seed=0) for r in range(WORLD)]


def _shard_loader(
    x: torch.Tensor, batch_size: int = 2, drop_last: bool = False, drop_last_share: bool = False
):
    dataset = data.TensorDataset(x, _targets()[: len(x)])
    sampler = data.DistributedSampler(dataset, shuffle=True, seed=0, drop_last=drop_last_share)
    return data.DataLoader(dataset, batch_size, sampler=sampler, drop_last=drop_last)


def _batch_sampler_loader(x: torch.Tensor):
    """A DataLoader whose batch_sampler= makes batches of 8 (drop_last=True) of each rank's
    DistributedSampler shard: the loader's own batch_size is None."""
    dataset = data.TensorDataset(x, _targets()[: len(x)])
    sampler = data.DistributedSampler(dataset, shuffle=True, seed=0)
    return data.DataLoader(dataset, batch_sampler=data.BatchSampler(sampler, 8, drop_last=True))


def _kl_model():
    """A linear layer on zero inputs with a latent weight and a point-estimate bias: the
    likelihood does not see the weight draw, so the step is exact, draws or none."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 3)), prior=PRIOR, select=["0.weight"])
    return model, mean_field_guide(model)


def _ensemble():
    torch.manual_seed(0)
    return batchensemble(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)), 2)


def _sgd(params):
    return torch.optim.SGD(params, lr=LR)


def _fit_kl(epochs: int):
    model, guide = _kl_model()
    result = fit(model, guide, _shard_loader(torch.zeros(N, 3)), epochs=epochs, optim=_sgd,
                 lr_schedule="constant", kl_weight=KL_WEIGHT, progress=False, seed=0)  # fmt: skip
    state = {"bias": model.net[0].bias.detach().clone()}
    state.update({k: v.detach().clone() for k, v in guide.state_dict().items()})
    return state, [(r.loss, r.nll, r.kl) for r in result.history]


def _fit_ensemble(epochs: int):
    model = _ensemble()
    result = fit(model, None, _shard_loader(_inputs()), epochs=epochs, optim=_sgd,
                 lr_schedule="constant", progress=False, seed=0)  # fmt: skip
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, [
        r.loss for r in result.history
    ]


def _draws(seed: int = 0, draws: str = "independent"):
    """The weights the linear layer ran with in each forward pass of fit() (the first is
    its set-up's probe), with a pyrouq loader of 8 examples in batches of 2."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 3)))
    guide = mean_field_guide(model)
    seen: list[torch.Tensor] = []
    model.net[0].register_forward_hook(lambda m, i, o: seen.append(m.weight.detach().clone()))
    x, y = _inputs()[:8], _targets()[:8]
    fit(model, guide, ArrayLoader(x, y, 2, seed=0), epochs=1, progress=False, seed=seed,
        distributed_draws=draws)  # fmt: skip
    return seen


def _refusal(loader) -> str:
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 3)))
    try:
        fit(model, mean_field_guide(model), loader, epochs=1, progress=False)
    except ValueError as err:
        return str(err)
    return "no error"


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        outcomes = {
            "kl": _fit_kl(2),
            "ensemble": _fit_ensemble(2),
            "draws": _draws(),
            "again": _draws(),
            "identical": _draws(draws="identical"),
            "no share": _refusal(_shard_loader(torch.zeros(1, 3), drop_last_share=True)),
            "share below a batch": _refusal(
                _shard_loader(torch.zeros(N, 3), batch_size=8, drop_last=True)
            ),
            "share below a sampled batch": _refusal(_batch_sampler_loader(torch.zeros(N, 3))),
        }
        torch.save(outcomes, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    spawn_ranks(_worker, (str(out / "init"), str(out)))
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def _batches(epoch: int) -> list[list[list[int]]]:
    """Per step, each rank's indices: shards of 5 of the 10 examples, in batches of 2, 2, 1."""
    shards = []
    for sampler in _samplers(data.TensorDataset(torch.zeros(N))):
        sampler.set_epoch(epoch)  # fit() numbers its epochs from 1
        order = list(sampler)
        shards.append([order[k : k + 2] for k in range(0, len(order), 2)])
    return [list(step) for step in zip(*shards, strict=True)]


def _hand_kl(epochs: int):
    """Each rank's loss -(N / B_r) sum log p + kl_weight * KL(q || p), averaged over the
    ranks (the gradients' all_reduce), SGD; KL(N(m, softplus(rho)) || N(0, PRIOR)) written
    out; the epoch's figures the means over its steps of the ranks' means."""
    model, guide = _kl_model()
    start = guide.state_dict()
    bias = model.net[0].bias.detach().double().requires_grad_()
    loc = start["loc.0__weight"].double().requires_grad_()
    rho = start["rho.0__weight"].double().requires_grad_()
    y, history = _targets(), []
    for epoch in range(1, epochs + 1):
        rows = []
        for step in _batches(epoch):
            s = F.softplus(rho)
            kl = (torch.log(PRIOR / s) + (s**2 + loc**2) / (2 * PRIOR**2) - 0.5).sum()
            nll = sum(
                N / len(b) * F.cross_entropy(bias.expand(len(b), 3), y[b], reduction="sum")
                for b in step
            ) / len(step)
            loss = nll + KL_WEIGHT * kl
            rows.append(torch.stack([loss, nll, kl]).detach())
            grads = torch.autograd.grad(loss, [bias, loc, rho])
            with torch.no_grad():
                for p, g in zip((bias, loc, rho), grads, strict=True):
                    p -= LR * g
        history.append(tuple(torch.stack(rows).mean(0).tolist()))
    state = {"bias": bias, "loc.0__weight": loc, "rho.0__weight": rho}
    return {k: v.detach() for k, v in state.items()}, history


def _hand_ensemble(epochs: int):
    """One process on the ranks' batches concatenated, -(N / 2B) sum over members and
    examples of log p (the ranks' mean of -(N / B) sum over their own), SGD."""
    model = _ensemble()
    optimizer = _sgd(model.parameters())
    x, y, history = _inputs(), _targets(), []
    for epoch in range(1, epochs + 1):
        losses = []
        for step in _batches(epoch):
            both = [i for batch in step for i in batch]
            logits = model(x[both])  # (members, 2B, classes)
            targets = y[both].repeat(logits.shape[0])
            loss = N / len(both) * F.cross_entropy(logits.reshape(-1, 3), targets, reduction="sum")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        history.append(sum(losses) / len(losses))
    return {k: v.detach() for k, v in model.state_dict().items()}, history


def _gap(ours: dict, theirs: dict) -> float:
    return max(float((ours[k].double() - v.double()).abs().max()) for k, v in theirs.items())


def test_two_ranks_step_on_the_hand_written_elbo_with_the_kl_once(ranks):
    reference, history = _hand_kl(2)
    for r in ranks:
        state, figures = r["kl"]
        assert _gap(state, reference) < 1e-6
        for got, want in zip(figures, history, strict=True):  # (loss, nll, kl) of each epoch
            assert got == pytest.approx(want, rel=1e-6)
    # the weight's gradient is kl_weight * grad KL alone (zero inputs): a KL counted once per
    # rank and summed, not averaged, would have moved it twice as far from its start
    assert history[0][2] == pytest.approx(31.976158, rel=1e-6)


def test_a_batchensemble_on_two_ranks_is_one_process_on_the_global_batches(ranks):
    reference, history = _hand_ensemble(2)
    for r in ranks:
        state, losses = r["ensemble"]
        assert _gap(state, reference) < 1e-6
        assert losses == pytest.approx(history, rel=1e-6)


def test_rank_r_draws_as_one_process_seeded_seed_plus_r_and_a_run_repeats(ranks):
    for rank, r in enumerate(ranks):
        alone = _draws(seed=rank)  # one process: its probe, then 4 steps
        assert len(r["draws"]) == 3  # the probe, then 2 steps on 4 of the 8 examples
        assert torch.equal(r["draws"][1], alone[1])  # the first step's draw
        assert all(torch.equal(a, b) for a, b in zip(r["draws"], r["again"], strict=True))
    first = [r["draws"][1] for r in ranks]
    assert float((first[0] - first[1]).abs().max()) > 1e-3  # the ranks' own particles
    same = [r["identical"] for r in ranks]
    assert all(torch.equal(a, b) for a, b in zip(*same, strict=True))


def test_an_epoch_without_batches_on_the_ranks_names_the_distributed_samplers_share(ranks):
    for r in ranks:
        assert r["no share"] == (
            "train_loader yielded no batches (its DistributedSampler gives each of the 2 ranks "
            "0 of the 1 examples: drop_last=True, with fewer examples than ranks) in epoch 1. "
            "Build the sampler with drop_last=False (it pads the shards to one size), or run "
            "on fewer ranks than examples."
        )
        assert r["share below a batch"] == (
            "train_loader yielded no batches (its DistributedSampler gives each of the 2 ranks "
            "5 of the 10 examples, fewer than a batch of 8 with drop_last=True) in epoch 1. "
            "Pass a batch_size of at most 5 (the batch size is per rank), or drop_last=False."
        )
        # a batch_sampler='s batch size is named too (the loader's own batch_size is None),
        # and the fix is the batch sampler's: DataLoader refuses a batch_size beside it
        assert r["share below a sampled batch"] == (
            "train_loader yielded no batches (its DistributedSampler gives each of the 2 ranks "
            "5 of the 10 examples, fewer than a batch of 8 with drop_last=True) in epoch 1. "
            "Build the batch sampler with a batch size of at most 5 (the batch size is per "
            "rank; DataLoader takes no batch_size beside a batch_sampler), or with "
            "drop_last=False."
        )
