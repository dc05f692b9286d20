"""Second audit of the layers and the engine, against independent references: a BatchEnsemble
layer's member m is the plain torch layer with weight ``W * (s_m r_m^T)`` and bias ``b_m``;
S draws of the engine are S ``functional_call`` runs; its gradients are autograd's of the plain
computation (``gradcheck``); the pooling fast paths refuse what torch refuses. And the audit's
fixes: a single draw on the accelerator schedule, a shared site listed first, a stacked input
of another count of draws to ``BayesianConv2d``."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _toy import Flattened
from torch import nn
from torch.func import functional_call

from pyrouq import KLWeightedELBO, _engine, batchensemble, bayesian, mean_field_guide
from pyrouq.nn import BATCHENSEMBLE_LAYERS, BayesianConv2d

F64 = torch.float64


def _member_weight(layer, m: int) -> torch.Tensor:
    """Member m's weight entry by entry: ``W[o, j, ...] * s_m[o] * r_m[input channel of j]``
    (a transposed convolution's W is ``(in, out / groups, ...)``)."""
    w, r, s = layer.weight.detach(), layer.r.detach()[m], layer.s.detach()[m]
    if w.dim() == 2:
        return w * torch.outer(s, r)
    extra, groups = (1,) * (w.dim() - 2), layer.groups
    if layer.transposed:
        cin, per_out = w.shape[:2]
        outs = [[c // (cin // groups) * per_out + j for j in range(per_out)] for c in range(cin)]
        return w * r.reshape(cin, 1, *extra) * s[torch.tensor(outs)].reshape(cin, per_out, *extra)
    cout, per_in = w.shape[:2]
    ins = [[o // (cout // groups) * per_in + j for j in range(per_in)] for o in range(cout)]
    return w * s.reshape(cout, 1, *extra) * r[torch.tensor(ins)].reshape(cout, per_in, *extra)


_LAYERS = [
    (lambda: nn.Linear(5, 4, bias=False), (2, 3, 5)),
    (lambda: nn.Linear(1, 6), (2, 1)),  # one input feature: the repeated-input path
    (lambda: nn.Linear(48, 48), (1, 48)),  # weights outnumber the activations: scaled path
    (lambda: nn.Conv1d(4, 6, 3, padding=2, dilation=2, groups=2, padding_mode="circular"),
     (2, 4, 9)),
    (lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), padding_mode="reflect"),
     (2, 4, 7, 8)),
    (lambda: nn.Conv2d(6, 6, 3, groups=6, bias=False, padding="same"), (2, 6, 5, 5)),
    (lambda: nn.Conv2d(1, 5, 3), (2, 1, 6, 6)),
    (lambda: nn.Conv2d(32, 32, 3, padding=1), (1, 32, 2, 2)),
    (lambda: nn.Conv3d(2, 4, 3, padding=1, padding_mode="replicate"), (2, 2, 4, 5, 3)),
    (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
     (2, 4, 5)),
    (lambda: nn.ConvTranspose2d(1, 3, 2, stride=2, bias=False), (2, 1, 4, 4)),
    (lambda: nn.ConvTranspose3d(2, 4, 3, stride=2, groups=2), (2, 2, 3, 3, 2)),
]  # fmt: skip


@pytest.mark.parametrize("make,shape", _LAYERS)
@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_each_member_of_a_layer_is_the_plain_layer_with_its_rank1_weight(make, shape, kind):
    """Folded batch, member passes (run_members), float64 to 1e-12."""
    torch.manual_seed(0)
    base, members = make().double(), 3
    layer = BATCHENSEMBLE_LAYERS[type(base)].from_module(base, members).double()
    with torch.no_grad():
        layer.bias.copy_(torch.randn_like(layer.bias))
    x = torch.randn(*shape, dtype=F64)
    expected = []
    for m in range(members):
        plain = copy.deepcopy(base)
        plain.weight = nn.Parameter(_member_weight(layer, m))
        plain.bias = nn.Parameter(layer.bias.detach()[m].clone())
        expected.append(plain(x).detach())
    reference = torch.stack(expected)
    with _engine.schedule(kind), torch.no_grad():
        folded = layer(x.repeat(members, *[1] * (x.dim() - 1))).unflatten(0, (members, -1))
        passes = _engine.run_members(Flattened(layer), x, members)
    torch.testing.assert_close(folded, reference, rtol=0, atol=1e-12)
    torch.testing.assert_close(passes, reference.flatten(2), rtol=0, atol=1e-12)


def _convnet(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, padding_mode="reflect"), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, width, 3, groups=width // 2 or 1), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
        nn.Flatten(), nn.Linear(width, 3),
    )  # fmt: skip


@pytest.mark.parametrize("width", [4, 16])  # 16: channels-last on CPU
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 2), (4, 1)])
@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_s_draws_are_s_functional_calls(width, lead, kind):
    torch.manual_seed(0)
    net = _convnet(width).double()
    model = bayesian(net)
    count = int(torch.Size(lead).numel())
    weights = {k: v.detach() + 0.1 * torch.randn(*lead, *v.shape, dtype=F64)
               for k, v in model.template().items()}  # fmt: skip
    x = torch.randn(2, 1, 6, 6, dtype=F64)
    flat = {k: v.reshape(count, *v.shape[len(lead) :]) for k, v in weights.items()}
    expected = torch.stack(
        [functional_call(net, {k: v[s] for k, v in flat.items()}, (x,)) for s in range(count)]
    )
    with _engine.schedule(kind):
        out = model.outputs(x, weights)
    shape = _engine.output_dims(torch.Size(lead))
    assert out.shape == (*shape, 2, 3)
    torch.testing.assert_close(out.reshape(count, 2, 3), expected, rtol=0, atol=1e-12)


