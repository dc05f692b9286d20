"""Docs audit 11: the code blocks of the README and of docs/*.md that no other test ran, run as
written (smaller data where a block trains on all of MNIST), and the figures they state.

* README "Checkpoints, resume and Ctrl-C": the block called ``fit(..., checkpoint="run.pt")``
  and then ``fit(..., resume_from="run.pt")`` with the same ``epochs``: run as written, the
  second call refused the finished run (a ``ValueError``). The resume call is now the comment
  it describes; uncommented after a Ctrl-C, it ends where the run never stopped would.
* README "Data", "Pyro inside", "BatchEnsemble", colour images and "Command line";
  docs/installation.md's two blocks, docs/kl_weight.md's loop and docs/scaling_out.md's script.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pyro
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq.data import TensorLoader

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def _blocks(path: Path, lang: str = "python") -> list[tuple[str, str]]:
    """(the heading above it, the code) of every ``lang`` block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    out = []
    for match in re.finditer(rf"```{lang}\n(.*?)```", text, re.S):
        headings = re.findall(r"^#+ .*$", text[: match.start()], re.M)
        out.append((headings[-1] if headings else "", match.group(1)))
    return out


def _block(path: Path, heading: str, lang: str = "python", index: int = 0) -> str:
    found = [code for head, code in _blocks(path, lang) if head == heading]
    assert len(found) > index, f"no {lang} block {index} under {heading!r} in {path.name}"
    return found[index]


def _run(code: str, namespace: dict, where: Path) -> dict:
    exec(compile(code, str(where), "exec"), namespace)
    return namespace


def _subset(loader: TensorLoader, n: int, batch_size: int | None = None) -> TensorLoader:
    return TensorLoader(
        loader.images[:n], loader.labels[:n], batch_size or loader.batch_size,
        shuffle=loader.shuffle, flatten=loader.transform.flatten, normalize=True, seed=0,
    )  # fmt: skip


@pytest.fixture
def small_mnist(monkeypatch):
    """load_mnist and ood_loader on subsets (512 training images, 64 test and OOD images): the
    blocks' calls as written, seconds instead of minutes."""
    real_load, real_ood = pyrouq.load_mnist, pyrouq.ood_loader

    def load(*args, **kwargs):
        train, test = real_load(*args, **kwargs, train_size=512)
        return train, _subset(test, 64)

    monkeypatch.setattr(pyrouq, "load_mnist", load)
    monkeypatch.setattr(pyrouq, "ood_loader", lambda *a, **k: _subset(real_ood(*a, **k), 64))


# -- README "Checkpoints, resume and Ctrl-C" ------------------------------------------------------


def _net_and_loader():
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(in_features=6, hidden_features=8, out_features=3)  # a front door
    x = torch.randn(96, 6, generator=torch.Generator().manual_seed(1))
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return model, pyrouq.mean_field_guide(model), pyrouq.ArrayLoader(x, y, batch_size=32, seed=0)


