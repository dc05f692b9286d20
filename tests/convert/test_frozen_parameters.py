"""Frozen parameters (``requires_grad=False``) stay frozen: through bayesian(), batchensemble()
and rank1(), through fit() and through plain Pyro SVI, as a torch user expects."""

from __future__ import annotations

import pyro
import pytest
import torch
from _toy import ListLoader, toy_data
from torch import nn

from pyrouq import KLWeightedELBO, batchensemble, bayesian, fit, mean_field_guide, rank1


def net_with_batchnorm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def snapshot(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def train(model, guide, epochs=3):
    x, y = toy_data(40)
    fit(model, guide, ListLoader(x, y, 10), epochs=epochs, progress=False, seed=0)


def test_fit_leaves_a_frozen_batchnorm_of_a_bayesian_network_unchanged():
    net = net_with_batchnorm()
    net[1].requires_grad_(False)
    model = bayesian(net)
    guide = mean_field_guide(model)
    before = snapshot(model)
    train(model, guide)
    after = dict(model.named_parameters())
    for name in ("net.1.weight", "net.1.bias"):
        assert torch.equal(after[name], before[name]), name
        assert not after[name].requires_grad
    # its running statistics are buffers: they follow the data in training, as in torch
    assert not torch.equal(model.net[1].running_mean, torch.zeros(8))


def test_select_none_leaves_a_frozen_backbone_fixed_and_makes_the_rest_bayesian():
    net = net_with_batchnorm()
    net[0].requires_grad_(False)  # a "pre-trained backbone"
    model = bayesian(net)
    assert list(model.latent_sites()) == ["3.weight", "3.bias"]
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if "net.0" in name}
    assert set(frozen) == {"net.0.weight", "net.0.bias"}
    guide = mean_field_guide(model)
    loc = guide.site_loc("3.weight").detach().clone()
    train(model, guide)
    for name, value in frozen.items():
        assert torch.equal(dict(model.named_parameters())[name], value), name
    assert not torch.equal(guide.site_loc("3.weight"), loc)  # the Bayesian head trained
    # named explicitly, a frozen layer is made latent all the same
    assert "0.weight" in bayesian(net, select=["0", "3"]).latent_sites()


def test_select_none_on_a_fully_frozen_network_says_what_to_do():
    net = net_with_batchnorm()
    net.requires_grad_(False)
    with pytest.raises(ValueError, match=r"is frozen \(requires_grad=False.*select=\[\.\.\.\]"):
        bayesian(net)


@pytest.mark.parametrize("norms", ["shared", "per_member"])
def test_batchensemble_of_a_frozen_network_trains_only_its_factors(norms):
    net = net_with_batchnorm()
    net.requires_grad_(False)  # phase one done: only the members' factors train now
    ensemble = batchensemble(net, 3, norms=norms)
    trainable = sorted(n for n, p in ensemble.named_parameters() if p.requires_grad)
    assert trainable == ["net.0.r", "net.0.s", "net.3.r", "net.3.s"]
    before = snapshot(ensemble)
    train(ensemble, None)
    after = snapshot(ensemble)
    for name, value in before.items():
        assert torch.equal(after[name], value) != (name in trainable), name
    # the shared W is still the network's
    assert torch.equal(ensemble.net[0].weight, net[0].weight)


def test_use_base_weights_false_starts_afresh_all_but_the_frozen_layers():
    net = net_with_batchnorm()
    net[0].requires_grad_(False)  # a frozen feature layer, a head to learn from scratch
    ensemble = batchensemble(net, 2, use_base_weights=False)
    assert torch.equal(ensemble.net[0].weight, net[0].weight)
    assert torch.equal(ensemble.net[0].bias[0], net[0].bias)
    assert not torch.equal(ensemble.net[3].weight, net[3].weight)


def test_a_frozen_layer_without_bias_gets_frozen_member_biases():
    # a conv before a BatchNorm has no bias; its BatchEnsemble layer adds the members' own,
    # which a frozen backbone must keep fixed too (at zero), with or without rank-1 priors
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(),
                        nn.Linear(8, 2))  # fmt: skip
    net[:2].requires_grad_(False)
    ensemble = batchensemble(net, 2)
    assert not ensemble.net[0].bias.requires_grad and ensemble.net[3].bias.requires_grad
    train(ensemble, None)
    assert torch.equal(ensemble.net[0].bias, torch.zeros(2, 8))
    model = rank1(net, 2)
    assert not dict(model.named_parameters())["net.0.bias"].requires_grad


def test_rank1_of_a_frozen_network_keeps_w_and_biases_fixed():
    net = net_with_batchnorm()
    net.requires_grad_(False)
    model = rank1(net, 2)
    guide = mean_field_guide(model)
    before = snapshot(model)
    assert before  # W, the biases and the BatchNorm are point estimates of the model
    train(model, guide)
    for name, value in snapshot(model).items():
        assert torch.equal(value, before[name]), name


def test_a_parameter_frozen_after_converting_is_left_alone_too():
    ensemble = batchensemble(net_with_batchnorm(), 2)
    ensemble.net[3].weight.requires_grad_(False)
    before = ensemble.net[3].weight.detach().clone()
    w0 = ensemble.net[0].weight.detach().clone()
    train(ensemble, None)
    assert torch.equal(ensemble.net[3].weight, before)
    assert not torch.equal(ensemble.net[0].weight, w0)


def test_plain_pyro_svi_leaves_frozen_parameters_alone():
    net = net_with_batchnorm()
    net[1].requires_grad_(False)
    model = bayesian(net, num_data=40)
    guide = mean_field_guide(model)
    x, y = toy_data(40)
    before = snapshot(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), loss=KLWeightedELBO())
    for _ in range(5):
        svi.step(x, y)
    after = dict(model.named_parameters())
    assert torch.equal(after["net.1.weight"], before["net.1.weight"])
    assert not after["net.1.weight"].requires_grad


def test_fit_with_nothing_but_frozen_parameters_says_so():
    ensemble = batchensemble(net_with_batchnorm(), 2)
    ensemble.requires_grad_(False)
    with pytest.raises(ValueError, match=r"only frozen parameters.*requires_grad_\(True\)"):
        train(ensemble, None, epochs=1)


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_checkpoints_keep_which_parameters_are_frozen(kind, tmp_path):
    from pyrouq import load, save

    net = net_with_batchnorm()
    net[0].requires_grad_(False)
    model = bayesian(net) if kind == "bayesian" else batchensemble(net, 2)
    guide = mean_field_guide(model) if kind == "bayesian" else None
    if guide is not None:
        guide.requires_grad_(False)  # e.g. a guide kept fixed while the BatchNorm trains
    save(tmp_path / "m.pt", model, guide)
    back = load(tmp_path / "m.pt", module=net_with_batchnorm())  # a skeleton not frozen
    flags = {n: p.requires_grad for n, p in back.model.named_parameters()}
    assert flags == {n: p.requires_grad for n, p in model.named_parameters()}
    assert False in flags.values() and True in flags.values()
    if guide is not None:
        assert not any(p.requires_grad for p in back.guide.parameters())
