"""Review of the day's commits: a small heteroscedastic noise floor trains (named only where
fit() stops on a non-finite loss), the own-model trace's retry on the whole data only after
size errors, BatchEnsemble's mcmc() and load(module=...) wording, stored params read outside
pyro.param put back, and unpickled copies registered in the param store."""

import gc
import io
import math
import warnings

import pyro
import pytest
import torch

import pyrouq
from pyrouq.likelihoods import Gaussian

# --------------------------------------------------------------------------------------------
# A heteroscedastic floor below float32's gradient limit (1.43e-13) is not refused up front:
# scales above it train; fit()'s non-finite-loss error names it
# --------------------------------------------------------------------------------------------


def _data(n: int = 32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    return x, x.sum(-1)


@pytest.mark.parametrize("floor", [1e-14, 1e-30])
def test_a_tiny_floor_scores_targets_and_trains(floor):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    lik = Gaussian("heteroscedastic", min_scale=floor)
    model = pyrouq.bayesian(pyrouq.MLP(3, 8, 2), likelihood=lik, num_data=32)
    guide = pyrouq.mean_field_guide(model)
    assert model(x, y).shape == (32, 2)  # a model given y scores them (refused before)
    result = pyrouq.fit(model, guide, [(x, y)], epochs=2, num_data=32, progress=False)
    assert math.isfinite(result.history[-1].loss)


def test_a_non_finite_loss_at_the_floor_names_it_and_the_safe_value():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    net = pyrouq.MLP(3, 8, 2)
    with torch.no_grad():
        list(net.parameters())[-1][1] = -200.0  # every scale at the floor
    lik = Gaussian("heteroscedastic", min_scale=1e-20)
    model = pyrouq.bayesian(net, likelihood=lik)
    with pytest.raises(FloatingPointError, match=r"^Non-finite loss") as info:
        pyrouq.fit(
            model, pyrouq.mean_field_guide(model), [(x, y)], epochs=1, num_data=32, progress=False
        )
    limit = torch.finfo(torch.float32).max ** (-1 / 3)
    assert f"The noise floor Gaussian(min_scale=1e-20) is below {limit:.3g}" in str(info.value)
    assert f"Raise min_scale to >= {limit:.3g} (1e-3 suggested)" in str(info.value)


def test_a_non_finite_loss_of_another_model_gets_no_floor_sentence():
    pyro.clear_param_store()
    x, y = _data()
    y = y * 1e30  # finite targets whose z**2 overflows float32 at any sensible floor
    model = pyrouq.bayesian(pyrouq.MLP(3, 8, 2), likelihood=Gaussian("heteroscedastic"))
    with pytest.raises(FloatingPointError, match=r"^Non-finite loss") as info:
        pyrouq.fit(
            model, pyrouq.mean_field_guide(model), [(x, y)], epochs=1, num_data=32, progress=False
        )
    assert "noise floor" not in str(info.value)


def test_a_learned_noise_fallen_to_0_scores_inf_predicts_and_is_named_by_fit():
    # softplus(-200) underflows float32 to 0: nll() was NaN, predict() refused "standard
    # deviations ... floored above 0" (none were passed), fit() gave the generic advice only
    tiny = torch.finfo(torch.float32).tiny
    lik = Gaussian("learned")
    lik.prepare(torch.zeros(1, 1))
    with torch.no_grad():
        lik.raw_scale.fill_(-200.0)
    assert lik.loc_scale(torch.zeros(1, 1))[1].item() == tiny  # its dtype's floor, not 0
    assert lik.nll(torch.zeros(4, 1), torch.ones(4)).item() == math.inf
    at_mean = lik.nll(torch.zeros(4, 1), torch.zeros(4)).item()  # z = 0: the log-scales
    assert at_mean == pytest.approx(4 * (math.log(tiny) + 0.5 * math.log(2 * math.pi)))
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    model = pyrouq.bayesian(pyrouq.MLP(3, 8, 1), likelihood=lik, num_data=32)
    guide = pyrouq.mean_field_guide(model)
    preds = pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert preds.scale.unique().tolist() == [tiny]
    with pytest.raises(FloatingPointError, match=r"^Non-finite loss \(inf\)") as info:
        pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=32, progress=False)
    assert (
        "The learned noise scale, Gaussian('learned'), has fallen to 1.18e-38 (softplus of "
        "raw_scale -200, output 0), below 5.42e-20: the NLL's z**2" in str(info.value)
    )
    assert "give the model a fixed noise scale (e.g. Gaussian(0.01))" in str(info.value)


