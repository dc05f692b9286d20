"""pyrouq under global state a user's script or notebook may have set: a fit() called under
torch.no_grad() / torch.inference_mode() / set_grad_enabled(False), a model loaded or built
inside torch.inference_mode(), and NUTS on a float32 model under a float64 default dtype."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import pyrouq


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g, dtype=torch.float32)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _fitted(context: contextlib.AbstractContextManager) -> tuple[list[float], dict]:
    x, y = _data()
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    with context:
        result = pyrouq.fit(model, guide, [(x, y)], epochs=3, num_data=32, progress=False, seed=0)
    return [r.loss for r in result.history], {k: v.clone() for k, v in guide.state_dict().items()}


@pytest.mark.parametrize(
    "make_context",
    [torch.no_grad, torch.inference_mode, lambda: torch.set_grad_enabled(False)],
    ids=["no_grad", "inference_mode", "grad_disabled"],
)
def test_fit_trains_under_a_callers_grad_off_mode_as_outside_it(make_context):
    """fit() used to run its steps without gradients there: the loss was computed, nothing was
    stepped, and the guide came back untouched with no word of it."""
    losses, state = _fitted(contextlib.nullcontext())
    start = pyrouq.mean_field_guide(pyrouq.bayesian(_net())).state_dict()
    assert any(not torch.equal(state[k], start[k]) for k in state)  # the reference trains
    got_losses, got_state = _fitted(make_context())
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # put back
    assert got_losses == losses
    assert all(torch.equal(got_state[k], state[k]) for k in state)


def test_batchensemble_fit_under_no_grad_trains():
    x, y = _data()
    runs = []
    for context in (contextlib.nullcontext(), torch.no_grad()):
        model = pyrouq.batchensemble(_net(), 2)
        with context:
            result = pyrouq.fit(
                model, None, [(x, y)], epochs=2, num_data=32, progress=False, seed=0
            )
        runs.append(([r.loss for r in result.history], model.state_dict()["net.0.s"].clone()))
    assert runs[1][0] == runs[0][0]
    assert runs[1][0][1] < runs[1][0][0]
    assert torch.equal(runs[1][1], runs[0][1])


def test_model_loaded_inside_inference_mode_trains_later(tmp_path):
    """load() under torch.inference_mode() (to evaluate) used to give inference tensors: a
    later fit() failed in its first step with torch's 'Inference tensors cannot be saved for
    backward'."""
    x, y = _data()
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=32, progress=False, seed=0)
    path = pyrouq.save(tmp_path / "m.pt", model, guide)
    with torch.inference_mode():
        restored = pyrouq.load(path, module=_net())
        seen = pyrouq.predict(
            restored.model, x, restored.guide, num_samples=4, progress=False, seed=0
        )
    expected = pyrouq.predict(model, x, guide, num_samples=4, progress=False, seed=0)
    assert torch.equal(seen.probs, expected.probs)
    tensors = [*restored.model.state_dict().values(), *restored.guide.state_dict().values()]
    assert not any(t.is_inference() for t in tensors)
    before = restored.guide.state_dict()["loc.0__weight"].clone()
    pyrouq.fit(restored.model, restored.guide, [(x, y)], epochs=1, num_data=32, progress=False)
    assert not torch.equal(restored.guide.state_dict()["loc.0__weight"], before)


def test_fit_refuses_a_model_built_inside_inference_mode_naming_the_tensor():
    x, y = _data()
    with torch.inference_mode():
        model = pyrouq.batchensemble(_net(), 2)
    with pytest.raises(RuntimeError, match=r"'net\.0\.weight' is an inference tensor") as err:
        pyrouq.fit(model, None, [(x, y)], epochs=1, num_data=32, progress=False)
    assert "outside torch.inference_mode()" in str(err.value)
    # converting a network made inside it, outside it, copies it into normal tensors: trains
    with torch.inference_mode():
        net = _net()
    model = pyrouq.batchensemble(net, 2)
    result = pyrouq.fit(model, None, [(x, y)], epochs=1, num_data=32, progress=False, seed=0)
    assert result.history[0].loss > 0


@pytest.fixture
def float64_default():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _chain() -> dict[str, torch.Tensor]:
    x, y = _data()
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(4, 3, dtype=torch.float32))
    result = pyrouq.mcmc(
        model, x[:16], y[:16], num_samples=3, warmup_steps=3, num_chains=1, seed=0, progress=False
    )
    return result.samples


def test_mcmc_of_a_float32_model_under_a_float64_default_dtype(float64_default):
    """Pyro's plate and deterministic sites give float64 zeros under a float64 default, which
    made a float32 model's potential energy float64, NUTS's steps with it, and the network
    failed on 'mat1 and mat2 must have the same dtype' (in-process chains only)."""
    got = _chain()
    assert torch.get_default_dtype() == torch.float64  # put back after the chain
    torch.set_default_dtype(torch.float32)
    expected = _chain()
    torch.set_default_dtype(torch.float64)
    assert {v.dtype for v in got.values()} == {torch.float32}
    assert all(torch.equal(got[k], expected[k]) for k in expected)
