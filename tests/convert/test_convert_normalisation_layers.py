"""Ninth audit of bring-your-own-network conversion and normalisation layers, as a user with
torchvision's resnet18 and networks of their own (GroupNorm / LayerNorm / InstanceNorm /
BatchNorm1d, a residual regression MLP with a root parameter and a buffer, depthwise, dilated
and transposed convolutions, LSTM / GRU / MultiheadAttention, a tied embedding): fixed draws
against the plain network run by ``torch.func.functional_call``, BatchEnsemble members against
the plain layers with their inputs and outputs scaled by hand, BatchNorm statistics and
parameter counts by hand, priors per layer, refusals, and fit / predict / save / load."""

from __future__ import annotations

import copy

import numpy as np
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import ListLoader
from torch import nn
from torch.func import functional_call

from pyrouq import batchensemble, bayesian, fit, load, mean_field_guide, predict, rank1, save

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _Norms(nn.Module):
    """Every normalisation layer, a depthwise dilated convolution and dropout."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 6)
        self.bn1 = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        h = self.c2(self.inorm(torch.relu(self.gn(self.c(x)))))
        h = torch.relu(self.bn1(self.fc(self.ln(h.mean((2, 3))))))
        return self.out(self.drop(h))


class _ResMLP(nn.Module):
    """A residual regression MLP: blocks in an nn.ModuleDict of nn.Sequential, a parameter
    on the root and a buffer."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(2, 8)
        self.blocks = nn.ModuleDict(
            {k: nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for k in ("a", "b")}
        )
        self.head = nn.Linear(8, 1)
        self.scale = nn.Parameter(torch.tensor(0.7))
        self.register_buffer("offset", torch.tensor([0.3]))

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks.values():
            h = h + block(h)
        return self.head(h) * self.scale + self.offset


class _Convs(nn.Module):
    """Depthwise, grouped, dilated, circular and transposed convolutions (one called with
    output_size), Conv1d and Conv3d."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(4, 8, 3, groups=4, padding=1, padding_mode="reflect")
        self.c = nn.Conv2d(8, 8, 3, stride=2, padding=2, dilation=2, groups=2, bias=False)
        self.t = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.t2 = nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1)
        self.d1 = nn.Conv1d(4, 4, 3, padding="same", padding_mode="circular")
        self.d3 = nn.Conv3d(1, 2, (1, 3, 3), padding=(0, 1, 1))
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        h = self.t(self.c(torch.relu(self.dw(x))))  # (B, 4, 8, 8)
        h = self.t2(h, output_size=[16, 16])
        h = self.d1(h.flatten(2))
        h = self.d3(h.reshape(h.shape[0], 1, 4, 16, 16))
        return self.fc(h.mean((2, 3, 4)))


class _Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 5, batch_first=True)
        self.gru = nn.GRU(5, 5, batch_first=True)
        self.att = nn.MultiheadAttention(5, 1, batch_first=True)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        h, _ = self.gru(self.lstm(x)[0])
        h, _ = self.att(h, h, h)
        return self.fc(h[:, -1])


class _TiedLM(nn.Module):
    """An output layer tied to an embedding, and a Linear called twice."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.mix = nn.Linear(4, 4)
        self.dec = nn.Linear(4, 5, bias=False)
        self.dec.weight = self.emb.weight

    def forward(self, x):
        h = self.emb(x).mean(1)
        return self.dec(torch.tanh(self.mix(torch.tanh(self.mix(h)))))


def _resnet18():
    tvm = pytest.importorskip("torchvision.models")
    return tvm.resnet18(weights=None, num_classes=4)


CASES = {
    "resnet18": (_resnet18, lambda: torch.randn(3, 3, 32, 32), "categorical"),
    "norms": (_Norms, lambda: torch.randn(4, 3, 8, 8), "categorical"),
    "resmlp": (_ResMLP, lambda: torch.randn(4, 2), "gaussian"),
    "convs": (_Convs, lambda: torch.randn(4, 4, 8, 8), "categorical"),
    "recurrent": (_Recurrent, lambda: torch.randn(4, 6, 3), "categorical"),
    "tied": (_TiedLM, lambda: torch.randint(0, 5, (4, 3)), "categorical"),
}


def _first(preds):
    return preds.probs[0] if hasattr(preds, "probs") else preds.loc[0]


