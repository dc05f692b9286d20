"""Audit 12: the execution engine's fast paths and the layers against independent references
(``torch.func.functional_call`` once per draw; hand-written BatchEnsemble members)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import pyrouq
from pyrouq.nn import BayesianLinear


def _draws(model, count, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    template = model.template()
    return {
        site: template[site]
        * (1 + 0.2 * torch.randn(count, *template[site].shape, generator=g, dtype=dtype))
        + 0.01 * torch.randn(count, *template[site].shape, generator=g, dtype=dtype)
        for site in model.network_sites()
    }


def _by_hand(net, x, draws):
    count = next(iter(draws.values())).shape[0]
    return torch.stack(
        [functional_call(net, {k: v[s] for k, v in draws.items()}, (x,)) for s in range(count)]
    )


def _conv_net():
    # 2x2 max-pooling (strided maxima), a 3x3 max-pooling of 16 channels (pooled
    # channels-last), convolutions of 16-32 channels (the network runs channels-last),
    # depthwise / grouped ones, reflect and circular padding, bias=False, norms, dropout
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, padding_mode="reflect"),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, groups=16, padding=1, padding_mode="circular", bias=False),
        nn.GroupNorm(4, 32),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        nn.Conv2d(32, 16, 1, stride=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.LayerNorm(16),
        nn.Dropout(0.3),
        nn.Linear(16, 3),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_draws_are_functional_call_once_per_draw(dtype, mode):
    torch.manual_seed(0)
    net = _conv_net().to(dtype)
    net[1].running_mean.normal_(0, 0.1)
    net[1].running_var.uniform_(0.5, 2.0)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for count, batch, grad in ((1, 1, False), (3, 4, False), (3, 4, True)):
        model = getattr(pyrouq.bayesian(copy.deepcopy(net)), mode)()
        plain = getattr(copy.deepcopy(net), mode)()
        draws = _draws(model, count, dtype)
        x = torch.randn(batch, 3, 12, 12, dtype=dtype)
        with torch.set_grad_enabled(grad):
            torch.manual_seed(1)  # (dropout in training: the same masks, draw by draw)
            out = model.outputs(x.clone().requires_grad_(grad), draws)
            torch.manual_seed(1)
            expected = _by_hand(plain, x, draws)
        assert out.shape == (count, batch, 3)
        torch.testing.assert_close(out, expected, **tol)
        if mode == "train":  # BatchNorm's running statistics moved once per draw, as by hand
            torch.testing.assert_close(model.net[1].running_mean, plain[1].running_mean, **tol)


def test_gradients_through_the_pooling_kernels_are_torchs():
    torch.manual_seed(0)
    net = _conv_net().double().train()
    net[-2].p = 0.0
    model = pyrouq.bayesian(copy.deepcopy(net)).train()
    draws = _draws(model, 2, torch.float64)
    x = torch.randn(3, 3, 13, 13, dtype=torch.float64)  # odd sizes: a row and column dropped
    x = x.round()  # ties in the pooling windows
    mine = {k: v.clone().requires_grad_() for k, v in draws.items()}
    theirs = {k: v.clone().requires_grad_() for k, v in draws.items()}
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    weights = torch.randn(2, 3, 3, dtype=torch.float64)
    (model.outputs(x1, mine) * weights).sum().backward()
    (_by_hand(net, x2, theirs) * weights).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)
    for site in draws:
        torch.testing.assert_close(mine[site].grad, theirs[site].grad, rtol=1e-9, atol=1e-12)


def test_chunked_prediction_batches_and_odd_layouts_give_the_same_outputs():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(2, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 81, 3)
    ).eval()
    model = pyrouq.bayesian(copy.deepcopy(net)).eval()
    draws = _draws(model, 2, torch.float32)
    x = torch.randn(600, 2, 20, 20)  # above 512 inputs without gradients: run in chunks
    with torch.no_grad():
        expected = _by_hand(net, x, draws)
        torch.testing.assert_close(model.outputs(x, draws), expected, rtol=1e-4, atol=1e-5)
        small = x[:5]
        for variant in (
            small.contiguous(memory_format=torch.channels_last),
            small.transpose(2, 3).contiguous().transpose(2, 3),  # strides of neither layout
            torch.cat([small, small], -1)[..., :20],  # a non-contiguous slice
            small[:0],  # an empty batch
        ):
            out = model.outputs(variant, draws)
            torch.testing.assert_close(out, expected[:, : len(variant)], rtol=1e-4, atol=1e-5)


def _member_by_hand(ensemble, net, member):
    """``net`` with member ``member``'s weights, W * (s r^T) and its bias, built by hand (not
    by the layers' own folding), and its copy of every norm."""
    out = copy.deepcopy(net)
    layers = dict(ensemble.net.named_modules())
    with torch.no_grad():
        for name, module in out.named_modules():
            layer = layers.get(name)
            if getattr(layer, "_is_batchensemble", False):
                w, r, s = layer.weight, layer.r[member], layer.s[member]
                groups = getattr(module, "groups", 1)
                extra = [1] * (w.dim() - 2)
                if w.dim() == 2:
                    weight = w * s[:, None] * r[None, :]
                else:  # (out, in / groups, ...): output channel o reads its group's inputs
                    per_in = w.shape[1]
                    rows = r.reshape(groups, per_in).repeat_interleave(w.shape[0] // groups, 0)
                    weight = w * s.reshape(-1, 1, *extra) * rows.reshape(*rows.shape, *extra)
                module.weight.copy_(weight)
                if module.bias is None:
                    module.bias = nn.Parameter(layer.bias[member].clone())
                else:
                    module.bias.copy_(layer.bias[member])
            elif getattr(layer, "_is_member_norm", False):
                module.load_state_dict(layer.norms[member].state_dict())
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batchensemble_members_are_explicit_networks(dtype):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, padding_mode="reflect"),  # a one-channel stem
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, groups=4, padding=1, bias=False),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 64),  # weights outnumbering one input's activations: scaled by r, s
        nn.ReLU(),
        nn.Linear(64, 3),
    ).to(dtype)
    ensemble = pyrouq.batchensemble(copy.deepcopy(net), 3)
    # the pre-trained weights are kept exactly, the bias copied to every member
    assert torch.equal(ensemble.net[0].weight, net[0].weight)
    assert torch.equal(ensemble.net[0].bias, net[0].bias.expand(3, -1))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    for mode, batch in (("train", 4), ("eval", 4), ("eval", 1)):
        getattr(ensemble, mode)()
        members = [getattr(_member_by_hand(ensemble, net, m), mode)() for m in range(3)]
        x = torch.randn(batch, 1, 8, 8, dtype=dtype)
        expected = torch.stack([member(x) for member in members])
        torch.testing.assert_close(ensemble.outputs(x), expected, **tol)
        assert expected.std(0).min() > 0  # (members that differ)
        if mode == "eval":  # (predict() runs the model in eval mode)
            probs = pyrouq.predict(ensemble, x, progress=False).probs
            torch.testing.assert_close(probs, expected.softmax(-1), **tol)


