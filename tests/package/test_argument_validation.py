"""Audit 12, argument validation across the public API: each bad argument is refused in words
naming it, what came and what to pass, rather than with a bare Python, pathlib, torch or arviz
error; and the valid-but-unusual values (numpy numbers, paths) are still taken."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import (
    ArrayLoader,
    ConformalClassifier,
    Gaussian,
    GaussianPredictions,
    KLWeightedELBO,
    Predictions,
    TemperatureScaler,
    bayesian,
    conformal,
    fit,
    load_mnist,
    mean_field_guide,
    mnist_arrays,
    ood_loader,
    plot_image_grid,
    plot_most_uncertain,
    plot_regression,
    rotate,
    save_figures,
    summary,
    to_inference_data,
    train_test_split,
)
from pyrouq.data import TensorLoader

HUGE = 10**400  # an int beyond every float: float() raises OverflowError
ABOUT = re.escape("about 10**400")


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(nn.Linear(4, 3)), num_data=12)
    return model, mean_field_guide(model)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)


def gaussian_preds():
    return GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1))


def class_preds():
    probs = torch.softmax(torch.randn(2, 6, 3, generator=torch.Generator().manual_seed(1)), -1)
    return Predictions(probs, torch.tensor([0, 1, 2, 0, 1, 2]))


# -- numbers beyond every float: a clear refusal, not Python's OverflowError ------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gaussian_preds().quantile(HUGE), r"Expected a quantile level in \(0, 1\), got "),
        (lambda: gaussian_preds().interval(HUGE), r"Expected an interval level in \(0, 1\), got "),
        (
            lambda: gaussian_preds().rescale(0.0, HUGE),
            r"rescale's std must be finite and > 0, got ",
        ),
        (lambda: gaussian_preds().rescale(HUGE, 1.0), r"rescale's mean must be finite, got "),
        (lambda: TemperatureScaler(HUGE), r"Expected a temperature > 0 \(finite\), got "),
        (
            lambda: conformal(class_preds(), lam=HUGE),
            r"Expected lam >= 0, the RAPS penalty .* got ",
        ),
        (lambda: Gaussian(HUGE), r"Expected the Gaussian noise scale > 0 \(a finite float\), got "),
        (
            lambda: train_test_split(torch.randn(5, 2), torch.randn(5), test_fraction=HUGE),
            r"Expected test_fraction in \(0, 1\), got ",
        ),
        (
            lambda: plot_regression(gaussian_preds(), torch.arange(3.0), num_sd=HUGE),
            r"Expected num_sd > 0, the bands' half-width in standard deviations, got ",
        ),
    ],
)
def test_an_int_beyond_every_float_is_refused_as_such(call, message):
    # each was "OverflowError: int too large to convert to float", from float() deep inside
    with pytest.raises(ValueError, match=message + ABOUT):
        call()


def test_conformal_alpha_beyond_every_float_is_refused_as_out_of_range():
    with pytest.raises(ValueError, match=r"Expected alpha in \(0, 1\), the allowed miscoverage"):
        conformal(class_preds(), alpha=HUGE)
    with pytest.raises(ValueError, match=r"ConformalClassifier: expected alpha in \(0, 1\)"):
        ConformalClassifier("lac", HUGE, 0.5, 0.01, 1, 0)
    with pytest.raises(ValueError, match=r"ConformalClassifier: expected lam >= 0 .*" + ABOUT):
        ConformalClassifier("raps", 0.1, 0.5, HUGE, 1, 0)


def test_numpy_and_tensor_numbers_are_still_taken():
    assert Gaussian(np.float64(0.3)).fixed == pytest.approx(0.3)
    assert Gaussian(torch.tensor(0.25)).fixed == pytest.approx(0.25)
    assert TemperatureScaler(np.float32(1.5)).temperature == pytest.approx(1.5)
    assert gaussian_preds().quantile(np.float64(0.5)).shape == (3, 1)
    assert rotate(torch.rand(2, 1, 8, 8), np.int64(30), normalized=False).shape == (2, 1, 8, 8)
    split = train_test_split(torch.randn(10, 2), torch.randn(10), test_fraction=np.float32(0.2))
    assert split[2].shape[0] == 2


# -- regression ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "0.5"])
def test_cdf_refuses_what_is_neither_a_number_nor_a_tensor(value):
    # was "TypeError: must be real number, not NoneType" / "new(): invalid data type 'str'"
    with pytest.raises(TypeError, match=r"Expected cdf's value to be one number or a tensor of "):
        gaussian_preds().cdf(value)
    assert gaussian_preds().cdf([0.0, 1.0, 2.0]).shape == (3, 1)


def test_plot_regression_refuses_an_empty_x_by_its_shape():
    # was torch's "cannot reshape tensor of 0 elements into shape [0, -1]"
    with pytest.raises(ValueError, match=r"Expected x with one value per point.* got shape \(0,\)"):
        plot_regression(gaussian_preds(), torch.zeros(0))


# -- loaders, data files, devices and folders ------------------------------------------------


@pytest.mark.parametrize("state", [None, torch.zeros(3)])
def test_set_rng_state_refuses_what_get_rng_state_never_returns(state):
    # was torch's "expected a torch.ByteTensor, but got NoneType" / "RNG state must be a ..."
    loader = ArrayLoader(torch.randn(6, 2), torch.randn(6), 2, seed=0)
    with pytest.raises(TypeError, match=r"ArrayLoader.set_rng_state\(\) expects the torch.uint8"):
        loader.set_rng_state(state)
    images = torch.zeros(4, 28, 28, dtype=torch.uint8)
    labels = torch.zeros(4, dtype=torch.long)
    tensors = TensorLoader(images, labels, 2, shuffle=True, flatten=False, normalize=True, seed=0)
    with pytest.raises(TypeError, match=r"TensorLoader.set_rng_state\(\) expects the torch.uint8"):
        tensors.set_rng_state(state)
    loader.set_rng_state(loader.get_rng_state())  # its own state is taken


def test_a_data_root_that_is_not_a_path_or_is_empty_is_refused():
    # was pathlib's "expected str, bytes or os.PathLike object, not int"
    with pytest.raises(TypeError, match=r"Expected root to be a folder path \(str or pathlib"):
        mnist_arrays("test", root=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Expected root to be a folder path .* got int"):
        load_mnist(root=1)  # type: ignore[arg-type]
    # an empty name was read as the current folder (pathlib's '.'): its MNIST/raw/ loaded, or
    # download=True fetched into it, as the command's --data-root "" did before e36b639
    empty = r"Expected root to be a folder's name, got '', an empty one, which pathlib reads as "
    with pytest.raises(ValueError, match=empty + r"the current folder .* or root=None for \$PY"):
        mnist_arrays("test", root="")
    # (a blank one is no current folder to pathlib: Path(' ') names a folder ' ')
    with pytest.raises(
        ValueError, match=r"got '\\t ', a blank one \(whitespace only\), which pathlib takes"
    ):  # (a tab was called "spaces only")
        load_mnist(root="\t ", download=True)
    with pytest.raises(ValueError, match=empty):
        ood_loader(root="")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: load_mnist(device="tpu"), r"load_mnist\(\): expected device to be a torch device"),
        (
            lambda: ood_loader(device="meta"),
            r"ood_loader\(\): device='meta' holds shapes, no value",
        ),
    ],
)
def test_a_loader_device_torch_cannot_use_is_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_loader_without_a_gpu_is_refused_by_name():
    # was torch's "Found no NVIDIA driver on your system", after the files were read
    with pytest.raises(ValueError, match=r"load_mnist\(\): torch cannot use device='cuda' here"):
        load_mnist(device="cuda")


def test_a_loader_device_given_as_torch_device_is_taken():
    train, _ = load_mnist(64, train_size=64, device=torch.device("cpu"))
    assert train.images.device.type == "cpu"


def test_save_figures_refuses_an_out_dir_that_is_not_a_path(tmp_path):
    import matplotlib.pyplot as plt

    fig = plt.figure()
    try:
        with pytest.raises(TypeError, match=r"Expected out_dir to be a folder path .* NoneType"):
            save_figures({"a": fig}, None)  # type: ignore[arg-type]
        assert save_figures({"a": fig}, Path(tmp_path) / "figs")[0].is_file()
    finally:
        plt.close("all")


# -- guides and fit() ------------------------------------------------------------------------


def test_a_guide_site_that_does_not_exist_is_named_with_the_sites(pair):
    _, guide = pair
    # was a bare "KeyError: '0.wieght'"
    with pytest.raises(KeyError, match=r"'0.wieght' is not a site of this guide; its sites are"):
        guide.site_loc("0.wieght")
    with pytest.raises(KeyError, match=r"None is not a site of this guide"):
        guide.site_scale(None)  # type: ignore[arg-type]


def test_fit_refuses_a_loader_that_is_not_iterable(pair):
    model, guide = pair
    # was "'NoneType' object is not iterable", from the epoch's loop
    with pytest.raises(TypeError, match=r"Expected train_loader to be an iterable of \(x, y\) bat"):
        fit(model, guide, None, epochs=1, progress=False)  # type: ignore[arg-type]


def test_fit_and_the_elbo_refuse_a_guide_that_is_not_callable(pair, data):
    model, _ = pair
    x, y = data
    loader = ArrayLoader(x, y, 6, seed=0)
    # was "'str' object is not callable", from fit()'s probe
    with pytest.raises(TypeError, match=r"fit\(\): expected the guide to be callable .* got str"):
        fit(model, "guide", loader, epochs=1, progress=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"KLWeightedELBO: expected the guide to be callable"):
        KLWeightedELBO().loss(model, 3, x, y)


# -- diagnostics -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def idata(pair, data):
    model, guide = pair
    return to_inference_data(model, guide, *data, num_samples=4, seed=0)


def test_var_names_that_are_no_names_are_refused(pair, data, idata):
    model, guide = pair
    # was "'int' object is not iterable"
    with pytest.raises(TypeError, match=r"to_inference_data\(\): expected var_names to be a var"):
        to_inference_data(model, guide, *data, num_samples=2, var_names=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"summary\(\): expected var_names to be a variable name"):
        summary(idata, var_names=1)  # type: ignore[arg-type]
    assert len(summary(idata, var_names=("0.bias",))) == 3


@pytest.mark.parametrize("hdi_prob", [True, 1.0, "0.9", 1.5, float("nan")])
def test_summary_refuses_an_hdi_prob_outside_zero_one(idata, hdi_prob):
    # True and 1.0 were arviz's "Too few elements for interval calculation", "0.9" its TypeError
    with pytest.raises(
        ValueError, match=r"summary\(\): expected hdi_prob in \(0, 1\), the HDI's"
    ) as refused:
        summary(idata, hdi_prob=hdi_prob)
    if hdi_prob == "0.9":  # a number in a string: told the float to pass
        assert "got '0.9' (a string: pass a float, hdi_prob=0.9). Pass e.g." in str(refused.value)


def test_summary_takes_a_numpy_hdi_prob(idata):
    assert "hdi_5%" in summary(idata, hdi_prob=np.float64(0.9)).columns


# -- plots of images -------------------------------------------------------------------------


@pytest.mark.parametrize("normalized", ["no", 0])
def test_image_plots_refuse_a_normalized_that_is_no_flag(normalized):
    import matplotlib.pyplot as plt

    preds, images = class_preds(), torch.rand(6, 1, 4, 4)
    # "no" was taken as True: [0, 1] images drawn as if normalised
    with pytest.raises(TypeError, match=r"Expected normalized to be True, False or None \(None: "):
        plot_image_grid(preds, images, rows=1, cols=2, normalized=normalized)
    with pytest.raises(TypeError, match=r"False for \[0, 1\]\."):
        plot_most_uncertain(preds, images, k=2, normalized=normalized)
    plot_image_grid(preds, images, rows=1, cols=2, normalized=np.bool_(False))
    plt.close("all")


def test_the_public_names_used_here_are_exported():
    for name in ("ConformalClassifier", "TemperatureScaler", "summary", "save_figures"):
        assert name in pyrouq.__all__