def test_a_single_draw_runs_on_the_accelerator_schedule():
    """Weights of one draw, (1, ...), have no site to vmap over: they run as one pass (on a
    GPU, KLWeightedELBO(vectorize_particles=True) with its default single particle failed:
    "vmap: Expected at least one Tensor to vmap over")."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    x = torch.randn(5, 4)
    weights = {k: v.detach().unsqueeze(0) for k, v in model.template().items()}
    with _engine.schedule("cpu"):
        expected = model.outputs(x, weights)
    with _engine.schedule("accelerator"):
        out = model.outputs(x, weights)
    assert out.shape == (1, 5, 3)
    torch.testing.assert_close(out, expected)
    model.num_data = 5
    guide = mean_field_guide(model)
    y = torch.tensor([0, 1, 2, 0, 1])
    losses = []
    for kind in ("cpu", "accelerator"):
        torch.manual_seed(1)
        with _engine.schedule(kind):
            losses.append(KLWeightedELBO(vectorize_particles=True).loss(model, guide, x, y))
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_a_site_of_a_single_draw_is_shared_wherever_it_comes(kind):
    """A site with one draw is shared by every draw, also when it is the first site (it was
    taken for the draws' count, and the others refused: "carries 4 draws where the others
    carry 1")."""
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    template = {k: v.detach() for k, v in model.template().items()}
    first = next(iter(template))
    weights = {k: v + 0.1 * torch.randn(4, *v.shape) for k, v in template.items()}
    weights[first] = template[first].unsqueeze(0)
    expanded = {**weights, first: weights[first].expand(4, *template[first].shape)}
    x = torch.randn(5, 4)
    with _engine.schedule(kind):
        out = model.outputs(x, weights)
        assert out.shape == (4, 5, 3)
        torch.testing.assert_close(out, model.outputs(x, expanded))


@pytest.mark.parametrize("width", [2, pytest.param(16, marks=pytest.mark.slow)])
def test_engine_gradients_are_autograds_of_the_plain_computation(width):
    """gradcheck in float64: a BatchEnsemble (member passes, folded batch, the repeated-input
    stem, channels-last at width 16: 20 s, a slow test) and S draws (one at a time, vmap),
    inputs and weights."""
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 3, 1), nn.Flatten(), nn.Linear(3 * 4, 2),
    ).double()  # fmt: skip
    net = batchensemble(base, 2, norms="shared").net
    names = [k for k, _ in net.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in net.parameters()]
    x = torch.randn(2, 1, 4, 4, dtype=F64, requires_grad=True)
    for kind in ("cpu", "accelerator"):

        def members(x, *ps, kind=kind, net=net, names=names):
            wrapper = _engine._MemberPass(net, 2)
            with _engine.schedule(kind):
                return functional_call(
                    wrapper, {f"net.{k}": v for k, v in zip(names, ps, strict=True)}, x
                )

        assert torch.autograd.gradcheck(members, (x, *params), eps=1e-6, atol=1e-7)
    model = bayesian(base)
    keys = list(model.template())
    draws = [(v.detach() + 0.1 * torch.randn(3, *v.shape, dtype=F64)).requires_grad_()
             for v in model.template().values()]  # fmt: skip
    for kind in ("cpu", "accelerator"):

        def outputs(x, *ws, kind=kind, model=model, keys=keys):
            with _engine.schedule(kind):
                return model.outputs(x, dict(zip(keys, ws, strict=True)))

        assert torch.autograd.gradcheck(outputs, (x, *draws), eps=1e-6, atol=1e-7)