def test_rank1_predictions_are_draw_major_over_explicit_members():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3, groups=2), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))
    model = pyrouq.rank1(net, 3)
    draws = _draws(model, 2, torch.float32)  # factors r, s of 2 draws, (2, M, ...)
    x = torch.randn(5, 2, 6, 6)
    probs = pyrouq.predict(model, x, posterior_samples=draws, progress=False).probs
    assert probs.shape == (6, 5, 3)
    for k in range(2):
        ensemble = copy.deepcopy(model.net)  # the BatchEnsemble's network, factors of draw k
        for site, value in draws.items():
            owner, _, attr = site.rpartition(".")
            setattr(ensemble.get_submodule(owner), attr, value[k])
        for m in range(3):
            member = _member_by_hand(type("E", (), {"net": ensemble}), net, m).eval()
            expected = member(x).softmax(-1)
            torch.testing.assert_close(probs[k * 3 + m], expected, rtol=1e-5, atol=1e-6)


def test_a_bayesian_network_names_the_layer_refusing_its_input():
    """torch's words alone named no layer ("weight of size [4, 3, 3, 3], expected
    input[...] to have 3 channels", "mat1 and mat2 shapes cannot be multiplied"), where a
    BatchEnsemble's refusal names 'net.0'."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(4, 4, 3))
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), block, nn.Flatten(), nn.Linear(144, 2))
    model = pyrouq.bayesian(net)
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(4, 2, 10, 10))
    assert str(info.value).endswith(
        "to have 3 channels, but got 2 channels instead (in Conv2d(3, 4, kernel_size=(3, 3), "
        "stride=(1, 1)) at 'net.0' of the model): the model's input, of 2 channels where this "
        "layer takes 3. Pass inputs of 3 channels, or build the network for 2 input channels "
        "(its first layer's in_channels=2)."
    )  # (given the model's input: what to do about it follows)
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(4, 3, 11, 11))
    assert str(info.value) == (
        "mat1 and mat2 shapes cannot be multiplied (4x196 and 144x2) (in Linear(in_features="
        "144, out_features=2, bias=True) at 'net.4' of the model)"
    )
    # predict() restates it naming x, the layer kept
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(ValueError, match=r"\(in Conv2d\(3, 4, .*\) at 'net\.0' of the model\): "):
        pyrouq.predict(model, torch.randn(4, 2, 10, 10), guide, num_samples=2, progress=False)


def test_bayesian_linear_draws_on_an_empty_batch():
    """Stacked weights met an empty batch in ``reshape(draws, -1, in)``: "cannot reshape
    tensor of 0 elements into shape [3, 0, -1]"."""
    layer = BayesianLinear(4, 5)
    loc, scale = torch.zeros(5, 4), torch.ones(5, 4)
    out = layer.sample_with(torch.randn(0, 4), loc, scale, torch.zeros(5), torch.ones(5), 3)
    assert out.shape == (3, 0, 5)
    weight, bias = torch.randn(3, 5, 4), torch.randn(3, 5)
    assert layer.forward_with(torch.randn(3, 0, 4), weight, bias).shape == (3, 0, 5)
    x = torch.randn(2, 7, 4)  # and on a non-empty one, as F.linear draw by draw
    expected = torch.stack([F.linear(x, weight[s], bias[s]) for s in range(3)])
    torch.testing.assert_close(layer.forward_with(x, weight, bias), expected)


