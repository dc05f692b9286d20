"""``seed=`` of predict(), to_inference_data() and psis_diagnostic(): with a seed the call's
draws come from torch's streams seeded with it inside a fork of the random state (two calls
with one seed agree to the bit whatever ran between them, and the global state after the call
is the state before it); seed=None is the call without the argument."""

from __future__ import annotations

import contextlib

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import sampled_linear, tiny_mlp, toy_data
from pyro.nn import PyroModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pyrouq import (
    MCMCResult,
    batchensemble,
    bayesian,
    mean_field_guide,
    predict,
    psis_diagnostic,
    rank1,
    to_inference_data,
)


def _bayesian():
    model = tiny_mlp()
    return model, mean_field_guide(model, init_scale=0.3)


def _same(a, b):
    return torch.equal(a.probs, b.probs)


def _kept(call):
    """``call()``'s value, asserting that torch's CPU generator is left as it was."""
    before = torch.get_rng_state()
    out = call()
    assert torch.equal(torch.get_rng_state(), before)
    return out


# --- predict() ---------------------------------------------------------------------------


def test_predict_seed_repeats_keeps_the_global_state_and_is_set_rng_seeds_draws():
    model, guide = _bayesian()
    x, _ = toy_data(10)
    first = _kept(lambda: predict(model, x, guide, num_samples=6, seed=3, progress=False))
    torch.randn(1000)  # whatever runs between two calls
    second = _kept(lambda: predict(model, x, guide, num_samples=6, seed=3, progress=False))
    assert _same(first, second)
    other = predict(model, x, guide, num_samples=6, seed=4, progress=False)
    assert not _same(first, other)
    assert not torch.equal(first.probs[0], first.probs[1])  # draws, not one network
    pyro.set_rng_seed(3)  # the convention of fit(seed=): the draws it gives
    assert _same(first, predict(model, x, guide, num_samples=6, progress=False))


def test_predict_seed_none_is_the_call_without_it():
    model, guide = _bayesian()
    x, _ = toy_data(10)
    torch.manual_seed(7)
    plain = predict(model, x, guide, num_samples=5, progress=False)
    after_plain = torch.get_rng_state()
    torch.manual_seed(7)
    none = predict(model, x, guide, num_samples=5, progress=False, seed=None)
    assert _same(plain, none)
    assert torch.equal(torch.get_rng_state(), after_plain)  # the same draws taken from it
    torch.manual_seed(7)
    assert not torch.equal(torch.get_rng_state(), after_plain)  # (the call advanced it)


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, True, "0", torch.tensor(1)])
def test_a_bad_seed_is_refused_in_the_house_words_by_all_three(bad):
    model, guide = _bayesian()
    x, y = toy_data(8)
    calls = {
        "predict()": lambda: predict(model, x, guide, num_samples=2, seed=bad, progress=False),
        "to_inference_data()": lambda: to_inference_data(model, guide, x, y, 2, seed=bad),
        "psis_diagnostic()": lambda: psis_diagnostic(model, guide, x, y, seed=bad),
    }
    for where, call in calls.items():
        before = torch.get_rng_state()
        with pytest.raises(
            ValueError,
            match=rf"{where[:-2]}\(\): expected seed to be an integer "
            r"in \[0, 2\*\*32 - 1\], got .*Pass e\.g\. seed=0\.",
        ):
            call()
        assert torch.equal(torch.get_rng_state(), before)


def test_predict_seed_covers_a_dataloaders_own_draws_and_max_draw_bytes_chunks():
    model, guide = _bayesian()
    x, y = toy_data(12)
    data = TensorDataset(x, y)

    def run(loader, **kw):
        torch.rand(17)  # whatever runs between two calls
        return _kept(
            lambda: predict(model, loader, guide, num_samples=6, seed=11, progress=False, **kw)
        )

    # a shuffling DataLoader without generator=: its order and its seed drawn from the seed
    one, two = run(DataLoader(data, 5, shuffle=True)), run(DataLoader(data, 5, shuffle=True))
    assert _same(one, two) and torch.equal(one.targets, two.targets)
    assert not torch.equal(one.targets, y)  # (shuffled: the order was drawn)
    # several passes over x (a chunk of draws each) give the draws of one pass, to the bit
    whole = run(x)
    chunked = run(x, max_draw_bytes=1)  # one draw per pass
    assert _same(whole, chunked)
    ordered = DataLoader(data, 5)  # each pass takes a seed of its own from the stream
    assert _same(run(ordered), run(ordered, max_draw_bytes=1))