def test_chunked_batches_and_batch_one_are_the_whole_batch():
    """Without gradients on CPU, a batch one input over CPU_CHUNK is split: the same outputs as
    one pass per input, members and draws alike."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    ensemble = batchensemble(base, 2)
    model = bayesian(base)
    weights = {k: v.detach() + 0.1 * torch.randn(3, *v.shape, dtype=F64)
               for k, v in model.template().items()}  # fmt: skip
    x = torch.randn(_engine.CPU_CHUNK + 1, 3, dtype=F64)
    with torch.no_grad():
        members, draws = ensemble.outputs(x), model.outputs(x, weights)
        assert members.shape == (2, _engine.CPU_CHUNK + 1, 2)
        for i in (0, _engine.CPU_CHUNK - 1, _engine.CPU_CHUNK):
            one = x[i : i + 1]
            exact = {"atol": 1e-12, "rtol": 0}
            torch.testing.assert_close(members[:, i : i + 1], ensemble.outputs(one), **exact)
            torch.testing.assert_close(draws[:, i : i + 1], model.outputs(one, weights), **exact)


@pytest.mark.parametrize(
    "shape", [(2, 2, 3, 4, 4), (4, 4), (3, 0, 4, 4), (0, 4, 4)], ids=["5d", "2d", "C0", "3dC0"]
)
@pytest.mark.parametrize("grad", [False, True])
def test_the_2x2_pool_refuses_what_torch_refuses(shape, grad):
    """nn.MaxPool2d(2), as prepare() rewrites it, pooled 5-d and 2-d inputs and inputs of no
    channels that torch refuses (a volume through a 2-d pooling ran on silently)."""
    x = torch.randn(*shape, requires_grad=grad)
    with pytest.raises(RuntimeError) as theirs:
        F.max_pool2d(x, 2)
    with pytest.raises(RuntimeError) as ours:
        _engine.MaxPool2x2()(x)
    assert str(ours.value) == str(theirs.value)


def test_bayesian_conv_names_stacked_inputs_of_another_count_of_draws():
    layer = BayesianConv2d(3, 4, 3)
    weight, bias = torch.randn(3, 4, 3, 3, 3), torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"3 weight draws .* shape \(2, 2, 3, 7, 6\).*S = 3"):
        layer.forward_with(torch.randn(2, 2, 3, 7, 6), weight, bias)
    stacked = torch.randn(3, 2, 3, 7, 6)
    expected = torch.stack([F.conv2d(stacked[s], weight[s], bias[s]) for s in range(3)])
    torch.testing.assert_close(layer.forward_with(stacked, weight, bias), expected)
