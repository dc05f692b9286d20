"""Audit 12: NUTS (mcmc()) against closed forms and hand computations, and Pyro models of the
user's own through predict() and to_inference_data(): outputs that are not the logits of the
model's likelihood (warned of, once per call), a regression whose likelihood is not named
"obs" and sites a subclass's forward samples beside the latent sites (refused rather than
silently mispredicted)."""

from __future__ import annotations

import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive
from pyro.infer.mcmc.util import initialize_model
from torch import nn

import pyrouq
from pyrouq.likelihoods import Gaussian

N, SIGMA, TAU = 30, 0.5, 1.0


def _regression_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 2, generator=gen)
    y = x @ torch.tensor([1.0, -0.5]) + 0.3 + SIGMA * torch.randn(N, generator=gen)
    return x, y


def _closed_form(x, y):
    """The posterior of (w1, w2, b) under Normal(0, TAU) priors and Normal noise SIGMA."""
    a = torch.cat([x, torch.ones(len(x), 1)], 1).double()
    precision = a.T @ a / SIGMA**2 + torch.eye(3, dtype=torch.float64) / TAU**2
    cov = torch.linalg.inv(precision)
    return cov @ a.T @ y.double() / SIGMA**2, cov.diagonal().sqrt()


def test_nuts_potential_energy_is_the_unscaled_full_data_log_joint():
    """mcmc() sets num_data = N: the density NUTS moves on is -log p(w) - sum log p(y | x, w),
    no N/B factor (a hand computation, float64)."""
    x, y = _regression_data()
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=Gaussian(SIGMA), prior=TAU)
    model.num_data = N  # as mcmc() sets it for its run
    _, potential, _, _ = initialize_model(model, model_args=(x, y))
    w = {"weight": torch.tensor([[0.2, 0.1]]), "bias": torch.tensor([0.05])}
    flat = torch.tensor([0.2, 0.1, 0.05], dtype=torch.float64)
    a = torch.cat([x, torch.ones(N, 1)], 1).double()
    hand = -(
        torch.distributions.Normal(0.0, TAU).log_prob(flat).sum()
        + torch.distributions.Normal(a @ flat, SIGMA).log_prob(y.double()).sum()
    )
    assert float(potential(w)) == pytest.approx(float(hand), rel=1e-5)


def test_nuts_on_bayesian_linear_regression_matches_the_closed_form():
    x, y = _regression_data()
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=Gaussian(SIGMA), prior=TAU)
    result = pyrouq.mcmc(model, x, y, 300, 150, 1, seed=0, progress=False)
    assert model.num_data is None  # restored
    draws = result.draws()
    got = torch.cat([draws["weight"].reshape(-1, 2), draws["bias"].reshape(-1, 1)], 1).double()
    mean, sd = _closed_form(x, y)
    # 300 draws (ESS ~ 300): the mean within 0.3 posterior sd (~5 MCSE), the sd within 25 %
    assert ((got.mean(0) - mean).abs() < 0.3 * sd).all(), (got.mean(0), mean)
    assert ((got.std(0) / sd - 1).abs() < 0.25).all(), (got.std(0), sd)
    # predict() on the draws: the network with each draw's weights, noise SIGMA
    preds = pyrouq.predict(model, x[:4], posterior_samples=result)
    hand = x[:4] @ draws["weight"].reshape(-1, 2).T + draws["bias"].reshape(1, -1)
    torch.testing.assert_close(preds.loc[..., 0], hand.T)
    assert torch.all(preds.scale == SIGMA)


def _classes():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(24, 2, generator=gen)
    return x, (x[:, 0] > 0).long()


def _w_draws(num=6):
    return {"w": torch.randn(num, 2, 2, generator=torch.Generator().manual_seed(2))}


def tempered(x, y=None):
    """Returns logits, but draws "obs" from them divided by 5."""
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
    logits = x @ w
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=logits / 5.0), obs=y)
    return logits


_FILTER = r".*differ from those its 'obs' site is drawn from"  # the regex the warning names


