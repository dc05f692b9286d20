"""Audit 13: the converters on torchvision's zoo, checked against the original network.

Every reference here is computed independently of pyrouq's engine: the original torchvision
module run by ``torch.func.functional_call`` with the weights put in by hand (the guide's
locations, or a BatchEnsemble member's effective weight built as the explicit product
``diag(s_m) W diag(r_m)``, grouped convolutions included).
"""

from __future__ import annotations

import copy
import warnings

import pyro.distributions as dist
import pytest
import torch
import torchvision.models as tvm
from _toy import ListLoader
from torch import nn
from torch.func import functional_call
from torch.nn.utils import parametrizations
from torchvision.models.vision_transformer import VisionTransformer

from pyrouq import batchensemble, bayesian, fit, mean_field_guide, predict, rank1


def _tiny_vit() -> nn.Module:
    return VisionTransformer(
        image_size=32,
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
        num_classes=4,
    )


def _tiny_densenet() -> nn.Module:
    return tvm.DenseNet(growth_rate=4, block_config=(1, 1), num_init_features=8, num_classes=4)


ZOO = {
    "mobilenet_v3_small": lambda: tvm.mobilenet_v3_small(num_classes=4),  # SE, depthwise
    "shufflenet_v2_x0_5": lambda: tvm.shufflenet_v2_x0_5(num_classes=4),  # channel shuffle
    "densenet_tiny": _tiny_densenet,  # concatenations
    "vit_tiny": _tiny_vit,  # attention reading its projections as tensors
    "swin_tiny": lambda: tvm.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=8,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=[2, 2],
        num_classes=4,
        stochastic_depth_prob=0.0,
    ),
}


def _zoo_net(name: str) -> tuple[nn.Module, torch.Tensor]:
    """The network (BatchNorm statistics moved off their defaults, eval mode) and 3 inputs."""
    torch.manual_seed(0)
    net = ZOO[name]()
    with torch.no_grad():
        net.train()(torch.randn(4, 3, 32, 32))  # running statistics that are not 0 / 1
    net.eval()
    return net, torch.randn(3, 3, 32, 32)


