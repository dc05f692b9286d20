"""Limits on sizes and counts that must not refuse what is legitimate: CQR intervals that all
cross, grids with a few blank cells, numpy counts, normalisation layers on another device,
and the words for a misspelled option of ``summary()``."""

from __future__ import annotations

import re

import arviz as az
import numpy as np
import pytest
import torch
from torch import nn

from pyrouq import (
    BatchEnsembleConv2d,
    BatchEnsembleConvTranspose1d,
    BatchEnsembleLinear,
    GaussianPredictions,
    Predictions,
    conformal,
    coverage,
    plot_image_grid,
    summary,
)
from pyrouq.nn import BatchEnsembleNorm


def test_coverage_of_cqr_intervals_that_all_cross_is_zero():
    # calibrated on wide predictions (N(0, 1)) whose targets sit at the mean, the CQR
    # threshold is about -z_0.95 = -1.645; on narrow test predictions (sd 0.1, quantiles
    # -+0.164) every interval [lo - t, hi + t] crosses: it covers nothing (Romano et al.)
    y = torch.linspace(-0.01, 0.01, 50).unsqueeze(-1)
    cal = GaussianPredictions(torch.zeros(1, 50, 1), torch.ones(1, 50, 1), y)
    reg = conformal(cal, score="cqr", alpha=0.1)
    assert -1.645 - 0.01 <= float(reg.threshold) <= -1.645 + 0.01
    test = GaussianPredictions(torch.zeros(1, 20, 1), torch.full((1, 20, 1), 0.1))
    lo, hi = reg.intervals(test)
    assert bool((lo > hi).all())
    assert coverage((lo, hi), torch.zeros(20, 1)) == 0.0  # (was refused as "swapped" bounds)


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_batchensemble_factors_past_int64_with_a_numpy_member_count(layer):
    # np.int64(2**62) * 3 wrapped around in numpy, so the factors (M, 3) passed the bound and
    # torch failed in its own words ("Storage size calculation overflowed")
    members = np.int64(2**62)
    name = "BatchEnsembleLinear" if layer == "linear" else "BatchEnsembleConv2d"
    with pytest.raises(ValueError) as err:
        if layer == "linear":
            BatchEnsembleLinear(3, 4, num_members=members)
        else:
            BatchEnsembleConv2d(3, 4, 3, num_members=members)
    assert str(err.value) == (
        f"Expected {name}'s r to hold at most 2**63 - 1 elements (torch's largest int64), got "
        f"num_members {2**62} x features 3 = {3 * 2**62}. Pass fewer members."
    )
    assert BatchEnsembleLinear(3, 4, num_members=np.int64(2)).r.shape == (2, 3)


def test_batchensemble_norm_memory_is_that_of_the_norms_device_and_dtype():
    # a norm on the meta device holds no values: its copies are built (they were refused
    # against the machine's RAM, 2 x 2 x 2**40 float32 values = 16 TiB)
    norm = BatchEnsembleNorm(nn.LayerNorm(2**40, device="meta"), num_members=2)
    assert [n.weight.shape for n in norm.norms] == [(2**40,), (2**40,)]
    # a float64 BatchNorm1d(4) holds 17 values of 8 bytes (it was counted in float32)
    big = nn.BatchNorm1d(4, dtype=torch.float64)
    with pytest.raises(ValueError) as err:
        BatchEnsembleNorm(big, num_members=10**12)
    gib = 17 * 10**12 * 8 / 2**30
    assert str(err.value).startswith(
        f"BatchEnsembleNorm of {10**12} members would hold 1.7e+13 values ({gib:.3g} GiB in "
        "torch.float64), more than the "
    )


@pytest.mark.parametrize(
    "rows, cols, n",
    # a last row, or cell, part blank; more than half blank at 8 x 8 on 20 (refused under the
    # 32-cell bound) and 32 x 32 on 3, the largest grid drawn more than half blank
    [(8, 8, 50), (1, 40, 39), (6, 8, 40), (6, 6, 30), (8, 8, 20), (32, 32, 3)],
)
def test_image_grid_of_a_fixed_size_with_some_cells_blank_is_drawn(rows, cols, n):
    # a grid kept the same for a varying N (the misclassified inputs, the last page) was
    # refused when it left one row, or with one row one cell, blank
    import matplotlib.pyplot as plt

    g = torch.Generator().manual_seed(0)
    preds = Predictions(torch.softmax(torch.randn(2, n, 3, generator=g), -1))
    fig = plot_image_grid(preds, torch.rand(n, 1, 8, 8, generator=g), rows=rows, cols=cols)
    assert len(fig.axes[0].images) == n
    assert tuple(fig.get_size_inches()) == pytest.approx((1.4 * cols, 1.75 * rows + 0.5))
    plt.close(fig)


def test_summary_words_a_slipped_option_name_as_other_options_do():
    # the words of every option slipped in case, spaces or '-' (as fit()'s, conformal()'s);
    # summary() said only "(did you mean 'stat_focus'?)"
    draws = np.random.default_rng(0).normal(size=(2, 20, 3))
    idata = az.from_dict(posterior={"w": draws})
    with pytest.raises(TypeError) as err:
        summary(idata, **{" Stat-Focus": "median"})
    assert str(err.value).startswith(
        "summary() got an unknown option ' Stat-Focus' (did you mean 'stat_focus'? the names "
        "are lower case, have no spaces around them and join their words with '_'): it passes "
        "its options on to az.summary, which takes filter_vars, fmt, kind, round_to, "
    )


def test_batchensemble_convolution_weight_past_int64_elements_is_refused():
    # as BatchEnsembleLinear's and BayesianConv2d's (it was torch's "Storage size calculation
    # overflowed"); torch's weight is (out, in / groups, *k), transposed (in, out / groups, *k)
    with pytest.raises(ValueError) as err:
        BatchEnsembleConv2d(2**31, 2**31, 2**10, num_members=2, groups=2)
    assert str(err.value) == (
        "Expected BatchEnsembleConv2d's weight to hold at most 2**63 - 1 elements (torch's "
        f"largest int64), got out_channels {2**31} x in_channels / groups {2**30} x "
        f"kernel_size[0] 1024 x kernel_size[1] 1024 = {2**81}. Pass fewer channels or a "
        "smaller kernel."
    )
    with pytest.raises(ValueError, match=re.escape(f"got in_channels {2**40} x out_channels / ")):
        BatchEnsembleConvTranspose1d(2**40, 2**42, 2**10, num_members=2)
    assert BatchEnsembleConv2d(4, 6, (3, 2), num_members=2, groups=2).weight.shape == (6, 2, 3, 2)
