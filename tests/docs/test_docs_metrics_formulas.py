"""Docs audit 7: the formulas of docs/metrics.md, recomputed by hand in numpy, against the
library, and a README statement that was imprecise (which `pyrouq fit` refuses --members and
--norms for)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import pyrouq
from pyrouq import metrics
from pyrouq.uncertainty import decompose

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _entropy(p: np.ndarray) -> np.ndarray:
    logs = np.log(np.where(p > 0, p, 1.0))
    return -(p * logs).sum(-1)


def _draws(seed: int, s: int, n: int, c: int, concentration: float) -> np.ndarray:
    p = np.random.default_rng(seed).gamma(concentration, size=(s, n, c))
    return p / p.sum(-1, keepdims=True)


def test_classification_and_ood_metrics_are_the_formulas_of_docs_metrics():
    s, n, c = 4, 41, 5
    p = _draws(0, s, n, c, 0.5)
    p[:, :3] = p[:1, :3]  # inputs whose draws agree
    q = _draws(1, s, 23, c, 0.3)
    y = np.random.default_rng(2).integers(0, c, n)
    pbar = p.mean(0)
    pred, conf = pbar.argmax(-1), pbar.max(-1)
    right = pred == y
    want = {
        "acc": right.mean(),
        "nll": -np.log(np.maximum(pbar[np.arange(n), y], 1e-12)).mean(),
        "brier": ((pbar - np.eye(c)[y]) ** 2).sum(-1).mean(),
    }
    width = np.minimum(np.floor(conf * 15), 14).astype(int)  # equal-width, left-closed
    want["ece"] = sum(
        (width == b).sum() / n * abs(right[width == b].mean() - conf[width == b].mean())
        for b in range(15)
        if (width == b).any()
    )
    order, (q15, r15) = np.argsort(conf, kind="stable"), divmod(n, 15)
    sizes = [q15 + 1] * r15 + [q15] * (15 - r15)  # the larger groups first
    cuts = np.split(order, np.cumsum(sizes)[:-1])
    want["aece"] = sum(len(g) / n * abs(right[g].mean() - conf[g].mean()) for g in cuts if len(g))
    errors = np.cumsum(~right[np.argsort(-conf, kind="stable")])  # no ties in these confidences
    k = np.arange(1, n + 1)
    want["aurc"] = (errors / k).mean()
    want["augrc"] = (errors / n).mean()
    qualifies = k[errors / k <= 0.05]
    want["cov_at_5_risk"] = qualifies.max() / n if qualifies.size else 0.0
    top = math.ceil(0.8 * n)
    want["risk_at_80_cov"] = errors[top - 1] / top
    votes = np.stack([(p.argmax(-1) == j).sum(0) for j in range(c)], -1)
    want["disagreement"] = (1 - (votes * (votes - 1)).sum(-1) / (s * (s - 1))).mean()
    want["expected_entropy"] = _entropy(p).mean()
    want["mutual_information"] = (_entropy(pbar) - _entropy(p).mean(0)).mean()
    a = _entropy(pbar) - _entropy(p).mean(0)  # the default score for S > 1
    o = _entropy(q.mean(0)) - _entropy(q).mean(0)
    want["ood_auroc"] = ((o[None] > a[:, None]) + 0.5 * (o[None] == a[:, None])).mean()
    t = np.unique(np.concatenate([a, o]))[::-1]
    tp = np.array([(o >= tk).sum() for tk in t])
    fp = np.array([(a >= tk).sum() for tk in t])
    recall = tp / len(o)
    want["ood_aupr"] = (np.diff(recall, prepend=0.0) * tp / (tp + fp)).sum()
    want["ood_fpr95"] = fp[np.nonzero(tp >= 0.95 * len(o))[0][0]] / n

    got = metrics.evaluate(torch.tensor(p), torch.tensor(y), ood=torch.tensor(q))
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(float(value), abs=1e-12), key
    one = metrics.evaluate(torch.tensor(p[:1]), torch.tensor(y), ood=torch.tensor(q[:1]))
    auroc = (_entropy(q[0])[None] > _entropy(p[0])[:, None]).mean()  # S = 1: the entropy
    assert one["ood_auroc"] == pytest.approx(auroc, abs=1e-12)
    with pytest.raises(ValueError, match="S = 1"):  # "evaluate refuses them"
        metrics.evaluate(torch.tensor(p[:1]), torch.tensor(y), torch.tensor(q[:1]), "variance")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decompositions_are_the_formulas_of_docs_metrics(dtype):
    p = _draws(3, 5, 17, 4, 0.7)
    p[:, :2] = p[:1, :2]
    pbar = p.mean(0)
    want = {
        "entropy": (_entropy(pbar), _entropy(p).mean(0)),
        "variance": ((pbar * (1 - pbar)).sum(-1), (p * (1 - p)).sum(-1).mean(0)),
        "zero_one": (1 - pbar.max(-1), (1 - p.max(-1)).mean(0)),
    }
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for measure, (total, aleatoric) in want.items():
        d = decompose(torch.tensor(p, dtype=dtype), measure)
        assert d.total.shape == (17,)
        np.testing.assert_allclose(d.total.double().numpy(), total, atol=tol)
        np.testing.assert_allclose(d.aleatoric.double().numpy(), aleatoric, atol=tol)
        assert bool((d.epistemic[:2] == 0).all()), measure  # draws that agree: exactly 0
    bits = decompose(torch.tensor(p), "entropy", base=2)
    np.testing.assert_allclose(bits.total.numpy(), _entropy(pbar) / math.log(2), atol=1e-12)


def test_regression_metrics_are_the_formulas_of_docs_metrics():
    rng = np.random.default_rng(4)
    s, n, d = 3, 7, 2
    loc, scale = rng.normal(size=(s, n, d)), rng.uniform(0.3, 1.5, (s, n, d))
    y = 1.5 * rng.normal(size=(n, d))
    preds = pyrouq.GaussianPredictions(torch.tensor(loc), torch.tensor(scale))
    got = preds.evaluate(torch.tensor(y))

    def cdf(t: np.ndarray) -> np.ndarray:  # the mixture's F at t (n, d), or at (m, n, d)
        z = torch.tensor((t[..., None, :, :] - loc) / scale)
        return (0.5 * torch.erfc(-z / math.sqrt(2))).mean(-3).numpy()

    def quantile(level: float) -> np.ndarray:
        lo, hi = np.full((n, d), -60.0), np.full((n, d), 60.0)
        for _ in range(200):
            mid = (lo + hi) / 2
            below = cdf(mid) < level
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return (lo + hi) / 2

    mean = loc.mean(0)
    log_density = (-0.5 * ((y - loc) / scale) ** 2 - np.log(scale * math.sqrt(2 * math.pi))).sum(-1)
    # CRPS = int F(t)^2 dt below y + int (1 - F(t))^2 dt above it, by the trapezoidal rule
    u = np.linspace(0.0, 40.0, 100_001)[:, None, None]
    below, above = cdf(y - u) ** 2, (1 - cdf(y + u)) ** 2
    ends = (below[0] + below[-1] + above[0] + above[-1]) / 2
    crps = (below[1:-1].sum(0) + above[1:-1].sum(0) + ends) * u[1, 0, 0]
    want = {
        "rmse": np.sqrt(((mean - y) ** 2).mean()),
        "mae": np.abs(mean - y).mean(),
        "nll": -np.log(np.exp(log_density).mean(0)).mean(),
        "crps": crps.mean(),
    }
    for level in (0.5, 0.9, 0.95):
        lo, hi = quantile((1 - level) / 2), quantile((1 + level) / 2)
        key = round(100 * level)
        want[f"coverage_{key}"] = ((y >= lo) & (y <= hi)).mean()
        want[f"width_{key}"] = (hi - lo).mean()
    pit = cdf(y).ravel()
    levels = np.arange(1, 20) / 20
    want["calibration_error"] = np.mean([(lv - (pit <= lv).mean()) ** 2 for lv in levels])
    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(float(value), abs=1e-6), key
    u = preds.uncertainty()
    np.testing.assert_allclose(u.aleatoric.numpy(), (scale**2).mean(0).sum(-1), atol=1e-12)
    np.testing.assert_allclose(u.epistemic.numpy(), loc.var(0).sum(-1), atol=1e-12)  # / S


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["bayesian-lenet", "--members", "4"], "--members"),
        (["mlp", "--members", "2"], "--members"),
        (["rank1-lenet", "--norms", "per_member"], "--norms"),
        (["batchensemble-lenet", "--norms", "shared"], "--norms"),
    ],
)
def test_readme_says_which_models_fit_refuses_members_and_norms_for(
    argv, refused, tmp_path, capsys
):
    # before: "`--members` and `--norms` are refused for other models", where --members is
    # taken by every BatchEnsemble and rank-1 model and --norms only with a factory
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert (
        "`--members` is refused for models that are neither, `--norms` for all but a factory"
        in text
    )
    from pyrouq.cli import main

    assert main(["fit", *argv, "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    assert refused in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