def test_a_learned_noise_above_the_floor_but_past_where_the_nll_overflows_is_named():
    # 1e-21 is no underflow, but 1/scale**2 (1e42) passes float32's largest number: the NLL
    # of a target 1 away from the mean overflows, and the scale is named as at the floor
    lik = Gaussian("learned")
    lik.prepare(torch.zeros(1, 1))
    with torch.no_grad():
        lik.raw_scale.fill_(math.log(1e-21))
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    model = pyrouq.bayesian(pyrouq.MLP(3, 8, 1), likelihood=lik, num_data=32)
    with pytest.raises(FloatingPointError, match=r"^Non-finite loss") as info:
        pyrouq.fit(
            model, pyrouq.mean_field_guide(model), [(x, y)], epochs=1, num_data=32, progress=False
        )
    assert "has fallen to 1e-21 (softplus of raw_scale -48.35, output 0), below 5.42e-20" in str(
        info.value
    )


def test_a_learned_noise_in_its_range_gets_no_sentence():
    x, y = _data()
    y = y * 1e30  # z**2 overflows, but the learned scale (1) is not the cause
    model = pyrouq.bayesian(pyrouq.MLP(3, 8, 1), likelihood=Gaussian("learned"))
    pyro.clear_param_store()
    with pytest.raises(FloatingPointError, match=r"^Non-finite loss") as info:
        pyrouq.fit(
            model, pyrouq.mean_field_guide(model), [(x, y)], epochs=1, num_data=32, progress=False
        )
    assert "learned noise" not in str(info.value)


# --------------------------------------------------------------------------------------------
# to_inference_data(model, None, x, y): the whole data is traced only after a size error on
# two rows (not a dtype error, a model's own ValueError, or out of memory)
# --------------------------------------------------------------------------------------------


def _counted(error):
    seen: list[int] = []

    def model(x, y=None):
        seen.append(x.shape[0])
        w = pyro.sample("w", pyro.distributions.Normal(torch.zeros(3), 1.0).to_event(1))
        if error is None:
            return x.double() @ w  # torch: "... must have the same dtype ..."
        raise error

    return model, seen


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (None, "RuntimeError"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "OutOfMemoryError"),
    ],
    ids=["dtype", "out-of-memory"],
)
def test_an_error_not_on_sizes_is_told_after_two_rows(error, name):
    model, seen = _counted(error)
    x, y = torch.randn(40, 3), torch.randn(40)
    with pytest.raises(ValueError, match=rf"it raised {name}: ") as info:
        pyrouq.to_inference_data(model, None, x, y)
    assert seen == [2]  # not run once more on the whole x
    assert "not on a dtype, a device or memory is traced once more" in str(info.value)


def test_a_plate_of_a_fixed_size_is_traced_on_the_whole_data():
    def plated(x, y=None):
        z = pyro.sample("z", pyro.distributions.Normal(0.0, 1.0))
        with pyro.plate("data", 40):  # "Shape mismatch inside plate" on two rows
            pyro.sample("obs", pyro.distributions.Normal(z + x[:, 0], 1.0), obs=y)

    x, y = torch.randn(40, 3), torch.randn(40)
    with pytest.raises(ValueError, match=r"samples the latent sites \['z'\] but guide is None"):
        pyrouq.to_inference_data(plated, None, x, y)


# --------------------------------------------------------------------------------------------
# Messages: mcmc() of a BatchEnsemble names rank1() of the network given to batchensemble();
# load(module=...) names a callable instance by its class and words a non-callable plainly
# --------------------------------------------------------------------------------------------


def test_mcmc_of_a_batchensemble_says_rank1_takes_the_network_given_to_batchensemble():
    ensemble = pyrouq.batchensemble(pyrouq.MLP(4, 8, 3), 2)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(TypeError) as info:
        pyrouq.mcmc(ensemble, x, y, num_samples=2, warmup_steps=2)
    assert (
        "pyrouq.rank1(net, num_members) of the network given to batchensemble() (not of the "
        "ensemble;"
    ) in str(info.value)


class _Builder:
    def __call__(self):
        return pyrouq.BayesianMLP(4, 8, 3)


def _unused_warning(path, module) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pyrouq.load(path, module=module)
    (warning,) = [w for w in caught if "is not used" in str(w.message)]
    return str(warning.message)


