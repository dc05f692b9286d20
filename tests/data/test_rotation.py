"""Rotated MNIST: pyrouq.rotation.rotate and evaluate_rotations."""

from __future__ import annotations

import math
import time

import numpy as np
import pyro
import pytest
import torch

from pyrouq import metrics
from pyrouq.data import MNIST_MEAN, MNIST_STD, NORMALIZED_BLACK, mnist_arrays
from pyrouq.infer import mean_field_guide
from pyrouq.models import MLP, BayesianMLP
from pyrouq.plotting import plot_rotation
from pyrouq.predictive import predict
from pyrouq.rotation import evaluate_rotations, format_rotation_table, rotate
from pyrouq.uncertainty import decompose


@pytest.fixture(scope="module")
def raw():
    """Eight MNIST test digits, float in [0, 1], (8, 1, 28, 28)."""
    return mnist_arrays("test")[0][:8].float().div(255).unsqueeze(1)


def _normalise(x):
    return (x - MNIST_MEAN) / MNIST_STD


# ---------------------------------------------------------------------------------------------
# rotate


def test_zero_and_full_turns_are_the_identity(raw):
    out = rotate(raw, 0)
    assert torch.equal(out, raw) and out is not raw
    for angle in (360, -360.0, 720):
        torch.testing.assert_close(rotate(raw, angle), raw)


def test_four_quarter_turns_are_the_identity(raw):
    x = _normalise(raw)
    out = x
    for _ in range(4):
        out = rotate(out, 90)
    assert torch.equal(out, x)  # square images: quarter turns permute the pixels exactly
    assert torch.equal(rotate(rotate(x, 90), -90), x)
    assert torch.equal(rotate(x, 180), x.flip(-1, -2))
    # non-square images go through the bilinear sampler
    wide = torch.rand(2, 1, 6, 10)
    torch.testing.assert_close(rotate(wide, 180), wide.flip(-1, -2), atol=1e-5, rtol=0)
    twice = rotate(rotate(wide, 90, normalized=False), -90, normalized=False)
    torch.testing.assert_close(twice[..., 2:4], wide[..., 2:4], atol=1e-5, rtol=0)  # interior


def test_counter_clockwise():
    x = torch.zeros(1, 1, 5, 5)
    x[0, 0, 0, 2] = 1.0  # top centre
    turned = rotate(x, 90, normalized=False)[0, 0]
    expected = torch.zeros(5, 5)
    expected[2, 0] = 1.0  # middle left
    torch.testing.assert_close(turned, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("angle", [30, -45, 137.5])
def test_matches_torchvision_bilinear_on_raw_images(raw, angle):
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.functional import rotate as tv_rotate

    bilinear = InterpolationMode.BILINEAR
    expected = tv_rotate(raw, angle, interpolation=bilinear)
    torch.testing.assert_close(rotate(raw, angle, normalized=False), expected, atol=1e-5, rtol=0)
    wide = raw[:2, :, 4:24, :]  # non-square (20 x 28)
    expected = tv_rotate(wide, angle, interpolation=bilinear)
    torch.testing.assert_close(rotate(wide, angle, normalized=False), expected, atol=1e-5, rtol=0)


def test_background_is_black_in_raw_pixel_space(raw):
    white = torch.ones(2, 1, 28, 28)
    assert rotate(white, 45, normalized=False)[0, 0, 0, 0] == 0.0  # corner rotated in
    normalised_white = _normalise(white)
    corner = rotate(normalised_white, 45)[0, 0, 0, 0]
    assert corner == pytest.approx(NORMALIZED_BLACK) and NORMALIZED_BLACK == pytest.approx(
        -0.4242, abs=1e-4
    )
    # rotating normalised images = normalising rotated raw images
    torch.testing.assert_close(
        rotate(_normalise(raw), 33),
        _normalise(rotate(raw, 33, normalized=False)),
        atol=1e-5,
        rtol=0,
    )


def test_shapes_dtypes_and_layouts(raw):
    x = _normalise(raw)
    four_d = rotate(x, 60)
    flat = rotate(x.flatten(1), 60)
    three_d = rotate(x[:, 0], 60)
    assert flat.shape == (8, 784) and three_d.shape == (8, 28, 28)
    torch.testing.assert_close(flat, four_d.flatten(1))
    torch.testing.assert_close(three_d, four_d[:, 0])
    double = rotate(x.double(), 60)
    assert double.dtype == torch.float64
    torch.testing.assert_close(double.float(), four_d, atol=1e-5, rtol=0)
    assert rotate(torch.zeros(0, 784), 30).shape == (0, 784)


def test_rotate_bad_inputs(raw):
    with pytest.raises(
        TypeError, match=r"Expected angle to be a real number of degrees .* got str '30'"
    ):
        rotate(raw, "30")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got bool True"):
        rotate(raw, True)
    with pytest.raises(TypeError, match="got Tensor"):
        rotate(raw, torch.tensor(30.0))  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match="Expected angle to be a finite number of degrees, got nan"
    ):
        rotate(raw, float("nan"))
    with pytest.raises(TypeError, match=r"floating-point images, got dtype torch.uint8.*/ 255"):
        rotate(mnist_arrays("test")[0][:2], 30)
    with pytest.raises(ValueError, match=r"shape \(N, 1, H, W\).*got shape \(2, 4, 28, 28\); 4 "):
        rotate(torch.zeros(2, 4, 28, 28), 30)
    with pytest.raises(ValueError, match=r"got shape \(2, 783\)"):
        rotate(torch.zeros(2, 783), 30)
    with pytest.raises(TypeError, match=r"Expected images to be a torch.Tensor, got list"):
        rotate([[0.0]], 30)  # type: ignore[arg-type]


