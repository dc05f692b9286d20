"""fit() on 2 processes (gloo, CPU), twelfth audit. Against a reference written by hand in one
process (plain torch Adam on the ranks' mean loss, each rank's weight draw read off its
forward pass): the KL-weighted ELBO's steps with real weight draws, on N = 11 and 9 examples
that 2 ranks do not divide (pyrouq's padded shards, a DistributedSampler's with a last batch
of one). And what a script sees around fit() on several ranks: a callback reading the training
loader (which served it the rank's shard alone), a second model built after fit() without
reseeding (which differed between the ranks, whose streams fit() had parted, so its fit() was
refused), and the refusal of a loader over an IterableDataset (which told to use a sampler that
such a dataset cannot take)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn
from torch.nn import functional as F

from pyrouq import ArrayLoader, bayesian, fit, mean_field_guide, predict

WORLD, LR, KL_WEIGHT, PRIOR, INIT_SCALE = 2, 0.05, 0.7, 0.5, 0.3
data = torch.utils.data


def _xy(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=g), torch.randint(0, 3, (n,), generator=g)


def _model(init_scale: float = INIT_SCALE):
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(3, 3)), prior=PRIOR)
    return model, mean_field_guide(model, init_scale=init_scale)


def _loader(kind: str):
    """11 examples in pyrouq's padded shards of 6, or 9 in a DistributedSampler's shards of 5
    (batches of 2, 2, 1): batches of 2 either way."""
    if kind == "array":
        return ArrayLoader(*_xy(11), 2, seed=0)
    dataset = data.TensorDataset(*_xy(9))
    return data.DataLoader(dataset, 2, sampler=data.DistributedSampler(dataset, seed=0))


def _fit_with_draws(kind: str):
    """The guide after 2 epochs of Adam, and each step's (inputs, weight, bias) of the layer."""
    model, guide = _model()
    seen: list = []
    model.net[0].register_forward_hook(
        lambda m, i, o: seen.append((i[0].detach().clone(), m.weight.detach(), m.bias.detach()))
    )
    result = fit(model, guide, _loader(kind), epochs=2, optim=lambda p: torch.optim.Adam(p, LR),
                 lr_schedule="constant", kl_weight=KL_WEIGHT, progress=False, seed=3)  # fmt: skip
    state = {k: v.detach().clone() for k, v in guide.state_dict().items()}
    return state, seen[1:], result.num_data  # (the first pass is fit()'s look at the data)


def _state(guide) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in guide.state_dict().items()}


def _fit_with_callback(read: bool):
    """2 epochs on 12 examples (shards of 6, batches of 4); a callback reading the training
    loader: its length, its rows, predict() on it."""
    x, y = _xy(12)
    train = ArrayLoader(x, y, 4, seed=0)
    model, guide = _model(0.01)
    seen: dict = {}

    def callback(record):
        seen["len"] = len(train)
        seen["rows"] = torch.cat([xb for xb, _ in train])
        seen["predicted"] = predict(model, train, guide, num_samples=2).probs.shape[1]

    result = fit(model, guide, train, epochs=2, progress=False, seed=0,
                 callbacks=[callback] if read else ())  # fmt: skip
    return {"state": _state(guide), "steps": result.steps, "after": len(train), **seen}


def _streams() -> list:
    """The global random streams (torch's, numpy's, Python's) as comparable values."""
    return [torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()]  # noqa: NPY002


def _two_models_in_a_row(seed: int | None):
    """A script seeding once, then training two models built one after the other."""
    torch.manual_seed(0)
    x, y = _xy(12)
    model = bayesian(nn.Sequential(nn.Linear(3, 3)))
    fit(model, mean_field_guide(model), ArrayLoader(x, y, 4, seed=0), epochs=1,
        progress=False, seed=seed)  # fmt: skip
    streams = _streams()
    second = bayesian(nn.Sequential(nn.Linear(3, 3)))
    built = {k: v.detach().clone() for k, v in second.state_dict().items()}
    guide = mean_field_guide(second)
    try:
        fit(second, guide, ArrayLoader(x, y, 4), epochs=1, progress=False, seed=seed)
        outcome = _state(guide)
    except ValueError as err:
        outcome = str(err)
    return {"streams": streams, "built": built, "second fit": outcome}


class _Stream(data.IterableDataset):
    def __iter__(self):
        x, y = _xy(12)
        yield from zip(x, y, strict=True)


def _unseeded_as_documented():
    """fit(seed=None) after torch.manual_seed(5), and fit(seed=offset), ``offset`` the
    generator's first draw after that manual_seed: rank r seeds ``offset + r`` either way."""
    x, y = _xy(12)
    states = []
    for seed in (None, "offset"):
        model, guide = _model()
        torch.manual_seed(5)
        if seed == "offset":
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        fit(model, guide, ArrayLoader(x, y, 4, seed=0), epochs=1, progress=False, seed=seed)
        states.append(_state(guide))
    return states


def _stream_refusal() -> str:
    model, guide = _model()
    try:
        fit(model, guide, data.DataLoader(_Stream(), batch_size=4), epochs=1, num_data=12,
            lr_schedule="constant", progress=False)  # fmt: skip
    except ValueError as err:
        return str(err)
    return "no error"


