"""Audit of Pyro models of one's own (PyroSample priors, autoguides) through fit(), predict()
and to_inference_data(): the loss against Pyro's Trace_ELBO, what predict() reads as logits,
and Pyro's global param store."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import LatentScale, sampled_linear
from pyro import poutine
from pyro.infer import Trace_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq

GUIDES = [AutoNormal, AutoDiagonalNormal, AutoDelta, AutoLowRankMultivariateNormal]


class Classifier(PyroModule):
    """Global weights, a positive global site, optionally a local latent per data point, and
    ``obs`` in a subsampled plate (named ``plate``); ``returns`` "logits" or "probs"."""

    def __init__(self, local=False, plate="data", returns="logits"):
        super().__init__()
        self.fc1 = sampled_linear(4, 5, bias_scale=1.0)
        self.fc2 = sampled_linear(5, 3, bias_scale=1.0)
        self.num_data = 40
        self.local, self.plate, self.returns = local, plate, returns

    def forward(self, x, y=None):
        temperature = pyro.sample("temperature", dist.LogNormal(0.0, 1.0))
        logits = self.fc2(F.relu(self.fc1(x))) * temperature
        with pyro.plate(self.plate, self.num_data, subsample_size=x.shape[0]):
            if self.local:
                z = pyro.sample("z", dist.Normal(0.0, 1.0))
                logits = logits + z[:, None] * torch.tensor([1.0, 0.0, -1.0])
            if self.returns == "probs":
                probs = logits.softmax(-1)
                pyro.sample("obs", dist.Categorical(probs=probs), obs=y)
                return probs
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def fitted(model, make=AutoNormal, epochs=2, **kwargs):
    x, y = data()
    guide = make(model)
    pyrouq.fit(
        model,
        guide,
        [(x[:20], y[:20]), (x[20:], y[20:])],
        epochs=epochs,
        num_data=40,
        progress=False,
        seed=0,
        **kwargs,
    )
    return guide


# -- the loss is Pyro's own -------------------------------------------------------------------


@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("make", GUIDES)
def test_fits_first_step_is_trace_elbo_on_a_subsampled_plate_loss_and_gradients(make, local):
    """fit()'s loss on a batch of 8 of N = 40 (its model.num_data) is Trace_ELBO's of the
    same draw, and KLWeightedELBO(1)'s gradients are Trace_ELBO's."""
    x, y = data()
    x, y = x[:8], y[:8]
    pyro.set_rng_seed(1)
    model = Classifier(local=local)
    guide = make(model)
    guide(x, y)
    model.train()
    grads, losses = [], []
    for elbo in (Trace_ELBO(), pyrouq.KLWeightedELBO(1.0)):
        pyro.set_rng_seed(5)
        with poutine.trace(param_only=True) as params:
            losses.append(elbo.loss_and_grads(model, guide, x, y))
        tensors = {n: s["value"].unconstrained() for n, s in params.trace.nodes.items()}
        grads.append({n: t.grad.clone() for n, t in tensors.items()})
        for t in tensors.values():
            t.grad = None
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-6)
    result = pyrouq.fit(
        model, guide, [(x, y)], epochs=1, num_data=40, kl_weight=1.0, seed=5, lr=1e-12,
        progress=False,
    )  # fmt: skip
    assert model.num_data == 40
    assert result.history[0].loss == pytest.approx(losses[0], rel=1e-6)


@pytest.mark.parametrize("make", GUIDES)
def test_a_kl_weight_is_trace_elbo_with_the_latent_sites_scaled_in_model_and_guide(make):
    x, y = data()
    x, y = x[:8], y[:8]
    model = Classifier(local=True)
    guide = make(model)
    guide(x, y)
    pyro.set_rng_seed(5)
    theirs = Trace_ELBO().loss(LatentScale(0.3)(model), LatentScale(0.3)(guide), x, y)
    pyro.set_rng_seed(5)
    ours = pyrouq.KLWeightedELBO(0.3).loss(model, guide, x, y)
    assert ours == pytest.approx(theirs, rel=1e-6)


# -- predict() ------------------------------------------------------------------------------


def test_predict_gives_s_n_c_and_identical_draws_of_a_map_guide_in_any_plate():
    x, _ = data()
    model = Classifier(plate="rows")
    guide = fitted(model, AutoDelta)
    preds = pyrouq.predict(model, x[:5], guide, num_samples=4, batch_size=2, progress=False)
    assert preds.probs.shape == (4, 5, 3)
    assert torch.equal(preds.probs, preds.probs[:1].expand(4, 5, 3))
    # the softmax of the model's own tempered logits, at the MAP weights
    model.eval()
    with torch.no_grad():
        replayed = poutine.replay(model, trace=poutine.trace(guide).get_trace(x[:5]))
        expected = poutine.trace(replayed).get_trace(x[:5]).nodes["obs"]["fn"].probs
    torch.testing.assert_close(preds.probs[0], expected, rtol=1e-5, atol=1e-6)


def test_probabilities_returned_for_logits_are_refused_not_softmaxed_again():
    """A model observing Categorical(probs=p) and returning p: predict() took p for logits and
    softmaxed it again, (0.23, 0.37, 0.39) came out as (0.30, 0.35, 0.35)."""
    x, _ = data()
    model = Classifier(returns="probs")
    guide = fitted(model)
    with pytest.raises(ValueError, match=r"returned class probabilities, not logits") as err:
        pyrouq.predict(model, x[:5], guide, num_samples=2, progress=False)
    assert "pyro.deterministic('logits', p.log())" in str(err.value)

    class Recorded(Classifier):
        def forward(self, x, y=None):
            out = super().forward(x, y)
            pyro.deterministic("logits", out.log())  # the fix the message names
            return out

    pyro.clear_param_store()  # a new AutoNormal of the same site names
    recorded = Recorded(returns="probs")
    guide = fitted(recorded)
    pyro.set_rng_seed(0)
    preds = pyrouq.predict(recorded, x[:5], guide, num_samples=2, progress=False)
    pyro.set_rng_seed(0)
    draws = pyro.infer.Predictive(recorded, guide=guide, num_samples=1)(x[:5])
    assert preds.probs.shape == (2, 5, 3)
    sites = {k: v for k, v in draws.items() if k not in ("obs", "logits", "data")}
    one = pyrouq.predict(recorded, x[:5], posterior_samples=sites, progress=False)
    torch.testing.assert_close(
        one.probs[0], draws["logits"].reshape(5, 3).exp(), rtol=1e-5, atol=1e-6
    )


class _Regression(PyroModule):
    def __init__(self, outputs):
        super().__init__()
        self.fc = sampled_linear(4, outputs, bias_scale=1.0)
        self.num_data = 40

    def forward(self, x, y=None):
        mean = self.fc(x)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Normal(mean, 0.5).to_event(1), obs=y)
        return mean


def test_a_multi_output_regression_is_refused_by_predict_not_read_as_class_logits():
    """Its (B, 2) means were taken for the logits of 2 classes, Predictions of (S, N, 2)."""
    x, _ = data()
    model = _Regression(2)
    y = torch.randn(40, 2)
    guide = AutoNormal(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=40, progress=False)
    for kwargs in ({"guide": guide}, {}):  # its guide's draws, or its prior's
        with pytest.raises(TypeError, match=r"observes continuous targets") as err:
            pyrouq.predict(model, x[:5], num_samples=2, progress=False, **kwargs)
        message = str(err.value)
        assert "'obs' site is drawn from Normal" in message
        assert "2 outputs per input predict() would take for the logits of 2 classes" in message
        assert "likelihood=pyrouq.likelihoods.Gaussian" in message


def test_a_bernoulli_classifiers_single_logit_is_refused_with_the_binary_fix():
    class Binary(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = sampled_linear(4, 1, bias_scale=1.0)
            self.num_data = 40

        def forward(self, x, y=None):
            logit = self.fc(x).squeeze(-1)
            with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
                pyro.sample("obs", dist.Bernoulli(logits=logit), obs=y)
            return logit

    x, y = data()
    model = Binary()
    guide = AutoNormal(model)
    pyrouq.fit(model, guide, [(x, (y > 0).float())], epochs=1, num_data=40, progress=False)
    with pytest.raises(TypeError, match=r"returned a tensor of shape \(5,\)") as err:
        pyrouq.predict(model, x[:5], guide, num_samples=2, progress=False)
    assert "torch.stack([torch.zeros_like(l), l], -1)" in str(err.value)


# -- Pyro's global param store ----------------------------------------------------------------


def test_a_new_guide_taking_an_earlier_fits_parameters_from_the_param_store_is_warned_of():
    """Pyro's param store is global: a new AutoNormal of a second model of the same class took
    the first one's fitted tensors, and training it moved the first guide too."""
    first = Classifier()
    first_guide = fitted(first)
    fitted_loc = first_guide.locs.fc1.weight.detach().clone()
    second = Classifier()
    with pytest.warns(UserWarning, match=r"Classifier's guide took \d+ parameter\(s\)") as rec:
        second_guide = fitted(second, epochs=1)
    message = str(rec[0].message)
    assert "'AutoNormal.locs.fc1.weight'" in message
    assert "pyro.settings.set(module_local_params=True)" in message
    assert second_guide.locs.fc1.weight is first_guide.locs.fc1.weight  # what it warns of
    assert not torch.equal(first_guide.locs.fc1.weight.detach(), fitted_loc)


