"""bayesian() and batchensemble() on any nn.Module: torchvision's resnet18, nested and residual
networks, priors and selections, the model contract, checkpoints from a skeleton."""

from __future__ import annotations

import copy
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
import torchvision
from pyro import poutine
from pyro.infer.autoguide import AutoNormal
from torch import nn

import pyrouq
from pyrouq import (
    BatchEnsembleNetwork,
    BayesianNetwork,
    KLWeightedELBO,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    predict,
    save,
)


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


def _is_norm(name: str) -> bool:
    return ".bn" in name or name.startswith("bn") or "downsample.1" in name


def test_resnet18_latent_sites_are_exactly_its_convolutions_and_linear(resnet):
    model = bayesian(resnet)
    expected = {n: p.shape for n, p in resnet.named_parameters() if not _is_norm(n)}
    assert model.latent_sites() == expected  # names, shapes and order of named_parameters()
    assert "layer1.0.conv1.weight" in expected and "fc.bias" in expected
    point = [n for n, _ in model.named_parameters()]
    assert point and all(_is_norm(n.removeprefix("net.")) for n in point)  # BatchNorm only
    assert len(point) == sum(1 for n, _ in resnet.named_parameters() if _is_norm(n))
    # the module itself is untouched
    assert all(isinstance(p, nn.Parameter) for _, p in resnet.named_parameters())
    trace = poutine.trace(model).get_trace(torch.randn(2, 3, 32, 32))
    latent = [
        n
        for n, s in trace.nodes.items()
        if s["type"] == "sample" and not s["is_observed"] and n not in ("data", "obs")
    ]
    assert latent == list(expected)


def test_resnet18_predict_shapes(resnet):
    model = bayesian(resnet)
    guide = mean_field_guide(model)
    preds = predict(model, torch.randn(4, 3, 32, 32), guide, num_samples=3)
    assert preds.probs.shape == (3, 4, 10)
    torch.testing.assert_close(preds.probs.sum(-1), torch.ones(3, 4))
    assert not torch.allclose(preds.probs[0], preds.probs[1])  # three different draws


def test_last_layer_selects_two_sites(resnet):
    model = bayesian(resnet, select="last_layer")
    assert list(model.latent_sites()) == ["fc.weight", "fc.bias"]
    assert sum(1 for _ in model.named_parameters()) == sum(1 for _ in resnet.parameters()) - 2


def test_select_by_names_prefixes_and_callable(resnet):
    by_prefix = bayesian(resnet, select=["layer4", "fc"])
    sites = list(by_prefix.latent_sites())
    assert all(s.startswith(("layer4.", "fc.")) for s in sites)
    assert "layer4.1.bn2.weight" in sites  # a prefix takes every parameter under it
    assert not any(s.startswith("layer40") for s in sites)
    only_weights = bayesian(resnet, select=lambda name, p: p.dim() == 4 and name < "layer2")
    assert set(only_weights.latent_sites()) == {
        n for n, p in resnet.named_parameters() if p.dim() == 4 and n < "layer2"
    }


def test_dict_and_callable_priors_reach_the_right_sites(resnet):
    laplace = dist.Laplace(0.0, 0.5)
    model = bayesian(resnet, prior={"layer4": 0.1, "layer4.1": 0.05, "fc": laplace})
    priors = model.priors()
    assert priors["layer4.0.conv1.weight"].base_dist.scale.unique().item() == pytest.approx(0.1)
    assert priors["layer4.1.conv2.weight"].base_dist.scale.unique().item() == pytest.approx(0.05)
    assert isinstance(priors["fc.weight"].base_dist, dist.Laplace)
    assert priors["fc.weight"].event_shape == (10, 512)
    assert priors["conv1.weight"].base_dist.scale.unique().item() == 1.0  # unmatched: default

    def fan_in(name, param):
        return dist.Normal(0.0, (1.0 / param[0].numel()) ** 0.5) if param.dim() > 1 else 1.0

    scaled = bayesian(resnet, prior=fan_in)
    got = scaled.priors()["layer1.0.conv1.weight"].base_dist.scale.unique().item()
    assert got == pytest.approx((1 / (64 * 9)) ** 0.5)
    assert scaled.priors()["fc.bias"].base_dist.scale.unique().item() == 1.0


def test_elbo_gradient_reaches_batchnorm_and_the_guide(resnet):
    model = bayesian(resnet, num_data=100)
    guide = mean_field_guide(model)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    KLWeightedELBO().differentiable_loss(model, guide, x, y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert guide.loc["fc__weight"].grad.abs().sum() > 0


def test_batchnorm_running_statistics_behave_as_in_torch():
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Flatten(), nn.LazyLinear(2))
    net(torch.randn(2, 1, 5, 5))
    model = bayesian(net, num_data=8)
    bn = model.net[1]
    before, count = bn.running_mean.clone(), int(bn.num_batches_tracked)
    guide = mean_field_guide(model)
    model.eval()
    predict(model, torch.randn(8, 1, 5, 5), guide, num_samples=2)
    assert torch.equal(bn.running_mean, before)  # eval: untouched
    model.train()
    KLWeightedELBO().loss(model, guide, torch.randn(8, 1, 5, 5), torch.randint(0, 2, (8,)))
    assert not torch.equal(bn.running_mean, before)  # train: updated
    assert int(bn.num_batches_tracked) == count + 1


def test_batchensemble_of_resnet18(resnet):
    resnet = resnet.eval()
    ensemble = batchensemble(resnet, 4, r_std=0.0, s_std=0.0).eval()
    x = torch.randn(3, 3, 32, 32)
    out = ensemble(x)
    assert out.shape == (4, 3, 10)
    with torch.no_grad():
        base = resnet(x)
    for member in range(4):
        torch.testing.assert_close(out[member], base, rtol=1e-5, atol=1e-5)
    preds = predict(batchensemble(resnet, 4), x)
    assert preds.probs.shape == (4, 3, 10)


