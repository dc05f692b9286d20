"""Audit 7 of the MNIST loaders and the categorical likelihood: what a user typed wrong is told
what was expected and what to do."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import bayesian
from pyrouq.data import load_fashion_mnist, load_mnist, ood_loader
from pyrouq.likelihoods import Categorical, Gaussian, get_likelihood


@pytest.fixture(scope="module")
def test_set():
    return ood_loader(batch_size=64, dataset="mnist").dataset


@pytest.mark.parametrize("index", [[0, 1], slice(0, 2), 1.5, "3", torch.tensor([0, 1])])
def test_a_dataset_index_that_is_no_integer_says_it_takes_one(test_set, index):
    # was: "'<=' not supported between instances of 'int' and 'list'" (or 'slice', 'str'),
    # "slice indices must be integers" for 1.5, "Boolean value of Tensor ... ambiguous"
    with pytest.raises(TypeError, match=r"expected an integer index into a data set of 10000 "):
        test_set[index]


def test_integer_indices_of_numpy_and_torch_read_the_same_example(test_set):
    x, y = test_set[3]
    for index in (np.int64(3), torch.tensor(3), -9997):
        xi, yi = test_set[index]
        assert torch.equal(xi, x) and int(yi) == int(y) == 0  # the 4th MNIST test label is 0
    with pytest.raises(IndexError, match="index 10000 is out of range"):
        test_set[10000]


def test_a_train_size_given_as_a_tensor_is_told_to_pass_a_python_number():
    with pytest.raises(ValueError, match=r"got tensor\(5\) \(a tensor: pass a Python integer"):
        load_mnist(train_size=torch.tensor(5))


@pytest.mark.parametrize(
    "call",
    [
        lambda n: load_mnist(train_size=n),
        lambda n: pyrouq.ArrayLoader(torch.zeros(8, 2), torch.zeros(8), batch_size=n),
        lambda n: pyrouq.train_test_split(torch.zeros(8, 2), torch.zeros(8), seed=n),
        lambda n: pyrouq.plot_reliability(
            torch.tensor([[0.9, 0.1]]), torch.tensor([0]), num_bins=n
        ),
        lambda n: pyrouq.metrics.ece(torch.tensor([[0.9, 0.1]]), torch.tensor([0]), num_bins=n),
    ],
)
def test_an_integer_given_as_a_tensor_is_told_int_t_alone(call):
    # was "e.g. float(t) or int(t)", and float(t), 5.0, was refused as no integer in turn
    with pytest.raises(ValueError, match=r"got tensor\(5\) \(a tensor: pass a Python integer, "
                       r"int\(t\)\)\."):  # fmt: skip
        call(torch.tensor(5))
    with pytest.raises(ValueError, match=r"got 5\.0"):  # what float(t) would have passed
        call(5.0)
    # a tensor holding no integer: int(t) would cut 2.5 to 2 unsaid; told so, as 2.5 is
    with pytest.raises(ValueError, match=r"got tensor\(2\.5000\) \(a tensor holding 2\.5, not an "
                       r"integer\)\."):  # fmt: skip
        call(torch.tensor(2.5))
    with pytest.raises(ValueError, match=r"got 2\.5\b"):
        call(2.5)
    for complex_number, shown in ((2.5 + 0j, r"\(2\.5\+0j\)"), (2 + 1j, r"\(2\+1j\)")):
        with pytest.raises(ValueError, match=rf"\(a tensor holding {shown}, not an integer\)\."):
            call(torch.tensor(complex_number))  # (int(t) gave 2 of both, unsaid)
    # several elements: int(t) raises ("only one element tensors can be converted")
    with pytest.raises(ValueError, match=r"got tensor\(\[5, 6\]\) \(a tensor of shape \(2,\): "
                       r"pass one Python integer\)\."):  # fmt: skip
        call(torch.tensor([5, 6]))
    result = call(int(torch.tensor(5)))  # what it says works
    if hasattr(result, "savefig"):
        import matplotlib.pyplot as plt

        plt.close(result)


@pytest.mark.parametrize("cls", [Categorical, Gaussian])
def test_a_likelihood_class_in_place_of_an_instance_says_to_call_it(cls):
    # was: "Unknown likelihood <class '...Categorical'>", though pyrouq knows it
    message = rf"got the class {cls.__name__} itself: pass an instance, {cls.__name__}\(\)"
    with pytest.raises(ValueError, match=message + rf" \(or the name '{cls.name}'\)"):
        get_likelihood(cls)
    with pytest.raises(ValueError, match=message):
        bayesian(nn.Linear(3, 2), likelihood=cls)
    assert get_likelihood(cls()).name == cls.name  # an instance is taken as before


@pytest.mark.parametrize("inside", ["MNIST", "MNIST/raw", "MNIST/raw/.."])
@pytest.mark.parametrize("download", [False, True])
def test_a_root_naming_the_data_sets_own_folder_names_the_root_above(tmp_path, inside, download):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in (Path(pyrouq.__file__).parent / "_data" / "MNIST" / "raw").glob("*.gz"):
        shutil.copy(f, raw / f.name)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(FileNotFoundError) as err:
        load_mnist(root=tmp_path / inside, download=download)
    assert f"To fix: root= is the folder above MNIST/: pass root={str(tmp_path)!r}." in str(
        err.value
    )
    assert sorted(tmp_path.rglob("*")) == before  # download=True fetched nothing into it
    assert load_mnist(root=tmp_path, batch_size=4)[1].dataset[0][1] == 7  # the root it names


@pytest.mark.parametrize("other", ["data/copy", "data/runs/exp1", "data/MNIST"])
def test_a_root_beside_or_below_the_data_is_not_told_to_go_up(tmp_path, other):
    """A sibling or a deeper folder of a root holding MNIST was told "pass root=<parent>" (and
    download=True skipped); so was the data set's folder when the root above lacks a file."""
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    names = ["train-images-idx3-ubyte.gz"] + ([] if other == "data/MNIST" else ["*.gz"])
    for pattern in names:
        for f in (Path(pyrouq.__file__).parent / "_data" / "MNIST" / "raw").glob(pattern):
            shutil.copy(f, raw / f.name)
    (tmp_path / other).mkdir(parents=True, exist_ok=True)
    with pytest.raises(FileNotFoundError) as err:
        load_mnist(root=tmp_path / other)
    assert "folder above" not in str(err.value)
    assert "To fix: pass a root= in torchvision layout" in str(err.value)


