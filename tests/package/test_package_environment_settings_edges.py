"""The edges of the settings test_package_environment_settings.py covers: a Pyro trace around
fit() and mcmc() kept from the sample sites by a poutine.block() between them, a condition
or do() fixing a latent site around fit(), mcmc() or predict() and a plate around the
diagnostics (refused), a condition giving None for one, a process whose stderr is closed or
detached, and train_test_split() and adaptive conformal scores under a default device other
than the CPU."""

from __future__ import annotations

import io
import os
import re
import sys

import pyro
import pytest
import torch
from _toy import toy_data
from torch import nn

import pyrouq

QUIET = {"progress": False}


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2))


def _run(call: str, **options):
    """fit()'s losses or mcmc()'s draws of one weight, on a fresh toy network."""
    x, y = toy_data(24)
    model = pyrouq.bayesian(_net())
    if call == "fit":
        guide = pyrouq.mean_field_guide(model)
        return pyrouq.fit(model, guide, [(x, y)], epochs=2, num_data=24, seed=0, **options).losses
    chain = pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1, seed=0,
                        **options)  # fmt: skip
    return chain.samples["0.weight"]


@pytest.mark.parametrize("call", ["fit", "mcmc"])
@pytest.mark.parametrize(
    "block",
    [{"expose_types": ["param"]}, {"hide_types": ["sample", "observe"]}],
    ids=["expose-params", "hide-samples"],
)
def test_a_trace_kept_from_the_sample_sites_by_a_block_lets_fit_and_mcmc_run(call, block):
    """A poutine.block() that hides every sample site, observed or not, leaves the trace
    outside it parameters alone to record (as trace(param_only=True)): fit() and mcmc() ran
    there (as outside any handler) and were refused as inside a bare trace."""
    pyro.clear_param_store()
    alone = _run(call, **QUIET)
    pyro.clear_param_store()
    with pyro.poutine.trace() as tracer, pyro.poutine.block(**block):
        got = _run(call, **QUIET)
    if call == "fit":  # (float32 sums may round otherwise there: 9e-8 relative on an AMD EPYC)
        assert got == pytest.approx(alone, rel=1e-6)
    else:
        assert torch.equal(got, alone)
    sites = tracer.trace.nodes.values()
    assert not [site["name"] for site in sites if site["type"] == "sample"]
    if call == "fit":  # (the guide's parameters, recorded by the trace outside the block)
        assert any(site["type"] == "param" for site in sites)


def test_a_block_letting_observed_sites_through_still_leaves_the_trace_refused():
    """hide_types=['sample'] hides the latent draws but not the observed sites ("obs",
    "logits"), which the trace records at every step (Pyro's "Multiple sample sites named
    'logits'"): refused, as inside a bare trace."""
    with pytest.raises(ValueError, match=r"^mcmc\(\) was called inside pyro\.poutine\.trace"):
        with pyro.poutine.trace(), pyro.poutine.block(hide_types=["sample"]):
            _run("mcmc", **QUIET)


def _call(call: str, model, guide, x, y):
    """``call`` (fit, mcmc, predict or a diagnostic) on the toy ``model``, quickly."""
    if call == "fit":
        return pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=24, **QUIET)
    if call == "mcmc":
        return pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1, **QUIET)
    if call == "predict":
        return pyrouq.predict(model, x, guide, num_samples=2, **QUIET)
    if call == "psis_diagnostic":
        return pyrouq.psis_diagnostic(model, guide, x, y, num_samples=30, seed=0)
    return pyrouq.to_inference_data(model, guide, x=x, y=y, num_samples=2, seed=0)


CALLS = ["fit", "mcmc", "predict", "psis_diagnostic", "to_inference_data"]


@pytest.mark.parametrize("handler", ["condition", "do"])
@pytest.mark.parametrize("call", CALLS)
def test_a_condition_fixing_a_latent_site_around_the_call_is_refused_in_words(call, handler):
    """pyro.poutine.condition(data={'0.weight': w}) around fit() failed in Pyro's words ('site
    0.weight must be sampled in trace'), around mcmc() gave draws without '0.weight' that
    predict() and to_inference_data() then refused as another model's, around predict()
    was ignored (the probabilities of the draws, w unused), and around the diagnostics told
    that the guide did not belong to the model. pyro.poutine.do() was let through: fit()
    trained the guide's '0.weight' on its prior alone (the network ran with w), mcmc() drew
    it from its prior, predict() ignored w."""
    x, y = toy_data(24)
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    fixed = getattr(pyro.poutine, handler)(data={"0.weight": torch.zeros(6, 3)})
    with fixed, pytest.raises(ValueError) as info:
        _call(call, model, guide, x, y)
    assert str(info.value).startswith(
        f"{call}() was called inside pyro.poutine.{handler}() fixing latent site(s) "
        "'0.weight' of BayesianNetwork, expected none fixed: "
    )
    assert "bayesian(net, select=...) without it" in str(info.value)
    if handler == "do" and call == "fit":
        assert "its guide learnt those sites from their prior alone" in str(info.value)


