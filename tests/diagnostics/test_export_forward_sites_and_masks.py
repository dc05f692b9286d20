"""Review of the latest fixes: the CPU default is entered where torch's get_default_device()
misses a ``with torch.device(...)`` block (torch 2.3-2.7) and around predict()'s batchnorm
data; an own forward's local site in the export draws apart from the guide's next draw; its
obs density honours a mask and outputs in a plate of their own, a mask or scale around the
export is refused; conformal() refuses 'abs' scores of an infinite stddev."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import NoisyMLP, tiny_mlp, toy_data
from torch import nn

import pyrouq
from pyrouq import ArrayLoader, GaussianPredictions, fit, mean_field_guide, to_inference_data
from pyrouq.calibration import conformal


def test_a_device_block_that_get_default_device_misses_still_takes_the_cpu_default(
    monkeypatch,
):
    x, y = toy_data(24)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    # (torch 2.3-2.7: get_default_device() reads set_default_device's setting alone)
    monkeypatch.setattr(torch, "get_default_device", lambda: torch.device("cpu"))
    with torch.device("meta"):
        result = fit(model, guide, ArrayLoader(x, y, batch_size=8, seed=0), epochs=1,
                     progress=False)  # fmt: skip
    assert result.steps == 3


def test_predict_reads_its_batchnorm_data_under_the_cpu_default():
    x, y = toy_data(24)
    net = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model = pyrouq.bayesian(net)
    guide = mean_field_guide(model)
    fit(model, guide, [(x, y)], epochs=1, num_data=24, progress=False)
    data = ArrayLoader(x, y, batch_size=8, shuffle=True, seed=0)
    want = pyrouq.predict(model, x, guide, num_samples=2, batchnorm_data=data, seed=0).probs
    data = ArrayLoader(x, y, batch_size=8, shuffle=True, seed=0)  # (shuffled as the first)
    torch.set_default_device("meta")
    try:
        got = pyrouq.predict(model, x, guide, num_samples=2, batchnorm_data=data, seed=0).probs
    finally:
        torch.set_default_device(None)
    assert torch.equal(got, want)


def test_a_local_site_of_the_forward_draws_apart_from_the_guides_next_draw():
    """The random state put back after draw s gave draw s + 1's guide the very normals draw
    s's eps had taken (equal to 3e-6)."""
    x, y = toy_data(13)
    model = NoisyMLP(in_features=3, hidden_features=4, out_features=2, num_data=13)
    guide = mean_field_guide(model)
    idata = to_inference_data(model, guide, x, y, 3, batch_size=13, seed=0)
    probs = torch.from_numpy(idata.posterior_predictive["probs"].values[0, :, :, 1]).double()
    eps = torch.log(probs / (1 - probs))  # (3, 13): the logit of class 1
    loc = guide.site_loc("fc1.weight").detach()
    scale = guide.site_scale("fc1.weight").detach()
    weights = torch.from_numpy(idata.posterior["fc1.weight"].values[0]).float()  # (3, 4, 3)
    normals = ((weights - loc) / scale).flatten(1).double()  # (3, 12)
    for s in range(2):
        gap = (eps[s, :12] - normals[s + 1]).abs().max()
        assert gap > 1e-2, (s, gap)


class _MaskedObs(pyrouq.BayesianNetwork):
    """A regression whose forward masks 'obs' at x[:, 0] <= 0, by poutine.mask or by the
    distribution's .mask(), observing Normal(out, 3.0) beside Gaussian(0.5)."""

    how = "poutine"

    def forward(self, x, y=None):
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        out = self.outputs(x, weights)
        keep = x[:, 0] > 0
        with pyro.plate("data", x.shape[0]):
            if self.how == "poutine":
                with pyro.poutine.mask(mask=keep):
                    pyro.sample("obs", dist.Normal(out, 3.0).to_event(1), obs=y)
            else:
                pyro.sample("obs", dist.Normal(out, 3.0).to_event(1).mask(keep), obs=y)
        return out


