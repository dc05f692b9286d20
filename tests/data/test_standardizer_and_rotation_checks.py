"""Audit 7 of the tabular helpers (Standardizer) and of the rotation sweep's input checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import pyrouq
from pyrouq import Standardizer, evaluate_rotations, rotate


def test_standardizer_transform_of_an_array_says_to_wrap_it_in_a_tensor():
    x, y = torch.randn(6, 2), torch.randn(6)
    scaler = Standardizer.fit(x, y)
    # a float32 array was told "expected a floating-point tensor, got float32; pass x.float()"
    with pytest.raises(
        TypeError,
        match=r"transform_x\(\): expected x to be a torch.Tensor, got ndarray; wrap it with "
        r"torch.as_tensor",
    ):
        scaler.transform_x(x.numpy())
    with pytest.raises(TypeError, match=r"transform_y\(\): expected y to be a torch.Tensor, got "):
        scaler.transform_y(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expected a floating-point tensor, got torch.int64"):
        scaler.transform_x(x.long())
    # the tensor path is unchanged: unbiased statistics of the training rows
    wide = x.double().numpy()
    expected = (wide - wide.mean(0)) / wide.std(0, ddof=1)
    np.testing.assert_allclose(scaler.transform_x(x).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("which", ["x", "y"])
def test_standardizer_fit_of_no_columns_is_a_clear_error(which):
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    args = {"x": x, "y": y, which: torch.zeros(4, 0)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it warned "std(): degrees of freedom is <= 0"
        with pytest.raises(ValueError, match=rf"{which} of shape \(4, 0\) has no columns"):
            Standardizer.fit(args["x"], args["y"])


def test_standardizer_fit_of_one_row_says_what_to_do():
    # it said "needs at least 2 rows to measure a spread, got 1." and no more
    x, y = torch.tensor([[2.0, 4.0]]), torch.tensor([3.0])
    told = (
        r"needs at least 2 rows to measure a spread, got 1; fit it on the training split \(2 "
        r"rows or more\), or make one of statistics you know: Standardizer\(x_mean, x_std, "
        r"y_mean, y_std\), a tensor each\.$"
    )
    with pytest.raises(ValueError, match=told):
        Standardizer.fit(x, y)
    known = Standardizer(x[0], torch.tensor([1.0, 2.0]), y[0], torch.tensor(0.5))  # as told
    assert known.transform(x + 1, y + 1)[0].tolist() == [[1.0, 0.5]]
    assert known.transform_y(y + 1).tolist() == [2.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_standardizer_transforms_return_the_wider_dtype_whatever_the_columns(dtype):
    # x and y of shape (N,) (0-d statistics) came back float16, of shape (N, D) float32
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 3, generator=g), torch.randn(10, generator=g)
    for scaler, values in ((Standardizer.fit(x, y), (x, y)), (Standardizer.fit(y, x), (y, x))):
        low = tuple(v.to(dtype) for v in values)
        got = (scaler.transform_x(low[0]), scaler.transform_y(low[1]), *scaler.transform(*low))
        assert [t.dtype for t in got] == [torch.float32] * 4
        exact = ((low[1].float() - scaler.y_mean) / scaler.y_std, scaler.transform_x(low[0]))
        assert torch.equal(got[1], exact[0]) and torch.equal(got[2], exact[1])
    # float64 inputs stay float64; a float16 scaler gives float32 inputs float32
    assert Standardizer.fit(x, y).transform_y(y.double()).dtype == torch.float64
    assert Standardizer.fit(x.half(), y.half()).transform_y(y).dtype == torch.float32
    # statistics given by hand in two dtypes: the widest of the three, the std's too
    mixed = Standardizer(torch.zeros(3), torch.full((3,), 2.0, dtype=torch.float64),
                         torch.zeros(()), torch.tensor(2.0, dtype=torch.float64))  # fmt: skip
    got = (mixed.transform_x(x.to(dtype)), mixed.transform_y(y.to(dtype)))
    assert [t.dtype for t in got] == [torch.float64] * 2
    assert torch.equal(got[1], y.to(dtype).double() / 2)


def test_standardizer_transforms_refuse_nan_and_inf_in_fits_words():
    # fit() refused NaN; transform_x() and transform_y() passed it on as NaN in silence
    x, y = torch.randn(6, 2), torch.randn(6)
    scaler = Standardizer.fit(x, y)
    told = r"holds NaN or inf; remove or repair those rows first: 1 of 6, at rows \[4\]\."
    with pytest.raises(ValueError, match=r"^Standardizer\.fit\(\): y " + told):
        Standardizer.fit(x, torch.where(torch.arange(6) == 4, torch.nan, y))
    with pytest.raises(ValueError, match=r"^Standardizer\.transform_y\(\): y " + told):
        scaler.transform_y(torch.where(torch.arange(6) == 4, torch.nan, y))
    with pytest.raises(ValueError, match=r"^Standardizer\.transform_x\(\): x " + told):
        scaler.transform_x(torch.where(torch.arange(6)[:, None] == 4, torch.inf, x))
    with pytest.raises(ValueError, match=r"^Standardizer\.transform_y\(\): y holds NaN"):
        scaler.transform(x, y.clone().fill_(torch.nan))
    assert scaler.transform_x(x[:0]).shape == (0, 2)  # no rows: nothing to refuse


def test_evaluate_rotations_reads_y_against_a_valid_batch_of_images():
    model = pyrouq.MLP(hidden_features=4)
    # a 0-d x raised IndexError: tuple index out of range
    with pytest.raises(ValueError, match=r"Expected images of shape .* got shape \(\)"):
        evaluate_rotations(model, torch.tensor(1.0), torch.tensor([3]), progress=False)
    # one flattened image was told "Expected y of shape (N,) = (784,)"
    with pytest.raises(
        ValueError, match=r"got shape \(784,\); .*for one image use images.unsqueeze\(0\)"
    ):
        evaluate_rotations(model, torch.randn(784), torch.tensor([3]), progress=False)
    with pytest.raises(ValueError, match=r"for one image use images.unsqueeze\(0\)"):
        rotate(torch.randn(28, 28), 30)
    # a batch of non-square flattened images gets no single-image hint
    with pytest.raises(
        ValueError, match=r"got shape \(5, 700\); reshape flattened images to \(N, C, H, W\) unless"
    ):
        rotate(torch.randn(5, 700), 30)
    # a valid batch still has its labels checked against its N
    with pytest.raises(ValueError, match=r"Expected y of shape \(N,\) = \(5,\)"):
        evaluate_rotations(model, torch.randn(5, 784), torch.arange(3), progress=False)