def test_predict_warns_once_of_returned_logits_unlike_those_obs_is_drawn_from():
    """predict() gave softmax(x @ w) (0.97 for class 0) where the model's own predictive is
    softmax(x @ w / 5) (0.67): it warns, once per call (it was a refusal, checked on every
    draw of every batch: 27 % of a predict() call), and the regex it names silences it."""
    x, _ = _classes()
    with pytest.warns(UserWarning) as record:
        preds = pyrouq.predict(
            tempered, x[:5], posterior_samples=_w_draws(), batch_size=2, progress=False
        )
    assert len(record) == 1, [str(w.message) for w in record]
    message = str(record[0].message)
    assert message.startswith(
        "predict(): the class probabilities reported for tempered, the softmax of the logits "
        "the model returned or recorded (["
    )
    assert "differ from those its 'obs' site is drawn from (Categorical: [" in message
    assert "For predictions of the observed labels, return, or record with " in message
    assert "If the difference is intended (label smoothing, a noise model whose " in message
    assert "warnings.filterwarnings('ignore', message=r\"" + _FILTER + '")' in message
    assert record[0].filename == __file__
    # the softmax of the returned logits, as before
    torch.testing.assert_close(preds.probs, (x[:5] @ _w_draws()["w"]).softmax(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=_FILTER)
        pyrouq.predict(tempered, x[:5], posterior_samples=_w_draws(), progress=False)


def test_a_smoothed_likelihood_predicts_its_clean_probabilities_with_a_warning():
    """Label smoothing (0.9 softmax(l) + 0.1 / C at "obs") was refused with no way out: the
    user wants softmax(l), the returned logits' probabilities."""

    def smoothed(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        logits = x @ w
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(probs=0.9 * logits.softmax(-1) + 0.05), obs=y)
        return logits

    x, _ = _classes()
    with pytest.warns(UserWarning, match=_FILTER):
        preds = pyrouq.predict(smoothed, x[:5], posterior_samples=_w_draws(), progress=False)
    torch.testing.assert_close(preds.probs, (x[:5] @ _w_draws()["w"]).softmax(-1))


@pytest.mark.parametrize("pattern", ["autocast", "rounded"])
def test_half_precision_logits_of_the_likelihood_raise_no_alarm(pattern):
    """The autocast pattern (logits computed in bfloat16, returned so, "obs" drawn from their
    float32 cast), and float32 logits returned rounded to float16: a tolerance of float32's
    rounding and a softmax taken in half precision refused them ("[0.924, ...] vs softmax
    [0.922, ...]")."""

    def autocast(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        if pattern == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = x @ w
            drawn = logits.float()
        else:
            drawn = x @ w
            logits = drawn.half()
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=drawn), obs=y)
        return logits

    x, _ = _classes()
    draws = {"w": 4.0 * _w_draws()["w"]}  # large logits: probabilities off by 1e-3 in half
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        preds = pyrouq.predict(autocast, x, posterior_samples=draws, progress=False)
    assert preds.probs.shape == (6, 24, 2)


def test_logits_the_likelihood_draws_from_predict_as_pyro_predictive_does():
    """No false alarm: a random effect added to the recorded logits (a local latent per input),
    and a likelihood named "label": predict() is Pyro's Predictive on the same draws."""

    def effect(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            logits = pyro.deterministic("logits", x @ w + z[:, None] * torch.tensor([1.0, -1.0]))
            pyro.sample("label", dist.Categorical(logits=logits), obs=y)
        return logits

    x, _ = _classes()
    draws = _w_draws()
    preds = pyrouq.predict(effect, x[:5], posterior_samples=draws, progress=False, seed=3)
    assert preds.probs.shape == (6, 5, 2)
    # the weights are the draws' (z, per input, from its prior): Predictive on w alone
    fixed = pyrouq.predict(tempered_free, x[:5], posterior_samples=draws, progress=False)
    reference = Predictive(tempered_free, posterior_samples=draws, return_sites=["_RETURN"])
    torch.testing.assert_close(fixed.probs, reference(x[:5])["_RETURN"].softmax(-1))


def tempered_free(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
    logits = x @ w
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def test_to_inference_data_warns_of_recorded_logits_unlike_those_obs_is_drawn_from():
    """Its posterior_predictive "probs" are the softmax of the recorded logits, not the
    model's predictive probabilities: a warning, once (it was a refusal)."""

    def recorded(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        logits = pyro.deterministic("logits", x @ w)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits * 3.0), obs=y)

    x, y = _classes()
    pyro.clear_param_store()
    guide = pyro.infer.autoguide.AutoNormal(recorded)
    with pytest.warns(UserWarning) as record:
        pyrouq.to_inference_data(recorded, guide, x, y, num_samples=3, seed=0)
    found = [str(w.message) for w in record if "'obs' site is drawn from" in str(w.message)]
    assert len(found) == 1, found
    assert found[0].startswith(
        "to_inference_data(): the class probabilities reported for recorded, the softmax"
    )
    pyro.clear_param_store()


def test_predict_refuses_a_regression_whose_likelihood_is_not_named_obs():
    """Its two means per input were taken for the logits of two classes: probs of shape
    (S, N, 2), without a word."""

    def regression(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        mean = x @ w
        with pyro.plate("data", x.shape[0]):
            pyro.sample("target", dist.Normal(mean, 0.5).to_event(1), obs=y)
        return mean

    x, _ = _classes()
    with pytest.raises(TypeError) as err:
        pyrouq.predict(regression, x[:5], posterior_samples=_w_draws(), progress=False)
    assert str(err.value).startswith(
        "predict(): regression draws no 'obs' site on the inputs alone, and a site drawn around "
        "the outputs ('target', a Normal whose mean they are): its 2 outputs per input may be "
        "the means of continuous targets, which predict() would take for the logits of 2 "
        "classes."
    )
    assert "A regression model of your own: draw its predictions with pyro.infer." in (
        str(err.value)
    )


def test_a_logit_normal_classifier_is_not_called_a_regression():
    """Its labels are drawn only where y is given: the refusal said it "observes continuous
    targets ... a regression model"; it names the site and how to draw the labels."""

    def logit_normal(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        logits = x @ w
        with pyro.plate("data", x.shape[0]):
            z = pyro.sample("z", dist.Normal(logits, 0.5).to_event(1))
            if y is not None:
                pyro.sample("obs", dist.Categorical(logits=z), obs=y)
        return logits

    x, _ = _classes()
    with pytest.raises(TypeError) as err:
        pyrouq.predict(logit_normal, x[:5], posterior_samples=_w_draws(), progress=False)
    message = str(err.value)
    assert "a site drawn around the outputs ('z', a Normal whose mean they are)" in message
    assert "regression model" not in message.split("A regression model of your own")[0]
    assert "draw its labels at 'obs' whether or not y is given (pyro.sample('obs', " in message


def test_predict_refuses_a_count_likelihood_at_obs():
    """A Poisson model's two rates per input (their logs) were softmaxed as 2 classes."""

    def counts(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2, 2]).to_event(2))
        log_rate = x @ w
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Poisson(log_rate.exp()).to_event(1), obs=y)
        return log_rate

    x, _ = _classes()
    with pytest.raises(TypeError) as err:
        pyrouq.predict(counts, x[:5], posterior_samples=_w_draws(), progress=False)
    assert str(err.value).startswith(
        "predict(): counts observes counts (its 'obs' site is drawn from Poisson): a count "
        "model, whose 2 outputs per input predict() would take for the logits of 2 classes. "
        "Draw its predictions with pyro.infer.Predictive"
    )


