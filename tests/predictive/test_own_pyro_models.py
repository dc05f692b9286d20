"""Pyro models written by hand (PyroSample priors, pyro.param, model functions) with Pyro's
autoguides, Predictive and MCMC, through pyrouq's fit(), predict() and diagnostics."""

from __future__ import annotations

import math
import warnings
from typing import ClassVar

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import EnumeratedMixture, sampled_linear
from pyro.infer import MCMC, NUTS, Predictive
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq


class BNN(PyroModule):
    """A classifier as in Pyro's own tutorials: PyroSample weights, obs in a subsampled plate."""

    def __init__(self, record_logits: bool = False, returns: str = "logits"):
        super().__init__()
        self.fc1 = sampled_linear(4, 8, bias_scale=1.0)
        self.fc2 = sampled_linear(8, 3, bias_scale=1.0)
        self.num_data = 48
        self.record_logits, self.returns = record_logits, returns

    def forward(self, x, y=None):
        logits = self.fc2(F.relu(self.fc1(x)))
        if self.record_logits:
            pyro.deterministic("logits", logits)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            obs = pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return {"logits": logits, "probs": logits.softmax(-1), "obs": obs}[self.returns]


def data(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def fitted(model=None, epochs=2):
    x, y = data()
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = model or BNN()
    guide = AutoNormal(model)
    pyrouq.fit(
        model,
        guide,
        [(x[:24], y[:24]), (x[24:], y[24:])],
        epochs=epochs,
        num_data=48,
        progress=False,
    )
    return model, guide


def drop_site(guide, site):
    return pyro.poutine.block(guide, hide=[site])  # its draws lack the site


def test_a_guide_missing_a_site_or_of_another_shape_is_refused_not_drawn_from_the_prior():
    model, guide = fitted()
    x, _ = data()
    with pytest.raises(ValueError) as err:
        pyrouq.predict(model, x, drop_site(guide, "fc2.bias"), progress=False)
    assert "predict(): the guide does not fit BNN: the model's latent site 'fc2.bias' (3,) is " in (
        str(err.value)
    )
    assert "AutoNormal(model) is one for any Pyro model" in str(err.value)
    draws = Predictive(model, guide=guide, num_samples=4, return_sites=["fc1.weight"])(x)
    with pytest.raises(ValueError, match=r"posterior_samples do not fit BNN: the model's latent"):
        pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    draws = Predictive(model, guide=guide, num_samples=4)(x)
    draws["fc2.bias"] = draws["fc2.bias"][..., :1]
    with pytest.raises(ValueError, match=r"site 'fc2.bias' has shape \(1, 1\) there but \(3,\)"):
        pyrouq.predict(model, x, posterior_samples=draws, progress=False)


def test_fit_refuses_a_guide_of_another_shape_before_training():
    class Narrow(PyroModule):
        def forward(self, x, y=None):
            pyro.sample("fc1.weight", dist.Normal(torch.zeros(8, 4), 1.0).to_event(2))
            pyro.sample("fc1.bias", dist.Normal(torch.zeros(8), 1.0).to_event(1))
            pyro.sample("fc2.weight", dist.Normal(torch.zeros(3, 8), 1.0).to_event(2))
            pyro.sample("fc2.bias", dist.Normal(torch.zeros(1), 1.0).to_event(1))

    x, y = data()
    model = BNN()
    with pytest.raises(ValueError) as err:
        pyrouq.fit(model, Narrow(), [(x, y)], epochs=1, num_data=48, progress=False)
    assert "fit(): the guide does not fit BNN: Model and guide shapes disagree at site " in str(
        err.value
    )
    assert "'fc2.bias': torch.Size([3]) vs torch.Size([1])" in str(err.value)


def test_predictive_output_predicts_the_new_inputs_under_its_latent_draws_only():
    model, guide = fitted(BNN(record_logits=True))
    x, _ = data()
    new = torch.randn(10, 4)
    draws = Predictive(model, guide=guide, num_samples=5)(x)  # with "obs" and "logits" of x
    assert draws["fc1.weight"].shape == (5, 1, 8, 4)  # padded to the model's one plate
    assert draws["logits"].shape == (5, 1, 48, 3)  # of x, not of the new inputs
    preds = pyrouq.predict(model, new, posterior_samples=draws, progress=False)
    assert preds.probs.shape == (5, 10, 3)
    # by hand: each draw's network on the new inputs
    w1, b1 = draws["fc1.weight"][:, 0], draws["fc1.bias"][:, 0]
    w2, b2 = draws["fc2.weight"][:, 0], draws["fc2.bias"][:, 0]
    hidden = F.relu(torch.einsum("ni,shi->snh", new, w1) + b1[:, None])
    expected = (torch.einsum("snh,sch->snc", hidden, w2) + b2[:, None]).softmax(-1)
    torch.testing.assert_close(preds.probs, expected)


def test_float64_draws_of_a_model_without_parameters_take_the_inputs_dtype():
    """arviz / numpy draws come as float64; a model with no parameters of its own tells no
    dtype, so they take the inputs' (torch refused float32 inputs times float64 weights)."""
    model, guide = fitted(BNN())
    x, _ = data()
    draws = Predictive(
        model,
        guide=guide,
        num_samples=4,
        return_sites=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    )(x)
    as_float64 = {k: v.double() for k, v in draws.items()}
    preds = pyrouq.predict(model, x[:6], posterior_samples=as_float64, progress=False)
    expected = pyrouq.predict(model, x[:6], posterior_samples=draws, progress=False)
    assert preds.probs.dtype == torch.float32
    torch.testing.assert_close(preds.probs, expected.probs)


def test_a_recorded_logits_site_is_read_before_the_return_value():
    model, guide = fitted(BNN(record_logits=True, returns="probs"))
    x, _ = data()
    pyro.set_rng_seed(1)
    preds = pyrouq.predict(model, x, guide, num_samples=3, progress=False)
    model.returns = "logits"  # the same draws, the logits returned
    pyro.set_rng_seed(1)
    expected = pyrouq.predict(model, x, guide, num_samples=3, progress=False)
    torch.testing.assert_close(preds.probs, expected.probs)  # not a softmax of probabilities


def test_predict_takes_batches_larger_than_the_training_set_of_a_subsampling_model():
    model, guide = fitted()
    x = torch.randn(100, 4)  # num_data is 48: pyro.plate(..., 48, subsample_size=100) alone fails
    preds = pyrouq.predict(model, x, guide, num_samples=3, progress=False)
    assert preds.probs.shape == (3, 100, 3)
    assert model.num_data == 48  # put back
    pyro.set_rng_seed(0)
    whole = pyrouq.predict(model, x, guide, num_samples=3, progress=False)
    pyro.set_rng_seed(0)
    parts = pyrouq.predict(model, x, guide, num_samples=3, batch_size=40, progress=False)
    torch.testing.assert_close(whole.probs, parts.probs)


def test_fit_trains_the_pyro_params_a_model_creates():
    class Biased(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = sampled_linear(4, 3)

        def forward(self, x, y=None):
            logits = x @ self.fc.weight.T + pyro.param("class_bias", torch.zeros(3))
            with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x = torch.randn(60, 4)
    y = torch.full((60,), 2)  # every label class 2: the bias must grow for class 2
    pyro.clear_param_store()
    model = Biased()
    batches = [(x[:30], y[:30]), (x[30:], y[30:])]
    pyrouq.fit(model, AutoNormal(model), batches, epochs=5, num_data=60, lr=0.1, progress=False,
               seed=0)  # fmt: skip
    bias = pyro.param("class_bias").detach()
    assert bias[2] > bias[0] + 1.0 and bias[2] > bias[1] + 1.0


def test_fit_takes_pyros_bayesian_regression_with_real_targets_and_full_batches():
    class BayesianRegression(PyroModule):  # as in Pyro's tutorial
        def __init__(self):
            super().__init__()
            self.linear = sampled_linear(3, 1, bias_scale=10.0)

        def forward(self, x, y=None):
            sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
            mean = self.linear(x).squeeze(-1)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Normal(mean, sigma), obs=y)
            return mean

    torch.manual_seed(0)
    x = torch.randn(40, 3)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(40)
    pyro.clear_param_store()
    model = BayesianRegression()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one batch of all N: no warning about the N/B scale
        result = pyrouq.fit(model, AutoNormal(model), [(x, y)], epochs=60, num_data=40, lr=0.05,
                            kl_weight=1.0, progress=False, seed=0)  # fmt: skip
    assert result.history[-1].loss < result.history[0].loss
    assert torch.isnan(torch.tensor(result.history[-1].train_acc))  # no accuracy to count


def test_pyro_mcmc_runs_are_predicted_and_refused_by_to_inference_data_with_the_fix():
    class Linear(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = sampled_linear(4, 3, bias_scale=1.0)

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x, y = data(30)
    pyro.set_rng_seed(0)
    model = Linear()
    run = MCMC(NUTS(model), num_samples=6, warmup_steps=6, disable_progbar=True)
    run.run(x, y)
    preds = pyrouq.predict(model, x, posterior_samples=run, progress=False)
    samples = run.get_samples()
    expected = torch.einsum("ni,sci->snc", x, samples["fc.weight"]) + samples["fc.bias"][:, None]
    torch.testing.assert_close(preds.probs, expected.softmax(-1))
    with pytest.raises(TypeError, match=r"got a pyro.infer.MCMC run as the model; .*from_pyro"):
        pyrouq.to_inference_data(run, x=x, y=y)
    with pytest.raises(TypeError, match=r"got a pyro.infer.MCMC run as the guide"):
        pyrouq.to_inference_data(model, run, x, y)


def test_fit_counts_the_training_accuracy_of_returned_or_recorded_logits():
    x, y = data()
    accuracies = []
    for record_logits in (False, True):
        pyro.clear_param_store()
        model = BNN(record_logits=record_logits)
        result = pyrouq.fit(model, AutoNormal(model), [(x, y)], epochs=1, num_data=48,
                            progress=False, seed=0)  # fmt: skip
        accuracies.append(result.history[-1].train_acc)
    assert accuracies[0] == accuracies[1] and 0 < accuracies[0] < 1  # not NaN: counted


def test_models_observing_row_by_row_or_needing_all_rows_are_checked_right():
    class Loop(PyroModule):  # Pyro's SVI Part I idiom: one site per row, named by its index
        def __init__(self):
            super().__init__()
            self.fc = sampled_linear(4, 3)

        def forward(self, x, y=None):
            logits = self.fc(x)
            for i in range(len(x)):
                pyro.sample(f"obs_{i}", dist.Categorical(logits=logits[i]),
                            obs=None if y is None else y[i])  # fmt: skip
            return logits

    class FullBatch(PyroModule):  # pyro.plate("data", N): runs on all N rows only
        def __init__(self):
            super().__init__()
            self.b = PyroSample(dist.Normal(0.0, 10.0).expand([3]).to_event(1))

        def forward(self, x, y=None):
            logits = x[:, :3] + self.b
            with pyro.plate("data", 12):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x = torch.randn(12, 4)
    draws = {"fc.weight": torch.randn(4, 3, 4), "fc.bias": torch.randn(4, 3)}
    preds = pyrouq.predict(Loop(), x, posterior_samples=draws, progress=False)
    assert preds.probs.shape == (4, 12, 3)  # obs_0, obs_1, ... are not latent sites
    with pytest.raises(ValueError, match=r"FullBatch: the model's latent site 'b' \(3,\) is not"):
        pyrouq.predict(FullBatch(), x, posterior_samples={"c": torch.randn(4, 3)}, progress=False)
    preds = pyrouq.predict(FullBatch(), x, posterior_samples={"b": torch.zeros(4, 3)},
                           progress=False)  # fmt: skip
    torch.testing.assert_close(preds.probs[0], x[:, :3].softmax(-1))


def test_one_logit_a_row_counts_no_training_accuracy():
    class Binary(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = sampled_linear(4, 1)

        def forward(self, x, y=None):
            logits = self.fc(x)  # (B, 1): argmax over one column is always 0
            with pyro.plate("data", self.num_data, subsample_size=len(x)):
                pyro.sample("obs", dist.Bernoulli(logits=logits[:, 0]),
                            obs=None if y is None else y.float())  # fmt: skip
            return logits

    x, _ = data()
    y = (x[:, 0] > 0).long()
    pyro.clear_param_store()
    model = Binary()
    result = pyrouq.fit(model, AutoNormal(model), [(x, y)], epochs=1, num_data=48,
                        progress=False)  # fmt: skip
    assert math.isnan(result.history[-1].train_acc)


def test_a_regression_model_of_ones_own_is_refused_by_predict_with_the_way_out():
    class Regression(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = sampled_linear(4, 1)

        def forward(self, x, y=None):
            mean = self.fc(x).squeeze(-1)
            with pyro.plate("data", len(x)):
                pyro.sample("obs", dist.Normal(mean, 1.0), obs=y)
            return mean

    x, _ = data()
    with pytest.raises(TypeError) as err:
        pyrouq.predict(Regression(), x, progress=False)
    assert "Regression returned a tensor of shape (48,) and recorded no 'logits' site" in str(
        err.value
    )
    assert "pyro.infer.Predictive, or build it as pyrouq.bayesian(net, likelihood=" in str(
        err.value
    )


def test_a_model_standardising_its_batch_is_probed_on_distinct_inputs():
    class Standardising(PyroModule):  # copies of one input give NaN: probed on x[:2], x[:3]
        def __init__(self):
            super().__init__()
            self.w = PyroSample(dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))

        def forward(self, x, y=None):
            logits = ((x - x.mean(0)) / x.std(0)) @ self.w
            pyro.sample("obs", dist.Categorical(logits=logits).to_event(1), obs=y)  # no plate
            return logits

    x = torch.randn(16, 4)
    draws = {"w": torch.randn(4, 4, 3)}
    preds = pyrouq.predict(Standardising(), x, posterior_samples=draws, progress=False)
    standardised = (x - x.mean(0)) / x.std(0)
    torch.testing.assert_close(preds.probs, (standardised @ draws["w"]).softmax(-1))


class PlainModulePyroModel(nn.Module):
    """A Pyro model written as a plain nn.Module (as in Pyro's VAE tutorial): its forward
    samples a weight with pyro.sample and observes y."""

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        logits = x @ w
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def test_fit_takes_a_pyro_model_written_as_a_plain_module_and_refuses_a_plain_network():
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    y = (x[:, 0] - x[:, 1] > 0).long()
    model = PlainModulePyroModel()
    result = pyrouq.fit(model, AutoNormal(model), [(x, y)], epochs=20, num_data=40, lr=0.1,
                        progress=False)  # fmt: skip
    assert result.history[-1].kl > 0 and result.history[-1].nll < result.history[0].nll
    network = nn.Linear(3, 2)  # forward(x): no labels, so no Pyro model
    with pytest.raises(ValueError, match=r"fit\(\) got a guide for a plain network \(Linear\)"):
        pyrouq.fit(network, AutoNormal(model), [(x, y)], epochs=1, num_data=40,
                   progress=False)  # fmt: skip


def test_predict_draws_a_pyro_model_written_as_a_plain_module_from_its_guide_or_draws():
    torch.manual_seed(0)
    x = torch.randn(40, 3)
    y = (x[:, 0] - x[:, 1] > 0).long()
    model = PlainModulePyroModel()
    guide = AutoNormal(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=30, num_data=40, lr=0.1, progress=False)
    preds = pyrouq.predict(model, x, guide, num_samples=7, progress=False)
    assert preds.probs.shape == (7, 40, 2)
    assert preds.probs.std(0).mean() > 1e-3  # seven draws of w, not one network
    assert (preds.probs.mean(0).argmax(-1) == y).float().mean() >= 0.9
    draws = {"w": torch.randn(5, 3, 2)}
    given = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    torch.testing.assert_close(given.probs, (x @ draws["w"]).softmax(-1))
    with pytest.raises(ValueError, match=r"predict\(\) got a guide for a plain network \(Linear\)"):
        pyrouq.predict(nn.Linear(3, 2), x, guide, progress=False)

    class Masked(nn.Module):  # a plain network whose forward takes a second, optional input
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x, mask=None):
            return self.fc(x if mask is None else x * mask)

    class Local(nn.Module):  # a Pyro model as an nn.Module whose latent sites are per row
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x, y=None):
            with pyro.plate("data", x.shape[0]):
                u = pyro.sample("u", dist.Normal(0.0, 1.0))
                logits = self.fc(x) + u.unsqueeze(-1) * torch.tensor([1.0, -1.0])
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    local = Local()
    local_guide = AutoNormal(local)
    local_guide(x, y)
    local_preds = pyrouq.predict(local, x, local_guide, num_samples=3, progress=False)
    assert local_preds.probs.shape == (3, 40, 2)  # per-input draws: not refused as plain
    with pytest.raises(ValueError, match=r"got posterior_samples for Masked, which samples none "
                       r"of the sites drawn \(w\): it has no latent site to draw"):  # fmt: skip
        pyrouq.predict(Masked(), x, posterior_samples=draws, progress=False)

    class NoLatent(Masked):  # a Pyro model whose only sample site is its likelihood
        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    with pytest.raises(ValueError, match=r"NoLatent, which samples none of the sites drawn \(w\)"):
        pyrouq.predict(NoLatent(), x, posterior_samples=draws, progress=False)


def test_a_pyro_model_written_as_a_module_is_refused_prior_weights_without_a_guide():
    """An ``nn.Module`` whose ``forward(x, y)`` samples its weights is a Pyro model: predict()
    without a guide ran it once, on weights drawn from the prior anew for every batch."""

    class Sampling(nn.Module):
        def forward(self, x, y=None):
            w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
            logits = x @ w
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x, _ = data()
    with pytest.raises(ValueError) as err:
        pyrouq.predict(Sampling(), x, progress=False)
    assert str(err.value).startswith(
        "Sampling samples the latent sites ['w'] and predict() got no draws of them: it would "
        "draw them from their priors, new ones for every input batch. Pass its fitted guide"
    )


def test_an_empty_batch_among_the_inputs_is_passed_over():
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(4, 3))
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    batches = [(x[:3], y[:3]), (x[:0], y[:0]), (x[3:], y[3:])]
    pyro.set_rng_seed(0)
    ours = pyrouq.predict(model, batches, guide, num_samples=2, progress=False)
    pyro.set_rng_seed(0)
    whole = pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    torch.testing.assert_close(ours.probs, whole.probs)
    assert torch.equal(ours.targets, y)


