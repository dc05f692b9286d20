"""Audit 12 of recalibration: temperature scaling against a brute-force grid, the conformal
threshold against the k-th smallest score written out (not numpy's 'higher' quantile, one
rank above), coverage over random splits, and the advice of a temperature at a bound."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from pyrouq import Predictions, TemperatureScaler, conformal, coverage, temperature_scale


def _grid_minimiser(probs: torch.Tensor, y: torch.Tensor) -> float:
    """The T of 2000 log-spaced points in [0.05, 20] of least tempered-mixture NLL, in numpy."""
    logp = np.log(np.clip(probs.double().numpy(), 1e-12, None))
    best, best_t = math.inf, math.nan
    for t in np.exp(np.linspace(math.log(0.05), math.log(20.0), 2000)):
        z = logp / t
        z = z - z.max(-1, keepdims=True)
        logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
        top = logq.max(0)
        mixture = top + np.log(np.exp(logq - top).mean(0))
        nll = -mixture[np.arange(len(y)), y.numpy()].mean()
        if nll < best:
            best, best_t = nll, float(t)
    return best_t


@pytest.mark.parametrize("draws, scale", [(1, 4.0), (1, 0.3), (6, 4.0), (6, 0.4)])
def test_the_temperature_is_the_grid_minimiser_and_tempers_each_draw(draws, scale):
    g = torch.Generator().manual_seed(draws)
    y = torch.randint(0, 4, (150,), generator=g)
    base = torch.randn(150, 4, generator=g)
    base[torch.arange(150), y] += 1.0
    probs = torch.softmax(scale * (base + 0.7 * torch.randn(draws, 150, 4, generator=g)), -1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an inner optimum: no warning
        t = temperature_scale(Predictions(probs, y)).temperature
    assert t == pytest.approx(_grid_minimiser(probs, y), rel=3e-3)  # grid step: 0.3 %
    assert (t > 1) == (scale > 1)  # over-confident softened, under-confident sharpened
    assert temperature_scale(Predictions(probs.double(), y)).temperature == pytest.approx(t)
    scaled = TemperatureScaler(t)(Predictions(probs, y))
    logp = probs.double().clamp_min(1e-12).log()  # below 1e-12: 1e-12, as documented
    by_hand = torch.softmax(logp / t, -1)  # each draw tempered; the mixture their mean
    torch.testing.assert_close(scaled.probs.double(), by_hand, rtol=1e-6, atol=1e-7)
    d = scaled.uncertainty()
    torch.testing.assert_close(d.total, d.aleatoric + d.epistemic)


def test_an_all_right_split_is_told_as_such_not_to_check_its_labels():
    """Every input right: the NLL falls toward 0 as T -> 0, so the search stops at T = 0.05;
    the warning told to check that the labels were the predictions' (wrong labels give
    T = 20, not 0.05) and did not say that T = 0.05 makes new predictions near one-hot."""
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    logits = torch.tensor([[3.0, -3.0], [-3.0, 3.0]])[y]
    for probs in (torch.softmax(logits, -1)[None], torch.softmax(logits * 0.01, -1)[None]):
        with pytest.warns(UserWarning) as caught:
            assert temperature_scale(Predictions(probs, y)).temperature == pytest.approx(0.05)
        text = str(caught[0].message)
        assert (
            "lowest at T = 0.05, the bound of the search [0.05, 20]: the predictions are far "
            "less confident than their accuracy; all 6 validation inputs are predicted right "
            "(by every draw), so the NLL falls toward 0 as T -> 0, with no minimum: T = 0.05 "
            "makes new predictions near one-hot. Fit T on a validation split with errors"
        ) in text
        assert "val_targets" not in text


def test_a_split_with_errors_at_the_lower_bound_is_told_to_check_its_probabilities():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (300,), generator=g)
    logits = torch.randn(300, 3, generator=g) * 2
    logits[torch.arange(300), y] += 2.0  # right 4 times in 5, about; softened 100-fold:
    probs = torch.softmax(logits / 100, -1)[None]  # its best T is about 0.01
    assert 0.5 < float((probs[0].argmax(1) == y).double().mean()) < 1
    with pytest.warns(UserWarning) as caught:
        assert temperature_scale(Predictions(probs, y)).temperature == pytest.approx(0.05)
    text = str(caught[0].message)
    assert (
        "the predictions are far less confident than their accuracy. Check that val_preds "
        "hold the model's probabilities (a softmax applied once, to its logits): T = 0.05 "
        "multiplies their log-odds by 20."
    ) in text
    shuffled = torch.softmax(torch.tensor([[4.0, 0.0]]).repeat(8, 1), -1)[None]
    with pytest.warns(UserWarning, match="Check that val_targets are the labels of val_preds"):
        temperature_scale(Predictions(shuffled, torch.tensor([0, 1] * 4)))  # T = 20: as was


def test_the_commands_words_name_its_options_for_every_warning(monkeypatch):
    """`pyrouq evaluate --calibrate temperature` sets its own words (as it does around its
    call): each warning, at either bound or flat, names --calibrate and none of
    temperature_scale()'s Python names; the factory's, where the run has one."""
    from pyrouq._temperature_warnings import temperature_words
    from pyrouq.cli._temperature_words import in_command_words

    monkeypatch.delenv("PYROUQ_DATA", raising=False)
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (300,), generator=g)
    logits = torch.randn(300, 3, generator=g) * 2
    logits[torch.arange(300), y] += 2.0
    cases = {
        "right": (torch.softmax(logits * 50, -1)[None], logits.argmax(1)),
        "softened": (torch.softmax(logits / 100, -1)[None], y),
        "flat": (torch.full((1, 300, 3), 1 / 3), y),
        "labels": (torch.softmax(logits, -1)[None], (logits.argmax(1) + 1) % 3),
    }
    said = {}
    for factory in (None, "nets:softmax_net"):
        for cause, (probs, labels) in cases.items():
            with pytest.warns(UserWarning) as caught:
                with temperature_words(in_command_words(None, factory)):
                    temperature_scale(Predictions(probs, labels))
            (text,) = [str(w.message) for w in caught]
            assert caught[0].filename == __file__  # the caller's line, as before
            assert text.startswith("--calibrate temperature: the validation NLL is "), text
            assert "leave --calibrate out" in text, text
            for name in ("val_targets", "val_preds", "temperature_scale", "returned"):
                assert name not in text, (name, text)
            said[cause, factory] = text
    assert "T cannot be fitted on a half of the test split without errors" in said["right", None]
    assert said["softened", "nets:softmax_net"].endswith(
        "far less confident than their accuracy. The factory 'nets:softmax_net' must return "
        "logits, which pyrouq turns into probabilities: a network returning probabilities "
        "(ending in nn.Softmax) or shrunken logits gives flatter predictions. T = 0.05 "
        "multiplies their log-odds by 20: make the factory's network return logits and fit "
        "the run again, or leave --calibrate out (T = 1, no change)."
    )
    assert "nets:" not in said["softened", None]
    assert (
        "so T = 1 (no change) is used. The run's model does not tell the images apart: "
        "check its accuracy above (and that the network of 'nets:softmax_net' uses its "
        "input)" in said["flat", "nets:softmax_net"]
    )
    assert said["labels", None].endswith(  # the bundled copy: its labels are right
        "so the flattest T fits best. The run's model tells the classes apart no better than "
        "chance (its accuracy above): train it longer (pyrouq fit --epochs), or leave "
        "--calibrate out (T = 1, no change)."
    )
    with pytest.warns(UserWarning, match="^temperature_scale: .*Check that val_targets"):
        temperature_scale(Predictions(*cases["labels"]))  # outside them: Python's words


@pytest.mark.parametrize("n", [9, 19, 37, 100])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.5, np.float64(0.1), np.float32(0.2)])
def test_the_threshold_is_the_kth_smallest_score_one_below_numpys_higher(n, alpha):
    k = math.ceil((n + 1) * (1 - float(alpha)))
    if k > n:
        with pytest.raises(ValueError, match="calibration points for a finite threshold"):
            conformal(Predictions(torch.full((1, n, 2), 0.5), torch.zeros(n).long()), alpha=alpha)
        return
    rng = np.random.default_rng(n)
    probs = rng.dirichlet(np.ones(4), size=n)
    y = rng.integers(0, 4, n)
    got = conformal(Predictions(torch.tensor(probs)[None], torch.tensor(y)), alpha=alpha)
    scores = 1 - probs[np.arange(n), y]
    assert got.threshold == np.sort(scores)[k - 1]  # bit for bit
    higher = np.quantile(scores, k / n, method="higher")  # index ceil(k (n - 1) / n): k + 1-th
    assert higher == (np.sort(scores)[k] if k < n else np.sort(scores)[k - 1])


def test_marginal_coverage_over_splits_is_k_over_n_plus_one():
    """Labels drawn from their own probabilities: the coverage averages k / (n + 1), inside
    [1 - alpha, 1 - alpha + 1 / (n + 1)], for LAC and the randomised APS alike."""
    g = torch.Generator().manual_seed(0)
    n, m, alpha = 40, 200, 0.1
    k = math.ceil((n + 1) * (1 - alpha))
    covered: dict[str, list[float]] = {"lac": [], "aps": []}
    for split in range(300):
        p = torch.softmax(torch.randn(n + m, 5, generator=g, dtype=torch.float64) * 2, -1)
        y = torch.multinomial(p, 1, generator=g)[:, 0]
        cal, test = Predictions(p[None, :n], y[:n]), Predictions(p[None, n:])
        for score, values in covered.items():
            sets = conformal(cal, alpha=alpha, score=score, seed=split).predict_sets(test)
            values.append(coverage(sets, y[n:]))
    for values in covered.values():
        mean, se = float(np.mean(values)), float(np.std(values)) / math.sqrt(len(values))
        assert abs(mean - k / (n + 1)) < 3 * se  # k / 41 = 0.902; se about 0.003


def test_the_commands_calibration_figures_are_the_python_apis(tmp_path, capsys):
    """`pyrouq evaluate --calibrate temperature --conformal` against the same steps in Python:
    the seeded half split, temperature_scale, conformal on the tempered predictions."""
    import json

    import pyrouq
    from pyrouq.cli import main

    run = tmp_path / "mlp"
    argv = ["fit", "mlp", "--epochs", "1", "--train-size", "64", "--no-progress", "--seed", "2"]
    assert main([*argv, "--out", str(run)]) == 0
    argv = ["evaluate", str(run), "--ood", "none", "--no-progress", "--seed", "5"]
    assert main([*argv, "--calibrate", "temperature", "--conformal", "0.1"]) == 0
    printed = capsys.readouterr().out
    cal = json.loads((run / "metrics-evaluate.json").read_text())["calibration"]
    images, labels = pyrouq.mnist_arrays("test")
    loader = pyrouq.data.TensorLoader(
        images, labels, 512, shuffle=False, flatten=False, normalize=True, seed=0
    )
    model = pyrouq.load(run / "checkpoint.pt").model
    probs = pyrouq.predict(model, loader.transform(images), progress=False).probs
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(5))
    val, rest = order[:5000], order[5000:]
    val_preds, test_preds = Predictions(probs[:, val], labels[val]), Predictions(probs[:, rest])
    scaler = temperature_scale(val_preds)
    assert cal["temperature"] == scaler.temperature
    assert f"temperature {scaler.temperature:.4f}" in printed
    assert cal["after"] == pyrouq.evaluate(scaler(test_preds), labels[rest])
    for score in ("lac", "aps", "raps"):
        predictor = conformal(scaler(val_preds), alpha=0.1, score=score, seed=5)
        sets = predictor.predict_sets(scaler(test_preds))
        row = cal["conformal"][score]
        assert row["threshold"] == predictor.threshold
        assert row["coverage"] == coverage(sets, labels[rest])
        assert row["mean_set_size"] == pyrouq.mean_set_size(sets)