def test_predict_seed_with_batchnorm_data_from_a_shuffling_loader():
    net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model = bayesian(net)
    guide = mean_field_guide(model, init_scale=0.3)
    x, y = toy_data(16)

    def run():
        norms = DataLoader(TensorDataset(x, y), 4, shuffle=True)  # batches drawn per call
        return _kept(
            lambda: predict(
                model,
                x[:6],
                guide,
                num_samples=3,
                seed=5,
                batchnorm_data=norms,
                batchnorm_batches=2,
                progress=False,
            )
        )

    first = run()
    torch.rand(50)
    assert _same(first, run())


def test_predict_seed_with_rank1_draws_of_members():
    model = rank1(nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2)), 2)
    guide = mean_field_guide(model, init_scale=0.3)
    x, _ = toy_data(7)
    first = _kept(lambda: predict(model, x, guide, num_samples=3, seed=2, progress=False))
    torch.rand(50)
    second = _kept(lambda: predict(model, x, guide, num_samples=3, seed=2, progress=False))
    assert first.num_samples == 6 and _same(first, second)  # K = 3 draws x M = 2 members
    assert not _same(first, predict(model, x, guide, num_samples=3, seed=9, progress=False))


def test_predict_seed_changes_nothing_for_an_ensemble_a_plain_network_and_mcmc_draws():
    x, _ = toy_data(6)
    plain = nn.Linear(3, 2)
    ensemble = batchensemble(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), 3)
    model, guide = _bayesian()
    draws = _guide_draws(model, guide, x, 4)  # (S, *shape): MCMC draws, say
    for net, kw in ((plain, {}), (ensemble, {}), (model, {"posterior_samples": draws})):
        unseeded = predict(net, x, progress=False, **kw)
        seeded = _kept(lambda net=net, kw=kw: predict(net, x, progress=False, seed=1, **kw))
        assert _same(seeded, unseeded)