def _state(net: nn.Module) -> dict:
    """Everything of ``net`` a conversion must leave alone."""
    return {
        "tensors": {k: v.detach().clone() for k, v in net.state_dict(keep_vars=True).items()},
        "requires_grad": [p.requires_grad for p in net.parameters()],
        "modes": [(n, m.training) for n, m in net.named_modules()],
        "hooks": [
            (n, len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in net.named_modules()
        ],
        "types": [(n, type(m)) for n, m in net.named_modules()],
    }


def _same(a: dict, b: dict) -> bool:
    if a["tensors"].keys() != b["tensors"].keys():
        return False
    if not all(torch.equal(a["tensors"][k], b["tensors"][k]) for k in a["tensors"]):
        return False
    return all(a[key] == b[key] for key in ("requires_grad", "modes", "hooks", "types"))


def _member_weights(ensemble: nn.Module, m: int) -> dict[str, torch.Tensor]:
    """Member ``m``'s weights of the original network's layers, built by hand from the
    BatchEnsemble's W, r, s and biases (and its copies of the normalisation layers)."""
    weights: dict[str, torch.Tensor] = {}
    for path, layer in ensemble.net.named_modules():
        if getattr(layer, "_is_batchensemble", False):
            w, r, s = layer.weight, layer.r[m], layer.s[m]
            if w.dim() == 2:  # Linear: s_i W_ij r_j
                eff = s[:, None] * w * r[None, :]
            else:  # convolution (out, in / groups, k, k): group g's outputs read its inputs
                groups, per_in = layer.groups, w.shape[1]
                per_out = w.shape[0] // groups
                r_out = r.reshape(groups, 1, per_in).expand(groups, per_out, per_in)
                eff = (
                    w * s[:, None, None, None] * r_out.reshape(w.shape[0], per_in)[..., None, None]
                )
            weights[f"{path}.weight"] = eff
            weights[f"{path}.bias"] = layer.bias[m]
        if getattr(layer, "_is_member_norm", False):
            for key, value in layer.norms[m].state_dict().items():
                weights[f"{path}.{key}"] = value
    return weights


# --------------------------------------------------------------------------------------------
# bayesian(): the guide's locations in the original network
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "densenet_tiny", "vit_tiny"])
def test_bayesian_zoo_net_computes_the_original_with_the_guides_locations(name):
    net, x = _zoo_net(name)
    before = _state(net)
    model = bayesian(net)
    guide = mean_field_guide(model)
    # locations moved off the network's weights, so that the check can tell them apart
    with torch.no_grad():
        for site in model.network_sites():
            loc = guide.site_loc(site)
            loc.add_(0.05 * torch.randn_like(loc))
    locs = {site: guide.site_loc(site).detach().clone() for site in model.network_sites()}
    with torch.no_grad():
        expected = functional_call(net, locs, (x,))
        assert (expected - net(x)).abs().max() > 1e-3  # the locations do differ
        out = model.eval().outputs(x, locs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # two posterior draws through predict(): each the original network's probabilities
    draws = {s: torch.stack([v, 2 * v - net.get_parameter(s).detach()]) for s, v in locs.items()}
    probs = predict(model, x, posterior_samples=draws, progress=False).probs
    with torch.no_grad():
        by_hand = torch.stack(
            [functional_call(net, {s: v[i] for s, v in draws.items()}, (x,)) for i in range(2)]
        ).softmax(-1)
    torch.testing.assert_close(probs, by_hand, rtol=1e-5, atol=1e-6)
    assert predict(model, x, guide, num_samples=3, progress=False).probs.shape == (3, 3, 4)
    assert _same(before, _state(net))


# --------------------------------------------------------------------------------------------
# batchensemble() / rank1(): every member built by hand
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "shufflenet_v2_x0_5", "swin_tiny"])
@pytest.mark.parametrize("norms", ["per_member", "shared"])
def test_batchensemble_zoo_members_match_hand_built_members(name, norms):
    net, x = _zoo_net(name)
    before = _state(net)
    ensemble = batchensemble(net, 2, r_std=0.3, s_std=0.3, norms=norms).eval()
    with torch.no_grad():
        out = ensemble.outputs(x)
        expected = torch.stack(
            [
                functional_call(net, _member_weights(ensemble, m), (x,), strict=False)
                for m in range(2)
            ]
        )
    assert out.shape == (2, 3, 4)
    scale = expected.abs().max()
    torch.testing.assert_close(out / scale, expected / scale, rtol=0, atol=1e-5)
    assert (expected[0] - expected[1]).abs().max() / scale > 1e-3  # the members differ
    assert _same(before, _state(net))


def test_rank1_zoo_draws_match_hand_built_members():
    net, x = _zoo_net("mobilenet_v3_small")
    model = rank1(net, 2).eval()
    guide = mean_field_guide(model)
    torch.manual_seed(1)
    draws = {s: v + 0.1 * torch.randn(2, *v.shape) for s, v in guide.means().items()}
    with torch.no_grad():
        out = model.outputs(x, draws)  # (S, M, B, C)
        expected = []
        for k in range(2):
            for m in range(2):
                ens = copy.deepcopy(model)  # the factors of draw k, by hand
                for path, layer in ens.net.named_modules():
                    if getattr(layer, "_is_batchensemble", False):
                        layer._buffers["r"] = draws[f"{path}.r"][k]
                        layer._buffers["s"] = draws[f"{path}.s"][k]
                expected.append(functional_call(net, _member_weights(ens, m), (x,), strict=False))
    expected_t = torch.stack(expected).reshape(2, 2, 3, 4)
    scale = expected_t.abs().max()
    torch.testing.assert_close(out / scale, expected_t / scale, rtol=0, atol=1e-5)
    # predict() flattens draws and members draw-major: s = k * M + m
    probs = predict(model, x, posterior_samples=draws, progress=False).probs
    torch.testing.assert_close(probs, expected_t.reshape(4, 3, 4).softmax(-1), atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------------------
# select=
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "head"),
    [
        (_tiny_vit, "heads.head"),
        (lambda: tvm.mobilenet_v3_small(num_classes=4), "classifier.3"),
        (lambda: tvm.googlenet(num_classes=4, aux_logits=True, init_weights=True), "fc"),
    ],
)
def test_last_layer_picks_the_zoo_head(build, head):
    torch.manual_seed(0)
    net = build()
    model = bayesian(net, select="last_layer")
    assert list(model.latent_sites()) == [f"{head}.weight", f"{head}.bias"]
    ensemble = bayesian(batchensemble(net, 2), select="last_layer", prior=dist.Normal(1.0, 0.1))
    assert list(ensemble.latent_sites()) == [f"{head}.r", f"{head}.s"]