@pytest.mark.parametrize("call", CALLS)
def test_a_condition_giving_none_for_a_latent_site_is_not_told_it_fixes_it(call):
    """Pyro's condition() observes nothing at a site given None (was refused as "fixing
    '0.weight'"): predict() and to_inference_data() run as without it; fit(), mcmc() and
    psis_diagnostic() would fail in Pyro's words (it writes the None over the guide's or
    NUTS's value: Pyro's own SVI fails so), and are told that. do() with None intervenes on
    nothing: every call runs."""
    x, y = toy_data(24)
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    with pyro.poutine.do(data={"0.weight": None}):
        _call(call, model, guide, x, y)
    given = pyro.poutine.condition(data={"0.weight": None})
    if call in ("predict", "to_inference_data"):
        with given:
            _call(call, model, guide, x, y)
        return
    over = "NUTS's value" if call == "mcmc" else "the guide's draw"
    with given, pytest.raises(ValueError, match=re.escape(
        f"{call}() was called inside pyro.poutine.condition() giving None for latent site(s) "
        f"'0.weight' of BayesianNetwork: Pyro observes nothing there but writes the None over "
        f"{over} of the site, so the run would fail in Pyro's words. Leave the None entries "
        f"out of data (they condition nothing), or call {call}() outside the handler."
    )):  # fmt: skip
        _call(call, model, guide, x, y)


def test_a_condition_of_the_targets_alone_is_let_through_as_pyro_applies_it():
    """Conditioning "obs" (the labels) fixes no latent site: fit() runs under it, on the
    conditioned labels, as Pyro's own ELBO would (the losses of a run on those labels)."""
    x, y = toy_data(24)
    losses = []
    for labels, given in ((y, 1 - y), (1 - y, 1 - y)):
        model = pyrouq.bayesian(_net())
        guide = pyrouq.mean_field_guide(model)
        with pyro.poutine.condition(data={"obs": given}):
            run = pyrouq.fit(model, guide, [(x, labels)], epochs=2, num_data=24, seed=0, **QUIET)
        losses.append(run.losses)
    assert losses[0] == losses[1]
    assert losses[0] != _run("fit", **QUIET)  # (the labels y: other losses)


@pytest.mark.parametrize("call", ["psis_diagnostic", "to_inference_data"])
def test_a_plate_around_the_diagnostics_is_refused_not_blamed_on_the_guide(call):
    """A vectorised pyro.plate around psis_diagnostic() or to_inference_data() broadcast the
    guide's draws, which were then said not to belong to the model ('site '0.weight' has
    shape (3, 1, 6, 3) in the guide ... Pass the guide built for this model'): it is
    refused as fit() and mcmc() refuse it, naming the plate."""
    x, y = toy_data(24)
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    with pyro.plate("outer", 3, dim=-2), pytest.raises(ValueError) as info:
        if call == "psis_diagnostic":
            pyrouq.psis_diagnostic(model, guide, x, y, num_samples=30, seed=0)
        else:
            pyrouq.to_inference_data(model, guide, x=x, y=y, num_samples=2, seed=0)
    words = str(info.value)
    assert words.startswith(
        f"{call}() got BayesianNetwork called inside pyro.plate('outer', 3, dim=-2), expected "
        "no plate around the call"
    )
    assert words.endswith(f"Call {call}() outside the plate.") == (call == "to_inference_data")
    assert "guide" not in words


def _closed() -> io.TextIOWrapper:
    stream = open(os.devnull, "w")  # (closed at once)
    stream.close()
    return stream


def _detached() -> io.TextIOWrapper:
    stream = io.TextIOWrapper(io.BytesIO())
    stream.detach()
    return stream


@pytest.mark.parametrize("stream", [_closed, _detached], ids=["closed", "detached"])
def test_fit_shows_no_bar_where_stderr_is_closed_or_detached(monkeypatch, stream):
    """tqdm flushes sys.stderr as it makes a bar: a closed one ended fit(progress=True) in
    ValueError "I/O operation on closed file" (a detached one: "underlying buffer has been
    detached"), as None had ended it in AttributeError."""
    pyro.clear_param_store()
    losses = _run("fit", progress=False)
    pyro.clear_param_store()
    monkeypatch.setattr(sys, "stderr", stream())
    got = _run("fit", progress=True)
    monkeypatch.undo()
    assert got == losses


class _Stream(io.StringIO):
    """A stderr that is a terminal or not (a Jupyter notebook's, a log file)."""

    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.mark.parametrize("terminal", [False, True], ids=["notebook", "terminal"])
def test_a_fit_inside_ones_own_bar_redraws_in_place_off_a_terminal(monkeypatch, terminal):
    """A fit() (or a predict() in a fit() callback) run while another bar is shown (one's own
    tqdm loop over settings, a notebook's usual cell) had its bar put on the line below by
    tqdm, reached by a cursor move up (ESC [A) that a notebook does not follow: each redraw
    was a new line in the cell, dozens an epoch. Off a terminal it is redrawn in place now;
    on a terminal, which follows the moves, it keeps its line below."""
    from tqdm.auto import tqdm

    stream = _Stream(terminal)
    monkeypatch.setattr(sys, "stderr", stream)
    outer = tqdm(total=2, desc="settings", leave=False)
    try:
        _run("fit", progress=True)
    finally:
        outer.close()
    monkeypatch.undo()
    drawn = stream.getvalue()
    assert "settings:" in drawn and "0/2 [00:00<?, ?step/s]" in drawn  # (both bars drawn)
    assert ("\x1b[A" in drawn) is terminal
    assert ("\n" in drawn) is terminal


