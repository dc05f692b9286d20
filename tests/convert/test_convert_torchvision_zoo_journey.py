"""Ninth audit, a user journey with torchvision's model zoo ("any nn.Module"): ShuffleNetV2
(channel shuffle), MobileNetV3 (Hardswish, squeeze-excitation), SqueezeNet (a convolution for a
head), a small ResNet with FrozenBatchNorm2d and zero_init_residual, a tiny VisionTransformer
(class token, position embedding, attention) and a small ConvNeXt whose LayerNorm2d has a
non-default eps. Every number is checked against the plain torch network: at the network's own
weights (one draw of the original state, factors of ones) predict() gives
``net.eval()(x).softmax(-1)``; a random draw gives the network with it loaded; the fitted
models load bit for bit; and a builder passed for a network is named with the call to make."""

from __future__ import annotations

import copy
import functools
import math

import pyro
import pytest
import torch
from _toy import loaded_copy
from torch import nn

from pyrouq import (
    batchensemble,
    bayesian,
    conformal,
    fit,
    load,
    mean_field_guide,
    predict,
    psis_diagnostic,
    rank1,
    save,
    temperature_scale,
    to_inference_data,
)

tvm = pytest.importorskip("torchvision.models")
from torchvision.models.convnext import CNBlockConfig, ConvNeXt, LayerNorm2d  # noqa: E402
from torchvision.ops import FrozenBatchNorm2d  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _convnext() -> nn.Module:
    """A two-stage ConvNeXt (CNBlock, layer scales) whose LayerNorm2d's have eps=0.5, far from
    the default 1e-6: an eps lost on the way changes every prediction."""
    settings = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)]
    return ConvNeXt(settings, num_classes=5, norm_layer=functools.partial(LayerNorm2d, eps=0.5))


def _vit() -> nn.Module:
    return tvm.VisionTransformer(
        image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=16, mlp_dim=32,
        num_classes=5,
    )  # fmt: skip


def _frozen_bn_resnet() -> nn.Module:
    return tvm.ResNet(
        tvm.resnet.BasicBlock, [1, 1, 1, 1], num_classes=5, norm_layer=FrozenBatchNorm2d,
        zero_init_residual=True,
    )  # fmt: skip


_ZOO = {
    "shufflenet": (lambda: tvm.shufflenet_v2_x0_5(num_classes=5), (3, 32, 32), "last_layer"),
    "mobilenet": (lambda: tvm.mobilenet_v3_small(num_classes=5), (3, 32, 32), "last_layer"),
    "squeezenet": (lambda: tvm.squeezenet1_1(num_classes=5), (3, 64, 64), ["classifier.1"]),
    "resnet_frozen_bn": (_frozen_bn_resnet, (3, 32, 32), "last_layer"),
    "vit": (_vit, (3, 32, 32), "last_layer"),
    "convnext": (_convnext, (3, 32, 32), "last_layer"),
}
"""name: (builder, input shape, the selection of its head)."""


def _settled(name: str) -> tuple[nn.Module, torch.Tensor]:
    """The network ``name`` in eval mode with unit-scale weights, BatchNorm statistics of a
    random batch and a head scaled to logits of unit spread (torchvision's init gives a zero
    head, whose uniform probabilities compare equal to anything), and 4 inputs."""
    build, shape, _ = _ZOO[name]
    torch.manual_seed(0)
    net = build()
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() > 1:
                p.normal_(0.0, p[0].numel() ** -0.5)
            else:
                p.add_(0.1 * torch.randn_like(p))
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = 1.0
            elif isinstance(m, FrozenBatchNorm2d):  # (its affine values are buffers)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
        net.train()(torch.randn(8, *shape))
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = 0.1
        head = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv2d))][-1]
        scale = 1.0 / float(net.eval()(torch.randn(8, *shape)).std())
        head.weight.mul_(scale)
        head.bias.mul_(scale)
    return net.eval(), torch.randn(4, *shape)


def _at(model, x, draws):
    return predict(model, x, posterior_samples=draws, progress=False).probs


@pytest.mark.parametrize("name", list(_ZOO))
def test_the_networks_own_weights_predict_the_plain_network(name):
    """One draw holding the original values (every Linear / convolution, the head alone, every
    parameter), and rank-1 factors or BatchEnsemble factors of ones, give the plain network's
    probabilities; a random draw of every parameter gives the network with it loaded."""
    net, x = _settled(name)
    with torch.no_grad():
        want = net(x).softmax(-1)
    assert float(want.max(-1).values.min()) < 0.95  # not saturated: a difference shows
    params = dict(net.named_parameters())
    for select in (None, _ZOO[name][2], lambda n, p: True):
        model = bayesian(net, select=select)
        own = {site: params[site].detach()[None] for site in model.latent_sites()}
        torch.testing.assert_close(_at(model, x, own)[0], want, rtol=0, atol=1e-5)
    ensemble = batchensemble(net, 2, r_std=0.0, s_std=0.0)
    torch.testing.assert_close(
        predict(ensemble, x, progress=False).probs, want.expand(2, -1, -1), rtol=0, atol=1e-5
    )
    ranked = rank1(net, 2)
    ones = {site: torch.ones(1, *shape) for site, shape in ranked.latent_sites().items()}
    torch.testing.assert_close(_at(ranked, x, ones), want.expand(2, -1, -1), rtol=0, atol=1e-5)
    # a random draw of every parameter (FrozenBatchNorm2d holds buffers), in float64
    net64, x64 = copy.deepcopy(net).double(), x.double()
    model = bayesian(net64, select=lambda n, p: True)
    pyro.set_rng_seed(0)
    draw = {k: v.detach() for k, v in mean_field_guide(model, init_scale=0.003).sample().items()}
    with torch.no_grad():
        drawn = loaded_copy(net64, draw)(x64).softmax(-1)
    assert float((drawn - want.double()).abs().max()) > 1e-3  # the draw moved the outputs
    got = _at(model, x64, {k: v[None] for k, v in draw.items()})[0]
    torch.testing.assert_close(got, drawn, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["vit", "convnext", "shufflenet"])