def test_a_relative_root_inside_the_data_set_is_told_the_root_above(tmp_path, monkeypatch):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in (Path(pyrouq.__file__).parent / "_data" / "MNIST" / "raw").glob("*.gz"):
        shutil.copy(f, raw / f.name)
    monkeypatch.chdir(tmp_path / "MNIST")
    with pytest.raises(FileNotFoundError, match=r"pass root='.*'\.$") as err:
        load_mnist(root=".", download=True)  # (downloads nothing into MNIST/MNIST/raw)
    assert str(tmp_path.resolve()) in str(err.value).split("To fix:")[1]
    assert not (tmp_path / "MNIST" / "MNIST").exists()


def test_a_data_set_folder_reached_through_a_link_is_told_the_root_as_named(tmp_path):
    """Resolving the root followed the link: the hint and the download guard were lost."""
    store = tmp_path / "store" / "mnist_v1" / "raw"
    store.mkdir(parents=True)
    for f in (Path(pyrouq.__file__).parent / "_data" / "MNIST" / "raw").glob("*.gz"):
        shutil.copy(f, store / f.name)
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "MNIST").symlink_to(store.parent, target_is_directory=True)
    with pytest.raises(FileNotFoundError) as err:
        load_mnist(root=tmp_path / "ci" / "MNIST", download=True)
    assert str(err.value).endswith(f"pass root={str(tmp_path / 'ci')!r}.")
    assert sorted(p.name for p in store.parent.iterdir()) == ["raw"]  # nothing downloaded


@pytest.mark.parametrize(
    ("load", "folder"), [(load_mnist, "MNIST"), (load_fashion_mnist, "FashionMNIST")]
)
def test_a_download_without_a_network_says_where_the_files_go_and_what_to_do(
    tmp_path, monkeypatch, load, folder
):
    """Offline, download=True raised torchvision's RuntimeError alone, 'Error downloading
    train-images-idx3-ubyte.gz: Tried https://..., got: <urlopen error ...>', naming neither
    the folder the files were to go into nor what to do. (No network used: urlopen fails as
    it does without one.)"""
    import urllib.error
    import urllib.request

    tried = []

    def offline(request, *args, **kwargs):
        tried.append(request.full_url)
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    raw = tmp_path / folder / "raw"
    fix = (
        "leave root=None to use the bundled copy"
        if folder == "MNIST"
        else "for its test split alone, bundled, use fashion_mnist_arrays() or ood_loader()"
    )
    with pytest.raises(RuntimeError) as err:
        load(root=tmp_path, download=True)
    said = str(err.value)
    assert tried  # (torchvision reached the network through the stub, nowhere else)
    assert list(tmp_path.iterdir()) == []  # (torchvision's <root>/<folder>/raw/ was left)
    assert said.startswith(f"download=True could not fetch {folder} into {raw} (RuntimeError: ")
    assert "Name or service not known" in said and "\n" not in said
    assert said.endswith(
        "Where there is no network, copy the files there (torchvision's layout: "
        f"train-images-idx3-ubyte[.gz] and the others), or {fix}."
    )
    if folder == "MNIST":  # the folder named by the environment: unset it
        monkeypatch.setenv("PYROUQ_DATA", str(tmp_path))
        with pytest.raises(RuntimeError, match=r"or unset \$PYROUQ_DATA to use the bundled "):
            load(download=True)
    # root= given where $PYROUQ_DATA is set: root=None alone would read that folder, and so
    # would fashion_mnist_arrays() (told to leave root=None, or to call it: FileNotFoundError)
    monkeypatch.setenv("PYROUQ_DATA", str(tmp_path / "elsewhere"))
    fix = (
        "leave root=None and unset $PYROUQ_DATA to use the bundled copy"
        if folder == "MNIST"
        else "for its test split alone, bundled, unset $PYROUQ_DATA and use "
        "fashion_mnist_arrays() or ood_loader()"
    )
    with pytest.raises(RuntimeError) as err:
        load(root=tmp_path, download=True)
    assert str(err.value).endswith(f"the others), or {fix}.")
    # the folders it made go, a root it made too; what was there before stays
    (tmp_path / folder / "raw").mkdir(parents=True)
    (tmp_path / folder / "raw" / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError):
        load(root=tmp_path / "new" / "root", download=True)
    with pytest.raises(RuntimeError):
        load(root=tmp_path, download=True)
    assert [p.name for p in tmp_path.rglob("*")] == [folder, "raw", "notes.txt"]


