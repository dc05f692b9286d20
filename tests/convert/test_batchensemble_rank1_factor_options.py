"""Fifth audit of BatchEnsemble and rank-1: ``use_base_weights=False`` keeps a frozen bias (it
was re-initialised and stayed frozen at random values), and factor means / stds whose draws the
layer's dtype cannot hold are refused (inf factors gave NaN outputs, found only at predict())."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from pyrouq import BatchEnsembleLeNet, BatchEnsembleMLP, batchensemble, load, rank1, save
from pyrouq.nn import BatchEnsembleLinear


@pytest.mark.parametrize(
    "make_layer", [lambda: nn.Linear(4, 3), lambda: nn.Conv2d(2, 3, 3)], ids=["linear", "conv"]
)
def test_use_base_weights_false_keeps_a_frozen_bias(make_layer):
    torch.manual_seed(0)
    layer = make_layer()
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([0.25, -1.5, 3.0]))
    layer.bias.requires_grad_(False)  # a trainable weight, a frozen bias
    weight = layer.weight.detach().clone()
    ensemble = batchensemble(nn.Sequential(layer), 2, use_base_weights=False)
    converted = ensemble.net[0]
    assert not torch.equal(converted.weight, weight)  # the trainable weight: re-initialised
    assert converted.weight.requires_grad
    assert not converted.bias.requires_grad  # the frozen bias: frozen, at its values
    expected = torch.tensor([[0.25, -1.5, 3.0]] * 2)
    assert torch.equal(converted.bias.detach(), expected)
    assert torch.equal(layer.bias, expected[0])  # the module itself is left untouched
    model = rank1(nn.Sequential(layer), 2, use_base_weights=False)  # rank1() takes this path
    assert torch.equal(model.net[0].bias.detach(), expected)


def test_factor_means_and_stds_a_dtype_cannot_hold_are_refused():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    held = r"float32 layer holds \(at most 3\.4e\+38 in magnitude\), got r_mean=1e\+39, r_std=0\.5"
    with pytest.raises(ValueError, match=rf"r_mean and r_std whose draws a torch\.{held}"):
        batchensemble(net, 2, r_mean=1e39)  # inf in float32 (every output was NaN)
    with pytest.raises(ValueError, match=r"torch\.float16 layer .*s_mean=1\.0, s_std=70000\.0"):
        batchensemble(nn.Sequential(nn.Linear(4, 3)).half(), 2, s_std=7e4)
    with pytest.raises(
        ValueError, match=r"r_mean=70000\.0.*would come out inf. Pick a smaller mean"
    ):
        BatchEnsembleLinear(4, 3, 2, base=nn.Linear(4, 3).half(), r_mean=7e4)
    with pytest.raises(ValueError, match=r"torch\.float16 layer .*r_std=70000\.0"):
        rank1(nn.Sequential(nn.Linear(4, 3)).half(), 2, r_std=7e4)
    # what the dtype holds is taken: float64 holds 1e39, float16 1e4
    wide = batchensemble(net.double(), 2, r_mean=1e39, r_std=0.0)
    assert torch.equal(wide.net[0].r, torch.full((2, 4), 1e39, dtype=torch.float64))
    half = batchensemble(nn.Sequential(nn.Linear(4, 3)).half(), 2, s_mean=1e4, s_std=0.0)
    assert torch.equal(half.net[0].s, torch.full((2, 3), 1e4, dtype=torch.float16))
    # random_sign draws +-1 whatever the (unused, warned of) means
    with pytest.warns(UserWarning, match=r"r_mean=70000\.0 is ignored"):
        signs = batchensemble(
            nn.Sequential(nn.Linear(4, 3)).half(), 2, r_mean=7e4, init="random_sign"
        )
    assert set(signs.net[0].r.flatten().tolist()) <= {-1.0, 1.0}


def test_the_factor_check_reads_no_tensor_so_fake_and_meta_layers_build():
    # the check read the drawn factors (bool(isfinite(...))): under FakeTensorMode, a
    # data-dependent output torch refuses
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        layer = BatchEnsembleLinear(4, 3, 2, base=nn.Linear(4, 3))
    assert isinstance(layer.r, FakeTensor) and layer.r.shape == (2, 4)
    meta = BatchEnsembleLinear(4, 3, 2, base=nn.Linear(4, 3, device="meta"))
    assert meta.r.is_meta


RANDOM_SIGN_IGNORES = r"init='random_sign' sets every factor entry to \+1 or -1 and reads no mean"


@pytest.mark.parametrize(
    "build",
    [
        lambda **o: batchensemble(nn.Sequential(nn.Linear(4, 3)), 2, **o),
        lambda **o: BatchEnsembleMLP(4, 5, 3, num_members=2, **o),
        lambda **o: BatchEnsembleLeNet(num_classes=3, num_members=2, **o),
        lambda **o: BatchEnsembleLinear(4, 3, 2, **o),
        lambda **o: rank1(nn.Sequential(nn.Linear(4, 3)), 2, **o),
    ],
    ids=["batchensemble", "mlp", "lenet", "layer", "rank1"],
)
def test_random_sign_warns_once_of_the_normal_options_it_does_not_read(build):
    # they were ignored in silence: r_std=0.1 with init="random_sign" drew +-1 all the same
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build(init="random_sign", r_std=0.1, s_std=0.0)
    told = [str(w.message) for w in caught if "random_sign" in str(w.message)]
    assert len(told) == 1  # once, not once per layer
    assert "r_std=0.1, s_std=0.0 are ignored. Leave them out, or pass init='normal'" in told[0]
    assert caught[0].filename == __file__  # the user's line
    held = [*model.named_parameters(), *model.named_buffers()]  # (rank-1's: buffers)
    factors = [p for name, p in held if name.split(".")[-1] in ("r", "s")]
    assert factors and all(set(p.detach().abs().flatten().tolist()) == {1.0} for p in factors)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the defaults, or init="normal": no warning
        build(init="random_sign")
        build(init="normal", r_std=0.1, s_std=0.0)


def test_a_saved_random_sign_ensemble_with_unread_options_loads_without_the_warning(tmp_path):
    with pytest.warns(UserWarning, match=RANDOM_SIGN_IGNORES):
        model = BatchEnsembleMLP(4, 5, 3, num_members=2, init="random_sign", r_mean=0.5)
    with pytest.warns(UserWarning, match=RANDOM_SIGN_IGNORES):
        other = batchensemble(nn.Sequential(nn.Linear(4, 3)), 2, init="random_sign", s_std=0.1)
    for saved in (model, other):
        path = save(tmp_path / "m.pt", saved)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned when it was built, not at every load
            back = (
                load(path, module=nn.Sequential(nn.Linear(4, 3))) if saved is other else load(path)
            )
        assert back.model.options == saved.options