class _AlwaysDropout(nn.Module):
    """A plain network whose dropout runs in eval mode too (MC dropout by hand)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(nn.functional.dropout(x, 0.5, training=True))


def test_predict_seed_fixes_a_dropout_that_runs():
    net, (x, _) = _AlwaysDropout(), toy_data(20)
    first = _kept(lambda: predict(net, x, seed=8, progress=False))
    torch.rand(50)
    assert _same(first, _kept(lambda: predict(net, x, seed=8, progress=False)))
    assert not _same(first, predict(net, x, seed=9, progress=False))


class _PriorNet(PyroModule):
    def __init__(self):
        super().__init__()
        self.fc = sampled_linear(3, 2)

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_predict_seed_fixes_a_pyro_models_prior_draws():
    model, (x, _) = _PriorNet(), toy_data(9)
    first = _kept(lambda: predict(model, x, num_samples=4, seed=6, batch_size=4, progress=False))
    torch.rand(50)
    second = _kept(lambda: predict(model, x, num_samples=4, seed=6, batch_size=4, progress=False))
    assert _same(first, second) and not torch.equal(first.probs[0], first.probs[1])
    pyro.set_rng_seed(6)
    assert _same(first, predict(model, x, num_samples=4, batch_size=4, progress=False))


# --- to_inference_data() and psis_diagnostic() -------------------------------------------


def _guide_draws(model, guide, x, count):
    sites = model.latent_sites()
    traces = [pyro.poutine.trace(guide).get_trace(x) for _ in range(count)]
    return {s: torch.stack([t.nodes[s]["value"].detach() for t in traces]) for s in sites}


def _values(idata):
    return {
        (group, name): idata[group][name].values
        for group in idata.groups()
        for name in idata[group].data_vars
    }


def _same_values(a, b):
    va, vb = _values(a), _values(b)
    return va.keys() == vb.keys() and all(
        va[k].shape == vb[k].shape and (va[k] == vb[k]).all() for k in va
    )


def test_to_inference_data_seed_repeats_the_guides_and_the_obs_draws():
    model, guide = _bayesian()
    x, y = toy_data(10)
    first = _kept(lambda: to_inference_data(model, guide, x, y, 4, seed=1))
    torch.rand(50)
    assert _same_values(first, _kept(lambda: to_inference_data(model, guide, x, y, 4, seed=1)))
    assert not _same_values(first, to_inference_data(model, guide, x, y, 4, seed=2))
    pyro.set_rng_seed(1)
    assert _same_values(first, to_inference_data(model, guide, x, y, 4))
    torch.manual_seed(3)
    plain, after = to_inference_data(model, guide, x, y, 4), torch.get_rng_state()
    torch.manual_seed(3)
    assert _same_values(plain, to_inference_data(model, guide, x, y, 4, seed=None))
    assert torch.equal(torch.get_rng_state(), after)


def test_to_inference_data_seed_fixes_the_obs_of_mcmc_draws_and_an_ensemble():
    model, guide = _bayesian()
    x, y = toy_data(10)
    draws = {k: v.unsqueeze(0) for k, v in _guide_draws(model, guide, x, 3).items()}
    stats = {
        "diverging": torch.zeros(1, 3, dtype=torch.bool),
        "step_size": torch.ones(1, 3),
        "tree_depth": torch.ones(1, 3),
        "energy": torch.zeros(1, 3),
    }
    result = MCMCResult(draws, stats, "nuts", 3, model=model, x=x, y=y)
    ensemble = batchensemble(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), 3)
    for export in (
        lambda s: to_inference_data(result, seed=s),
        lambda s: to_inference_data(ensemble, None, x, y, seed=s),
    ):
        first = _kept(lambda export=export: export(4))
        torch.rand(50)
        assert _same_values(first, _kept(lambda export=export: export(4)))
        changed = [
            key for key, v in _values(first).items() if not (v == _values(export(5))[key]).all()
        ]
        assert changed == [("posterior_predictive", "obs")]  # the only draws: the obs


def _regression():
    x = torch.randn(20, 2)
    y = x @ torch.tensor([1.0, -2.0]) + 0.5 * torch.randn(20)

    def model(x, y):
        w = pyro.sample("w", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(x @ w, 0.5), obs=y)

    def guide(x, y):
        pyro.sample("w", dist.Normal(torch.tensor([1.0, -2.0]), 0.2).to_event(1))

    return model, guide, x, y


def test_psis_diagnostic_seed_repeats_and_keeps_the_global_state():
    model, guide, x, y = _regression()
    first = _kept(lambda: psis_diagnostic(model, guide, x, y, num_samples=40, seed=0))
    torch.rand(50)
    second = _kept(lambda: psis_diagnostic(model, guide, x, y, num_samples=40, seed=0))
    assert torch.equal(first.log_weights, second.log_weights) and first.k_hat == second.k_hat
    other = psis_diagnostic(model, guide, x, y, num_samples=40, seed=1)
    assert not torch.equal(first.log_weights, other.log_weights)
    pyro.set_rng_seed(0)
    assert torch.equal(
        first.log_weights, psis_diagnostic(model, guide, x, y, num_samples=40).log_weights
    )
    torch.manual_seed(2)
    plain, after = psis_diagnostic(model, guide, x, y, num_samples=40), torch.get_rng_state()
    torch.manual_seed(2)
    none = psis_diagnostic(model, guide, x, y, num_samples=40, seed=None)
    assert torch.equal(plain.log_weights, none.log_weights)
    assert torch.equal(torch.get_rng_state(), after)


# --- CUDA --------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_predict_seed_on_cuda_keeps_the_devices_generator():
    model = tiny_mlp().cuda()
    guide = mean_field_guide(model, init_scale=0.3)
    x = toy_data(10)[0].cuda()
    cuda_before = torch.cuda.get_rng_state()
    first = _kept(lambda: predict(model, x, guide, num_samples=4, seed=3, progress=False))
    assert torch.equal(torch.cuda.get_rng_state(), cuda_before)
    torch.randn(100, device="cuda")
    assert _same(first, predict(model, x, guide, num_samples=4, seed=3, progress=False))
    pyro.set_rng_seed(3)  # the device's generator seeded as set_rng_seed seeds it
    assert _same(first, predict(model, x, guide, num_samples=4, progress=False))


def test_evaluate_rotations_seed_repeats_and_keeps_the_global_state():
    """evaluate_rotations() took no seed= where predict() does: its rows drew from, and
    advanced, torch's global stream."""
    from pyrouq import BayesianMLP, evaluate_rotations, mean_field_guide

    torch.manual_seed(0)
    model = BayesianMLP(in_features=784, hidden_features=8, out_features=10)
    guide = mean_field_guide(model, init_scale=0.5)
    x, y = torch.randn(6, 1, 28, 28), torch.arange(6)
    options = dict(angles=[0, 90], num_samples=4, progress=False)
    state = torch.get_rng_state()
    first = evaluate_rotations(model, x, y, guide, seed=3, **options)
    assert torch.equal(torch.get_rng_state(), state)
    torch.randn(100)  # the global stream moved: the seeded sweep does not care
    assert evaluate_rotations(model, x, y, guide, seed=3, **options) == first
    assert evaluate_rotations(model, x, y, guide, seed=4, **options) != first
    pyro.set_rng_seed(3)  # the draws pyro.set_rng_seed gives, as for predict(seed=)
    assert evaluate_rotations(model, x, y, guide, **options) == first
    with pytest.raises(ValueError, match=r"^evaluate_rotations\(\): expected seed to be an "):
        evaluate_rotations(model, x, y, guide, seed=-1, **options)