def test_a_loader_root_of_fashion_mnists_train_split_alone_is_not_told_to_leave_root_none(
    tmp_path, monkeypatch
):
    """load_fashion_mnist(root=) on a folder of the train split alone (the test split being
    bundled) was told 'leave root=None to use the bundled copy' (or 'unset $PYROUQ_DATA'):
    followed, that fails on the train split, which is not bundled. It is told what the folder
    lacks; fashion_mnist_arrays('test'), which reads that split alone, keeps the advice."""
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    header = (0x803).to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in (2, 28, 28))
    (raw / "train-images-idx3-ubyte").write_bytes(header + bytes(2 * 28 * 28))
    labels = (0x801).to_bytes(4, "big") + (2).to_bytes(4, "big") + bytes([3, 7])
    (raw / "train-labels-idx1-ubyte").write_bytes(labels)
    lacks = "(<root>/FashionMNIST/raw/t10k-images-idx3-ubyte[.gz]) or pass download=True."
    with pytest.raises(FileNotFoundError, match="FashionMNIST test file not found") as err:
        load_fashion_mnist(root=tmp_path)
    assert str(err.value).endswith(f"To fix: pass a root= in torchvision layout {lacks}")
    with pytest.raises(FileNotFoundError, match="FashionMNIST train file not found"):
        load_fashion_mnist()  # (the advice it had: the train split is not bundled)
    monkeypatch.setenv("PYROUQ_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        load_fashion_mnist()
    assert str(err.value).endswith(lacks) and "unset $PYROUQ_DATA" not in str(err.value)
    monkeypatch.delenv("PYROUQ_DATA")
    with pytest.raises(FileNotFoundError, match=r"or leave root=None to use the bundled copy\.$"):
        pyrouq.fashion_mnist_arrays("test", root=tmp_path)  # the test split alone: it is
    assert pyrouq.fashion_mnist_arrays("test")[1].shape == (10000,)


def test_a_data_folder_name_too_long_to_look_up_is_told_what_to_pass(tmp_path, monkeypatch):
    # pathlib's is_file() raised the system's bare OSError (File name too long), which
    # `pyrouq data` with such a $PYROUQ_DATA showed as a traceback
    long = str(tmp_path / ("a" * 256))  # (more than the 255 bytes a name may hold)
    with pytest.raises(pyrouq.data.DataError) as info:
        pyrouq.fashion_mnist_arrays("test", root=long)
    assert str(info.value) == (
        f"Expected a data folder that can be looked up, got root={long!r} (File name too "
        "long). Pass a shorter path, in torchvision layout (<root>/FashionMNIST/raw/...)."
    )
    monkeypatch.setenv("PYROUQ_DATA", long)
    with pytest.raises(ValueError, match=r"got \$PYROUQ_DATA='.*' \(File name too long\)\. "):
        load_mnist(batch_size=64)


def test_a_blank_pyrouq_data_is_refused_as_a_blank_root_is(monkeypatch, capsys):
    # root=" " was refused, but $PYROUQ_DATA=" " was looked up as a folder named " " (a file
    # not found under "<cwd>/ "); an empty one still means the bundled copy
    from pyrouq.cli import main

    told = (
        "Expected $PYROUQ_DATA to be a folder's name, got ' ', a blank one (whitespace only), "
        "which pathlib takes for a folder of that name. Point it at a folder in torchvision "
        "layout (DIR/MNIST/raw/...), or unset it (or set it empty) for the bundled copy."
    )
    monkeypatch.setenv("PYROUQ_DATA", " ")
    with pytest.raises(pyrouq.data.DataError) as info:
        pyrouq.mnist_arrays("test")
    assert str(info.value) == told
    assert main(["data"]) == 2
    assert capsys.readouterr().err == f"pyrouq: error: {told}\n"
    monkeypatch.setenv("PYROUQ_DATA", "")  # as told: set empty, the bundled copy
    assert pyrouq.mnist_arrays("test")[0].shape == (10000, 28, 28)