class Encoder(nn.Module):
    """Tokens (B, T, 6) -> a 2-layer transformer encoder -> mean over tokens -> 4 classes."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x)).mean(1))


def test_batchensemble_and_rank1_of_a_transformer_encoder():
    # in eval mode without gradients, torch's fused encoder layer reads its linear layers'
    # weights as tensors; the members must still run through the BatchEnsemble layers
    torch.manual_seed(0)
    net = Encoder().eval()
    x = torch.randn(3, 5, 6)
    with torch.no_grad():
        base = net(x)  # torch's fused path
    ensemble = batchensemble(net, 2, r_std=0.0, s_std=0.0).eval()
    with torch.no_grad():
        out = ensemble(x)
    for member in range(2):
        torch.testing.assert_close(out[member], base, rtol=1e-5, atol=1e-5)
    assert torch.backends.mha.get_fastpath_enabled()  # switched back on after the run
    y = torch.tensor([0, 1, 3])
    for model, guide in (
        (batchensemble(net, 2), None),
        (lambda m: (m, mean_field_guide(m)))(pyrouq.rank1(net, 2)),
    ):
        fit(model, guide, [(x, y)], epochs=1, num_data=3, progress=False, seed=0)
        preds = predict(model.eval(), x, guide, num_samples=3 if guide is not None else None)
        assert preds.probs.shape == ((6 if guide is not None else 2), 3, 4)


def _small_swin() -> nn.Module:
    """torchvision's Swin transformer (v2 blocks), two stages of width 24, 4 x 4 windows."""
    from torchvision.models import swin_transformer as swin

    return swin.SwinTransformer(
        [4, 4], 24, [2, 2], [2, 2], [4, 4], num_classes=10,
        block=swin.SwinTransformerBlockV2, downsample_layer=swin.PatchMergingV2,
    )  # fmt: skip


def test_batchensemble_and_rank1_of_a_swin_transformer(tmp_path):
    # torchvision's Swin attention reads its qkv and projection layers' weights and biases as
    # tensors: those layers stay plain (shared), every other layer is converted
    torch.manual_seed(0)
    net = _small_swin().eval()
    x = torch.randn(3, 3, 32, 32)
    ensemble = batchensemble(net, 2)
    attention = ensemble.net.features[1][0].attn
    assert type(attention.qkv) is nn.Linear and type(attention.proj) is nn.Linear
    assert type(attention.cpb_mlp[0]) is nn.Linear  # the relative position bias's MLP too
    assert type(ensemble.net.features[1][0].mlp[0]) is pyrouq.BatchEnsembleLinear
    assert type(ensemble.net.head) is pyrouq.BatchEnsembleLinear
    with torch.no_grad():
        same = batchensemble(net, 2, r_std=0.0, s_std=0.0).eval()(x)
        torch.testing.assert_close(same, net(x).expand(2, -1, -1), rtol=1e-5, atol=1e-5)
    y = torch.tensor([0, 1, 3])
    ranked = pyrouq.rank1(net, 2)
    for model, guide in ((ensemble, None), (ranked, mean_field_guide(ranked))):
        fit(model, guide, [(x, y)], epochs=1, num_data=3, progress=False, seed=0)
        preds = predict(model.eval(), x, guide, num_samples=3 if guide is not None else None)
        assert preds.probs.shape == ((6 if guide is not None else 2), 3, 10)
        assert not torch.allclose(preds.probs[0], preds.probs[1])  # the members differ
    restored = load(save(tmp_path / "s.pt", ensemble), module=_small_swin()).model.eval()
    assert torch.equal(restored(x), ensemble.eval()(x))


class TiedLM(nn.Module):
    """Tokens -> embedding -> two linear layers sharing one weight -> a head tied to the
    embedding (as language models tie them)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.relu(self.b(torch.relu(self.a(self.emb(x).mean(1))))))


class Tied(TiedLM):
    """TiedLM's ties, and the first linear layer registered again under a second name."""

    def __init__(self):
        super().__init__()
        self.again = self.a

    def forward(self, x):
        h = torch.relu(self.b(torch.relu(self.a(self.emb(x).mean(1)))))
        return self.head(torch.relu(self.again(h)))


def test_a_tied_weight_is_one_latent_site_that_every_name_reads(tmp_path):
    torch.manual_seed(0)
    net = TiedLM()
    model = bayesian(net, prior={"head": 0.1})  # a key matching the head's name for the matrix
    assert list(model.latent_sites()) == ["emb.weight", "a.weight", "a.bias", "b.bias"]
    assert model.prior_of("emb.weight").scale.item() == pytest.approx(0.1)
    assert list(bayesian(net, select=["b.weight"]).latent_sites()) == ["a.weight"]
    x, y = torch.randint(0, 10, (4, 3)), torch.tensor([0, 3, 9, 1])
    # one draw, read under every name: as the plain network holding the drawn values
    drawn = {k: v + 0.1 * torch.randn_like(v) for k, v in model.template().items()}
    plain = model.plain_network()
    assert plain.b.weight is plain.a.weight and plain.head.weight is plain.emb.weight
    with torch.no_grad():
        for site, value in drawn.items():
            plain.get_parameter(site).copy_(value)
    assert torch.allclose(model.outputs(x, drawn), plain(x), atol=1e-5)
    guide = mean_field_guide(model, init_from=net)
    fit(model, guide, [(x, y)], epochs=1, num_data=4, progress=False, seed=0)
    model.double().float()  # torch casts each module's buffers on its own
    assert model.net.b.weight is model.net.a.weight
    assert model.net.head.weight is model.net.emb.weight
    assert predict(model.eval(), x, guide, num_samples=2).probs.shape == (2, 4, 10)
    restored = load(save(tmp_path / "t.pt", model, guide=guide), module=TiedLM())
    assert restored.model.net.head.weight is restored.model.net.emb.weight
    assert torch.equal(restored.model.outputs(x, drawn), model.outputs(x, drawn))


@pytest.mark.parametrize("old_torch", [False, True], ids=["torch", "torch_before_2_4"])
def test_a_network_cast_alone_is_told_to_cast_the_model(monkeypatch, old_torch):
    # model.net.double() leaves the priors float32: model(x) gave torch's "mat1 and mat2 must
    # have the same dtype, but got Double and Float", which names neither; the advice, followed,
    # runs in float64. Before torch 2.4 torch.is_autocast_enabled() takes no device: the check
    # of the cast called it with one and raised torch's TypeError ("takes 0 positional
    # arguments")
    if old_torch:  # torch < 2.4's calls (the CPU's has one of its own)
        monkeypatch.setattr(torch, "is_autocast_enabled", lambda: False)
        monkeypatch.setattr(torch, "is_autocast_cpu_enabled", lambda: False)
    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    model.net.double()
    x = torch.randn(5, 3, dtype=torch.float64)
    with pytest.raises(TypeError) as err:
        model(x)
    assert str(err.value) == (
        "BayesianNetwork's priors are torch.float32, but its network is torch.float64 (the "
        "network was cast alone, e.g. model.net.double()), so the weights they draw do not fit "
        "it. Cast the whole model, model.double(), which casts the priors with the network."
    )
    assert model.double()(x).dtype == torch.float64