def test_last_layer_of_a_net_without_linear_names_its_last_convolution():
    net = tvm.squeezenet1_1(num_classes=4)
    with pytest.raises(ValueError, match=r"needs an nn.Linear, and SqueezeNet has none") as err:
        bayesian(net, select="last_layer")
    assert "select=['classifier.1']" in str(err.value)
    with pytest.raises(ValueError, match="needs a BatchEnsembleLinear") as err:
        bayesian(batchensemble(net, 2), select="last_layer")
    assert "['classifier.1.r', 'classifier.1.s']" in str(err.value)


def test_a_prefix_select_takes_every_parameter_under_it():
    net = tvm.resnet18(num_classes=4)
    model = bayesian(net, select=["layer4.1", "fc"])
    expected = [n for n, _ in net.named_parameters() if n.startswith(("layer4.1.", "fc."))]
    assert list(model.latent_sites()) == expected
    assert "layer4.1.bn1.weight" in expected  # a norm's too, as documented


# --------------------------------------------------------------------------------------------
# tied, reused, parametrized, non-persistent
# --------------------------------------------------------------------------------------------


class _Tied(nn.Module):
    """``b`` shares ``a``'s weight matrix; ``a`` is called twice."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.head = nn.Linear(6, 3)
        self.register_buffer("shift", torch.full((6,), 0.5), persistent=False)

    def forward(self, x):
        h = torch.tanh(self.a(torch.tanh(self.a(x - self.shift))))
        return self.head(torch.tanh(self.b(h)))


def test_tied_and_reused_layers_match_the_original():
    torch.manual_seed(0)
    net = _Tied()
    x = torch.randn(5, 6)
    model = bayesian(net).eval()
    assert list(model.latent_sites()) == [
        "a.weight",
        "a.bias",
        "b.bias",
        "head.weight",
        "head.bias",
    ]
    draws = {s: v + 0.2 * torch.randn(2, *v.shape) for s, v in model.template().items()}
    with torch.no_grad():
        out = model.outputs(x, draws)
        expected = torch.stack(  # torch's tied semantics: a.weight's draw is b.weight's
            [functional_call(net, {s: v[i] for s, v in draws.items()}, (x,)) for i in range(2)]
        )
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    plain = model.plain_network()
    assert plain.a.weight is plain.b.weight
    assert "net.shift" not in model.state_dict()  # a non-persistent buffer stays one
    torch.testing.assert_close(plain.eval()(x), net(x), rtol=0, atol=0)

    ensemble = batchensemble(net, 2, r_std=0.3, s_std=0.3).eval()
    assert ensemble.net.a.weight is ensemble.net.b.weight  # W stays tied, factors apart
    assert "net.shift" not in ensemble.state_dict()
    with torch.no_grad():
        out = ensemble.outputs(x)
        for m in range(2):
            weights = _member_weights(ensemble, m)  # a's and b's: one W, their own factors
            expected_m = functional_call(net, weights, (x,), strict=False, tie_weights=False)
            torch.testing.assert_close(out[m], expected_m, rtol=0, atol=1e-6)


class _TiedBias(nn.Module):
    """``b`` shares ``a``'s bias (not its weight)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.bias = self.a.bias
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


