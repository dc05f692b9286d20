"""Review 11e: a SyncBatchNorm frozen for a first fit() is told, on a second fit() of the model
(left in eval mode), to call model.train() then layer.eval(), and trains so; to_inference_data's
trace of a model of one's own puts back a stored parameter the model changes in place, and runs
the model on two rows alone where its error there is not one of sizes."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import bayesian, fit, mean_field_guide, to_inference_data

QUIET = {"progress": False}

# --------------------------------------------------------------------------------------------
# 1. A second fit() of a model with a frozen SyncBatchNorm, on the CPU in a gloo group
# --------------------------------------------------------------------------------------------


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)


def test_a_second_fit_is_told_to_call_train_then_eval_and_trains_so(gloo_group):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(nn.SyncBatchNorm.convert_sync_batchnorm(net))
    guide = mean_field_guide(model)
    model.net[1].eval()  # frozen, as the refusal and fit() tell
    x, y = _data(8)
    fit(model, guide, [(x, y)], epochs=1, num_data=8, **QUIET)
    assert not model.training  # fit() leaves the model in eval mode
    before = model.net[1].running_mean.clone()

    with pytest.raises(ValueError) as info:  # continuing the training
        fit(model, guide, [(x, y)], epochs=1, num_data=8, **QUIET)
    text = str(info.value)
    assert (
        "BayesianNetwork is in eval mode (model.eval() leaves a model so, and so do fit() "
        "and load()), and fit() switches a model in eval mode to training mode throughout, "
        "these layers with it."
    ) in text
    assert (
        "or keep such a layer frozen: call model.train(), then layer.eval(), before fit() "
        "(here model.get_submodule('net.1').eval(); "
    ) in text
    assert "would train these" not in text

    model.train()  # as told
    model.get_submodule("net.1").eval()
    result = fit(model, guide, [(x, y)], epochs=2, num_data=8, **QUIET)
    assert len(result.losses) == 2
    torch.testing.assert_close(model.net[1].running_mean, before)  # still frozen


# --------------------------------------------------------------------------------------------
# 2. to_inference_data(model, None, x, y) of a model of one's own
# --------------------------------------------------------------------------------------------

N = 20


def _own_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, 3, generator=g), torch.randint(0, 2, (N,), generator=g)


def test_a_stored_param_the_model_changes_in_place_is_put_back():
    pyro.clear_param_store()
    noise = pyro.param("review11e_noise", torch.ones(2))

    def doubling(x, y=None):
        scale = pyro.param("review11e_noise")
        scale.data.mul_(2)  # in place, in the store's own tensor
        w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=(x @ w) * scale), obs=y)

    x, y = _own_data()
    try:
        with pytest.raises(ValueError, match=r"doubling samples the latent sites \['w'\]"):
            to_inference_data(doubling, None, x, y)
        assert list(pyro.get_param_store().keys()) == ["review11e_noise"]
        assert pyro.param("review11e_noise") is noise  # the same tensor, its value back
        torch.testing.assert_close(noise.detach(), torch.ones(2))
    finally:
        pyro.clear_param_store()


def test_a_model_whose_bug_is_not_about_sizes_is_run_on_two_rows_only():
    seen = []

    def buggy(x, y=None):
        seen.append(x.shape[0])
        pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
        raise AttributeError("review11e: the model's own bug")

    x, y = _own_data()
    with pytest.raises(ValueError) as info:
        to_inference_data(buggy, None, x, y)
    assert seen == [2]  # not run once more on the whole x
    said = str(info.value)
    assert said.startswith(
        "to_inference_data(): buggy could not be traced to find its latent sites (run as "
        "model(x, y), it raised AttributeError: review11e: the model's own bug), and guide is "
        "None. The trace ran on x[:2], y[:2] (the site names are all it reads; an error there "
        "that is not on a dtype, a device or memory is traced once more on the whole data)."
    )
    assert isinstance(info.value.__cause__, AttributeError)
    assert str(info.value.__cause__).startswith("review11e: the model's own bug")


def test_a_model_of_x_alone_whose_bug_is_not_about_sizes_is_told_it_ran_on_x_2():
    seen = []

    def buggy_of_x(x):
        seen.append(x.shape[0])
        raise KeyError("review11e")

    x, y = _own_data()
    with pytest.raises(
        ValueError, match=r"\(run as model\(x\), .* The trace ran on x\[:2\] "
    ) as info:
        to_inference_data(buggy_of_x, None, x, y)
    assert seen == [2]
    assert isinstance(info.value.__cause__, KeyError)