def test_an_empty_first_batch_and_a_network_taking_a_mask_are_run_as_given():
    def weights_only(x, y=None):  # global weights, no plate
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
        return x @ w

    x, _ = data(n=7)
    preds = pyrouq.predict(weights_only, [x[:0], x[:3], x[3:]], num_samples=3, progress=False)
    assert preds.probs.shape == (3, 7, 3)

    class Masked(nn.Module):  # a second argument, no sampling: run once per batch
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x, mask=None):
            return self.fc(x)

    net, seen = Masked(), []
    net.register_forward_hook(lambda module, inputs, out: seen.append(inputs[0].shape[0]))
    assert pyrouq.predict(net, x, progress=False).probs.shape == (1, 7, 3)
    assert seen == [7]


def test_a_networks_own_error_and_an_empty_first_batchs_random_state_come_through():
    class Failing(Exception):
        def __init__(self, code, message):
            super().__init__(message)
            self.code = code

    class Masked(nn.Module):
        def forward(self, x, mask=None):
            raise Failing(42, "the network's own error")

    x, _ = data(n=7)
    with pytest.raises(Failing) as err:  # not Pyro's rewrapped copy (a TypeError here)
        pyrouq.predict(Masked(), x, progress=False)
    assert err.value.code == 42

    def weights_only(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
        return x @ w

    pyro.set_rng_seed(0)
    plain = pyrouq.predict(weights_only, [x], num_samples=3, progress=False)
    pyro.set_rng_seed(0)
    after_empty = pyrouq.predict(weights_only, [x[:0], x], num_samples=3, progress=False)
    assert torch.equal(plain.probs, after_empty.probs)


# -- KLWeightedELBO(1) is Trace_ELBO for any model and guide ------------------------------------


def _losses(model, guide, *args, seed=0):
    """Trace_ELBO's and KLWeightedELBO(1)'s loss on one draw of the same seed."""
    from pyro.infer import Trace_ELBO

    out = []
    guide(*args)  # an autoguide sets itself up on its first call, drawing from the stream
    for elbo in (Trace_ELBO(), pyrouq.KLWeightedELBO(1.0)):
        pyro.set_rng_seed(seed)
        out.append(float(elbo.loss(model, guide, *args)))
    return out


def test_constrained_sites_of_autoguides_keep_their_log_jacobian():
    """An autoguide draws a positive site as a Delta of exp(z), its log-Jacobian as its
    density: the KL registered for Delta left that out (q(log s) of an untouched LogNormal
    ended at loc -1.07 instead of 0)."""
    from pyro.infer.autoguide import AutoDiagonalNormal, AutoLowRankMultivariateNormal

    def model(x, y=None):
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        h = pyro.sample("h", dist.HalfNormal(2.0))
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w, 1.0 + 0 * s * h), obs=y)

    x, y = torch.randn(10, 3), torch.randn(10)
    for make in (AutoNormal, AutoDiagonalNormal, AutoLowRankMultivariateNormal):
        pyro.clear_param_store()
        guide = make(model)
        theirs, ours = _losses(model, guide, x, y)
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-5), make.__name__


