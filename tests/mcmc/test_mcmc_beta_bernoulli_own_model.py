"""Audit of NUTS and of Pyro models of one's own: a Beta-Bernoulli model of one's own sampled by
Pyro's NUTS and predicted by predict() against its closed-form posterior, the decomposition of
MCMC draws by hand; to_inference_data() of a model of one's own without a guide, draws grouped
by chain for a model of one's own, and a BatchEnsemble given to mcmc(), each told what to do."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import toy_data
from pyro import poutine
from pyro.infer import MCMC, NUTS
from pyro.nn import PyroModule, PyroSample
from torch import nn

import pyrouq
from pyrouq import batchensemble, bayesian, mcmc, predict, to_inference_data

QUIET = {"progress": False}
A, B = 2.0, 3.0  # the Beta prior of the coin's probability


def coin(x, y=None):
    """A Beta-Bernoulli model of one's own, written as a classifier of two classes."""
    p = pyro.sample("p", dist.Beta(A, B))
    logits = torch.stack([torch.log1p(-p), torch.log(p)]).expand(x.shape[0], 2)
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
    return logits


def _coin_run(num_samples=300, warmup_steps=150):
    g = torch.Generator().manual_seed(0)
    y = (torch.rand(30, generator=g) < 0.3).long()
    x = torch.zeros(30, 1)
    pyro.set_rng_seed(0)
    run = MCMC(NUTS(coin), num_samples, warmup_steps, disable_progbar=True)
    run.run(x, y)
    return x, y, run


class OwnLinear(PyroModule):
    """A PyroModule of one's own with PyroSample priors and a subsampled plate."""

    def __init__(self):
        super().__init__()
        self.fc = PyroModule[nn.Linear](3, 2)
        self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 3]).to_event(2))
        self.fc.bias = PyroSample(dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        self.num_data = 20

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


# --------------------------------------------------------------------------------------------
# against independent references
# --------------------------------------------------------------------------------------------


def test_a_beta_bernoulli_model_of_ones_own_is_predicted_as_its_closed_form_posterior():
    az = pytest.importorskip("arviz")
    _, y, run = _coin_run()
    k, n = int(y.sum()), len(y)
    a, b = A + k, B + n - k  # conjugate: Beta(A + k, B + n - k)
    mean, sd = a / (a + b), math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
    draws = run.get_samples()["p"]
    preds = predict(coin, torch.zeros(4, 1), posterior_samples=run, **QUIET)
    assert preds.probs.shape == (300, 4, 2)
    # each draw's class-1 probability is its p, for every input
    torch.testing.assert_close(preds.probs[..., 1], draws[:, None].expand(300, 4))
    taken = preds.probs[:, 0, 1].double().numpy()
    assert abs(taken.mean() - mean) < 3 * float(az.mcse(taken))
    assert abs(taken.std() - sd) < 3 * float(az.mcse(taken, method="sd"))
    # the predictive mean of a coin is its posterior mean
    assert abs(float(preds.mean_probs[0, 1]) - float(draws.mean())) < 1e-6


def test_mcmc_draws_decompose_by_hand_as_guide_draws_do():
    x, y = toy_data(16)
    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    result = mcmc(model, x, y, 6, 4, 2, seed=0, parallel=False, **QUIET)
    preds = predict(model, x, posterior_samples=result, **QUIET)
    # by hand, from the draws: chain after chain
    draws = result.draws()
    probs = []
    for s in range(12):
        h = torch.tanh(x @ draws["0.weight"][s].T + draws["0.bias"][s])
        probs.append(torch.softmax(h @ draws["2.weight"][s].T + draws["2.bias"][s], -1))
    probs = torch.stack(probs)
    torch.testing.assert_close(preds.probs, probs)
    mean = probs.mean(0)
    total = -(mean * mean.log()).sum(-1)
    aleatoric = -(probs * probs.log()).sum(-1).mean(0)
    u = preds.uncertainty()
    torch.testing.assert_close(u.total, total)
    torch.testing.assert_close(u.aleatoric, aleatoric)
    torch.testing.assert_close(u.epistemic, total - aleatoric)
    torch.testing.assert_close(u.total, u.aleatoric + u.epistemic)


# --------------------------------------------------------------------------------------------
# refusals that say what to do
# --------------------------------------------------------------------------------------------


def _conditioned():
    return poutine.condition(OwnLinear(), data={"fc.bias": torch.zeros(2)})


@pytest.mark.parametrize(
    "make, sites, name",
    [
        (OwnLinear, "['fc.weight', 'fc.bias']", "OwnLinear"),
        (lambda: coin, "['p']", "coin"),
        # named '_bound_partial', the class of the partial that Pyro's handlers make
        (_conditioned, "['fc.weight']", "OwnLinear (under poutine.condition)"),
    ],
    ids=["pyromodule", "function", "poutine-wrapped"],
)
def test_to_inference_data_of_ones_own_model_without_a_guide_names_its_latent_sites(
    make, sites, name
):
    model = make()
    x, y = (torch.zeros(30, 1), torch.zeros(30).long()) if model is coin else toy_data(20)
    state = torch.get_rng_state()
    with pytest.raises(ValueError) as err:
        to_inference_data(model, None, x, y)
    assert str(err.value).startswith(
        f"to_inference_data(): {name} samples the latent sites {sites} but guide is None"
    )
    assert "to_inference_data(model, guide, x, y)" in str(err.value)
    assert "arviz.from_pyro(run)" in str(err.value)
    assert torch.equal(torch.get_rng_state(), state)  # (its trace drew from a kept state)


def test_a_plain_network_without_a_guide_is_still_told_it_has_no_posterior():
    x, y = toy_data(8)
    with pytest.raises(ValueError, match=r"Linear has no posterior to export: no latent sites"):
        to_inference_data(nn.Linear(3, 2), None, x, y)


def test_draws_of_ones_own_model_grouped_by_chain_are_told_to_flatten():
    x, y = toy_data(20)
    model = OwnLinear()
    pyro.set_rng_seed(0)
    run = MCMC(NUTS(model), num_samples=4, warmup_steps=2, disable_progbar=True)
    run.run(x, y)
    grouped = run.get_samples(group_by_chain=True)
    with pytest.raises(ValueError) as err:
        predict(model, x, posterior_samples=grouped, **QUIET)
    assert str(err.value).startswith(
        "predict(): posterior_samples: site 'fc.weight' has shape (1, 4, 2, 3), read as "
        "(chain, draw) = (1, 4) before the site's shape (2, 3): predict() takes the draws "
        "flattened, (S, *shape)."
    )
    # the flattened draws (and the run itself) are predicted, draw by draw
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in grouped.items()}
    preds = predict(model, x, posterior_samples=flat, **QUIET)
    expected = torch.softmax(
        torch.einsum("soi,ni->sno", flat["fc.weight"], x) + flat["fc.bias"][:, None], -1
    )
    torch.testing.assert_close(preds.probs, expected)
    torch.testing.assert_close(predict(model, x, posterior_samples=run, **QUIET).probs, expected)


