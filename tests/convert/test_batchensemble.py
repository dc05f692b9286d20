from __future__ import annotations

import copy
import gc

import pyro
import pytest
import torch
from pyro import poutine
from torch import nn

from pyrouq.infer import fit
from pyrouq.models import (
    MLP,
    BatchEnsembleLeNet,
    BatchEnsembleMLP,
    BatchEnsembleNetwork,
    LeNet,
    ResidualCNN,
    batchensemble,
)
from pyrouq.nn import (
    BATCHENSEMBLE_LAYERS,
    BatchEnsembleConv1d,
    BatchEnsembleConv2d,
    BatchEnsembleLinear,
    BatchEnsembleNorm,
)


def _layers(ensemble):
    kinds = tuple(BATCHENSEMBLE_LAYERS.values())
    return {n: m for n, m in ensemble.net.named_modules() if isinstance(m, kinds)}


def _member_copy(net: nn.Module, ensemble, member: int) -> nn.Module:
    """A standalone copy of ``net`` carrying member i's effective weights and bias."""
    clone = copy.deepcopy(net)
    for name, layer in _layers(ensemble).items():
        plain = clone.get_submodule(name)
        with torch.no_grad():
            plain.weight.copy_(layer.effective_weight(member))
            plain.bias.copy_(layer.bias[member])
    return clone


def _distinct_biases(ensemble):
    with torch.no_grad():
        for layer in _layers(ensemble).values():
            layer.bias.add_(torch.randn_like(layer.bias))


@pytest.mark.parametrize("make_net", [lambda: MLP(), lambda: LeNet()])
def test_unit_factors_and_equal_biases_reproduce_the_base_network(make_net):
    net = make_net()
    ensemble = batchensemble(net, 4, r_std=0.0, s_std=0.0)
    x = torch.randn(6, 1, 28, 28)
    out = ensemble(x)
    assert out.shape == (4, 6, 10)
    for i in range(4):
        torch.testing.assert_close(out[i], net(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make_net", [lambda: MLP(num_hidden=2), lambda: LeNet()])
def test_member_equals_network_with_effective_weights(make_net):
    net = make_net()
    ensemble = batchensemble(net, 3)  # random r, s ~ N(1, 0.5)
    _distinct_biases(ensemble)
    x = torch.randn(5, 1, 28, 28)
    out = ensemble(x)
    for i in range(3):
        standalone = _member_copy(net, ensemble, i)
        torch.testing.assert_close(out[i], standalone(x), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(out[0], out[1])


def test_effective_weight_is_diag_s_w_diag_r():
    layer = BatchEnsembleLinear(3, 2, 2)
    i = 1
    expected = torch.diag(layer.s[i]) @ layer.weight @ torch.diag(layer.r[i])
    torch.testing.assert_close(layer.effective_weight(i), expected)


def test_converter_copies_weights_exactly_and_leaves_module_alone():
    net = LeNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    ensemble = batchensemble(net, 3)
    for name in ("conv1", "conv2", "fc1", "fc2", "fc3"):
        layer = ensemble.net.get_submodule(name)
        assert torch.equal(layer.weight, getattr(net, name).weight)
        assert torch.equal(layer.bias, getattr(net, name).bias.expand(3, -1))
        assert layer.weight.data_ptr() != getattr(net, name).weight.data_ptr()
    assert isinstance(ensemble, BatchEnsembleLeNet)
    assert isinstance(batchensemble(MLP(), 2), BatchEnsembleMLP)
    with torch.no_grad():
        ensemble.net.fc1.weight.add_(1.0)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    fresh = batchensemble(net, 3, use_base_weights=False)
    assert not torch.equal(fresh.net.fc1.weight, net.fc1.weight)


def test_factor_initialisation():
    torch.manual_seed(0)
    layer = BatchEnsembleLinear(400, 300, 4, r_mean=2.0, r_std=0.1, s_mean=-1.0, s_std=0.3)
    assert layer.r.shape == (4, 400) and layer.s.shape == (4, 300) and layer.bias.shape == (4, 300)
    assert layer.r.mean().item() == pytest.approx(2.0, abs=0.01)
    assert layer.r.std().item() == pytest.approx(0.1, rel=0.05)
    assert layer.s.mean().item() == pytest.approx(-1.0, abs=0.03)
    assert layer.s.std().item() == pytest.approx(0.3, rel=0.05)
    signs = BatchEnsembleConv2d(3, 5, 3, 2, init="random_sign")
    assert set(signs.r.unique().tolist()) == {-1.0, 1.0}
    assert set(signs.s.unique().tolist()) <= {-1.0, 1.0}


def test_model_contract_sites_and_scale():
    model = BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=3, num_members=2)
    model.num_data = 50
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])
    trace = poutine.trace(model).get_trace(x, y)
    latent = [
        n
        for n, s in trace.nodes.items()
        if s["type"] == "sample" and not s["is_observed"] and n not in ("data", "members")
    ]
    assert latent == []
    obs = trace.nodes["obs"]
    assert obs["fn"].batch_shape == (2, 5)
    assert obs["scale"] == pytest.approx(10.0)
    assert sorted(f.name for f in obs["cond_indep_stack"]) == ["data", "members"]
    assert trace.nodes["logits"]["value"].shape == (2, 5, 3)


