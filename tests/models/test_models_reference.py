"""The shipped models against references written here from torch's functional calls.

Each network is rebuilt from ``F.conv2d`` / ``F.linear`` / ``F.batch_norm`` with the model's
weights (or, for the Bayesian models, the prior's or the guide's draws) put in by hand; the
BatchEnsemble members from ``diag(s_m) W diag(r_m)`` built here. Counts and shapes are the
documented ones (DESIGN.md, the tutorials' printed figures).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn

import pyrouq

LENET_LAYERS = ("conv1", "conv2", "fc1", "fc2", "fc3")


def lenet_ref(x, p):
    h = F.max_pool2d(F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"])), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"])), 2)
    h = h.reshape(h.shape[0], -1)
    h = F.relu(F.linear(h, p["fc1.weight"], p["fc1.bias"]))
    h = F.relu(F.linear(h, p["fc2.weight"], p["fc2.bias"]))
    return F.linear(h, p["fc3.weight"], p["fc3.bias"])


def mlp_ref(x, p):
    h = x.reshape(x.shape[0], -1)
    last = max(int(k[2:].partition(".")[0]) for k in p if k.startswith("fc"))
    for i in range(1, last):
        h = F.relu(F.linear(h, p[f"fc{i}.weight"], p[f"fc{i}.bias"]))
    return F.linear(h, p[f"fc{last}.weight"], p[f"fc{last}.bias"])


def _bn(h, p, b, name, training):
    mean, var = b[f"{name}.running_mean"], b[f"{name}.running_var"]  # updated in place
    return F.batch_norm(h, mean, var, p[f"{name}.weight"], p[f"{name}.bias"], training, 0.1, 1e-5)


def _block(h, p, b, name, stride, training):
    out = F.conv2d(h, p[f"{name}.conv1.weight"], None, stride, 1)
    out = F.relu(_bn(out, p, b, f"{name}.bn1", training))
    out = _bn(F.conv2d(out, p[f"{name}.conv2.weight"], None, 1, 1), p, b, f"{name}.bn2", training)
    if f"{name}.shortcut.0.weight" in p:
        skip = F.conv2d(h, p[f"{name}.shortcut.0.weight"], None, stride)
        h = _bn(skip, p, b, f"{name}.shortcut.1", training)
    return F.relu(out + h)


def residual_ref(x, p, b, training):
    h = F.relu(_bn(F.conv2d(x, p["stem.0.weight"], None, 1, 1), p, b, "stem.1", training))
    for name, stride in (("layer1", 1), ("layer2", 2), ("layer3", 2)):
        h = _block(h, p, b, name, stride, training)
    return F.linear(h.mean((-2, -1)), p["fc.weight"], p["fc.bias"])


def member_weights(net, m, factors=None):
    """Member m's weights ``diag(s_m) W diag(r_m)`` and bias, for every LeNet / MLP layer of
    a BatchEnsemble's ``net``; ``factors`` ({"fc1.r": (M, in), ...}) in place of its own."""
    out = {}
    for name, layer in net.named_children():
        if not hasattr(layer, "r"):
            continue
        w = layer.weight.detach()
        r = (layer.r if factors is None else factors[f"{name}.r"]).detach()[m]
        s = (layer.s if factors is None else factors[f"{name}.s"]).detach()[m]
        out_shape, in_shape = [-1] + [1] * (w.dim() - 1), [1, -1] + [1] * (w.dim() - 2)
        out[f"{name}.weight"] = s.view(out_shape) * w * r.view(in_shape)
        out[f"{name}.bias"] = layer.bias.detach()[m]
    return out


def _params(net):
    return {k: v.detach() for k, v in net.named_parameters()}


def _scramble_norms(net):
    """BatchNorm statistics and affine parameters away from 0 / 1, so that eval mode tests
    them."""
    with torch.no_grad():
        for name, t in [*net.named_buffers(), *net.named_parameters()]:
            if name.endswith(("running_mean", "bias")):
                t.normal_(0, 0.5)
            elif name.endswith("running_var") or (name.endswith("weight") and t.dim() == 1):
                t.uniform_(0.5, 2.0)