def test_a_batchensemble_given_to_mcmc_is_told_it_has_no_latent_sites():
    x, y = toy_data(8)
    with pytest.raises(TypeError) as err:
        mcmc(batchensemble(nn.Linear(3, 2), 2), x, y, 3, 2, 1, **QUIET)
    assert str(err.value) == (
        "mcmc() samples a pyrouq Bayesian model (made by pyrouq.bayesian(), BayesianMLP, ...), "
        "got BatchEnsembleNetwork, which has no latent sites to sample: its members are point "
        "estimates, trained by fit() (predict() runs them). To sample a network's weights, make "
        "it Bayesian: pyrouq.bayesian(net), or pyrouq.rank1(net, num_members) of the network "
        "given to batchensemble() (not of the ensemble; for a BatchEnsembleMLP or "
        "BatchEnsembleLeNet, a pyrouq.MLP or LeNet of its sizes) for an ensemble whose rank-1 "
        "factors are latent; to make this existing BatchEnsemble's factors latent, use "
        "pyrouq.bayesian(ensemble, prior=...) (a prior centred on 1 for the factors, as "
        "rank1()'s Normal(1, 0.1): one centred on 0 pulls them to 0)."
    )


def test_a_model_function_given_to_mcmc_is_pointed_to_pyros_mcmc():
    x, y = toy_data(8)
    with pytest.raises(TypeError, match=r"got function; for any other Pyro model use pyro\."):
        pyrouq.mcmc(coin, x, y, 3, 2, 1, **QUIET)
