"""Checkpoint audit: likelihoods a file cannot rebuild, damaged zip headers, symbolic links, and
bit-exact round trips of converted networks of every kind."""

from __future__ import annotations

import os
import struct
import zipfile

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pyrouq import (
    BayesianMLP,
    Categorical,
    CheckpointError,
    Gaussian,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    predict,
    rank1,
    save,
)
from pyrouq.likelihoods import Likelihood


def small_net(out: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, out))


class Tied(nn.Module):
    """Two layers reading one weight matrix."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 3)
        self.b.weight = self.a.weight

    def forward(self, x):
        return self.head(self.b(torch.relu(self.a(x))))


# --------------------------------------------------------------------------------------------
# likelihoods a checkpoint cannot rebuild are refused when saving, not when loading
# --------------------------------------------------------------------------------------------


class HalvedCategorical(Categorical):
    """A Categorical of one's own: a checkpoint would give back the plain one."""

    def nll(self, *args, **kwargs):
        return super().nll(*args, **kwargs) / 2


class Poisson(Likelihood):
    name = "poisson"


def test_save_refuses_a_likelihood_subclass_it_would_give_back_as_its_base(tmp_path):
    model = bayesian(small_net(), likelihood=HalvedCategorical())
    with pytest.raises(
        CheckpointError,
        match=r"cannot describe the likelihood HalvedCategorical, a subclass of Categorical: "
        r"a checkpoint rebuilds only pyrouq's own likelihoods \(Categorical, Gaussian\)",
    ):
        save(tmp_path / "c.pt", model, mean_field_guide(model))
    assert not (tmp_path / "c.pt").exists()
    with pytest.raises(CheckpointError, match=r"likelihood Poisson: a checkpoint rebuilds only"):
        save(tmp_path / "p.pt", batchensemble(small_net(), 2, likelihood=Poisson()))


def test_fit_refuses_a_checkpoint_of_a_likelihood_it_cannot_rebuild_before_training(tmp_path):
    model = bayesian(small_net(), likelihood=HalvedCategorical())
    guide = mean_field_guide(model)
    before = {k: v.clone() for k, v in guide.state_dict().items()}
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randint(0, 3, (8,))), batch_size=4)
    with pytest.raises(CheckpointError, match="a subclass of Categorical"):
        fit(model, guide, data, epochs=1, progress=False, checkpoint=tmp_path / "run.pt")
    assert all(torch.equal(v, before[k]) for k, v in guide.state_dict().items())  # untrained
    assert not (tmp_path / "run.pt").exists()


@pytest.mark.parametrize(
    "prior",
    [dist.HalfNormal(1.0).mask(True), dist.FoldedDistribution(dist.Normal(0.0, 1.0))],
    ids=["masked", "folded"],
)
def test_save_refuses_a_noise_prior_it_cannot_rebuild(tmp_path, prior):
    model = bayesian(small_net(), likelihood=Gaussian(prior))
    with pytest.raises(
        CheckpointError,
        match=r"cannot describe the noise prior of the Gaussian likelihood \((Masked|Folded)"
        r"Distribution\(\)\).*Use such a prior \(HalfNormal, LogNormal",
    ):
        save(tmp_path / "c.pt", model)
    assert not (tmp_path / "c.pt").exists()


# --------------------------------------------------------------------------------------------
# damaged zip headers: a CheckpointError, never a raw zipfile error or uninitialised tensors
# --------------------------------------------------------------------------------------------


def _central_headers(data: bytes, path) -> dict[str, int]:
    """The offset of each entry's central-directory header in the zip archive ``data``."""
    with zipfile.ZipFile(path) as archive:
        offset = archive.start_dir
        names = [info.filename for info in archive.infolist()]
    out = {}
    for name in names:
        assert data[offset : offset + 4] == b"PK\x01\x02"
        name_len, extra_len, comment_len = struct.unpack("<HHH", data[offset + 28 : offset + 34])
        out[name] = offset
        offset += 46 + name_len + extra_len + comment_len
    return out


@pytest.fixture
def saved(tmp_path):
    model = BayesianMLP(in_features=2, hidden_features=3, out_features=2)
    path = save(tmp_path / "good.pt", model, mean_field_guide(model))
    return path, path.read_bytes()


def test_an_entry_marked_as_a_folder_is_refused_not_loaded_as_uninitialised_memory(saved):
    path, data = saved
    headers = _central_headers(data, path)
    tensor = next(name for name in headers if name.endswith("data/0"))
    damaged = bytearray(data)
    damaged[headers[tensor] + 38] |= 0x10  # the MS-DOS folder bit of its external attributes
    bad = path.with_name("folder_bit.pt")
    bad.write_bytes(bytes(damaged))
    # (torch's reader gives such an entry's tensor whatever memory it finds: -2.8e22, ...)
    with pytest.raises(
        CheckpointError,
        match=rf"truncated or corrupted \(its entry '{tensor}' is marked as a folder\)",
    ):
        load(bad)


