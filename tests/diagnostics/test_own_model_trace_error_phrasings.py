"""Review of 47cc9fe: a nested model's clean-up removes only its own param store entries, the
own-model trace retries on the whole data after any error but dtype/device/memory ones, a
gradient overflowing at a tiny noise floor stops fit() with finite parameters, load(module=)
names a partial of a class, and mcmc() of a BatchEnsemble names bayesian(ensemble, prior=)."""

import functools
import gc
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

import pyrouq
from pyrouq.likelihoods import Gaussian

# --------------------------------------------------------------------------------------------
# A pyrouq model named by Pyro inside a user's PyroModule (net) removes only its own entries
# --------------------------------------------------------------------------------------------


class _Head(PyroModule):
    def __init__(self):
        super().__init__()
        self.scale = PyroParam(torch.tensor(1.0), constraints.positive)

    def forward(self, x):
        return self.scale * x


class _Baseline(PyroModule):
    def __init__(self):
        super().__init__()
        self.net = _Head()

    def forward(self, x):
        return self.net(x)


class _Ours(PyroModule):
    def __init__(self):
        super().__init__()
        self.net = pyrouq.bayesian(pyrouq.MLP(3, 4, 1), likelihood=Gaussian("learned"), num_data=5)

    def forward(self, x, y=None):
        return self.net(x, y)


def test_a_nested_models_clean_up_leaves_a_users_entries_under_its_name():
    pyro.clear_param_store()
    store = pyro.get_param_store()
    pyro.param("net.scale", torch.tensor(7.0), constraint=constraints.positive)
    tmp = _Ours()
    tmp(torch.randn(5, 3), torch.randn(5))  # its entries under net.likelihood$$$...
    assert any(name.startswith("net.likelihood$$$") for name in store.keys())
    del tmp
    gc.collect()
    assert list(store.keys()) == ["net.scale"]  # its own gone, the user's kept
    assert _Baseline()(torch.tensor(1.0)).item() == pytest.approx(7.0)


# --------------------------------------------------------------------------------------------
# to_inference_data(model, None, x, y) retries on the whole data after torch's size errors in
# any phrasing (expand, einsum, cross_entropy, bmm); never after a dtype error
# --------------------------------------------------------------------------------------------


def _expanded(x, y=None):
    z = pyro.sample("z", dist.Normal(0.0, 1.0))
    pyro.sample("obs", dist.Normal(z + x[:, 0], 1.0).expand([40]).to_event(1), obs=y)


def _einsum(x, y=None):
    z = pyro.sample("z", dist.Normal(0.0, 1.0))
    torch.einsum("i,i->", x[:, 0] * z, torch.ones(40))  # "does not broadcast" on two rows


def _cross_entropy(x, y=None):
    z = pyro.sample("z", dist.Normal(0.0, 1.0))
    labels = torch.zeros(40, dtype=torch.long)
    torch.nn.functional.cross_entropy(x * z, labels)  # "Expected input batch_size (2) ..."


def _bmm(x, y=None):
    z = pyro.sample("z", dist.Normal(0.0, 1.0))
    torch.bmm(x[:, None, :] * z, torch.ones(40, 3, 1))  # "Expected size for first two ..."


@pytest.mark.parametrize("model", [_expanded, _einsum, _cross_entropy, _bmm])
def test_a_size_error_of_any_phrasing_on_two_rows_is_traced_on_the_whole_data(model):
    x, y = torch.randn(40, 3), torch.randn(40)
    with pytest.raises(ValueError, match=r"samples the latent sites \['z'\] but guide is None"):
        pyrouq.to_inference_data(model, None, x, y)


def test_a_dtype_error_on_two_rows_is_still_not_traced_on_the_whole_data():
    seen: list[int] = []

    def model(x, y=None):
        seen.append(x.shape[0])
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        return x.double() @ w

    with pytest.raises(ValueError, match=r"it raised RuntimeError: ") as info:
        pyrouq.to_inference_data(model, None, torch.randn(40, 3), torch.randn(40))
    assert seen == [2]
    assert "an error there that is not on a dtype, a device or memory is traced" in str(info.value)