def test_plain_svi_with_empty_guide_trains_it():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    model = BatchEnsembleMLP(in_features=4, hidden_features=16, out_features=2, num_members=3)
    model.num_data = 64

    def guide(x, y=None):
        pass

    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), pyro.infer.Trace_ELBO())
    losses = [svi.step(x, y) for _ in range(60)]
    assert losses[-1] < 0.5 * losses[0]


def test_fit_without_guide_and_isolation_between_ensembles():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    loader = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    a = BatchEnsembleMLP(in_features=4, hidden_features=16, out_features=2, num_members=2)
    b = BatchEnsembleMLP(in_features=4, hidden_features=16, out_features=2, num_members=2)
    b_before = {k: v.clone() for k, v in b.state_dict().items()}
    b_out = b(x).detach()
    b_entries = dict(pyro.get_param_store().items())  # b's call registered b's tensors
    a_out = a(x).detach()
    result = fit(a, None, loader, epochs=15, lr=0.02, num_data=64, progress=False)
    assert result.history[-1].loss < result.history[0].loss
    assert result.history[-1].kl == 0.0
    assert result.history[-1].train_acc > 0.9
    assert not torch.equal(a(x).detach(), a_out)  # a did train
    for k, v in b.state_dict().items():
        assert torch.equal(v, b_before[k])
    assert torch.equal(b(x).detach(), b_out)
    # b's entries in the param store are its own: a's training replaced or moved none of them
    store = pyro.get_param_store()
    assert b_entries and set(b_entries) <= set(store.keys())
    for name, value in b_entries.items():
        assert torch.equal(store[name].detach(), value.detach()), name


def test_param_store_entries_go_with_the_ensemble():
    other = BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=3, num_members=2)
    other(torch.randn(2, 4))
    kept = set(pyro.get_param_store().keys())
    model = BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=3, num_members=2)
    model(torch.randn(2, 4))
    added = set(pyro.get_param_store().keys()) - kept
    assert len(added) == len(kept) > 0  # as many entries again, under names of its own
    del model
    gc.collect()
    assert set(pyro.get_param_store().keys()) == kept  # another ensemble's entries stay