def test_a_cpu_autocast_is_read_under_a_torch_without_device_autocast_calls(monkeypatch):
    # there the CPU's autocast has calls of its own (is_autocast_cpu_enabled, ...): an autocast
    # on is read through them (the check of a network cast alone, and float16's of _site_kl)
    from pyrouq._autocast import autocast_dtype

    with torch.autocast("cpu", dtype=torch.bfloat16), monkeypatch.context() as old_torch:
        old_torch.setattr(torch, "is_autocast_enabled", lambda: False)  # (the GPU's, < 2.4)
        assert autocast_dtype("cpu") == torch.bfloat16
        assert autocast_dtype("cuda") is None
    with monkeypatch.context() as old_torch:
        old_torch.setattr(torch, "is_autocast_enabled", lambda: False)
        assert autocast_dtype("cpu") is None


def test_a_tied_site_stays_tied_through_load_state_dict_with_assign():
    # assign=True puts the loaded tensor in under the site's name only; net(x), which runs the
    # network with its template, read the tensor it replaced under the other names
    torch.manual_seed(0)
    source, model = bayesian(TiedLM()), bayesian(TiedLM())
    x = torch.randint(0, 10, (4, 3))
    for loading in (model, nn.ModuleList([model])):  # its own load_state_dict, or a parent's
        state = (
            source.state_dict()
            if loading is model
            else {f"0.{k}": v for k, v in source.state_dict().items()}
        )
        loading.load_state_dict(state, assign=True)
        assert model.net.head.weight is model.net.emb.weight
        assert model.net.b.weight is model.net.a.weight
        with torch.no_grad():
            assert torch.equal(model.net(x), source.net(x))


def test_a_model_pickled_before_tied_sites_runs_whole():
    import pickle

    model = bayesian(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)),
                     local_reparameterization=True)  # fmt: skip
    del model._tied  # as pickled by pyrouq before tied sites
    old = pickle.loads(pickle.dumps(model))
    assert old.local_layers() == {"0": ("0.weight", "0.bias"), "2": ("2.weight", "2.bias")}
    assert isinstance(old.plain_network()[0].weight, nn.Parameter)


class TiedTo(nn.Module):
    """Three layers, the last reading the weight of the one named ``partner``: tied to "a" or
    to "b", the same first names and shapes."""

    def __init__(self, partner):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.c.weight = getattr(self, partner).weight

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


class _Untied(TiedLM):
    """TiedLM with its two linear layers untied."""

    def __init__(self):
        super().__init__()
        self.b.weight = nn.Parameter(self.a.weight.detach().clone())


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_checkpoint_refuses_a_skeleton_tied_otherwise(tmp_path):
    from _toy import StopAfter

    from pyrouq.infer import TrainingInterrupted

    # the record listed parameters under their first names only: a skeleton whose "c" read
    # "b"'s weight instead of "a"'s loaded, and computed another function
    torch.manual_seed(0)
    model = bayesian(TiedTo("a"))
    x, y = torch.randn(8, 4), torch.randint(0, 4, (8,))
    path = save(tmp_path / "t.pt", model)
    other = r"'c.weight' is tied to 'a.weight' in the checkpoint and tied to 'b.weight' in"
    with pytest.raises(pyrouq.CheckpointError, match=other):
        load(path, module=TiedTo("b"))
    assert load(path, module=TiedTo("a")).model.net.c.weight is not None
    untied = r"'b.weight' is tied to 'a.weight' in the checkpoint and shape \(8, 8\) in"
    with pytest.raises(pyrouq.CheckpointError, match=untied):
        load(save(tmp_path / "lm.pt", bayesian(TiedLM())), module=_Untied())
    guide = mean_field_guide(model)
    with pytest.raises(TrainingInterrupted):
        fit(model, guide, [(x, y)], epochs=2, num_data=8, progress=False, seed=0,
            checkpoint=tmp_path / "run.pt", callbacks=[StopAfter(1)])  # fmt: skip
    other_model = bayesian(TiedTo("b"))
    with pytest.raises(
        pyrouq.CheckpointError, match=r"module\['tied'\]\['c.weight'\] is \"a.weight\""
    ):
        fit(other_model, mean_field_guide(other_model), [(x, y)], epochs=2, num_data=8,
            progress=False, resume_from=tmp_path / "run.pt")  # fmt: skip


def test_a_layer_registered_twice_cannot_have_latent_parameters():
    # torch.func.functional_call would leave a draw in it: refused under any of its names
    twice = r"'{}' belongs to a layer of Tied registered under several names \('a' and 'again'"
    with pytest.raises(ValueError, match=twice.format("a.weight") + r".*call it as often"):
        bayesian(Tied())
    with pytest.raises(ValueError, match=twice.format("a.bias")):
        bayesian(Tied(), select=["again.bias"])
    with pytest.raises(ValueError, match=twice.format("a.r")):
        pyrouq.rank1(Tied(), 2)
    assert list(bayesian(Tied(), select=["head"]).latent_sites()) == ["emb.weight"]