def _plain(out, likelihood):
    return out.softmax(-1) if likelihood == "categorical" else out


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("every", [False, True])
def test_a_fixed_draw_gives_the_plain_network_run_with_those_weights(case, every):
    """predict() under one given draw of every latent site (select=None, or every parameter:
    norms, RNN weights, MultiheadAttention's in_proj, the root parameter) equals the
    original module run with that draw by torch.func.functional_call."""
    factory, inputs, likelihood = CASES[case]
    torch.manual_seed(0)
    net = factory().eval()
    x = inputs()
    select = (lambda name, p: p.is_floating_point()) if every else None
    model = bayesian(net, likelihood=likelihood, select=select)
    params = dict(net.named_parameters())
    assert set(model.latent_sites()) <= set(params)
    if every:
        assert set(model.latent_sites()) == set(params)
    g = torch.Generator().manual_seed(1)
    draw = {
        s: params[s].detach() + 0.1 * torch.randn(params[s].shape, generator=g)
        for s in model.latent_sites()
    }
    preds = predict(model, x, posterior_samples={s: v[None] for s, v in draw.items()},
                    progress=False)  # fmt: skip
    with torch.no_grad():
        ref = functional_call(net, draw, (x,), strict=False)
    torch.testing.assert_close(_first(preds), _plain(ref, likelihood), rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["norms", "recurrent", "tied"])
def test_a_guide_with_vanishing_scales_predicts_the_trained_means(case):
    """After fit(), a guide whose scales are ~0 predicts what the original module computes
    with the guide's means, the trained point estimates (norms) and the running statistics
    put in by functional_call."""
    factory, inputs, likelihood = CASES[case]
    torch.manual_seed(0)
    x = inputs()
    y = torch.randint(0, 3, (x.shape[0],))
    model = bayesian(factory(), likelihood=likelihood)
    guide = mean_field_guide(model)
    fit(model, guide, ListLoader(x, y, 2), epochs=2, progress=False)
    with torch.no_grad():
        for rho in guide.rho.values():
            rho.fill_(-80.0)
    preds = predict(model, x, guide, num_samples=2, progress=False)
    means = guide.means()
    state = {k[4:]: v for k, v in model.named_parameters() if k.startswith("net.")}
    state.update(
        {k[4:]: v for k, v in model.named_buffers() if k.startswith("net.") and k[4:] not in means}
    )
    with torch.no_grad():
        ref = functional_call(factory().eval(), {**state, **means}, (x,), strict=False)
    for s in range(2):
        torch.testing.assert_close(preds.probs[s], ref.softmax(-1), rtol=0, atol=1e-6)


class _Scaled(nn.Module):
    """Member m of a BatchEnsemble layer computed with the plain torch layer itself:
    ``s_m * layer_without_bias(x * r_m) + b_m`` (linearity; no folded weights)."""

    def __init__(self, layer, r, s, b):
        super().__init__()
        self.layer = copy.deepcopy(layer)
        self.layer.bias = None
        self.r, self.s, self.b = r, s, b

    def forward(self, x, **kw):
        dim = -1 if isinstance(self.layer, nn.Linear) else 1
        shape = [1] * x.dim()
        shape[dim] = -1
        out = self.layer(x * self.r.reshape(shape), **kw)
        shape = [1] * out.dim()
        shape[dim] = -1
        return out * self.s.reshape(shape) + self.b.reshape(shape)


def _member_by_hand(net, ensemble, member):
    """A copy of ``net`` whose converted layers are :class:`_Scaled` with ``member``'s
    factors and bias, and whose per-member norms are that member's copies."""
    ref = copy.deepcopy(net)
    for name, layer in ensemble.net.named_modules():
        if ".norms." in f"{name}.":  # inside a per-member norm: its copies
            continue
        owner, _, attr = name.rpartition(".")
        parent = ref.get_submodule(owner)
        if getattr(layer, "_is_batchensemble", False):
            plain = getattr(parent, attr)
            setattr(parent, attr, _Scaled(plain, *(t[member].detach() for t in
                                                   (layer.r, layer.s, layer.bias))))  # fmt: skip
        elif getattr(layer, "_is_member_norm", False):
            setattr(parent, attr, copy.deepcopy(layer.norms[member]))
    return ref


