"""Reproducibility audit 8: seeds and random state across the public entry points.

What earlier audits left out: every model kind repeating under ``fit(seed=...)`` (and
differing under another seed), in this process and in fresh ones (other hash seeds);
``predict()`` drawing from torch's stream as documented; a multi-process DataLoader with
augmentations under ``fit(seed=...)``; ``mcmc(seed=None)`` after ``torch.manual_seed``;
``to_inference_data`` and ``psis_diagnostic`` under one seed; the loaders' seed refusals.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from _toy import PyroClassifier, toy_data
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq
from pyrouq.data import TensorLoader

KINDS = ("bayesian", "last_layer", "batchensemble", "rank1", "bayesian_mlp", "pyro_autonormal")


def _network() -> nn.Module:
    """A small network with dropout, which draws from torch's stream while it trains."""
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 2))


def _build(kind: str):
    torch.manual_seed(0)  # the initial weights (and BatchEnsemble factors): one start for all
    pyro.clear_param_store()
    if kind == "bayesian":
        model = pyrouq.bayesian(_network())
    elif kind == "last_layer":
        model = pyrouq.bayesian(_network(), select="last_layer")
    elif kind == "batchensemble":
        return pyrouq.batchensemble(_network(), 3), None
    elif kind == "rank1":
        model = pyrouq.rank1(_network(), 3)
    elif kind == "bayesian_mlp":
        model = pyrouq.BayesianMLP(in_features=3, hidden_features=8, out_features=2)
    else:
        model = PyroClassifier(3, 2)
        return model, AutoNormal(model)  # starts at random when fit() first runs it
    return model, pyrouq.mean_field_guide(model)


def _loader(kind: str, x: torch.Tensor, y: torch.Tensor) -> pyrouq.ArrayLoader:
    """Batches of 10; of all 40 for the Pyro model, which observes them unscaled (N/B = 1)."""
    return pyrouq.ArrayLoader(x, y, batch_size=40 if kind == "pyro_autonormal" else 10, seed=0)


def _run_kind(kind: str, seed: int) -> tuple[list[float], torch.Tensor]:
    """``fit(seed=seed)`` from a fresh model, guide and loader, then ``predict()`` straight
    after, from the stream the training left (no reseeding in between)."""
    x, y = toy_data(40)
    model, guide = _build(kind)
    loader = _loader(kind, x, y)
    losses = pyrouq.fit(model, guide, loader, epochs=2, seed=seed, progress=False).losses
    draws = {} if kind == "batchensemble" else {"num_samples": 4}
    probs = pyrouq.predict(model, x, guide, progress=False, **draws).probs
    return losses, probs


def _digest(losses: list[float], probs: torch.Tensor) -> str:
    data = torch.tensor(losses, dtype=torch.float64).numpy().tobytes() + probs.numpy().tobytes()
    return hashlib.sha1(data).hexdigest()


@pytest.mark.parametrize("kind", KINDS)
def test_every_model_kind_repeats_under_one_seed_and_differs_under_another(kind):
    losses, probs = _run_kind(kind, 0)
    again, again_probs = _run_kind(kind, 0)
    assert again == losses and torch.equal(again_probs, probs)
    other, other_probs = _run_kind(kind, 1)
    assert other != losses
    assert not torch.equal(other_probs, probs)


_FRESH = """
import sys
sys.path[:0] = [{tests!r}, {tests!r} + "/.."]  # its folder, and tests/
import torch
torch.set_num_threads(1)
import warnings
warnings.simplefilter("ignore")
from test_seeds_across_entry_points import KINDS, _digest, _run_kind
print(" ".join(_digest(*_run_kind(kind, 0)) for kind in KINDS))
"""


def test_two_fresh_processes_train_and_predict_the_same_bits_as_this_one():
    """Each process hashes strings with a seed of its own (nothing pyrouq draws may follow a
    set's or dict's order of strings) and starts torch's stream afresh."""
    tests = str(Path(__file__).resolve().parent)
    script = _FRESH.format(tests=tests)
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split())
    here = [_digest(*_run_kind(kind, 0)) for kind in KINDS]
    assert outputs[0] == outputs[1] == here


def test_predict_draws_from_torchs_stream_which_it_advances():
    """As its docstring says: torch.manual_seed before predict() repeats the draws, two calls
    after one seed draw anew, and numpy's and Python's generators are left alone. A network
    without draws (a BatchEnsemble, a plain one) takes nothing from the stream."""
    x, _ = toy_data(20)
    model, guide = _build("bayesian")
    torch.manual_seed(3)
    np.random.seed(3)  # noqa: NPY002 - the legacy global state a user seeds
    random.seed(3)
    numpy_state, python_state = np.random.get_state()[1].copy(), random.getstate()  # noqa: NPY002
    first = pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs
    second = pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs
    assert not torch.equal(first, second)
    assert np.array_equal(np.random.get_state()[1], numpy_state)  # noqa: NPY002
    assert random.getstate() == python_state
    torch.manual_seed(3)
    assert torch.equal(pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs, first)
    for network in (_build("batchensemble")[0], _network()):
        state = torch.get_rng_state()
        pyrouq.predict(network, x, progress=False)
        assert torch.equal(torch.get_rng_state(), state)


