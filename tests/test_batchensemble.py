from __future__ import annotations

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
    batchensemble,
)
from pyrouq.nn import BatchEnsembleConv2d, BatchEnsembleLinear


def _plain_copy(net: nn.Sequential, ensemble, member: int) -> nn.Sequential:
    """A standalone copy of ``net`` carrying member i's effective weights and bias."""
    import copy

    clone = copy.deepcopy(net)
    for name, layer in clone.named_children():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            be = getattr(ensemble, name)
            with torch.no_grad():
                layer.weight.copy_(be.effective_weight(member))
                layer.bias.copy_(be.bias[member])
    return clone


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
    with torch.no_grad():  # distinct biases per member too
        for module in ensemble.modules():
            if isinstance(module, (BatchEnsembleLinear, BatchEnsembleConv2d)):
                module.bias.add_(torch.randn_like(module.bias))
    x = torch.randn(5, 1, 28, 28)
    out = ensemble(x)
    for i in range(3):
        standalone = _plain_copy(net, ensemble, i)
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
        layer = getattr(ensemble, name)
        assert torch.equal(layer.weight, getattr(net, name).weight)
        assert torch.equal(layer.bias, getattr(net, name).bias.expand(3, -1))
        assert layer.weight.data_ptr() != getattr(net, name).weight.data_ptr()
    assert isinstance(ensemble, BatchEnsembleLeNet)
    assert isinstance(batchensemble(MLP(), 2), BatchEnsembleMLP)
    with torch.no_grad():
        ensemble.fc1.weight.add_(1.0)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    fresh = batchensemble(net, 3, use_base_weights=False)
    assert not torch.equal(fresh.fc1.weight, net.fc1.weight)


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
    assert [f.name for f in obs["cond_indep_stack"]] == ["data", "members"] or [
        f.name for f in obs["cond_indep_stack"]
    ] == ["members", "data"]
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
    result = fit(a, None, loader, epochs=15, lr=0.02, num_data=64, progress=False)
    assert result.history[-1].loss < result.history[0].loss
    assert result.history[-1].kl == 0.0
    assert result.history[-1].train_acc > 0.9
    for k, v in b.state_dict().items():
        assert torch.equal(v, b_before[k])
    assert a._pyro_name != b._pyro_name


def test_param_store_entries_go_with_the_ensemble():
    model = BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=3, num_members=2)
    model(torch.randn(2, 4))
    prefix = model._pyro_name
    assert any(k.startswith(prefix + ".") for k in pyro.get_param_store().keys())
    del model
    gc.collect()
    assert not any(k.startswith(prefix + ".") for k in pyro.get_param_store().keys())


def test_generic_sequential_conversion():
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    ensemble = batchensemble(net, 2, r_std=0.0, s_std=0.0)
    assert type(ensemble) is BatchEnsembleNetwork
    x = torch.randn(3, 4)
    torch.testing.assert_close(ensemble(x)[1], net(x))


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"Expected num_members to be an integer >= 1, got 0"):
        batchensemble(MLP(), 0)
    with pytest.raises(ValueError, match=r"Expected r_std >= 0 .*got -0.1"):
        batchensemble(MLP(), 2, r_std=-0.1)
    with pytest.raises(ValueError, match=r"Expected s_std >= 0"):
        BatchEnsembleLinear(2, 2, 2, s_std=-1.0)
    with pytest.raises(ValueError, match=r"Unknown init 'uniform': expected 'normal'"):
        batchensemble(MLP(), 2, init="uniform")  # type: ignore[arg-type]
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 3))
    with pytest.raises(TypeError, match=r"Layer '1' \(BatchNorm1d\) has parameters and no"):
        batchensemble(net, 2)
    with pytest.raises(TypeError, match=r"converts an MLP, a LeNet or an nn\.Sequential"):
        batchensemble(nn.Linear(3, 3), 2)
    with pytest.raises(ValueError, match=r"expects images of shape \(B, 1, 28, 28\)"):
        BatchEnsembleLeNet(num_members=2)(torch.randn(2, 784))
    layer = BatchEnsembleLinear(4, 3, 2)
    with pytest.raises(ValueError, match=r"with 2 members expects input .* got shape \(3, 5, 4\)"):
        layer(torch.randn(3, 5, 4))


@pytest.mark.parametrize("init", ["normal", "random_sign"])
@pytest.mark.parametrize("make_net", [lambda: MLP(num_hidden=2), lambda: LeNet(in_channels=1)])
def test_batched_pass_equals_member_passes_values_and_gradients(make_net, init):
    """The batched pass (accelerators) and the per-member passes (CPU, with the shared first
    convolution and pooling, where negative factors turn max-pooling into min-pooling) are
    the same function."""
    from pyrouq.nn import run_pipeline

    ensemble = batchensemble(make_net(), 3, init=init)
    if init == "random_sign" and isinstance(ensemble, BatchEnsembleLeNet):
        assert (ensemble.conv1.r * ensemble.conv1.s < 0).any()  # the min-pooling branch runs
    with torch.no_grad():
        for module in ensemble.modules():
            if isinstance(module, (BatchEnsembleLinear, BatchEnsembleConv2d)):
                module.bias.add_(torch.randn_like(module.bias))
    x = torch.randn(4, 1, 28, 28)
    batched = run_pipeline(ensemble, ensemble._steps, x)
    looped = ensemble._member_passes(x)
    torch.testing.assert_close(batched, looped, rtol=1e-4, atol=1e-5)
    grads = []
    for out in (batched, looped):
        ensemble.zero_grad()
        (out * torch.arange(out.numel()).reshape(out.shape).sin()).sum().backward()
        grads.append({n: p.grad.clone() for n, p in ensemble.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-3, atol=1e-4)


def test_conv_layer_with_several_input_channels_shared_and_stacked():
    layer = BatchEnsembleConv2d(3, 4, 3, 2, padding=1)
    x = torch.randn(5, 3, 8, 8)
    out = layer(x)
    for m in range(2):
        expected = torch.conv2d(x, layer.effective_weight(m), layer.bias[m], padding=1)
        torch.testing.assert_close(out[m], expected, rtol=1e-4, atol=1e-5)
    xs = torch.randn(2, 5, 3, 8, 8)
    out = layer(xs)
    for m in range(2):
        expected = torch.conv2d(xs[m], layer.effective_weight(m), layer.bias[m], padding=1)
        torch.testing.assert_close(out[m], expected, rtol=1e-4, atol=1e-5)