# --------------------------------------------------------------------------------------------
# A finite loss whose gradients overflow at a tiny noise floor stops fit() before the step
# --------------------------------------------------------------------------------------------


def test_gradients_overflowing_at_a_tiny_floor_stop_fit_with_finite_parameters():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=g)
    y = x.sum(-1)
    net = pyrouq.MLP(3, 8, 2)
    with torch.no_grad():
        list(net.parameters())[-1][1] = -200.0  # every scale at the floor
    model = pyrouq.bayesian(net, likelihood=Gaussian("heteroscedastic", min_scale=1e-14))
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(
        FloatingPointError, match=r"^Non-finite gradients \(the loss is finite"
    ) as info:
        pyrouq.fit(model, guide, [(x, y)], epochs=3, num_data=32, progress=False)
    limit = torch.finfo(torch.float32).max ** (-1 / 3)
    assert "the parameters and normalisation statistics of the last finite step are kept" in str(
        info.value
    )
    assert f"The noise floor Gaussian(min_scale=1e-14) is below {limit:.3g}" in str(info.value)
    assert all(torch.isfinite(p).all() for p in guide.parameters())
    assert all(torch.isfinite(p).all() for p in pyro.get_param_store().values())


def test_gradients_overflowing_under_a_large_kl_term_are_not_told_as_a_kl_overflow():
    # the loss is finite (2.02e+34 in float32), yet the error said "The KL term overflowed it:
    # kl_weight * KL = 1e+30 * 20207.3 = 2.02e+34 ... Pass a smaller kl_weight" (its KL term
    # is the larger one): what overflowed is the gradients at the noise floor
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 3, generator=g)
    net = pyrouq.MLP(3, 8, 2)
    with torch.no_grad():
        list(net.parameters())[-1][1] = -200.0  # every scale at the floor
    model = pyrouq.bayesian(net, likelihood=Gaussian("heteroscedastic", min_scale=1e-14))
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(FloatingPointError) as info:
        pyrouq.fit(model, guide, [(x, x.sum(-1))], epochs=1, num_data=32, kl_weight=1e30,
                   progress=False)  # fmt: skip
    told = str(info.value)
    assert told.startswith("Non-finite gradients (the loss is finite, 2.02")
    assert "overflowed it" not in told
    assert "kept. Lower lr, check the inputs and targets for NaN/inf" in told
    assert "The noise floor Gaussian(min_scale=1e-14) is below" in told


# --------------------------------------------------------------------------------------------
# load(module=functools.partial(SomeClass, ...)) names the class the partial builds
# --------------------------------------------------------------------------------------------


def test_load_names_a_partial_of_a_class_by_the_class(tmp_path):
    plain = pyrouq.bayesian(pyrouq.MLP(4, 8, 3))
    path = pyrouq.save(tmp_path / "n.pt", plain, pyrouq.mean_field_guide(plain))
    with pytest.raises(pyrouq.CheckpointError) as info:
        pyrouq.load(path, module=functools.partial(pyrouq.MLP, 4, 8, 3))
    assert (
        "Expected module= to be an nn.Module instance (the skeleton), got the class MLP, which "
        "builds one, not the network itself. Pass the network built as for training: "
        "load(path, module=MLP())"
    ) in str(info.value)


# --------------------------------------------------------------------------------------------
# mcmc() of a BatchEnsemble also names bayesian(ensemble, prior=...), the route on it as it is
# --------------------------------------------------------------------------------------------


def test_mcmc_of_a_batchensemble_names_bayesian_of_the_ensemble_too():
    ensemble = pyrouq.batchensemble(pyrouq.MLP(4, 8, 3), 2)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(TypeError) as info:
        pyrouq.mcmc(ensemble, x, y, num_samples=2, warmup_steps=2)
    assert (
        "to make this existing BatchEnsemble's factors latent, use pyrouq.bayesian(ensemble, "
        "prior=...) (a prior centred on 1 for the factors, as rank1()'s Normal(1, 0.1)"
    ) in str(info.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the route named works, without the prior warning
        model = pyrouq.bayesian(ensemble, prior=dist.Normal(1.0, 0.1))
    assert model.latent_sites()