def test_a_damaged_entry_name_or_end_record_is_refused_as_a_damaged_file(saved):
    path, data = saved
    with zipfile.ZipFile(path) as archive:
        info = archive.infolist()[1]
    name_at = info.header_offset + 30  # the name in the entry's local header
    damaged = bytearray(data)
    damaged[name_at] ^= 0x80  # no longer UTF-8 (was a raw UnicodeDecodeError)
    bad = path.with_name("name.pt")
    bad.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match=r"truncated or corrupted \(its entry .* is unread"):
        load(bad)
    # the zip64 end-record locator's disk number (zipfile: "span multiple disks", a BadZipFile)
    damaged = bytearray(data)
    assert damaged[-42:-38] == b"PK\x06\x07"
    damaged[-38] ^= 0x01
    bad = path.with_name("disks.pt")
    bad.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match=r"truncated or corrupted \(the archive is unread"):
        load(bad)


# --------------------------------------------------------------------------------------------
# writing through a symbolic link
# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_save_through_a_symbolic_link_writes_its_target_and_keeps_the_link(tmp_path):
    model = BayesianMLP(in_features=2, hidden_features=3, out_features=2)
    target = save(tmp_path / "store" / "run.pt", model, metadata={"v": 1})
    link = tmp_path / "latest.pt"
    os.symlink(target, link)
    assert save(link, model, metadata={"v": 2}) == link
    assert link.is_symlink()  # not replaced by a file of its own
    assert load(target).metadata == {"v": 2}
    assert sorted(os.listdir(target.parent)) == ["run.pt"]  # no temporary file left


# --------------------------------------------------------------------------------------------
# bit-exact round trips
# --------------------------------------------------------------------------------------------

_KINDS = {
    "callable-prior": lambda: (
        bayesian(small_net(), prior=lambda n, p: 0.1 if "bias" in n else dist.Laplace(0.0, 2.0)),
        small_net,
    ),
    "dict-prior-last-layer": lambda: (
        bayesian(small_net(), prior={"3.bias": dist.StudentT(3.0, 0.0, 0.5)}, select="last_layer"),
        small_net,
    ),
    "local-reparameterization": lambda: (
        bayesian(small_net(), local_reparameterization=True),
        small_net,
    ),
    "gaussian-learned": lambda: (bayesian(small_net(), likelihood=Gaussian("learned")), small_net),
    "gaussian-latent": lambda: (
        bayesian(small_net(), likelihood=Gaussian(dist.HalfNormal(torch.ones(3)))),
        small_net,
    ),
    "rank1": lambda: (rank1(small_net(), 3), small_net),
    "batchensemble-shared-norms": lambda: (
        batchensemble(small_net(), 3, norms="shared"),
        small_net,
    ),
    "tied": lambda: (bayesian(Tied()), Tied),
    "float64": lambda: (bayesian(small_net().double()), lambda: small_net().double()),
}


@pytest.mark.parametrize("kind", list(_KINDS))
def test_a_converted_network_predicts_bit_identically_after_a_round_trip(tmp_path, kind):
    model, skeleton = _KINDS[kind]()
    if kind == "gaussian-learned":
        model.likelihood.prepare(torch.zeros(1, 3))
    guide = None if kind.startswith("batchensemble") else mean_field_guide(model)
    with torch.no_grad():  # off the skeleton's values, which a wrong load would show
        for module in (model, guide):
            for p in module.parameters() if module is not None else ():
                p.add_(torch.randn_like(p) * 0.1)
    model.eval()
    x = torch.randn(5, 4, dtype=torch.float64 if kind == "float64" else torch.float32)
    draws = 3 if guide is not None else None
    pyro.set_rng_seed(7)
    want = predict(model, x, guide, num_samples=draws, progress=False)
    back = load(save(tmp_path / "c.pt", model, guide), module=skeleton())
    pyro.set_rng_seed(7)
    got = predict(back.model, x, back.guide, num_samples=draws, progress=False)
    fields = ("loc", "scale") if isinstance(model.likelihood, Gaussian) else ("probs",)
    for field in fields:
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert getattr(got, fields[0]).dtype == x.dtype


@pytest.mark.parametrize("kind", ["plain", "bayesian", "batchensemble"])
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_skeleton_built_on_the_meta_device_is_refused_with_the_fix(tmp_path, kind):
    convert = {
        "plain": lambda n: n,
        "bayesian": bayesian,
        "batchensemble": lambda n: batchensemble(n, 2),
    }
    path = save(tmp_path / "c.pt", convert[kind](small_net()))
    with torch.device("meta"):  # (was: a model of meta tensors, or a bare StopIteration)
        skeleton = small_net()
    with pytest.raises(
        CheckpointError,
        match=r"The skeleton \(Sequential\) has tensors on the meta device \('0.weight', "
        r"'0.bias', '1.weight', \.\.\.\), which hold no values.*Build it on the CPU",
    ):
        load(path, module=skeleton)