class Residual(nn.Module):
    """Nested, residual, BatchNorm, 1-d and grouped convolutions: not an nn.Sequential."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(2, 6, 3, padding=1), nn.BatchNorm1d(6), nn.ReLU())
        self.block = nn.ModuleDict(
            {
                "depthwise": nn.Conv1d(6, 6, 3, padding=1, groups=6),
                "grouped": nn.Conv1d(6, 6, 1, groups=3, bias=False),
                "norm": nn.BatchNorm1d(6),
            }
        )
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.stem(x)
        h = h + self.block["norm"](self.block["grouped"](self.block["depthwise"](h)))
        return self.head(h.relu().mean(-1))


def test_any_module_converts_nested_residual_and_grouped():
    net = Residual().eval()
    ensemble = batchensemble(net, 3, norms="shared")
    assert type(ensemble) is BatchEnsembleNetwork
    kinds = {n: type(m) for n, m in _layers(ensemble).items()}
    assert kinds == {
        "stem.0": BatchEnsembleConv1d,
        "block.depthwise": BatchEnsembleConv1d,
        "block.grouped": BatchEnsembleConv1d,
        "head": BatchEnsembleLinear,
    }
    # normalisation layers are shared: one set of parameters and running statistics
    assert [n for n, _ in ensemble.named_parameters() if "norm" in n or "stem.1" in n] == [
        "net.stem.1.weight",
        "net.stem.1.bias",
        "net.block.norm.weight",
        "net.block.norm.bias",
    ]
    _distinct_biases(ensemble)
    ensemble.eval()
    x = torch.randn(4, 2, 9)
    out = ensemble(x)
    assert out.shape == (3, 4, 3)
    for i in range(3):
        layers = _layers(ensemble)
        clone = copy.deepcopy(net)
        for name, layer in layers.items():
            plain = clone.get_submodule(name)
            with torch.no_grad():
                plain.weight.copy_(layer.effective_weight(i))
                if plain.bias is None:
                    plain.bias = nn.Parameter(layer.bias[i].clone())
                else:
                    plain.bias.copy_(layer.bias[i])
        torch.testing.assert_close(out[i], clone(x), rtol=1e-4, atol=1e-5)


def test_batchnorm_in_training_normalises_over_every_member():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ensemble = batchensemble(net, 2, r_std=0.0, s_std=0.0, norms="shared")
    with torch.no_grad():
        ensemble.net[0].bias[1] += 10.0  # member 1's pre-activations shifted by 10
    ensemble.train()
    out = ensemble(torch.randn(8, 3))
    # statistics over the folded batch of both members: each member's mean is off zero
    means = out.mean(1)
    assert torch.allclose(means.sum(0), torch.zeros(4), atol=1e-5)
    assert (means[1] - means[0]).abs().min() > 0.5
    running = ensemble.net[1].running_mean
    assert running.shape == (4,) and running.abs().sum() > 0  # one shared set


def test_a_shared_instancenorm_moves_its_running_statistics_once_a_step():
    # members equal to the base network: the folded batch is x four times over, whose
    # per-instance statistics torch averages into one update of the running statistics
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.InstanceNorm2d(4, affine=True,
                        track_running_stats=True), nn.Flatten(), nn.Linear(144, 3))  # fmt: skip
    ensemble = batchensemble(net, 4, r_std=0.0, s_std=0.0, norms="shared").train()
    x = torch.randn(5, 3, 8, 8)
    ensemble(x)
    reference = copy.deepcopy(net[1]).train()
    reference(net[0](x))
    norm = ensemble.net[1]
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)


@pytest.mark.skipif(not hasattr(nn, "RMSNorm"), reason="nn.RMSNorm needs torch >= 2.4")
def test_rmsnorm_gets_a_copy_per_member_and_an_empty_batch_a_message():
    net = nn.Sequential(nn.Linear(6, 5), nn.RMSNorm(5), nn.Linear(5, 3))
    ensemble = batchensemble(net, 2)
    assert isinstance(ensemble.net[1], BatchEnsembleNorm)
    assert [n for n, _ in ensemble.named_parameters() if n.startswith("net.1.")] == [
        "net.1.norms.0.weight",
        "net.1.norms.1.weight",
    ]
    with pytest.raises(ValueError, match=r"got an empty batch \(outputs of shape \(2, 0, 3\)\), "
                       "expected at least one input"):  # fmt: skip
        ensemble(torch.randn(0, 6))


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"Expected num_members to be an integer >= 1, got 0"):
        batchensemble(MLP(), 0)
    with pytest.raises(ValueError, match=r"Expected r_std >= 0 .*got -0.1"):
        batchensemble(MLP(), 2, r_std=-0.1)
    with pytest.raises(ValueError, match=r"Expected s_std >= 0"):
        BatchEnsembleLinear(2, 2, 2, s_std=-1.0)
    with pytest.raises(ValueError, match=r"Unknown init 'uniform': expected 'normal'"):
        batchensemble(MLP(), 2, init="uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"has no nn\.Linear or convolution layer"):
        batchensemble(nn.Sequential(nn.BatchNorm1d(3), nn.ReLU()), 2)
    with pytest.raises(TypeError, match=r"Expected an nn\.Module to convert.*got int"):
        batchensemble(3, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expects images of shape \(B, 1, 28, 28\)"):
        BatchEnsembleLeNet(num_members=2)(torch.randn(2, 784))
    layer = BatchEnsembleLinear(4, 3, 2)
    with pytest.raises(
        ValueError, match=r"with 2 members expects a folded batch .*got shape \(3, 4\)"
    ):
        layer(torch.randn(3, 4))

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x), x

    with pytest.raises(TypeError, match=r"Pair.forward returned tuple; pyrouq needs a network"):
        batchensemble(Pair(), 2)(torch.randn(3, 2))


@pytest.mark.parametrize(
    ("make_net", "norms"),
    # ResidualCNN: a one-channel stem on the repeated input (the members share its convolution)
    # and BatchNorm, shared (folded passes in training) or per member (member passes on CPU)
    [
        (lambda: MLP(num_hidden=2), "shared"),
        (LeNet, "shared"),
        (Residual, "shared"),
        (lambda: ResidualCNN(width=4), "shared"),
        (lambda: ResidualCNN(width=4), "per_member"),
    ],
)
def test_cpu_and_accelerator_schedules_are_the_same_function(make_net, norms):
    """The folded pass with activations scaled by r and s (accelerators), the per-member
    folded convolutions and the whole member passes (CPU) give the same logits and gradients."""
    from pyrouq import _engine

    ensemble = batchensemble(make_net(), 3, init="random_sign", norms=norms)
    _distinct_biases(ensemble)
    x = torch.randn(4, 2, 9) if make_net is Residual else torch.randn(4, 1, 28, 28)
    results = []
    for mode in ("eval", "train"):
        getattr(ensemble, mode)()
        for kind in ("cpu", "accelerator"):
            with _engine.schedule(kind):
                ensemble.zero_grad()
                out = ensemble(x)
                (out * torch.arange(out.numel()).reshape(out.shape).sin()).sum().backward()
            grads = {n: p.grad.clone() for n, p in ensemble.named_parameters()}
            results.append((mode, out.detach(), grads))
    for mode in ("eval", "train"):
        (_, out_a, grads_a), (_, out_b, grads_b) = [r for r in results if r[0] == mode]
        torch.testing.assert_close(out_a, out_b, rtol=1e-4, atol=1e-5)
        for name in grads_a:
            torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-3, atol=1e-4)


class _Downsample(nn.Module):
    """16 channels wide, with a strided 1x1 convolution on 4 channels: the kind of convolution
    whose channels-last weight gradient torch 2.14's CPU kernel gets wrong (or hangs on) when
    called directly, so the engine keeps such networks in the default layout."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.down = nn.Conv2d(4, 16, 1, stride=2)
        self.wide = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        h = self.wide(torch.relu(self.down(torch.relu(self.stem(x)))))
        return self.fc(h.mean((-2, -1)))


