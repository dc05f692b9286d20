"""A reference posterior beside a mean-field guide, as README's MCMC paragraph and tutorial 08
walk through it: fit and mcmc on one small network, predict with both, export both for arviz,
save and reload the chains, the seeds' documented semantics, float64 models."""

from __future__ import annotations

import math
import warnings

import arviz as az
import pytest
import torch
from torch import nn

import pyrouq


def _data(n=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 4 - 2
    return x, torch.sin(x[:, 0]) + 0.3 * torch.randn(n, generator=g)


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(1, 3), nn.Tanh(), nn.Linear(3, 1)).to(dtype)
    return pyrouq.bayesian(net, likelihood=pyrouq.Gaussian(scale=0.3))


def _chains(model, x, y, **kwargs):
    options = {"num_samples": 15, "warmup_steps": 15, "num_chains": 2, "seed": 0}
    return pyrouq.mcmc(
        model, x, y, progress=False, parallel=False, max_tree_depth=4, **{**options, **kwargs}
    )


def test_chain_c_runs_on_seed_plus_c_as_documented():
    # README and mcmc()'s docstring: nearby seeds share chains
    x, y = _data()
    both = _chains(_model(), x, y, seed=5)
    second = _chains(_model(), x, y, seed=6, num_chains=1)
    for site, value in both.samples.items():
        assert torch.equal(value[1], second.samples[site][0])
        assert not torch.equal(value[0], second.samples[site][0])


def test_a_loaded_result_exports_once_its_model_is_set_on_data_passed(tmp_path):
    # MCMCResult's docstring: after load, set result.model and pass x and y
    x, y = _data()
    model = _model()
    result = _chains(model, x, y)
    back = pyrouq.load(pyrouq.save(tmp_path / "chains.pt", result))
    assert back.model is None and back.x is None and back.y is None
    new_x, new_y = _data(12, seed=1)
    # the first refusal says all that is needed; followed, the export works (it asked for the
    # data alone, then, given x= and y=, for result.model)
    with pytest.raises(ValueError) as refused:
        pyrouq.to_inference_data(back)
    assert str(refused.value).endswith(
        "this one lacks result.model, result.x and result.y: set result.model = model (the "
        "model its chains ran) and pass x= and y=, then to_inference_data(result, x=x, y=y) "
        "(or set result.x and result.y instead of passing)."
    )
    with pytest.raises(
        ValueError, match=r"lacks result\.model: set result\.model = model .*again\.$"
    ):
        pyrouq.to_inference_data(back, x=new_x, y=new_y)  # x and y given: the model is missing
    with pytest.raises(ValueError, match=r"lacks result\.model and result\.y: .* pass y=, then"):
        pyrouq.to_inference_data(back, x=new_x)
    back.model = model
    only_y = r"lacks result\.y: pass y=, then to_inference_data\(result, x=x, y=y\) "
    with pytest.raises(ValueError, match=only_y + r"\(or set result\.y instead of passing\)\.$"):
        pyrouq.to_inference_data(back, x=new_x)
    got = pyrouq.to_inference_data(back, x=new_x, y=new_y)
    want = pyrouq.to_inference_data(result, x=new_x, y=new_y)
    assert got.log_likelihood["obs"].shape == (2, 15, 12)
    assert (got.log_likelihood["obs"].values == want.log_likelihood["obs"].values).all()
    assert (got.observed_data["obs"].values == new_y.numpy()).all()


def _by_hand(model, draws, x, noise):
    """The mixture's mean and variance from the draws, one functional_call per draw."""
    count = next(iter(draws.values())).shape[0]
    with torch.no_grad():
        outs = torch.stack(
            [
                torch.func.functional_call(model.net, {k: v[s] for k, v in draws.items()}, (x,))
                for s in range(count)
            ]
        )
    return outs.mean(0), outs.var(0, unbiased=False) + noise**2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_guide_and_chains_side_by_side(dtype):
    x, y = _data()
    x, y = x.to(dtype), y.to(dtype)
    vi = _model(dtype)
    guide = pyrouq.mean_field_guide(vi)
    loader = pyrouq.ArrayLoader(x, y, batch_size=30, seed=0)
    fit = pyrouq.fit(vi, guide, loader, epochs=60, progress=False, seed=0)
    assert fit.kl_weight == 1.0  # regression: the exact ELBO, the posterior NUTS samples
    reference = _model(dtype)
    chains = _chains(reference, x, y)
    assert all(v.dtype == dtype for v in chains.samples.values())

    grid = torch.linspace(-3, 3, 7, dtype=dtype).unsqueeze(1)
    nuts = pyrouq.predict(reference, grid, posterior_samples=chains, progress=False)
    assert nuts.loc.shape == (30, 7, 1) and nuts.loc.dtype == dtype
    mean, variance = _by_hand(reference, chains.draws(), grid, 0.3)
    torch.testing.assert_close(nuts.mean, mean)
    torch.testing.assert_close(nuts.variance, variance)
    torch.manual_seed(0)
    guided = pyrouq.predict(vi, grid, guide, num_samples=30, progress=False)
    assert guided.loc.shape == nuts.loc.shape and guided.loc.dtype == dtype

    idata = pyrouq.to_inference_data(chains)
    assert idata.posterior["0.weight"].shape == (2, 15, 3, 1)
    assert idata.posterior["0.weight"].dtype == idata.posterior_predictive["loc"].dtype
    assert "sample_stats" in idata.groups() and idata.sample_stats["energy"].shape == (2, 15)
    idv = pyrouq.to_inference_data(vi, guide, x, y, num_samples=30)
    assert idv.posterior["0.weight"].shape == (1, 30, 3, 1)
    assert "sample_stats" not in idv.groups()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k warnings of so few draws
        loos = {"mcmc": az.loo(idata), "vi": az.loo(idv)}
        table = az.compare({"mcmc": idata, "vi": idv})
    assert all(math.isfinite(float(loo.elpd_loo)) for loo in loos.values())
    assert set(table.index) == {"mcmc", "vi"}
    # the exported log-likelihood is the draws' own: their sum at point 0, by hand
    ll = torch.as_tensor(idata.log_likelihood["obs"].values).flatten(0, 1)[:, 0]
    loc = pyrouq.predict(reference, x[:1], posterior_samples=chains, progress=False).loc
    want = torch.distributions.Normal(loc[:, 0, 0].double(), 0.3).log_prob(y[0].double())
    torch.testing.assert_close(ll, want, rtol=1e-5, atol=1e-6)
