"""How the in-memory loaders gather a batch's rows, and what the data commands tell a user about
the folder to give: TensorLoader and ArrayLoader serve, for inputs of odd dtypes and layouts,
the very rows ``t[index]`` picks (values, dtype, shape and strides), and `--data-root` (or
`$PYROUQ_DATA`) naming a folder inside the data set's is told the folder above as it is written,
even where its path holds ``root=``; a `pyrouq fit` factory naming a class in the wrong case
is asked whether it meant the class; normalize() of float images on the meta device is told
their dtype."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import pyrouq
from pyrouq.cli import main
from pyrouq.data import TensorLoader, normalize
from pyrouq.tabular import ArrayLoader

#: The bundled copy, in torchvision layout: <root>/MNIST/raw/*.gz
BUNDLED = Path(pyrouq.__file__).resolve().parent / "_data"
N, BATCH, SEED = 23, 5, 4  # 4 full batches and one of 3


def _reference(n, shuffle, world=1, rank=0):
    """One epoch's indices as the loaders document them: a randperm of a generator seeded with
    ``SEED`` (or 0..n-1), padded with its first indices to a multiple of ``world``, every
    ``world``-th from ``rank``."""
    g = torch.Generator().manual_seed(SEED)
    order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
    pad = -(-n // world) * world - n
    return torch.cat([order, order[:pad]])[rank::world]


def _same(got, want):
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert got.requires_grad == want.requires_grad
    assert torch.equal(got.detach(), want.detach())


def _odd_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, 2, 2, generator=g)
    y = torch.randint(0, 5, (N,), generator=g)
    size1 = torch.randn(N, 5, generator=g).as_strided((N, 1, 5), (5, 99, 1))  # contiguous
    return {
        "channels_last": (x.contiguous(memory_format=torch.channels_last), y),
        "float64": (x.double(), torch.randn(N, 2, generator=g).double()),
        "float16_int32": (x.half(), y.int()),
        "bfloat16_uint8": (x.bfloat16(), y.to(torch.uint8)),
        "strided_expanded": (torch.randn(N, 8, generator=g)[:, ::2], y[:, None].expand(N, 3)),
        "rows_transposed": (torch.randn(4, N, generator=g).t(), y),
        "size1_odd_stride": (size1, y.unsqueeze(1)),
        "offset_view": (torch.randn(N + 3, 4, generator=g)[3:], y),
        "no_columns": (torch.randn(N, 0, generator=g), y),
        "parameter": (torch.nn.Parameter(torch.randn(N, 3, generator=g)), y),
    }


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("case", sorted(_odd_inputs()))
def test_array_loader_batches_are_the_rows_indexing_picks(case, shuffle, world):
    x, y = _odd_inputs()[case]
    loader = ArrayLoader(x, y, BATCH, shuffle=shuffle, seed=SEED)
    with loader.sharded(world - 1, world):
        batches = list(loader)
    order = _reference(N, shuffle, world, world - 1)
    assert [len(b[1]) for b in batches] == [
        len(order[s : s + BATCH]) for s in range(0, len(order), BATCH)
    ]
    for (bx, by), start in zip(batches, range(0, len(order), BATCH), strict=True):
        index = order[start : start + BATCH]
        _same(bx, x[index])
        _same(by, y[index])


@pytest.mark.parametrize(
    "case", ["uint8_transposed", "float64", "float16_int32_labels", "strided_labels", "bool"]
)
def test_tensor_loader_batches_are_the_rows_indexing_picks(case):
    g = torch.Generator().manual_seed(1)
    raw = torch.randint(0, 256, (N, 4, 3), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (N,), generator=g)
    images, labels = {
        "uint8_transposed": (raw.transpose(1, 2), labels),
        "float64": (raw.double(), labels),
        "float16_int32_labels": (raw.half(), labels.int()),
        "strided_labels": (raw, torch.randint(0, 10, (N, 2), generator=g)[:, 1]),
        "bool": (raw > 128, labels),
    }[case]
    loader = TensorLoader(
        images, labels, BATCH, shuffle=True, flatten=False, normalize=False, seed=SEED
    )
    order = _reference(N, True)
    assert len(loader) == 5  # 4 full batches and one of 3
    for (bx, by), start in zip(loader, range(0, N, BATCH), strict=True):
        index = order[start : start + BATCH]
        # the documented scaling of t[index], by hand: float32 pixels / 255, one channel
        _same(bx, (images[index].to(torch.float32) / 255).unsqueeze(1))
        _same(by, labels[index])


def _told(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("pyrouq: error: "), err
    return err.rstrip("\n").split(" To fix: ")[1]


@pytest.mark.skipif(sys.platform == "win32", reason="a symbolic link to the bundled copy")
def test_a_data_root_whose_path_holds_root_equals_is_told_that_path(capsys, tmp_path, monkeypatch):
    # before: every "root=" of the loaders' fix became "--data-root ", the folder's own name
    # too: "pass --data-root '.../data_--data-root 1'" (a Hydra-style run folder, key=value)
    home = tmp_path / "data_root=1"
    home.mkdir()
    (home / "MNIST").symlink_to(BUNDLED / "MNIST", target_is_directory=True)
    assert _told(capsys, ["data", "--data-root", str(home / "MNIST")]) == (
        f"--data-root is the folder above MNIST/: pass --data-root {str(home)!r}"
    )
    label_file = home / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    assert _told(capsys, ["data", "--data-root", str(label_file)]) == (
        f"--data-root names a file, not a folder: pass the folder that holds MNIST/, {str(home)!r}"
    )
    monkeypatch.setenv("PYROUQ_DATA", str(home / "MNIST" / "raw"))
    assert _told(capsys, ["data"]) == (
        f"$PYROUQ_DATA is the folder above MNIST/: set it to {str(home)!r}"
    )
    monkeypatch.delenv("PYROUQ_DATA")
    assert main(["data", "--data-root", str(home)]) == 0  # the folder it names works
    assert capsys.readouterr().out.startswith("MNIST: train 60000 / test 10000 images")


def test_a_class_factory_name_slipped_in_case_is_asked_did_you_mean(tmp_path, capsys, monkeypatch):
    # the data commands' factory: "TINYNET" for the class TinyNet was told only "name a function
    # or class of that module that builds the network" (difflib matches case as written)
    (tmp_path / "w22_case_nets.py").write_text(
        "from torch import nn\n\n\nclass TinyNet(nn.Sequential):\n    def __init__(self):\n"
        "        super().__init__(nn.Flatten(), nn.Linear(784, 10))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for given in ("TINYNET", "tinynet", "Tiny_Net"):
        argv = ["fit", f"w22_case_nets:{given}", "--out", str(tmp_path / "run"), "--no-progress"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (
            f"pyrouq: error: 'w22_case_nets' has no attribute {given!r} (factory "
            f"'w22_case_nets:{given}') (did you mean 'w22_case_nets:TinyNet'?)\n"
        )
    assert not (tmp_path / "run").exists()


def test_normalize_of_meta_floats_is_told_the_dtype_not_a_meta_read():
    # before: RuntimeError "Tensor.item() cannot be called on meta tensors", from the look at
    # the values that tells raw pixels held as floats (meta tensors have none)
    with pytest.raises(TypeError) as info:
        normalize(torch.empty(2, 28, 28, device="meta"))
    assert str(info.value) == (
        "Expected raw integer pixels in [0, 255] (e.g. uint8), got dtype torch.float32: these "
        "images look normalised already; pass them to the network as they are."
    )
