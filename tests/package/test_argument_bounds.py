"""Arguments past their bounds: counts past torch's int64 (``10**400`` was torch's "Overflow
when unpacking long long", or a hang), networks that could never fit in memory (built layer by
layer until it ran out), image grids far larger than the images and misspelled options of
``summary()``."""

from __future__ import annotations

import contextlib
import re
import signal

import arviz as az
import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import (
    ArrayLoader,
    BatchEnsembleLinear,
    BayesianConv2d,
    BayesianLinear,
    KLWeightedELBO,
    batchensemble,
    conformal,
    plot_image_grid,
    summary,
)
from pyrouq.metrics import ece
from pyrouq.models import MLP, BayesianMLP
from pyrouq.nn import BatchEnsembleNorm

INT64_MAX = 2**63 - 1
PAST_INT64 = "to be at most 2**63 - 1, torch's largest int64, got "


@contextlib.contextmanager
def _within(seconds):
    """Fail, rather than hang, where a call runs past ``seconds`` (no guard without SIGALRM)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def late(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _classes(n=12, s=2, c=3):
    g = torch.Generator().manual_seed(0)
    return pyrouq.Predictions(torch.softmax(torch.randn(s, n, c, generator=g), -1))


# --------------------------------------------------------------------------------------------
# counts and sizes past int64
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda v: batchensemble(MLP(3, 4, 2), v), "num_members"),
        (lambda v: MLP(hidden_features=v), "hidden_features"),
        (lambda v: MLP(3, 4, 2, num_hidden=v), "num_hidden"),  # (was a hang)
        (lambda v: KLWeightedELBO(num_particles=v), "num_particles"),
        (lambda v: ArrayLoader(torch.zeros(4, 2), torch.zeros(4), batch_size=v), "batch_size"),
        (lambda v: BayesianLinear(v, 3), "BayesianLinear's in_features"),
        (lambda v: BayesianConv2d(2, 3, v), "BayesianConv2d's kernel_size"),
        (
            lambda v: pyrouq.BatchEnsembleConv2d(2, 3, 3, 2, stride=(1, v)),
            "BatchEnsembleConv2d's stride",
        ),
        (lambda v: conformal(_classes(), torch.arange(12) % 3, score="raps", k_reg=v), "k_reg"),
    ],
)
def test_counts_past_int64_are_refused_in_words(call, message):
    with _within(5), pytest.raises(ValueError) as err:
        call(10**400)
    assert f"Expected {message} {PAST_INT64}about 10**400." in str(err.value)
    with pytest.raises(ValueError, match=re.escape(f"{PAST_INT64}9223372036854775808.")):
        call(INT64_MAX + 1)


def test_fit_and_predict_counts_past_int64():
    x, y = torch.randn(8, 3), torch.arange(8) % 2
    model = BayesianMLP(3, 4, 2)
    guide = pyrouq.mean_field_guide(model)
    loader = ArrayLoader(x, y, batch_size=4)
    with pytest.raises(ValueError, match=re.escape(f"Expected epochs {PAST_INT64}about 10**400")):
        pyrouq.fit(model, guide, loader, epochs=10**400, progress=False)
    with pytest.raises(ValueError, match=re.escape(f"num_samples {PAST_INT64}about 10**400")):
        pyrouq.predict(model, x, guide, num_samples=10**400)
    # the bound itself is a count taken (nothing is built from it here)
    assert KLWeightedELBO(num_particles=INT64_MAX).num_particles == INT64_MAX


def test_layer_weights_past_int64_elements_are_refused():
    # a weight of 4 x 2**62 = 2**64 elements: BayesianLinear took it and failed at its first
    # forward, BatchEnsembleLinear failed in torch's "Storage size calculation overflowed"
    with pytest.raises(ValueError) as err:
        BayesianLinear(2**62, 4)
    assert str(err.value) == (
        "Expected BayesianLinear's weight to hold at most 2**63 - 1 elements (torch's largest "
        f"int64), got out_features 4 x in_features {2**62} = {2**64}. Pass smaller sizes."
    )
    with pytest.raises(ValueError, match=re.escape(f"kernel_width 1024 = {2**80}. Pass fewer")):
        BayesianConv2d(2**40, 2**20, 2**10)
    with pytest.raises(ValueError, match=re.escape(f"in_features 3 = {3 * 2**62}. Pass smaller")):
        BatchEnsembleLinear(3, 2**62, num_members=2)
    with pytest.raises(ValueError, match=re.escape(f"{2**62} x features 3 = {3 * 2**62}. Pass")):
        BatchEnsembleLinear(3, 4, num_members=2**62)  # the factors r, (M, in)
    assert BayesianLinear(3, 4).weight_shape == (4, 3)  # (a usual layer still builds)


def test_a_network_larger_than_memory_is_refused_before_its_layers_are_built():
    # 2**62 + 1 layers of one weight and one bias: built one by one, it ran until memory ran out
    values = 2 * (2**62 + 1)
    with _within(3), pytest.raises(ValueError) as err:
        MLP(1, 1, 1, num_hidden=2**62)
    nbytes = values * 4  # float32
    assert str(err.value).startswith(
        f"MLP(1, 1, 1, num_hidden={2**62}) would hold {values:.3g} values "
        f"({nbytes / 2**30:.3g} GiB in torch.float32), more than the "
    )
    assert str(err.value).endswith(
        "of memory of the cpu it is built on: it could never be built. Pass fewer or narrower "
        "hidden layers."
    )
    # a BatchNorm1d(4) holds 17 values (weight, bias, running mean and var, the batch count)
    with _within(3), pytest.raises(ValueError, match=re.escape("would hold 1.7e+13 values")):
        BatchEnsembleNorm(nn.BatchNorm1d(4), num_members=10**12)
    # a BatchEnsemble's factors and biases, M x (in + 2 out) per layer: they failed in torch's
    # words ("DefaultCPUAllocator: can't allocate memory"), or filled the memory first
    net = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    layer = "BatchEnsembleLinear of 1000000000000 members (its factors and biases) would hold"
    for convert in (pyrouq.batchensemble, pyrouq.rank1):
        with _within(3), pytest.raises(ValueError, match=re.escape(f"{layer} 1.6e+13 values")):
            convert(net, 10**12)
    # numpy's members too: M x (in + 2 out) wrapped around in int64 (2**60 x 16 = 0), and
    # torch refused the factors in its words ("Storage size calculation overflowed")
    held = re.escape(f"BatchEnsembleLinear of {2**60} members (its factors and biases) would hold")
    with _within(3), pytest.raises(ValueError, match=f"{held} 1.84e\\+19 values"):
        BatchEnsembleLinear(4, 6, np.int64(2**60))
    assert len(MLP(3, 4, 2, num_hidden=3)) == 1 + 2 * 3 + 1  # flatten, 3 x (fc, relu), fc


def test_a_huge_number_of_bins_is_shown_short():
    probs = _classes().mean_probs
    with pytest.raises(ValueError) as err:
        ece(probs, torch.arange(12) % 3, num_bins=10**400)
    assert "got about 10**400. The reported figures use 15" in str(err.value)


# --------------------------------------------------------------------------------------------
# plot_image_grid: a grid far larger than the images
# --------------------------------------------------------------------------------------------


def test_image_grid_far_larger_than_the_images_is_refused():
    import matplotlib.pyplot as plt

    preds, images = _classes(n=3), torch.rand(3, 1, 28, 28)
    with pytest.raises(ValueError) as err:
        plot_image_grid(preds, images, rows=100, cols=100)
    assert str(err.value) == (
        "plot_image_grid(): got rows=100 x cols=100 for N=3 inputs, which leaves more than "
        "half of the cells blank: a grid of more than 1,024 cells (32 x 32) must be at least "
        "half full (its figure is sized to rows x cols). Pass e.g. rows=1, cols=3."
    )
    with pytest.raises(ValueError, match=r"got rows=1 x cols=1025 for N=3 inputs, which leaves"):
        plot_image_grid(preds, images, rows=1, cols=1025)  # one cell past 1,024, 1022 blank
    forty = _classes(n=40)
    many = _classes(n=600)
    with pytest.raises(ValueError, match=r"rows=40 x cols=40 for N=600 .* rows=15, cols=40"):
        plot_image_grid(many, torch.rand(600, 1, 8, 8), rows=40, cols=40)  # 1000 of 1600 blank
    # the default 4 x 8 on 3 images, 4 x 4 on 12, 5 x 8 and 8 x 8 on 40 are drawn (blank cells
    # kept: a grid kept the same while N varies)
    fits = ((preds, 3, 4, 8), (_classes(n=12), 12, 4, 4), (forty, 40, 5, 8), (forty, 40, 8, 8))
    for p, n, rows, cols in fits:
        fig = plot_image_grid(p, torch.rand(n, 1, 28, 28), rows=rows, cols=cols)
        assert len(fig.axes[0].images) == n
        plt.close(fig)


# --------------------------------------------------------------------------------------------
# summary(**kwargs): names az.summary takes
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def idata():
    draws = np.random.default_rng(0).normal(size=(2, 20, 3))
    return az.from_dict(posterior={"w": draws})


@pytest.mark.parametrize(
    "options, meant",
    [
        ({"round_too": 2}, " (did you mean 'round_to'?)"),
        ({"Round_To": 2}, " (did you mean 'round_to'? the names are lower case)"),
        (
            {"stat-focus": "median"},
            " (did you mean 'stat_focus'? the names join their words with '_')",
        ),
        ({"zzz": 1}, ""),
    ],
)
def test_summary_refuses_an_option_az_summary_does_not_take(idata, options, meant):
    (name,) = options
    with pytest.raises(TypeError) as err:
        summary(idata, **options)
    message = str(err.value)
    assert message.startswith(f"summary() got an unknown option {name!r}{meant}: it passes its")
    assert "az.summary, which takes filter_vars, fmt, kind, round_to, " in message
    assert message.endswith(". Pass one of these, or leave it out.")


def test_summary_refuses_data_and_takes_real_options(idata):
    with pytest.raises(TypeError, match=r"summary\(\) got data=, but it passes idata to az"):
        summary(idata, data=idata)
    table = summary(idata, round_to=1, kind="stats")
    means = idata.posterior["w"].values.reshape(-1, 3).mean(0)
    np.testing.assert_allclose(table["mean"].to_numpy(), np.round(means, 1))
