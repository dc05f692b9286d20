"""Audit of what users read, third round: README blocks that no other test ran (diagnostics,
plots, calibration), the figures the README quotes against docs/measurements.md, and the
command line options the README lists against the parser."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest
import torch

import pyrouq
from pyrouq.data import TensorLoader

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MEASUREMENTS = ROOT / "docs" / "measurements.md"


def _block_after(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"no python block after {heading!r}"
    return match.group(1)


def _subset(loader: TensorLoader, n: int) -> TensorLoader:
    return TensorLoader(
        loader.images[:n], loader.labels[:n], loader.batch_size, shuffle=loader.shuffle,
        flatten=False, normalize=True, seed=0,
    )  # fmt: skip


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The README's Example block, run once on a data subset (batches of 32 of 512 training
    images, 64 test and OOD images): the namespace the later README blocks continue in."""
    real_load, real_ood = pyrouq.load_mnist, pyrouq.ood_loader

    def small_mnist(*args, **kwargs):
        kwargs["batch_size"] = 32
        train, test = real_load(*args, **kwargs, train_size=512)
        return train, _subset(test, 64)

    folder = tmp_path_factory.mktemp("readme")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pyrouq, "load_mnist", small_mnist)
        mp.setattr(pyrouq, "ood_loader", lambda *a, **k: _subset(real_ood(*a, **k), 64))
        mp.chdir(folder)
        namespace: dict = {}
        exec(compile(_block_after("## Example"), str(README), "exec"), namespace)
    return namespace, folder


def test_readme_diagnostics_block_runs_on_the_example_model(example):
    # before: the block used x, y that no block defined, and named `fc3.bias`, a site of the
    # Example's BayesianLeNet but not of the rank-1 LeNet the block directly before it builds
    code = _block_after("### Diagnostics (arviz)")
    # 50 guide draws for k-hat instead of the default 1000: seconds (checked below)
    shortened = code.replace(
        "num_data=result.num_data)", "num_data=result.num_data, num_samples=50)"
    )
    names = re.findall(r"var_names=\[([^\]]*)\]", code)
    assert names, "the block passes var_names"
    namespace = dict(example[0])
    exec(compile(shortened, str(README), "exec"), namespace)
    sites = namespace["model"].latent_sites()
    for listed in names:
        for name in re.findall(r'"([^"]+)"', listed):
            assert name in sites, f"{name!r} is not a site of the model the block runs on"
            assert name in namespace["idata"].posterior
    assert namespace["x"].shape[0] == namespace["y"].shape[0] > 0
    assert namespace["psis"].num_samples == 50 and math.isfinite(namespace["psis"].k_hat)


def test_readme_plots_block_runs_after_the_example(example):
    namespace, folder = dict(example[0]), example[1]
    code = _block_after("### Plots and rotated MNIST")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        quiet = code.replace("guide)", "guide, progress=False)")
        exec(compile(quiet, str(README), "exec"), namespace)
    written = {p.stem for p in (folder / "plots").glob("*.png")}
    assert written == set(namespace["figs"])
    assert [row["angle"] for row in namespace["rows"]] == list(range(0, 181, 15))


def test_readme_calibration_block_runs_with_stand_ins():
    # the block names the user's splits and a small model: stand-ins for them, and the NUTS run
    # shortened (the API calls, arguments and return values are the README's)
    code = _block_after("## Calibration, conformal sets and MCMC")
    shortened = code.replace(
        "num_samples=500, warmup_steps=500", "num_samples=5, warmup_steps=5, progress=False"
    )
    assert shortened != code
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(4, 400, 10, generator=g), -1)
    labels = torch.randint(0, 10, (400,), generator=g)
    torch.manual_seed(0)
    namespace: dict = {
        "pyrouq": pyrouq,
        "val_preds": pyrouq.Predictions(probs[:, :200], labels[:200]),
        "test_preds": pyrouq.Predictions(probs[:, 200:], labels[200:]),
        "small_model": pyrouq.bayesian(torch.nn.Linear(2, 3)),
        "x": torch.randn(30, 2, generator=g),
        "y": torch.randint(0, 3, (30,), generator=g),
        "x_new": torch.randn(5, 2, generator=g),
    }
    exec(compile(shortened, str(README), "exec"), namespace)
    assert namespace["sets"].shape == (200, 10) and namespace["sets"].dtype == torch.bool
    assert namespace["preds"].probs.shape == (4 * 5, 5, 3)  # 4 chains of 5 draws
    assert "sample_stats" in namespace["idata"].groups()


def _measurements() -> str:
    return MEASUREMENTS.read_text(encoding="utf-8")


def test_readme_demo_row_quotes_the_measured_runs_of_that_day():
    # before: "18.6-20.0 s later that day, 4.6 s epochs" of runs measured 22.2 / 20.0 / 18.6 s
    # with epochs 4.6-5.4 s
    runs = re.search(
        r"(\d+\.\d) / (\d+\.\d) / (\d+\.\d) s from the shell in three runs, epochs "
        r"(\d+\.\d)-(\d+\.\d) s",
        _measurements(),
    )
    assert runs, "the measurements page lists the three runs of 2026-12-05, later"
    quoted = re.search(
        r"(\d+\.\d)-(\d+\.\d) s later that day, (\d+\.\d)-(\d+\.\d) s epochs",
        README.read_text(encoding="utf-8"),
    )
    assert quoted, "the README's demo row quotes the later runs as ranges"
    seconds = sorted(float(v) for v in runs.groups()[:3])
    assert (float(quoted[1]), float(quoted[2])) == (seconds[0], seconds[-1])
    assert (quoted[3], quoted[4]) == (runs[4], runs[5])