def test_a_models_own_scale_and_mask_on_a_prior_count_as_in_trace_elbo():
    from pyro import poutine

    def model(x, y=None, how="plain"):
        prior = dist.Normal(0.0, 1.0).expand([3]).to_event(1)
        if how == "scaled":
            with poutine.scale(scale=0.1):
                w = pyro.sample("w", prior)
        elif how == "masked":
            w = pyro.sample("w", prior.mask(False))
        else:
            w = pyro.sample("w", prior)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)

    x, y = torch.randn(10, 3), torch.randn(10)
    losses = {}
    for how in ("plain", "scaled", "masked"):
        pyro.clear_param_store()
        guide = AutoNormal(lambda x, y=None, how=how: model(x, y, how))
        theirs, ours = _losses(lambda x, y=None, how=how: model(x, y, how), guide, x, y)
        assert ours == pytest.approx(theirs, rel=1e-6), how
        losses[how] = ours
    assert losses["scaled"] != losses["plain"] != losses["masked"]  # the prior's weight counts


def test_a_discrete_guide_site_is_refused_not_left_unlearned():
    """Without a score-function term a Bernoulli guide's parameter never moved (q(z=1) stayed
    0.5 where Trace_ELBO reaches 0.95)."""
    from pyro.nn import PyroParam

    class Model(PyroModule):
        def forward(self, x, y=None):
            z = pyro.sample("z", dist.Bernoulli(0.5))
            with pyro.plate("data", 20, subsample_size=x.shape[0]):
                pyro.sample("obs", dist.Normal(z * 2.0 + 0 * x[:, 0], 1.0), obs=y)

    class Guide(PyroModule):
        def __init__(self):
            super().__init__()
            self.p = PyroParam(torch.tensor(0.5), constraint=dist.constraints.unit_interval)

        def forward(self, x, y=None):
            pyro.sample("z", dist.Bernoulli(self.p))

    x, y = torch.zeros(20, 1), torch.full((20,), 2.0)
    with pytest.raises(ValueError) as caught:
        pyrouq.fit(Model(), Guide(), [(x, y)], num_data=20, epochs=1, progress=False)
    assert str(caught.value).startswith(
        "The guide draws its site 'z' from Bernoulli, which has no reparameterised sampler (a "
        "discrete site): KLWeightedELBO and fit() take gradients through the guide's draws only"
    )
    assert "pyro.infer.TraceEnum_ELBO with pyro.infer.SVI" in str(caught.value)