def test_load_names_a_callable_instance_by_its_class_and_a_str_plainly(tmp_path):
    model = pyrouq.BayesianMLP(4, 8, 3)
    path = pyrouq.save(tmp_path / "m.pt", model, pyrouq.mean_field_guide(model))
    said = _unused_warning(path, _Builder())
    assert "module= (a callable _Builder) is not used." in said
    assert said.endswith("(an nn.Module instance, e.g. module=make_net()), not what builds it.")
    said = _unused_warning(path, "m.pt")
    assert "module= (a str) is not used." in said
    assert said.endswith("(an nn.Module instance, e.g. module=make_net()).")
    assert "an int" in _unused_warning(path, 3)
    # a network's checkpoint: the skeleton refusal names the instance's class
    plain = pyrouq.bayesian(pyrouq.MLP(4, 8, 3))
    path = pyrouq.save(tmp_path / "n.pt", plain, pyrouq.mean_field_guide(plain))
    with pytest.raises(pyrouq.CheckpointError) as info:
        pyrouq.load(path, module=_Builder())
    assert "got a callable _Builder, not the network itself. Pass the network built" in str(
        info.value
    )


# --------------------------------------------------------------------------------------------
# to_inference_data(model, None, x, y): a stored param the model reads under poutine.block()
# or as pyro.get_param_store()[name], and changes in place, is put back
# --------------------------------------------------------------------------------------------


def test_a_stored_param_read_without_pyro_param_messages_is_put_back():
    from pyro import poutine

    store = pyro.get_param_store()
    blocked = pyro.param("review11h_blocked", torch.ones(2))
    direct = pyro.param("review11h_direct", torch.ones(2))

    def doubling(x, y=None):
        with poutine.block():
            pyro.param("review11h_blocked").data.mul_(2)
        store["review11h_direct"].data.mul_(2)
        w = pyro.sample("w", pyro.distributions.Normal(torch.zeros(3), 1.0).to_event(1))
        pyro.sample("obs", pyro.distributions.Normal(x @ w, 1.0).to_event(1), obs=y)

    x, y = torch.randn(20, 3), torch.randn(20)
    with pytest.raises(ValueError, match=r"doubling samples the latent sites \['w'\]"):
        pyrouq.to_inference_data(doubling, None, x, y)
    assert pyro.param("review11h_blocked") is blocked and store["review11h_direct"] is direct
    torch.testing.assert_close(blocked.detach(), torch.ones(2))
    torch.testing.assert_close(direct.detach(), torch.ones(2))


# --------------------------------------------------------------------------------------------
# A model and guide unpickled beside their live originals (renamed <name>_copy<k>) put their
# entries into Pyro's param store at once: a store saved before they run holds them
# --------------------------------------------------------------------------------------------


def test_a_reloaded_pair_replacing_its_originals_is_in_a_saved_param_store(tmp_path):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = _data()
    model = pyrouq.bayesian(pyrouq.MLP(3, 8, 1), likelihood=Gaussian("learned"))
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=32, progress=False)
    buffer = io.BytesIO()
    torch.save((model, guide), buffer)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=32, progress=False)
    buffer.seek(0)
    model, guide = torch.load(buffer, weights_only=False)  # the originals collected
    gc.collect()
    store = pyro.get_param_store()
    assert any(name.startswith(guide.name + "$$$") for name in store.keys())
    noise = model.likelihood.raw_scale.detach().clone()
    params = [p.detach().clone() for p in guide.parameters()]
    store.save(tmp_path / "store.pt")
    with torch.no_grad():
        model.likelihood.raw_scale.add_(5.0)
        for p in guide.parameters():
            p.add_(1.0)
    store.load(tmp_path / "store.pt")
    pyrouq.predict(model, x, guide, num_samples=2, progress=False)  # takes the store's values
    torch.testing.assert_close(model.likelihood.raw_scale.detach(), noise)
    for p, saved in zip(guide.parameters(), params, strict=True):
        torch.testing.assert_close(p.detach(), saved)


# --------------------------------------------------------------------------------------------
# A pyrouq model nested in a user's PyroModule holds its entries under Pyro's name for it
# --------------------------------------------------------------------------------------------


class _Wrap(pyro.nn.PyroModule):
    def __init__(self):
        super().__init__()
        self.bnn = pyrouq.bayesian(pyrouq.MLP(3, 4, 1), likelihood=Gaussian("learned"))

    def forward(self, x, y=None):
        return self.bnn(x, y)


def test_a_nested_model_unpickled_beside_it_and_its_clean_up_use_pyros_name_for_it():
    pyro.clear_param_store()
    store = pyro.get_param_store()
    x, y = _data(8)
    wrap = _Wrap()
    wrap.bnn.num_data = 8
    wrap(x, y)
    original = wrap.bnn.likelihood.raw_scale
    assert store["bnn.likelihood$$$raw_scale"] is original
    buffer = io.BytesIO()
    torch.save(wrap, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    loaded(x, y)  # named apart: the original's entry stays its own
    assert store["bnn.likelihood$$$raw_scale"] is original
    del loaded
    gc.collect()
    assert store["bnn.likelihood$$$raw_scale"] is original
    del wrap, original
    gc.collect()
    assert not any(name.startswith("bnn.") for name in store.keys())
