"""Audit 7: normalisation layers across pyrouq, checked against the plain torch modules run by
hand with the same weights (running statistics in fit(), per-member and shared norms, the
per-draw re-estimation of predict(batchnorm_data=...)), and batchnorm_data that does not fit."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import fit, mean_field_guide, predict

X = torch.randn(24, 4, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 3, (24,), generator=torch.Generator().manual_seed(1))
LOADER = [(X[i : i + 8], Y[i : i + 8]) for i in range(0, 24, 8)]


def _frozen_optim(params):
    return torch.optim.SGD(params, lr=0.0)  # the weights stay where they started


def _statistics(module, prefix=""):
    return {
        k.removeprefix(prefix): v
        for k, v in module.state_dict().items()
        if k.startswith(prefix) and ("running" in k or "num_batches" in k)
    }


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_batchnorm_data_of_another_shape_than_x_is_named_in_the_error():
    # x is fine, batchnorm_data has 5 features: torch's "mat1 and mat2 shapes cannot be
    # multiplied (8x5 and 4x6)" alone did not say which of the two inputs failed
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)))
    guide = mean_field_guide(model)
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        predict(model, X[:5], guide, num_samples=2, batchnorm_data=torch.randn(8, 5),
                progress=False)  # fmt: skip
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "batch of batchnorm_data, shaped (8, 5)" in note
    assert "training inputs shaped as them" in note
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    model = pyrouq.bayesian(net)
    with pytest.raises(RuntimeError, match="channels") as info:  # 3 channels for 1
        predict(model, torch.randn(4, 1, 2, 2), mean_field_guide(model), num_samples=1,
                batchnorm_data=torch.randn(6, 3, 2, 2), progress=False)  # fmt: skip
    assert "batchnorm_data, shaped (6, 3, 2, 2)" in "\n".join(info.value.__notes__)


@pytest.mark.parametrize(("particles", "vectorize"), [(1, False), (2, False), (2, True)])
def test_fit_updates_running_statistics_once_per_particle_as_torch_would(particles, vectorize):
    # weights held at the guide's means (scale ~ 0, lr 0): every particle's train-mode pass
    # moves the statistics, as the plain network run once per particle and batch does
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Unflatten(1, (2, 2, 1)), nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3, momentum=None),
        nn.ReLU(), nn.InstanceNorm2d(3, affine=True, track_running_stats=True), nn.Flatten(),
        nn.Linear(6, 4), nn.BatchNorm1d(4, affine=False), nn.Linear(4, 3),
    )  # fmt: skip
    plain = copy.deepcopy(net).train()
    model = pyrouq.bayesian(net)
    guide = mean_field_guide(model, init_scale=1e-20)
    fit(model, guide, LOADER, epochs=1, optim=_frozen_optim, num_particles=particles,
        vectorize_particles=vectorize, num_data=24, progress=False)  # fmt: skip
    with torch.no_grad():
        for x, _ in LOADER:
            for _ in range(particles):
                plain(x)
    got, expected = _statistics(model, "net."), _statistics(plain)
    assert got.keys() == expected.keys() and len(got) == 9
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)
    assert int(got["2.num_batches_tracked"]) == 3 * particles


def _member_network(ensemble, net, member):
    """Member ``member`` of ``ensemble`` as a plain copy of ``net``."""
    plain = copy.deepcopy(net)
    for name, layer in ensemble.net.named_modules():
        if hasattr(layer, "effective_weight"):
            with torch.no_grad():
                plain.get_submodule(name).weight.copy_(layer.effective_weight(member))
                plain.get_submodule(name).bias.copy_(layer.bias[member])
        if hasattr(layer, "norms"):
            plain.get_submodule(name).load_state_dict(layer.norms[member].state_dict())
    return plain


@pytest.mark.parametrize("norms", ["per_member", "shared"])
def test_batchensemble_norm_statistics_are_those_of_the_members_own_networks(norms):
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Unflatten(1, (2, 2, 1)), nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3, momentum=None),
        nn.ReLU(), nn.InstanceNorm2d(3, track_running_stats=True), nn.Flatten(),
        nn.Linear(6, 3),
    )  # fmt: skip
    model = pyrouq.batchensemble(net, 3, norms=norms)
    members = [_member_network(model, net, m).train() for m in range(3)]
    fit(model, None, LOADER, epochs=1, optim=_frozen_optim, num_data=24, progress=False)
    with torch.no_grad():
        if norms == "per_member":  # each member's own network on the same batches
            for x, _ in LOADER:
                for plain in members:
                    plain(x)
            for m, plain in enumerate(members):
                for index in (2, 4):
                    got = model.net[index].norms[m].state_dict()
                    for key, value in plain[index].state_dict().items():
                        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)
            return
        # shared: one BatchNorm over the members' rows together, once a step
        bn, inorm = copy.deepcopy(net[2]).train(), copy.deepcopy(net[4]).train()
        for x, _ in LOADER:
            h = torch.cat([plain[:2](x) for plain in members])
            inorm(torch.relu(bn(h)))
    for index, reference in ((2, bn), (4, inorm)):
        got = model.net[index].state_dict()
        for key, value in reference.state_dict().items():
            torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)
    assert int(model.net[2].num_batches_tracked) == 3


@pytest.mark.parametrize("norms", ["shared", "per_member"])
def test_rank1_batchnorm_data_is_a_hand_reestimate_per_draw(norms):
    # reset, momentum None, train-mode passes on the data under the draw's factors, then eval
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Flatten(), nn.Linear(36, 3))  # fmt: skip
    model = pyrouq.rank1(net, 2, norms=norms)
    guide = mean_field_guide(model, init_scale=0.3)
    with torch.no_grad():
        draws = [guide.sample() for _ in range(2)]
    samples = {k: torch.stack([d[k] for d in draws]) for k in model.latent_sites()}
    train, x = torch.randn(12, 2, 3, 3), torch.randn(5, 2, 3, 3)
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    got = predict(model, x, posterior_samples=samples, batchnorm_data=train, batch_size=4,
                  progress=False).probs  # fmt: skip
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == (1 if norms == "shared" else 2)
    expected = []
    for s in range(2):
        draw = {k: v[s] for k, v in samples.items()}
        model.eval()
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None
            bn.train()
        with torch.no_grad():
            for batch in train.split(4):
                model.outputs(batch, draw)
            model.eval()
            expected.append(torch.softmax(model.outputs(x, draw), -1))
        model.load_state_dict(kept)
        for bn in bns:
            bn.momentum = 0.1
    torch.testing.assert_close(got, torch.cat(expected), rtol=0, atol=1e-6)  # draw-major
