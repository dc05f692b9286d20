"""The command line's options as the README writes them: `--data-root` (and `$PYROUQ_DATA`)
naming the data set's own folder, its `raw/`, or a file, is told the folder to give, as the
loaders tell `root=`."""

from __future__ import annotations

from pathlib import Path

import pytest

import pyrouq
from pyrouq.cli import main

#: The bundled copy, in torchvision layout: <root>/MNIST/raw/*.gz
BUNDLED = Path(pyrouq.__file__).resolve().parent / "_data"


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("inside", ["MNIST", "MNIST/raw"])
@pytest.mark.parametrize("command", [["data"], ["fit", "mlp", "--no-progress"]])
def test_a_data_root_inside_the_data_sets_folder_is_told_the_folder_above(
    capsys, tmp_path, inside, command
):
    # before: "pass a --data-root in torchvision layout (DIR/MNIST/raw/...)", where the loaders
    # tell root= the very folder to pass
    out = ["--out", str(tmp_path / "run")] if command[0] == "fit" else []
    err = _error(capsys, [*command, "--data-root", str(BUNDLED / inside), *out])
    assert err.endswith(
        f"To fix: --data-root is the folder above MNIST/: pass --data-root {str(BUNDLED)!r}\n"
    )
    assert not (tmp_path / "run").exists()
    assert main(["data", "--data-root", str(BUNDLED)]) == 0  # the folder it names works
    assert capsys.readouterr().out.startswith("MNIST: train 60000 / test 10000 images")


def test_a_data_root_naming_a_file_is_told_the_folder_that_holds_the_data_set(capsys):
    label_file = BUNDLED / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz"
    err = _error(capsys, ["data", "--data-root", str(label_file)])
    assert err.endswith(
        "To fix: --data-root names a file, not a folder: pass the folder that holds MNIST/, "
        f"{str(BUNDLED)!r}\n"
    )


def test_pyrouq_data_inside_the_data_sets_folder_is_told_what_to_set_it_to(capsys, monkeypatch):
    # before: the loaders said "root= is the folder above MNIST/: pass root=..." of a root=
    # never passed, and the command "point $PYROUQ_DATA ... at a folder in torchvision layout"
    monkeypatch.setenv("PYROUQ_DATA", str(BUNDLED / "MNIST" / "raw"))
    told = f"To fix: $PYROUQ_DATA is the folder above MNIST/: set it to {str(BUNDLED)!r}"
    with pytest.raises(FileNotFoundError) as info:
        pyrouq.load_mnist()
    assert str(info.value).endswith(told + ".")
    assert "root=" not in str(info.value)
    assert _error(capsys, ["data"]).endswith(told + "\n")
    # root= keeps its own words
    with pytest.raises(FileNotFoundError) as info:
        pyrouq.load_mnist(root=BUNDLED / "MNIST")
    assert str(info.value).endswith(
        f"To fix: root= is the folder above MNIST/: pass root={str(BUNDLED)!r}."
    )


@pytest.mark.parametrize("command", ["data", "fit", "evaluate"])
def test_every_subcommands_help_has_a_description_line(command, capsys):
    # `pyrouq data --help` went from its usage straight to its options, the others not
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    paragraphs = capsys.readouterr().out.split("\n\n")
    assert paragraphs[0].startswith(f"usage: pyrouq {command}")
    assert not paragraphs[1].startswith(("options:", "positional arguments:")), paragraphs[1]
    if command == "data":
        assert paragraphs[1].startswith("Load MNIST's train and test splits (from --data-root,")