def test_an_int_angle_is_reduced_modulo_360_exactly_however_large(raw):
    # past 2**53 an int's float dropped its remainder: 360 * 10**20 + 90 returned an unchanged
    # copy, and 10**400 (finite) was refused as "a finite number of degrees"
    x = _normalise(raw)
    assert torch.equal(rotate(x, 360 * 10**20 + 90), rotate(x, 90))
    assert torch.equal(rotate(x, -(360 * 10**20) + 45), rotate(x, 45))
    assert 10**400 % 360 == 280
    assert torch.equal(rotate(x, 10**400), rotate(x, 280))
    assert torch.equal(rotate(x, np.int64(360 * 2**54 + 180)), x.flip(-1, -2))
    net, y = MLP(hidden_features=8), mnist_arrays("test")[1][:8]
    far, near = evaluate_rotations(net, x, y, angles=(360 * 10**20 + 90, 90), progress=False)
    assert far["angle"] == 3.6e22 and {**far, "angle": 90.0} == near  # rotated alike
    told = r"each angle to be a number of degrees a float can hold .* about 10\*\*400, an int"
    with pytest.raises(ValueError, match=told + r" past that range; reduce it with % 360"):
        evaluate_rotations(net, x, y, angles=(0, 10**400), progress=False)


# ---------------------------------------------------------------------------------------------
# evaluate_rotations


def test_rotation_rows_agree_with_predict_and_metrics(raw):
    x, y = _normalise(raw), mnist_arrays("test")[1][:8]
    net = MLP(hidden_features=8)
    rows = evaluate_rotations(net, x, y, angles=(0, 45.0, 90))
    assert [r["angle"] for r in rows] == [0.0, 45.0, 90.0]
    assert all(list(r) == ["angle", "acc", "ece", "epistemic", "total"] for r in rows)
    assert all(isinstance(v, float) for r in rows for v in r.values())
    for row in rows:
        preds = predict(net, rotate(x, row["angle"]))
        m = metrics.evaluate(preds, y)
        assert row["acc"] == m["acc"] and row["ece"] == m["ece"]
        assert row["epistemic"] == 0.0  # S = 1
        assert row["total"] == pytest.approx(m["expected_entropy"])


