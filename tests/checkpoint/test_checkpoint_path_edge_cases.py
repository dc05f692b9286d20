"""Second review of the day's audits (diagnostics, rotation, checkpoints): a bfloat16 model's
export, checkpoint paths that name no file ('~' left unexpanded, 'runs/.'), and the advice
for angles given as a list of tensors."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import CheckpointError, bayesian, mean_field_guide, save, to_inference_data
from pyrouq.models import MLP
from pyrouq.rotation import evaluate_rotations


def _bf16(likelihood: str):
    torch.manual_seed(0)
    outputs = 2 if likelihood == "categorical" else 1
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, outputs))
    if likelihood == "categorical":
        model = bayesian(net)
    else:
        model = bayesian(net, likelihood=pyrouq.Gaussian(0.5))
    model = model.to(torch.bfloat16)
    return model, mean_field_guide(model, init_scale=0.1)


@pytest.mark.parametrize(
    ("likelihood", "y"),
    [
        ("categorical", torch.tensor([0, 1, 1, 0, 1, 0])),
        ("gaussian", torch.linspace(-1, 1, 6)),
        ("gaussian", torch.linspace(-1, 1, 6).bfloat16()),
    ],
)
def test_a_bfloat16_model_exports_its_draws_and_targets_as_float32(likelihood, y):
    # its posterior draws (and bfloat16 targets) went to numpy as they were: "Got unsupported
    # ScalarType BFloat16" after every prediction had been made
    model, guide = _bf16(likelihood)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1)).bfloat16()
    idata = to_inference_data(model, guide, x, y, num_samples=3)
    weight = idata.posterior["0.weight"].values
    assert weight.dtype == np.float32 and weight.shape == (1, 3, 4, 3)
    # the draws' own values: bfloat16 numbers, read back exactly
    back = torch.from_numpy(weight).bfloat16().float().numpy()
    np.testing.assert_array_equal(weight, back)
    # the exported draws give the exported log-likelihood
    with torch.no_grad():
        draws = {
            k: torch.from_numpy(idata.posterior[k].values[0]).bfloat16()
            for k in model.latent_sites()
        }
        outputs = model.outputs(x, draws).double()
    if likelihood == "categorical":
        want = torch.log_softmax(outputs, -1).gather(-1, y.expand(3, 6).unsqueeze(-1))[..., 0]
    else:
        want = torch.distributions.Normal(outputs[..., 0], 0.5).log_prob(y.double())
    got = idata.log_likelihood["obs"].values[0]
    # (equal here; 0.02 leaves a bfloat16 rounding of the outputs to a CPU whose kernels
    # round the export's passes and these apart)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=0.02)
    observed = idata.observed_data["obs"].values
    np.testing.assert_array_equal(observed, (y.float() if y.is_floating_point() else y).numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pareto k warnings of 3 draws
        assert math.isfinite(float(pyrouq.summary(idata)["mean"].iloc[0]))


def _mlp():
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(in_features=3, hidden_features=4, out_features=2)
    return model, mean_field_guide(model)


@pytest.mark.parametrize("path", ["~/runs/ckpt.pt", "~"])
def test_a_path_starting_with_a_tilde_is_refused_not_made_a_folder_named_tilde(
    path, tmp_path, monkeypatch
):
    # '~/runs/ckpt.pt' was written to ./~/runs/ckpt.pt, a folder named '~' made in the
    # working directory (torch.save itself fails on such a path: no folder '~')
    monkeypatch.chdir(tmp_path)
    model, guide = _mlp()
    message = rf"^save\(\) got '{path}', whose '~' is not expanded .* os\.path\.expanduser\("
    with pytest.raises(CheckpointError, match=message):
        save(path, model, guide)
    loader = [(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]
    with pytest.raises(CheckpointError, match=r"^fit\(checkpoint=\.\.\.\) got '~/runs/ckpt\.pt'"):
        pyrouq.fit(model, guide, loader, epochs=1, checkpoint="~/runs/ckpt.pt", num_data=4,
                    progress=False)  # fmt: skip
    assert os.listdir(tmp_path) == []
    # what the message says to pass is the path in the home folder
    assert os.path.expanduser(path) != path and not os.path.expanduser(path).startswith("~")


@pytest.mark.parametrize("name", ["runs/.", "runs/.."])
def test_a_path_ending_in_a_dot_names_a_folder_and_is_refused(name, tmp_path):
    # 'runs/.' was written as a file named 'runs' (Path drops the trailing '.')
    model, guide = _mlp()
    given = os.path.join(tmp_path, name)
    with pytest.raises(CheckpointError, match=rf"needs a file path, got the folder '{given}'"):
        save(given, model, guide)
    assert os.listdir(tmp_path) == []


def test_angles_given_as_a_list_of_tensors_are_told_a_conversion_that_works():
    # the advice read "pass e.g. each angle=30 or each angle=float(t)", no Python to pass
    angles = [torch.tensor(0.0), torch.tensor(90.0)]
    x, y = torch.zeros(2, 1, 28, 28), torch.tensor([0, 1])
    message = r"got Tensor tensor\(0\.\); pass e\.g\. angles=\[0, 30\] or angles=\[float\(a\) "
    with pytest.raises(TypeError, match=message + r"for a in angles\]\.$"):
        evaluate_rotations(MLP(), x, y, angles=angles, progress=False)
    rows = evaluate_rotations(MLP(), x, y, angles=[float(a) for a in angles], progress=False)
    assert [row["angle"] for row in rows] == [0.0, 90.0]
