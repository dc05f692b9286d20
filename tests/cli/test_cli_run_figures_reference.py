"""Audit of the `pyrouq` command (apart from --resume): a run's figures against predict() and
metrics recomputed by hand from its checkpoint, the printed tables against the saved JSON, the
rotation table's 0-degree row against the main table, seeds, the files of a run folder, bad
input."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from PIL import Image

import pyrouq
from pyrouq.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIT = ["fit", "bayesian-mlp", "--epochs", "1", "--train-size", "512", "--batch-size", "128"]
FIT += ["--num-samples", "2", "--seed", "5", "--no-progress"]
TIMINGS = {"train_seconds", "eval_seconds"}
RUN_FILES = {"metrics.json", "config.json", "checkpoint.pt"} | {
    f"{p}.png"
    for p in (
        "reliability",
        "risk_coverage",
        "image_grid",
        "most_uncertain",
        "uncertainty",
        "training_curves",
    )
}
# format_table's rows: the name printed -> (metrics.json key, shown as a percentage)
ROWS = {
    "Acc": ("acc", True),
    "NLL": ("nll", False),
    "Brier": ("brier", False),
    "ECE": ("ece", True),
    "aECE": ("aece", True),
    "AURC": ("aurc", True),
    "AUGRC": ("augrc", True),
    "Cov@5Risk": ("cov_at_5_risk", True),
    "Risk@80Cov": ("risk_at_80_cov", True),
    "Disagreement": ("disagreement", False),
    "Expected entropy": ("expected_entropy", False),
    "Mutual information": ("mutual_information", False),
    "AUROC": ("ood_auroc", True),
    "AUPR": ("ood_aupr", True),
    "FPR95": ("ood_fpr95", True),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One tiny Bayesian run: (its folder, what fit printed)."""
    out = tmp_path_factory.mktemp("audit11") / "run"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main([*FIT, "--out", str(out)]) == 0
    return out, printed.getvalue()


def _table_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")] if line.startswith("│") else []
        if len(cells) == 2 and cells[0] in ROWS:
            rows[cells[0]] = cells[1]
    return rows


def test_a_run_folder_holds_the_documented_files_as_valid_pngs(run):
    out, _ = run
    assert {p.name for p in out.iterdir()} == RUN_FILES
    for name in RUN_FILES - {"metrics.json", "config.json", "checkpoint.pt"}:
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            low, high = image.convert("L").getextrema()
            assert min(image.size) >= 300 and high - low > 100, name  # drawn, not blank
    readme = (ROOT / "README.md").read_text()
    assert "`fit` writes `metrics.json`, `config.json`, `checkpoint.pt` and PNG plots" in readme


def test_the_printed_tables_are_the_saved_metrics(run):
    out, printed = run
    metrics = json.loads((out / "metrics.json").read_text())
    rows = _table_rows(printed)
    assert set(rows) == set(ROWS)
    for name, (key, percent) in ROWS.items():
        assert rows[name] == format(metrics[key], ".2%" if percent else ".5f"), name
    entropy = re.search(r"with entropy the AUROC is (\d\.\d{4})\)", printed)
    assert entropy and entropy[1] == f"{metrics['ood_auroc_entropy']:.4f}"
    assert "on 512 MNIST images, 1 epoch of 4 batches of 128, device cpu" in printed


