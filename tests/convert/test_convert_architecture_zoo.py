"""Seventh audit, bring your own network across architectures the other tests do not use:
torchvision's DenseNet (with activation checkpointing), a small ConvNeXt (layer scales), a
small EfficientNet (stochastic depth), a tiny VisionTransformer, MobileNetV3 and a network of
one's own with a GRU over the rows of an image, a tied linear layer and a functional
convolution on a registered parameter. Every value is checked against the plain torch network
(with the weights loaded) or a member built by hand."""

from __future__ import annotations

import copy
import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from _toy import loaded_copy
from torch import nn
from torch.utils.checkpoint import checkpoint

import pyrouq
from pyrouq import (
    KLWeightedELBO,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    predict,
    rank1,
    save,
)
from pyrouq._engine._cpu_paths import schedule
from pyrouq.nn import BatchEnsembleNorm

tvm = pytest.importorskip("torchvision.models")

_BATCHENSEMBLE = tuple(pyrouq.nn.BATCHENSEMBLE_LAYERS.values())
"""pyrouq's BatchEnsemble layer classes."""


def _settled(net: nn.Module, shape: tuple[int, ...]) -> nn.Module:
    """``net`` with weights of unit-scale activations and BatchNorm statistics of one random
    batch (torchvision's init gives a zero head and logits near 0, which compare to anything),
    in eval mode."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1:
                p.normal_(0.0, p[0].numel() ** -0.5)
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = 1.0
        net.train()(torch.randn(8, *shape))
    return net.eval()


def _tiny_densenet(memory_efficient: bool) -> nn.Module:
    return tvm.DenseNet(
        growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2, num_classes=10,
        memory_efficient=memory_efficient,
    )  # fmt: skip


def _vit() -> nn.Module:
    return tvm.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=10,
    )  # fmt: skip


class _RowsGRU(nn.Module):
    """A GRU over the rows of an image, after a convolution of a registered parameter; one
    Linear called twice, and a second Linear tied to it."""

    def __init__(self):
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(4, 1, 3, 3) * 0.3)
        self.rnn = nn.GRU(28, 16, batch_first=True)
        self.mid = nn.Linear(16, 16)
        self.again = nn.Linear(16, 16)
        self.again.weight = self.mid.weight
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = F.conv2d(x, self.kernel, padding=1).mean(1)
        out, _ = self.rnn(h)
        z = torch.tanh(self.mid(out[:, -1]))
        z = torch.tanh(self.mid(z))
        return self.head(torch.tanh(self.again(z)))


# --------------------------------------------------------------------------------------------
# Activation checkpointing (the defect this audit fixed)
# --------------------------------------------------------------------------------------------


def _elbo_grads(model, guide, x, y):
    pyro.set_rng_seed(0)
    loss = KLWeightedELBO().differentiable_loss(model, guide, x, y)
    params = [*guide.parameters(), *model.parameters()]
    return torch.autograd.grad(loss, params, allow_unused=True)


def test_a_bayesian_densenet_that_checkpoints_its_latent_layers_is_refused_naming_the_layer():
    """DenseNet(memory_efficient=True) runs its bottlenecks inside torch.utils.checkpoint,
    which runs them again in the backward pass, after the draw has been put back: its
    gradients were silently those of other weights (conv0's location off by 0.26 of 1.45).
    fit() now refuses it, naming the layer and the switch; predict() (no backward) runs."""
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    model = bayesian(_tiny_densenet(True))
    guide = mean_field_guide(model)
    assert predict(model, x, guide, num_samples=2, progress=False).probs.shape == (2, 4, 10)
    with pytest.raises(ValueError, match=r"torch\.utils\.checkpoint") as error:
        fit(model, guide, [(x, y)], epochs=1, num_data=4, progress=False)
    text = str(error.value)
    assert "'features.denseblock1.denselayer1'" in text
    assert "memory_efficient=False" in text
    # a rank-1 network and local reparameterisation met torch's bare CheckpointError
    for made in (
        rank1(_tiny_densenet(True), 2),
        bayesian(_tiny_densenet(True), local_reparameterization=True),
    ):
        with pytest.raises(ValueError, match="memory_efficient=False"):
            _elbo_grads(made, mean_field_guide(made), x, y)


def test_checkpointed_layers_that_hold_no_draw_keep_their_gradients():
    """Checkpointing is refused only where it would compute otherwise: with the last layer
    Bayesian (the checkpointed body holds point estimates) and for a BatchEnsemble run on its
    folded batch, the gradients equal those of the same network without checkpointing; a
    BatchEnsemble's member passes (CPU) are refused, with pyrouq's message, not torch's."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    base = _tiny_densenet(False)
    grads = {}
    for efficient in (False, True):
        net = copy.deepcopy(base)
        for module in net.modules():
            if hasattr(module, "memory_efficient"):
                module.memory_efficient = efficient
        model = bayesian(net, select="last_layer", num_data=4)
        grads[efficient] = _elbo_grads(model, mean_field_guide(model, init_scale=0.3), x, y)
    for a, b in zip(grads[False], grads[True], strict=True):
        assert a is not None and torch.equal(a, b)
    torch.manual_seed(1)
    plain, checkpointed = batchensemble(base, 2), batchensemble(_tiny_densenet(True), 2)
    checkpointed.load_state_dict(plain.state_dict())
    for model in (plain, checkpointed):
        model.num_data = 4
    with schedule("accelerator"):  # the folded batch (M * B, ...): the same function again
        want = torch.autograd.grad(-pyro.poutine.trace(plain).get_trace(x, y).log_prob_sum(),
                                   list(plain.parameters()))  # fmt: skip
        got = torch.autograd.grad(
            -pyro.poutine.trace(checkpointed).get_trace(x, y).log_prob_sum(),
            list(checkpointed.parameters()),
        )
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with schedule("cpu"), pytest.raises(ValueError, match=r"denselayer1\.norm1"):
        pyro.poutine.trace(checkpointed).get_trace(x, y)


# --------------------------------------------------------------------------------------------
# The zoo against the plain networks
# --------------------------------------------------------------------------------------------


def test_vit_sites_guide_means_members_and_round_trip_match_the_plain_network(tmp_path):
    """A tiny ViT: the default sites are the Linear / convolution weights (MultiheadAttention's
    out_proj included; in_proj_weight, the class token and the position embedding stay point
    estimates), the guide's means give the plain network's logits, a BatchEnsemble with
    r_std = s_std = 0 is M copies of it, and a fitted model loads bit for bit."""
    net = _settled(_vit(), (3, 32, 32))
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    model = bayesian(net)
    params = dict(net.named_parameters())
    layers = (nn.Linear, nn.Conv2d)
    picked = [
        name
        for name in params
        if name.rpartition(".")[2] in ("weight", "bias")
        and isinstance(net.get_submodule(name.rpartition(".")[0]), layers)
    ]
    assert {s: tuple(v) for s, v in model.network_sites().items()} == {
        n: tuple(params[n].shape) for n in picked
    }
    point = {n for n, _ in model.named_parameters()}
    assert {"net.class_token", "net.encoder.pos_embedding"} <= point
    assert "net.encoder.layers.encoder_layer_0.self_attention.in_proj_weight" in point
    guide = mean_field_guide(model, init_from=net)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.outputs(x, guide.means()), net(x), rtol=0, atol=1e-5)
        ensemble = batchensemble(net, 3, r_std=0.0, s_std=0.0).eval()
        torch.testing.assert_close(ensemble.outputs(x), net(x).expand(3, -1, -1), atol=1e-5,
                                   rtol=0)  # fmt: skip
    fit(model, guide, [(x, y)], epochs=2, num_data=4, progress=False, seed=0)
    pyro.set_rng_seed(3)
    first = predict(model, x, guide, num_samples=3, progress=False).probs
    restored = load(save(tmp_path / "vit.pt", model, guide), module=_vit())
    pyro.set_rng_seed(3)
    assert torch.equal(
        predict(restored.model, x, restored.guide, num_samples=3, progress=False).probs, first
    )