def test_no_param_store_warning_when_a_guide_trains_on_or_was_set_up_before_fit():
    x, y = data()
    model = Classifier()
    guide = AutoDiagonalNormal(model)
    guide(x[:20], y[:20])  # set up by hand first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted_guide = fitted(model, lambda m: guide)
        fitted(model, lambda m: fitted_guide)  # trained on
        net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
        bayesian = pyrouq.bayesian(net, num_data=40)
        fitted(bayesian, pyrouq.mean_field_guide)


def test_fit_and_predict_with_module_local_params():
    """With pyro.settings' module_local_params, a PyroModule's plain nn.Parameter (an
    unsampled bias) is a param site whose value has no .unconstrained: fit() failed with an
    AttributeError before training."""

    class PlainBias(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = PyroModule[nn.Linear](4, 3)
            self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 4]).to_event(2))
            self.num_data = 40

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x, _ = data()
    losses = []
    for local in (False, True):
        pyro.clear_param_store()
        old = pyro.settings.get("module_local_params")
        pyro.settings.set(module_local_params=local)
        try:
            torch.manual_seed(0)
            model = PlainBias()
            bias = model.fc.bias.detach().clone()
            guide = fitted(model, epochs=3, lr=0.1)
            losses.append(pyrouq.predict(model, x[:5], guide, progress=False).probs.shape)
            assert not torch.equal(model.fc.bias.detach(), bias)  # trained
            losses.append(model.fc.bias.detach().clone())
        finally:
            pyro.settings.set(module_local_params=old)
    assert losses[0] == losses[2] == (32, 5, 3)
    torch.testing.assert_close(losses[1], losses[3])  # the same run either way


class _MultiLabel(PyroModule):
    """Three yes/no labels per input, each a Bernoulli of its own logit."""

    def __init__(self):
        super().__init__()
        self.lin = PyroModule[nn.Linear](4, 3)
        self.lin.weight = PyroSample(dist.Normal(0.0, 1.0).expand([3, 4]).to_event(2))
        self.num_data = 16

    def forward(self, x, y=None):
        logits = self.lin(x)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Bernoulli(logits=logits).to_event(1), obs=y)
        return logits


def test_a_multi_label_model_is_refused_not_read_as_one_softmax():
    """Its (B, 3) logits were read as one softmax over 3 classes, without a word."""
    pyro.clear_param_store()
    model = _MultiLabel()
    guide = AutoNormal(model)
    x, y = torch.randn(16, 4), (torch.rand(16, 3) > 0.5).float()
    guide(x, y)
    with pytest.raises(TypeError) as info:
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert str(info.value) == (
        "predict(): _MultiLabel observes 3 labels per input (its 'obs' site is drawn from "
        "Bernoulli): a multi-label model, whose outputs predict() would take for the logits of "
        "one softmax over 3 classes. Draw its predictions with pyro.infer.Predictive "
        "(predict() covers models that pick one class of C per input)."
    )
