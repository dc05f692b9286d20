"""Audit of fit()'s optimizer and helpers: pyrouq's Adam against torch.optim.Adam (parameters
without a gradient, parameters that appear late, refused state dicts, sparse gradients), the
learning-rate schedules against their formulas, and the gradient average of 2 gloo ranks
against one process when a parameter goes without a gradient."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _processes import exit_quietly, spawn_ranks
from torch import nn

import pyrouq
from pyrouq.infer._adam import Adam

# --------------------------------------------------------------------------------------------
# Adam
# --------------------------------------------------------------------------------------------


def _steps(make, start, grads):
    params = [nn.Parameter(t.clone()) for t in start]
    optimizer = make(params)
    for step in grads:
        optimizer.zero_grad(set_to_none=True)
        for p, g in zip(params, step, strict=True):
            if g is not None:
                p.grad = g.clone()
        optimizer.step()
    return params, optimizer


def test_adam_is_torch_fused_adam_to_the_bit_with_missing_and_late_gradients():
    # a parameter without a gradient in some steps keeps its value and state (torch skips it);
    # one that gets its first gradient at step 5 starts its own step count there
    torch.manual_seed(0)
    start = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 3, 4, 4)]
    grads = []
    for t in range(12):
        step = [torch.randn_like(p) for p in start]
        step[1] = None if t % 3 == 1 else step[1]
        step[2] = None if t < 4 else step[2]
        grads.append(step)
    kwargs = {"lr": 0.1, "betas": (0.5, 0.9), "eps": 1e-3}
    ours, adam = _steps(lambda ps: Adam(ps, **kwargs), start, grads)
    theirs, _ = _steps(lambda ps: torch.optim.Adam(ps, fused=True, **kwargs), start, grads)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    steps = [float(adam.state[p]["step"]) for p in ours]
    assert steps == [12.0, 8.0, 8.0]


def test_adam_refuses_a_state_of_other_shapes_and_keeps_its_own():
    # before 2026-12: loaded silently, and the fused kernel then read and wrote past the end
    # of the smaller tensors (a segmentation fault when the parameter was the larger one)
    _, saved = _steps(lambda ps: Adam(ps, lr=0.1), [torch.zeros(4)], [[torch.ones(4)]])
    params, adam = _steps(lambda ps: Adam(ps, lr=0.1), [torch.zeros(2)], [[torch.ones(2)]])
    before = copy.deepcopy(adam.state_dict())
    message = (
        r"The optimizer state's exp_avg at position 0 has shape \(4,\), but the parameter "
        r"there has shape \(2,\); resume with the model and guide"
    )
    with pytest.raises(ValueError, match=message):
        adam.load_state_dict(saved.state_dict())
    assert torch.equal(adam.state[params[0]]["exp_avg"], before["state"][0]["exp_avg"])


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [({"weight_decay": 0.1}, "{'weight_decay': 0.1}"), ({"amsgrad": True}, "{'amsgrad': True}")],
)
def test_adam_refuses_the_state_of_an_adam_it_does_not_implement(kwargs, shown):
    _, torch_adam = _steps(
        lambda ps: torch.optim.Adam(ps, lr=0.1, **kwargs), [torch.zeros(3)], [[torch.ones(3)]]
    )
    params, adam = _steps(lambda ps: Adam(ps, lr=0.2), [torch.zeros(3)], [[torch.ones(3)]])
    with pytest.raises(ValueError, match=f"saved by an Adam with {shown}, which this Adam"):
        adam.load_state_dict(torch_adam.state_dict())
    assert adam.param_groups[0]["lr"] == 0.2 and float(adam.state[params[0]]["step"]) == 1.0


def test_adam_refuses_a_sparse_gradient_with_what_to_do():
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(10, 4, sparse=True)
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            return self.out(self.embedding(x))

    x, y = torch.randint(0, 10, (8,)), torch.arange(8) % 2
    message = (
        r"pyrouq's Adam \(fit\(\)'s default optimizer\) got a sparse gradient for a parameter "
        r"of shape \(10, 4\) \(an nn.Embedding\(..., sparse=True\)\?\).*build the layer with "
        r"sparse=False"
    )
    with pytest.raises(RuntimeError, match=message):
        pyrouq.fit(Tokens(), None, pyrouq.ArrayLoader(x, y, 4, seed=0), epochs=1,
                   progress=False, seed=0)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Learning-rate schedules
# --------------------------------------------------------------------------------------------


def _learning_rates(n, batch_size, epochs, schedule):
    seen = []

    class Recording(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)

    torch.manual_seed(0)
    x, y = torch.randn(n, 3), torch.arange(n) % 2
    pyrouq.fit(nn.Linear(3, 2), None, pyrouq.ArrayLoader(x, y, batch_size, seed=0),
               epochs=epochs, lr_schedule=schedule, optim=lambda p: Recording(p, lr=2.0),
               progress=False, seed=0)  # fmt: skip
    return seen


@pytest.mark.parametrize(
    ("n", "batch_size", "epochs", "warmup"),
    [(10, 2, 2, 2), (10, 3, 3, 2), (1, 1, 1, 0), (4, 4, 3, 0)],
)
def test_schedules_follow_their_formulas_per_step(n, batch_size, epochs, warmup):
    total = epochs * math.ceil(n / batch_size)
    for schedule, ramp in (("warmup_cosine", warmup), ("cosine", 0)):
        expected = [
            2.0 * (s + 1) / ramp
            if s < ramp
            else 2.0 * 0.5 * (1 + math.cos(math.pi * (s - ramp) / (total - ramp)))
            for s in range(total)
        ]
        got = _learning_rates(n, batch_size, epochs, schedule)
        assert got == pytest.approx(expected, rel=1e-12, abs=0), schedule
    assert _learning_rates(n, batch_size, epochs, "constant") == [2.0] * total


# --------------------------------------------------------------------------------------------
# The probe
# --------------------------------------------------------------------------------------------


class _Wrapper:
    """A loader wrapping a DataLoader, its .dataset forwarded, that prepares the batches:
    flattens the images, or scales raw uint8 pixels to [0, 1]."""

    def __init__(self, images, labels, prepare):
        self.dataset = torch.utils.data.TensorDataset(images, labels)
        self.loader = torch.utils.data.DataLoader(self.dataset, batch_size=5)
        self.prepare = prepare

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for x, y in self.loader:
            yield self.prepare(x), y


@pytest.mark.parametrize(
    "images, prepare",
    [
        (torch.randn(20, 1, 4, 4), lambda x: x.flatten(1)),
        (torch.randint(0, 256, (20, 16), dtype=torch.uint8), lambda x: x.float() / 255),
    ],
)
def test_the_probe_runs_the_model_on_what_a_wrapping_loader_serves(images, prepare):
    # before 2026-12 fit() probed the network on two items of the wrapper's .dataset, not
    # on its batches: "Linear failed on the first examples of train_loader (x of shape
    # (2, 1, 4, 4))", or the uint8 pixels refused ("Scale and normalise images first")
    loader = _Wrapper(images, torch.arange(20) % 3, prepare)
    torch.manual_seed(0)
    result = pyrouq.fit(nn.Linear(16, 3), None, loader, epochs=1, progress=False, seed=0)
    assert result.steps == 4 and math.isfinite(result.losses[0])


class _Forwarding:
    """A loader wrapping another, its .dataset forwarded, that serves its batches as they are."""

    def __init__(self, inner):
        self.inner, self.dataset = inner, inner.dataset

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        yield from self.inner


def test_the_probe_of_a_wrapping_loader_leaves_the_wrapped_loaders_random_state_alone():
    # reading the wrapper's first batch drew the wrapped loader's first order: from a pyrouq
    # loader's generator (the first epoch then took the second order) or torch's global state
    from pyrouq.infer._probe import Probe

    x, y = torch.randn(20, 3), torch.arange(20) % 2
    model = pyrouq.bayesian(nn.Linear(3, 2))
    inner = pyrouq.ArrayLoader(x, y, batch_size=5, seed=0)
    before = inner.get_rng_state()
    assert Probe(model, pyrouq.mean_field_guide(model), _Forwarding(inner)).num_classes == 2
    assert torch.equal(inner.get_rng_state(), before)
    shuffled = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=5, shuffle=True
    )
    state = torch.get_rng_state()
    Probe(model, pyrouq.mean_field_guide(model), _Forwarding(shuffled))
    assert torch.equal(torch.get_rng_state(), state)


def test_the_probe_leaves_random_state_and_batchnorm_statistics_alone():
    from pyrouq.infer._probe import Probe

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model = pyrouq.bayesian(net)
    dataset = torch.utils.data.TensorDataset(torch.randn(20, 3), torch.arange(20) % 2)
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, shuffle=True)
    statistics = [b.clone() for b in model.buffers()]
    state = torch.get_rng_state()
    probe = Probe(model, pyrouq.mean_field_guide(model), loader)
    assert probe.num_classes == 2 and model.training
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(statistics, model.buffers(), strict=True))


# --------------------------------------------------------------------------------------------
# torch.distributed: a parameter without a gradient
# --------------------------------------------------------------------------------------------


class _Sometimes(nn.Module):
    """A classifier whose extra bias takes part in odd forward passes only: in even steps it
    has no gradient."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.extra = nn.Parameter(torch.zeros(2))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = self.linear(x)
        return out + self.extra if self.calls % 2 else out


