"""Audit 7 of the recalibration: arguments given one place off (an alpha where the targets go, a
score where alpha goes, the predictions where their labels or the sets go) are named for what
they are, with the call that works, and a flat NLL names every cause it can have."""

from decimal import Decimal

import numpy as np
import pytest
import torch

from pyrouq import Predictions
from pyrouq.calibration import (
    conformal,
    coverage,
    mean_set_size,
    temperature_scale,
)
from pyrouq.regression import GaussianPredictions


def _classes(n=40, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(2 * torch.randn(2, n, c, generator=g), -1)
    return Predictions(probs, torch.randint(0, c, (n,), generator=g))


def _gaussian(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(2, n, 1, generator=g)
    return GaussianPredictions(loc, torch.ones(2, n, 1), torch.randn(n, generator=g))


@pytest.mark.parametrize("make", [_classes, _gaussian])
def test_an_alpha_given_where_the_targets_go_is_named_alpha(make):
    # conformal(val_preds, 0.1) was told "expected targets ..., got float; wrap it with
    # torch.as_tensor(...)": labels made of the alpha
    preds = make()
    with pytest.raises(TypeError) as info:
        conformal(preds, 0.1)
    assert str(info.value) == (
        "conformal(): got 0.1 as val_targets, the second argument; alpha is not the second: "
        "pass conformal(val_preds, alpha=0.1) (the targets default to those the predictions "
        "carry) or conformal(val_preds, val_targets, alpha, score)."
    )
    with pytest.raises(TypeError, match=r"pass conformal\(val_preds, score='aps'\)"):
        conformal(preds, "aps")
    assert conformal(preds, alpha=0.1).alpha == 0.1  # the call it names works


def test_a_score_given_where_alpha_goes_is_told_to_be_the_score():
    preds = _classes()
    with pytest.raises(ValueError) as info:
        conformal(preds, preds.targets, "aps")
    assert str(info.value) == (
        "Expected alpha in (0, 1), the allowed miscoverage (0.1: 90 % coverage), got 'aps': a "
        "score, the fourth argument; pass score='aps'."
    )
    # a string holding a number, not a score: told to pass the float (it said "got '0.1'."),
    # as is a Decimal, which is no real number to pyrouq
    with pytest.raises(ValueError, match=r"got '0.1' \(a string: pass a float, alpha=0.1\)\.$"):
        conformal(preds, preds.targets, "0.1")
    with pytest.raises(ValueError, match=r"got Decimal\('0.1'\) \(a Decimal: pass a float, alph"):
        conformal(preds, alpha=Decimal("0.1"))
    with pytest.raises(ValueError, match=r"got '1.5' \(a string: pass a float in \(0, 1\)\)\.$"):
        conformal(preds, alpha="1.5")  # (not told alpha=1.5, which is refused too)
    with pytest.raises(ValueError, match=r"got 'abc'\.$"):  # no number: the range says it
        conformal(preds, alpha="abc")


def test_predictions_given_for_their_labels_are_told_to_pass_their_targets():
    preds, gauss = _classes(), _gaussian()
    sets = conformal(preds).predict_sets(preds)
    with pytest.raises(TypeError) as info:
        coverage(sets, preds)
    assert str(info.value) == (
        "coverage(): expected the labels as a torch.Tensor, got Predictions: pass the "
        "predictions' .targets, the labels they carry."
    )
    with pytest.raises(TypeError, match=r"got GaussianPredictions: pass the predictions' "
                       r"\.targets, the targets they carry\.$"):  # fmt: skip
        coverage(conformal(gauss).intervals(gauss), gauss)
    assert coverage(sets, preds.targets) == pytest.approx(
        float(sets[torch.arange(40), preds.targets].double().mean())
    )


@pytest.mark.parametrize("call", [lambda p: coverage(p, p.targets), mean_set_size])
def test_predictions_given_as_sets_are_told_how_to_make_sets(call):
    with pytest.raises(TypeError) as info:
        call(_classes())
    assert str(info.value) == (
        "Expected prediction sets as an (N, C) boolean tensor (predict_sets() returns them), "
        "got Predictions (predictions, not sets): make sets with conformal(val_preds, val_targets)"
        ".predict_sets(preds), intervals with .intervals(preds) (a tuple (lo, hi))."
    )


def test_members_whose_mixture_is_uniform_at_every_t_are_named_as_the_cause():
    # two members of mirrored confidence: their mixture is (0.5, 0.5) whatever T, while each
    # draw is far from uniform; the warning said "every draw is uniform over the classes"
    probs = torch.tensor([[[0.9, 0.1]] * 6, [[0.1, 0.9]] * 6], dtype=torch.float64)
    preds = Predictions(probs, torch.tensor([0, 1, 0, 1, 0, 0]))
    with pytest.warns(UserWarning, match=r"the draws disagree so symmetrically that their "
                      r"mixture is uniform at every T"):  # fmt: skip
        scaler = temperature_scale(preds)
    assert scaler.temperature == 1.0
    assert torch.allclose(scaler(preds).probs.mean(0), torch.full((6, 2), 0.5, dtype=torch.float64))


def test_sets_given_as_a_frame_like_object_keep_the_array_hint():
    """A pandas DataFrame has .loc, which was read as Gaussian predictions."""

    class Frame:  # what coverage() reads of a DataFrame: .loc and .shape, no tensor
        loc = None
        shape = (3, 2)

    with pytest.raises(TypeError) as err:
        mean_set_size(Frame())
    assert "predictions, not sets" not in str(err.value)
    assert str(err.value).endswith("; convert an array with torch.as_tensor(sets).")


def test_an_integer_label_given_where_the_targets_go_is_not_called_an_alpha():
    """conformal(preds, 2): one label, not an alpha; it was told to pass alpha=2."""
    preds = Predictions(torch.tensor([[[0.7, 0.2, 0.1]]]))
    for label in (2, np.int64(2)):
        with pytest.raises(TypeError) as err:
            conformal(preds, label)
        assert "alpha" not in str(err.value).split(";")[0]
        assert "alpha=2" not in str(err.value)