def test_an_enumerated_site_left_out_of_the_guide_is_refused_with_pyros_way():
    from pyro import poutine

    model = EnumeratedMixture()
    guide = AutoNormal(poutine.block(model, hide=["z"]))  # Pyro's recipe for enumeration
    x, y = torch.zeros(20, 1), torch.randn(20)
    with pytest.raises(ValueError) as caught:
        pyrouq.fit(model, guide, [(x, y)], num_data=20, epochs=1, progress=False)
    assert (
        "EnumeratedMixture has discrete latent site(s) ['z'], which its guide leaves out for "
        in str(caught.value)
    )
    assert "pyro.infer.SVI with pyro.infer.TraceEnum_ELBO" in str(caught.value)


class _Regression(PyroModule):
    """y = w x[:, 0] + noise, w ~ Normal(0, 1): real-valued targets."""

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=y)


def test_per_example_weights_deep_plates_and_a_regressions_default_kl_weight():
    """A tensor poutine.scale crashed fit()'s N/B check; three nested plates collided with
    vectorized particles (nesting fixed at 2); a regression written in Pyro got the
    classifiers' kl_weight 0.02 (its posterior's spread a fifth of the exact one's)."""
    from pyro import poutine

    class Weighted(PyroModule):
        def forward(self, x, y=None):
            w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
            weights = torch.ones(len(x))
            weights[0] = 2.0
            with pyro.plate("data", 20, subsample_size=len(x)), poutine.scale(scale=weights):
                pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)

    x = torch.randn(20, 3)
    y = (x[:, 0] > 0).long()
    pyro.clear_param_store()
    model = Weighted()
    result = pyrouq.fit(model, AutoNormal(model), [(x[:10], y[:10]), (x[10:], y[10:])],
                        num_data=20, epochs=1, progress=False, seed=0)  # fmt: skip
    assert result.history[0].kl > 0

    class Deep(PyroModule):
        def forward(self, x, y=None):
            w = pyro.sample("w", dist.Normal(0.0, 1.0))
            with pyro.plate("a", 2, dim=-3), pyro.plate("b", 2, dim=-2):
                with pyro.plate("data", x.shape[0], dim=-1):
                    pyro.sample("obs", dist.Normal(w * x[:, 0], 1.0), obs=y)

    pyro.clear_param_store()
    model = Deep()
    result = pyrouq.fit(model, AutoNormal(model), [(x, torch.randn(20))], num_data=20, epochs=1,
                        num_particles=3, vectorize_particles=True, progress=False)  # fmt: skip
    assert math.isfinite(result.history[0].loss)

    pyro.clear_param_store()
    model = _Regression()
    result = pyrouq.fit(model, AutoNormal(model), [(x, 0.8 * x[:, 0])], num_data=20, epochs=2,
                        progress=False)  # fmt: skip
    for record in result.history:  # loss = nll + kl_weight * kl with kl_weight = 1
        assert record.loss == pytest.approx(record.nll + record.kl, rel=1e-6)


