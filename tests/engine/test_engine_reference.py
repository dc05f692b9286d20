"""The engine against its slow reference: ``torch.func.functional_call`` of the plain network,
one draw (or one member) at a time, with the drawn weights put in by hand. Outputs to float
tolerance, gradients with respect to the guide's locations and scales, and the inputs' own
gradients, on both schedules (the CPU's draw-by-draw passes with their kernels, and the
accelerator's ``vmap``); BatchEnsemble / rank-1 members built entry by entry; local
reparameterisation's pre-activation draws computed by hand; and the backward pass of S draws
taken one at a time, which writes the draws' gradient once (not a stack of zeros per draw)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode

import pyrouq
from pyrouq import _engine

F64 = torch.float64
TOL = dict(rtol=1e-9, atol=1e-10)


def _coefficients(out: torch.Tensor) -> torch.Tensor:
    """Fixed weights of a scalar loss that reaches every output with another factor."""
    return torch.linspace(-1.0, 1.0, out.numel(), dtype=out.dtype).reshape(out.shape)


_NETS = {
    "conv2d": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 4, 3, stride=2, padding=1, padding_mode="reflect", bias=False),
            nn.ReLU(),
            nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2, padding_mode="circular"),
            nn.MaxPool2d(2),
            nn.Flatten(),
        ),
        (3, 3, 7, 6),
    ),
    "conv1d_conv3d": (
        lambda: nn.Sequential(
            nn.Conv3d(2, 2, 3, padding=1, padding_mode="replicate"),
            nn.Flatten(2),
            nn.Conv1d(2, 4, 3, stride=2, padding=2, dilation=2, groups=2, padding_mode="circular"),
            nn.Flatten(),
        ),
        (3, 2, 3, 2, 3),
    ),
    "transposed": (
        lambda: nn.Sequential(
            nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1, groups=1),
            nn.Tanh(),
            nn.Flatten(2),
            nn.ConvTranspose1d(4, 2, 2, stride=2, groups=2, bias=False),
            nn.Flatten(),
        ),
        (3, 3, 2, 2),
    ),
    "norms": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 16, 3),
            nn.BatchNorm2d(16),
            nn.GroupNorm(4, 16),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),  # 16 channels: pooled channels-last on CPU
            nn.Conv2d(16, 16, 1),
            nn.Flatten(),
            nn.LayerNorm(16 * 2 * 2),
            nn.Linear(64, 3),
        ),
        (5, 3, 5, 5),
    ),
}


@pytest.mark.parametrize("name", list(_NETS))
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_draws_and_their_gradients_are_functional_call_draw_by_draw(name, count, mode):
    """S = 1 and 3 draws ``loc + scale * eps``: outputs, gradients of loc and scale and of a
    non-contiguous input requiring grad, on both schedules, equal the plain network's
    functional_call once per draw (BatchNorm in training mode: each draw's batch statistics)."""
    make, shape = _NETS[name]
    torch.manual_seed(0)
    base = make().double().train(mode == "train")
    template = pyrouq.bayesian(copy.deepcopy(base)).template()
    g = torch.Generator().manual_seed(1)
    loc = {k: v.detach().clone().requires_grad_() for k, v in template.items()}
    scale = {k: torch.full_like(v, 0.1).requires_grad_() for k, v in template.items()}
    eps = {k: torch.randn(count, *v.shape, generator=g, dtype=F64) for k, v in template.items()}
    x0 = torch.randn(*shape[:-1], shape[-1] * 2, generator=g, dtype=F64)

    def run(kind: str):
        for p in (*loc.values(), *scale.values()):
            p.grad = None
        base_x = x0.clone().requires_grad_()
        x = base_x[..., ::2]  # non-contiguous
        draws = {k: loc[k] + scale[k] * eps[k] for k in loc}
        if kind == "reference":
            plain = copy.deepcopy(base)
            outs = [
                functional_call(plain, {k: v[s] for k, v in draws.items()}, (x,))
                for s in range(count)
            ]
            out = torch.stack(outs)
        else:
            model = pyrouq.bayesian(copy.deepcopy(base))
            model.net.train(mode == "train")
            with _engine.schedule(kind):
                out = model.outputs(x, draws)
        (out * _coefficients(out)).sum().backward()
        grads = [p.grad for p in (*loc.values(), *scale.values())]
        return out.detach(), grads, base_x.grad

    expected = run("reference")
    for kind in ("cpu", "accelerator"):
        out, grads, x_grad = run(kind)
        assert out.shape == expected[0].shape == (count, shape[0], expected[0].shape[-1])
        torch.testing.assert_close(out, expected[0], **TOL)
        for got, want in zip(grads, expected[1], strict=True):
            torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(x_grad, expected[2], **TOL)


def test_embedding_draws_are_functional_call_draw_by_draw():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 3)).double()
    model = pyrouq.bayesian(copy.deepcopy(base)).eval()
    draws = {k: v + 0.1 * torch.randn(2, *v.shape, dtype=F64) for k, v in model.template().items()}
    ids = torch.tensor([[0, 9, 3], [3, 3, 1]])
    expected = torch.stack(
        [functional_call(base, {k: v[s] for k, v in draws.items()}, (ids,)) for s in range(2)]
    )
    for kind in ("cpu", "accelerator"):
        with _engine.schedule(kind):
            torch.testing.assert_close(model.outputs(ids, draws), expected, **TOL)