def test_a_gru_network_with_a_tied_layer_and_a_functional_kernel_runs_every_draw_exactly(
    tmp_path,
):
    """Every parameter latent (the GRU's, the kernel read by F.conv2d, the tied matrix once):
    a draw gives the outputs of a copy with it loaded; a rank-1 network's members keep the
    tied W, and save / load with a fresh skeleton repeats its predictions bit for bit."""
    torch.manual_seed(0)
    net = _RowsGRU().eval()
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    model = bayesian(net, select=lambda name, p: True)
    assert list(model.network_sites()) == [n for n, _ in net.named_parameters()]
    assert "again.weight" not in model.network_sites()  # one site, under its first name
    guide = mean_field_guide(model, init_scale=0.1)
    draw = {k: v.detach() for k, v in guide.sample().items()}
    model.eval()
    with torch.no_grad():
        want = loaded_copy(net, {**draw, "again.weight": draw["mid.weight"]})(x)
        assert torch.equal(model.outputs(x, draw), want)
    ensemble = rank1(net, 2)
    assert ensemble.net.again.weight is ensemble.net.mid.weight
    guide = mean_field_guide(ensemble)
    fit(ensemble, guide, [(x, y)], epochs=2, num_data=4, progress=False, seed=0)
    pyro.set_rng_seed(1)
    first = predict(ensemble, x, guide, num_samples=2, progress=False).probs
    restored = load(save(tmp_path / "gru.pt", ensemble, guide), module=_RowsGRU())
    assert restored.model.net.again.weight is restored.model.net.mid.weight
    pyro.set_rng_seed(1)
    again = predict(restored.model, x, restored.guide, num_samples=2, progress=False).probs
    assert again.shape == (4, 4, 10) and torch.equal(again, first)


