"""The documented recipes (``bayesian(net)``, ``batchensemble(net, M)``, ``rank1(net, M)``,
``fit``, ``predict``, ``Gaussian`` regression, ``save`` / ``load``) run on networks unlike the
rest of the suite's: a forward of ``torch.nn.functional`` calls on raw ``nn.Parameter``s with
buffers, weight sharing with ``nn.ModuleDict`` and ``nn.ParameterList``, a block of Dropout /
GELU / LayerNorm / GroupNorm / a skip / ``AdaptiveAvgPool2d`` / ``Flatten``, a grouped dilated
``Conv1d`` with ``BatchNorm1d``, a bidirectional GRU, a pre-norm ``TransformerEncoder``, and a
heteroscedastic regression MLP.

Every check is against an independent reference: the plain torch network run with
:func:`torch.func.functional_call` on the drawn weights (per draw), the plain network with
forward hooks that scale a layer's input by ``r_m``, its output by ``s_m`` and add ``b_m``
(per BatchEnsemble member), torch's own BatchNorm with ``momentum=None`` over the same batches
(``batchnorm_data``), and the Gaussian head written out by hand (``1e-3 + softplus``)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyrouq import (
    ArrayLoader,
    Gaussian,
    Standardizer,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    predict,
    rank1,
    save,
)

# ---------------------------------------------------------------------------------------------
# The networks (none of them elsewhere in the suite)


class FunctionalNet(nn.Module):
    """``F.linear`` on raw parameters, input standardisation by buffers, and a step counter
    buffer that the forward moves in training mode."""

    def __init__(self, d=12, h=8, c=3):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(h, d) / math.sqrt(d))
        self.bias = nn.Parameter(torch.zeros(h))
        self.w2 = nn.Parameter(torch.randn(c, h) / math.sqrt(h))
        self.register_buffer("mu", torch.full((d,), 0.1))
        self.register_buffer("sd", torch.full((d,), 0.3))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        x = (x.flatten(1) - self.mu) / self.sd
        if self.training:
            self.calls += 1
        return F.linear(F.relu(F.linear(x, self.weight, self.bias)), self.w2)


class SharedDictNet(nn.Module):
    """One convolution called twice, layers in an ``nn.ModuleDict``, gates in an
    ``nn.ParameterList``."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.blocks = nn.ModuleDict({"mix": nn.Conv2d(4, 4, 3, padding=1), "proj": nn.Linear(4, 6)})
        self.gates = nn.ParameterList([nn.Parameter(torch.ones(4)), nn.Parameter(torch.ones(6))])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.stem(x)), 2)
        h = F.relu(self.blocks["mix"](h)) * self.gates[0].view(1, -1, 1, 1)
        h = F.relu(self.blocks["mix"](h)).mean((2, 3))  # the same convolution again
        return self.head(torch.tanh(self.blocks["proj"](h)) * self.gates[1])


class ModernNet(nn.Module):
    """GroupNorm, GELU, Dropout, a residual block, AdaptiveAvgPool2d, Flatten, LayerNorm."""

    def __init__(self, p=0.1):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 2, 1), nn.GroupNorm(4, 16), nn.GELU())
        self.conv1 = nn.Conv2d(16, 16, 3, padding=1)
        self.gn = nn.GroupNorm(4, 16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.drop = nn.Dropout(p)
        self.pool, self.flat = nn.AdaptiveAvgPool2d(1), nn.Flatten()
        self.head = nn.Sequential(
            nn.LayerNorm(16), nn.Dropout(p), nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 3)
        )

    def forward(self, x):
        h = self.stem(x)
        h = h + self.drop(self.conv2(F.gelu(self.gn(self.conv1(h)))))
        return self.head(self.flat(self.pool(h)))


class Conv1dNet(nn.Module):
    """Rows of an image as a sequence: Conv1d, BatchNorm1d, a grouped dilated Conv1d."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(8, 8, 3, padding=1),
            nn.BatchNorm1d(8),
            nn.ReLU(),
            nn.Conv1d(8, 8, 3, dilation=2, padding=2, groups=4),
            nn.ReLU(),
            nn.AdaptiveMaxPool1d(1),
            nn.Flatten(),
            nn.Linear(8, 3),
        )

    def forward(self, x):
        return self.body(x.squeeze(1).transpose(1, 2))


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(8, 6, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        out, _ = self.gru(x.squeeze(1))
        return self.fc(out[:, -1])


class EncoderNet(nn.Module):
    """A pre-norm, GELU ``nn.TransformerEncoder`` over the rows (attention dropout off, so
    that training-mode runs compare to the bit)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(
            16, 4, 32, dropout=0.0, batch_first=True, norm_first=True, activation="gelu"
        )
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.cls = nn.Linear(16, 3)

    def forward(self, x):
        return self.cls(self.enc(self.emb(x.squeeze(1))).mean(1))