class _Depthwise(nn.Module):
    """A MobileNet-style block: a depthwise 3x3 (strided) and a 1x1 expansion to 160 channels,
    wider than the engine's channels-last bound, which a depthwise convolution lifts."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
        self.depthwise = nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16)
        self.norm = nn.BatchNorm2d(16)
        self.expand = nn.Conv2d(16, 160, 1)
        self.fc = nn.Linear(160, 10)

    def forward(self, x):
        h = torch.relu(self.norm(self.depthwise(torch.relu(self.stem(x)))))
        return self.fc(torch.relu(self.expand(h)).mean((-2, -1)))


@pytest.mark.parametrize(
    ("make_net", "norms"),
    [
        (ResidualCNN, "shared"),
        (ResidualCNN, "per_member"),
        (_Downsample, "shared"),
        (_Depthwise, "per_member"),
    ],
)
def test_float32_training_matches_float64(make_net, norms, monkeypatch):
    """Whatever memory layout the engine picks on CPU (channels-last for wide convolutions),
    a float32 train step's logits and gradients are float64's up to float32 rounding.

    The networks' ``torch.relu`` is smooth here (tanh): a pre-activation within float32's
    rounding of 0 (about one in 10^5; ResidualCNN on one thread, torch 2.14) switches its
    gradient on in one dtype and off in the other, which moves the weight gradients by a few
    percent through BatchNorm with no layout at fault."""
    monkeypatch.setattr(torch, "relu", torch.tanh)
    torch.manual_seed(0)
    ensemble = batchensemble(make_net(), 2, init="random_sign", norms=norms)
    x = torch.randn(6, 1, 28, 28)
    grads = []
    for dtype in (torch.float64, torch.float32):
        net = copy.deepcopy(ensemble).to(dtype).train()
        out = net(x.to(dtype))
        (out * torch.arange(out.numel()).reshape(out.shape).sin()).sum().backward()
        grads.append(
            (out.detach().double(), {n: p.grad.double() for n, p in net.named_parameters()})
        )
    (want, want_grads), (got, got_grads) = grads
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for name, grad in want_grads.items():
        scale = float(grad.abs().max())
        torch.testing.assert_close(got_grads[name], grad, rtol=0, atol=1e-4 * max(scale, 1.0))


def test_conv_layer_on_a_folded_batch():
    layer = BatchEnsembleConv2d(3, 4, 3, 2, padding=1)
    x = torch.randn(2 * 5, 3, 8, 8)
    for kind in ("cpu", "accelerator"):
        from pyrouq import _engine

        with _engine.schedule(kind):
            out = layer(x)
        for m in range(2):
            chunk = x[m * 5 : (m + 1) * 5]
            expected = torch.conv2d(chunk, layer.effective_weight(m), layer.bias[m], padding=1)
            torch.testing.assert_close(out[m * 5 : (m + 1) * 5], expected, rtol=1e-4, atol=1e-5)


def test_per_member_norms_keep_each_members_statistics():
    net = ResidualCNN(width=4)
    shared = batchensemble(net, 3, init="random_sign", norms="shared")
    own = batchensemble(net, 3, init="random_sign")  # the default: a copy per member
    with torch.no_grad():
        for a, b in zip(_layers(shared).values(), _layers(own).values(), strict=True):
            b.r.copy_(a.r)
            b.s.copy_(a.s)
    norms = [m for m in own.net.modules() if isinstance(m, BatchEnsembleNorm)]
    assert len(norms) == 9 and all(len(m.norms) == 3 for m in norms)
    assert sum(isinstance(m, nn.BatchNorm2d) for m in own.net.modules()) == 27
    x = torch.randn(8, 1, 28, 28)
    shared.train(), own.train()
    a, b = shared(x), own(x)
    assert not torch.allclose(a, b, atol=1e-3)  # statistics over all members' rows vs each's
    stem = own.net.stem[1].norms  # each copy's running mean moved by its own member's rows
    assert not torch.allclose(stem[0].running_mean, stem[1].running_mean)
    # a member's copies see exactly its rows: member 1 computed on its own
    torch.testing.assert_close(b[1], _member_alone(own, x, 1), rtol=1e-4, atol=1e-5)


def _member_alone(ensemble, x, member):
    """Member ``member``'s outputs computed on its own: effective weights, its norm copies."""
    import copy as _copy

    net = _copy.deepcopy(ensemble.net)
    for layer in list(net.modules()):
        for child_name, child in list(layer.named_children()):
            if getattr(child, "_is_batchensemble", False):
                weight, bias = child.folded_weights()
                setattr(layer, child_name, _plain_layer(child, weight[member], bias[member]))
            elif isinstance(child, BatchEnsembleNorm):
                setattr(layer, child_name, child.norms[member])
    net.train()
    return net(x)