def test_a_pyro_model_written_as_a_plain_module_trains_its_params_and_is_checked(tmp_path):
    """As a PyroModule is: its pyro.param trained (it stayed at its start), the N/B check,
    and a save() message that names what it may be."""

    class Module(nn.Module):
        def forward(self, x, y=None):
            b = pyro.param("module_b", torch.zeros(2))
            w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
            with pyro.plate("data", len(x)):  # no N/B factor
                pyro.sample("obs", dist.Categorical(logits=x @ w + b), obs=y)
            return x @ w + b

    pyro.clear_param_store()
    x, y = torch.randn(20, 3), torch.ones(20, dtype=torch.long)  # all class 1: b[1] grows
    model = Module()
    guide = AutoNormal(model)
    with pytest.warns(UserWarning, match="observes its targets without the factor N/B"):
        pyrouq.fit(model, guide, [(x[:10], y[:10]), (x[10:], y[10:])], epochs=10, lr=0.1,
                   num_data=20, progress=False, seed=0)  # fmt: skip
    b = pyro.param("module_b").detach()
    assert float(b[1] - b[0]) > 1.0
    with pytest.raises(pyrouq.CheckpointError, match="if it is a Pyro model of your own"):
        pyrouq.save(tmp_path / "unused.pt", model, guide)