def _member_weight(weight, r, s, groups, transposed):
    """A member's weight entry by entry: ``W[o, j, ...] * s[o] * r[input channel of j]``."""
    if weight.dim() == 2:
        return weight * torch.outer(s, r)
    extra = (1,) * (weight.dim() - 2)
    if transposed:
        cin, per_out = weight.shape[:2]
        outs = [[c // (cin // groups) * per_out + j for j in range(per_out)] for c in range(cin)]
        return (
            weight * r.reshape(cin, 1, *extra) * s[torch.tensor(outs)].reshape(cin, per_out, *extra)
        )
    cout, per_in = weight.shape[:2]
    ins = [[o // (cout // groups) * per_in + j for j in range(per_in)] for o in range(cout)]
    return weight * s.reshape(cout, 1, *extra) * r[torch.tensor(ins)].reshape(cout, per_in, *extra)


def _members_by_hand(base, layers, values, x, members, mode):
    """``(M, B, D)``: each member the plain network with its weights built entry by entry
    (``values``: a layer's tensors by dotted name, drawn or the layer's own)."""
    outs = []
    for m in range(members):
        weights = {}
        for path, layer in layers:

            def get(attr, path=path, layer=layer):
                return values.get(f"{path}.{attr}", getattr(layer, attr))

            weights[f"{path}.weight"] = _member_weight(
                get("weight"),
                get("r")[m],
                get("s")[m],
                layer.groups if hasattr(layer, "groups") else 1,
                getattr(layer, "transposed", False),
            )
            weights[f"{path}.bias"] = get("bias")[m]
        outs.append(functional_call(copy.deepcopy(base).train(mode == "train"), weights, (x,)))
    return torch.stack(outs)


_ENSEMBLE_NETS = [
    # the stem of one input channel (the folded batch's repeated-input path), reflect padding
    (
        lambda: nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1, padding_mode="reflect"),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(4 * 5 * 5, 3),
        ),
        (3, 1, 5, 5),
    ),
    # weights outnumbering a single input's activations: the members' scaled activations
    (lambda: nn.Sequential(nn.Linear(40, 48), nn.ReLU(), nn.Linear(48, 3)), (1, 40)),
    # grouped convolutions, a transposed one, GroupNorm and LayerNorm
    (
        lambda: nn.Sequential(
            nn.Conv2d(4, 8, 3, groups=2, padding=1, padding_mode="circular", bias=False),
            nn.GroupNorm(2, 8),
            nn.ReLU(),
            nn.ConvTranspose2d(8, 4, 2, stride=2, groups=2),
            nn.Flatten(),
            nn.LayerNorm(4 * 8 * 8),
            nn.Linear(4 * 8 * 8, 2),
        ),
        (3, 4, 4, 4),
    ),
]


@pytest.mark.parametrize("index", range(len(_ENSEMBLE_NETS)))
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_batchensemble_members_and_gradients_are_hand_built_member_networks(index, mode):
    """Outputs, gradients of W, r, s and the biases, and the input's gradient, of every member
    pass / folded batch / scaled-activation path equal the plain network run per member with
    ``diag(s_m) W diag(r_m)`` built entry by entry."""
    make, shape = _ENSEMBLE_NETS[index]
    torch.manual_seed(0)
    base = make().double()
    members = 3
    results = {}
    for kind in ("reference", "cpu", "accelerator"):
        torch.manual_seed(0)
        ensemble = pyrouq.batchensemble(copy.deepcopy(base), members)
        ensemble.net.train(mode == "train")
        with torch.no_grad():
            for module in ensemble.modules():
                if getattr(module, "_is_batchensemble", False):
                    module.bias.copy_(torch.randn_like(module.bias))
        x = torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(2))
        x.requires_grad_()
        if kind == "reference":
            layers = [(p, m) for p, m in ensemble.net.named_modules() if hasattr(m, "r")]
            out = _members_by_hand(base, layers, {}, x, members, mode)
        else:
            with _engine.schedule(kind):
                out = ensemble(x)
        (out * _coefficients(out)).sum().backward()
        layers = [m for m in ensemble.modules() if hasattr(m, "r")]  # (norms: the base's)
        grads = {(i, n): p.grad for i, m in enumerate(layers) for n, p in m.named_parameters()}
        results[kind] = (out.detach(), grads, x.grad)
    expected = results["reference"]
    for kind in ("cpu", "accelerator"):
        out, grads, x_grad = results[kind]
        assert out.shape == (members, shape[0], expected[0].shape[-1])
        torch.testing.assert_close(out, expected[0], **TOL)
        assert len(grads) == len(expected[1]) > 0
        for name in grads:
            torch.testing.assert_close(grads[name], expected[1][name], **TOL)
        torch.testing.assert_close(x_grad, expected[2], **TOL)


@pytest.mark.parametrize("count", [1, 2])
def test_rank1_draws_run_every_member_as_hand_built_networks(count):
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)
    ).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = pyrouq.rank1(copy.deepcopy(base), 2).eval()
    template = model.template()
    loc = {k: v.detach().clone().requires_grad_() for k, v in template.items()}
    eps = {k: 0.1 * torch.randn(count, *v.shape, dtype=F64) for k, v in template.items()}
    x = torch.randn(3, 1, 4, 4, dtype=F64)
    layers = [(p, m) for p, m in model.net.named_modules() if hasattr(m, "r")]

    def grads_of(out):
        for p in loc.values():
            p.grad = None
        (out * _coefficients(out)).sum().backward()
        return [p.grad.clone() for p in loc.values()]

    draws = {k: loc[k] + eps[k] for k in loc}
    expected = torch.stack(
        [
            _members_by_hand(base, layers, {k: v[s] for k, v in draws.items()}, x, 2, "eval")
            for s in range(count)
        ]
    )
    want = grads_of(expected)
    for kind in ("cpu", "accelerator"):
        draws = {k: loc[k] + eps[k] for k in loc}
        with _engine.schedule(kind):
            out = model.outputs(x, draws)
        assert out.shape == (count, 2, 3, 3)
        torch.testing.assert_close(out, expected, **TOL)
        for got, exp in zip(grads_of(out), want, strict=True):
            torch.testing.assert_close(got, exp, **TOL)