def test_a_fitted_zoo_model_calibrates_and_loads_bit_for_bit(name, tmp_path):
    """Each conversion fits an epoch, predicts, calibrates (the LAC threshold is the
    ceil((n + 1)(1 - alpha))-th smallest score, by hand) and loads into a fresh skeleton with
    the same predictions, bit for bit; ConvNeXt's LayerNorm2d keeps its eps of 0.5."""
    net, _ = _settled(name)
    torch.manual_seed(1)
    x, y = torch.randn(8, *_ZOO[name][1]), torch.randint(0, 5, (8,))
    made = {
        "bayesian": lambda: bayesian(net),
        "head": lambda: bayesian(net, select=_ZOO[name][2]),
        "batchensemble": lambda: batchensemble(net, 2),
        "rank1": lambda: rank1(net, 2),
    }
    for kind, make in made.items():
        model = make()
        guide = None if kind == "batchensemble" else mean_field_guide(model)
        draws = None if guide is None else 2
        losses = fit(model, guide, [(x, y)], epochs=1, num_data=8, progress=False, seed=0).losses
        assert len(losses) == 1 and math.isfinite(losses[0])
        pyro.set_rng_seed(3)
        preds = predict(model, x, guide, num_samples=draws, progress=False)
        assert preds.probs.shape == ((4 if kind == "rank1" else 2), 8, 5)
        tempered = temperature_scale(preds, y)(preds).probs
        torch.testing.assert_close(tempered.sum(-1), torch.ones(tempered.shape[:2]))
        sets = conformal(preds, y, alpha=0.25)
        scores = (1 - preds.mean_probs.gather(1, y[:, None])[:, 0]).sort().values
        assert sets.threshold == pytest.approx(float(scores[math.ceil(9 * 0.75) - 1]))
        restored = load(save(tmp_path / f"{kind}.pt", model, guide), module=_ZOO[name][0]())
        pyro.set_rng_seed(3)
        again = predict(restored.model, x, restored.guide, num_samples=draws, progress=False)
        assert torch.equal(again.probs, preds.probs), kind
        if name == "convnext":
            eps = {m.eps for m in restored.model.modules() if isinstance(m, LayerNorm2d)}
            assert eps == {0.5}
        if kind == "head":
            idata = to_inference_data(model, guide, x, y, num_samples=3)
            head = model.latent_sites()
            assert list(idata.posterior.data_vars) == list(head)
            assert idata.log_likelihood["obs"].shape == (1, 3, 8)


def test_a_network_builder_given_for_the_network_is_named_with_the_call_to_make():
    """torchvision.models.resnet18 (the builder, not resnet18()) given to predict() ran as a
    Pyro model function: resnet18(x) read x as its ``weights`` and raised torch's "Boolean
    value of Tensor with more than one value is ambiguous" under a Pyro trace table, and so did
    psis_diagnostic() and evaluate_rotations(); bayesian() of a functools.partial said "got
    partial". Each now names the builder and the call that builds the network."""
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([0, 1])
    call = r"the function resnet18, which builds a ResNet\. Call it to build the network: "
    with pytest.raises(TypeError, match=rf"^predict\(\) expects the model .* got {call}"):
        predict(tvm.resnet18, x, progress=False)
    with pytest.raises(TypeError, match=r"got the class ResNet\. Build the network: ResNet\("):
        predict(tvm.ResNet, x, progress=False)
    guide = mean_field_guide(bayesian(tvm.resnet18(num_classes=5), select="last_layer"))
    with pytest.raises(TypeError, match=rf"^psis_diagnostic\(\): .* got {call}resnet18\(\.\.\.\)"):
        psis_diagnostic(tvm.resnet18, guide, x, y)
    with pytest.raises(TypeError, match=rf"^to_inference_data\(\): .* got {call}"):
        to_inference_data(tvm.resnet18, None, x, y, num_samples=2)
    for convert in (bayesian, functools.partial(batchensemble, num_members=2)):
        with pytest.raises(TypeError, match=rf"Expected an nn\.Module .* got {call}"):
            convert(functools.partial(tvm.resnet18, num_classes=5))
    # a function of no such annotation keeps its message; the built network converts
    with pytest.raises(TypeError, match=r"got function\. Pass the network, e\.g\. nn\.Seq"):
        bayesian(lambda x: x)
    assert predict(tvm.resnet18(num_classes=5).eval(), x, progress=False).probs.shape == (1, 2, 5)