def test_readme_checkpoint_block_runs_and_its_resume_line_continues_an_interrupted_run(
    tmp_path, monkeypatch
):
    # before: the block resumed, with the same epochs, the run its previous line had finished:
    # "resume_from has already completed 10 epochs, but epochs=10: ... nothing to resume"
    code = _block(README, "### Checkpoints, resume and Ctrl-C")
    short = code.replace("epochs=10", "epochs=3, progress=False")
    assert short.count("epochs=3, progress=False") == code.count("epochs=10") >= 2
    monkeypatch.chdir(tmp_path)
    model, guide, train = _net_and_loader()
    namespace = _run(
        short, {"pyrouq": pyrouq, "model": model, "guide": guide, "train": train}, README
    )
    assert namespace["ckpt"].metadata == {"note": "2 epochs"}
    assert namespace["ckpt"].optimizer_state is None  # save() was given no optimizer

    (resume,) = [line for line in short.splitlines() if "resume_from=" in line]
    resume = resume.lstrip("# ")
    # the uninterrupted run of 3 epochs, the reference
    model, guide, train = _net_and_loader()
    torch.manual_seed(5)
    pyrouq.fit(model, guide, train, epochs=3, checkpoint="ref.pt", progress=False)
    reference = {site: guide.site_loc(site).detach().clone() for site in guide.sites}
    # the same run stopped by Ctrl-C at the end of epoch 1, then the README's line
    model, guide, train = _net_and_loader()
    torch.manual_seed(5)

    def ctrl_c(record):
        if record.epoch == 1:
            raise KeyboardInterrupt

    with pytest.raises(pyrouq.TrainingInterrupted):
        pyrouq.fit(model, guide, train, epochs=3, checkpoint="run.pt", progress=False,
                   callbacks=[ctrl_c])  # fmt: skip
    fresh = {"pyrouq": pyrouq, "model": model, "guide": guide, "train": train}
    result = _run(f"result = {resume}", fresh, README)["result"]
    assert [r.epoch for r in result.history] == [1, 2, 3]
    for site, value in reference.items():
        torch.testing.assert_close(guide.site_loc(site), value, rtol=0, atol=1e-6)
    # "a finished run is refused: pass a larger epochs to train on"
    with pytest.raises(ValueError, match="it finished the run it was planned for"):
        _run(resume, fresh, README)
    # "the call without resume_from warns, then starts afresh and writes over the stopped run"
    assert "the call without resume_from warns, then starts afresh" in code
    with pytest.raises(pyrouq.TrainingInterrupted):
        pyrouq.fit(model, guide, train, epochs=3, checkpoint="run.pt", progress=False,
                   callbacks=[ctrl_c])  # fmt: skip
    with pytest.warns(UserWarning, match=r"holds an interrupted run \(1 of 3 epochs done"):
        pyrouq.fit(model, guide, train, epochs=3, checkpoint="run.pt", progress=False)
    assert pyrouq.load("run.pt").training["epochs_done"] == 3
    # "one whose resume_from is another file warns too, then writes that run over the stopped
    # one" (it wrote over it without a word)
    assert "one whose resume_from is another file warns too" in code
    with pytest.raises(pyrouq.TrainingInterrupted):
        pyrouq.fit(model, guide, train, epochs=3, checkpoint="run.pt", progress=False,
                   callbacks=[ctrl_c])  # fmt: skip
    with pytest.warns(UserWarning, match=r"run resumes another \('ref.pt'\), so it writes over"):
        pyrouq.fit(model, guide, train, epochs=4, checkpoint="run.pt", resume_from="ref.pt",
                   progress=False)  # fmt: skip
    assert pyrouq.load("run.pt").training["epochs_done"] == 4


# -- README "Data", "Pyro inside", "BatchEnsemble", colour images, "Command line" ------------------


def test_readme_data_block_runs_and_normalises_with_the_stated_constants(tmp_path, monkeypatch):
    # root="../shared/data" as written: a folder in torchvision layout beside the working one
    code = _block(README, "## Data")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(Path(pyrouq.__file__).parent / "_data")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    namespace = _run(code, {}, README)
    train, test = namespace["train_loader"], namespace["test_loader"]
    assert (len(train.dataset), len(test.dataset), train.batch_size) == (60000, 10000, 256)
    x, _ = next(iter(test))  # the test loader keeps the files' order
    raw, _ = pyrouq.mnist_arrays("test")
    want = (raw[:256].double() / 255 - 0.1307) / 0.3081  # "(0.1307, 0.3081)"
    torch.testing.assert_close(x[:, 0].double(), want, rtol=0, atol=1e-5)
    flat, _ = pyrouq.load_mnist(flatten=True, train_size=2000)
    assert next(iter(flat))[0].shape == (256, 784) and len(flat.dataset) == 2000


def test_readme_pyro_inside_block_runs():
    code = _block(README, "## Pyro inside")
    namespace = _run(code, {"pyrouq": pyrouq}, README)
    x, y = torch.randn(8, 784), torch.arange(8) % 10
    assert torch.isfinite(torch.tensor(namespace["svi"].step(x, y)))
    draws = pyro.infer.Predictive(
        namespace["model"], guide=namespace["guide"], num_samples=16, parallel=True
    )(x)
    assert draws["logits"].shape == (16, 8, 10)