def _two_threads_inside(model, first, second):
    """Run ``first()`` on one thread and ``second()`` on another, each a call that runs
    ``model``'s first Linear layer, so that (where nothing stops them) the second enters while
    the first is inside, and the first ends while the second is inside; where the calls run
    one at a time, the first goes on after 0.5 s of waiting."""
    import threading

    layer = next(m for m in model.modules() if isinstance(m, nn.Linear))
    first_in, second_in, first_done = threading.Event(), threading.Event(), threading.Event()
    names, failed = {}, []

    def hook(module, args):
        who = names.get(threading.get_ident())
        if who == "first" and not first_in.is_set():
            first_in.set()
            second_in.wait(0.5)  # (a timeout: one at a time, the second cannot come in)
        elif who == "second" and not second_in.is_set():
            second_in.set()
            first_done.wait(30)

    def run(name, call, after):
        names[threading.get_ident()] = name
        if name == "second":
            first_in.wait(30)
        try:
            call()
        except Exception as error:  # (a thread's error would pass for a warning alone)
            failed.append(error)
        after.set()

    handle = layer.register_forward_pre_hook(hook)
    try:
        threads = [
            threading.Thread(target=run, args=("first", first, first_done)),
            threading.Thread(target=run, args=("second", second, threading.Event())),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        handle.remove()
    if failed:
        raise failed[0]


@pytest.mark.parametrize("seeded", [False, True])
def test_predict_on_two_threads_at_once_leaves_the_modes_validation_and_streams_as_they_were(
    seeded,
):
    """Two threads predicting at once: the first to end put back the model's mode and Pyro's
    validation flag it had found, and the second then its own, those the first had set: the
    model was left in eval mode and Pyro's validation off for good, and (with seed=) torch's
    global stream at the first call's seeded state. The calls now run one at a time."""
    from pyro.infer import is_validation_enabled

    torch.manual_seed(0)
    model, guide = _bayesian()
    x, _ = toy_data(8)
    seeds = (1, 2) if seeded else (None, None)
    alone = [predict(model, x, guide, num_samples=3, progress=False, seed=s) for s in seeds]
    got = {}

    def call(i):
        return lambda: got.update({i: predict(model, x, guide, 3, progress=False, seed=seeds[i])})

    model.train()
    state = torch.get_rng_state()
    with pyro.validation_enabled(True):
        _two_threads_inside(model, call(0), call(1))
        assert model.training and is_validation_enabled()
    assert sorted(got) == [0, 1]
    if seeded:
        assert torch.equal(torch.get_rng_state(), state)
        assert _same(got[0], alone[0]) and _same(got[1], alone[1])


def test_predict_in_a_child_forked_while_another_thread_predicts_does_not_wait():
    """The lock that keeps predict() calls one at a time is a fresh one in a forked child: the
    parent's thread holding it does not exist there."""
    import multiprocessing
    import threading

    from pyrouq import _one_at_a_time

    torch.manual_seed(0)
    model, guide = _bayesian()
    x, _ = toy_data(8)
    held, release = threading.Event(), threading.Event()

    def hold():
        with _one_at_a_time._lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    try:
        child = multiprocessing.get_context("fork").Process(
            target=predict, args=(model, x, guide, 2), kwargs={"progress": False, "seed": 0}
        )
        child.start()
        child.join(20)
        alive = child.is_alive()
        if alive:
            child.kill()
    finally:
        release.set()
        holder.join(30)
    assert not alive and child.exitcode == 0


def test_to_inference_data_on_two_threads_at_once_leaves_the_global_stream_as_it_was():
    """As predict(): two seeded exports at once left torch's global stream at the first
    export's seeded state (the second put back what it had found, the first's fork)."""
    torch.manual_seed(0)
    model, guide = _bayesian()
    x, y = toy_data(8)
    state, got = torch.get_rng_state(), {}
    _two_threads_inside(
        model,
        lambda: got.update(first=to_inference_data(model, guide, x, y, num_samples=3, seed=1)),
        lambda: got.update(second=to_inference_data(model, guide, x, y, num_samples=3, seed=2)),
    )
    assert torch.equal(torch.get_rng_state(), state)
    assert sorted(got) == ["first", "second"]


@contextlib.contextmanager
def _held_until_a_call_warns(monkeypatch):
    """Another thread holds the lock that runs calls one at a time (PATIENCE cut to 0.01 s)
    until the call made inside the block warns that it has waited; yields the warnings the
    block recorded (pytest.warns: the block must warn a RuntimeWarning)."""
    import threading

    from pyrouq import _one_at_a_time

    held, release = threading.Event(), threading.Event()
    warn = _one_at_a_time._warn_waiting

    def warned(name):  # the holder lets go once the waiting call has warned
        warn(name)
        release.set()

    monkeypatch.setattr(_one_at_a_time, "PATIENCE", 0.01)
    monkeypatch.setattr(_one_at_a_time, "_warn_waiting", warned)

    def hold():
        with _one_at_a_time._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    try:
        with pytest.warns(RuntimeWarning) as record:
            yield record
    finally:
        release.set()
        holder.join(30)


def test_a_call_kept_waiting_for_another_threads_warns_of_a_call_that_waits_on_it(monkeypatch):
    """A loader making its batches with predict() on a thread of its own (a teacher's labels,
    prefetched) waits on a call that waits on the predict() reading the loader: neither ends,
    and nothing said why. A call kept waiting (PATIENCE seconds) now warns, saying what to
    do, and goes on waiting."""
    torch.manual_seed(0)
    model, guide = _bayesian()
    x, _ = toy_data(8)
    with _held_until_a_call_warns(monkeypatch) as record:
        preds = predict(model, x, guide, 2, progress=False)
    assert preds.probs.shape[:2] == (2, 8)
    message = str(record[0].message)
    assert message.startswith("predict() has waited 0.01 s for a call of predict(), ")
    assert "make those predictions on the thread of the call that reads them" in message


@pytest.mark.parametrize("which", ["to_inference_data", "psis_diagnostic", "evaluate_rotations"])
def test_the_other_calls_that_run_one_at_a_time_wait_for_another_threads_and_warn(
    which, monkeypatch
):
    """psis_diagnostic() and evaluate_rotations() set what predict() sets (the model's modes,
    Pyro's validation flags, with seed= torch's streams) and take the same turn: with the
    lock taken off either of them, no test failed. Each waits while another thread's call
    runs, warning in its own name once kept waiting, and then runs."""
    from pyrouq import BayesianMLP, evaluate_rotations

    torch.manual_seed(0)
    if which == "psis_diagnostic":
        model, guide, x, y = _regression()
        call = lambda: psis_diagnostic(model, guide, x, y, num_samples=40)  # noqa: E731
    elif which == "evaluate_rotations":
        model = BayesianMLP(in_features=784, hidden_features=8, out_features=10)
        guide = mean_field_guide(model, init_scale=0.5)
        x, y = torch.randn(4, 1, 28, 28), torch.arange(4)
        call = lambda: evaluate_rotations(  # noqa: E731
            model, x, y, guide, angles=[0, 90], num_samples=2, progress=False
        )
    else:
        model, guide = _bayesian()
        x, y = toy_data(8)
        call = lambda: to_inference_data(model, guide, x, y, num_samples=2)  # noqa: E731
    with _held_until_a_call_warns(monkeypatch) as record:
        result = call()
    assert result is not None
    assert str(record[0].message).startswith(f"{which}() has waited 0.01 s for a call of ")