def test_a_per_member_norm_is_named_at_the_users_layer():
    """A per-member norm's copy for member 0 was named, 'net.1.norms.0': pyrouq's copy, at a
    path not in the user's network; and a BatchNorm's "running_mean should contain 8
    elements not 7" named no layer."""
    torch.manual_seed(0)
    for norms in ("per_member", "shared"):
        model = pyrouq.batchensemble(
            nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(7), nn.Linear(8, 2)), 3, norms=norms
        )
        with pytest.raises(RuntimeError) as info:
            model(torch.randn(5, 4))
        assert str(info.value).endswith(
            f"but got input of size[5, 8] (in {nn.LayerNorm(7)!r} at 'net.1' of the model)"
        )
    model = pyrouq.batchensemble(
        nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(7), nn.Linear(8, 2)), 3
    )
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(5, 4))
    assert str(info.value) == (
        f"running_mean should contain 8 elements not 7 (in {nn.BatchNorm1d(7)!r} at 'net.1' of "
        "the model)"
    )


@pytest.mark.parametrize(
    "layer, words",
    [
        (nn.GroupNorm(2, 16), "number of channels in input, but got weight of shape [16]"),
        (nn.GroupNorm(3, 9), "to be divisible by num_groups, but got input of shape"),
        (nn.PReLU(16), "Found parameter numbers = 16 and channel size = 8."),
    ],
)
def test_a_norm_or_prelu_of_other_channels_is_named_and_restated_by_predict(layer, words):
    """GroupNorm's and PReLU's words on a channel count they do not take ("Expected weight to
    be a vector of size equal to the number of channels in input", "Mismatch of parameter
    numbers and input channel size") were not read as torch's words on shapes: no layer was
    named, and predict() let them through bare, where a BatchNorm's or a LayerNorm's are named
    and restated with what to check (a GroupNorm network given one image (1, 28, 28), which
    its convolution takes unbatched, met the first)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), layer, nn.Flatten(), nn.Linear(200, 2))
    model = pyrouq.bayesian(net)
    with pytest.raises(RuntimeError) as info:
        model(torch.randn(3, 1, 5, 5))
    assert words in str(info.value)
    assert str(info.value).endswith(f"(in {layer!r} at 'net.1' of the model)")
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(ValueError) as info:
        pyrouq.predict(model, torch.randn(3, 1, 5, 5), guide, num_samples=2, progress=False)
    assert str(info.value).startswith("predict(): BayesianNetwork failed on x (a batch of shape ")
    assert words in str(info.value) and "at 'net.1' of the model)" in str(info.value)
    assert "Check that the network takes x (shape, channels, flattening" in str(info.value)


def test_an_affine_instance_norm_of_other_channels_is_named_and_restated():
    """An affine InstanceNorm's refusal of another channel count is torch's ValueError, not a
    RuntimeError as a GroupNorm's: it named no layer, in a converted network or a plain one;
    and, named, predict(), fit() and mcmc() let it through as it came, where they restate a
    GroupNorm's or BatchNorm's naming x and what to check."""
    torch.manual_seed(0)
    layer = nn.InstanceNorm2d(16, affine=True)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), layer, nn.Flatten(), nn.Linear(200, 2))
    model = pyrouq.bayesian(net)
    said = "expected input's size at dim=1 to match num_features (16), but got: 8"
    x, y = torch.randn(3, 1, 5, 5), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError) as info:
        model(x)
    assert str(info.value) == f"{said} (in {layer!r} at 'net.1' of the model)"
    check = "Check that the network takes x (shape, channels, flattening: inputs of the shape"
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(ValueError) as info:
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)
    assert str(info.value) == (
        "predict(): BayesianNetwork failed on x (a batch of shape (3, 1, 5, 5), dtype "
        f"torch.float32): {said} (in {layer!r} at 'net.1' of the model). {check} it was "
        "built for)."
    )
    with pytest.raises(ValueError) as info:
        pyrouq.predict(net, x, progress=False)
    assert str(info.value).startswith("predict(): Sequential failed on x (a batch of shape")
    assert f"{said} (in {layer!r} at '1' of the network). {check}" in str(info.value)
    with pytest.raises(ValueError) as info:
        pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=3, progress=False)
    assert str(info.value).startswith("fit(): BayesianNetwork failed on the first examples")
    assert str(info.value).endswith("built for); nothing was trained.")
    assert f"{said} (in {layer!r} at 'net.1' of the model). Check" in str(info.value)
    with pytest.raises(ValueError) as info:
        pyrouq.mcmc(model, x, y, 2, 2, num_chains=1, progress=False)
    assert str(info.value).startswith("mcmc(): BayesianNetwork failed on x (shape (3, 1, 5, 5)")
    assert f"{said} (in {layer!r} at 'net.1' of the model). {check}" in str(info.value)
    assert str(info.value).endswith("; nothing was sampled.")
    for caller, run in [
        ("psis_diagnostic()", lambda: pyrouq.psis_diagnostic(model, guide, x, y, num_samples=25)),
        ("to_inference_data()", lambda: pyrouq.to_inference_data(model, guide, x, y, 2)),
    ]:
        with pytest.raises(ValueError) as info:
            run()
        assert str(info.value).startswith(f"{caller}: BayesianNetwork failed on x (shape (3, 1")
        assert f"{said} (in {layer!r} at 'net.1' of the model). Check that the model takes x" in (
            str(info.value)
        )

    # a ValueError of those words from another layer of the user's is left as it came
    class Own(nn.Module):
        def forward(self, x):
            raise ValueError(f"{said}.")

    with pytest.raises(ValueError) as info:
        pyrouq.bayesian(nn.Sequential(nn.Linear(2, 2), Own()))(torch.randn(3, 2))
    assert str(info.value) == f"{said}."


def test_an_own_pyro_models_instance_norm_refusal_is_restated_with_one_full_stop():
    """In a Pyro model of one's own (no layer named), torch's InstanceNorm words end with a
    full stop: restated, they read "but got: 3.. Check that ...", where they were not restated
    at all."""
    import pyro
    import pyro.distributions as dist
    from pyro.infer.autoguide import AutoNormal
    from pyro.nn import PyroModule, PyroSample

    class Own(PyroModule):
        def __init__(self):
            super().__init__()
            self.norm = nn.InstanceNorm1d(4, affine=True)
            self.fc = PyroModule[nn.Linear](20, 2)
            self.fc.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 20]).to_event(2))

        def forward(self, x, y=None):
            logits = self.fc(self.norm(x).flatten(1))
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    torch.manual_seed(0)
    model = Own()
    guide = AutoNormal(model)
    x, y = torch.randn(6, 4, 5), torch.randint(0, 2, (6,))
    pyrouq.fit(model, guide, [(x, y)], epochs=1, num_data=6, progress=False)
    said = "expected input's size at dim=1 to match num_features (4), but got: 3. Check that"
    with pytest.raises(ValueError) as info:
        pyrouq.psis_diagnostic(model, guide, torch.randn(6, 3, 5), y, num_samples=25)
    assert str(info.value).startswith("psis_diagnostic(): Own failed on x (shape (6, 3, 5)")
    assert said in str(info.value)
    with pytest.raises(ValueError) as info:
        pyrouq.predict(model, torch.randn(6, 3, 5), guide, num_samples=2, progress=False)
    assert str(info.value).startswith("predict(): Own failed on x (a batch of shape (6, 3, 5)")
    assert "but got: 3." in str(info.value) and ".." not in str(info.value)


class _Tokens(nn.Module):
    """Token ids to their mean embedding, looked up in its own forward (not by calling its
    nn.Embedding), with an auxiliary head the forward leaves out."""

    def __init__(self, vocab, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.embed = nn.Embedding(vocab, hidden_size)
        self.aux = nn.Linear(hidden_size, 2)

    def forward(self, ids):
        return F.embedding(ids, self.embed.weight).mean(1)

    def extra_repr(self):
        return f"hidden_size={self.hidden_size}"


def test_a_dtype_error_is_not_taken_for_a_shape_error_by_the_layer_named():
    """The layer added to torch's words ("Head(hidden_size=4)") said "size": a dtype error
    got the note on BatchEnsemble layers not called and per-member biases."""
    torch.manual_seed(0)
    model = pyrouq.batchensemble(nn.Sequential(_Tokens(10, 4), nn.Linear(4, 2)), 3)
    ids = torch.randint(10, (5, 6))
    with pytest.warns(UserWarning, match="1 of the network's 2 BatchEnsemble layers were not"):
        assert model(ids).shape == (3, 5, 2)
    with pytest.raises(RuntimeError) as info:
        model(ids.float())  # float ids: cast to the network's dtype
    told = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert told.endswith(
        "but got torch.FloatTensor instead (while checking arguments for embedding) (in "
        "_Tokens(hidden_size=4) at 'net.0' of the model)"
    )


def test_a_vmap_run_names_the_layer_refusing_its_input(monkeypatch):
    """Draws run as one vmap pass (on accelerators) met torch's "Expected size for first two
    dimensions of batch2 tensor", which named no layer."""
    import pyrouq._engine

    monkeypatch.setattr(pyrouq._engine, "_cpu", lambda x: False)  # the accelerators' way
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(7, 2)))
    draws = _draws(model, 3, torch.float32)
    with pytest.raises(RuntimeError) as info:
        model.outputs(torch.randn(5, 4), draws)
    assert str(info.value) == (
        "Expected size for first two dimensions of batch2 tensor to be: [3, 8] but got: "
        "[3, 7]. (in Linear(in_features=7, out_features=2, bias=True) at 'net.2' of the model)"
    )
    guide = pyrouq.mean_field_guide(model)
    with pytest.raises(ValueError, match=r"\(in Linear\(in_features=7, .*\) at 'net\.2' of the "):
        pyrouq.predict(model, torch.randn(5, 4), guide, num_samples=3, progress=False)
