"""Fifth audit of the engine, against independent references (``functional_call`` looped over
the draws, weight sampling): the draws run one at a time after vmap refuses a network find
the input and the network's buffers as they came (copied until a pass in the network's mode
runs through); an ensemble's folded batch may be empty; float16 local reparameterisation adds
no noise where the variance is 0 (nor a floor of 0.008 elsewhere); weights of another shape,
or of no draws, are refused naming the site."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

import pyrouq
from pyrouq import _engine, batchensemble, bayesian, rank1


class _ScalesItsInput(nn.Module):
    """Doubles its input in place, then branches on a value: vmap refuses the branch after
    the input has changed."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        h = self.a(x)
        if h.sum() > -1e9:  # data-dependent control flow
            h = h.relu()
        return self.b(h)


@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_draws_run_after_a_vmap_refusal_find_the_input_as_it_came(kind):
    """The accelerator schedule's vmap pass doubled the input before failing; the draws then
    run one at a time doubled it again (outputs off by 1.1 from functional_call's)."""
    torch.manual_seed(0)
    net = _ScalesItsInput().double()
    model = bayesian(copy.deepcopy(net))
    weights = {k: v.detach() + 0.1 * torch.randn(3, *v.shape, dtype=torch.float64)
               for k, v in model.template().items()}  # fmt: skip
    x = torch.randn(5, 4, dtype=torch.float64)
    expected = torch.stack(
        [
            functional_call(net, {k: v[s] for k, v in weights.items()}, (x.clone(),))
            for s in range(3)
        ]
    )
    given = x.clone()
    with _engine.schedule(kind), torch.no_grad():
        out = model.outputs(given, weights)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(given, 2 * x)  # changed in place once, as torch's call does


