"""Eighth audit of the engine's CPU fast paths, against plain PyTorch on the same weights: the
2x2 max-pooling kernel lays its output out as torch does (a forward that ``.view()``s a pooled
transposed activation ran in torch and failed converted), and the max-pooling kernels give
torch's values and gradients for padded, dilated, ceil-mode windows on NaNs and ties, in any
input layout."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

from pyrouq import _engine, batchensemble, bayesian


class _PoolsTransposed(nn.Module):
    """Pools a transposed (neither NCHW- nor channels-last-contiguous) activation, then
    ``.view()``s the result, which torch's pooling lays out contiguously."""

    def __init__(self, pool: nn.Module, features: int):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.pool = pool
        self.fc = nn.Linear(features, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(torch.relu(self.conv(x)).transpose(2, 3))
        return self.fc(h.view(h.shape[0], -1))


@pytest.mark.parametrize(("pool", "features"), [(nn.MaxPool2d(2), 36), (nn.MaxPool2d(3, 2), 16)])
@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_a_view_after_pooling_a_transposed_activation_runs_as_in_torch(pool, features, kind):
    """The 2x2 kernel kept a strided input's layout in its output, where torch's lays it out
    anew: ``h.view(B, -1)`` after it raised "view size is not compatible" for a network that
    runs in torch, with gradients and without."""
    torch.manual_seed(0)
    net = _PoolsTransposed(pool, features).double()
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    model = bayesian(copy.deepcopy(net))
    weights = {k: v.detach().clone().requires_grad_() for k, v in model.template().items()}
    leaf, ref_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = functional_call(net, weights, (ref_leaf,))
    seed = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, [ref_leaf, *weights.values()], seed)
    with _engine.schedule(kind):
        out = model.outputs(leaf, weights)
        grads = torch.autograd.grad(out, [leaf, *weights.values()], seed)
        with torch.no_grad():
            torch.testing.assert_close(model.outputs(x, weights), expected, rtol=0, atol=1e-12)
        members = batchensemble(net, 2, r_std=0.0, s_std=0.0).double().eval()
        with torch.inference_mode():
            every = members.outputs(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(every, expected.detach().expand(2, -1, -1), rtol=0, atol=1e-12)


def _pooling_net(pool: nn.Module, channels: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(), pool, nn.Flatten(), nn.LazyLinear(3)
    )


_POOLS = [
    nn.MaxPool2d(2),
    nn.MaxPool2d(3, 2, 1, ceil_mode=True),
    nn.MaxPool2d(2, 1, 1, dilation=2),
    nn.MaxPool2d((3, 2), (2, 1), (1, 0), (1, 2), ceil_mode=True),
]


@pytest.mark.parametrize("pool", _POOLS, ids=["2x2", "3x3-ceil", "dilated", "uneven"])
@pytest.mark.parametrize("channels", [4, 16])  # 16: the channels-last pooling kernel
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided", "one"])
def test_max_pooling_gives_torchs_values_and_gradients(pool, channels, layout):
    """Windows with padding, dilation and ceil mode, over NaNs and ties (the ReLU's zeros and
    rounded inputs), on NCHW, channels-last and strided inputs and a batch of one: the values
    and the gradients for the input and the weights are torch's, forward and backward."""
    torch.manual_seed(0)
    net = _pooling_net(copy.deepcopy(pool), channels).double()
    x = torch.randn(3, 1, 7, 9, dtype=torch.float64).round()  # ties within the windows
    x[1, 0, 2, 3] = float("nan")
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":
        x = torch.cat([x, x], -1)[..., ::2]
    elif layout == "one":
        x = x[1:2]
    net(x)  # (the lazy layer takes its size)
    model = bayesian(copy.deepcopy(net))
    weights = {k: v.detach().clone().requires_grad_() for k, v in model.template().items()}
    leaf, ref_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected = functional_call(net, weights, (ref_leaf,))
    seed = torch.randn_like(expected)
    want = torch.autograd.grad(expected, [ref_leaf, *weights.values()], seed)
    with _engine.schedule("cpu"):
        out = model.outputs(leaf, weights)
        got = torch.autograd.grad(out, [leaf, *weights.values()], seed)
        with torch.no_grad():
            plain = model.outputs(x, weights)
    assert out.isnan().any() and want[1].isnan().any()  # the NaN reached outputs, gradients
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(plain, expected, rtol=0, atol=1e-12, equal_nan=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("pool", [nn.MaxPool2d(2), nn.MaxPool2d(3, 2, 1)], ids=["2x2", "3x3"])
def test_convolutions_and_pooling_run_their_draws_as_one_vmap_pass(pool):
    """The accelerators' schedule runs S weight draws as one ``vmap`` pass: the pools asked the
    batched activation whether it was channels-last, which vmap refuses ("NYI: querying
    is_contiguous inside of vmap"), so a network of convolutions and max-pooling (LeNet) ran
    a failed pass, then its draws one at a time (the pool called 1 + S times, not once)."""
    torch.manual_seed(0)
    net = _pooling_net(copy.deepcopy(pool), 16).double()
    x = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    net(x)  # (the lazy layer takes its size)
    model = bayesian(copy.deepcopy(net))
    weights = {k: v.detach() + 0.1 * torch.randn(4, *v.shape, dtype=torch.float64)
               for k, v in model.template().items()}  # fmt: skip
    expected = torch.stack(
        [functional_call(net, {k: v[s] for k, v in weights.items()}, (x,)) for s in range(4)]
    )
    calls = []
    model.net[2].register_forward_pre_hook(lambda *_: calls.append(1))
    with _engine.schedule("accelerator"), torch.no_grad():
        out = model.outputs(x, weights)
    assert len(calls) == 1
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
