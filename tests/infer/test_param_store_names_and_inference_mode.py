"""Review 11g: to_inference_data's trace of a model of one's own runs once more on the whole data
after an error on sizes or shapes on two rows (torch's size errors come in many phrasings),
and keeps a copy only of the stored parameters the model reads; fit() refuses a lazy parameter
created inside torch.inference_mode() before it is made, and a learned Gaussian scale made by a
first predict() there is a normal tensor fit() trains; a model or guide unpickled beside its
live original is named apart from it; the SyncBatchNorm refusal says what leaves a model in
eval mode."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import re

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, toy_data
from torch import nn

import pyrouq
from pyrouq.likelihoods import Gaussian

QUIET = {"progress": False}

# --------------------------------------------------------------------------------------------
# 1. to_inference_data(model, None, x, y) of a model of one's own sized for its whole data
# --------------------------------------------------------------------------------------------

N = 20


def _own_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, 3, generator=g), torch.randn(N, generator=g)


def _stacking(x, y=None):  # torch: "stack expects each tensor to be equal size"
    z = pyro.sample("z", dist.Normal(torch.zeros(N), 1.0).to_event(1))
    mean = torch.stack([z, x[:, 0]]).sum(0)
    pyro.sample("obs", dist.Normal(mean, 1.0).to_event(1), obs=y)


def _dotting(x, y=None):  # torch: "inconsistent tensor size, expected tensor [20] and src [2]"
    w = pyro.sample("w", dist.Normal(torch.zeros(N), 1.0).to_event(1))
    s = torch.dot(w, x[:, 0])
    pyro.sample("obs", dist.Normal(s.expand(x.shape[0]), 1.0).to_event(1), obs=y)


def _masking(x, y=None):  # torch (IndexError): "The shape of the mask [2] at index 0 ..."
    z = pyro.sample("z", dist.Normal(torch.zeros(N), 1.0).to_event(1))
    mean = z[x[:, 0] > 0].sum() + x[:, 1]
    pyro.sample("obs", dist.Normal(mean, 1.0).to_event(1), obs=y)


@pytest.mark.parametrize(
    ("model", "site"),
    [(_stacking, "z"), (_dotting, "w"), (_masking, "z")],
    ids=["stack", "dot", "mask"],
)
def test_a_model_sized_for_its_whole_data_has_its_latent_sites_named(model, site):
    """Each fails on x[:2] with a size error torch words otherwise than a plate does (it was
    refused at once, as a bug of its own); traced on the whole data, its site is named."""
    x, y = _own_data()
    with pytest.raises(ValueError, match=rf"samples the latent sites \['{site}'\] but guide is"):
        pyrouq.to_inference_data(model, None, x, y)


def test_a_model_raising_a_key_error_is_told_at_once_on_two_rows():
    seen = []

    def looking_up(x, y=None):
        seen.append(x.shape[0])
        pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        return {}["review11g"]

    x, y = _own_data()
    with pytest.raises(ValueError) as info:
        pyrouq.to_inference_data(looking_up, None, x, y)
    assert seen == [2]  # not run once more on the whole x
    said = str(info.value)
    assert "it raised KeyError: 'review11g'), and guide is None." in said
    assert (
        "The trace ran on x[:2], y[:2] (the site names are all it reads; an error there that "
        "is not on a dtype, a device or memory is traced once more on the whole data)."
    ) in said
    assert isinstance(info.value.__cause__, KeyError)


_CALLS: list[str] = []


class _Watched(torch.Tensor):
    """A tensor that records the torch functions called on it (in ``_CALLS``)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _CALLS.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_only_the_stored_parameters_the_model_reads_are_copied_and_put_back():
    """A parameter of Pyro's param store the model never reads (a large network's guide) is
    neither copied nor written (every one was cloned at each trace); one it reads and changes
    in place is put back."""
    store = pyro.get_param_store()
    store["review11g_unread"] = torch.zeros(3).as_subclass(_Watched)
    read = pyro.param("review11g_read", torch.ones(2))

    def doubling(x, y=None):
        pyro.param("review11g_read").data.mul_(2)
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        pyro.sample("obs", dist.Normal(x @ w, 1.0).to_event(1), obs=y)

    x, y = _own_data()
    _CALLS.clear()
    with pytest.raises(ValueError, match=r"doubling samples the latent sites \['w'\]"):
        pyrouq.to_inference_data(doubling, None, x, y)
    assert _CALLS == []
    assert pyro.param("review11g_read") is read
    torch.testing.assert_close(read.detach(), torch.ones(2))


# --------------------------------------------------------------------------------------------
# 2. Inference tensors: a lazy parameter created inside inference_mode, a first predict() there
# --------------------------------------------------------------------------------------------