def test_the_readme_output_the_measurements_name_is_the_one_shown():
    # before: the page said the 2026-12-04 figures (99.02 %, 0.0344, 0.25 %, 0.959) were the
    # output at the top of the README, which shows those of 2026-12-05 (99.00 %, 0.03443, ...)
    readme = README.read_text(encoding="utf-8")
    output = readme[readme.index("```text\npyrouq 0.1.0") :]
    output = output[: output.index("\n```")]

    def cell(row: str) -> str:
        found = re.search(rf"│ {row} +│ +([\d.]+)%? │", output)
        assert found, row
        return found[1]

    entropy = re.search(r"with entropy the AUROC is ([\d.]+)", output)
    assert entropy
    page = _measurements()
    at = page.index("the output shown at the top of the README")
    claim = page[page.rindex("acc ", 0, at) : at]
    assert f"{cell('Acc')} %" in claim
    assert cell("NLL") in claim
    assert f"{cell('ECE')} %" in claim
    assert f"{float(cell('AUROC')) / 100:.3f}" in claim
    assert f"entropy {float(entropy[1]):.3f}" in claim


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+\.\d+", text))


def test_measurements_hold_the_kl_weight_figures_the_readme_quotes():
    # before: the GPU sweep (+0.0033 ± 0.0011, ...), the 10-epoch run (0.2111 against 0.2062)
    # and the exact-ELBO run (88.8 % against 91.0 %) were on no row of the page that the
    # README sends readers to for every measurement's date and machine
    readme = README.read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| `kl_weight` |"))
    page_numbers = [float(v) for v in _numbers(_measurements())]
    missing = []
    for token in sorted(_numbers(row.split(" | ")[2])):
        places = len(token.split(".")[1])
        if not any(round(v, places) == float(token) for v in page_numbers):
            missing.append(token)
    assert not missing, f"README figures on no row of docs/measurements.md: {missing}"


def _fit_options() -> set[str]:
    from pyrouq.cli._parser import _build_parser

    parser = _build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    fit = sub.choices["fit"]
    return {o for a in fit._actions for o in a.option_strings if o.startswith("--")} - {"--help"}


def test_readme_lists_the_fit_options_of_the_parser():
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("### Command line") : readme.index("### Checkpoints")]
    listed = re.search(r"Options: `([^`]*)`", section)
    assert listed, "the README lists pyrouq fit's options"
    options = set(listed[1].split())
    parser_options = _fit_options()
    assert options <= parser_options, options - parser_options
    mentioned = set(re.findall(r"--[a-z][a-z-]*", section))
    assert parser_options <= mentioned, parser_options - mentioned


def test_readme_local_reparameterisation_cost_is_the_measured_one():
    # before: "for about twice the time per step on CPU", where the measurements page (and
    # benchmarks/results.md) has a BayesianLeNet epoch at 2.9x (now 2.46x) that of weight sampling
    readme = " ".join(README.read_text(encoding="utf-8").split())
    quoted = re.search(
        r"for about (\w+) times the time per step on CPU \(a BayesianLeNet epoch ([\d.]+)x", readme
    )
    assert quoted, "the README quotes the measured cost of local reparameterisation"
    row = next(
        line
        for line in _measurements().splitlines()
        if line.startswith("| BayesianLeNet epoch with local reparameterisation")
    )
    measured = re.search(r"\| ([\d.]+)x", row)
    assert measured and quoted[2] == measured[1]
    words = {"two": 2, "three": 3, "four": 4}
    assert words[quoted[1]] == round(float(measured[1]))


def test_readme_select_example_names_sites_of_its_resnet18():
    # before: `select=["layer1"]` "makes `layer1.bn1.weight` latent" and `["layer1.conv1", ...]`
    # names the layers: the names of the tutorial's ResidualCNN, not of the README's resnet18
    # (`layer1.0.bn1.weight`; `layer1.conv1` is refused as matching no parameter)
    torchvision = pytest.importorskip("torchvision")
    text = " ".join(README.read_text(encoding="utf-8").split())
    quoted = re.search(
        r'`select=\["([\w.]+)"\]` makes (?:resnet18\'s )?`([\w.]+)` latent; name the layers, '
        r'`\["([\w.]+)",',
        text,
    )
    assert quoted, "the README shows select= on a module prefix"
    net = torchvision.models.resnet18(num_classes=10)
    assert quoted[2] in pyrouq.bayesian(net, select=[quoted[1]]).latent_sites()
    named = pyrouq.bayesian(net, select=[quoted[3]]).latent_sites()
    assert named and not any(".bn" in name for name in named)


def test_readme_channels_last_speedup_is_the_measured_one():
    # before: "a ResidualCNN step about 1.4x faster", a figure on no row of the measurements
    # page, whose channels-last measurement has `bayesian(ResidualCNN)` training 1.30x faster
    readme = " ".join(README.read_text(encoding="utf-8").split())
    quoted = re.search(r"`bayesian\(ResidualCNN\(\)\)` trains ([\d.]+)x faster", readme)
    assert quoted, "the README quotes channels-last's measured speed-up on the ResidualCNN"
    measured = re.search(
        r"channels-last \(>= 16 channels\): `bayesian\(ResidualCNN\)` training ([\d.]+)x faster",
        _measurements(),
    )
    assert measured and quoted[1] == measured[1]