# --------------------------------------------------------------------------------------------
# Plain networks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, shape, ref",
    [
        (lambda: pyrouq.MLP(num_hidden=0), (5, 784), mlp_ref),
        (lambda: pyrouq.MLP(in_features=12, hidden_features=7, num_hidden=2), (5, 3, 4), mlp_ref),
        (lambda: pyrouq.LeNet(), (5, 1, 28, 28), lenet_ref),
        (lambda: pyrouq.LeNet(3, 4), (5, 3, 28, 28), lenet_ref),
        (lambda: pyrouq.LeNet(), (600, 1, 28, 28), lenet_ref),  # > 512: CPU chunks
    ],
)
def test_plain_networks_equal_their_functional_reference(make, shape, ref):
    net = make()
    x = torch.randn(shape)
    torch.testing.assert_close(net(x), ref(x, _params(net)), rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # (the inference paths)
        torch.testing.assert_close(net.eval()(x), ref(x, _params(net)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [(28, 28), (17, 23)])
def test_residual_cnn_equals_its_functional_reference_in_both_modes(size):
    net = pyrouq.ResidualCNN(width=8)
    _scramble_norms(net)
    x = torch.randn(4, 1, *size)
    buffers = {k: v.clone() for k, v in net.named_buffers()}
    torch.testing.assert_close(net.eval()(x), residual_ref(x, _params(net), buffers, False))
    out = net.train()(x)  # batch statistics, and the running ones updated as torch does
    torch.testing.assert_close(out, residual_ref(x, _params(net), buffers, True))
    for name, value in net.named_buffers():
        if "running" in name:  # (F.batch_norm keeps no count of batches)
            torch.testing.assert_close(value, buffers[name], msg=name)


def test_documented_counts_and_shapes():
    count = lambda net: sum(p.numel() for p in net.parameters())  # noqa: E731
    lenet = pyrouq.LeNet()
    assert {n: tuple(p.shape) for n, p in lenet.named_parameters()} == {
        "conv1.weight": (6, 1, 5, 5), "conv1.bias": (6,),
        "conv2.weight": (16, 6, 5, 5), "conv2.bias": (16,),
        "fc1.weight": (120, 256), "fc1.bias": (120,),
        "fc2.weight": (84, 120), "fc2.bias": (84,),
        "fc3.weight": (10, 84), "fc3.bias": (10,),
    }  # fmt: skip
    assert count(lenet) == 44_426  # the tutorial's and docs' figure
    assert count(pyrouq.MLP()) == 784 * 256 + 256 + 256 * 10 + 10 == 203_530
    assert count(pyrouq.BatchEnsembleMLP(num_members=3)) == 207_980  # tutorial 02
    # the CLI's banner: a location and a scale per weight
    assert count(pyrouq.mean_field_guide(pyrouq.BayesianLeNet())) == 88_852
    net = pyrouq.ResidualCNN()
    assert count(net) == 77_754
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    norms = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(convs) == len(norms) == 9
    assert sorted({c.out_channels for c in convs}) == [16, 32, 64]
    sites = pyrouq.bayesian(net).network_sites()
    assert (len(sites), sum(math.prod(s) for s in sites.values())) == (11, 77_082)  # tutorial 05


# --------------------------------------------------------------------------------------------
# Bayesian models
# --------------------------------------------------------------------------------------------

BAYESIAN = [
    (lambda **kw: pyrouq.BayesianLeNet(**kw), pyrouq.LeNet, (6, 1, 28, 28), lenet_ref),
    (
        lambda **kw: pyrouq.BayesianMLP(in_features=10, hidden_features=9, num_hidden=2, **kw),
        lambda: pyrouq.MLP(in_features=10, hidden_features=9, num_hidden=2),
        (6, 10),
        mlp_ref,
    ),
]


@pytest.mark.parametrize("make, plain, shape, ref", BAYESIAN)
def test_bayesian_front_doors_are_the_documented_pyro_models(make, plain, shape, ref):
    model = make(prior_scale=0.3, num_data=60)
    x, y = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    trace = poutine.trace(model).get_trace(x, y)
    latent = {
        name: site
        for name, site in trace.nodes.items()
        if site["type"] == "sample" and not site["is_observed"] and name != "data"
    }
    expected = {n: p.shape for n, p in plain().named_parameters()}
    assert {n: s["value"].shape for n, s in latent.items()} == expected
    assert list(latent) == list(expected)  # named_parameters() order
    for name, site in latent.items():
        fn = site["fn"]
        assert fn.event_shape == expected[name] and fn.batch_shape == ()  # one event
        base = fn.base_dist
        assert type(base).__name__ == "Normal"
        assert bool((base.loc == 0).all()) and bool((base.scale == 0.3).all())
    draws = {n: s["value"] for n, s in latent.items()}
    logits = ref(x, draws)
    assert trace.nodes["logits"]["type"] == "sample"  # pyro.deterministic
    torch.testing.assert_close(trace.nodes["logits"]["value"], logits)
    obs = trace.nodes["obs"]
    assert [(f.name, f.dim, f.size) for f in obs["cond_indep_stack"]] == [("data", -1, shape[0])]
    assert obs["scale"] == pytest.approx(60 / shape[0])
    trace.compute_log_prob()
    expected_ll = 60 / shape[0] * logits.log_softmax(-1).gather(1, y[:, None]).sum()
    torch.testing.assert_close(obs["log_prob_sum"], expected_ll)


@pytest.mark.parametrize("make, plain, shape, ref", BAYESIAN)
def test_guide_starts_at_torch_init_with_scale_0_01(make, plain, shape, ref):
    torch.manual_seed(5)
    model = make()
    torch.manual_seed(5)
    net = plain()
    guide = pyrouq.mean_field_guide(model)
    for name, value in _params(net).items():
        torch.testing.assert_close(guide.loc[name.replace(".", "__")], value, rtol=0, atol=0)
        if value.dim() > 1:  # torch's kaiming-uniform range, 1 / sqrt(fan_in)
            assert float(value.abs().max()) <= 1 / math.sqrt(value[0].numel())
    for scale in guide.scales().values():
        torch.testing.assert_close(scale, torch.full_like(scale, 0.01))


def _residual():
    net = pyrouq.ResidualCNN(width=4)
    _scramble_norms(net)
    return pyrouq.bayesian(net)


PREDICT = [
    ("BayesianLeNet", lambda: pyrouq.BayesianLeNet(), (5, 1, 28, 28)),
    ("BayesianMLP", lambda: pyrouq.BayesianMLP(hidden_features=16, num_hidden=2), (5, 784)),
    ("bayesian(ResidualCNN)", _residual, (5, 1, 28, 28)),
    ("rank1(LeNet)", lambda: pyrouq.rank1(pyrouq.LeNet(), 3), (5, 1, 28, 28)),
]


def _reference_probs(label, model, x, draw):
    """(members or 1, B, C) probabilities of one weight draw, computed here."""
    if label == "rank1(LeNet)":
        members = [member_weights(model.net, m, draw) for m in range(model.num_members)]
        return torch.stack([lenet_ref(x, w).softmax(-1) for w in members])
    if label == "bayesian(ResidualCNN)":
        net = model.net
        fixed = {k: v.detach() for k, v in net.named_parameters()}
        buffers = {k: v.clone() for k, v in net.named_buffers() if "running" in k}
        return residual_ref(x, {**fixed, **draw}, buffers, False).softmax(-1)[None]
    ref = lenet_ref if label == "BayesianLeNet" else mlp_ref
    return ref(x, draw).softmax(-1)[None]


@pytest.mark.parametrize("label, make, shape", PREDICT, ids=[p[0] for p in PREDICT])
def test_predict_equals_the_reference_under_the_guides_draws(label, make, shape):
    model = make()
    guide = pyrouq.mean_field_guide(model)
    x = torch.randn(shape)
    torch.manual_seed(11)
    draws = [{k: v.detach() for k, v in guide(x).items()} for _ in range(3)]
    torch.manual_seed(11)  # predict's draws: three runs of the guide, from torch's stream
    preds = pyrouq.predict(model, x, guide, num_samples=3, progress=False)
    expected = torch.cat([_reference_probs(label, model, x, d) for d in draws])
    torch.testing.assert_close(preds.probs, expected)
    stacked = {s: torch.stack([d[s] for d in draws]) for s in draws[0]}
    loop = pyrouq.predict(model, x, posterior_samples=stacked, parallel=False, progress=False)
    torch.testing.assert_close(loop.probs, expected)


# --------------------------------------------------------------------------------------------
# BatchEnsembles
# --------------------------------------------------------------------------------------------

ENSEMBLES = [
    (lambda **kw: pyrouq.BatchEnsembleLeNet(**kw), pyrouq.LeNet, (4, 1, 28, 28), lenet_ref),
    (
        lambda **kw: pyrouq.BatchEnsembleMLP(num_hidden=2, hidden_features=12, **kw),
        lambda: pyrouq.MLP(num_hidden=2, hidden_features=12),
        (4, 784),
        mlp_ref,
    ),
]


@pytest.mark.parametrize("make, plain, shape, ref", ENSEMBLES)
def test_batchensemble_members_are_the_hand_built_rank1_networks(make, plain, shape, ref):
    base = plain()
    model = make(num_members=3, base=base, num_data=40)
    for name, value in base.named_parameters():  # use_base_weights: W and biases copied
        held = model.net.get_parameter(name)
        torch.testing.assert_close(held if name.endswith("weight") else held[2], value)
    x, y = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    expected = torch.stack([ref(x, member_weights(model.net, m)) for m in range(3)])
    trace = poutine.trace(model).get_trace(x, y)
    torch.testing.assert_close(trace.nodes["logits"]["value"], expected)
    obs = trace.nodes["obs"]
    assert {(f.name, f.dim) for f in obs["cond_indep_stack"]} == {("data", -1), ("members", -2)}
    trace.compute_log_prob()
    log_lik = 40 / shape[0] * expected.log_softmax(-1).gather(-1, y.expand(3, -1)[..., None])
    torch.testing.assert_close(obs["log_prob_sum"], log_lik.sum())
    preds = pyrouq.predict(model, x, progress=False)
    torch.testing.assert_close(preds.probs, expected.softmax(-1))


def test_batchensemble_factor_init_is_the_documented_one():
    model = pyrouq.BatchEnsembleMLP(num_members=16, r_mean=2.0, r_std=0.1, s_mean=-1.0)
    r, s = model.net.fc1.r.detach(), model.net.fc1.s.detach()  # (16, 784), (16, 256)
    assert abs(float(r.mean()) - 2.0) < 0.01 and abs(float(r.std()) - 0.1) < 0.005
    assert abs(float(s.mean()) + 1.0) < 0.03 and abs(float(s.std()) - 0.5) < 0.02
    signs = pyrouq.BatchEnsembleLeNet(num_members=4, init="random_sign").net.fc1
    assert set(signs.r.detach().unique().tolist()) == set(signs.s.detach().unique().tolist())
    assert set(signs.r.detach().unique().tolist()) == {-1.0, 1.0}


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------

SAVED = [
    ("MLP", lambda: pyrouq.MLP(hidden_features=16, num_hidden=2), (3, 784)),
    ("LeNet", lambda: pyrouq.LeNet(3, 7), (3, 3, 28, 28)),
    ("ResidualCNN", lambda: pyrouq.ResidualCNN(width=4), (3, 1, 28, 28)),
    ("BayesianMLP", lambda: pyrouq.BayesianMLP(hidden_features=8, prior_scale=0.7), (3, 784)),
    (
        "BayesianLeNet",
        lambda: pyrouq.BayesianLeNet(num_classes=5, prior_scale=0.2),
        (3, 1, 28, 28),
    ),
    (
        "BatchEnsembleMLP",
        lambda: pyrouq.BatchEnsembleMLP(hidden_features=8, num_members=2, init="random_sign"),
        (3, 784),
    ),
    (
        "BatchEnsembleLeNet",
        lambda: pyrouq.BatchEnsembleLeNet(num_members=3, r_std=0.2),
        (3, 1, 28, 28),
    ),
]


@pytest.mark.parametrize("label, make, shape", SAVED, ids=[s[0] for s in SAVED])
def test_every_shipped_model_survives_save_and_load(tmp_path, label, make, shape):
    model = make()
    if label == "ResidualCNN":
        _scramble_norms(model)
    guide = pyrouq.mean_field_guide(model) if label.startswith("Bayesian") else None
    path = tmp_path / "model.pt"
    pyrouq.save(path, model, guide)
    skeleton = {"module": pyrouq.ResidualCNN(width=4)} if label == "ResidualCNN" else {}
    restored = pyrouq.load(path, **skeleton)
    assert type(restored.model) is type(model)
    assert getattr(restored.model, "config", None) == getattr(model, "config", None)
    if guide is not None:
        scales = torch.cat([p.base_dist.scale.flatten() for p in restored.model.priors().values()])
        assert scales.tolist() == pytest.approx([model.config["prior_scale"]] * len(scales))
    x = torch.randn(shape)
    options = {"num_samples": 3, "seed": 2} if guide is not None else {}
    before = pyrouq.predict(model, x, guide, progress=False, **options).probs
    after = pyrouq.predict(restored.model, x, restored.guide, progress=False, **options).probs
    torch.testing.assert_close(after, before, rtol=0, atol=0)