def test_local_reparameterisation_draws_the_hand_computed_pre_activations():
    """Each Linear / Conv layer's output is ``mean + sqrt(var) * eps``, its moments computed
    by hand on the input padded by hand (reflect, circular, replicate), in the same random
    order; gradients of locations, scales and the input follow."""
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2, padding=1, padding_mode="reflect", bias=False),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2, padding_mode="circular"),
        nn.Flatten(2),
        nn.Conv1d(4, 2, 3, padding=1, padding_mode="replicate"),
        nn.Flatten(),
        nn.Linear(2 * 16, 3),
    ).double()
    model = pyrouq.bayesian(copy.deepcopy(base), local_reparameterization=True).eval()
    layers = model.local_layers()
    assert list(layers) == ["0", "2", "4", "6"]
    template = model.template()
    loc = {k: v.detach().clone().requires_grad_() for k, v in template.items()}
    scale = {k: (0.05 + 0.1 * torch.rand_like(v)).requires_grad_() for k, v in template.items()}
    x = torch.randn(3, 3, 7, 7, dtype=F64, requires_grad=True)
    torch.manual_seed(7)
    out = _engine.run_local(model.net, x, loc, scale, layers)

    def by_hand(module, args, output, w, b):
        h = args[0]
        if isinstance(module, nn.Linear):
            mean = F.linear(h, loc[w], loc[b])
            var = F.linear(h**2, scale[w] ** 2, scale[b] ** 2)
            return mean + var.sqrt() * torch.randn_like(mean)
        pad, padding = module._reversed_padding_repeated_twice, module.padding
        if module.padding_mode != "zeros":
            h, padding = F.pad(h, pad, mode=module.padding_mode), 0
        conv = (F.conv1d, F.conv2d)[module.weight.dim() - 3]
        settings = (module.stride, padding, module.dilation, module.groups)
        mean = conv(h, loc[w], loc[b] if b else None, *settings)
        var = conv(h**2, scale[w] ** 2, scale[b] ** 2 if b else None, *settings)
        return mean + var.sqrt() * torch.randn_like(mean)

    plain = copy.deepcopy(base)
    for path, (w, b) in layers.items():
        plain.get_submodule(path).register_forward_hook(
            lambda m, a, o, w=w, b=b: by_hand(m, a, o, w, b)
        )
    torch.manual_seed(7)
    expected = plain(x)
    torch.testing.assert_close(out, expected, **TOL)
    leaves = [*loc.values(), *scale.values(), x]
    got = torch.autograd.grad((out * _coefficients(out)).sum(), leaves)
    want = torch.autograd.grad((expected * _coefficients(out)).sum(), leaves)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, **TOL)