def _images(n=6, side=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, side, side, generator=g), torch.arange(n) % 3


# ---------------------------------------------------------------------------------------------
# References


def _per_draw_reference(model, guide, x, num_samples=3):
    """predict() on S guide draws given as posterior_samples, and the plain network run on
    each draw by torch.func.functional_call."""
    torch.manual_seed(1)
    draws = {k: v.detach() for k, v in guide.sample(num_samples).items()}
    preds = predict(model, x.clone(), posterior_samples=draws, progress=False)
    plain = model.plain_network().eval()
    with torch.no_grad():
        ref = torch.stack(
            [
                torch.func.functional_call(plain, {k: v[s] for k, v in draws.items()}, (x,))
                for s in range(num_samples)
            ]
        )
    return preds, ref


def _factors(ensemble_net):
    """``{layer path: (r, s, b)}`` of the BatchEnsemble layers of a converted network."""
    return {
        path: (m.r, m.s, m.bias)
        for path, m in ensemble_net.named_modules()
        if isinstance(getattr(m, "r", None), torch.Tensor)
    }


def _hooked_members(net, factors, num_members, x):
    """Member m computed by the plain ``net``: the input of every layer of ``factors`` scaled
    by r_m (channels, or the features of a Linear), its bias-free output by s_m, plus b_m, by
    forward hooks."""
    assert factors
    outs = []
    for member in range(num_members):
        plain = copy.deepcopy(net).eval()
        for path, tensors in factors.items():
            layer = plain.get_submodule(path)
            if layer.bias is not None:
                with torch.no_grad():
                    layer.bias.zero_()
            dim = -1 if isinstance(layer, nn.Linear) else 1
            r, s, b = (t[member].detach() for t in tensors)

            def pre(mod, args, r=r, dim=dim):
                shape = [1] * args[0].dim()
                shape[dim] = -1
                return (args[0] * r.view(shape),)

            def post(mod, args, out, s=s, b=b, dim=dim):
                shape = [1] * out.dim()
                shape[dim] = -1
                return out * s.view(shape) + b.view(shape)

            layer.register_forward_pre_hook(pre)
            layer.register_forward_hook(post)
        with torch.no_grad():
            outs.append(plain(x))
    return torch.stack(outs)


# ---------------------------------------------------------------------------------------------
# Bayesian networks: every draw is the plain network with that draw's weights


@pytest.mark.parametrize(
    ("make", "select", "sites"),
    [
        (FunctionalNet, lambda name, p: True, ["weight", "bias", "w2"]),
        (
            SharedDictNet,
            None,
            [
                *("stem.weight", "stem.bias", "blocks.mix.weight", "blocks.mix.bias"),
                *("blocks.proj.weight", "blocks.proj.bias", "head.weight", "head.bias"),
            ],
        ),
        (SharedDictNet, ["gates", "head"], ["gates.0", "gates.1", "head.weight", "head.bias"]),
        (ModernNet, None, None),
        (Conv1dNet, None, None),
        (GRUNet, lambda name, p: p.dim() > 1, None),
        (EncoderNet, None, None),
    ],
)
def test_bayesian_draws_are_the_plain_network_with_those_weights(make, select, sites):
    x, _ = _images()
    x = x.flatten(1)[:, :12] if make is FunctionalNet else x
    model = bayesian(make(), select=select)
    if sites is not None:
        assert list(model.latent_sites()) == sites
    preds, ref = _per_draw_reference(model, mean_field_guide(model, init_scale=0.1), x)
    assert preds.probs.shape == (3, 6, 3)
    torch.testing.assert_close(preds.probs, ref.softmax(-1), rtol=0, atol=1e-6)
    u = preds.uncertainty()
    p = ref.double().softmax(-1)  # the entropies of the reference's draws, by hand
    mean = p.mean(0)
    total, aleatoric = -(mean * mean.log()).sum(-1), -(p * p.log()).sum(-1).mean(0)
    torch.testing.assert_close(u.total.double(), total, rtol=0, atol=1e-5)
    torch.testing.assert_close(u.aleatoric.double(), aleatoric, rtol=0, atol=1e-5)
    assert bool((u.epistemic > 0).all())  # the draws differ


def test_functional_network_without_layers_is_refused_by_select_none():
    with pytest.raises(
        ValueError, match=r"has no nn\.Linear or convolution layer, so select=None picks nothing"
    ):
        bayesian(FunctionalNet())
    with pytest.raises(ValueError, match="Its parameters are 'weight', 'bias', 'w2'"):
        bayesian(FunctionalNet())