@pytest.mark.parametrize("case", ["resnet18", "norms", "convs", "recurrent", "tied"])
@pytest.mark.parametrize("norms", ["per_member", "shared"])
def test_batchensemble_members_are_the_plain_layers_with_scaled_inputs_and_outputs(case, norms):
    """With r = s = 1 every member is the original network; with random factors, member m is
    the original with every Linear / convolution computing s_m * layer(x * r_m) + b_m."""
    factory, inputs, _ = CASES[case]
    torch.manual_seed(0)
    net = factory().eval()
    x = inputs()
    ones = batchensemble(net, 3, r_std=0.0, s_std=0.0, norms=norms).eval()
    with torch.no_grad():
        torch.testing.assert_close(ones(x), net(x).expand(3, *net(x).shape), rtol=0, atol=1e-6)
    ensemble = batchensemble(net, 2, norms=norms).eval()
    with torch.no_grad():
        out = ensemble(x)
        for m in range(2):
            ref = _member_by_hand(net, ensemble, m).eval()(x)
            torch.testing.assert_close(out[m], ref, rtol=1e-5, atol=1e-5)


def test_rank1_under_unit_factors_is_the_plain_network():
    torch.manual_seed(0)
    net = _Norms().eval()
    x = torch.randn(4, 3, 8, 8)
    model = rank1(net, 2)
    ones = {s: torch.ones(1, *shape) for s, shape in model.latent_sites().items()}
    preds = predict(model, x, posterior_samples=ones, progress=False)
    with torch.no_grad():
        ref = net(x).softmax(-1)
    torch.testing.assert_close(preds.probs, ref.expand(2, 4, 3), rtol=0, atol=1e-6)


def _effective_linear(layer, member, z):
    """Member ``member`` of a BatchEnsembleLinear on ``z``, in float64 numpy."""
    w, r, s, b = (t.detach().double().numpy() for t in (layer.weight, layer.r, layer.s,
                                                          layer.bias))  # fmt: skip
    return s[member] * ((z * r[member]) @ w.T) + b[member]