def _worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    try:
        outcomes = {
            "array": _fit_with_draws("array"),
            "sampler": _fit_with_draws("sampler"),
            "callback": _fit_with_callback(read=True),
            "no callback": _fit_with_callback(read=False),
            "seeded": _two_models_in_a_row(0),
            "unseeded": _two_models_in_a_row(None),
            "stream": _stream_refusal(),
            "documented": _unseeded_as_documented(),
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


def _hand_adam(steps_per_rank: list[list], x: torch.Tensor, y: torch.Tensor, n: int):
    """torch Adam on the mean over the ranks of -(N / B) sum log p(y | x, w_r) + kl_weight *
    KL(N(loc, softplus(rho)) || N(0, PRIOR)), w_r = loc + softplus(rho) * eps_r, eps_r read
    off the weight each rank ran its step with."""
    _, guide = _model()
    start = guide.state_dict()
    names = [f"{kind}.0__{site}" for site in ("weight", "bias") for kind in ("loc", "rho")]
    params = {k: start[k].clone().requires_grad_() for k in names}
    optimizer = torch.optim.Adam(params.values(), lr=LR)
    for step in zip(*steps_per_rank, strict=True):
        loss = torch.zeros(())
        for inputs, weight, bias in step:
            which = [int(((x - row).abs().sum(1) == 0).nonzero()[0]) for row in inputs]
            drawn = {}
            kl = torch.zeros(())
            for site, value in (("weight", weight), ("bias", bias)):
                loc, scale = params[f"loc.0__{site}"], F.softplus(params[f"rho.0__{site}"])
                eps = ((value - loc) / scale).detach()
                drawn[site] = loc + scale * eps
                kl = (
                    kl
                    + (torch.log(PRIOR / scale) + (scale**2 + loc**2) / (2 * PRIOR**2) - 0.5).sum()
                )
            logits = inputs @ drawn["weight"].T + drawn["bias"]
            nll = n / len(which) * F.cross_entropy(logits, y[which], reduction="sum")
            loss = loss + (nll + KL_WEIGHT * kl) / WORLD
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: v.detach() for k, v in params.items()}


@pytest.mark.parametrize(
    ("kind", "n", "sizes"), [("array", 11, [2] * 6), ("sampler", 9, [2, 2, 1] * 2)]
)
def test_two_ranks_of_adam_with_real_draws_step_as_the_hand_written_mean_loss(
    ranks, kind, n, sizes
):
    x, y = _xy(n)
    states = [r[kind][0] for r in ranks]
    steps = [r[kind][1] for r in ranks]
    assert [r[kind][2] for r in ranks] == [n, n]  # N is the whole set's on every rank
    assert [[len(s[0]) for s in rank] for rank in steps] == [sizes, sizes]
    reference = _hand_adam(steps, x, y, n)
    _, guide = _model()
    for name, value in reference.items():
        assert float((states[0][name] - states[1][name]).abs().max()) == 0.0
        assert float((states[0][name] - value).abs().max()) < 1e-6
        assert float((value - guide.state_dict()[name]).abs().max()) > 0.05  # it did move
    first = [rank[0][1] for rank in steps]  # each rank its own draw
    assert float((first[0] - first[1]).abs().max()) > 1e-2


def test_a_callback_reads_the_whole_training_loader_not_the_ranks_shard(ranks):
    x, _ = _xy(12)
    for r in ranks:
        seen = r["callback"]
        assert seen["len"] == 3 and seen["after"] == 3  # 12 examples in batches of 4
        assert torch.equal(seen["rows"].sort(0).values, x.sort(0).values)
        assert seen["predicted"] == 12
        assert seen["steps"] == 4  # the training itself on shards of 6: 2 steps an epoch
        plain = r["no callback"]
        assert all(torch.equal(v, plain["state"][k]) for k, v in seen["state"].items())


@pytest.mark.parametrize("case", ["seeded", "unseeded"])
def test_a_model_built_after_fit_is_alike_on_the_ranks_and_trains(ranks, case):
    first, second = (r[case] for r in ranks)
    (torch_a, numpy_a, python_a), (torch_b, numpy_b, python_b) = first["streams"], second["streams"]
    assert torch.equal(torch_a, torch_b) and np.array_equal(numpy_a, numpy_b)
    assert python_a == python_b
    assert all(torch.equal(v, second["built"][k]) for k, v in first["built"].items())
    assert isinstance(first["second fit"], dict), first["second fit"]
    assert all(torch.equal(v, second["second fit"][k]) for k, v in first["second fit"].items())


def test_an_unseeded_run_on_ranks_seeds_them_as_documented(ranks):
    # rank r seeds offset + r, offset drawn from its generator (fit()'s seed docstring): the
    # seed that rejoins the ranks' streams after fit() is drawn after it, not before
    for r in ranks:
        unseeded, seeded = r["documented"]
        assert all(torch.equal(v, seeded[k]) for k, v in unseeded.items())
    assert not torch.equal(
        ranks[0]["documented"][0]["loc.0__weight"], _model()[1].state_dict()["loc.0__weight"]
    )


def test_a_loader_over_an_iterable_dataset_is_refused_with_what_to_do(ranks):
    for r in ranks:
        assert r["stream"] == (
            "fit() runs on 2 ranks (torch.distributed is initialised), but train_loader "
            "(DataLoader) is neither one of pyrouq's loaders (load_mnist, ArrayLoader, ...: "
            "they shard themselves by rank) nor a DataLoader with a DistributedSampler, so "
            "fit() cannot tell whether it gives every rank the same data or each rank its own; "
            "it takes no data sharded beforehand. Its dataset (_Stream) is an IterableDataset, "
            "which takes no sampler: put the examples in a map-style dataset "
            "(torch.utils.data.TensorDataset, or one with __getitem__ and __len__) and pass "
            "DataLoader(dataset, batch_size, sampler=DistributedSampler(dataset)) on every "
            "rank, or train on one process."
        )