def _plain_layer(layer, weight, bias):
    if isinstance(layer, BatchEnsembleLinear):
        plain = nn.Linear(layer.in_features, layer.out_features)
    else:
        plain = nn.Conv2d(
            layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
            layer.padding, layer.dilation, layer.groups, padding_mode=layer.padding_mode,
        )  # fmt: skip
    with torch.no_grad():
        plain.weight.copy_(weight)
        plain.bias.copy_(bias)
    return plain


def test_per_member_norms_start_as_the_base_network():
    net = ResidualCNN(width=4)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5), m.weight.uniform_(0.5, 1.5)
    net.eval()
    ensemble = batchensemble(net, 4, r_std=0.0, s_std=0.0, norms="per_member").eval()
    x = torch.randn(5, 1, 28, 28)
    out = ensemble(x)
    for member in range(4):
        torch.testing.assert_close(out[member], net(x), rtol=1e-5, atol=1e-5)


def test_per_member_norm_refuses_what_it_cannot_copy_or_split():
    with pytest.raises(TypeError, match="BatchEnsembleNorm copies a normalisation layer"):
        BatchEnsembleNorm(nn.ReLU(), 2)
    with pytest.raises(
        ValueError, match=r"BatchEnsembleNorm\(num_members=3\) with 3 members expects a folded"
    ):
        BatchEnsembleNorm(nn.LayerNorm(4), 3)(torch.randn(4, 4))


@pytest.mark.parametrize("module", ["MLP", "Sequential"])
def test_batchensemble_takes_the_num_data_its_refusal_asks_for(module):
    """A BatchEnsemble run by a Pyro loop of one's own (not fit()) meets 'num_data is not
    set ... Pass num_data=N to the constructor': batchensemble() took no num_data (a
    TypeError), as bayesian() and rank1() do. Its N now scales a minibatch's 'obs' by N/B."""
    torch.manual_seed(0)
    if module == "MLP":
        net: nn.Module = MLP(in_features=3, hidden_features=4, out_features=2)
    else:
        net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    with pytest.raises(ValueError, match=r"num_data is not set.*Pass num_data=N to the const"):
        batchensemble(net, 2)(x, y)
    model = batchensemble(net, 2, num_data=40)
    assert model.num_data == 40
    assert poutine.trace(model).get_trace(x, y).nodes["obs"]["scale"] == 4.0
