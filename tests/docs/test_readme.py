"""The README's example runs as written (on a data subset, so it takes seconds)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import pyrouq
from pyrouq.data import TensorLoader

README = Path(__file__).resolve().parents[2] / "README.md"


def block_after(heading: str) -> str:
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    match = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert match, f"no python block after {heading!r}"
    return match.group(1)


def subset(loader: TensorLoader, n: int) -> TensorLoader:
    return TensorLoader(
        loader.images[:n], loader.labels[:n], loader.batch_size, shuffle=loader.shuffle,
        flatten=False, normalize=True, seed=0,
    )  # fmt: skip


def test_the_example_block_runs(monkeypatch, tmp_path, capsys):
    code = block_after("## Example")
    assert len(code.strip().splitlines()) <= 15
    real_load, real_ood = pyrouq.load_mnist, pyrouq.ood_loader

    def small_mnist(*args, **kwargs):
        train, test = real_load(*args, **kwargs, train_size=1024)
        return train, subset(test, 300)

    monkeypatch.setattr(pyrouq, "load_mnist", small_mnist)
    monkeypatch.setattr(pyrouq, "ood_loader", lambda *a, **k: subset(real_ood(*a, **k), 300))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    printed = capsys.readouterr().out
    assert "Classification" in printed and "OOD" in printed
    preds, u = namespace["preds"], namespace["u"]
    assert preds.probs.shape == (32, 300, 10)
    torch.testing.assert_close(u.total, u.aleatoric + u.epistemic, atol=1e-6, rtol=0)
    restored = namespace["restored"]
    for site in namespace["guide"].sites:
        assert torch.equal(restored.guide.site_loc(site), namespace["guide"].site_loc(site))
    assert (tmp_path / "bayesian-lenet.pt").is_file()


@pytest.mark.parametrize("command", ["pyrouq fit bayesian-lenet --epochs 2"])
def test_make_demo_is_the_documented_command(command):
    makefile = (README.parent / "Makefile").read_text()
    assert f"$(BIN)/{command}" in makefile
    assert f"`{command}`" in README.read_text()


def test_the_your_own_network_block_runs(monkeypatch, tmp_path):
    code = block_after("## Your own network")
    monkeypatch.chdir(tmp_path)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    namespace: dict = {"x": x[:3]}
    namespace["train_loader"] = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=4
    )
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["preds"].probs.shape == (16, 3, 10)
    assert len(namespace["head"].latent_sites()) == 2
    assert namespace["ensemble"].num_members == 4
    restored = namespace["restored"]
    model = namespace["model"]
    for site in model.latent_sites():
        assert torch.equal(restored.guide.site_loc(site), namespace["guide"].site_loc(site))
    with torch.no_grad():  # the BatchNorm point estimates came back too
        model.eval()
        torch.testing.assert_close(model.net.bn1.running_mean, restored.model.net.bn1.running_mean)


def test_the_regression_block_runs(capsys):
    code = block_after("## Regression")
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    printed = capsys.readouterr().out
    assert "│ RMSE" in printed and "│ Coverage 90%" in printed
    preds, u = namespace["preds"], namespace["u"]
    assert preds.loc.shape == (32, 250, 1)
    torch.testing.assert_close(u.total, u.aleatoric + u.epistemic, atol=1e-6, rtol=0)
    metrics = preds.evaluate(namespace["test_y"])
    assert metrics["rmse"] < 0.6 and 0.85 <= metrics["coverage_90"] <= 0.98


def test_the_rank1_block_runs():
    code = block_after("### Rank-1 Bayesian BatchEnsemble")
    train, test = pyrouq.load_mnist(batch_size=256, train_size=512)
    namespace: dict = {"pyrouq": pyrouq, "train": train, "test": subset(test, 64)}
    exec(compile(code, str(README), "exec"), namespace)
    assert namespace["preds"].probs.shape == (32, 64, 10)
    assert namespace["model"].default_kl_weight == 1.0