def test_masked_priors_a_models_own_kl_weight_and_non_discrete_samplers_without_rsample():
    """Two .mask()ed distributions: torch's registered KL kept the entries both masks keep
    (and gave a float 0.0 for two masks of False); a model's own default_kl_weight stays its
    default for real targets; a continuous guide site without rsample is not called discrete."""
    x, y = torch.randn(6, 3), torch.randn(6)

    def masked_model(mask):
        def model(x, y=None):
            w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3]).mask(mask).to_event(1))
            with pyro.plate("data", 6):
                pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)

        return model

    def masked_guide(mask):
        def guide(x, y=None):
            pyro.sample("w", dist.Normal(torch.full((3,), 0.5), 0.3).mask(mask).to_event(1))

        return guide

    different = (torch.tensor([True, True, False]), torch.tensor([True, False, True]))
    for model_mask, guide_mask in (different, (False, False)):
        theirs, ours = _losses(masked_model(model_mask), masked_guide(guide_mask), x, y)
        assert ours == pytest.approx(theirs, rel=1e-6), (model_mask, guide_mask)
    # masked alike (a mirrored guide): the exact KL of the entries kept, no estimate's noise
    same = torch.tensor([True, False, True])
    exact = torch.distributions.kl_divergence(dist.Normal(0.5, 0.3), dist.Normal(0.0, 1.0))
    for _ in range(3):
        terms = pyrouq.KLWeightedELBO(1.0).terms(masked_model(same), masked_guide(same), x, y)
        assert float(terms.kl) == pytest.approx(2 * float(exact), rel=1e-6)

    pyro.clear_param_store()
    model = _Regression()
    model.default_kl_weight = 0.1  # its own default, which fit() keeps
    record = pyrouq.fit(model, AutoNormal(model), [(x, y)], num_data=6, epochs=1,
                        progress=False).history[0]  # fmt: skip
    assert record.loss == pytest.approx(record.nll + 0.1 * record.kl, rel=1e-6)

    def circular(x, y=None):
        pyro.sample("angle", dist.VonMises(0.0, 1.0))

    def circular_guide(x, y=None):
        pyro.sample("angle", dist.VonMises(pyro.param("mu", torch.tensor(0.1)), 2.0))

    with pytest.raises(ValueError) as caught:
        pyrouq.KLWeightedELBO(1.0).loss(circular, circular_guide, x, y)
    assert "(torch has no rsample for VonMises)" in str(caught.value)
    assert "discrete" not in str(caught.value)

    class Jitter(dist.TorchDistribution):  # a distribution of one's own: no support declared
        arg_constraints: ClassVar[dict] = {}

        def sample(self, sample_shape=()):
            return torch.randn(sample_shape)

        def log_prob(self, value):
            return -0.5 * value**2

    with pytest.raises(ValueError, match=r"\(torch has no rsample for Jitter\)"):
        pyrouq.KLWeightedELBO(1.0).loss(
            circular, lambda x, y=None: pyro.sample("angle", Jitter()), x, y
        )

    def jittered(x, y=None):  # a latent site of its own distribution, left out of the guide
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        z = pyro.sample("z", Jitter())
        with pyro.plate("data", len(x)):
            pyro.sample("obs", dist.Normal(x[:, 0] * w + z, 1.0), obs=y)

    def w_alone(x, y=None):
        pyro.sample("w", dist.Normal(pyro.param("w_loc", torch.tensor(0.0)), 1.0))

    # asked whether the site is discrete (to enumerate), torch's Distribution.support raised
    # NotImplementedError for it: it counts as continuous, and the guide is told what it lacks
    for draws in (dict(guide=w_alone), dict(posterior_samples={"w": torch.zeros(3)})):
        with pytest.raises(ValueError, match=r"model.s latent site 'z' \(\) is not in it"):
            pyrouq.predict(jittered, x, num_samples=3 if "guide" in draws else None,
                           progress=False, **draws)  # fmt: skip


