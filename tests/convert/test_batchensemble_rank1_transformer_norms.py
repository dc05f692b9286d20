"""Third audit of BatchEnsemble and rank-1: the final norm of a sequence-first
``nn.TransformerEncoder`` keeps its members apart in a folded batch, and a network already
holding BatchEnsemble layers of another size is refused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pyrouq import _engine, batchensemble, rank1
from pyrouq.nn import BatchEnsembleNorm


def _member_network(base: nn.Module, ensemble, i: int) -> nn.Module:
    """``base`` with member i's effective weights, biases and norm copies."""
    clone = copy.deepcopy(base)
    for name, module in ensemble.net.named_modules():
        if getattr(module, "_is_batchensemble", False):
            plain = clone.get_submodule(name)
            plain.weight = nn.Parameter(module.effective_weight(i).detach().clone())
            plain.bias = nn.Parameter(module.bias.detach()[i].clone())
        elif isinstance(module, BatchEnsembleNorm):
            parent, _, child = name.rpartition(".")
            setattr(clone.get_submodule(parent), child, copy.deepcopy(module.norms[i]))
    return clone


class _Encoder(nn.Module):
    """torch's default transformer stack: sequence-first (batch_first=False), a final norm."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, 8)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
        self.encoder = nn.TransformerEncoder(
            layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False
        )
        self.head = nn.Linear(8, 2)

    def forward(self, x):  # (B, T, 3)
        h = self.encoder(self.embed(x).transpose(0, 1))  # (T, B, 8)
        return self.head(h.mean(0))


@pytest.mark.parametrize("steps", [6, 5])  # T = M * B (once silently mixed), T not a multiple
def test_the_final_norm_of_a_sequence_first_transformer_stack_keeps_members_apart(steps):
    torch.manual_seed(0)
    base = _Encoder()
    ensemble = batchensemble(base, 3).eval()  # per-member norms: the default
    with torch.no_grad():  # members whose final norms differ, as after training
        for norm in ensemble.net.encoder.norm.norms:
            norm.weight.add_(0.5 * torch.randn_like(norm.weight))
            norm.bias.add_(0.5 * torch.randn_like(norm.bias))
    x = torch.randn(2, steps, 3)  # B = 2: M * B = 6
    with torch.no_grad():
        expected = torch.stack([_member_network(base, ensemble, i).eval()(x) for i in range(3)])
        for kind in ("cpu", "accelerator"):  # member passes; one folded batch
            with _engine.schedule(kind):
                got = ensemble(x)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_a_network_holding_batchensemble_layers_of_another_size_is_refused():
    torch.manual_seed(0)
    inner = batchensemble(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)), 2)
    extended = nn.Sequential(inner.net, nn.LayerNorm(3), nn.Linear(3, 3))
    message = (
        r"Sequential already holds BatchEnsemble layers of another size than num_members=3: "
        r"'0\.0' \(2 members\), '0\.2' \(2 members\)\. They would mix the members of the "
        r"folded batch\. Convert the plain network they were made from, or pass num_members=2"
    )
    for convert in (batchensemble, rank1):
        with pytest.raises(ValueError, match=message):
            convert(extended, 3)
    # with their own size the layers are kept as they are and the new ones join them
    ensemble = batchensemble(extended, 2).eval()
    x = torch.randn(2, 4)  # M * B = 4: a multiple of 2 once split it silently
    with torch.no_grad():
        hidden = inner.eval().outputs(x)  # (M, B, 3)
        norm, head = ensemble.net[1], ensemble.net[2]
        expected = torch.stack(
            [norm.norms[m](hidden[m]) @ head.effective_weight(m).T + head.bias[m] for m in range(2)]
        )
        for kind in ("cpu", "accelerator"):
            with _engine.schedule(kind):
                torch.testing.assert_close(ensemble(x), expected, rtol=1e-5, atol=1e-6)