@pytest.mark.parametrize("convert", ["batchensemble", "rank1"])
def test_a_tied_bias_stays_tied_in_a_batchensemble_through_training(convert):
    """Audit 13: batchensemble() kept tied weights tied but gave each layer of a tied bias its
    own per-member biases, which then trained apart."""
    torch.manual_seed(0)
    net = _TiedBias()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    model = batchensemble(net, 2) if convert == "batchensemble" else rank1(net, 2)
    assert model.net.a.bias is model.net.b.bias
    guide = None if convert == "batchensemble" else mean_field_guide(model)
    fit(model, guide, ListLoader(x, y, 4), epochs=2, lr=1e-2, progress=False)
    assert model.net.a.bias is model.net.b.bias
    moved = model.net.a.bias.detach()
    assert (moved - net.a.bias.detach()).abs().max() > 1e-3  # trained, still one tensor
    if convert == "batchensemble":
        with torch.no_grad():
            out = model.eval().outputs(x)
            for m in range(2):
                weights = _member_weights(model, m)
                assert torch.equal(weights["a.bias"], weights["b.bias"])
                expected = functional_call(net, weights, (x,), strict=False, tie_weights=False)
                torch.testing.assert_close(out[m], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["weight_norm", "spectral_norm", "orthogonal"])
def test_a_parametrized_weight_is_warned_of_or_latent_through_its_own_tensors(kind):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    getattr(parametrizations, kind)(net[0])
    net.eval()
    x = torch.randn(4, 6)
    with pytest.warns(UserWarning, match=r"'0.weight' of Sequential: computed by a parametriz"):
        model = bayesian(net)
    assert list(model.latent_sites()) == ["0.bias", "2.weight", "2.bias"]
    # named, the parametrization's own tensors are latent, and a draw goes through it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = bayesian(net, select=["0", "2"]).eval()
    assert any(site.startswith("0.parametrizations.weight.original") for site in model.template())
    draws = {s: v + 0.1 * torch.randn(2, *v.shape) for s, v in model.template().items()}
    with torch.no_grad():
        out = model.outputs(x, draws)
        expected = torch.stack(
            [functional_call(net, {s: v[i] for s, v in draws.items()}, (x,)) for i in range(2)]
        )
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    with pytest.warns(UserWarning, match="carried a parametrization"):
        ensemble = batchensemble(net, 2, r_std=0.0, s_std=0.0).eval()
    torch.testing.assert_close(ensemble.outputs(x), net(x).expand(2, 4, 3), rtol=0, atol=1e-6)


@pytest.mark.filterwarnings("ignore:.*weight_norm.*is deprecated:FutureWarning")
def test_the_legacy_weight_norm_is_refused_saying_what_to_use():
    net = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    nn.utils.weight_norm(net[0])
    for convert in (bayesian, lambda n: batchensemble(n, 2), lambda n: rank1(n, 2)):
        with pytest.raises(ValueError, match=r"legacy torch\.nn\.utils\.weight_norm") as err:
            convert(net)
        assert "Use torch.nn.utils.parametrizations.weight_norm" in str(err.value)


# --------------------------------------------------------------------------------------------
# fit() and predict() on a converted zoo network
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
def test_five_steps_of_fit_then_predict_leave_the_original_as_it_was(kind):
    net, _ = _zoo_net("shufflenet_v2_x0_5")
    net.conv1[0].register_forward_hook(lambda module, inputs, output: None)
    net.fc.train()  # a mixed mode, which must survive
    before = _state(net)
    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(10, 3, 32, 32, generator=g), torch.randint(0, 4, (10,), generator=g)
    if kind == "bayesian":
        model = bayesian(net)
    elif kind == "batchensemble":
        model = batchensemble(net, 2)
    else:
        model = rank1(net, 2)
    guide = None if kind == "batchensemble" else mean_field_guide(model)
    result = fit(model, guide, ListLoader(xs, ys, 2), epochs=1, lr=1e-3, progress=False)
    assert len(result.history) == 1 and torch.isfinite(torch.tensor(result.history[0].loss))
    draws = None if guide is None else 2
    probs = predict(model, xs[:3], guide, num_samples=draws, progress=False).probs
    assert probs.shape == ({"bayesian": 2, "batchensemble": 2, "rank1": 4}[kind], 3, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(probs.shape[:2]))
    assert _same(before, _state(net))