@pytest.mark.parametrize("norms", ["per_member", "shared"])
def test_batchensemble_batchnorm_running_statistics_by_hand(norms):
    """Two training steps: each member's BatchNorm copy holds the momentum-0.1 average of the
    mean and unbiased variance of its own rows; a shared one, of all members' rows."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(6, 3)
    ensemble = batchensemble(net, 3, norms=norms).train()
    with torch.no_grad():
        ensemble(x)
        ensemble(2 * x)
    z = x.double().numpy()
    steps = [[_effective_linear(ensemble.net[0], m, zz) for m in range(3)] for zz in (z, 2 * z)]
    groups = [[m] for m in range(3)] if norms == "per_member" else [[0, 1, 2]]
    for i, members in enumerate(groups):
        mean, var = np.zeros(4), np.ones(4)
        for step in steps:
            h = np.concatenate([step[m] for m in members])
            mean = 0.9 * mean + 0.1 * h.mean(0)
            var = 0.9 * var + 0.1 * h.var(0, ddof=1)
        bn = ensemble.net[1].norms[i] if norms == "per_member" else ensemble.net[1]
        np.testing.assert_allclose(bn.running_mean.numpy(), mean, rtol=0, atol=1e-6)
        np.testing.assert_allclose(bn.running_var.numpy(), var, rtol=0, atol=1e-6)
        assert int(bn.num_batches_tracked) == 2


def test_batchnorm_data_re_estimates_each_members_statistics_as_by_hand():
    """rank1 with per-member norms, one fixed draw, batchnorm_data of 10 rows in batches of 6
    and 4: each member predicts with the batch-size-weighted means of its BatchNorm input's
    batch means and unbiased variances, as computed in numpy; the statistics are put back."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2)).eval()
    model = rank1(net, 2, norms="per_member")
    g = torch.Generator().manual_seed(3)
    draw = {s: 1 + 0.3 * torch.randn(1, *shape, generator=g)
            for s, shape in model.latent_sites().items()}  # fmt: skip
    data, x = torch.randn(10, 3, generator=g), torch.randn(5, 3, generator=g)
    preds = predict(model, x, posterior_samples=draw, batchnorm_data=data, batch_size=6,
                    progress=False)  # fmt: skip
    d = {k: v[0].double().numpy() for k, v in draw.items()}
    w0, b0 = (t.detach().double().numpy() for t in (model.net[0].weight, model.net[0].bias))
    w1, b1 = (t.detach().double().numpy() for t in (model.net[3].weight, model.net[3].bias))
    dd, xx = data.double().numpy(), x.double().numpy()
    for m in range(2):

        def first(z, m=m):
            return d["0.s"][m] * ((z * d["0.r"][m]) @ w0.T) + b0[m]

        bn = model.net[1].norms[m]
        mean = (6 * first(dd[:6]).mean(0) + 4 * first(dd[6:]).mean(0)) / 10
        var = (6 * first(dd[:6]).var(0, ddof=1) + 4 * first(dd[6:]).var(0, ddof=1)) / 10
        gamma, beta = bn.weight.detach().double().numpy(), bn.bias.detach().double().numpy()
        h = np.maximum((first(xx) - mean) / np.sqrt(var + bn.eps) * gamma + beta, 0)
        out = d["3.s"][m] * ((h * d["3.r"][m]) @ w1.T) + b1[m]
        probs = np.exp(out - out.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        np.testing.assert_allclose(preds.probs[m].numpy(), probs, rtol=0, atol=1e-6)
        assert int(bn.num_batches_tracked) == 0  # put back: fresh copies, never trained
        assert not bn.running_mean.any()


def test_parameter_counts_by_hand():
    torch.manual_seed(0)
    net, m = _Norms(), 3

    def linear(i, o):
        return o * i + m * (i + o + o)  # W, r, s, per-member bias

    def conv(i, o, k, groups=1):
        return o * (i // groups) * k * k + m * (i + o + o)

    layers = conv(3, 8, 3) + conv(8, 8, 3, groups=8) + linear(8, 6) + linear(6, 3)
    norms = 16 + 16 + 16 + 12  # gn, inorm, ln, bn1: weight and bias
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    assert count(batchensemble(net, m)) == layers + m * norms == 759
    assert count(batchensemble(net, m, norms="shared")) == layers + norms == 639
    model = bayesian(net)
    latent = 8 * 3 * 9 + 8 + 8 * 9 + 8 + 6 * 8 + 6 + 3 * 6 + 3
    assert sum(int(np.prod(s)) for s in model.latent_sites().values()) == latent == 379
    assert count(model) == norms
    assert count(mean_field_guide(model)) == 2 * latent
    factors = rank1(net, 2).latent_sites()
    assert sum(int(np.prod(s)) for s in factors.values()) == 2 * (3 + 8 + 8 + 8 + 8 + 6 + 6 + 3)


def test_the_prior_of_every_layer_is_its_longest_key():
    model = bayesian(
        _resnet18(),
        prior={"layer4": 0.1, "layer4.1.conv2": 0.01, "fc": 0.5, "conv1": dist.Laplace(0.0, 2.0)},
    )

    def inner(d):
        while hasattr(d, "base_dist"):
            d = d.base_dist
        return d

    def base(site):
        d = inner(model.priors()[site])
        return type(d).__name__, round(float(d.scale.flatten()[0]), 6)

    assert base("conv1.weight") == ("Laplace", 2.0)
    assert base("layer1.0.conv1.weight") == ("Normal", 1.0)  # no key: Normal(0, 1)
    assert base("layer4.0.downsample.0.weight") == ("Normal", 0.1)
    assert base("layer4.1.conv2.weight") == ("Normal", 0.01)
    assert base("fc.bias") == ("Normal", 0.5)
    assert model.priors()["fc.weight"].event_shape == (4, 512)
    for site, d in rank1(_Norms(), 2).priors().items():
        loc, scale = (inner(d).loc.unique(), inner(d).scale.unique())
        assert (loc.tolist(), [round(v, 6) for v in scale.tolist()]) == ([1.0], [0.1]), site


@pytest.mark.parametrize("case", ["norms", "resmlp", "convs", "recurrent", "tied"])
@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
def test_fit_predict_save_load_round_trip(case, kind, tmp_path):
    factory, inputs, likelihood = CASES[case]
    torch.manual_seed(0)
    x = inputs()
    y = torch.randn(x.shape[0], 1) if likelihood == "gaussian" else torch.randint(0, 3, (len(x),))
    if kind == "bayesian":
        model = bayesian(factory(), likelihood=likelihood)
    elif kind == "batchensemble":
        model = batchensemble(factory(), 2, likelihood=likelihood)
    else:
        model = rank1(factory(), 2, likelihood=likelihood)
    assert model.training and all(m.training for m in model.modules())
    guide = None if kind == "batchensemble" else mean_field_guide(model)
    fit(model, guide, ListLoader(x, y, 2), epochs=1, progress=False)
    assert not model.training
    draws = None if guide is None else 2
    torch.manual_seed(5)
    before = predict(model, x, guide, num_samples=draws, progress=False)
    save(tmp_path / "m.pt", model, guide)
    restored = load(tmp_path / "m.pt", module=factory())
    torch.manual_seed(5)
    after = predict(restored.model, x, restored.guide, num_samples=draws, progress=False)
    field = "loc" if likelihood == "gaussian" else "probs"
    assert getattr(after, field).shape[0] == {"bayesian": 2, "batchensemble": 2, "rank1": 4}[kind]
    assert torch.equal(getattr(after, field), getattr(before, field))
    if case == "tied" and kind == "batchensemble":
        assert restored.model.net.dec.weight is restored.model.net.emb.weight


def test_converting_leaves_the_users_network_and_modes_alone():
    """The original stays in eval mode with its values; a converted model starts in training
    mode throughout, and predict() (eval mode inside) leaves it in the mode it came in."""
    net = _Norms().eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(3, 3, 8, 8)
    for model in (bayesian(net), batchensemble(net, 2), rank1(net, 2)):
        assert all(m.training for m in model.modules())
        guide = mean_field_guide(model) if hasattr(model, "latent_sites") else None
        predict(model, x, guide, num_samples=None if guide is None else 2, progress=False)
        assert all(m.training for m in model.modules())
    assert not any(m.training for m in net.modules())
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize(
    "given, got",
    [
        (lambda x: x, "got function. Pass the network, e.g. nn.Sequential(nn.Linear(4, 2))."),
        (_Norms, "got the class _Norms. Build the network: _Norms(...)."),
        (torch.ones(3), "got Tensor. Pass the network"),
    ],
)
def test_rank1_refuses_what_is_not_a_module_as_the_other_converters_do(given, got):
    """rank1() read the module's parameters before checking it was one: an AttributeError
    ('function' object has no attribute 'parameters') or torch's missing-self TypeError."""
    with pytest.raises(
        TypeError, match=r"Expected an nn\.Module to convert into a rank-1 network, "
    ):
        rank1(given, 2)
    with pytest.raises(TypeError) as err:
        rank1(given, 2)
    assert got in str(err.value)
    with pytest.raises(TypeError, match=r"Expected an nn\.Module to convert into a BatchEnsemble"):
        batchensemble(given, 2)
    with pytest.raises(TypeError, match=r"Expected an nn\.Module to make Bayesian"):
        bayesian(given)


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda n: bayesian(n, select=["f"]), ValueError,
         "select entry 'f' matches no parameter of _Norms. Its parameters are 'c.weight'"),
        (lambda n: bayesian(n, select=[nn.Linear]), TypeError,
         "not a class: got Linear. For the layers of a type, pass their names (here 'fc', 'out')"),
        (lambda n: bayesian(n, select=[n.fc]), TypeError,
         "got the Linear layer. Here it is named 'fc': select=['fc']."),
        (lambda n: bayesian(n, select="fc"), ValueError,
         "Unknown select 'fc'"),
        (lambda n: bayesian(n, select=["bn1.running_mean"]), ValueError,
         "'bn1.running_mean' is a buffer, not a parameter"),
        (lambda n: bayesian(n, prior={"gn": 0.1}), ValueError,
         "prior key 'gn' matches no latent site: it names parameters that are not latent"),
        (lambda n: batchensemble(n, 0), ValueError,
         "Expected num_members to be an integer >= 1, got 0."),
        (lambda n: rank1(n, -1), ValueError,
         "Expected num_members to be an integer >= 1, got -1."),
        (lambda n: batchensemble(nn.Sequential(nn.LSTM(2, 2)), 2), ValueError,
         "has no nn.Linear or convolution layer to turn into BatchEnsemble layers"),
        (lambda n: bayesian(nn.Sequential(nn.LSTM(2, 2))), ValueError,
         "select=None picks nothing. Its parameters are '0.weight_ih_l0'"),
    ],
)  # fmt: skip
def test_refusals_say_what_came_and_what_to_do(call, error, fragment):
    with pytest.raises(error) as err:
        call(_Norms())
    assert fragment in str(err.value)


def test_select_by_name_type_or_callable_picks_those_parameters():
    net = _ResMLP()
    assert list(bayesian(net, select=["blocks.a", "scale"], likelihood="gaussian")
                .latent_sites()) == ["scale", "blocks.a.0.weight", "blocks.a.0.bias"]  # fmt: skip
    names = [n for n, m in net.named_modules() if n and isinstance(m, nn.Linear)]
    picked = bayesian(net, select=names, likelihood="gaussian").latent_sites()
    assert list(picked) == [n for n, _ in net.named_parameters() if n != "scale"]
    odd = bayesian(net, select=lambda n, p: n.endswith("bias"), likelihood="gaussian")
    assert list(odd.latent_sites()) == ["inp.bias", "blocks.a.0.bias", "blocks.b.0.bias",
                                        "head.bias"]  # fmt: skip
    assert F.mse_loss(odd.plain_network()(torch.ones(1, 2)), net(torch.ones(1, 2))) == 0