def test_every_angle_sees_the_same_posterior_draws(raw):
    x, y = _normalise(raw).flatten(1), mnist_arrays("test")[1][:8]
    model = BayesianMLP(in_features=784, hidden_features=8, out_features=10)
    guide = mean_field_guide(model, init_scale=0.3)
    pyro.set_rng_seed(1)
    rows = evaluate_rotations(model, x, y, guide, angles=(0, 90, 0), num_samples=4)
    after = torch.get_rng_state()
    assert rows[0] == {**rows[2]}
    assert rows[1] != rows[0]
    pyro.set_rng_seed(1)
    preds = predict(model, x, guide, num_samples=4)
    assert torch.equal(torch.get_rng_state(), after)  # advanced as by one predict() call
    m = metrics.evaluate(preds, y)
    assert rows[0]["acc"] == m["acc"] and rows[0]["ece"] == m["ece"]
    assert rows[0]["epistemic"] == pytest.approx(m["mutual_information"], rel=1e-12)
    assert rows[0]["epistemic"] > 0

    pyro.set_rng_seed(1)
    (row,) = evaluate_rotations(model, x, y, guide, angles=[0], num_samples=4, measure="variance")
    parts = decompose(preds.probs.double(), "variance")
    assert row["epistemic"] == pytest.approx(float(parts.epistemic.mean()), rel=1e-12)
    assert row["total"] == pytest.approx(float(parts.total.mean()), rel=1e-12)


def test_evaluate_rotations_takes_posterior_samples_as_predict_does(raw):
    # Draws from anywhere (an MCMC run, a dict), as predict(posterior_samples=) takes them:
    # each row against Pyro's own conditioning of the model on each draw, rotated by rot90
    x, y = _normalise(raw).flatten(1), mnist_arrays("test")[1][:8]
    model = BayesianMLP(in_features=784, hidden_features=8, out_features=10)
    draws = mean_field_guide(model, init_scale=0.3).sample(3)
    rows = evaluate_rotations(model, x, y, angles=(0, 90), posterior_samples=draws, seed=0)
    assert [row["angle"] for row in rows] == [0.0, 90.0]
    for row, turns in zip(rows, (0, 1), strict=True):
        images = torch.rot90(x.view(8, 1, 28, 28), turns, dims=(-2, -1)).flatten(1)
        probs = []
        for s in range(3):
            conditioned = pyro.poutine.condition(model, data={k: v[s] for k, v in draws.items()})
            logits = pyro.poutine.trace(conditioned).get_trace(images).nodes["logits"]["value"]
            probs.append(torch.softmax(logits.detach().double(), -1).numpy())
        p = np.stack(probs)  # (S, N, C)
        mean = p.mean(0)
        total = -(mean * np.log(mean)).sum(-1)
        aleatoric = -(p * np.log(p)).sum(-1).mean(0)
        assert row["acc"] == float((mean.argmax(-1) == y.numpy()).mean())
        assert row["total"] == pytest.approx(total.mean(), rel=1e-5)
        assert row["epistemic"] == pytest.approx((total - aleatoric).mean(), rel=1e-4, abs=1e-7)
    assert rows[0]["epistemic"] > 1e-4  # the draws differ
    with pytest.raises(ValueError, match="draws come from one source"):
        evaluate_rotations(model, x, y, angles=[0], num_samples=2, posterior_samples=draws)


