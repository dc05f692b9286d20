"""Small leftovers of the audits: a ConformalRegressor made by hand with a negative "abs"
threshold (inverted intervals) or an infinite one; a checkpoint whose format_version was
edited to True or 3.0; a Standardizer made by hand with a None, zero or infinite std;
format_table() printing a known metric's non-number as text; fit() on uint16/32/64 labels
(torch's "min_all" NotImplementedError); per-member norm copies that broke a tie between
two normalisation layers."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
from _toy import tiny_mlp, toy_data
from torch import nn

import pyrouq
from pyrouq import (
    ArrayLoader,
    CheckpointError,
    ConformalRegressor,
    GaussianPredictions,
    Standardizer,
    batchensemble,
    fit,
    format_table,
    mean_field_guide,
)

# --------------------------------------------------------------------------------------------
# ConformalRegressor(threshold=) made by hand
# --------------------------------------------------------------------------------------------


def _preds():
    return GaussianPredictions(torch.tensor([[[0.0]], [[2.0]]]), torch.ones(2, 1, 1))


def test_an_abs_threshold_below_zero_is_refused():
    with pytest.raises(ValueError) as info:
        ConformalRegressor("abs", 0.1, torch.tensor([1.0, -1.0]))
    assert str(info.value) == (
        "ConformalRegressor: expected thresholds >= 0 for score 'abs' (numbers of standard "
        "deviations), got [1.0, -1.0]: a negative one gives intervals with lo > hi. "
        "conformal() makes them from held-out predictions (only 'cqr' thresholds may be "
        "negative)."
    )


@pytest.mark.parametrize("score", ["abs", "cqr"])
@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_an_infinite_threshold_is_refused(score, bad):
    with pytest.raises(ValueError, match=r"^ConformalRegressor: expected finite thresholds, got "):
        ConformalRegressor(score, 0.1, torch.tensor([bad]))


def test_a_negative_cqr_threshold_and_a_zero_abs_one_are_kept():
    preds = _preds()  # a mixture of N(0, 1) and N(2, 1): mean 1, sd sqrt(2)
    lo, hi = ConformalRegressor("abs", 0.1, torch.tensor([0.0])).intervals(preds)
    assert (lo.item(), hi.item()) == (1.0, 1.0)
    lo, hi = ConformalRegressor("cqr", 0.1, torch.tensor([-0.25])).intervals(preds)
    q_lo, q_hi = preds.interval(0.9)  # shrunk by 0.25 on each side, as documented
    assert lo.item() == pytest.approx(q_lo.item() + 0.25, abs=1e-12)
    assert hi.item() == pytest.approx(q_hi.item() - 0.25, abs=1e-12)


# --------------------------------------------------------------------------------------------
# read(): a format_version that is no int
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "shown"), [(True, "True (bool)"), (3.0, "3.0 (float)")])
def test_a_format_version_edited_to_a_bool_or_a_float_is_refused(tmp_path, version, shown):
    pyro.clear_param_store()
    net = tiny_mlp()
    path = pyrouq.save(tmp_path / "ok.pt", net, mean_field_guide(net))
    payload = torch.load(path, weights_only=True)
    assert payload["format_version"] == 3 and type(payload["format_version"]) is int
    torch.save({**payload, "format_version": version}, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError) as info:
        pyrouq.load(tmp_path / "edited.pt")
    assert str(info.value) == (
        f"{str(tmp_path / 'edited.pt')!r} has checkpoint format version {shown}, not the int "
        "that pyrouq.save() writes: the file was edited or is damaged. Re-save the model with "
        "pyrouq.save()."
    )
    torch.save({**payload, "format_version": 3}, tmp_path / "int.pt")  # the int still loads
    assert isinstance(pyrouq.load(tmp_path / "int.pt").model, nn.Module)


# --------------------------------------------------------------------------------------------
# Standardizer made by hand
# --------------------------------------------------------------------------------------------


def test_a_standardizer_without_a_std_is_refused_as_such():
    with pytest.raises(TypeError) as info:
        Standardizer(torch.zeros(1), None, torch.zeros(()), torch.ones(()))
    assert str(info.value) == (
        "Standardizer: expected x_std to be a tensor of real numbers, one per column, got "
        "NoneType. Use Standardizer.fit(x, y), or pass torch.as_tensor(...)."
    )


@pytest.mark.parametrize("bad", [0.0, -2.0, math.inf, math.nan])
def test_a_standardizer_std_that_is_not_finite_and_positive_is_refused(bad):
    with pytest.raises(ValueError) as info:
        Standardizer(torch.zeros(2), torch.ones(2), torch.zeros(3), torch.tensor([1.0, bad, 3.0]))
    assert str(info.value) == (
        "Standardizer: expected y_std finite and > 0 in every column (standard deviations to "
        f"divide by), got 1 of 3 value(s) that are not, e.g. {bad!r}. Use "
        "Standardizer.fit(x, y), which gives a constant column std 1."
    )


def test_a_standardizer_made_by_hand_transforms_as_computed():
    scaler = Standardizer(
        torch.tensor([1.0, -2.0]), torch.tensor([2.0, 0.5]), torch.tensor(10.0), torch.tensor(4.0)
    )
    x, y = scaler.transform(torch.tensor([[3.0, -1.0]]), torch.tensor([2.0]))
    assert x.tolist() == [[1.0, 2.0]] and y.tolist() == [-2.0]
    nan_mean = Standardizer(torch.zeros(1), torch.ones(1), torch.tensor(math.nan), torch.ones(()))
    assert math.isnan(nan_mean.y_mean.item())  # a NaN mean is refused later, by inverse()


def test_standardizer_fit_refuses_a_spread_that_overflows_float32():
    # its std was inf in float32, which standardised every value of the column to 0
    x = torch.tensor([[1.0, -3e38], [2.0, 3e38]])
    with pytest.raises(ValueError) as info:
        Standardizer.fit(x, torch.tensor([0.0, 1.0]))
    assert str(info.value) == (
        "Standardizer.fit(): the standard deviation of x overflows torch.float32 in column(s) "
        "[1]; pass x.double(), or rescale it first."
    )
    wide = Standardizer.fit(x.double(), torch.tensor([0.0, 1.0]))
    a = x[1, 1].item()  # float32's 3e38, exactly: the column is [-a, a], its std sqrt(2) a
    assert wide.x_std[1].item() == pytest.approx(math.sqrt(2) * a, rel=1e-12)


# --------------------------------------------------------------------------------------------
# format_table(): a known metric that is no number
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [("x", "'x' (str)"), (None, "None (NoneType)")])
def test_format_table_refuses_a_known_metric_that_is_no_number(value, shown):
    with pytest.raises(TypeError) as info:
        format_table({"acc": value})
    assert str(info.value) == (
        f"format_table(): expected metric 'acc' to be a number (a float, or a tensor or array "
        f"of one value), got {shown}. Pass the values that evaluate() or Predictions.evaluate() "
        "return."
    )


def test_format_table_shows_an_unknown_entry_as_text():
    table = format_table({"acc": 0.5, "ood_score": "mutual_information"})  # a metrics.json
    assert "│ Acc            │             50.00% │" in table
    assert "│ ood_score      │ mutual_information │" in table


# --------------------------------------------------------------------------------------------
# fit() on labels of wide unsigned dtypes
# --------------------------------------------------------------------------------------------


def _fit(y):
    pyro.clear_param_store()
    x, _ = toy_data(16)
    torch.manual_seed(0)
    net = tiny_mlp()
    loader = ArrayLoader(x, y, batch_size=8)
    return fit(net, mean_field_guide(net), loader, epochs=1, progress=False, seed=0)


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_fit_refuses_wide_unsigned_labels_in_its_words(dtype):
    _, y = toy_data(16)
    with pytest.raises(ValueError) as info:
        _fit(y.to(dtype))
    assert str(info.value) == (
        f"train_loader has labels of dtype {dtype}, which torch can neither take the minimum "
        "of nor compare with int64 predictions, expected int64 class indices: pass y.long(); "
        "nothing was trained. Fix the targets."
    )


def test_fit_trains_on_uint8_int32_and_int64_labels_alike():
    _, y = toy_data(16)
    losses = {dtype: _fit(y.to(dtype)).losses for dtype in (torch.uint8, torch.int32, torch.long)}
    want = losses[torch.long]
    assert len(want) == 1 and math.isfinite(want[0])
    assert losses[torch.uint8] == want and losses[torch.int32] == want


# --------------------------------------------------------------------------------------------
# batchensemble(norms="per_member"): a tie between two norms
# --------------------------------------------------------------------------------------------


class _TiedNorms(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.n1, self.n2 = nn.Linear(3, 4), nn.LayerNorm(4), nn.LayerNorm(4)
        self.l2 = nn.Linear(4, 2)
        self.n2.weight = self.n1.weight  # one scale for both norms

    def forward(self, x):
        return self.l2(self.n2(self.n1(self.l1(x))))


def test_per_member_norms_keep_a_tie_within_each_member():
    torch.manual_seed(0)
    ensemble = batchensemble(_TiedNorms(), 3)
    n1, n2 = ensemble.net.n1, ensemble.net.n2
    for m in range(3):
        assert n1.norms[m].weight is n2.norms[m].weight
        assert n1.norms[m].bias is not n2.norms[m].bias  # untied stays untied
    assert len({id(n.weight) for n in n1.norms}) == 3  # each member its own copy
    with torch.no_grad():
        n1.norms[1].weight.mul_(2.0)
    assert torch.equal(n2.norms[1].weight, torch.full((4,), 2.0))
    assert torch.equal(n2.norms[0].weight, torch.ones(4))
    shared = batchensemble(_TiedNorms(), 3, norms="shared").net
    assert shared.n1.weight is shared.n2.weight