def test_mobilenet_batchensemble_members_are_the_network_with_their_weights_and_norms():
    """MobileNetV3 (depthwise convolutions, squeeze-excitation, Hardswish, bias-free
    convolutions given per-member biases): member m on the CPU member passes and on the
    folded batch is the plain network with W * s_m r_m^T, member m's bias and norm copies."""
    net = _settled(tvm.mobilenet_v3_small(num_classes=10), (3, 32, 32)).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    torch.manual_seed(0)
    ensemble = batchensemble(net, 2).eval()
    with torch.no_grad():
        for module in ensemble.net.modules():
            if isinstance(module, BatchEnsembleNorm):
                for copy_ in module.norms:
                    for p in copy_.parameters():
                        p.add_(0.1 * torch.randn_like(p))
            elif isinstance(module, _BATCHENSEMBLE):
                module.bias.add_(0.1 * torch.randn_like(module.bias))
    for kind in ("cpu", "accelerator"):
        with torch.no_grad(), schedule(kind):
            out = ensemble.outputs(x)
        for m in range(2):
            member = copy.deepcopy(net)
            for path, module in ensemble.net.named_modules():
                parent, _, name = path.rpartition(".")
                if isinstance(module, _BATCHENSEMBLE):
                    layer = member.get_submodule(path)
                    layer.weight = nn.Parameter(module.effective_weight(m).detach())
                    layer.bias = nn.Parameter(module.bias[m].detach())
                elif isinstance(module, BatchEnsembleNorm):
                    setattr(member.get_submodule(parent), name, module.norms[m])
            with torch.no_grad():
                torch.testing.assert_close(out[m], member.eval()(x), rtol=1e-9, atol=1e-9)


