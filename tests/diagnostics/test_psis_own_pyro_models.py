"""Audit of Pyro-native use: a Pyro user's own models (PyroSample priors, model functions) and
Pyro's autoguides through psis_diagnostic() and to_inference_data(), checked against the log
joint and log-likelihood Pyro's own traces give."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer.autoguide import AutoDelta, AutoLaplaceApproximation, AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq


def _linear(i, o):
    layer = PyroModule[nn.Linear](i, o)
    layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand([o, i]).to_event(2))
    layer.bias = PyroSample(dist.Normal(0.0, 1.0).expand([o]).to_event(1))
    return layer


class Softmax(PyroModule):
    """Softmax regression in the README's recipe: ``obs`` in a plate of ``num_data`` points,
    subsampled to the batch."""

    def __init__(self, num_data=40):
        super().__init__()
        self.fc = _linear(4, 3)
        self.num_data = num_data

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, (x[:, 0] - x[:, 1] > 0).long() + (x[:, 2] > 1).long()


def _reference_log_weights(model, guide, x, y, num_samples):
    """log p(w_s, D) - log q(w_s) of Pyro's own traces, drawn as psis_diagnostic draws."""
    weights = []
    for _ in range(num_samples):
        with torch.no_grad():
            guide_trace = poutine.trace(guide).get_trace(x, y)
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
            weights.append(float(model_trace.log_prob_sum() - guide_trace.log_prob_sum()))
    return torch.tensor(weights, dtype=torch.float64)


# -- psis_diagnostic() --------------------------------------------------------------------------


def test_psis_refuses_a_point_mass_guide_instead_of_calling_it_the_posterior():
    """An AutoDelta (a MAP fit) draws the same weights every time, so its ratios were constant
    and psis_diagnostic() said k-hat -inf, "the guide equals the posterior"; the Laplace
    approximation around the same MAP point is checked as any guide."""
    x, y = _data()
    model = Softmax()
    delta = AutoDelta(model)
    pyrouq.fit(model, delta, [(x, y)], epochs=5, num_data=40, progress=False, seed=0)
    with pytest.raises(ValueError, match=r"same value of every latent site.*a point mass"):
        pyrouq.psis_diagnostic(model, delta, x, y, num_samples=30)

    pyro.clear_param_store()
    model = Softmax()
    laplace = AutoLaplaceApproximation(model)
    pyrouq.fit(
        model, laplace, [(x, y)], epochs=200, num_data=40, kl_weight=1.0, progress=False, seed=0
    )
    with pytest.raises(ValueError, match=r"laplace_approximation\(x, y\)"):
        pyrouq.psis_diagnostic(model, laplace, x, y, num_samples=30)
    approximation = laplace.laplace_approximation(x, y)
    pyro.set_rng_seed(3)
    result = pyrouq.psis_diagnostic(model, approximation, x, y, num_samples=60)
    pyro.set_rng_seed(3)
    reference = _reference_log_weights(model, approximation, x, y, 60)
    torch.testing.assert_close(result.log_weights, reference, rtol=1e-5, atol=1e-3)
    assert result.k_hat > -float("inf")


def test_psis_refuses_a_model_that_observes_a_random_subsample_of_the_points():
    """A plate subsampling 10 of the 40 points given weighed each draw on other points times
    4 (the k-hat of that noise came out 0.57, "ok"); a plate of a larger N subsampled to
    len(x), the model's own scale, is still taken, with Pyro's log joint."""

    class Subsampling(PyroModule):
        def __init__(self, size, subsample):
            super().__init__()
            self.fc = _linear(4, 3)
            self.size, self.subsample = size, subsample

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", self.size, subsample_size=self.subsample) as i:
                pyro.sample("obs", dist.Categorical(logits=logits[i]), obs=y[i])

    x, y = _data()
    model = Subsampling(40, 10)
    guide = AutoNormal(model, init_scale=0.1)
    guide(x, y)
    with pytest.raises(ValueError, match=r"'obs' in plate 'data' subsampled to 10 of 40"):
        pyrouq.psis_diagnostic(model, guide, x, y, num_samples=30)

    class Scaled(Subsampling):  # the README's recipe with its N fixed: indices unused
        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", self.size, subsample_size=self.subsample):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)

    pyro.clear_param_store()
    model = Scaled(400, 40)
    guide = AutoNormal(model, init_scale=0.1)
    guide(x, y)
    pyro.set_rng_seed(4)
    result = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=30)
    pyro.set_rng_seed(4)
    reference = _reference_log_weights(model, guide, x, y, 30)  # the likelihood times 10
    torch.testing.assert_close(result.log_weights, reference, rtol=1e-5, atol=1e-3)