def test_evaluate_rotations_bad_inputs(raw):
    net, y = MLP(hidden_features=8), torch.zeros(8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"Expected y of shape \(N,\) = \(8,\).*got shape \(3,\)"):
        evaluate_rotations(net, raw, y[:3])
    with pytest.raises(TypeError, match=r"expects x and y as tensors .* got y of type list"):
        evaluate_rotations(net, raw, [0] * 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Expected at least one angle"):
        evaluate_rotations(net, raw, y, angles=())
    with pytest.raises(TypeError, match="Expected each angle to be a real number of degrees"):
        evaluate_rotations(net, raw, y, angles=(0, "90"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown measure 'bald'"):
        evaluate_rotations(net, raw, y, measure="bald")  # type: ignore[arg-type]
    # 0 images were refused in predict()'s words ("predict() got no inputs"), after the
    # labels' and options' checks; now up front, in evaluate_rotations' own
    empty = r"^evaluate_rotations\(\) got no images: x is empty \(shape \(0, 1, 28, 28\)\)\."
    with pytest.raises(ValueError, match=empty + r".* pass at least one image, with its label"):
        evaluate_rotations(net, raw[:0], y[:0], measure="bald", progress=False)
    with torch.device("meta"):  # refused in its own name, not predict()'s
        shapes = BayesianMLP(hidden_features=8)
    told = r"^evaluate_rotations\(\): the model is on the meta device \(shapes, no values\).* "
    with pytest.raises(ValueError, match=told + r"model\.to_empty\(device='cpu'\)"):
        evaluate_rotations(shapes, raw, y, progress=False)


def test_evaluate_rotations_refuses_bad_labels_in_words_naming_y_before_predicting(
    raw, monkeypatch
):
    # float or negative labels were refused only after the first angle was predicted, in
    # the metrics' words ("convert them with targets.long()"); the upper bound needs the
    # classes, known after the first prediction, and is then refused naming y too
    import pyrouq.predictive

    calls = []
    real = pyrouq.predictive.predict
    monkeypatch.setattr(
        pyrouq.predictive, "predict", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    net, y = MLP(hidden_features=8), mnist_arrays("test")[1][:8]
    with pytest.raises(TypeError, match=r"integer y .*dtype torch.float32; convert them with y"):
        evaluate_rotations(net, raw, y.float(), angles=(0, 90), progress=False)
    with pytest.raises(TypeError, match=r"for one-hot rows, y\.long\(\)\.argmax\(-1\)\)\.$"):
        evaluate_rotations(net, raw, y > 4, angles=(0, 90), progress=False)
    with pytest.raises(ValueError, match=r"Expected y to be class indices .* \[-1, 8\]"):
        evaluate_rotations(net, raw, y - 1, angles=(0, 90), progress=False)
    assert calls == []  # refused before any prediction
    with pytest.raises(ValueError, match=r"Expected y in \[0, 10\) .* \[5, 14\]; relabel"):
        evaluate_rotations(net, raw, y + 5, angles=(0, 90), progress=False)
    assert calls == [1]  # one angle, the classes' count coming from its predictions


def test_format_rotation_table():
    rows = [
        {"angle": 0.0, "acc": 0.99, "ece": 0.004, "epistemic": 0.01, "total": 0.05},
        {"angle": 165.0, "acc": 0.25, "ece": 0.5, "epistemic": 0.3, "total": 1.25},
    ]
    lines = format_rotation_table(rows).splitlines()
    assert len(lines) == 6 and len({len(line) for line in lines}) == 1  # fixed width
    assert lines[1] == "│ Angle │    Acc │    ECE │ Epistemic │   Total │"
    assert lines[3] == "│    0° │ 99.00% │  0.40% │   0.01000 │ 0.05000 │"
    assert lines[4] == "│  165° │ 25.00% │ 50.00% │   0.30000 │ 1.25000 │"
    with pytest.raises(ValueError, match=r"lacks the key\(s\) \['total'\]"):
        format_rotation_table([{"angle": 0.0, "acc": 1.0, "ece": 0.0, "epistemic": 0.0}])
    with pytest.raises(ValueError, match="Expected at least one row"):
        format_rotation_table([])
    with pytest.raises(TypeError, match="Expected rows to be a list of dicts"):
        format_rotation_table(rows[0])  # type: ignore[arg-type]
    # metrics left as one-number tensors or arrays read as the numbers they hold
    held = [
        {**rows[0], "acc": torch.tensor(0.99), "ece": np.array(0.004)},
        {**rows[1], "acc": torch.tensor([0.25], requires_grad=True), "total": np.array([1.25])},
    ]
    assert format_rotation_table(held).splitlines() == lines
    with pytest.raises(TypeError, match=r"A rotation row holds non-numbers \{'acc': None\}"):
        format_rotation_table([{**rows[0], "acc": None}])
    # an infinite ECE or a NaN angle was printed as "inf%" and "nan°"
    with pytest.raises(ValueError, match=r"holds NaN or infinite values \(angle=nan, ece=inf\)"):
        format_rotation_table([rows[0], {**rows[1], "angle": math.nan, "ece": math.inf}])
    # percentages given by hand were shown as "9900.00%", and plotted so
    told = (
        r"A rotation row holds acc=99\.0, ece=40\.0 outside \[0, 1\]; expected acc and ece as "
        r"fractions, .* If they are percentages, divide them by 100\."
    )
    for call in (format_rotation_table, plot_rotation):
        with pytest.raises(ValueError, match=told):
            call([{**rows[0], "acc": 99.0, "ece": 40.0}, rows[1]])
        with pytest.raises(ValueError, match=r"holds ece=-0\.1 outside \[0, 1\]"):
            call([{**rows[0], "ece": -0.1}])


class _SlowMLP(MLP):
    def forward(self, x):
        time.sleep(0.8)
        return super().forward(x)


def test_a_long_rotation_sweep_shows_one_bar_over_the_angles(capsys):
    x, y = torch.randn(4, 1, 28, 28), torch.arange(4)
    evaluate_rotations(_SlowMLP(), x, y, angles=[0, 30, 60, 90])  # about 3.2 s
    shown = capsys.readouterr().err
    assert "rotations" in shown and "/4" in shown
    assert "predict" not in shown  # the predictions under it show no bar of their own
    evaluate_rotations(_SlowMLP(), x, y, angles=[0, 30, 60, 90], progress=False)
    assert capsys.readouterr().err == ""


def test_a_regression_model_is_told_at_once_how_to_evaluate_it_under_rotation(raw):
    # with float targets it was first told "convert them with y.long()", then, followed,
    # "use its .evaluate()"; now the first refusal names what to do, and doing it works
    import pyrouq

    torch.manual_seed(0)
    model = pyrouq.bayesian(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 1)),
                            likelihood=pyrouq.Gaussian(scale=0.5))  # fmt: skip
    guide = mean_field_guide(model)
    y = torch.linspace(-1, 1, raw.shape[0])
    told = (
        r"^evaluate_rotations\(\) expects a classifier .* got BayesianNetwork with a Gaussian "
        r"likelihood, a regression model, which it does not evaluate\. Evaluate one with "
        r"predict\(model, x, guide\)\.evaluate\(y\) .* predict on rotate\(x, angle\) for each"
    )
    for targets in (y, y.long(), y[:, None]):  # as they come, as once told, one column
        with pytest.raises(TypeError, match=told):
            evaluate_rotations(model, raw, targets, guide, angles=(0, 90), progress=False)
    told = told.replace("BayesianNetwork", r"BayesianNetwork \(in DataParallel\)")  # (was: got
    with pytest.raises(TypeError, match=told):  # DataParallel with a Gaussian likelihood)
        evaluate_rotations(torch.nn.DataParallel(model), raw, y, guide, progress=False)
    rows = [predict(model, rotate(raw, a), guide, num_samples=2).evaluate(y) for a in (0, 90)]
    assert all(math.isfinite(row["rmse"]) and row["rmse"] > 0 for row in rows)


def test_a_classifier_of_a_reloaded_likelihoods_module_is_not_taken_for_a_regression_model():
    """The refusal of a regression model (026fc33) took every likelihood but today's
    Categorical for one: a classifier built before a notebook's importlib.reload() (which
    makes the class again) was told 'got BayesianNetwork with a Categorical likelihood, a
    regression model'. It is evaluated as before."""
    import pyrouq.likelihoods

    torch.manual_seed(0)
    model = BayesianMLP(in_features=64, hidden_features=4, out_features=3)
    guide = mean_field_guide(model)
    x, y = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    reloaded = type("Categorical", (pyrouq.likelihoods.Categorical,), {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pyrouq.likelihoods, "Categorical", reloaded)
        rows = evaluate_rotations(model, x, y, guide, angles=(0, 90), num_samples=2, progress=False)
    assert [row["angle"] for row in rows] == [0, 90]
    assert all(0.0 <= row["acc"] <= 1.0 for row in rows)