class _Tempered(pyrouq.BayesianNetwork):
    """A subclass whose forward draws a temperature beside the network's weights."""

    def forward(self, x, y=None):
        t = pyro.sample("temp", dist.LogNormal(0.0, 0.5))
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        out = self.outputs(x, weights) / t
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=out), obs=y)
        return out


def test_mcmc_refuses_sites_a_subclass_forward_samples_beside_the_latent_sites():
    """NUTS sampled "temp", the result dropped it, and predict() ran the network without it."""
    x, y = _classes()
    model = _Tempered(nn.Linear(2, 2))
    before = torch.get_rng_state()
    with pytest.raises(ValueError) as err:
        pyrouq.mcmc(model, x, y, 5, 5, 1, seed=0, progress=False)
    assert str(err.value).startswith(
        "mcmc(): _Tempered samples ['temp'] in its forward beside its latent sites ['weight', "
        "'bias']: NUTS would sample them too, but the result keeps the latent sites alone"
    )
    assert "pyro.infer.MCMC(NUTS(model))" in str(err.value)
    assert model.num_data is None and model.training  # put back
    assert torch.equal(torch.get_rng_state(), before)


def test_mcmc_leaves_the_global_random_state_and_gives_seeded_draws():
    """The forward traced before the chains draws nothing from the caller's streams."""
    x, y = _classes()
    model = pyrouq.bayesian(nn.Linear(2, 2))
    before = torch.get_rng_state()
    first = pyrouq.mcmc(model, x, y, 5, 5, 1, seed=4, progress=False)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(123)  # another global state: the same seeded draws
    again = pyrouq.mcmc(model, x, y, 5, 5, 1, seed=4, progress=False)
    for site in first.samples:
        assert torch.equal(first.samples[site], again.samples[site])


class _Penalised(pyrouq.BayesianNetwork):
    """A subclass whose forward adds an input-gradient penalty (autograd inside forward)."""

    def forward(self, x, y=None):
        x = x.detach().requires_grad_(True)
        weights = {site: pyro.sample(site, prior) for site, prior in self.priors().items()}
        out = self.outputs(x, weights)
        (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        pyro.factor("penalty", -grad.pow(2).sum())
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=out), obs=y)
        return out


def test_mcmc_runs_a_forward_that_needs_gradients():
    """The check of the forward's sites traced it under torch.no_grad(): "element 0 of
    tensors does not require grad and does not have a grad_fn" before any chain ran."""
    x, y = _classes()
    result = pyrouq.mcmc(_Penalised(nn.Linear(2, 2)), x, y, 5, 5, 1, seed=0, progress=False)
    assert sorted(result.samples) == ["bias", "weight"]


class _Passing(pyrouq.BayesianNetwork):
    def forward(self, x, y=None):
        return super().forward(x, y)


def test_mcmc_in_parallel_leaves_the_param_store_as_it_was():
    """The check's trace ran the forward here, which put the point estimates (unselected
    parameters) into this process's param store ("..net$$$0.weight"), where the chains,
    run in other processes, put none."""
    x, y = _classes()
    net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    model = _Passing(net, select=["1.weight", "1.bias"])
    pyro.clear_param_store()
    pyrouq.mcmc(model, x, y, 5, 5, 2, seed=0, progress=False, parallel=True)
    assert list(pyro.get_param_store().keys()) == []