# -- a continuous site without rsample ----------------------------------------------------------


def _circular(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
    angle = pyro.sample("angle", dist.VonMises(0.0, 2.0))
    with pyro.plate("data", len(x)):
        pyro.sample("obs", dist.Categorical(logits=x @ w * torch.cos(angle)), obs=y)


def _without_angle(x, y=None):
    pyro.sample("w", dist.Normal(pyro.param("w_loc", torch.zeros(4, 3)), 0.1).to_event(2))


@pytest.mark.parametrize("check", ["psis", "idata"])
def test_a_continuous_site_without_rsample_left_out_of_the_guide_is_not_called_discrete(check):
    """torch's VonMises has no rsample, and a guide that forgot it was told the model has a
    discrete site left out for enumeration, with TraceEnum_ELBO as the way."""
    x, y = _data()
    with pytest.raises(ValueError) as caught:
        if check == "psis":
            pyrouq.psis_diagnostic(_circular, _without_angle, x, y, num_samples=30)
        else:
            pyrouq.to_inference_data(_circular, _without_angle, x, y, num_samples=3)
    message = str(caught.value)
    assert "the model's latent site(s) ['angle'] are missing from the guide" in message
    assert "discrete" not in message and "TraceEnum_ELBO" not in message


# -- inputs of another dtype -------------------------------------------------------------------


def test_float64_inputs_of_a_float32_pyro_model_are_cast_as_predict_casts_them():
    """numpy's float64 inputs met the float32 draws of an autoguide in torch's "mat1 and mat2
    must have the same dtype" in to_inference_data() and psis_diagnostic(); predict() took
    them. The results are those of the float32 inputs."""
    x, y = _data()
    model = Softmax()
    guide = AutoNormal(model, init_scale=0.1)
    pyrouq.fit(model, guide, [(x, y)], epochs=5, num_data=40, progress=False, seed=0)
    exports = []
    for inputs in (x, x.double()):
        pyro.set_rng_seed(7)
        exports.append(pyrouq.to_inference_data(model, guide, inputs, y, num_samples=5))
    for group in ("posterior", "log_likelihood", "posterior_predictive"):
        assert exports[1][group].equals(exports[0][group]), group
    weights = []
    for inputs in (x, x.double()):
        pyro.set_rng_seed(7)
        weights.append(pyrouq.psis_diagnostic(model, guide, inputs, y, num_samples=30))
    torch.testing.assert_close(weights[1].log_weights, weights[0].log_weights)
    pyro.set_rng_seed(7)
    reference = _reference_log_weights(model, guide, x, y, 30)
    torch.testing.assert_close(weights[0].log_weights, reference, rtol=1e-5, atol=1e-3)


# -- local latent sites --------------------------------------------------------------------------


class _Local(PyroModule):
    """A global weight and a local latent ``z`` per data point."""

    def __init__(self):
        super().__init__()
        self.fc = _linear(4, 3)

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", len(x)):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            pyro.sample("obs", dist.Categorical(logits=logits + z[:, None]), obs=y)


@pytest.mark.parametrize("check", ["psis", "idata"])
def test_a_guide_of_local_latent_sites_on_other_points_is_told_not_a_size_mismatch(check):
    """An AutoNormal of a local site built on 40 points, exported on 10 of them, met torch's
    "The size of tensor a (10) must match the size of tensor b (40)" from inside the model;
    on its own 40 points it exports its z (one per point) and weighs its draws as Pyro does."""
    x, y = _data()
    model = _Local()
    guide = AutoNormal(model, init_scale=0.1)
    guide(x, y)
    with pytest.raises(ValueError) as caught:
        if check == "psis":
            pyrouq.psis_diagnostic(model, guide, x[:10], y[:10], num_samples=30)
        else:
            pyrouq.to_inference_data(model, guide, x[:10], y[:10], num_samples=3)
    message = str(caught.value)
    assert "the guide's site 'z' holds a value per point of plate 'data' of 40 points" in message
    assert "while x holds 10: a local latent site" in message
    assert "size of tensor a (10) must match" in message  # the model's own error, first line
    pyro.set_rng_seed(2)
    if check == "idata":
        idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=3)
        assert idata.posterior["z"].shape == (1, 3, 40)
        assert idata.log_likelihood["obs"].shape == (1, 3, 40)
    else:
        result = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=30)
        pyro.set_rng_seed(2)
        reference = _reference_log_weights(model, guide, x, y, 30)
        torch.testing.assert_close(result.log_weights, reference, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize(
    ("k", "reading"),
    [
        (0.498, "good (k-hat 0.498 < 0.5)"),
        (0.6996, "ok (0.5 <= k-hat 0.6996 < 0.7)"),
        (0.29, "good (k-hat 0.29 < 0.5)"),
        (0.7, "bad (k-hat 0.70 >= 0.7)"),
    ],
)
def test_a_k_hat_just_below_a_threshold_is_not_shown_at_it(monkeypatch, k, reading):
    """k-hat 0.498 was read as "good (k-hat 0.50 < 0.5)", 0.6996 as "ok (... 0.70 < 0.7)";
    arviz's k-hat is set (its psislw patched) to read the interpretation psis_diagnostic gives."""
    import arviz

    monkeypatch.setattr(arviz, "psislw", lambda lw, reff: (lw - lw.max(), k))
    model = Softmax()
    guide = AutoNormal(model)
    x, y = _data()
    result = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=25)
    assert result.k_hat == k
    assert result.interpretation.startswith(reading), result.interpretation