def test_fit_seeds_torch_numpy_and_python_random_and_does_not_put_them_back():
    x, y = toy_data(40)
    np.random.seed(5)  # noqa: NPY002
    random.seed(5)
    seeded = np.random.get_state()[1].copy(), random.getstate()  # noqa: NPY002
    np.random.seed(123)  # noqa: NPY002
    random.seed(123)
    torch.manual_seed(123)
    model, guide = _build("bayesian")
    pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 10, seed=0), epochs=1, seed=5, progress=False)
    # training draws from torch's stream only: numpy's and Python's stay where the seed put them
    assert np.array_equal(np.random.get_state()[1], seeded[0])  # noqa: NPY002
    assert random.getstate() == seeded[1]
    after = torch.get_rng_state()
    model, guide = _build("bayesian")
    torch.manual_seed(999)  # another state before the call: the seed replaces it
    pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 10, seed=0), epochs=1, seed=5, progress=False)
    assert torch.equal(torch.get_rng_state(), after)


class _Augmented(torch.utils.data.Dataset):
    """Toy points with noise drawn from torch's, numpy's and Python's streams (in a loader's
    worker processes, each seeded by the DataLoader from torch's stream)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = 0.1 * torch.randn(3) + 0.1 * float(np.random.rand()) + 0.1 * random.random()  # noqa: NPY002
        return self.x[i] + noise, self.y[i]


def test_a_seeded_fit_on_a_two_worker_shuffling_dataloader_with_augmentations_repeats():
    x, y = toy_data(40)

    def run(seed: int) -> list[float]:
        model, guide = _build("bayesian_mlp")
        loader = torch.utils.data.DataLoader(
            _Augmented(x, y), batch_size=10, shuffle=True, num_workers=2
        )
        return pyrouq.fit(model, guide, loader, epochs=2, seed=seed, progress=False).losses

    first = run(0)
    assert run(0) == first
    assert run(1) != first


def test_mcmc_without_a_seed_repeats_after_torch_manual_seed_and_takes_one_draw():
    x, y = toy_data(20)
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(in_features=3, hidden_features=3, out_features=2)
    options = dict(num_samples=3, warmup_steps=3, num_chains=2, progress=False, parallel=False)
    torch.manual_seed(7)
    start = torch.get_rng_state()
    first = pyrouq.mcmc(model, x, y, max_tree_depth=3, **options)
    after = torch.get_rng_state()
    torch.set_rng_state(start)
    torch.randint(0, 2**31 - 1, ())  # the one draw the docstring names, for the seed
    assert torch.equal(after, torch.get_rng_state())
    torch.manual_seed(7)
    again = pyrouq.mcmc(model, x, y, max_tree_depth=3, **options)
    for site in first.samples:
        assert torch.equal(again.samples[site], first.samples[site])
    torch.manual_seed(8)
    other = pyrouq.mcmc(model, x, y, max_tree_depth=3, **options)
    assert not torch.equal(other.samples["fc1.weight"], first.samples["fc1.weight"])


@pytest.mark.parametrize("kind", ["bayesian_mlp", "pyro_autonormal"])
def test_to_inference_data_and_psis_repeat_under_one_torch_seed(kind):
    x, y = toy_data(40)
    model, guide = _build(kind)
    pyrouq.fit(model, guide, _loader(kind, x, y), epochs=1, seed=0, progress=False)

    def export(seed: int, **options) -> dict[str, np.ndarray]:
        torch.manual_seed(seed)
        idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=5, **options)
        groups = ("posterior", "posterior_predictive", "log_likelihood")
        return {f"{g}/{v}": idata[g][v].values for g in groups for v in idata[g].data_vars}

    first = export(0)
    assert "posterior_predictive/obs" in first
    same = export(0)
    assert same.keys() == first.keys()
    assert all(np.array_equal(same[k], first[k]) for k in first)  # obs draws included
    # other batches: the same draws; the outputs to float32's rounding (a matmul of 7 rows
    # rounds as one of 40 does on an AMD EPYC, an ulp apart on an Intel Xeon)
    chunked = export(0, batch_size=7)
    assert chunked.keys() == first.keys()
    for k in first:
        exact = k.startswith("posterior/") or k == "posterior_predictive/obs"
        if exact:
            assert np.array_equal(chunked[k], first[k]), k
        else:
            np.testing.assert_allclose(chunked[k], first[k], rtol=1e-6, atol=1e-7, err_msg=k)
    other = export(1)
    assert all(not np.array_equal(other[k], first[k]) for k in first)
    k_hats = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        k_hats.append(pyrouq.psis_diagnostic(model, guide, x, y, num_samples=30).k_hat)
    assert k_hats[0] == k_hats[1] != k_hats[2]


@pytest.mark.parametrize(
    ("load", "name"),
    [(pyrouq.load_mnist, "load_mnist"), (pyrouq.load_fashion_mnist, "load_fashion_mnist")],
)
@pytest.mark.parametrize("seed", [-1, True, 2**63, 1.0, "0"])
def test_the_mnist_loaders_refuse_a_bad_seed_by_their_own_name_before_reading_files(
    load, name, seed
):
    """They said "the loader: expected seed ...", after reading the files: Fashion-MNIST's
    training split is not bundled, so load_fashion_mnist(seed=-1) told of missing files."""
    with pytest.raises(
        ValueError,
        match=rf"^{name}\(\): expected seed to be an integer in \[0, 2\*\*32 - 1\], got "
        rf"{repr(seed).replace('*', '[*]')}\. Pass e\.g\. seed=0\.$",
    ):
        load(seed=seed, train_size=10)


def test_a_tensor_loader_names_itself_and_numpy_seeds_give_the_int_seeds_order():
    images, labels = torch.zeros(6, 2, 2), torch.arange(6)
    with pytest.raises(ValueError, match=r"^TensorLoader: expected seed to be an integer in "):
        TensorLoader(images, labels, 2, shuffle=True, flatten=False, normalize=False, seed=-1)
    orders = []
    for seed in (3, np.int64(3), np.uint32(3), 4):
        train, _ = pyrouq.load_mnist(batch_size=4, seed=seed, train_size=12)
        orders.append(torch.cat([x.flatten(1).sum(1) for x, _ in train]))
    assert torch.equal(orders[0], orders[1]) and torch.equal(orders[0], orders[2])
    assert not torch.equal(orders[0], orders[3])


@pytest.mark.parametrize("bad", [{"lr_schedule": "bad"}, {"kl_weight": -1.0}, {"checkpoint": 123}])
def test_a_refused_fit_leaves_the_callers_random_streams_alone(bad) -> None:
    """fit(seed=0) refused for another argument seeded nothing (it reseeded torch, numpy and
    random before checking the rest)."""
    x, y = toy_data(8)
    model = pyrouq.bayesian(_network(), num_data=8)
    guide = pyrouq.mean_field_guide(model)
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    random.seed(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())  # noqa: NPY002
    torch.manual_seed(7)
    np.random.seed(7)  # noqa: NPY002
    random.seed(7)
    with pytest.raises((ValueError, TypeError)):
        pyrouq.fit(model, guide, [(x, y)], epochs=1, seed=0, progress=False, **bad)
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])  # noqa: NPY002
    assert random.random() == expected[2]


def _threads(count: int, work):
    """``work()`` on ``count`` torch threads, the caller's number put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return work()
    finally:
        torch.set_num_threads(before)