def test_readme_batchensemble_block_runs(small_mnist):
    code = _block(README, "### BatchEnsemble").replace("epochs=5", "epochs=1, progress=False")
    convert, train_and_predict = code.split("pyrouq.fit(", 1)
    train, test = pyrouq.load_mnist(batch_size=256)
    torch.manual_seed(0)
    namespace = _run(convert, {"pyrouq": pyrouq, "train": train, "test": test}, README)
    net, layer = namespace["net"], namespace["ensemble"].net.fc1
    assert torch.equal(layer.weight, net.fc1.weight)  # "copies W and biases"
    assert torch.equal(layer.bias, net.fc1.bias.expand(3, -1))
    for factor in (layer.r, layer.s):  # "r, s ~ N(1, 0.5)": 2,352 and 768 draws
        assert abs(factor.mean().item() - 1) < 0.06 and abs(factor.std().item() - 0.5) < 0.04
    namespace = _run("pyrouq.fit(" + train_and_predict, namespace, README)
    assert namespace["preds"].probs.shape == (3, 64, 10)  # "S = 3 members"


def test_readme_colour_images_block_runs():
    code = _block(README, "### Plots and rotated MNIST", index=1)
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(144, 10)))
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(12, 3, 8, 8), torch.arange(12) % 10
    preds = pyrouq.predict(model, x, guide, num_samples=4, progress=False)
    quiet = code.replace("guide, **cifar)", "guide, progress=False, **cifar)")
    namespace = {"pyrouq": pyrouq, "preds": preds, "x": x, "y": y, "model": model, "guide": guide}
    namespace = _run(quiet, namespace, README)
    assert [row["angle"] for row in namespace["rows"]] == list(range(0, 181, 15))
    import matplotlib.pyplot as plt

    plt.close(namespace["fig"])


def _parser():
    from pyrouq.cli._parser import _build_parser

    return _build_parser()


def test_readme_command_lines_parse_and_name_the_cli_models_and_methods():
    from pyrouq.cli._build import METHODS, MODELS

    code = _block(README, "### Command line", lang="bash")
    parser = _parser()
    lines = [line.split("#")[0].strip() for line in code.splitlines()]
    commands = [shlex.split(line) for line in lines if line.startswith(("pyrouq", "python -m"))]
    assert len(commands) == 8
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    named = {(argv[3:] if argv[0] == "python" else argv[1:])[0] for argv in commands}
    assert named == set(sub.choices), named ^ set(sub.choices)  # (pyrouq data was left out)
    for argv in commands:
        argv = argv[3:] if argv[0] == "python" else argv[1:]
        parser.parse_args([a.replace("...", "x") for a in argv])  # exits on an unknown option
    # "pyrouq fit bayesian-lenet ... # or bayesian-mlp, ..., lenet, mlp": the presets, all of them
    presets = set(re.findall(r"[a-z0-9-]+", "\n".join(code.splitlines()[:2]))) - {"-", "--epochs"}
    presets -= {"pyrouq", "fit", "or", "2"}
    assert presets == set(MODELS), presets ^ set(MODELS)
    methods = re.search(r"--method bayesian +# or ([\w, -]+)", code)
    assert methods is not None
    listed = {"bayesian", *re.split(r",? (?:or )?", methods[1].strip())}
    assert listed == set(METHODS)
    method = next(a for a in sub.choices["fit"]._actions if "--method" in a.option_strings)
    assert set(method.choices) == set(METHODS)


def test_readme_pyrouq_data_line_is_what_it_prints_for_the_bundled_copy(capsys, monkeypatch):
    from pyrouq.cli import main

    readme = " ".join(README.read_text(encoding="utf-8").split())
    quoted = re.search(r"\(`(MNIST: train .*?), \.\.\.\]` for the bundled copy\)", readme)
    assert quoted, "the README quotes what pyrouq data prints"
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    assert main(["data"]) == 0
    assert capsys.readouterr().out.startswith(quoted[1])


