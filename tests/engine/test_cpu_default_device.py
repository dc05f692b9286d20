"""Review of the hostile-environment fixes: save() reports a disk's error only when the disk
failed, and pyrouq's calls run under the CPU default (not the model's device) whatever torch's
default device is."""

from __future__ import annotations

import os
import re

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import tiny_mlp, toy_data
from pyro.infer.autoguide import AutoNormal

import pyrouq
from pyrouq import ArrayLoader, fit, mean_field_guide


class _Refusing(torch.Tensor):
    """A tensor whose pickling fails with a RuntimeError of its own, after an OSError of its
    own (a stat of a missing file) that it handled."""

    def __reduce_ex__(self, protocol):
        try:
            os.stat("/nonexistent/pyrouq")
        except OSError:
            raise RuntimeError("_Refusing refuses pickling") from None


def test_a_pickling_error_after_an_oserror_of_its_own_is_not_called_a_disk_error(tmp_path):
    model = tiny_mlp()
    model.register_buffer("extra", torch.zeros(2).as_subclass(_Refusing))
    with pytest.raises(RuntimeError, match="_Refusing refuses pickling"):
        pyrouq.save(tmp_path / "m.pt", model, mean_field_guide(model))
    assert list(tmp_path.iterdir()) == []  # (no temporary file left)


class _Caused(torch.Tensor):
    def __reduce_ex__(self, protocol):
        raise RuntimeError("cannot pickle") from ValueError("the real reason")


def test_a_pickling_error_keeps_its_cause(tmp_path):
    model = tiny_mlp()
    model.register_buffer("extra", torch.zeros(2).as_subclass(_Caused))
    with pytest.raises(RuntimeError, match="cannot pickle") as info:
        pyrouq.save(tmp_path / "m.pt", model, mean_field_guide(model))
    assert isinstance(info.value.__cause__, ValueError)


def test_loader_and_callbacks_see_the_cpu_default_under_a_meta_default():
    x, y = toy_data(24)
    seen = []

    def callback(record):
        seen.append(torch.empty(0).device.type)

    model = tiny_mlp()
    torch.set_default_device("meta")
    try:
        fit(model, mean_field_guide(model), ArrayLoader(x, y, batch_size=8, shuffle=True, seed=0),
            epochs=2, progress=False, callbacks=[callback])  # fmt: skip
        after = torch.empty(0).device.type
    finally:
        torch.set_default_device(None)
    assert seen == ["cpu", "cpu"]
    assert after == "meta"  # (the script's default is given back)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_model_trains_from_a_shuffled_cpu_loader_under_the_cpu_default():
    x, y = toy_data(24)
    model = tiny_mlp().cuda()
    result = fit(model, mean_field_guide(model), ArrayLoader(x, y, batch_size=8, seed=0),
                 epochs=1, progress=False)  # fmt: skip
    assert result.steps == 3


class _ZerosNet(torch.nn.Module):
    """A forward that makes a tensor without naming its device (as users' forwards do)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x) + torch.zeros(2)


def test_predict_runs_a_forward_under_the_cpu_default_as_fit_does():
    x, y = toy_data(24)
    model = pyrouq.bayesian(_ZerosNet())
    guide = mean_field_guide(model)
    fit(model, guide, [(x, y)], epochs=1, num_data=24, progress=False)
    expected = pyrouq.predict(model, x, guide, num_samples=3, seed=0).probs
    torch.set_default_device("meta")
    try:
        probs = pyrouq.predict(model, x, guide, num_samples=3, seed=0).probs
    finally:
        torch.set_default_device(None)
    assert torch.equal(probs, expected)


def test_models_built_under_a_meta_default_are_refused_in_words_by_fit_mcmc_save_and_guide(
    tmp_path,
):
    """A model built after torch.set_default_device('meta') (left set from building a
    skeleton) holds shapes, no values: predict() said so, but fit(), mcmc(), save() and
    mean_field_guide() failed in torch's words ('Tensor.item() cannot be called on meta
    tensors', 'Cannot copy out of meta tensor; no data!')."""
    x, y = toy_data(8)
    torch.set_default_device("meta")
    try:
        net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        model, ensemble = pyrouq.bayesian(net), pyrouq.batchensemble(net, 2)
    finally:
        torch.set_default_device(None)
    words = r"{}: the model is on the meta device .*set_default_device\('meta'\).*to_empty"
    with pytest.raises(ValueError, match=words.format(r"mean_field_guide\(\)")):
        mean_field_guide(model)
    with pytest.raises(ValueError, match=words.format(r"fit\(\)")):
        fit(ensemble, None, [(x, y)], epochs=1, progress=False)
    with pytest.raises(ValueError, match=words.format(r"mcmc\(\)")):
        pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1, progress=False)
    with pytest.raises(pyrouq.CheckpointError, match=words.format(r"save\(\)")):
        pyrouq.save(tmp_path / "m.pt", ensemble)
    assert not (tmp_path / "m.pt").exists()


