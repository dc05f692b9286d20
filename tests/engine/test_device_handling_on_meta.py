"""Device handling found by a static review of the accelerator branches, checked on the CPU:
the 'meta' device stands in for a GPU (a tensor made on the CPU where the model's or the
inputs' device should be used shows up there), and torch.cuda is monkeypatched where the
branch only runs on a CUDA machine."""

from __future__ import annotations

import torch
from torch import nn

import pyrouq
from pyrouq._predict_runners import _in_dtype_of
from pyrouq.checkpoint import _describe
from pyrouq.infer import _training


def test_resuming_restores_the_cuda_states_of_the_gpus_present_only(monkeypatch):
    """A checkpoint written where two GPUs were visible (rank 0 of a torchrun node, say) holds
    two CUDA generator states; resumed where one GPU is, torch.cuda.set_rng_state_all(states)
    set the second on a device that is not there: IndexError (or, before CUDA's
    initialisation, a DeferredCudaCallError at the first CUDA call)."""
    calls = []

    def set_rng_state(state, device="cuda"):
        index = device if isinstance(device, int) else torch.device(device).index
        if index >= 1:  # as torch.cuda.default_generators[index] fails with one GPU
            raise IndexError("tuple index out of range")
        calls.append(index)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)
    cpu = torch.get_rng_state()
    states = {"torch": cpu, "cuda": [torch.zeros(16, dtype=torch.uint8)] * 2}
    _training.restore_rng_states(states, [])
    assert calls == [0]
    assert torch.equal(torch.get_rng_state(), cpu)


def test_load_rebuilds_the_priors_on_the_skeletons_device():
    """load(path, module=net) with a skeleton on a GPU rebuilt the network there but its
    priors on the CPU (torch.zeros without a device): a model on two devices, whose non-scalar
    priors then fail in mcmc(), psis_diagnostic() or a Monte Carlo KL ('Expected all tensors
    to be on the same device'). The meta device stands in for the GPU."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    described = _describe.describe_model(pyrouq.bayesian(net))
    with torch.device("meta"):
        skeleton = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    model = _describe._rebuild_converted(described["class"], dict(described["config"]), skeleton)
    devices = {name: t.device.type for name, t in model.state_dict().items()}
    assert any(name.startswith("site_priors.") for name in devices)
    assert set(devices.values()) == {"meta"}, devices


def test_posterior_draws_of_a_model_without_tensors_go_to_the_inputs_device():
    """predict(model, x, posterior_samples=draws) with a Pyro model of the user's own that
    holds no tensors (a function, or every weight a PyroSample) cast the draws to x's dtype but
    left them where they were: numpy's or a loaded MCMC run's CPU draws with x on a GPU failed
    in the model ('Expected all tensors to be on the same device')."""
    draws = {"w": torch.zeros(5, 3, dtype=torch.float64), "k": torch.zeros(5, dtype=torch.long)}
    x = torch.zeros(2, 3, device="meta")
    moved = _in_dtype_of(draws, x)
    assert moved["w"].device.type == "meta" and moved["w"].dtype == torch.float32
    assert moved["k"].device.type == "meta" and moved["k"].dtype == torch.long
    ids = torch.zeros(2, 3, dtype=torch.long, device="meta")  # an embedding's indices
    moved = _in_dtype_of(draws, ids)
    assert moved["w"].device.type == "meta" and moved["w"].dtype == torch.float64
