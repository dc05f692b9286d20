"""Audit of data loading: corrupt IDX files, TensorLoader's pixel range and devices, the
bundled copy against the raw files, BatchNorm re-estimation against a hand computation."""

from __future__ import annotations

import copy
import gzip
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pyrouq import bayesian, predict
from pyrouq.data import DataError, TensorLoader, mnist_arrays, normalize
from pyrouq.rotation import rotate

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def _test_split_root(tmp_path: Path) -> Path:
    """A root holding the bundled MNIST test split, plain IDX files."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    bundled = Path(__file__).resolve().parents[2] / "pyrouq" / "_data" / "MNIST" / "raw"
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (raw / name).write_bytes(gzip.decompress((bundled / f"{name}.gz").read_bytes()))
    return tmp_path


def test_a_garbled_gzip_idx_file_is_a_data_error(tmp_path):
    root = _test_split_root(tmp_path)
    raw = root / "MNIST" / "raw"
    (raw / "t10k-labels-idx1-ubyte").unlink()
    # a gzip header, then a deflate block of the reserved type 3: zlib.error, not OSError
    garbled = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\xff" * 32
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(garbled)
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz: .*corrupt or truncated"):
        mnist_arrays("test", root=root)  # it raised zlib.error 'Error -3 while decompressing'


def test_an_idx_file_of_no_examples_is_a_data_error(tmp_path):
    root = _test_split_root(tmp_path)
    raw = root / "MNIST" / "raw"
    header = bytes([0, 0, 8, 3]) + (0).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
    (raw / "t10k-images-idx3-ubyte").write_bytes(header)
    (raw / "t10k-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + (0).to_bytes(4, "big"))
    with pytest.raises(DataError, match=r"holds no data: its header declares shape \(0, 28, 28\)"):
        mnist_arrays("test", root=root)  # it was torch.frombuffer's 'both buffer length (0)...'


def _loader(images, labels=None):
    labels = torch.arange(len(images)) % 10 if labels is None else labels
    return TensorLoader(images, labels, 4, shuffle=False, flatten=False, normalize=True, seed=0)


def test_tensor_loader_refuses_images_normalised_already():
    raw = mnist_arrays("test")[0][:8]
    normalised = normalize(raw)[:, 0]  # in [-0.424, 2.82]: divided by 255 again, ~constant
    with pytest.raises(ValueError, match=r"got values in \[-0.424, 2.82\]: images normalised"):
        _loader(normalised)
    with pytest.raises(ValueError, match=r"got values in \[0, 300\]"):
        _loader(torch.tensor([0, 300], dtype=torch.int16).repeat(2, 14, 1))
    # raw pixels as given stay served as before: rotated ones round a few ulps past 255 ...
    white = torch.cat([raw.float(), torch.full((1, 28, 28), 255.0)])
    rotated = rotate(white.unsqueeze(1), 13, normalized=False)[:, 0]
    assert rotated.max() > 255
    x, _ = next(iter(_loader(rotated)))
    assert torch.allclose(x, (rotated[:4].unsqueeze(1) / 255 - 0.1307) / 0.3081)
    # ... and NaN or inf are left to fit(), which names the examples holding them
    holed = raw.float()
    holed[1, 2, 3] = float("nan")
    holed[2, 2, 3] = float("inf")
    assert _loader(holed).images is holed


def test_tensor_loader_refuses_images_and_labels_on_two_devices():
    images = torch.zeros(6, 28, 28, dtype=torch.uint8, device="meta")  # stands in for a GPU
    labels = torch.zeros(6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"images are on meta and labels on cpu; .*one device"):
        _loader(images, labels)  # it served x on meta beside y on the CPU
    with pytest.raises(ValueError, match=r"images are on cpu and labels on meta"):
        _loader(torch.zeros(6, 28, 28, dtype=torch.uint8), labels.to("meta"))


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs the raw MNIST files of /work/shared/data")
def test_the_bundled_test_split_is_the_raw_files_bit_for_bit():
    def read(path):  # numpy's own reading of an unsigned-byte IDX file
        data = path.read_bytes()
        dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(data[3])]
        return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)

    images, labels = mnist_arrays("test")
    raw = SHARED / "MNIST" / "raw"
    assert np.array_equal(images.numpy(), read(raw / "t10k-images-idx3-ubyte"))
    assert np.array_equal(labels.numpy(), read(raw / "t10k-labels-idx1-ubyte"))


def test_a_bundled_copy_inside_a_zip_archive_is_told_as_such(tmp_path, monkeypatch):
    # pyrouq imported from a zip on sys.path: pathlib cannot look inside it, and the refusal
    # said "pyrouq bundles only MNIST and ...; for the MNIST test split pass root=", of MNIST
    archive = tmp_path / "pyrouq.zip"
    archive.write_bytes(b"PK")
    monkeypatch.setattr("pyrouq._idx._BUNDLED_ROOT", archive / "pyrouq" / "_data")
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    with pytest.raises(FileNotFoundError) as info:
        mnist_arrays("test")
    said = str(info.value)
    assert (
        f"the bundled copy is not a folder on disk: pyrouq was imported from inside the "
        f"file {str(archive)!r} (a zip archive); pass root= (or set $PYROUQ_DATA)" in said
    )
    assert "bundles only" not in said


def test_predict_batchnorm_data_predicts_with_the_average_of_the_batches_statistics():
    """predict(..., batchnorm_data=...) predicts each draw with BatchNorm's running statistics
    re-estimated under that draw: the average of the batches' means and unbiased variances
    (each batch weighted by its size, as SWAG's bn_update; a batch of one input left out), as
    a copy of the network with those statistics set by hand gives. The model keeps its mode and
    buffers."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, momentum=0.3), nn.Linear(4, 2))
    with torch.no_grad():  # statistics and an affine map far from a fresh layer's
        net[1].weight.uniform_(0.5, 2.0)
        net[1].bias.normal_()
        net[1].running_mean.normal_()
        net[1].running_var.uniform_(0.5, 2.0)
        net[1].num_batches_tracked.fill_(7)
    plain = copy.deepcopy(net).eval()
    model = bayesian(net, num_data=10).train()
    before = {name: b.clone() for name, b in model.named_buffers()}
    # two draws: the network's own weights, and others that move the statistics
    draws = {
        site: torch.stack([(w := plain.get_parameter(site).detach()), 2.0 * w + 0.1])
        for site in model.latent_sites()
    }
    inputs = [torch.randn(5, 3), torch.randn(7, 3), torch.randn(1, 3), torch.randn(2, 3)]
    x = torch.randn(6, 3)
    probs = predict(model, x, posterior_samples=draws, batchnorm_data=inputs, progress=False).probs
    expected = []
    for k in range(2):
        ref = copy.deepcopy(plain)
        with torch.no_grad():
            for site, values in draws.items():
                ref.get_parameter(site).copy_(values[k])
            hidden = [ref[0](batch) for batch in inputs if len(batch) > 1]
            rows = sum(len(h) for h in hidden)
            ref[1].running_mean.copy_(sum(len(h) * h.mean(0) for h in hidden) / rows)
            ref[1].running_var.copy_(sum(len(h) * h.var(0) for h in hidden) / rows)
            expected.append(torch.softmax(ref(x), -1))
    torch.testing.assert_close(probs, torch.stack(expected), rtol=1e-5, atol=1e-6)
    assert model.training and net.training and net[1].training and net[1].momentum == 0.3
    after = dict(model.named_buffers())
    assert all(torch.equal(before[name], after[name]) for name in before)