def test_the_arviz_export_and_psis_of_a_meta_model_are_refused_in_words():
    """to_inference_data() of an MCMC result whose model was set to a skeleton on the meta
    device failed in torch's words ('Cannot copy out of meta tensor; no data!'), and
    psis_diagnostic() of such a model with a guide on the CPU told to move the guide there."""
    x, y = toy_data(8)
    result = pyrouq.mcmc(pyrouq.bayesian(torch.nn.Linear(3, 2)), x, y, num_samples=2,
                         warmup_steps=2, num_chains=1, seed=0, progress=False)  # fmt: skip
    guide = mean_field_guide(pyrouq.bayesian(torch.nn.Linear(3, 2)))
    with torch.device("meta"):
        result.model = skeleton = pyrouq.bayesian(torch.nn.Linear(3, 2))
    words = r"^{}: the model is on the meta device .*Build it on the CPU"
    with pytest.raises(ValueError, match=words.format(r"to_inference_data\(\)")):
        pyrouq.to_inference_data(result)
    with pytest.raises(ValueError, match=words.format(r"psis_diagnostic\(\)")):
        pyrouq.psis_diagnostic(skeleton, guide, x, y, num_samples=30)


def test_a_guide_alone_on_the_meta_device_is_named_not_the_model():
    """A guide on the meta device was told "the model is on the meta device" beside a model
    function (no tensors), and beside a pyrouq model on the CPU to move it, guide.to(device),
    which copies no values out of it; the guide is named, and the fix is to_empty on it."""
    x, y = toy_data(8)

    def own(x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
        with pyro.plate("data", x.shape[0]):
            return pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)

    auto = AutoNormal(own)
    auto(x, y)
    model, mlp = pyrouq.bayesian(torch.nn.Linear(3, 2)), pyrouq.BayesianMLP(hidden_features=4)
    images, labels = torch.rand(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)
    words = r"^{}: the guide is on the meta device .*Build it on the CPU.* guide\.to_empty\("
    for call, guide, run in (
        ("psis_diagnostic()", auto, lambda g: pyrouq.psis_diagnostic(own, g, x, y)),
        ("predict()", auto, lambda g: pyrouq.predict(own, x, g, num_samples=2)),
        ("to_inference_data()", auto, lambda g: pyrouq.to_inference_data(own, g, x, y)),
        (
            "psis_diagnostic()",
            mean_field_guide(model),
            lambda g: pyrouq.psis_diagnostic(model, g, x, y),
        ),
        (
            "evaluate_rotations()",
            mean_field_guide(mlp),
            lambda g: pyrouq.evaluate_rotations(mlp, images, labels, guide=g, progress=False),
        ),
        (
            "fit()",
            mean_field_guide(model),
            lambda g: fit(model, g, [(x, y)], epochs=1, progress=False),
        ),
    ):
        with pytest.raises(ValueError, match=words.format(re.escape(call))):
            run(guide.to("meta"))
