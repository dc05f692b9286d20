"""batchensemble() against a hand-written reference, and the audit's fixes: member i of a
converted network is the base network with weight ``W * (s_i r_i^T)`` (grouped convolutions
included) and member i's bias and norms."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from pyrouq import _engine, batchensemble
from pyrouq.nn import (
    BatchEnsembleConv2d,
    BatchEnsembleConvTranspose2d,
    BatchEnsembleNorm,
)


def _member_weight(layer, i: int) -> torch.Tensor:
    """Member i's weight, entry by entry: ``W[o, j, ...] * s_i[o] * r_i[input channel of j]``
    (a transposed convolution's W is ``(in, out / groups, ...)``)."""
    w, r, s = layer.weight.detach(), layer.r.detach()[i], layer.s.detach()[i]
    if w.dim() == 2:
        return w * s[:, None] * r[None, :]
    extra, groups = (1,) * (w.dim() - 2), layer.groups
    if getattr(layer, "transposed", False):
        cin, per_out = w.shape[0], w.shape[1]
        outs = [[ic // (cin // groups) * per_out + j for j in range(per_out)] for ic in range(cin)]
        return w * r.reshape(cin, 1, *extra) * s[torch.tensor(outs)].reshape(cin, per_out, *extra)
    cout, per_in = w.shape[0], w.shape[1]
    ins = [[o // (cout // groups) * per_in + j for j in range(per_in)] for o in range(cout)]
    return w * s.reshape(cout, 1, *extra) * r[torch.tensor(ins)].reshape(cout, per_in, *extra)


def _member_network(base: nn.Module, ensemble, i: int) -> nn.Module:
    """``base`` with member i's weights, biases and norm copies."""
    clone = copy.deepcopy(base)
    for name, module in ensemble.net.named_modules():
        if getattr(module, "_is_batchensemble", False):
            plain = clone.get_submodule(name)
            plain.weight = nn.Parameter(_member_weight(module, i))
            plain.bias = nn.Parameter(module.bias.detach()[i].clone())
        elif isinstance(module, BatchEnsembleNorm):
            parent, _, child = name.rpartition(".")
            setattr(clone.get_submodule(parent), child, copy.deepcopy(module.norms[i]))
    return clone


def _distinct(ensemble) -> None:
    """Different biases and norm parameters and statistics for every member."""
    with torch.no_grad():
        for module in ensemble.net.modules():
            if getattr(module, "_is_batchensemble", False):
                module.bias.add_(torch.randn_like(module.bias))
            if isinstance(module, BatchEnsembleNorm):
                for norm in module.norms:
                    for p in norm.parameters():
                        p.add_(0.3 * torch.randn_like(p))
                    if getattr(norm, "running_mean", None) is not None:
                        norm.running_mean.add_(torch.randn_like(norm.running_mean))


class _Mixed(nn.Module):
    """Grouped, dilated, strided and padded convolutions, a transposed one, BatchNorm and a
    Linear on (B, T, D)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2, padding_mode="circular")
        self.bn = nn.BatchNorm2d(6)
        self.b = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6, bias=False)
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.tok = nn.Linear(4, 5)
        self.fc = nn.Linear(5 * 64, 3)

    def forward(self, x):
        h = self.up(torch.tanh(self.b(torch.tanh(self.bn(self.a(x))))))  # (B, 4, 8, 8)
        h = self.tok(h.flatten(2).transpose(1, 2))  # (B, 64, 5)
        return self.fc(h.view(x.size(0), -1))


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("kind", ["cpu", "accelerator"])
def test_each_member_is_the_base_network_with_its_rank1_weights(mode, kind):
    torch.manual_seed(0)
    base = _Mixed()
    ensemble = batchensemble(base, 3)
    _distinct(ensemble)
    getattr(ensemble, mode)()
    members = [getattr(_member_network(base, ensemble, i), mode)() for i in range(3)]
    x = torch.randn(4, 4, 8, 8)
    with _engine.schedule(kind):
        out = ensemble(x).detach()
    for i, member in enumerate(members):
        torch.testing.assert_close(out[i], member(x).detach(), rtol=1e-4, atol=1e-5)
        # per-member BatchNorm: each copy's running statistics moved by its member's rows
        norm = ensemble.net.bn.norms[i]
        torch.testing.assert_close(norm.running_mean, member.bn.running_mean)
        torch.testing.assert_close(norm.running_var, member.bn.running_var)


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h, _ = self.att(x, x, x)
        return self.fc(h.mean(1))


class _Scaled(nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_use_base_weights_false_leaves_the_layers_kept_plain_as_they_were():
    """The attention's out_proj and a subclass with its own forward stay plain layers the
    members share; re-initialising them (and not the attention's in_proj) scrambled a
    pre-trained attention."""
    torch.manual_seed(0)
    net = _Attention()
    ensemble = batchensemble(net, 2, use_base_weights=False)
    assert torch.equal(ensemble.net.att.out_proj.weight, net.att.out_proj.weight)
    assert torch.equal(ensemble.net.att.in_proj_weight, net.att.in_proj_weight)
    assert not torch.equal(ensemble.net.fc.weight, net.fc.weight)
    scaled = nn.Sequential(_Scaled(4, 4), nn.Linear(4, 3))
    with pytest.warns(UserWarning, match="subclasses with a forward of their own"):
        ensemble = batchensemble(scaled, 2, use_base_weights=False)
    assert torch.equal(ensemble.net[0].weight, scaled[0].weight)
    assert not torch.equal(ensemble.net[1].weight, scaled[1].weight)


def test_use_base_weights_false_reinitialises_a_parametrized_layer():
    """Its reset_parameters wrote into a computed weight: the pre-trained weight stayed."""
    torch.manual_seed(0)
    net = nn.Sequential(weight_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 3))
    with pytest.warns(UserWarning, match="start from a re-initialised weight"):
        ensemble = batchensemble(net, 2, use_base_weights=False)
    layer = ensemble.net[0]
    assert not torch.allclose(layer.weight, net[0].weight)
    assert layer.weight.requires_grad and layer.bias.requires_grad
    bound = 1 / 4**0.5  # torch's default initialisation of a Linear with 4 inputs
    assert float(layer.weight.detach().abs().max()) <= bound
    assert float(layer.bias.detach().abs().max()) <= bound
    with pytest.warns(UserWarning, match="start from its current weight"):
        kept = batchensemble(net, 2)
    torch.testing.assert_close(kept.net[0].weight, net[0].weight)


def test_a_conv_base_with_other_sizes_or_settings_is_refused_and_its_own_accepted():
    base = nn.Conv2d(3, 4, 3)
    with pytest.raises(ValueError, match=r"kernel_size=5 and base=Conv2d .* kernel_size=\(3, 3\)"):
        BatchEnsembleConv2d(3, 4, 5, 2, base=base)
    # base's own settings, in another form, are no clash
    layer = BatchEnsembleConv2d(3, 4, (3, 3), 2, base=base, padding=(0, 0), stride=[1, 1])
    assert layer.padding == (0, 0) and layer.kernel_size == (3, 3)
    with pytest.raises(ValueError, match=r"settings \{'stride': 2\}"):
        BatchEnsembleConv2d(3, 4, 3, 2, base=base, stride=2)
    up = nn.ConvTranspose2d(5, 6, 3, stride=2)
    with pytest.raises(ValueError, match=r"got sizes \(3, 4\), kernel_size=3 and base="):
        BatchEnsembleConvTranspose2d(3, 4, 3, 2, base=up)
    with pytest.raises(ValueError, match=r"settings \{'output_padding': 1\}"):
        BatchEnsembleConvTranspose2d(5, 6, 3, 2, base=up, output_padding=1)
    same = nn.ConvTranspose2d(5, 6, 3, stride=2, output_padding=1)
    assert BatchEnsembleConvTranspose2d(5, 6, 3, 2, base=same, output_padding=1).output_padding
    assert BatchEnsembleConvTranspose2d.from_module(same, 2).output_padding == (1, 1)


class _ReadsItsNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(F.layer_norm(self.a(x), (8,), self.ln.weight, self.ln.bias))


def test_a_forward_reading_a_per_member_norms_weight_is_told_what_to_do():
    ensemble = batchensemble(_ReadsItsNorm(), 2)
    with pytest.raises(AttributeError, match=r"one LayerNorm per member .* norms='shared'"):
        ensemble(torch.randn(3, 4))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        ensemble.net.ln.nothing  # noqa: B018 - what a norm does not have either: torch's error
    shared = batchensemble(_ReadsItsNorm(), 2, norms="shared")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert shared(torch.randn(3, 4)).shape == (2, 3, 3)