def _lazy():
    """A network of lazy layers that states its number of classes (fit() need not run it to
    learn that)."""
    net = nn.Sequential(nn.LazyLinear(4), nn.Tanh(), nn.LazyLinear(2))
    net.num_classes = 2
    return net


def _sometimes_fit(batch_size, make=_Sometimes):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=g), torch.arange(8) % 2
    torch.manual_seed(0)
    model = make()
    pyrouq.fit(model, None, pyrouq.ArrayLoader(x, y, batch_size, shuffle=False), epochs=4,
               lr=0.05, lr_schedule="constant", progress=False, seed=0)  # fmt: skip
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _sometimes_worker(rank: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        torch.save(_sometimes_fit(4), Path(out) / f"sometimes{rank}.pt")
        torch.save(_sometimes_fit(4, _lazy), Path(out) / f"lazy{rank}.pt")
    finally:
        dist.destroy_process_group()
    exit_quietly()


def test_two_ranks_leave_a_parameter_without_gradient_as_one_process_does(tmp_path):
    # before 2026-12 a gradient missing on every rank became zeros: Adam then moved the
    # parameter on its momentum in the steps where one process leaves it alone (2.4e-3 apart
    # after 4 steps of this model; the other parameters followed, 9.5e-4 apart)
    spawn_ranks(_sometimes_worker, (str(tmp_path / "init"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"sometimes{r}.pt", weights_only=True) for r in range(2)]
    single = _sometimes_fit(8)  # one process, one batch of both ranks' shards
    for key, value in single.items():
        torch.testing.assert_close(ranks[0][key], value, rtol=0, atol=1e-6)
        assert torch.equal(ranks[0][key], ranks[1][key]), key

    # a lazy layer's weights are made by fit()'s probe, before the ranks compare them and
    # seed their own streams (before 2026-12: "Attempted to use an uninitialized parameter")
    ranks = [torch.load(tmp_path / f"lazy{r}.pt", weights_only=True) for r in range(2)]
    single = _sometimes_fit(8, _lazy)
    for key, value in single.items():
        torch.testing.assert_close(ranks[0][key], value, rtol=0, atol=1e-6)
        assert torch.equal(ranks[0][key], ranks[1][key]), key


def test_the_probe_makes_a_lazy_layers_parameters_before_the_optimizer():
    from pyrouq.infer._probe import Probe

    net = _lazy()
    loader = pyrouq.ArrayLoader(torch.randn(6, 3), torch.arange(6) % 2, 3, seed=0)
    probe = Probe(net, None, loader)
    assert probe.num_classes == 2 and net.training
    assert [tuple(p.shape) for p in net.parameters()] == [(4, 3), (4,), (2, 4), (2,)]