class Counts(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.counts = nn.Parameter(torch.tensor([1, 2]), requires_grad=False)

    def forward(self, x):
        return self.fc(x) * self.counts.sum()


def test_select_refuses_integer_parameters_and_non_bool_answers():
    with pytest.raises(ValueError, match=r"not floating-point: 'counts' \(torch.int64\).*callable"):
        bayesian(Counts(), select=lambda name, param: True)
    with pytest.raises(ValueError, match=r"not floating-point: 'counts'.*names or prefixes"):
        bayesian(Counts(), select=["counts"])
    assert list(bayesian(Counts()).latent_sites()) == ["fc.weight", "fc.bias"]
    with pytest.raises(TypeError, match=r"for 'counts' it returned Tensor of shape \(2,\)"):
        bayesian(Counts(), select=lambda name, param: param > 0)


def test_batchensemble_keeps_tied_weights_and_repeated_layers(tmp_path):
    torch.manual_seed(0)
    ensemble = batchensemble(Tied(), 2)
    net = ensemble.net
    assert type(net.a) is pyrouq.BatchEnsembleLinear and net.again is net.a  # one layer
    assert net.b.weight is net.a.weight and net.head.weight is net.emb.weight
    assert net.b.r is not net.a.r  # the factors and biases are each layer's own
    x, y = torch.randint(0, 10, (4, 3)), torch.tensor([0, 3, 9, 1])
    fit(ensemble, None, [(x, y)], epochs=1, num_data=4, progress=False, seed=0)
    assert net.b.weight is net.a.weight and net.head.weight is net.emb.weight
    restored = load(save(tmp_path / "t.pt", ensemble), module=Tied()).model.eval()
    assert restored.net.b.weight is restored.net.a.weight
    assert restored.net.head.weight is restored.net.emb.weight
    assert torch.equal(restored(x), ensemble.eval()(x))


class Direct(nn.Module):
    """A forward that reads its head's weight (and, with ``bias``, its bias) as tensors."""

    def __init__(self, bias: bool = False):
        super().__init__()
        self.hidden = nn.Linear(4, 8)
        self.fc = nn.Linear(8, 3)
        self.read_bias = bias

    def forward(self, x):
        bias = self.fc.bias if self.read_bias else None
        return nn.functional.linear(torch.relu(self.hidden(x)), self.fc.weight, bias)


def test_a_forward_that_reads_a_bias_fails_with_a_note_naming_the_layers_not_called():
    # a converted layer's bias is per member, (M, out): F.linear(h, w, b) cannot take it
    ensemble = batchensemble(Direct(bias=True), 2)
    with pytest.raises(RuntimeError) as failure:
        ensemble(torch.randn(5, 4))
    note = "\n".join([str(failure.value), *getattr(failure.value, "__notes__", [])])
    assert note.split("\n")[-1].startswith(
        "pyrouq: the forward failed before calling these BatchEnsemble layers: fc. If it reads "
        "a layer's bias as a tensor"
    )
    assert "per-member biases, shaped (M, out): call the layer instead (self.fc(x))" in note


def test_the_note_on_a_bias_read_as_a_tensor_outlives_a_first_run_that_passed():
    ensemble = batchensemble(Direct(bias=True), 2)
    with pytest.warns(UserWarning, match=r"reads a layer's weight or bias as a tensor"):
        ensemble(torch.randn(2, 4))  # M rows: the (M, out) bias happens to fit them
    with pytest.raises(RuntimeError) as failure:  # fit() probes, then fails on 5 rows
        fit(ensemble, None, [(torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1]))], epochs=1,
            num_data=5, progress=False)  # fmt: skip
    notes = getattr(failure.value, "__notes__", [])
    assert any(n.startswith("pyrouq: the forward failed before calling these BatchEnsemble "
                            "layers: fc.") for n in notes), notes  # fmt: skip