class _CountsItsCalls(_ScalesItsInput):
    """Adds one to a buffer of its own at every call, then branches on a value."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_draws_run_after_a_vmap_refusal_find_the_buffers_as_they_were(kind):
    """The accelerator schedule's vmap pass added to the buffer before failing; the three
    draws then run one at a time added three more (4, where three calls of torch's give 3)."""
    torch.manual_seed(0)
    model = bayesian(_CountsItsCalls().double())
    weights = {k: v.detach() + 0.1 * torch.randn(3, *v.shape, dtype=torch.float64)
               for k, v in model.template().items()}  # fmt: skip
    with _engine.schedule(kind), torch.no_grad():
        model.outputs(torch.randn(5, 4, dtype=torch.float64), weights)
    assert float(model.net.calls) == 3.0


class _CountsAndBranchesInTraining(nn.Module):
    """Adds one to a buffer of its own at every call; branches on a value in training only."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.norm(self.a(x))
        if self.training and h.sum() > -1e9:  # (vmap refuses it in training only)
            h = h.relu()
        return h


def test_a_network_whose_vmap_pass_ran_through_has_no_buffer_copied_again():
    """Every call on the accelerator schedule copied every buffer of the network (a kernel
    launch each on a GPU: 60 for a ResNet-18's BatchNorm statistics) for a refusal that a
    network whose pass ran through does not meet; only its first call in a mode copies them,
    and a mode whose pass is refused still finds them as they were."""
    torch.manual_seed(0)
    model = bayesian(_CountsAndBranchesInTraining().double())
    net = model.net
    weights = {k: v.detach() + 0.1 * torch.randn(3, *v.shape, dtype=torch.float64)
               for k, v in model.template().items()}  # fmt: skip
    x = torch.randn(5, 4, dtype=torch.float64)
    buffers = {id(b) for b in net.buffers()}
    copied: list[int] = []

    class Copies(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.clone and id(args[0]) in buffers:
                copied.append(id(args[0]))
            return func(*args, **(kwargs or {}))

    with _engine.schedule("accelerator"), torch.no_grad(), Copies():
        net.eval()
        for _ in range(3):  # eval: vmap runs through, the counter moves once a call
            model.outputs(x, weights)
        first = len(copied)
        net.train()
        net.norm.eval()  # (no batch statistics: the draws go to vmap)
        model.outputs(x, weights)  # training: refused after the counter moved; 3 draws
    # the counter and BatchNorm's 3 buffers, at the first call of each mode
    assert first == 4 and len(copied) == 8
    assert float(net.calls) == 3.0 + 3.0


class _CountsAndBranchesWithGradients(nn.Module):
    """Adds one to a buffer of its own at every call; branches on a value with gradients on."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.a(x)
        if torch.is_grad_enabled() and h.sum() > -1e9:  # (vmap refuses it with gradients)
            h = h.relu()
        return h


def test_a_pass_run_through_without_gradients_keeps_the_buffers_for_one_with_them():
    """Gradients are part of the mode a pass ran through in: the first call with them on,
    refused after the counter moved, finds it as it was (3 draws: 3, not 4)."""
    torch.manual_seed(0)
    model = bayesian(_CountsAndBranchesWithGradients().double())
    weights = {k: v.detach() + 0.1 * torch.randn(3, *v.shape, dtype=torch.float64)
               for k, v in model.template().items()}  # fmt: skip
    x = torch.randn(5, 4, dtype=torch.float64)
    with _engine.schedule("accelerator"):
        with torch.no_grad():
            model.outputs(x, weights)  # vmap runs through: the counter moves once
        model.outputs(x, weights)  # with gradients: refused, then the 3 draws one at a time
    assert float(model.net.calls) == 1.0 + 3.0


class _SumsItsActivations(nn.Module):
    """Adds the mean of its activations to a buffer of its own at every call (no_grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.register_buffer("total", torch.zeros(3, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        with torch.no_grad():
            self.total.mul_(0.5).add_(h.mean(0))
        return h


@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_draws_that_update_a_buffer_by_their_values_run_one_at_a_time(kind):
    """Under vmap the update of one buffer by three draws' values failed with torch's
    "output with shape [3] doesn't match the broadcast shape [3, 3]" (on accelerators only):
    the draws now run one at a time, as torch's three calls do."""
    torch.manual_seed(0)
    net = _SumsItsActivations().double()
    model = bayesian(copy.deepcopy(net))
    weights = {k: v.detach() + 0.1 * torch.randn(3, *v.shape, dtype=torch.float64)
               for k, v in model.template().items()}  # fmt: skip
    x = torch.randn(5, 4, dtype=torch.float64)
    draws = [{k: v[s] for k, v in weights.items()} for s in range(3)]
    expected = torch.stack([functional_call(net, draw, (x,)) for draw in draws])
    with _engine.schedule(kind), torch.no_grad():
        out = model.outputs(x, weights)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.net.total, net.total, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_an_ensemble_runs_an_empty_batch_as_torch_does(kind):
    """On the folded batch (a GPU's schedule), an empty batch raised ZeroDivisionError
    ("integer modulo by zero"): torch's network gives (0, D)."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, groups=2), nn.Flatten(), nn.Linear(4, 5), nn.LayerNorm(5),
        nn.Linear(5, 3),
    )  # fmt: skip
    empty, one = torch.randn(0, 1, 6, 6), torch.randn(1, 1, 6, 6)
    assert net(empty).shape == (0, 3)
    for norms in ("per_member", "shared"):
        ensemble = batchensemble(net, 3, norms=norms).eval()
        with _engine.schedule(kind):
            assert ensemble.outputs(empty).shape == (3, 0, 3)
            members = ensemble.outputs(one)
        with _engine.schedule("cpu" if kind == "accelerator" else "accelerator"):
            torch.testing.assert_close(ensemble.outputs(one), members)
    model = rank1(net, 3)
    weights = {k: v.detach() + torch.zeros(2, *v.shape) for k, v in model.template().items()}
    with _engine.schedule(kind):
        assert model.outputs(empty, weights).shape == (2, 3, 0, 3)


def test_float16_local_reparameterisation_draws_the_variances_it_computes():
    """The noise scale was sqrt(max(var, float16's tiny, 6.1e-5)): 0.0078 where the exact
    scale is 0 (an input row of zeros, no bias) or 0.001 (scale 1e-3 on inputs 0.5)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3, bias=False)).half()
    model = bayesian(net, local_reparameterization=True)
    assert model.local_layers() == {"0": ("0.weight", None)}
    loc = {k: v.detach() for k, v in model.template().items()}
    scale = {k: torch.full_like(v, 1e-3) for k, v in loc.items()}
    x = torch.zeros(2, 4, dtype=torch.float16)
    x[1] = 0.5
    draws = _engine.run_local(model.net, x, loc, scale, model.local_layers(), 4000)
    assert draws.dtype == torch.float16
    spread = draws.float().std(0)
    assert torch.equal(spread[0], torch.zeros(3))  # no variance, no noise
    exact = (0.25 * 4 * 1e-6) ** 0.5  # sqrt(sum_j x_j^2 scale^2)
    torch.testing.assert_close(spread[1], torch.full((3,), exact), rtol=0.1, atol=0)
    # the gradient stays finite where the variance is 0
    scale = {k: v.clone().requires_grad_() for k, v in scale.items()}
    out = _engine.run_local(model.net, x, loc, scale, model.local_layers())
    (grad,) = torch.autograd.grad(out.float().sum(), list(scale.values()))
    assert torch.isfinite(grad).all()
    # float32 and float64 draw as before, to the bit
    for dtype in (torch.float32, torch.float64):
        var = torch.tensor([0.0, 1e-40, 2.5e-7, 3.0], dtype=dtype)
        before = var.clamp_min(torch.finfo(dtype).tiny).sqrt()
        assert torch.equal(_engine._layer_calls.noise_scale(var), before)


@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_weights_of_another_shape_or_of_no_draws_are_refused_naming_the_site(kind):
    """torch said "mat1 and mat2 shapes cannot be multiplied (5x4 and 8x4)", or, for no draws,
    "stack expects a non-empty TensorList" and vmap "Expected at least one Tensor to vmap
    over"."""
    model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    draws = {k: v.detach() + torch.zeros(3, *v.shape) for k, v in model.template().items()}
    x = torch.randn(5, 4)
    with _engine.schedule(kind):
        for wrong in (torch.zeros(3, 4, 8), torch.zeros(8)):
            with pytest.raises(ValueError, match=r"'0\.weight' takes draws of shape \(8, 4\)"):
                model.outputs(x, {**draws, "0.weight": wrong})
        none = {k: v[:0] for k, v in draws.items()}
        with pytest.raises(ValueError, match=r"'0\.weight' carries no draws: shape \(0, 8, 4\)"):
            model.outputs(x, none)
        assert model.outputs(x, draws).shape == (3, 5, 3)


def test_a_bare_layer_is_drawn_by_its_pre_activations():
    # the layer at the root path '' was looked up as '.weight': local reparameterisation was
    # silently off for bayesian(nn.Linear(...), local_reparameterization=True)
    model = bayesian(nn.Linear(4, 3), local_reparameterization=True)
    assert model.local_layers() == {"": ("weight", "bias")}
    conv = bayesian(nn.Conv2d(1, 2, 3, bias=False), local_reparameterization=True)
    assert conv.local_layers() == {"": ("weight", None)}


def test_a_float16_bayesian_linear_draws_its_outputs_with_the_variance_it_computes():
    # sqrt(max(var, float16's tiny 6.1e-5)) gave every output a spread of at least 0.0078
    torch.manual_seed(0)
    layer = pyrouq.nn.BayesianLinear(4, 3, local_reparameterization=True).half()
    x = torch.zeros(2, 4, dtype=torch.float16)
    x[1] = 0.5
    w_loc, b_loc = torch.zeros(3, 4).half(), torch.zeros(3).half()
    w_scale, b_scale = torch.full((3, 4), 1e-3).half(), torch.full((3,), 1e-3).half()
    draws = layer.sample_with(x, w_loc, w_scale, b_loc, b_scale, num_draws=4000).float()
    exact = torch.tensor([1e-3, (4 * 0.25 * 1e-6 + 1e-6) ** 0.5])  # sqrt(sum x^2 s^2 + s_b^2)
    torch.testing.assert_close(draws.std(0), exact[:, None].expand(2, 3), rtol=0.1, atol=0)


class _Attends(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "layer":
            self.att: nn.Module = nn.TransformerEncoderLayer(
                8, 2, 16, dropout=0.0, batch_first=True
            )
        else:
            self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.att(x) if self.kind == "layer" else self.att(x, x, x, need_weights=False)[0]
        return self.head(h.mean(1))


@pytest.mark.parametrize("kind", ["layer", "attention"])
def test_draws_of_fused_attention_in_eval_mode_get_the_plain_gradients_from_vmap(kind):
    """Every tensor of the attention latent, eval mode, gradients on: inside the accelerator
    schedule's vmap pass torch saw no draw requiring gradients and ran its fused kernels, whose
    backward failed ('derivative for aten::_native_multi_head_attention is not implemented',
    or for aten::_transformer_encoder_layer_fwd)."""
    torch.manual_seed(0)
    net = _Attends(kind).eval()
    model = bayesian(copy.deepcopy(net), select=lambda name, param: True).eval()
    base = {k: v.detach() + 0.1 * torch.randn(3, *v.shape) for k, v in model.template().items()}
    x = torch.randn(4, 5, 8)
    weights = {k: v.clone().requires_grad_() for k, v in base.items()}
    with _engine.schedule("accelerator"):
        model.outputs(x, weights).square().sum().backward()
    given = {k: v.clone().requires_grad_() for k, v in base.items()}
    plain = [functional_call(net, {k: v[s] for k, v in given.items()}, (x,)) for s in range(3)]
    torch.stack(plain).square().sum().backward()
    for site, value in weights.items():
        torch.testing.assert_close(value.grad, given[site].grad, rtol=1e-4, atol=1e-5)
    assert torch.backends.mha.get_fastpath_enabled()  # switched back on after the pass
