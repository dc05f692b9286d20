"""Audit of mcmc(): an autocast around the call, a pandas frame or a list of batches given as
the data, and float64 labels named as the caller gave them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _toy import MCMC_OPTIONS, regression_data, regression_model
from torch import nn

from pyrouq import bayesian, mcmc

OPTIONS = {**MCMC_OPTIONS, "num_samples": 6, "warmup_steps": 6, "num_chains": 1}


def test_an_autocast_around_mcmc_changes_no_draw():
    """The chains ran here under the caller's bfloat16 autocast (the network's matmuls in
    bfloat16, the precision mcmc() refuses a bfloat16 model for), while chain processes,
    which start without it, ran in float32: "the draws are the same either way" failed."""
    x, y = regression_data()
    model = regression_model()
    plain = mcmc(model, x, y, **OPTIONS)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = mcmc(model, x, y, **OPTIONS)
        assert torch.is_autocast_enabled("cpu")  # the caller's autocast is left on
    for site, value in plain.samples.items():
        assert cast.samples[site].dtype == torch.float32
        assert torch.equal(cast.samples[site], value), site
    assert torch.equal(cast.sample_stats["energy"], plain.sample_stats["energy"])


def test_a_pandas_frame_or_a_list_of_batches_is_told_how_to_make_a_tensor():
    """A pandas frame was told mcmc() 'takes no minibatch loader', and a list of batches to
    call torch.as_tensor, which fails on both."""
    pandas = pytest.importorskip("pandas")
    x, y = regression_data()
    model = regression_model()
    frame = pandas.DataFrame(x.numpy())
    with pytest.raises(
        TypeError,
        match=r"^mcmc\(\) needs the full data as tensors x and y, got DataFrame for x\. Convert "
        r"it first: x = torch\.tensor\(np\.asarray\(x\)\)\.$",
    ):
        mcmc(model, frame, y, **OPTIONS)
    with pytest.raises(
        TypeError, match=r"got Series for y\. .*y = torch\.tensor\(np\.asarray\(y\)\)\.$"
    ):
        mcmc(model, x, pandas.Series(y.numpy()), **OPTIONS)
    ours = mcmc(model, torch.tensor(np.asarray(frame)), y, **OPTIONS)  # the advice works
    assert torch.equal(ours.samples["weight"], mcmc(model, x, y, **OPTIONS).samples["weight"])
    with pytest.raises(
        TypeError,
        match=r"got a list of tensors for x\. Join them first: x = torch\.cat\(x\) \(a "
        r"loader's batches\) or torch\.stack\(x\) \(one tensor per point\)\.$",
    ):
        mcmc(model, [x[:6], x[6:]], y, **OPTIONS)
    assert torch.equal(torch.cat([x[:6], x[6:]]), x)  # (what the advice gives back)


def test_float64_labels_are_named_as_given():
    """Float labels were cast to the model's dtype before the check, which then named a
    float32 the caller never passed."""
    x, _ = regression_data()
    model = bayesian(nn.Linear(2, 3))
    labels = torch.arange(len(x)) % 3
    with pytest.raises(ValueError, match=r"labels of dtype torch\.float64, expected an integer"):
        mcmc(model, x, labels.double(), **OPTIONS)
    mcmc(model, x, labels, **OPTIONS)  # (long labels run)


def test_the_same_values_in_another_layout_give_the_same_draws():
    """A transposed or column-sliced x (a frame's columns, data[:, :2]) rounded NUTS's
    gradients otherwise than the contiguous x of the same values: the same seed gave chains
    that drifted apart (by 0.01 to 2 within 60 steps)."""
    x, y = regression_data()
    model = regression_model()
    options = {**OPTIONS, "num_samples": 20, "warmup_steps": 20}
    ours = mcmc(model, x, y, **options)
    for other in (x.T.contiguous().T, torch.cat([x, y[:, None]], 1)[:, :2]):
        assert torch.equal(other, x) and not other.is_contiguous()
        again = mcmc(model, other, y, **options)
        assert again.x.is_contiguous()
        for site, value in ours.samples.items():
            assert torch.equal(again.samples[site], value), site