def test_an_mlps_seeded_run_repeats_on_as_many_threads_only_as_the_docs_say():
    """The docs named a convolution's weight gradient alone as what torch splits among its
    threads ("so a convolutional network trained on another number ends in other last bits";
    mcmc: the draws the same in chain processes but for convolutions and large data). A
    BayesianMLP trained on 1 and on 2 threads ends in other parameters too (a linear layer's
    weight gradient, MKL in torch's x86 wheels), and torch adds more than 32,768 values in
    another order (measured; mcmc of ``bayesian(nn.Linear(16, 10))`` on 128 points, 2 chains of
    20 steps: parallel and in this process 6.2e-05 apart on 2 caller threads, equal on 1)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 200, generator=g), torch.randint(0, 10, (64,), generator=g)

    def run():
        torch.manual_seed(0)
        model = pyrouq.BayesianMLP(in_features=200, hidden_features=200, out_features=10)
        guide = pyrouq.mean_field_guide(model)
        loader = pyrouq.ArrayLoader(x, y, batch_size=32, seed=0)
        pyrouq.fit(model, guide, loader, epochs=1, seed=0, progress=False)
        return [p.detach().clone() for p in guide.parameters()]

    one, again, two = _threads(1, run), _threads(1, run), _threads(2, run)
    assert all(torch.equal(a, b) for a, b in zip(one, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    values = torch.randn(32_769, generator=g)
    sums = [_threads(n, lambda k=k: values[:k].sum()) for k in (32_768, 32_769) for n in (1, 2)]
    assert torch.equal(sums[0], sums[1]) and not torch.equal(sums[2], sums[3])

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert (
        "a linear layer's for some shapes and any sum of more than 32,768 values, so a network "
        "trained on another number, an MLP too, ends in other last bits" in readme
    )
    assert "a linear layer's for some shapes, even a logistic regression's on 128 points" in (
        readme
    )
    fit_doc = " ".join((pyrouq.fit.__doc__ or "").split())
    assert "a linear layer's for some shapes and any sum of more than 32,768 values" in fit_doc
    mcmc_doc = " ".join((pyrouq.mcmc.__doc__ or "").split())
    assert "a linear layer's for some shapes (a logistic regression's" in mcmc_doc
