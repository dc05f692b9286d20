"""mcmc() on data and in contexts a user brings: features that carry an autograd graph, a
caller in torch.no_grad / torch.inference_mode, Pyro's validation turned off, and a model with
no finite starting point."""

from __future__ import annotations

import pyro
import pytest
import torch
from _toy import MCMC_OPTIONS, regression_data, regression_model
from torch import nn

import pyrouq
from pyrouq import Gaussian, bayesian, mcmc

OPTIONS = MCMC_OPTIONS
_data, _model = regression_data, regression_model


def test_features_with_an_autograd_graph_run_in_parallel_chains():
    """Inputs computed by a network (an encoder's features, outside torch.no_grad) carry a
    graph; the chain processes' pickling refused them ("Cowardly refusing to serialize
    non-leaf tensor which requires_grad"), where the chains run here took them."""
    x, y = _data()
    encoder = nn.Linear(2, 2)
    features = encoder(x)
    assert features.requires_grad
    model = _model()
    here = mcmc(model, features, y, num_chains=2, parallel=False, **OPTIONS)
    there = mcmc(model, features, y, num_chains=2, parallel=True, **OPTIONS)
    for site in here.samples:
        torch.testing.assert_close(there.samples[site], here.samples[site])
    assert not there.x.requires_grad and encoder.weight.grad is None


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_mcmc_runs_under_no_grad_and_inference_mode(context):
    """NUTS differentiates the log density: called under torch.no_grad (an evaluation block)
    it failed with "element 0 of tensors does not require grad and does not have a grad_fn"."""
    x, y = _data()
    model = _model()
    expected = mcmc(model, x, y, num_chains=1, **OPTIONS)
    with context():
        res = mcmc(model, x, y, num_chains=1, **OPTIONS)
        assert not torch.is_grad_enabled()  # the caller's mode as it was
    for site in expected.samples:
        assert torch.equal(res.samples[site], expected.samples[site])


def test_data_made_in_inference_mode_are_sampled_on():
    """Tensors made under torch.inference_mode cannot be saved for a backward pass."""
    x, y = _data()
    model = _model()
    expected = mcmc(model, x, y, num_chains=1, **OPTIONS)
    with torch.inference_mode():
        xi, yi = x * 1, y * 1
    res = mcmc(model, xi, yi, num_chains=1, **OPTIONS)
    assert torch.equal(res.samples["bias"], expected.samples["bias"])
    assert not res.x.is_inference()


def test_a_chain_with_no_finite_starting_point_says_why_and_closes_its_bar():
    """Targets whose squared error overflows float32 make the log density -inf at every
    weight: Pyro's "Model specification seems incorrect - cannot find valid initial params"
    said nothing of the chain or what to check, and the chain's progress bar stayed open."""
    from tqdm.auto import tqdm

    x, _ = _data()
    y = torch.full((x.shape[0],), 1e25)
    before = len(tqdm._instances)
    with pytest.raises(
        ValueError,
        match=r"mcmc\(\): chain 0 found no starting point where the model's log density is "
        r"finite .*cannot find valid initial params\)\. .*NaN or infinite.*Standardizer",
    ) as info:
        mcmc(_model(), x, y, num_chains=1, **{**OPTIONS, "progress": True})
    assert len(tqdm._instances) == before, "the bar is left open"  # while the error is held
    assert info.value.__cause__ is not None  # Pyro's own error chained


def test_summary_of_an_mcmc_result_names_the_call_that_exports_it():
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(scale=0.5))
    x = torch.randn(20, 2)
    result = mcmc(model, x, x.sum(-1, keepdim=True), num_samples=5, warmup_steps=5,
                  num_chains=1, progress=False, parallel=False)  # fmt: skip
    with pytest.raises(TypeError) as info:
        pyrouq.diagnostics.summary(result)
    assert str(info.value) == (
        "Expected idata to be an arviz.InferenceData, got MCMCResult; make one with "
        "to_inference_data(result)."
    )
    assert len(pyrouq.diagnostics.summary(pyrouq.diagnostics.to_inference_data(result))) == 3


@pytest.mark.parametrize("validation", [True, False])
def test_labels_outside_the_classes_are_refused_whatever_pyros_validation(validation):
    """Under pyro.enable_validation(False) (a script's setting for speed) the labels' range
    went unchecked and mcmc() failed in torch's words ('index 7 is out of bounds for
    dimension 1 with size 3'); it checks them once on the full data either way, as fit()."""
    x = torch.randn(12, 4)
    y = torch.tensor([0, 1, 2, 7] * 3)
    torch.manual_seed(0)
    was = pyro.poutine.util.is_validation_enabled()
    pyro.enable_validation(validation)
    try:
        with pytest.raises(ValueError, match=r"^mcmc\(\): labels in \[0, 7\], expected class "):
            mcmc(bayesian(nn.Linear(4, 3)), x, y, **{**OPTIONS, "num_chains": 1})
    finally:
        pyro.enable_validation(was)


@pytest.mark.parametrize("parallel", [False, True])
def test_chain_bars_off_a_terminal_redraw_in_place_not_a_line_each(capfd, parallel):
    """In a Jupyter notebook stderr is no terminal (the kernel forwards the chain processes'
    output too) and tqdm's moves between lines (ESC [A) are not followed: the bars of chains
    1, 2, ... drawn on lines of their own (``position=chain``) added a line at each redraw,
    hundreds in a cell for a long run. Chains run one after another share one line anyway."""
    x, y = _data()
    mcmc(_model(), x, y, num_chains=2, parallel=parallel, **{**OPTIONS, "progress": True})
    err = capfd.readouterr().err
    assert "chain 0 warmup" in err and "chain 1 warmup" in err
    assert "\x1b[A" not in err  # the cursor moved up, to a bar's line of its own
    assert "\n" not in err  # each redraw a carriage return on the same line


def test_parallel_chain_bars_keep_a_line_each_on_a_terminal(monkeypatch):
    """On a terminal, which follows tqdm's moves, chains run at once keep a line each."""
    from pyrouq import _mcmc_workers

    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr(_mcmc_workers.sys, "stderr", Terminal())
    assert [_mcmc_workers._bar_line(c, parallel=True) for c in (0, 3)] == [0, 3]
    assert _mcmc_workers._bar_line(3, parallel=False) is None
    # a chain job run here (threads None: one after another) shares one line; one in a chain
    # process (its threads set) keeps its own
    lines = []
    monkeypatch.setattr(_mcmc_workers, "_run_chain", lambda *args, line: lines.append(line))
    job = (_model(), *_data(), None, 1, 1, 0, 3, True, 2)
    _mcmc_workers.chain_job((*job, None))
    _mcmc_workers.chain_job((*job, torch.get_num_threads()))
    assert lines == [None, 3]
    monkeypatch.setattr(_mcmc_workers.sys, "stderr", None)
    assert _mcmc_workers._bar_line(3, parallel=True) is None