@pytest.mark.parametrize("fn", ["psis_diagnostic", "to_inference_data"])
def test_an_unfitted_autoguide_on_float64_inputs_is_told_to_fit_it_or_cast_x(fn):
    """An AutoNormal not fitted yet builds itself on x: on float64 x its run of the model
    (float32 priors) failed in torch's bare 'mat1 and mat2 must have the same dtype', Pyro's
    site shapes after it (the inputs' cast reads a built guide's dtype, and it had none)."""
    torch.manual_seed(0)
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    model = Softmax()
    guide = AutoNormal(model)

    def call(inputs):
        kw = {"num_samples": 25} if fn == "psis_diagnostic" else {"num_samples": 4}
        return getattr(pyrouq, fn)(model, guide, inputs, y, **kw)

    with pytest.raises(TypeError) as info:
        call(x.double())
    assert str(info.value) == (
        f"{fn}(): Softmax draws its latent sites ('fc.weight', 'fc.bias') in torch.float32, its "
        "priors' dtype, but x is torch.float64, and torch does not mix the two (RuntimeError: "
        "mat1 and mat2 must have the same dtype, but got Double and Float). Its guide holds no "
        "parameters yet to take the dtype from: it has not been fitted (a fitted guide's dtype "
        "is what x is cast to). Fit it first, pyrouq.fit(model, guide, ...), or pass x in "
        "torch.float32 (x.float()), or build Softmax's priors in torch.float64."
    )
    pyrouq.fit(model, guide, pyrouq.ArrayLoader(x, y, 20), epochs=1, progress=False)
    assert call(x.double()) is not None  # the first fix: x is cast to the fitted guide's dtype