def test_a_bar_given_its_position_keeps_it_off_a_terminal(monkeypatch):
    # only a bar given no position is drawn on the first line: one placed by its caller (each
    # MCMC chain's on a line of its own) keeps its line, reached by tqdm's moves down and up
    from pyrouq._progress import tqdm

    stream = _Stream(False)
    monkeypatch.setattr(sys, "stderr", stream)
    bar = tqdm(total=2, desc="chain 2", position=1)
    bar.close()
    monkeypatch.undo()
    assert "chain 2:" in stream.getvalue()
    assert "\n" in stream.getvalue() and "\x1b[A" in stream.getvalue()  # (drawn a line below)


def test_train_test_split_under_a_meta_default_device_splits_as_on_the_cpu():
    """Its order came from a randperm on the default device: "Cannot copy out of meta tensor;
    no data!" (under 'cuda': a CPU generator refused there), as ArrayLoader's did."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, 2, generator=g), torch.randn(10, generator=g)
    torch.set_default_device("meta")
    try:
        tx, ty, vx, vy = pyrouq.train_test_split(x, y, test_fraction=0.3, seed=5)
    finally:
        torch.set_default_device(None)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(5))  # by hand
    assert tx.device.type == vx.device.type == "cpu"
    assert torch.equal(vx, x[order[:3]]) and torch.equal(vy, y[order[:3]])
    assert torch.equal(tx, x[order[3:]]) and torch.equal(ty, y[order[3:]])


def test_adaptive_conformal_scores_under_a_meta_default_device_are_the_cpus():
    """APS drew its u with a CPU generator on the default device: under a meta (or CUDA)
    default, torch refused the generator; now u is drawn on the CPU, as without a default."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(2, 30, 3, generator=g), -1)
    labels = torch.randint(0, 3, (30,), generator=g)
    preds = pyrouq.Predictions.from_probs(probs, labels)
    expected = pyrouq.conformal(preds, alpha=0.2, score="aps").predict_sets(preds)
    torch.set_default_device("meta")
    try:
        got = pyrouq.conformal(preds, alpha=0.2, score="aps").predict_sets(preds)
    finally:
        torch.set_default_device(None)
    assert torch.equal(got, expected)


def _on_meta_default(call):
    """``call()`` under a meta default device, the default put back after."""
    torch.set_default_device("meta")
    try:
        return call()
    finally:
        torch.set_default_device(None)


def test_class_conditional_coverage_under_a_meta_default_device_is_the_cpus():
    """Its counts were zeros of the default device fed CPU indices: index_add() refused."""
    sets = torch.tensor([[True, False, False], [True, True, False], [False, False, True]])
    y = torch.tensor([0, 2, 2])
    got = _on_meta_default(lambda: pyrouq.class_conditional_coverage(sets, y))
    assert got.device.type == "cpu"
    torch.testing.assert_close(
        got, torch.tensor([1.0, float("nan"), 0.5], dtype=torch.float64), equal_nan=True
    )


def test_a_hand_made_regressor_of_a_list_threshold_under_a_meta_default_device():
    preds = pyrouq.GaussianPredictions(torch.zeros(1, 2, 1), torch.ones(1, 2, 1))
    reg = _on_meta_default(lambda: pyrouq.ConformalRegressor("abs", 0.1, [2.0]))
    lo, hi = _on_meta_default(lambda: reg.intervals(preds))
    assert reg.threshold.device.type == "cpu"
    assert lo.tolist() == [[-2.0], [-2.0]] and hi.tolist() == [[2.0], [2.0]]


def test_a_grid_of_normalised_colour_images_under_a_meta_default_device():
    """Its per-channel constants were made on the default device, the images on the CPU."""
    import matplotlib

    matplotlib.use("Agg")
    images = torch.zeros(2, 3, 4, 4)  # black, normalised per channel
    preds = pyrouq.Predictions.from_probs(torch.full((1, 2, 3), 1 / 3))
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.2, 0.2)
    figure = _on_meta_default(
        lambda: pyrouq.plot_image_grid(
            preds, images, rows=1, cols=2, normalized=True, mean=mean, std=std
        )
    )
    shown = figure.axes[0].images[0].get_array()
    assert shown.shape == (4, 4, 3) and shown[0, 0].tolist() == pytest.approx(list(mean))


def test_an_array_given_as_the_training_batches_is_told_with_an():
    with pytest.raises(TypeError, match=r"^train_loader is an ndarray \(the inputs alone\?\)"):
        pyrouq.fit(_net(), None, torch.zeros(4, 3).numpy(), epochs=1, **QUIET)
