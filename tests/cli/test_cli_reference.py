"""`pyrouq fit` / `pyrouq evaluate` against references computed by hand: the figures evaluate
writes (accuracy, NLL, Brier, the LAC conformal threshold and coverage of --conformal) equal
those recomputed from the checkpoint with predict() and the documented seeded split; a user
factory whose name has a typo is told the close names, and one whose network gives one value
per image (a regression's squeezed output) is refused in the command's words (fit() told to
return it as (B, 1), which the command then refused for want of 10 logits)."""

from __future__ import annotations

import json
import math

import pyro
import pytest
import torch
from _cli import one_line_error
from torch import nn

import pyrouq
from pyrouq.cli import main


class _Squeezed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(784, 1)

    def forward(self, x):
        return self.fc(x.flatten(1)).squeeze(-1)


def squeezed() -> nn.Module:  # `pyrouq fit test_cli_reference:squeezed`
    return _Squeezed()


def tiny() -> nn.Module:  # `pyrouq fit test_cli_reference:tiny`
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


def test_a_factory_name_with_a_typo_is_told_the_close_names(capsys):
    err = one_line_error(capsys, ["fit", "_factories:tiny_residul", "--out", "unused"])
    assert (
        "pyrouq: error: '_factories' has no attribute 'tiny_residul' (factory "
        "'_factories:tiny_residul') (did you mean '_factories:tiny_residual'?)\n"
    ) == err
    err = one_line_error(capsys, ["fit", "_factories:zzzz", "--out", "unused"])
    assert err.endswith(
        "(factory '_factories:zzzz'); name a function or class of that module that builds the "
        "network\n"
    )


def test_a_network_with_one_value_per_image_is_refused_in_the_commands_words(tmp_path, capsys):
    out = tmp_path / "run"
    err = one_line_error(capsys, ["fit", "test_cli_reference:squeezed", "--out", str(out)])
    assert err == (
        "pyrouq: error: factory 'test_cli_reference:squeezed' builds a network with 1 output "
        "per image; MNIST and Fashion-MNIST have 10 classes: make it output 10 logits\n"
    )
    assert not out.exists()


def test_evaluate_figures_equal_a_hand_computation_from_the_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["fit", "test_cli_reference:tiny", "--epochs", "1", "--train-size", "64"]
    argv += ["--batch-size", "32", "--seed", "3", "--num-samples", "2", "--no-progress"]
    assert main([*argv, "--out", str(run)]) == 0
    alpha, seed = 0.2, 11
    assert main(["evaluate", str(run), "--ood", "none", "--conformal", str(alpha), "--seed",
                 str(seed), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    got = json.loads((run / "metrics-evaluate.json").read_text())
    # the reference: the checkpoint's model and guide, predict() after seeding as documented
    saved = pyrouq.load(run / "checkpoint.pt", module=tiny())
    _, test = pyrouq.load_mnist(32, seed=3, train_size=64)
    pyro.set_rng_seed(seed)
    probs = pyrouq.predict(saved.model, test.transform(test.images), saved.guide,
                           num_samples=2, progress=False).probs.double()  # fmt: skip
    pbar, labels = probs.mean(0), test.labels
    n = len(labels)
    rows = torch.arange(n)
    onehot = torch.nn.functional.one_hot(labels, 10).double()
    assert got["acc"] == pytest.approx((pbar.argmax(1) == labels).double().mean().item(), abs=0)
    assert got["nll"] == pytest.approx(-pbar[rows, labels].log().mean().item(), rel=1e-5)
    assert got["brier"] == pytest.approx(((pbar - onehot) ** 2).sum(1).mean().item(), rel=1e-5)
    assert 0.2 < got["acc"] < 0.95 and got["seed"] == seed
    # LAC (score 1 - p of the true class) on the seeded half, reported on the other half
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    val, rest = order[: n // 2], order[n // 2 :]
    scores = (1 - pbar[val, labels[val]]).sort().values
    k = math.ceil((len(val) + 1) * (1 - alpha))
    threshold = scores[k - 1].item()
    sets = (1 - pbar[rest]) <= threshold
    lac = got["calibration"]["conformal"]["lac"]
    assert got["calibration"]["validation_size"] == len(val) == 5000
    assert lac["threshold"] == pytest.approx(threshold, abs=1e-6)
    coverage = sets[torch.arange(len(rest)), labels[rest]].double().mean().item()
    assert lac["coverage"] == pytest.approx(coverage, abs=2e-4)  # a float32 tie or two
    assert lac["mean_set_size"] == pytest.approx(sets.sum(1).double().mean().item(), abs=2e-3)
    assert 0.75 < lac["coverage"] < 0.85
    # and evaluate at the run's own seed repeats the figures fit wrote
    fitted = json.loads((run / "metrics.json").read_text())
    assert main(["evaluate", str(run), "--no-progress"]) == 0
    again = json.loads((run / "metrics-evaluate.json").read_text())
    assert {k: again[k] for k in ("acc", "nll", "ece", "ood_auroc")} == {
        k: fitted[k] for k in ("acc", "nll", "ece", "ood_auroc")
    }