def test_a_masked_obs_scores_zero_whichever_way_it_is_masked():
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(4))
    y = 4 * x.sum(-1)
    found = {}
    for how in ("poutine", "distribution"):
        torch.manual_seed(0)  # (the same network both ways)
        model = _MaskedObs(nn.Linear(3, 1), likelihood=pyrouq.Gaussian(0.5), num_data=9)
        model.how = how
        with pytest.warns(UserWarning, match="forward draws 'obs'"):
            idata = to_inference_data(model, mean_field_guide(model), x, y, 2, seed=1)
        found[how] = torch.from_numpy(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(found["poutine"], found["distribution"], rtol=0, atol=1e-6)
    assert (found["poutine"][:, x[:, 0] <= 0] == 0).all()
    assert (found["poutine"][:, x[:, 0] > 0] != 0).all()


def test_a_mask_or_scale_around_the_export_is_refused_as_it_would_not_apply():
    """The export's log-likelihood is every point's, unscaled, whatever handler is around the
    call: a mask leaving points out or a scale other than 1 was ignored (a pyrouq model) or
    told as the model's own mask (a Pyro model); True and 1 are let through."""
    x, y = toy_data(6)
    model = tiny_mlp()
    guide = mean_field_guide(model)

    def own(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=y)

    def own_guide(x, y=None):
        pyro.sample("w", dist.Normal(0.3, 0.1))

    plain = to_inference_data(model, guide, x, y, 2, seed=1).log_likelihood["obs"].values
    with pyro.poutine.mask(mask=True), pyro.poutine.scale(scale=1.0):
        kept = to_inference_data(model, guide, x, y, 2, seed=1).log_likelihood["obs"].values
    assert (kept == plain).all()
    # a mask keeping every point, a scale of ones: no point's log-likelihood changes (they were
    # refused as 'the points the mask leaves out', which it leaves none of)
    every, ones = torch.ones(6, dtype=torch.bool), torch.ones(6)
    for args in ((model, guide, x, y), (own, own_guide, x, x[:, 1])):
        bare = to_inference_data(*args, 2, seed=1).log_likelihood["obs"].values
        with pyro.poutine.mask(mask=every), pyro.poutine.scale(scale=ones):
            kept = to_inference_data(*args, 2, seed=1).log_likelihood["obs"].values
        assert kept.shape == bare.shape and (kept == bare).all()
    with pyro.poutine.mask(mask=x[:, 0] > 0), pytest.raises(ValueError) as told:
        to_inference_data(model, guide, x, y, 2, seed=1)  # (keep, which the advice names)
    assert str(told.value).endswith(
        "Call to_inference_data() outside the mask, on the x and y whose points should count "
        "(x[keep], y[keep], keep the points the mask keeps)."
    )
    handlers = [
        (pyro.poutine.mask(mask=False), r"mask\(mask=False\), expected no mask around"),
        (
            pyro.poutine.mask(mask=torch.arange(6) < 3),
            r"mask\(\) of a mask of shape \(6,\), expected no mask around",
        ),
        (pyro.poutine.scale(scale=2.0), r"scale\(scale=2\), expected no scale around"),
    ]
    for handler, shown in handlers:
        for args in ((model, guide, x, y), (own, own_guide, x, x[:, 1])):
            with (
                handler,
                pytest.raises(
                    ValueError,
                    match=rf"to_inference_data\(\) was called inside pyro\.poutine\.{shown} the "
                    r"call: the export would not apply it, its log_likelihood .* Call "
                    r"to_inference_data\(\) outside",
                ),
            ):
                to_inference_data(*args, 2, seed=1)


class _PlatedOutputs(pyrouq.BayesianNetwork):
    """Two outputs observed in a plate of their own, Normal(out, 3.0), beside Gaussian(0.5)."""

    def forward(self, x, y=None):
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        out = self.outputs(x, weights)
        with pyro.plate("outs", 2, dim=-1), pyro.plate("data", x.shape[0], dim=-2):
            pyro.sample("obs", dist.Normal(out, 3.0), obs=y)
        return out


def test_outputs_in_a_plate_of_their_own_are_summed_into_the_obs_density():
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(4))
    y = torch.stack([x.sum(-1), x[:, 0]], -1) * 4
    model = _PlatedOutputs(nn.Linear(3, 2), likelihood=pyrouq.Gaussian(0.5), num_data=9)
    with pytest.warns(UserWarning, match="forward draws 'obs'"):
        idata = to_inference_data(model, mean_field_guide(model), x, y, 3, batch_size=4, seed=1)
    loc = torch.from_numpy(idata.posterior_predictive["loc"].values[0]).double()  # (3, 9, 2)
    want = torch.distributions.Normal(loc, 3.0).log_prob(y.double()).sum(-1)
    got = torch.from_numpy(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_conformal_refuses_abs_scores_of_an_infinite_stddev():
    loc = torch.full((2, 6, 1), 1e300, dtype=torch.float64)
    loc[1] = -1e300
    preds = GaussianPredictions(loc, torch.ones(2, 6, 1, dtype=torch.float64), torch.zeros(6))
    with pytest.raises(ValueError, match=r"expected finite predictive stddevs for the 'abs'"):
        conformal(preds, score="abs", alpha=0.2)


def test_a_local_site_of_the_forward_differs_between_draws_that_move_no_random_state():
    """A Delta guide (as MCMC draws) moves no random state between draws: seeded from the
    state alone, every draw's eps was the same."""
    from pyro.infer.autoguide import AutoDelta

    x, y = toy_data(13)
    model = NoisyMLP(in_features=3, hidden_features=4, out_features=2, num_data=13)
    guide = AutoDelta(model)
    guide(x, y)  # (its values made: the first export would otherwise draw them)
    idata = to_inference_data(model, guide, x, y, 3, batch_size=13, seed=0)
    probs = torch.from_numpy(idata.posterior_predictive["probs"].values[0, :, :, 1])  # (3, 13)
    assert not torch.equal(probs[0], probs[1]) and not torch.equal(probs[1], probs[2])
    again = to_inference_data(model, guide, x, y, 3, batch_size=13, seed=0)
    assert (again.posterior_predictive["probs"].values == idata.posterior_predictive["probs"]).all()