def test_a_lazy_layer_built_inside_inference_mode_is_refused_naming_its_parameter():
    """Its parameters are inference tensors before they are made, and stay so once made:
    fit() failed with torch's raw "Inplace update to inference tensor" as it made them."""
    with torch.inference_mode():
        net = nn.Sequential(nn.LazyLinear(3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(RuntimeError) as info:
        pyrouq.fit(net, None, [(x, y)], epochs=1, num_data=8, **QUIET)
    assert str(info.value).startswith(
        "fit() expects the model's parameters and buffers to be normal tensors, but "
        "Sequential's '0.weight' is an inference tensor: the model was built, or first run "
        "(its lazy parameters made), inside torch.inference_mode()"
    )


def test_a_learned_scale_made_by_a_first_predict_in_inference_mode_is_trained():
    """The model and guide are built outside inference_mode; the first predict() is inside
    it, and makes the learned noise scale: a normal tensor, which fit() then trains (it was
    refused as a model 'built (or converted) inside torch.inference_mode()')."""
    torch.manual_seed(0)
    x, y = torch.randn(16, 3), torch.randn(16, 1)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(3, 1)), likelihood=Gaussian("learned"))
    guide = pyrouq.mean_field_guide(model)
    with torch.inference_mode():
        pyrouq.predict(model, x, guide, num_samples=2, **QUIET)
    scale = model.likelihood.raw_scale
    assert not scale.is_inference()
    before = scale.detach().clone()
    pyrouq.fit(model, guide, [(x, y)], epochs=2, num_data=16, lr=0.1, **QUIET)
    assert not torch.equal(model.likelihood.raw_scale.detach(), before)


def test_a_learned_scale_created_and_first_run_inside_inference_mode_is_made():
    """Gaussian('learned') built and first run inside inference_mode (its scale's tensor an
    inference tensor from the start) is still made there: softplus(raw) = 1."""
    with torch.inference_mode():
        likelihood = Gaussian("learned")
        nll = likelihood.nll(torch.zeros(4, 2), torch.zeros(4, 2))
    assert torch.isfinite(nll).all()
    torch.testing.assert_close(
        torch.nn.functional.softplus(likelihood.raw_scale.detach()), torch.ones(2)
    )


# --------------------------------------------------------------------------------------------
# 3. Unpickled beside the live original: a name of its own
# --------------------------------------------------------------------------------------------


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2))


def _entries(name):
    store = pyro.get_param_store()
    return {k: store[k] for k in store.keys() if k.startswith((f"{name}.", f"{name}$$$"))}


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_an_unpickled_model_beside_its_original_is_named_apart(kind):
    """Both keep their own entries after the copy is fitted (the copy's replaced the
    original's under their one name)."""
    x, y = toy_data(40)
    if kind == "bayesian":
        model = pyrouq.bayesian(_net(), select="last_layer", num_data=40)
        guide = pyrouq.mean_field_guide(model)
    else:
        model, guide = pyrouq.batchensemble(_net(), 2), None
        model.num_data = 40
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, seed=0, **QUIET)
    loaded = pickle.loads(pickle.dumps(model))
    assert re.fullmatch(rf"{model._pyro_name}_copy\d+", loaded._pyro_name)
    pyrouq.fit(loaded, copy.deepcopy(guide), ListLoader(x, y, 20), epochs=1, seed=1, **QUIET)
    for owner in (model, loaded):
        held = _entries(owner._pyro_name)
        assert held and {id(t) for t in held.values()} <= {id(p) for p in owner.parameters()}


def test_an_unpickled_guide_beside_its_original_is_named_apart():
    x, y = toy_data(40)
    model = pyrouq.bayesian(_net(), select="last_layer", num_data=40)
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, seed=0, **QUIET)
    loaded = pickle.loads(pickle.dumps(guide))
    assert re.fullmatch(rf"{guide.name}_copy\d+", loaded.name)
    pyrouq.fit(model, loaded, ListLoader(x, y, 20), epochs=1, seed=1, **QUIET)
    for owner in (guide, loaded):
        held = _entries(owner.name)
        assert held and {id(t) for t in held.values()} == {id(p) for p in owner.parameters()}


def test_a_torch_loaded_pair_keeps_its_names_where_no_live_one_holds_them():
    """torch.load of a pickled (model, guide) once the originals are gone (a new process, a
    spawned MCMC chain) keeps their names; beside live ones, it is named apart."""
    model = pyrouq.bayesian(_net(), select="last_layer", num_data=40)
    guide = pyrouq.mean_field_guide(model)
    names = (model._pyro_name, guide.name)
    buffer = io.BytesIO()
    torch.save((model, guide), buffer)
    buffer.seek(0)
    beside = torch.load(buffer, weights_only=False)
    assert beside[0]._pyro_name != names[0] and beside[1].name != names[1]
    del model, guide, beside
    gc.collect()
    buffer.seek(0)
    alone, alone_guide = torch.load(buffer, weights_only=False)
    assert (alone._pyro_name, alone_guide.name) == names


# --------------------------------------------------------------------------------------------
# 4. The SyncBatchNorm refusal of a model in eval mode says what left it so
# --------------------------------------------------------------------------------------------


def test_a_model_the_user_put_in_eval_mode_is_not_said_to_be_left_so_by_fit(gloo_group):
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model = pyrouq.bayesian(nn.SyncBatchNorm.convert_sync_batchnorm(net))
    model.eval()  # never fitted
    x, y = toy_data(8)
    with pytest.raises(ValueError) as info:
        pyrouq.fit(model, pyrouq.mean_field_guide(model), [(x, y)], epochs=1, **QUIET)
    text = str(info.value)
    assert "as fit() leaves a model it trained" not in text
    assert (
        "BayesianNetwork is in eval mode (model.eval() leaves a model so, and so do fit() and "
        "load()), and fit() switches a model in eval mode to training mode throughout"
    ) in text