class AuxHead(nn.Module):
    """A network with a head its forward never calls, that runs out of memory once told to."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.aux = nn.Linear(4, 3)
        self.fail = False

    def forward(self, x):
        if self.fail:
            raise RuntimeError("CUDA out of memory (simulated)")
        return self.fc(x)


def test_a_failure_that_is_no_shape_error_gets_no_note_about_layers_not_called():
    ensemble = batchensemble(AuxHead(), 2)
    with pytest.warns(UserWarning, match=r"layers were not called in its forward: aux"):
        ensemble(torch.randn(3, 4))
    ensemble.net.fail = True
    with pytest.raises(RuntimeError, match="out of memory") as failure:
        ensemble(torch.randn(3, 4))
    assert not getattr(failure.value, "__notes__", [])


def test_fit_trains_a_converted_network_and_its_point_estimates():
    torch.manual_seed(0)
    x = torch.randn(96, 2)
    y = (x[:, 0] * x[:, 1] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    net = nn.Sequential(nn.Linear(2, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
    model = bayesian(net)
    guide = mean_field_guide(model)
    bn_before = model.net[1].weight.detach().clone()
    result = fit(model, guide, loader, epochs=40, lr=0.05, progress=False, seed=0)
    assert result.history[-1].train_acc > 0.9
    assert not torch.equal(model.net[1].weight, bn_before)  # BatchNorm trained too
    assert model.num_classes is None  # not stated: fit read it off the outputs


def test_autonormal_guide_trains_through_fit():
    """An autoguide creates its parameters on its first call: fit sets it up before building
    the optimizer (it once trained nothing and stayed at chance)."""
    torch.manual_seed(0)
    x = torch.randn(128, 2)
    y = (x[:, 0] > 0).long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    net = nn.Sequential(nn.Linear(2, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    model = bayesian(net)
    guide = AutoNormal(model, init_scale=0.01)
    fit(model, guide, loader, epochs=30, lr=0.05, progress=False, seed=0)
    preds = predict(model, x, guide, num_samples=8)
    assert (preds.predicted == y).float().mean() > 0.9


def test_plain_pyro_svi_trains_point_estimates_and_guide():
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = (x[:, 0] > 0).long()
    net = nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 2))
    model = bayesian(net, num_data=64)
    guide = mean_field_guide(model)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), KLWeightedELBO(0.1))
    norm_before = model.net[1].weight.detach().clone()
    losses = [svi.step(x, y) for _ in range(60)]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    assert not torch.equal(model.net[1].weight, norm_before)  # SVI saw the LayerNorm too


class Tower(nn.Module):
    """Grouped, depthwise and 1-d convolutions, a residual sum, LayerNorm: not a Sequential."""

    def __init__(self, width=6):
        super().__init__()
        self.conv = nn.Conv1d(2, width, 3, padding=1)
        self.depthwise = nn.Conv1d(width, width, 3, padding=1, groups=width)
        self.grouped = nn.Conv1d(width, width, 1, groups=3)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        h = h + self.grouped(self.depthwise(h))
        return self.head(self.norm(h.mean(-1)))


def test_outputs_with_stacked_draws_equal_one_draw_at_a_time():
    model = bayesian(Tower())
    x = torch.randn(5, 2, 7)
    stacked = {s: torch.randn(4, *shape) * 0.3 for s, shape in model.latent_sites().items()}
    out = model.outputs(x, stacked)
    assert out.shape == (4, 5, 3)
    for i in range(4):
        one = model.outputs(x, {s: v[i] for s, v in stacked.items()})
        torch.testing.assert_close(out[i], one)
    with poutine.condition(data=stacked):
        torch.testing.assert_close(model(x), out)


def test_cpu_and_accelerator_schedules_agree_for_stacked_draws():
    from pyrouq import _engine

    model = bayesian(Tower()).eval()
    x = torch.randn(5, 2, 7)
    stacked = {s: torch.randn(3, *shape) * 0.3 for s, shape in model.latent_sites().items()}
    with _engine.schedule("cpu"):
        looped = model.outputs(x, stacked)
    with _engine.schedule("accelerator"):
        vmapped = model.outputs(x, stacked)  # one torch.func.vmap pass
    torch.testing.assert_close(looped, vmapped, rtol=1e-5, atol=1e-6)


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(4, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def test_draws_vmap_cannot_batch_run_one_at_a_time_on_the_accelerator_schedule():
    """torch.func.vmap has no batching rule for nn.LSTM: the draws run one at a time (the
    accelerator schedule raised 'Batching rule not implemented for aten::lstm.input')."""
    from pyrouq import _engine

    model = bayesian(Recurrent(), select=lambda name, p: p.dim() > 1).eval()
    x = torch.randn(3, 5, 4)
    stacked = {s: torch.randn(3, *shape) * 0.3 for s, shape in model.latent_sites().items()}
    with _engine.schedule("cpu"):
        looped = model.outputs(x, stacked)
    with _engine.schedule("accelerator"):
        fallen_back = model.outputs(x, stacked)
    torch.testing.assert_close(looped, fallen_back)


def test_local_reparameterization_on_a_converted_network():
    model = bayesian(Tower(), num_data=10, local_reparameterization=True)
    assert set(model.local_layers()) == {"conv", "depthwise", "grouped", "head"}
    guide = mean_field_guide(model, init_scale=0.05)
    x, y = torch.randn(10, 2, 7), torch.randint(0, 3, (10,))
    loss = KLWeightedELBO().differentiable_loss(model, guide, x, y)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in guide.parameters())
    assert model.net.norm.weight.grad is not None  # LayerNorm: a point estimate


def test_checkpoint_round_trip_from_a_skeleton(tmp_path, resnet):
    model = bayesian(resnet, prior={"fc": dist.Laplace(0.0, 0.3), "layer1": 0.2}, num_data=7)
    guide = mean_field_guide(model)
    with torch.no_grad():
        model.net.bn1.running_mean.add_(0.5)
        guide.loc["fc__bias"].add_(1.0)
    path = save(tmp_path / "r.pt", model, guide)
    restored = load(path, module=torchvision.models.resnet18(num_classes=10))
    assert type(restored.model) is BayesianNetwork and restored.model.num_data == 7
    assert torch.equal(restored.model.net.bn1.running_mean, model.net.bn1.running_mean)
    assert torch.equal(restored.guide.site_loc("fc.bias"), guide.site_loc("fc.bias"))
    assert isinstance(restored.model.priors()["fc.weight"].base_dist, dist.Laplace)
    assert restored.model.priors()["layer1.0.conv1.weight"].base_dist.scale.unique() == 0.2
    x = torch.randn(2, 3, 32, 32)
    pyro.set_rng_seed(1)
    a = predict(model, x, guide, num_samples=2).probs
    pyro.set_rng_seed(1)
    b = predict(restored.model, x, restored.guide, num_samples=2).probs
    assert torch.equal(a, b)
    ensemble = batchensemble(resnet, 2)
    restored = load(
        save(tmp_path / "e.pt", ensemble), module=torchvision.models.resnet18(num_classes=10)
    )
    assert type(restored.model) is BatchEnsembleNetwork
    ensemble.eval()
    assert torch.equal(restored.model(x), ensemble(x))
    own = batchensemble(resnet, 2, norms="per_member")
    own.train()
    own(x)  # every member's copies of the BatchNorms get running statistics of their own
    own.eval()
    restored = load(
        save(tmp_path / "o.pt", own), module=torchvision.models.resnet18(num_classes=10)
    )
    assert restored.model.options["norms"] == "per_member"
    assert torch.equal(restored.model(x), own(x))


class _TwoHidden(nn.Module):
    def __init__(self, fc2_first=False):
        super().__init__()
        if fc2_first:  # the same network, its layers defined in another order
            self.fc2 = nn.Linear(8, 8)
            self.fc1 = nn.Linear(8, 8)
        else:
            self.fc1 = nn.Linear(8, 8)
            self.fc2 = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def test_a_skeleton_defining_its_layers_in_another_order_keeps_each_sites_prior(tmp_path):
    torch.manual_seed(0)
    model = bayesian(_TwoHidden(), prior={"fc1": 0.1, "fc2": 5.0, "out": 1.0}, num_data=4)
    guide = mean_field_guide(model, init_scale=0.3)
    save(tmp_path / "m.pt", model, guide)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 0])

    def loss(m, g):
        pyro.set_rng_seed(0)
        return KLWeightedELBO(1.0).differentiable_loss(m, g, x, y).item()

    back = load(tmp_path / "m.pt", module=_TwoHidden(fc2_first=True))
    assert back.model.prior_of("fc1.weight").distribution().base_dist.scale[0, 0] == 0.1
    assert back.model.prior_of("fc2.weight").distribution().base_dist.scale[0, 0] == 5.0
    assert loss(back.model, back.guide) == loss(model, guide)  # the KL too, to the bit


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_checkpoints_of_pyrouq_networks_need_no_skeleton(tmp_path):
    model = bayesian(pyrouq.ResidualCNN(width=4))
    with pytest.raises(pyrouq.CheckpointError, match="module=net"):
        load(save(tmp_path / "r.pt", model))  # a user class: the skeleton is needed
    lenet = bayesian(pyrouq.LeNet(num_classes=5))
    restored = load(save(tmp_path / "l.pt", lenet))
    assert restored.model.latent_sites() == lenet.latent_sites()
    skeleton = pyrouq.ResidualCNN(width=4)
    saved = pyrouq.ResidualCNN(width=4)
    plain = load(save(tmp_path / "p.pt", saved), module=skeleton)
    assert isinstance(plain.model, pyrouq.ResidualCNN)
    want = saved.state_dict()
    assert plain.model.state_dict().keys() == want.keys()
    assert all(torch.equal(v, want[k]) for k, v in plain.model.state_dict().items())
    assert not torch.equal(skeleton.stem[0].weight, saved.stem[0].weight)  # so the file's


def _weight_normed():
    return nn.Sequential(
        nn.utils.parametrizations.weight_norm(nn.Linear(4, 6)), nn.ReLU(), nn.Linear(6, 2)
    )


def test_parametrized_weights_are_named_in_a_warning(tmp_path):
    # weight_norm's weight is computed, not a parameter: bayesian() cannot make it latent,
    # batchensemble() trains W without the parametrization; both say so at the user's line
    net = _weight_normed()
    with pytest.warns(UserWarning, match=r"bayesian\(\): '0.weight' of Sequential: computed") as w:
        model = bayesian(net)
    assert w[0].filename == __file__
    assert sorted(model.latent_sites()) == ["0.bias", "2.bias", "2.weight"]
    with pytest.warns(UserWarning, match=r"rank1\(\): 1 of the converted layers") as w:
        rank_one = pyrouq.rank1(net, 2)
    assert w[0].filename == __file__
    # load() rebuilding them loads the trained W: it does not repeat the conversion's warning
    # (it said "batchensemble(): ... start from its current weight", for a rank-1 file too)
    with pytest.warns(UserWarning, match=r"batchensemble\(\): 1 of the converted layers"):
        ensemble = batchensemble(net, 2)
    x = torch.randn(5, 4)
    for saved, guide in ((rank_one, mean_field_guide(rank_one)), (ensemble, None)):
        path = pyrouq.save(tmp_path / "m.pt", saved, guide)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = pyrouq.load(path, module=_weight_normed())
        expected = pyrouq.predict(saved, x, guide, progress=False, seed=0).probs
        again = pyrouq.predict(loaded.model, x, loaded.guide, progress=False, seed=0).probs
        assert torch.equal(again, expected)


class Decoder(nn.Module):
    """A strided conv down, a grouped transposed conv back up to the input's size (torch's
    ``output_size``), a BatchNorm, then a linear head: 3 classes."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(1, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, groups=2)
        self.bn = nn.BatchNorm2d(6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.up(torch.relu(self.down(x)), output_size=x.shape)
        return self.head(torch.relu(self.bn(h)).mean((2, 3)))


def _member_network(ensemble, base, member):
    """``base`` with member ``member``'s effective weights and biases (a plain network)."""
    net = copy.deepcopy(base)
    for name, layer in ensemble.net.named_modules():
        if getattr(layer, "_is_batchensemble", False):
            plain = net.get_submodule(name)
            plain.weight.data = layer.effective_weight(member).detach().clone()
            plain.bias.data = layer.bias[member].detach().clone()
    return net


def test_batchensemble_converts_transposed_convolutions(tmp_path):
    torch.manual_seed(0)
    net = Decoder().eval()
    x = torch.randn(4, 1, 9, 9)  # odd size: output_size picks the output padding
    ensemble = batchensemble(net, 3).eval()
    assert type(ensemble.net.up) is pyrouq.BatchEnsembleConvTranspose2d
    with torch.no_grad():
        out = ensemble(x)
        for member in range(3):  # each member is the plain network with its own weights
            expected = _member_network(ensemble, net, member)(x)
            torch.testing.assert_close(out[member], expected, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(out[0], out[1])  # the members differ
        same = batchensemble(net, 3, r_std=0.0, s_std=0.0).eval()(x)
        torch.testing.assert_close(same, net(x).expand(3, -1, -1), rtol=1e-5, atol=1e-5)
    layer = ensemble.net.up
    folded = torch.randn(3 * 2, 8, 5, 5)  # the layer alone, default output padding
    ref = torch.conv_transpose2d(
        folded[2:4], layer.effective_weight(1), layer.bias[1], stride=2, padding=1, groups=2
    )
    torch.testing.assert_close(layer(folded)[2:4], ref, rtol=1e-5, atol=1e-5)
    restored = load(save(tmp_path / "d.pt", ensemble), module=Decoder()).model.eval()
    assert torch.equal(restored(x), ensemble(x))
    model = pyrouq.rank1(net, 2)
    assert tuple(model.latent_sites()["up.r"]) == (2, 8)
    assert tuple(model.latent_sites()["up.s"]) == (2, 6)
    y = torch.tensor([0, 1, 2, 0])
    fit(model, mean_field_guide(model), [(x, y)], epochs=1, num_data=4, progress=False, seed=0)


class WideOnSmall(nn.Module):
    """Every layer holds more weights than the activations it meets on 2 x 2 maps: a
    convolution, a grouped one, a grouped transposed one and a linear head; optionally a
    BatchNorm on the outputs."""

    def __init__(self, norm: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=4)
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2, groups=2)
        self.head = nn.Linear(16, 10)
        self.norm = nn.BatchNorm1d(10) if norm else nn.Identity()

    def forward(self, x):
        h = torch.relu(self.grouped(torch.relu(self.conv(x))))
        return self.norm(self.head(torch.relu(self.up(h)).mean((2, 3))))


@pytest.mark.parametrize("shared_batchnorm", [False, True], ids=["member-passes", "folded"])
def test_members_of_layers_wider_than_their_activations(shared_batchnorm):
    # on CPU such layers scale one member's activations instead of building its weights:
    # the same outputs and gradients as the member's plain network with its effective weights.
    # A BatchNorm the members share, in training, runs them as one folded batch, its
    # statistics over every member's rows.
    torch.manual_seed(0)
    net = WideOnSmall(norm=shared_batchnorm)
    x, y = torch.randn(2, 3, 2, 2), torch.tensor([3, 7])
    ensemble = batchensemble(net, 3, norms="shared").train()
    out = ensemble(x)
    loss = nn.functional.cross_entropy(out.flatten(0, 1), y.repeat(3))
    loss.backward()
    layers = {n: m for n, m in ensemble.net.named_modules() if hasattr(m, "effective_weight")}
    params = [p for m in layers.values() for p in (m.weight, m.r, m.s, m.bias)]
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    net_without_norm = copy.deepcopy(net)
    net_without_norm.norm = nn.Identity()
    refs = []
    for member in range(3):
        weights = {}
        for name, layer in layers.items():
            weights[f"{name}.weight"] = layer.folded_weights()[0][member]
            weights[f"{name}.bias"] = layer.bias[member]
        refs.append(torch.func.functional_call(net_without_norm, weights, (x,)))
    ref = torch.stack(refs)
    if shared_batchnorm:
        norm = ensemble.net.norm
        ref = nn.functional.batch_norm(
            ref.flatten(0, 1), None, None, norm.weight, norm.bias, training=True
        ).unflatten(0, (3, 2))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    nn.functional.cross_entropy(ref.flatten(0, 1), y.repeat(3)).backward()
    for got, p in zip(grads, params, strict=True):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)