def test_fit_figures_equal_predict_and_metrics_recomputed_by_hand(run):
    """The independent reference: the checkpoint's model and guide, predict() with the run's
    seed, and the metrics written out in numpy (mean probabilities, natural logs, 15 bins)."""
    out, _ = run
    metrics = json.loads((out / "metrics.json").read_text())
    saved = pyrouq.load(out / "checkpoint.pt")
    _, test = pyrouq.load_mnist(train_size=512)
    ood = pyrouq.ood_loader(1024, dataset="fashion-mnist")
    pyro.set_rng_seed(5)  # the run's --seed: its draws of the test images, then the OOD's
    probs = pyrouq.predict(saved.model, test.transform(test.images), saved.guide, num_samples=2)
    ood_probs = pyrouq.predict(saved.model, ood.transform(ood.images), saved.guide, num_samples=2)
    p, po = probs.probs.double().numpy(), ood_probs.probs.double().numpy()
    y = test.labels.numpy()
    n = len(y)
    mean = p.mean(0)
    conf, right = mean.max(1), mean.argmax(1) == y
    bins = np.clip(np.ceil(conf * 15).astype(int) - 1, 0, 14)
    ece = sum(
        (bins == b).mean() * abs(conf[bins == b].mean() - right[bins == b].mean())
        for b in range(15)
        if (bins == b).any()
    )

    def entropy(q):
        return -(q * np.log(np.clip(q, 1e-300, None))).sum(-1)

    def mi(q):
        return entropy(q.mean(0)) - entropy(q).mean(0)

    def auroc(inside, outside):  # OOD positive: P(score_out > score_in), ties counted half
        ranked = np.sort(inside)
        below = np.searchsorted(ranked, outside, "left")
        tied = np.searchsorted(ranked, outside, "right") - below
        return (below + 0.5 * tied).sum() / (len(inside) * len(outside))

    order = np.argsort(-conf, kind="stable")
    reference = {
        "acc": right.mean(),
        "nll": -np.log(np.clip(mean[np.arange(n), y], 1e-12, None)).mean(),  # metrics.nll's clamp
        "brier": ((mean - np.eye(10)[y]) ** 2).sum(1).mean(),
        "ece": ece,
        "expected_entropy": entropy(p).mean(),
        "mutual_information": mi(p).mean(),
        "disagreement": (p[0].argmax(1) != p[1].argmax(1)).mean(),
        "aurc": (np.cumsum(1 - right[order]) / np.arange(1, n + 1)).mean(),
        "ood_auroc": auroc(mi(p), mi(po)),
    }
    assert metrics["num_samples"] == 2 and metrics["ood_score"] == "mutual_information"
    assert 0.3 < metrics["acc"] < 0.95 and metrics["mutual_information"] > 0  # a trained BNN
    for key, value in reference.items():
        # metrics.aurc averages over ties of float32 confidences (fewer in float64); the
        # OOD AUROC ranks float32 mutual informations
        tolerance = {"ood_auroc": 1e-4, "aurc": 1e-5}.get(key, 1e-6)
        assert metrics[key] == pytest.approx(value, abs=tolerance), key


