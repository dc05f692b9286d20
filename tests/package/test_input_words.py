"""Inputs the refusals of a guide in the model's place and of integer inputs must let through
or word for the case at hand: a Pyro model of one's own (a PyroModule) taking integer group
indices in the diagnostics, a guide saved alone, a Pyro messenger guide swapped with the
model in predict()."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from pyro import poutine
from pyro.infer.autoguide import AutoNormal, AutoNormalMessenger
from pyro.nn import PyroModule

import pyrouq

N = 30


@pytest.fixture(autouse=True)
def _fresh_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _group_body(x, y=None):
    """One mean per group, x the group index of each point (int64)."""
    a = pyro.sample("a", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    with pyro.plate("data", N, subsample=torch.arange(len(x))):
        return pyro.sample("obs", dist.Normal(a[..., x], 1.0), obs=y)


class Groups(PyroModule):
    def forward(self, x, y=None):
        return _group_body(x, y)


def _groups():
    x = torch.arange(N) % 3
    return x, x.float() + torch.randn(N, generator=torch.Generator().manual_seed(0))


def test_diagnostics_take_integer_group_indices_of_a_pyro_module_of_ones_own():
    # refused as "to_inference_data() expects floating-point inputs ... normalize(images)",
    # though the same body written as a function was let through, and the module ran before
    x, y = _groups()
    model = Groups()
    guide = AutoNormal(model)
    guide(x, y)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=5)
    a = torch.as_tensor(idata.posterior["a"].values[0])  # (S, 3)
    by_hand = dist.Normal(a[:, x], 1.0).log_prob(y)  # (S, N)
    got = torch.as_tensor(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, by_hand.to(got.dtype), rtol=1e-5, atol=1e-5)
    # psis: the k-hat of the same body as a function, same guide values, same seed
    pyro.set_rng_seed(0)
    ours = pyrouq.psis_diagnostic(model, guide, x, y, num_samples=40)
    pyro.set_rng_seed(0)
    as_function = pyrouq.psis_diagnostic(_group_body, guide, x, y, num_samples=40)
    torch.testing.assert_close(ours.log_weights, as_function.log_weights)
    assert ours.k_hat == as_function.k_hat


def test_a_guide_saved_alone_still_saves_and_loads_into_its_skeleton(tmp_path):
    # save(path, guide) was refused as "the model and its guide swapped?"
    x, y = toy_data(20)
    model = tiny_mlp(num_data=20)
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, ListLoader(x, y, 10), epochs=1, progress=False, seed=0)
    path = pyrouq.save(tmp_path / "guide.pt", guide)
    loaded = pyrouq.load(path, module=pyrouq.mean_field_guide(tiny_mlp(num_data=20))).model
    assert isinstance(loaded, pyrouq.MeanFieldGuide)
    for name, value in guide.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_predict_of_a_messenger_guide_swapped_with_the_model_names_predicts_order():
    # it said "Pass them in order: the model first, then its guide"
    x, _ = toy_data(6)
    model = tiny_mlp(num_data=6)
    guide = AutoNormalMessenger(poutine.block(model, hide=["obs"]))
    with pytest.raises(TypeError) as info:
        pyrouq.predict(guide, x, model, 2, progress=False)
    assert str(info.value) == (
        "predict() expected the model first, got a guide (AutoNormalMessenger) in its place "
        "(the model and its guide swapped?). Pass them in order: predict(model, x, guide)."
    )