def test_a_bayesian_layers_local_reparameterization_is_documented_as_fit_applies_it():
    """BayesianLinear's docs called sample_with "the training path of KLWeightedELBO": fit()
    trains a model of one's own holding the layer through its sites, and warns so."""

    class WithLayer(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = pyrouq.BayesianLinear(4, 3, local_reparameterization=True)

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", self.num_data, subsample_size=len(x)):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x, y = data()
    pyro.clear_param_store()
    model = WithLayer()
    with pytest.warns(UserWarning, match=r"layer 'fc' \(BayesianLinear\) has local_repa"):
        pyrouq.fit(model, AutoNormal(model), [(x, y)], num_data=48, epochs=1, progress=False)
    for layer in (pyrouq.BayesianLinear, pyrouq.BayesianConv2d):
        doc = " ".join((layer.__doc__ or "").split())
        assert "the training path of" not in doc
    doc = " ".join((pyrouq.BayesianLinear.__doc__ or "").split())
    assert "and warn that the flag is not applied" in doc


class _Shaped(BNN):
    """BNN whose logits come out reshaped by ``how``: transposed (C, B), with a leading 1
    (1, B, C), with a leading dim of 2 draws (2, B, C), or those of the first 10 inputs
    only."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def forward(self, x, y=None):
        full = self.fc2(F.relu(self.fc1(x)))
        logits = {"T": full.T, "lead": full[None], "draws": full.expand(2, *full.shape),
                  "first": full[:10]}[self.how]  # fmt: skip
        if self.how == "lead":
            pyro.deterministic("logits", logits)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=full), obs=y)
        return logits


@pytest.mark.parametrize("how", ["T", "lead", "draws", "first"])
@pytest.mark.parametrize("source", ["prior", "guide", "posterior_samples"])
def test_logits_not_one_row_per_input_are_refused_by_predict(how, source):
    """A model returning logits.T ((C, B)) was predicted as C inputs of B classes, without a
    word (and beside targets of B rows); (1, B, C) failed later as "probs of 4 dims"."""
    x, y = data()
    model = _Shaped(how)
    kwargs: dict = {"num_samples": 2}
    pyro.clear_param_store()
    if source == "guide":
        kwargs["guide"] = AutoNormal(model)
        kwargs["guide"](x, y)  # built on the model with its targets, as fit() builds it
    elif source == "posterior_samples":
        kwargs = {}
        kwargs["posterior_samples"] = {
            "fc1.weight": torch.randn(2, 8, 4), "fc1.bias": torch.randn(2, 8),
            "fc2.weight": torch.randn(2, 3, 8), "fc2.bias": torch.randn(2, 3),
        }  # fmt: skip
    recorded = "recorded a 'logits' site" if how == "lead" else "returned logits"
    shape = {"T": (3, 48), "lead": (1, 48, 3), "draws": (2, 48, 3), "first": (10, 3)}[how]
    why = "one row per input" if len(shape) == 2 else "one run gives one draw, and predict() "
    with pytest.raises(ValueError) as err:
        pyrouq.predict(model, x, **kwargs)
    assert str(err.value).startswith(
        f"predict(): _Shaped {recorded} of shape {shape} on a batch of 48 inputs, expected "
        f"class logits (48, C): {why}"
    ), str(err.value)
    assert str(err.value).endswith("Return or record logits of shape (B, C).")


class _Transposing(nn.Module):
    """A Pyro model written as an ``nn.Module`` (``forward(x, y)``) with no latent site,
    which predict() runs as a plain network, returning logits.T."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.num_data = 48

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", self.num_data, subsample_size=len(x)):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits.T


def test_logits_not_one_row_per_input_of_a_network_without_latent_sites_are_refused():
    """The plain path (an nn.Module whose forward(x, y) samples no latent site, or a plain
    network) read (C, B) logits as C inputs of B classes, without a word."""
    x, _ = data()
    with pytest.raises(ValueError) as err:
        pyrouq.predict(_Transposing(), x, progress=False)
    assert str(err.value) == (
        "predict(): _Transposing returned logits of shape (3, 48) on a batch of 48 inputs, "
        "expected class logits (48, C): one row per input, in the order given (not logits.T, "
        "nor those of a subsample of the inputs)."
    )


class _TakesLengths(BNN):
    """BNN whose forward takes another input between x and y."""

    def forward(self, x, lengths, y=None):
        return super().forward(x, y)


class _Needs(BNN):
    """BNN whose forward needs a third input."""

    def forward(self, x, y, lengths):
        return super().forward(x, y)


class _Renamed(BNN):
    """BNN whose forward names its inputs otherwise, with an extra one that has a default."""

    def forward(self, inputs, targets=None, mask=None):
        return super().forward(inputs, targets)


def test_a_forward_that_fit_cannot_call_as_model_x_y_is_refused_first():
    """forward(x, lengths, y=None) took y as lengths and left obs unobserved: Pyro's autoguide
    then said "Continuous inference cannot handle discrete sample site 'obs'"."""
    x, y = data()
    for model, why in (
        (_TakesLengths(), "y would fill its parameter 'lengths'"),
        (_Needs(), "it also needs 'lengths'"),
    ):
        pyro.clear_param_store()
        with pytest.raises(TypeError) as err:
            pyrouq.fit(model, AutoNormal(model), [(x, y)], num_data=48, epochs=1, progress=False)
        name = type(model).__name__
        assert str(err.value).startswith(
            f"fit() calls {name}(x, y), as Pyro's SVI calls a model, but its forward("
        ), str(err.value)
        assert f") takes them otherwise: {why}. Write forward(x, y=None) (the inputs, then " in (
            str(err.value)
        )
    # other names, an extra parameter with a default: called as model(x, y) fine
    fitted(_Renamed())