def test_a_forward_moving_its_own_buffer_moves_it_once_a_training_step():
    """Buffers behave as in torch: fit()'s checks on the first batch leave the counter as
    they found it, so it counts the training steps."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 12, generator=g), torch.arange(32) % 3
    model = bayesian(FunctionalNet(), select=lambda name, p: True)
    fit(
        model,
        mean_field_guide(model),
        ArrayLoader(x, y, batch_size=8, seed=0),
        epochs=2,
        progress=False,
    )
    assert int(model.net.calls) == 8  # 2 epochs of 4 batches


def test_zero_scale_guide_after_fit_predicts_the_plain_network_at_its_means():
    x, y = _images(12)
    model = bayesian(ModernNet())
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, batch_size=6, seed=0), epochs=1, progress=False)
    sharp = copy.deepcopy(guide)
    with torch.no_grad():
        for rho in sharp.rho.values():
            rho.fill_(-60.0)  # softplus(-60): scales of ~1e-26
    preds = predict(model, x, sharp, num_samples=2, progress=False)
    plain = model.plain_network().eval()
    with torch.no_grad():
        ref = torch.func.functional_call(plain, guide.means(), (x,)).softmax(-1)
    torch.testing.assert_close(preds.probs, ref.expand(2, -1, -1), rtol=0, atol=1e-6)


def test_training_mode_gradients_match_functional_call_in_float64():
    """One draw's outputs and gradients in training mode (GroupNorm, skip, LayerNorm; the
    network's dropout off) against torch's own functional_call."""
    torch.manual_seed(0)
    net = ModernNet(p=0.0).double()
    model = bayesian(net, select=lambda name, p: True).train()
    draw = {
        k: v.detach().double().requires_grad_()
        for k, v in mean_field_guide(model, init_scale=0.05).sample().items()
    }
    x = _images()[0].double()
    out = model.outputs(x, draw)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), list(draw.values()))
    plain = model.plain_network().train()
    draw2 = {k: v.detach().clone().requires_grad_() for k, v in draw.items()}
    ref = torch.func.functional_call(plain, draw2, (x,))
    ref_grads = torch.autograd.grad((ref * w).sum(), list(draw2.values()))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_batchnorm_data_is_torchs_cumulative_statistics_per_draw():
    x, _ = _images(4)
    train_x, _ = _images(30, seed=1)
    model = bayesian(Conv1dNet())
    guide = mean_field_guide(model, init_scale=0.1)
    torch.manual_seed(1)
    draws = {k: v.detach() for k, v in guide.sample(2).items()}
    preds = predict(
        model, x, posterior_samples=draws, batchnorm_data=train_x, batch_size=10, progress=False
    )
    refs = []
    for s in range(2):
        net = model.plain_network()
        weights = {k: v[s] for k, v in draws.items()}
        for m in net.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.reset_running_stats()
                m.momentum = None  # torch's cumulative average
        net.train()
        with torch.no_grad():
            for batch in train_x.split(10):  # three batches of ten: equal weights
                torch.func.functional_call(net, weights, (batch,))
            refs.append(torch.func.functional_call(net.eval(), weights, (x,)).softmax(-1))
    torch.testing.assert_close(preds.probs, torch.stack(refs), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# BatchEnsembles and rank-1 networks: every member is the plain network, hooked


@pytest.mark.parametrize("make", [SharedDictNet, ModernNet, Conv1dNet, GRUNet, EncoderNet])
def test_batchensemble_members_are_the_hooked_plain_network(make):
    torch.manual_seed(0)
    net = make().eval()
    x, _ = _images()
    ensemble = batchensemble(net, 3)
    with torch.no_grad():  # members' own biases apart
        for m in ensemble.net.modules():
            if isinstance(getattr(m, "r", None), torch.Tensor):
                m.bias.add_(0.1 * torch.randn_like(m.bias))
    preds = predict(ensemble.eval(), x, progress=False)
    ref = _hooked_members(net, _factors(ensemble.net), 3, x)
    torch.testing.assert_close(preds.probs, ref.softmax(-1), rtol=0, atol=1e-5)
    same = predict(batchensemble(net, 3, r_std=0.0, s_std=0.0).eval(), x, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(
            same.probs, net(x).softmax(-1).expand(3, -1, -1), rtol=0, atol=1e-6
        )


def test_rank1_zero_scale_draws_are_the_members_at_the_factor_means():
    torch.manual_seed(0)
    net = SharedDictNet()
    x, y = _images(12)
    model = rank1(net, 2)
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, batch_size=6, seed=0), epochs=1, progress=False)
    sharp = copy.deepcopy(guide)
    with torch.no_grad():
        for rho in sharp.rho.values():
            rho.fill_(-60.0)
    preds = predict(model, x, sharp, num_samples=2, progress=False)  # S = 2 draws x 2 members
    means = guide.means()
    factors = {
        path: (means[f"{path}.r"], means[f"{path}.s"], bias)
        for path, (_, _, bias) in _factors(model.net).items()
    }
    plain = copy.deepcopy(net)  # W (and the gates) as trained: the model's point estimates
    trained = dict(model.net.named_parameters())
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if trained[name].shape == p.shape:  # (not the members' biases)
                p.copy_(trained[name])
    ref = _hooked_members(plain, factors, 2, x).softmax(-1)
    torch.testing.assert_close(preds.probs, ref.repeat(2, 1, 1), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Regression: the Gaussian heads as documented


def _regression(n=48):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, generator=g) * 8 - 4
    y = torch.sin(x[:, 0]) + (0.1 + 0.2 * x[:, 0].abs()) * torch.randn(n, generator=g)
    return x, y


def test_heteroscedastic_head_is_mean_and_softplus_scale_after_standardising():
    x, y = _regression()
    scaler = Standardizer.fit(x, y)
    net = nn.Sequential(nn.Linear(1, 16), nn.SiLU(), nn.Linear(16, 2))
    model = bayesian(net, likelihood=Gaussian("heteroscedastic"))
    guide = mean_field_guide(model)
    fit(
        model,
        guide,
        ArrayLoader(*scaler.transform(x, y), batch_size=16, seed=0),
        epochs=2,
        progress=False,
    )
    sharp = copy.deepcopy(guide)
    with torch.no_grad():
        for rho in sharp.rho.values():
            rho.fill_(-60.0)
    preds = scaler.inverse(
        predict(model, scaler.transform_x(x), sharp, num_samples=2, progress=False)
    )
    plain = model.plain_network().eval()
    with torch.no_grad():
        out = torch.func.functional_call(plain, guide.means(), (scaler.transform_x(x),))
    loc = out[:, :1] * scaler.y_std + scaler.y_mean
    scale = (1e-3 + F.softplus(out[:, 1:])) * scaler.y_std
    assert preds.loc.shape == preds.scale.shape == (2, 48, 1)
    torch.testing.assert_close(preds.loc[0], loc, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(preds.scale[0], scale, rtol=1e-6, atol=1e-6)
    drawn = predict(model, x, guide, num_samples=4, progress=False)
    u = drawn.uncertainty()  # the law of total variance over the 4 draws
    torch.testing.assert_close(u.aleatoric, (drawn.scale**2).mean(0)[:, 0])
    torch.testing.assert_close(u.epistemic, drawn.loc.var(0, unbiased=False)[:, 0])
    torch.testing.assert_close(u.total, u.aleatoric + u.epistemic, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
def test_homoscedastic_known_noise_predicts_that_noise(kind):
    x, y = _regression()
    net = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    if kind == "bayesian":
        model = bayesian(net, likelihood=Gaussian(0.3))
    elif kind == "batchensemble":
        model = batchensemble(net, 3, likelihood=Gaussian(0.3))
    else:
        model = rank1(net, 3, likelihood=Gaussian(0.3))
    guide = None if kind == "batchensemble" else mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, batch_size=16, seed=0), epochs=1, progress=False)
    preds = predict(model, x, guide, progress=False)
    assert preds.loc.shape[1:] == (48, 1)
    torch.testing.assert_close(preds.scale, torch.full_like(preds.scale, 0.3))
    u = preds.uncertainty()
    torch.testing.assert_close(u.aleatoric, torch.full_like(u.aleatoric, 0.09))
    torch.testing.assert_close(
        u.epistemic, preds.loc.var(0, unbiased=False)[:, 0], rtol=1e-5, atol=1e-8
    )


# ---------------------------------------------------------------------------------------------
# Checkpoints of the unseen networks


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "rank1"])
def test_save_load_round_trip_with_a_skeleton(kind, tmp_path):
    x, y = _images(8)
    net = SharedDictNet()
    if kind == "bayesian":
        model = bayesian(net, select=lambda name, p: True)
    elif kind == "batchensemble":
        model = batchensemble(net, 2)
    else:
        model = rank1(net, 2)
    guide = None if kind == "batchensemble" else mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, batch_size=4, seed=0), epochs=1, progress=False)
    save(tmp_path / "m.pt", model, guide)
    restored = load(tmp_path / "m.pt", module=SharedDictNet())
    a = predict(model, x, guide, progress=False, seed=3)
    b = predict(restored.model, x, restored.guide, progress=False, seed=3)
    assert torch.equal(a.probs, b.probs)