# -- docs/installation.md, docs/kl_weight.md, docs/scaling_out.md ---------------------------------


def test_installation_quickstart_block_runs(small_mnist, tmp_path, monkeypatch):
    code = _block(DOCS / "installation.md", "## Quickstart")
    quiet = code.replace("seed=0)  # kl_weight", "seed=0, progress=False)  # kl_weight")
    assert quiet != code
    monkeypatch.chdir(tmp_path)
    namespace = _run(quiet, {}, DOCS / "installation.md")
    u, top = namespace["u"], namespace["most_doubtful"]
    assert set(namespace["metrics"]) >= {"acc", "ece", "ood_auroc"}
    assert top.shape == (10,)
    assert u.epistemic[top].min() >= u.epistemic.sort(descending=True).values[9]


def test_installation_plain_pyro_block_runs_and_its_last_batch_is_96():
    # the comment's arithmetic on the full training set: 60000 = 117 * 512 + 96
    full, _ = pyrouq.load_mnist(batch_size=512, flatten=True)
    assert len(full) == 118 and len(full.dataset) - 117 * 512 == 96
    code = _block(DOCS / "installation.md", "## Quickstart", index=1)
    real = pyrouq.load_mnist

    def first_608(*args, **kwargs):  # 512 + 96 images: two steps, the last batch of 96
        train, test = real(*args, **kwargs, train_size=608)
        return train, test

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pyrouq, "load_mnist", first_608)
        namespace = _run(code, {"pyrouq": pyrouq}, DOCS / "installation.md")
    assert tuple(namespace["samples"]["logits"].shape) == (16, 96, 10)


def test_kl_weight_page_loop_runs_for_one_weight(small_mnist, capsys):
    code = _block(DOCS / "kl_weight.md", "## Measured on MNIST")
    one = code.replace("(0.01, 0.02, 0.1, 1.0, 10.0)", "(0.02,)").replace(
        "seed=0)\n    preds", "seed=0, progress=False)\n    preds"
    )
    assert one.count("(0.02,)") == 1 and "progress=False" in one
    _run(one, {}, DOCS / "kl_weight.md")
    (line,) = capsys.readouterr().out.strip().splitlines()
    values = [float(v) for v in line.split()]
    assert len(values) == 6 and values[0] == 0.02 and 0 <= values[1] <= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scaling_out_script_runs_in_a_group_of_one_rank(tmp_path):
    code = _block(DOCS / "scaling_out.md", "## One node, several nodes")
    quiet = code.replace("seed=0)  # rank r", "seed=0, progress=False)  # rank r")
    assert quiet != code
    prelude = (
        "import pyrouq\n"
        "from pyrouq.data import TensorLoader\n"
        "_load = pyrouq.load_mnist\n"
        "def _small(*a, **k):\n"
        "    train, test = _load(*a, **k, train_size=256)\n"
        "    return train, TensorLoader(test.images[:64], test.labels[:64], 64, shuffle=False,\n"
        "                               flatten=False, normalize=True, seed=0)\n"
        "pyrouq.load_mnist = _small\n"
    )
    script = tmp_path / "script.py"
    script.write_text(prelude + quiet, encoding="utf-8")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "│ Acc" in done.stdout and "│ OOD" not in done.stdout  # evaluate() without ood=


def test_every_make_target_the_docs_name_is_in_the_makefile():
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    texts = [README, *DOCS.glob("*.md"), DOCS / "tutorials" / "index.md"]
    named = set()
    for path in texts:
        named |= set(re.findall(r"`make ([a-z-]+)`", path.read_text(encoding="utf-8")))
        for _, code in _blocks(path, "bash"):
            named |= set(re.findall(r"^make ([a-z-]+)", code, re.M))
    assert {"demo", "test", "lint", "format", "test-slow", "bench", "docs"} <= named
    assert named <= targets, named - targets