def test_convnext_layer_scales_stay_point_estimates_and_the_means_give_the_network():
    """ConvNeXt's layer_scale (an nn.Parameter of no Linear or convolution) stays a point
    estimate trained by fit(); the guide's means give the plain network's logits."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    settings = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)]
    net = _settled(ConvNeXt(settings, num_classes=10), (3, 32, 32))
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    model = bayesian(net)
    scales = [n for n, _ in net.named_parameters() if n.endswith("layer_scale")]
    assert scales and not set(scales) & set(model.network_sites())
    guide = mean_field_guide(model, init_from=net)
    with torch.no_grad():
        torch.testing.assert_close(
            model.eval().outputs(x, guide.means()), net(x), rtol=0, atol=1e-5
        )
    before = model.net.get_parameter(scales[0]).detach().clone()
    fit(model, guide, [(x, y)], epochs=2, num_data=4, progress=False, seed=0)
    assert not torch.equal(model.net.get_parameter(scales[0]), before)


def test_a_seeded_fit_of_an_efficientnet_with_stochastic_depth_repeats_itself():
    """EfficientNet's StochasticDepth draws in training mode: two fits from one seed give the
    same guide and predictions, bit for bit (also by local reparameterisation)."""
    from torchvision.models.efficientnet import EfficientNet, MBConvConfig

    settings = [MBConvConfig(1, 3, 1, 8, 8, 1), MBConvConfig(4, 3, 2, 8, 16, 2)]
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    for local in (False, True):
        runs = []
        for _ in range(2):
            torch.manual_seed(0)
            net = EfficientNet(settings, dropout=0.2, stochastic_depth_prob=0.5, num_classes=10,
                               last_channel=32)  # fmt: skip
            model = bayesian(net, local_reparameterization=local)
            guide = mean_field_guide(model)
            fit(model, guide, [(x, y)], epochs=3, num_data=4, progress=False, seed=5)
            pyro.set_rng_seed(2)
            runs.append(predict(model, x, guide, num_samples=3, progress=False).probs)
        assert torch.equal(runs[0], runs[1])


# --------------------------------------------------------------------------------------------
# The checkpoint refusal's review: what it must not refuse, and a later mode still checked
# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_a_network_with_a_torchscript_part_still_trains_and_keeps_no_hook():
    """Hooks cannot be put on a ScriptModule: the check raised torch's "not supported on
    ScriptModules" at fit()'s first step, and left the hooks it had put on the others."""
    net = nn.Sequential(nn.Linear(4, 5), torch.jit.script(nn.Tanh()), nn.Linear(5, 3))
    model = bayesian(net)
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    losses = fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False).losses
    assert len(losses) == 1 and math.isfinite(losses[0])
    hooked = [
        name
        for name, m in model.named_modules()
        if not isinstance(m, torch.jit.ScriptModule) and (m._forward_pre_hooks or m._forward_hooks)
    ]
    assert hooked == []


def test_a_users_module_with_a_member_attribute_may_be_checkpointed():
    """Any module with an attribute ``_member`` counted as a BatchEnsemble member's pass."""

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 3)
            self._member = 0  # the user's own

        def forward(self, h):
            return self.fc(h)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(4, 5), Head()

        def forward(self, x):
            return checkpoint(self.head, torch.tanh(self.body(x)), use_reentrant=False)

    model = bayesian(Net(), select=["body"], num_data=8)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    grads = _elbo_grads(model, mean_field_guide(model), x, y)
    assert all(g is not None for g in grads[:2])


def test_checkpoints_met_only_in_training_are_refused_after_a_run_in_eval_mode():
    """A run with gradients in eval mode (mcmc(), say) settled the check for good: a network
    that checkpoints only in training then trained on the initial weights' gradients."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 3)

        def forward(self, x):
            h = checkpoint(self.fc1, x, use_reentrant=False) if self.training else self.fc1(x)
            return self.fc2(torch.tanh(h))

    model = bayesian(Net(), num_data=8)
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    model.eval()
    assert all(g is not None for g in _elbo_grads(model, guide, x, y)[:2])
    model.train()
    with pytest.raises(ValueError, match=r"runs 'fc1' inside torch\.utils\.checkpoint"):
        _elbo_grads(model, guide, x, y)


def test_a_copy_of_a_network_checked_once_is_checked_again():
    """What the check settled was an attribute of the network, which a deep copy carries:
    bayesian(model.plain_network()) with the checkpointed layer latent then went unchecked."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 3)

        def forward(self, x):
            return self.fc2(torch.tanh(checkpoint(self.fc1, x, use_reentrant=False)))

    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    head = bayesian(Net(), select=["fc2"], num_data=8)  # the checkpointed fc1 a point estimate
    assert all(g is not None for g in _elbo_grads(head, mean_field_guide(head), x, y)[:2])
    whole = bayesian(head.plain_network(), num_data=8)
    with pytest.raises(ValueError, match=r"runs 'fc1' inside torch\.utils\.checkpoint"):
        _elbo_grads(whole, mean_field_guide(whole), x, y)
