"""Review of c523c9b: batchensemble()/rank1() keep a bias tied between two layers tied.

References are independent of pyrouq's engine: the original network run by
``torch.func.functional_call`` with each member's weights built by hand (``diag(s) W diag(r)``)
and, for the gradients, each layer's copy of the tied bias a leaf of its own, summed.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.func import functional_call

import pyrouq
from pyrouq import batchensemble, rank1


class _TiedBias(nn.Module):
    """``b`` shares ``a``'s bias (not its weight); an optional BatchNorm between them."""

    def __init__(self, norm: bool = False):
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.norm = nn.BatchNorm1d(5) if norm else nn.Identity()
        self.b = nn.Linear(5, 5)
        self.b.bias = self.a.bias
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.norm(self.a(x))))))


class _TiedToAParameter(nn.Module):
    """``a``'s bias is also read as a tensor of its own (``offset``)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.offset = self.a.bias
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.a(x)) + self.offset)


def _member(ensemble, m: int, leaves: bool = False) -> dict[str, torch.Tensor]:
    """Member ``m``'s weights of the original layers, by hand; ``leaves``: each layer's bias a
    fresh leaf (a tied bias: one per layer), to read its gradient."""
    weights = {}
    for path, layer in ensemble.net.named_modules():
        if getattr(layer, "_is_batchensemble", False):
            w, r, s = layer.weight.detach(), layer.r[m].detach(), layer.s[m].detach()
            weights[f"{path}.weight"] = s[:, None] * w * r[None, :]
            bias = layer.bias[m].detach().clone()
            weights[f"{path}.bias"] = bias.requires_grad_(leaves)
    return weights


@pytest.mark.parametrize("norm", [False, True], ids=["member_passes", "folded_shared_bn"])
def test_tied_bias_gradient_is_the_sum_of_both_layers_member_by_member(norm):
    torch.manual_seed(0)
    net = _TiedBias(norm=norm).train()
    ensemble = batchensemble(net, 2, r_std=0.3, s_std=0.3, norms="shared").train()
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    out = ensemble.outputs(x)
    nn.functional.cross_entropy(out.flatten(0, 1), y.repeat(2), reduction="sum").backward()
    grad = ensemble.net.a.bias.grad
    assert ensemble.net.b.bias.grad is grad  # one tensor
    expected = torch.zeros(2, 5)
    members = [_member(ensemble, m, leaves=True) for m in range(2)]
    if norm:  # a shared BatchNorm in training: statistics over both members' rows
        state = {k: v.detach() for k, v in ensemble.net.norm.named_parameters()}
        reference = nn.BatchNorm1d(5).train()

        def body(weights, inputs):
            h = [
                nn.functional.linear(i, weights[k]["a.weight"], weights[k]["a.bias"])
                for k, i in enumerate(inputs)
            ]
            h = functional_call(reference, state, (torch.cat(h),)).chunk(2)
            h = [
                nn.functional.linear(torch.tanh(v), weights[k]["b.weight"], weights[k]["b.bias"])
                for k, v in enumerate(h)
            ]
            return torch.stack(
                [
                    nn.functional.linear(
                        torch.tanh(v), weights[k]["head.weight"], weights[k]["head.bias"]
                    )
                    for k, v in enumerate(h)
                ]
            )

        logits = body(members, [x, x])
    else:
        logits = torch.stack([functional_call(net, w, (x,), tie_weights=False) for w in members])
    nn.functional.cross_entropy(logits.flatten(0, 1), y.repeat(2), reduction="sum").backward()
    for m in range(2):
        expected[m] = members[m]["a.bias"].grad + members[m]["b.bias"].grad
    torch.testing.assert_close(out.detach(), logits.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_with_the_tied_bias_trained_apart_loads_as_saved(tmp_path):
    """Review 13c: an ensemble saved before c523c9b held a tied bias as two layers' per-member
    biases, trained apart; rebuilt tied, load() put the last one in both layers, silently."""
    torch.manual_seed(0)
    saved = batchensemble(_TiedBias(), 2, r_std=0.3, s_std=0.3)
    with torch.no_grad():  # what the earlier conversion held after training: two biases
        saved.net.b.bias = nn.Parameter(saved.net.a.bias + torch.randn(2, 5))
    pyrouq.save(tmp_path / "old.pt", saved)
    loaded = pyrouq.load(tmp_path / "old.pt", module=_TiedBias()).model
    x = torch.randn(4, 5)
    with torch.no_grad():
        expected = torch.stack(
            [
                functional_call(_TiedBias(), _member(saved, m), (x,), tie_weights=False)
                for m in range(2)
            ]
        )
        torch.testing.assert_close(loaded.outputs(x), expected, rtol=0, atol=1e-6)
    assert torch.equal(loaded.net.b.bias, saved.net.b.bias)
    # one saved tied keeps its tie
    tied = batchensemble(_TiedBias(), 2)
    pyrouq.save(tmp_path / "new.pt", tied)
    again = pyrouq.load(tmp_path / "new.pt", module=_TiedBias()).model
    assert again.net.a.bias is again.net.b.bias
    assert torch.equal(again.net.a.bias, tied.net.a.bias)


@pytest.mark.parametrize("convert", [batchensemble, rank1])
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_bias_tied_to_a_kept_parameter_warns_that_the_tie_breaks(convert, tmp_path):
    """Review 13c: a bias tied to a parameter the conversion keeps (read as a tensor) lost its
    tie silently, though the docstring says a tied bias stays tied."""
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="tied to the bias of a converted layer") as record:
        model = convert(_TiedToAParameter(), 2)
    text = str(record[0].message)
    assert text.startswith(
        f"{convert.__name__}(): 'offset', tied to the bias of a converted layer,"
    )
    assert "train apart" in text and "pyrouq.bayesian(net), which keeps every tie" in text
    assert tuple(model.net.a.bias.shape) == (2, 5) and tuple(model.net.offset.shape) == (5,)
    pyrouq.save(tmp_path / "m.pt", model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # load() does not repeat it
        pyrouq.load(tmp_path / "m.pt", module=_TiedToAParameter())


@pytest.mark.parametrize("use_base_weights", [True, False])
def test_no_warning_for_ties_among_converted_layers(use_base_weights):
    torch.manual_seed(0)
    shared = nn.Linear(5, 5)
    net = nn.Sequential(shared, nn.Tanh(), shared, nn.Tanh(), _TiedBias())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ensemble = batchensemble(net, 3, use_base_weights=use_base_weights)
    inner = ensemble.net[4]
    assert ensemble.net[0] is ensemble.net[2] and inner.a.bias is inner.b.bias
    assert torch.equal(inner.a.bias[0], inner.a.bias[2])  # every member starts from one bias