class _LargeTensors(TorchDispatchMode):
    """Counts the ops (views aside) that make a tensor of at least ``size`` values."""

    def __init__(self, size: int):
        super().__init__()
        self.size, self.made = size, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() >= self.size and not func.is_view:
            self.made.append(str(func))
        return out


def test_draws_run_one_at_a_time_back_propagate_their_gradient_once():
    """The CPU runs S draws one at a time: the backward pass writes the gradient of the S
    draws once, not a zero tensor of all S draws per draw (S^2 weights written: 3.7 s against
    1.3 s for 16 draws of a 1000 x 1000 layer on two threads)."""
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)))
    count = 4
    draws = {
        k: (v + 0.01 * torch.randn(count, *v.shape)).requires_grad_()
        for k, v in model.template().items()
    }
    plain = model.plain_network()
    x = torch.randn(5, 64)
    with _engine.schedule("cpu"):
        out = model.outputs(x, draws)
    expected = torch.stack(
        [functional_call(plain, {k: v[s] for k, v in draws.items()}, (x,)) for s in range(count)]
    )
    torch.testing.assert_close(out, expected)
    made = _LargeTensors(count * 64 * 64)
    with made:
        (out * _coefficients(out)).sum().backward()
    assert len(made.made) <= 1, made.made  # the old path: 4 select_backward and 3 adds
    want = torch.autograd.grad(
        (expected * _coefficients(expected)).sum(), draws["0.weight"], retain_graph=True
    )[0]
    torch.testing.assert_close(draws["0.weight"].grad, want)
