"""Audit 11 leftovers: a BatchNorm without running statistics on a batch of one input in
to_inference_data() and in fit()'s first batch, the CLI's --conformal help, a float64 learned
noise through save/load, and SyncBatchNorm in a CPU process group."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import Gaussian, bayesian, fit, mean_field_guide, predict
from pyrouq.cli import main


def _net_without_running_stats() -> nn.Module:
    return nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False), nn.ReLU(), nn.Linear(4, 2)
    )


def _data(n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g)


@pytest.fixture
def model_and_guide():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = bayesian(_net_without_running_stats())
    return model, mean_field_guide(model)


_STATS = (
    "and a BatchNorm built without running statistics (track_running_stats=False) normalises "
    "with the statistics of its batch in eval mode too, which need more than one value per "
    "channel (torch: 'Expected more than 1 value per channel'). "
)


# 1. to_inference_data() words a batch of one input as predict() does


def test_to_inference_data_names_a_remainder_of_one_input(model_and_guide):
    pytest.importorskip("arviz")
    model, guide = model_and_guide
    x, y = _data(5)
    with pytest.raises(ValueError) as info:
        pyrouq.to_inference_data(model, guide, x, y, num_samples=2, batch_size=4)
    assert str(info.value) == (
        "to_inference_data(): batch 2 of x holds 1 input of shape (3,), "
        + _STATS
        + "batch_size=4 leaves 1 of x's 5 inputs alone: pass a batch_size that leaves no "
        "remainder of 1. Its predictions depend on the inputs predicted together; build the "
        "BatchNorm with running statistics (track_running_stats=True, the default) to export "
        "each input alone."
    )


def test_to_inference_data_names_an_x_of_one_input(model_and_guide):
    pytest.importorskip("arviz")
    model, guide = model_and_guide
    x, y = _data(1)
    with pytest.raises(ValueError, match=r"^to_inference_data\(\): batch 1 of x holds 1") as info:
        pyrouq.to_inference_data(model, guide, x, y, num_samples=2)
    assert "x is that one input: export it together with others." in str(info.value)


def test_predicts_words_stay_its_own(model_and_guide):
    model, guide = model_and_guide
    x, _ = _data(1)
    with pytest.raises(ValueError) as info:
        predict(model, x, guide, num_samples=2)
    assert str(info.value).startswith("predict(): batch 1 of x holds 1 input of shape (3,), ")
    assert "x is that one input: predict it together with others." in str(info.value)
    assert str(info.value).endswith("to predict each input alone.")


# 2. fit()'s first batch of one input gets fit()'s words


_FIT_ONE = (
    "Batch 1 of epoch 1 holds 1 input of shape (3,), and a BatchNorm in training mode needs 2 "
    "or more inputs per batch to normalise them (torch: 'Expected more than 1 value per "
    "channel'). Give batches of 2 or more inputs (more examples, or a larger batch_size), or "
    "freeze the BatchNorm with .eval() (it then normalises with its running statistics; one "
    "built with track_running_stats=False takes its batch's statistics in eval mode too)."
)


def test_fit_words_a_first_batch_of_one_input(model_and_guide):
    model, guide = model_and_guide
    x, y = _data(5)
    loader = [(x[:1], y[:1]), (x[1:], y[1:])]
    with pytest.raises(ValueError) as info:
        fit(model, guide, loader, epochs=1, num_data=5, progress=False)
    assert str(info.value) == _FIT_ONE


def test_fit_words_a_data_loader_of_one_example(model_and_guide):
    model, guide = model_and_guide
    x, y = _data(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    with pytest.raises(ValueError) as info:
        fit(model, guide, loader, epochs=1, progress=False)
    assert str(info.value) == _FIT_ONE


# 3. the CLI's --conformal help says what it calibrates on with --calibrate


def test_conformal_help_says_it_follows_the_temperature(capsys):
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--conformal ALPHA conformal prediction sets (LAC, APS, RAPS) at miscoverage ALPHA, "
        "same split; with --calibrate, calibrated on the temperature-scaled predictions"
    ) in text


# 4. a float64 model's learned noise comes back float64


def _regression_net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def test_float64_learned_noise_loads_float64(tmp_path):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = bayesian(_regression_net(), likelihood=Gaussian("learned")).double()
    guide = mean_field_guide(model)
    x = torch.randn(4, 3, dtype=torch.float64)
    predict(model, x, guide, num_samples=1)  # the noise takes its shape on the first call
    noise = torch.tensor([0.1234567890123456789, 1e-12], dtype=torch.float64)
    with torch.no_grad():
        model.likelihood.raw_scale.copy_(noise)
    pyrouq.save(tmp_path / "m.pt", model, guide)
    loaded = pyrouq.load(tmp_path / "m.pt", module=_regression_net())
    raw = loaded.model.likelihood.raw_scale
    assert raw.dtype == torch.float64
    assert torch.equal(raw.detach(), noise)  # neither value is a float32 number
    scale = predict(loaded.model, x, loaded.guide, num_samples=1).scale
    assert scale.dtype == torch.float64


# 5. SyncBatchNorm in a CPU process group: refused before training, in pyrouq's words


def _sync_model() -> nn.Module:
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    return bayesian(nn.SyncBatchNorm.convert_sync_batchnorm(net))


def test_sync_batchnorm_on_the_cpu_is_refused_in_a_gloo_group(gloo_group):
    pyro.clear_param_store()
    model = _sync_model()
    guide = mean_field_guide(model)
    x, y = _data(8)
    with pytest.raises(ValueError) as info:
        fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False)
    text = str(info.value)
    assert text.startswith(
        "fit() runs BayesianNetwork on cpu in a torch.distributed process group (backend "
        "gloo), but it holds SyncBatchNorm layers (net.1), which torch synchronises across "
        "ranks on GPUs only (torch: 'SyncBatchNorm expected input tensor to be on GPU or XPU')."
    )
    assert "build the network with BatchNorm layers instead" in text
    assert "Or train on GPUs in an nccl group" in text


def test_sync_batchnorm_outside_a_process_group_trains():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = _sync_model()
    guide = mean_field_guide(model)
    x, y = _data(8)
    result = fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False)
    assert len(result.losses) == 1