def test_a_layer_the_forward_bypasses_is_named_in_a_warning():
    # F.linear(h, self.fc.weight) reads the shared W: the members' factors never apply there
    ensemble = batchensemble(Direct(), 2)
    with pytest.warns(
        UserWarning,
        match=r"1 of the network's 2 BatchEnsemble layers were not "
        r"called in its forward: fc\..*call the layer instead",
    ) as w:
        ensemble(torch.randn(5, 4))
    assert w[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ensemble(torch.randn(5, 4))  # said once per network
        batchensemble(nn.Sequential(nn.Linear(4, 3)), 2)(torch.randn(5, 4))  # all called


class ScaledLinear(nn.Linear):
    """A Linear subclass with a computation of its own."""

    def forward(self, x):
        return 3.0 * super().forward(x) + 1.0


class StdConv(nn.Conv2d):
    """A weight-standardised convolution (BiT's), overriding ``_conv_forward`` only."""

    def _conv_forward(self, x, weight, bias):
        mean = weight.mean((1, 2, 3), keepdim=True)
        weight = (weight - mean) / (weight.std((1, 2, 3), keepdim=True) + 1e-5)
        return super()._conv_forward(x, weight, bias)


def test_a_batchensemble_file_that_converted_such_a_subclass_says_why_it_cannot_load(tmp_path):
    """pyrouq before 2026-12-04 converted a subclass with a forward of its own (dropping it):
    such a file holds member factors for a layer that today's conversion keeps plain."""
    import json

    ensemble = batchensemble(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), 2)
    path = pyrouq.save(tmp_path / "old.pt", ensemble)
    payload = torch.load(path, weights_only=True)
    description = json.loads(payload["description"])
    description["model"]["module"]["modules"]["0"] = "ScaledLinear"  # as the old file records
    payload["description"] = json.dumps(description)
    torch.save(payload, path)
    # a rank-1 file fails earlier, rebuilding its sites
    rank_one = pyrouq.rank1(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), 2)
    old_rank1 = pyrouq.save(tmp_path / "old1.pt", rank_one, mean_field_guide(rank_one))
    payload = torch.load(old_rank1, weights_only=True)
    description = json.loads(payload["description"])
    description["model"]["module"]["modules"]["0"] = "ScaledLinear"
    payload["description"] = json.dumps(description)
    torch.save(payload, old_rank1)
    skeleton = nn.Sequential(ScaledLinear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    with pytest.warns(UserWarning, match="subclasses with a forward of their own"):
        with pytest.raises(pyrouq.CheckpointError, match=r"Its layers \['0'\] are of subclasses"):
            pyrouq.load(old_rank1, module=skeleton)
    with pytest.warns(UserWarning, match="subclasses with a forward of their own"):
        with pytest.raises(
            pyrouq.CheckpointError,
            match=r"Its layers \['0'\] are of subclasses "
            r"with a forward of their own, .*convert and train the network again",
        ):
            pyrouq.load(path, module=skeleton)


class ScaledHead(nn.Module):
    """A head of ScaledLinear whose own parameter is called ``s``, as BatchEnsemble factors."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = ScaledLinear(4, 2)
        self.head.s = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.head.s * self.head(torch.relu(self.body(x)))


class ScaledHeadTakingT(ScaledHead):
    def forward(self, x, *, t):
        return super().forward(x) / t


def test_a_bayesian_file_with_a_site_named_s_is_not_taken_for_an_old_ensemble(tmp_path):
    model = bayesian(ScaledHead(), select=["head"])
    path = pyrouq.save(tmp_path / "m.pt", model, mean_field_guide(model))
    ScaledHeadTakingT.__name__ = ScaledHeadTakingT.__qualname__ = "ScaledHead"
    with pytest.raises(pyrouq.CheckpointError, match=r"cannot rebuild BayesianNetwork .*requires "
                       r"the keyword argument\(s\) t") as info:  # fmt: skip
        pyrouq.load(path, module=ScaledHeadTakingT())
    assert "subclasses with a forward of their own" not in str(info.value)


class PlainSubclass(nn.Linear):
    """A subclass that computes as torch's Linear does: converted as one."""


def test_subclasses_computing_their_own_way_keep_their_computation():
    torch.manual_seed(0)
    net = nn.Sequential(
        StdConv(1, 4, 3), nn.ReLU(), nn.Flatten(), PlainSubclass(64, 8), nn.ReLU(),
        ScaledLinear(8, 3),
    ).eval()  # fmt: skip
    x = torch.randn(5, 1, 6, 6)
    with pytest.warns(
        UserWarning,
        match=r"batchensemble\(\): 2 layer\(s\) of ScaledLinear, "
        r"StdConv, subclasses with a forward of their own, are kept as they are",
    ):
        ensemble = batchensemble(net, 2, r_std=0.0, s_std=0.0).eval()
    assert type(ensemble.net[3]).__name__ == "BatchEnsembleLinear"  # converted
    assert type(ensemble.net[5]) is ScaledLinear and type(ensemble.net[0]) is StdConv
    with torch.no_grad():
        torch.testing.assert_close(ensemble(x), net(x).expand(2, 5, 3))  # was off by 3.3
    # local reparameterisation draws only layers that compute as torch's do
    model = bayesian(net, local_reparameterization=True)
    assert set(model.local_layers()) == {"3"}
    # a parametrization's generated class (ParametrizedScaledLinear) hides no subclass
    weighted = nn.Sequential(nn.Linear(4, 4), nn.utils.parametrizations.weight_norm(
        ScaledLinear(4, 3))).eval()  # fmt: skip
    with pytest.warns(UserWarning, match=r"1 layer\(s\) of ParametrizedScaledLinear"):
        ensemble = batchensemble(weighted, 2, r_std=0.0, s_std=0.0).eval()
    with torch.no_grad():
        x = torch.randn(5, 4)
        torch.testing.assert_close(ensemble(x), weighted(x).expand(2, 5, 3))


def test_a_network_changing_its_input_in_place_sees_it_as_it_came_in_every_draw_and_member():
    """An in-place activation first: the second draw or member saw the first one's output."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.LeakyReLU(0.1, inplace=True), nn.Linear(4, 3)).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = net(x.clone())
        model = bayesian(net).eval()
        same = {k: v.expand(3, *v.shape) for k, v in model.template().items()}  # 3 equal draws
        torch.testing.assert_close(model.outputs(x.clone(), same), expected.expand(3, 2, 3))
        ensemble = batchensemble(net, 3, r_std=0.0, s_std=0.0).eval()
        torch.testing.assert_close(ensemble(x.clone()), expected.expand(3, 2, 3))
    # one draw per pass (parallel=False), and inference-mode inputs, which keep no version
    draws = {k: v.expand(3, *v.shape).clone() for k, v in model.template().items()}
    for parallel in (False, True):
        probs = pyrouq.predict(model, x.clone(), posterior_samples=draws, parallel=parallel,
                               progress=False).probs  # fmt: skip
        torch.testing.assert_close(probs, expected.softmax(-1).expand(3, 2, 3))
    with torch.inference_mode():
        frozen = x.clone()  # (an in-place network cannot run on it, in torch either)
    plain = nn.Sequential(nn.Linear(4, 3))
    for other in (bayesian(plain), batchensemble(plain, 3)):
        guide = mean_field_guide(other) if isinstance(other, pyrouq.BayesianNetwork) else None
        assert pyrouq.predict(other, frozen, guide, progress=False).probs.shape[1:] == (2, 3)
    # training: every particle sees the batch as it came
    seen = []
    recorder = nn.Module()
    recorder.forward = lambda h: seen.append(float(h.sum())) or h
    watched = bayesian(nn.Sequential(recorder, *net))
    batch = -torch.rand(8, 4)
    fit(watched, mean_field_guide(watched), [(batch, torch.zeros(8, dtype=torch.long))],
        epochs=1, num_particles=2, num_data=8, progress=False, seed=0)  # fmt: skip
    assert seen[-1] == seen[-2]  # the two particles of the one step


class DoubleUnderscore(nn.Module):
    """Sites ``block.fc.*`` and ``block__fc.*``: the guide keys both ``block__fc__*``."""

    def __init__(self):
        super().__init__()
        self.block = nn.Module()
        self.block.fc = nn.Linear(4, 4)
        self.block__fc = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.block__fc(torch.tanh(self.block.fc(x)))))


def test_sites_whose_guide_keys_would_meet_get_one_each(tmp_path):
    torch.manual_seed(0)
    net = DoubleUnderscore()
    model = bayesian(net)
    guide = mean_field_guide(model)
    assert len(guide.loc) == len(guide.rho) == 6  # two sites shared one location before
    assert torch.equal(guide.site_loc("block.fc.weight"), net.block.fc.weight)
    assert torch.equal(guide.site_loc("block__fc.weight"), net.block__fc.weight)
    back = pyrouq.load(pyrouq.save(tmp_path / "m.pt", model, guide), module=DoubleUnderscore())
    for site in model.latent_sites():
        assert torch.equal(back.guide.site_loc(site), guide.site_loc(site)), site


class Versioned(nn.Module):
    """A module that reads its state_dict version on load, as torchvision's MNASNet does (it
    refuses a state without one)."""

    _version = 3

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.loaded_version = None

    def forward(self, x):
        return self.fc(x)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
        self.loaded_version = local_metadata.get("version")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_checkpoints_keep_the_modules_state_dict_versions(tmp_path):
    for i, model in enumerate((Versioned(), bayesian(Versioned()), batchensemble(Versioned(), 2))):
        restored = load(save(tmp_path / f"{i}.pt", model), module=Versioned()).model
        inner = restored if isinstance(restored, Versioned) else restored.net
        assert inner.loaded_version == 3, type(model).__name__


def test_weights_outside_linear_and_conv_stay_point_estimates_unless_selected():
    """README: with select=None, attention's Q/K/V projection, a ViT's tokens and embeddings
    stay point estimates; select=lambda name, p: p.dim() > 1 makes every weight latent."""
    torch.manual_seed(0)
    vit = torchvision.models.VisionTransformer(
        image_size=16, patch_size=8, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16,
        num_classes=3,
    )  # fmt: skip
    attention = "encoder.layers.encoder_layer_0.self_attention."
    default = bayesian(vit)
    assert attention + "in_proj_weight" not in default.latent_sites()
    assert attention + "out_proj.weight" in default.latent_sites()  # a Linear (subclass)
    assert "net." + attention + "in_proj_weight" in dict(default.named_parameters())
    every = bayesian(vit, select=lambda name, p: p.dim() > 1)
    assert (
        set(every.latent_sites())
        == {name for name, p in vit.named_parameters() if p.dim() > 1}
        >= {attention + "in_proj_weight", "class_token", "encoder.pos_embedding"}
    )
    draws = predict(every, torch.randn(2, 3, 16, 16), mean_field_guide(every), num_samples=3,
                    progress=False)  # fmt: skip
    assert draws.probs.shape == (3, 2, 3)


def test_a_prior_to_learn_and_a_positive_prior_on_signed_weights_are_told_what_happens():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    scale = torch.tensor(1.0, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = bayesian(net, prior=dist.Normal(0.0, scale), num_data=4)
    assert [str(w.message) for w in caught] == [
        "The priors of '0.weight', '0.bias', '2.weight', '2.bias' have parameters that require "
        "grad (scale); pyrouq does not learn priors (they are part of the model, not of the "
        "fit): fit() leaves their values as given. Pass plain tensors to silence this."
    ]
    assert not model.site_priors[0].scale.requires_grad and float(model.site_priors[0].scale) == 1
    positive = bayesian(net, prior={"2.bias": dist.HalfNormal(1.0)}, num_data=4)
    below = int((net[2].bias <= 0).sum())
    assert below > 0  # the seed gives this bias a weight that is not positive
    clamped = rf"'2.bias' \({below} of 2\); the network starts changed"
    with pytest.warns(UserWarning, match=r"sites with a prior on \(0, inf\) get a LogNormal "
                      r"guide, .* " + clamped):  # fmt: skip
        guide = mean_field_guide(positive)
    start = net[2].bias.detach().clamp_min(1e-6)
    torch.testing.assert_close(guide.site_loc("2.bias").exp(), start)