def test_evaluate_repeats_fit_and_its_rotation_row_at_0_degrees_repeats_the_table(
    run, tmp_path, capsys
):
    """The rotation sweep drew fresh posterior draws (after the test and OOD images'), so its
    0-degree row, the same test images, read another accuracy than the table just above it
    (one run: 56.30 % against 54.92 %), and the sweep changed with --ood. It now draws the
    table's."""
    out = tmp_path / "run"
    shutil.copytree(run[0], out)  # evaluate writes beside fit's files: keep the fixture's
    fitted = json.loads((out / "metrics.json").read_text())
    assert main(["evaluate", str(out), "--shift", "rotate", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    evaluated = json.loads((out / "metrics-evaluate.json").read_text())
    rotation = evaluated.pop("rotation")
    assert {k: v for k, v in evaluated.items() if k not in TIMINGS} == {
        k: v for k, v in fitted.items() if k not in TIMINGS
    }
    zero = rotation[0]
    assert zero["angle"] == 0.0
    assert zero["acc"] == evaluated["acc"] and zero["ece"] == evaluated["ece"]
    assert zero["epistemic"] == pytest.approx(evaluated["mutual_information"], rel=1e-9)
    table = re.search(r"│\s+0° │\s+([\d.]+)% │\s+([\d.]+)% │", printed)
    assert table and (table[1], table[2]) == (
        f"{100 * zero['acc']:.2f}",
        f"{100 * zero['ece']:.2f}",
    )
    assert _table_rows(printed)["Acc"] == f"{evaluated['acc']:.2%}"
    assert (out / "rotation-evaluate.png").read_bytes()[:4] == b"\x89PNG"
    # without the OOD set's draws first, the sweep is the same
    assert main(["evaluate", str(out), "--shift", "rotate", "--ood", "none", "--no-progress"]) == 0
    capsys.readouterr()
    again = json.loads((out / "metrics-evaluate.json").read_text())["rotation"]
    assert again == rotation


def test_the_same_seed_trains_the_same_run_and_another_seed_another(run, tmp_path, capsys):
    out, _ = run
    assert main([*FIT, "--out", str(tmp_path / "same")]) == 0
    assert main([*FIT[:-3], "--seed", "6", "--no-progress", "--out", str(tmp_path / "other")]) == 0
    capsys.readouterr()

    def figures(folder):
        metrics = json.loads((folder / "metrics.json").read_text())
        return {k: v for k, v in metrics.items() if k not in TIMINGS}

    assert figures(tmp_path / "same") == figures(out)
    assert figures(tmp_path / "other")["nll"] != figures(out)["nll"]
    first, second = (pyrouq.load(f / "checkpoint.pt") for f in (out, tmp_path / "same"))
    for a, b in zip(
        first.guide.state_dict().values(), second.guide.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["fit", "mlp", "--device", "cuda"], "--device cuda asked for CUDA, but torch sees no GPU"),
        (["fit", "mlp", "--device", "gpu"], "--device 'gpu' is not a torch device"),
        (["fit", "mlp", "--train-size", "70000"], "Expected --train-size to be an integer in"),
        (["fit", "mlp", "--kl-weight", "1"], "--kl-weight 1 applies to a Bayesian model"),
        # as typed, not :g's 6 digits ('--num-samples 1e+06', '--kl-weight 0.123457')
        (["fit", "mlp", "--num-samples", "1000000"], "--num-samples 1000000 applies to a Bayes"),
        (["fit", "mlp", "--kl-weight", "0.123456789"], "--kl-weight 0.123456789 applies to a "),
        (["fit", "bayesian-mlp", "--members", "3"], "--members 3 applies to a BatchEnsemble"),
        (["fit", "mlp", "--method", "plain"], "--method applies to a factory"),
        (["fit", "mlp", "--dataset", "fashion-mnist"], "which pyrouq does not bundle"),
        (["evaluate", ""], "RUN_DIR is '', an empty name"),
    ],
)
def test_user_errors_are_one_line_and_exit_code_2(argv, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main([*argv, "--out", str(tmp_path / "x")] if argv[0] == "fit" else argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("pyrouq: error: ") and expected in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert not (tmp_path / "x").exists()  # refused before any run folder is made


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["fit", "mlp", "--num_samples", "4"],
            "unrecognized arguments: --num_samples 4 (see `pyrouq fit --help`)",
        ),
        (
            ["evaluate", "run", "--epochs", "2"],
            "unrecognized arguments: --epochs 2 (see `pyrouq evaluate --help`)",
        ),
        (["fit", "mlp", "--n", "3"], "ambiguous option: --n could match"),
        (["fitt"], "invalid choice: 'fitt' (did you mean 'fit'?) (choose from "),
        (
            ["fit", "mlp", "--dataset", "fashion"],
            "argument --dataset: invalid choice: 'fashion' (did you mean 'fashion-mnist'?) "
            "(choose from 'mnist', 'fashion-mnist') (see `pyrouq fit --help`)",
        ),
        (["fit", "mlp", "--dataset", "fmnist"], "'fmnist' (did you mean 'fashion-mnist'?)"),
        (["evaluate", "run", "--ood", "fashion"], "'fashion' (did you mean 'fashion-mnist'?)"),
        (["fit", "mlp", "--method", "bayes"], "'bayes' (did you mean 'bayesian'?)"),
        (["fit", "mlp", "--dataset", "F-MNIST"], "'F-MNIST' (did you mean 'fashion-mnist'?)"),
        (
            ["fit", "mlp", "--seed", "4294967296"],
            "--seed must be in [0, 2**32 - 1], got 4294967296",
        ),
        (["evaluate", "run", "--conformal", "1.5"], "--conformal must lie in (0, 1)"),
    ],
)
def test_misspelled_and_out_of_range_options_are_one_line_and_exit_code_2(argv, expected, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and expected in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # was: "(did you mean 'fashion-mnist'?)", not a method (the data sets' words, asked of
        # every option's choices)
        (["fit", "mlp", "--method", "fmnist"], "invalid choice: 'fmnist' (choose from 'bayesian'"),
        # was: "(did you mean 'mnist'?)", another data set than the one meant
        (["fit", "mlp", "--dataset", "kmnist"], "invalid choice: 'kmnist' (choose from 'mnist'"),
    ],
)
def test_a_word_for_none_of_an_options_choices_is_not_asked_did_you_mean(argv, expected, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "did you mean" not in err, err
