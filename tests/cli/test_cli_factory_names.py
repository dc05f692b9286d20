"""Second look at conformal()'s alpha-in-the-targets'-place refusal and `pyrouq fit`'s factory
checks: an alpha tensor of any floating dtype is shown as its shortest number, a regression's
one target as a 0-d tensor is told the targets' shapes (not to pass it as alpha), a meta tensor
is not read; a typo in the middle of a dotted factory name is told the whole name, close names
are found without running the user's code (a module ``__dir__`` or ``__getattr__`` that fails,
a property), and a network ending in ``.squeeze()`` is refused in the command's words."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from pyrouq import GaussianPredictions, Predictions, conformal
from pyrouq.cli import main


def _one_line_error(capsys, argv):
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    return err


def _class_preds():
    probs = torch.tensor([[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]])[None]
    return Predictions(probs, torch.tensor([0, 1, 1]))


@pytest.mark.parametrize(
    ("dtype", "value", "want"),
    [
        (torch.bfloat16, 0.1, "0.1"),  # bfloat16's 0.1 is 0.10009765625: was 0.100097656
        (torch.bfloat16, 0.05, "0.05"),  # 0.050048828125: was 0.050048828
        (torch.float16, 0.1, "0.1"),
        (torch.float32, 0.3, "0.3"),
        (torch.float64, 0.1 + 2**-40, repr(0.1 + 2**-40)),  # float64: every digit kept
    ],
)
def test_an_alpha_tensor_is_named_by_its_dtypes_shortest_number(dtype, value, want):
    alpha = torch.tensor(value, dtype=dtype)
    with pytest.raises(TypeError) as info:
        conformal(_class_preds(), alpha)
    assert f"pass conformal(val_preds, alpha={want}) (the targets default" in str(info.value)
    # the number shown gives the tensor's value back in its dtype
    assert torch.tensor(float(want), dtype=torch.float64).to(dtype) == alpha


def test_a_meta_tensor_in_the_targets_place_is_not_read():
    # was RuntimeError "Tensor.item() cannot be called on meta tensors"
    with pytest.raises(
        TypeError, match=r"^Expected integer val_targets \(class indices\), got dtype"
    ):
        conformal(_class_preds(), torch.tensor(0.1, device="meta"))


def test_a_regressions_one_target_as_a_0d_tensor_is_told_the_targets_shapes():
    # one calibration input: a 0-d tensor may be its target; it was told "alpha is not the
    # second: pass conformal(val_preds, alpha=0.5)", which drops the target
    one = GaussianPredictions(torch.zeros(1, 1, 1), torch.ones(1, 1, 1))
    with pytest.raises(ValueError) as info:
        conformal(one, torch.tensor(0.5), alpha=0.6)
    assert str(info.value) == (
        "Expected val_targets of shape (1, 1) or (1,), one per input and output, got shape (). "
        "Pass it as one dim, val_targets.reshape(-1)."
    )
    reg = conformal(one, torch.tensor([0.5]), alpha=0.6)  # the shape it names works
    assert reg.threshold.tolist() == [0.5]  # |0.5 - 0| / 1
    # more inputs: a 0-d tensor cannot be their targets, so it is alpha
    three = GaussianPredictions(torch.zeros(1, 3, 1), torch.ones(1, 3, 1))
    with pytest.raises(TypeError, match=r"alpha is not the second: pass conformal\(val_preds, "):
        conformal(three, torch.tensor(0.5))


# factories named through a class, an instance and a failing property


def _net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


class Builders:
    @classmethod
    def build(cls) -> nn.Module:
        return _net()

    @staticmethod
    def make() -> nn.Module:
        return _net()


class _Holder:
    @property
    def explode(self):
        raise RuntimeError("the property ran")

    def build(self) -> nn.Module:
        return _net()


holder = _Holder()


class _AllSqueezed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 1)

    def forward(self, x):
        return self.fc(x.flatten(1)).squeeze()  # (B,) for a batch, () for one image


def all_squeezed() -> nn.Module:
    return _AllSqueezed()


_ME = "test_cli_factory_names"


def test_a_typo_in_the_middle_of_a_factory_name_is_told_the_whole_name(tmp_path, capsys):
    out = str(tmp_path / "run")
    err = _one_line_error(capsys, ["fit", f"{_ME}:Buildrs.build", "--out", out])
    # was "did you mean ...:Builders?", a class whose call builds no network
    assert err.endswith(f" (did you mean '{_ME}:Builders.build'?)\n")
    err = _one_line_error(capsys, ["fit", f"{_ME}:Builders.mak", "--out", out])
    assert err.endswith(f" (did you mean '{_ME}:Builders.make'?)\n")  # a staticmethod
    err = _one_line_error(capsys, ["fit", f"{_ME}:holder.buil", "--out", out])
    assert err.endswith(f" (did you mean '{_ME}:holder.build'?)\n")  # an instance: no property run


def test_close_names_go_through_submodules(tmp_path, capsys, monkeypatch):
    pkg = tmp_path / "r2_review_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import models\n")
    (pkg / "models.py").write_text(
        "from torch import nn\n\ndef make():\n    return nn.Linear(784, 10)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    err = _one_line_error(capsys, ["fit", "r2_review_pkg:modls.make", "--out", str(tmp_path / "o")])
    # was "name a function or class of that module": a module is not callable
    assert err.endswith(
        "(factory 'r2_review_pkg:modls.make') (did you mean 'r2_review_pkg:models.make'?)\n"
    )


@pytest.mark.parametrize(
    ("given", "how"),
    [
        ("ALL_SQUEEZED", "are lower case"),  # was "name a function or class of that module"
        ("all-squeezed", "join their words with '_'"),  # was "did you mean ...?", no why
        ("Builders.Make", "are lower case"),
    ],
)
def test_a_factory_name_that_slipped_in_case_or_joins_is_asked_as_options_are(
    tmp_path, capsys, given, how
):
    err = _one_line_error(capsys, ["fit", f"{_ME}:{given}", "--out", str(tmp_path / "o")])
    meant = given.lower().replace("-", "_").replace("builders", "Builders")
    assert err == (
        f"pyrouq: error: {_ME!r} has no attribute {given!r} (factory '{_ME}:{given}') (did you "
        f"mean {meant.rpartition('.')[2]!r}? the names {how}); name {_ME}:{meant}\n"
    )


@pytest.mark.parametrize(
    ("name", "source", "advice"),
    [
        (  # was a RuntimeError traceback
            "r2_review_dir_fails",
            """
            def __dir__():
                raise RuntimeError("dir broke")

            def tiny():
                pass
            """,
            "; name a function or class of that module that builds the network",
        ),
        (  # a lazy module: its names are not imported (was a RuntimeError traceback)
            "r2_review_lazy",
            """
            def __getattr__(name):
                if name == "heavy":
                    raise RuntimeError("a lazy import failed")
                raise AttributeError(name)

            def __dir__():
                return ["heavy", "tiny"]

            def tiny():
                pass
            """,
            " (did you mean 'r2_review_lazy:tiny'?)",
        ),
    ],
)
def test_close_names_are_read_without_running_the_modules_code(
    tmp_path, capsys, monkeypatch, name, source, advice
):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    err = _one_line_error(capsys, ["fit", f"{name}:tny", "--out", str(tmp_path / "o")])
    assert err == (
        f"pyrouq: error: {name!r} has no attribute 'tny' (factory '{name}:tny'){advice}\n"
    )


def test_a_name_whose_lookup_raises_is_one_line(tmp_path, capsys):
    err = _one_line_error(capsys, ["fit", f"{_ME}:holder.explode", "--out", str(tmp_path / "o")])
    assert err == (
        f"pyrouq: error: getting 'explode' of the factory '{_ME}:holder.explode' raised "
        "RuntimeError: the property ran (get it in Python to see the traceback)\n"
    )


def test_a_network_ending_in_squeeze_is_refused_in_the_commands_words(tmp_path, capsys):
    out = tmp_path / "run"
    # one image gives () through .squeeze(): it was left to fit(), which said to return (B, 1)
    err = _one_line_error(capsys, ["fit", f"{_ME}:all_squeezed", "--out", str(out)])
    assert err == (
        f"pyrouq: error: factory '{_ME}:all_squeezed' builds a network with 1 output per "
        "image; MNIST and Fashion-MNIST have 10 classes: make it output 10 logits\n"
    )
    assert not out.exists()
