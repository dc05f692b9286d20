"""Arguments and the words refusing them: a hand-made conformal predictor's thresholds (numpy
arrays taken as lists are, a negative class threshold refused), BatchEnsemble convolutions'
padding_mode and unknown keywords named after the public class, option names that slipped in
case or joins asked "did you mean", the flags' what-to-pass, mean_set_size()'s words for a list,
and fit(num_data=) against the loader's dataset and batches."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from torch import nn

import pyrouq
from pyrouq import (
    ArrayLoader,
    ConformalClassifier,
    ConformalRegressor,
    GaussianPredictions,
    Predictions,
    class_conditional_coverage,
    coverage,
    fit,
    mean_field_guide,
    mean_set_size,
    plot_uncertainty_distributions,
)
from pyrouq.nn import BatchEnsembleConv2d, BatchEnsembleConvTranspose2d

QUIET = {"progress": False}


# -- 1. a hand-made ConformalRegressor's threshold as a numpy array ----------------------------


@pytest.mark.parametrize(
    "threshold",
    [
        np.array([0.5, 2.0]),
        np.array([0.5, 2.0], dtype=np.float32),
        np.array([0.5, 2.0], dtype=">f8"),  # big-endian (torch refuses it as it is)
        np.array([0.5, 2.0])[::-1][::-1],  # a view
    ],
)
def test_a_regressor_takes_a_numpy_threshold_as_it_takes_a_list(threshold):
    # was: "expected threshold as a floating (D,) tensor ... got ndarray", a list being taken
    reg = ConformalRegressor("abs", 0.1, threshold)
    assert reg == ConformalRegressor("abs", 0.1, [0.5, 2.0])
    assert reg.threshold.dtype == torch.float64 and reg.threshold.device.type == "cpu"
    # by hand: one draw of mean 0 and sd 1 per output, intervals -+ threshold * 1
    preds = GaussianPredictions(torch.zeros(1, 3, 2), torch.ones(1, 3, 2))
    lo, hi = reg.intervals(preds)
    expected = torch.tensor([[0.5, 2.0]] * 3, dtype=torch.float64)
    torch.testing.assert_close(hi, expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(lo, -expected, rtol=0, atol=1e-12)


def test_a_regressor_takes_an_integer_array_and_numpy_scalars_in_a_list():
    assert ConformalRegressor("cqr", 0.1, np.array([1, -2])).threshold.tolist() == [1.0, -2.0]
    listed = ConformalRegressor("abs", 0.1, [np.float32(0.25), np.int64(1)])
    assert listed.threshold.tolist() == [0.25, 1.0]


def test_a_regressor_refuses_a_bare_numpy_number_as_a_python_one():
    for value in (np.float64(0.5), 0.5):
        with pytest.raises(ValueError, match=r"got float(64)?; for one output pass torch.tensor"):
            ConformalRegressor("abs", 0.1, value)
    with pytest.raises(ValueError, match=r"expected thresholds >= 0 for score 'abs'"):
        ConformalRegressor("abs", 0.1, np.array([-1.0]))


# -- 2. a hand-made ConformalClassifier's negative threshold ---------------------------------


def test_every_class_score_is_at_least_zero_so_a_negative_threshold_is_refused():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(4, 50, 6, generator=g), -1)
    preds = Predictions(probs)
    for score, lam in (("lac", 0.0), ("aps", 0.0), ("raps", 0.5)):
        scores = ConformalClassifier(score, 0.1, 0.5, lam, 1, 0).scores(preds)
        assert float(scores.min()) >= 0.0  # 1 - p, a mass, plus penalties: never below 0
    for threshold in (-1, -1e-9, np.float32(-0.5), -float("inf")):
        # was: accepted, and every set came out empty
        with pytest.raises(ValueError, match=r"ConformalClassifier: expected threshold >= 0, got"):
            ConformalClassifier("raps", 0.1, threshold, 0.5, 1, 0)
    message = (
        r"every score is at least 0 \('lac' 1 - p, 'aps' and 'raps' a probability mass, plus "
        r"penalties\), so no class is ever within a negative threshold and every set would be "
        r"empty\. conformal\(\) makes it from held-out predictions; pass a threshold >= 0"
    )
    with pytest.raises(ValueError, match=message):
        ConformalClassifier("lac", 0.1, -1, 0.0, 0, 0)
    zero = ConformalClassifier("lac", 0.1, 0.0, 0.0, 0, 0)  # 0 admits a class of p = 1
    sure = Predictions(torch.tensor([[[1.0, 0.0], [0.5, 0.5]]]))
    assert zero.predict_sets(sure).tolist() == [[True, False], [False, False]]


# -- 3. BatchEnsemble convolutions: padding_mode and unknown keywords ------------------------


def test_a_conv_refuses_a_padding_mode_not_a_name_saying_what_it_takes():
    # was: TypeError "unhashable type: 'list'"
    with pytest.raises(
        ValueError,
        match=r"Expected BatchEnsembleConv2d's padding_mode to be one of \('zeros', 'reflect', "
        r"'replicate', 'circular'\), got \['zeros'\]\. Pass e\.g\. padding_mode='zeros'\.",
    ):
        BatchEnsembleConv2d(3, 4, 3, 2, padding_mode=["zeros"])
    with pytest.raises(ValueError, match=r"got 'Zeros' \(did you mean 'zeros'\? the names are"):
        BatchEnsembleConv2d(3, 4, 3, 2, padding_mode="Zeros")
    with pytest.raises(
        ValueError,
        match=r"Expected BatchEnsembleConvTranspose2d's padding_mode to be 'zeros', got "
        r"\['zeros'\]\. Pass e\.g\. padding_mode='zeros' \(a transposed convolution pads",
    ):
        BatchEnsembleConvTranspose2d(3, 4, 3, 2, padding_mode=["zeros"])
    circular = BatchEnsembleConv2d(3, 4, 3, 2, padding=1, padding_mode="circular")
    assert circular(torch.randn(4, 3, 5, 5)).shape == (4, 4, 5, 5)


def test_a_conv_refuses_an_unknown_keyword_naming_the_public_class():
    # was: "_BatchEnsembleConv.__init__() got an unexpected keyword argument 'padding_mod'"
    calls = [
        lambda: BatchEnsembleConv2d(3, 4, 3, 2, padding_mod="zeros"),
        lambda: BatchEnsembleConv2d.from_module(nn.Conv2d(3, 4, 3), 2, padding_mod="zeros"),
    ]
    for call in calls:
        with pytest.raises(TypeError) as caught:
            call()
        text = str(caught.value)
        assert "_BatchEnsembleConv" not in text
        assert text == (
            "BatchEnsembleConv2d got the keyword argument(s) 'padding_mod' (did you mean "
            "'padding_mode'?), which it does not take: beside the channels, kernel_size and "
            "num_members it takes Conv2d's settings (stride, padding, dilation, groups, "
            "padding_mode), the factor options (init, r_mean, r_std, s_mean, s_std) and base (a "
            "Conv2d to copy)."
        )
    with pytest.raises(TypeError, match=r"BatchEnsembleConvTranspose2d got the keyword .*'foo'.*"
                       r"output_padding\).* Leave them out\."):  # fmt: skip
        BatchEnsembleConvTranspose2d(3, 4, 3, 2, foo=1)
    with pytest.raises(TypeError, match=r"\(a Conv2d to copy\)\. Every member has biases of its "
                       r"own \(from 0 where base has none\), so there is no bias= to set: leave "
                       r"it out\.$"):  # fmt: skip
        BatchEnsembleConv2d(3, 4, 3, 2, bias=False)
    no_bias = BatchEnsembleConv2d(3, 4, 3, 2, base=nn.Conv2d(3, 4, 3, bias=False))
    assert torch.equal(no_bias.bias, torch.zeros(2, 4))  # (what the words say)


# -- 4. option names that slipped: did you mean ----------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pyrouq.bayesian(nn.Linear(3, 2), select="Last_Layer"),
         r"Unknown select 'Last_Layer' \(did you mean 'last_layer'\? the names are lower case\): "
         r"expected None"),
        (lambda: pyrouq.bayesian(nn.Linear(3, 2), likelihood="Gaussian"),
         r"Unknown likelihood 'Gaussian' \(did you mean 'gaussian'\? the names are lower case\)"),
        (lambda: pyrouq.batchensemble(nn.Linear(3, 2), 2, init="Normal"),
         r"Unknown init 'Normal' \(did you mean 'normal'\? the names are lower case\)"),
        (lambda: pyrouq.batchensemble(nn.Linear(3, 2), 2, norms="per-member"),
         r"Unknown norms 'per-member' \(did you mean 'per_member'\? the names join their words "
         r"with '_'\): expected 'shared'"),
        (lambda: pyrouq.batchensemble(nn.Linear(3, 2), 2, norms=" Per member"),
         r"\(did you mean 'per_member'\? the names are lower case, have no spaces around them "
         r"and join their words with '_'\)"),
        (lambda: pyrouq.decompose(torch.full((1, 2, 2), 0.5), "Zero-One"),
         r"Unknown measure 'Zero-One' \(did you mean 'zero-one'\? the names are lower case\)"),
        (lambda: pyrouq.metrics.ood_scores(torch.full((2, 2), 0.5), "Max-Prob"),
         r"Unknown OOD score 'Max-Prob' \(did you mean 'max_prob'\?"),
        (lambda: pyrouq.likelihoods.Gaussian("Learned"),
         r"Unknown noise scale 'Learned' \(did you mean 'learned'\?"),
        (lambda: pyrouq.likelihoods.Gaussian("0.5"),  # (it said 'Unknown noise scale' alone,
         # then "pass the float 0.5": scale= is what takes it, as test_..._followed_passes does)
         r"^Unknown noise scale '0\.5' \(a string: pass a float, scale=0\.5\): expected a "
         r"float > 0"),
        (lambda: pyrouq.likelihoods.Gaussian("-1"),
         r"^Unknown noise scale '-1' \(a string: pass a float > 0\): expected"),
        (lambda: pyrouq.ood_loader(dataset="Fashion-MNIST"),
         r"Unknown dataset 'Fashion-MNIST' \(did you mean 'fashion-mnist'\?"),
        (lambda: GaussianPredictions(torch.zeros(1, 2, 1), torch.ones(1, 2, 1)).uncertainty(
            "Variance"),
         r"got measure='Variance' \(did you mean 'variance'\? the names are lower case\)\. Call "
         r"uncertainty\(\)"),
    ],
)  # fmt: skip
def test_an_option_name_slipped_in_case_or_joins_is_asked_did_you_mean(call, message):
    # was: the names listed, the one meant not told
    with pytest.raises(ValueError, match=message):
        call()


def _classifier_of(*args, **kwargs):
    return ConformalClassifier("lac", 0.1, *args, lam=0.0, k_reg=0, seed=0, **kwargs)


@pytest.mark.parametrize(
    ("make", "given", "field", "taken"),
    [
        (pyrouq.likelihoods.Gaussian, "0.5", "fixed", 0.5),  # (was "pass the float 0.5")
        (_classifier_of, "inf", "threshold", float("inf")),  # (was told nothing)
        (_classifier_of, "0.25", "threshold", 0.25),
    ],
)
def test_a_number_in_a_string_is_told_the_keyword_that_takes_it(make, given, field, taken):
    with pytest.raises(ValueError) as info:
        make(given)
    advice = re.search(r"\(a string: pass a float, (\w+)=(\S+)\)[.:]", str(info.value))
    assert advice, str(info.value)
    name, written = advice.groups()
    made = make(**{name: eval(written, {"float": float})})  # the advice, followed
    assert getattr(made, field) == taken


@pytest.mark.parametrize(
    ("given", "meant"),
    [("normal", "gaussian"), ("Normal", "gaussian"), ("gauss", "gaussian"),
     (" Gauss", "gaussian"), ("gausian", "gaussian"), ("regression", "gaussian"),
     ("Regression", "gaussian"), ("classification", "categorical"), ("softmax", "categorical")],
)  # fmt: skip
def test_other_words_for_a_likelihood_are_asked_did_you_mean(given, meant):
    # was: no hint, as for a likelihood pyrouq has not ("poisson", below): "Unknown likelihood
    # 'regression': expected one of ['categorical', 'gaussian']", the one meant not told
    # (Laplace's likelihood= takes 'regression' and 'classification')
    said = rf"^Unknown likelihood {given!r} \(did you mean {meant!r}\?\): expected one of"
    with pytest.raises(ValueError, match=said):
        pyrouq.bayesian(nn.Linear(3, 2), likelihood=given)
    with pytest.raises(ValueError, match=said):
        pyrouq.likelihoods.get_likelihood(given)


@pytest.mark.parametrize(
    ("given", "scale"),
    [("heteroscedastic", "heteroscedastic"), ("Heteroskedastic", "heteroscedastic"),
     ("learned", "learned")],
)  # fmt: skip
def test_a_noise_scale_given_as_the_likelihood_is_told_the_gaussian_that_takes_it(given, scale):
    # was: "Unknown likelihood 'heteroscedastic': expected one of ['categorical', 'gaussian'] or
    # a ... Likelihood instance (e.g. pyrouq.likelihoods.Gaussian(0.5))": a fixed noise offered
    with pytest.raises(ValueError) as caught:
        pyrouq.bayesian(nn.Linear(3, 2), likelihood=given)
    advice = re.search(r"pass likelihood=pyrouq\.(Gaussian\('\w+'\))\)", str(caught.value))
    assert advice, str(caught.value)
    made = pyrouq.bayesian(nn.Linear(3, 2), likelihood=eval(advice.group(1), vars(pyrouq)))
    assert made.likelihood.mode == scale  # the advice, followed


def test_a_description_naming_a_noise_scale_is_not_told_to_pass_a_gaussian():
    # a likelihood's description (a checkpoint's, a dict) is not what a user typed: no advice
    # to write likelihood=pyrouq.Gaussian(...) there
    with pytest.raises(ValueError) as caught:
        pyrouq.likelihoods.get_likelihood({"name": "heteroscedastic"})
    assert str(caught.value).startswith("Unknown likelihood {'name': 'heteroscedastic'}: expected")
    assert "noise scale" not in str(caught.value)


@pytest.mark.parametrize(
    ("given", "meant"),
    [("heteroskedastic", "heteroscedastic"), ("Heteroskedastic", "heteroscedastic"),
     ("hetero", "heteroscedastic"), ("heteroscedastc", "heteroscedastic"), ("learnt", "learned"),
     ("learn", "learned")],
)  # fmt: skip
def test_a_noise_scale_of_another_spelling_or_a_typo_is_asked_did_you_mean(given, meant):
    # was: "Unknown noise scale 'heteroskedastic': expected a float > 0, 'learned', ...", the
    # one meant not told (only a slip of case was asked), though a likelihood's name is
    with pytest.raises(ValueError, match=rf"^Unknown noise scale {given!r} \(did you mean "
                       rf"{meant!r}\?\): expected a float > 0"):  # fmt: skip
        pyrouq.likelihoods.Gaussian(given)


@pytest.mark.parametrize(
    ("call", "given", "meant"),
    [
        (lambda v: pyrouq.ood_loader(dataset=v), "fashion", "fashion-mnist"),
        (lambda v: pyrouq.ood_loader(dataset=v), "fmnist", "fashion-mnist"),
        (lambda v: pyrouq.ood_loader(dataset=v), "fashion_mnist", "fashion-mnist"),
        (lambda v: pyrouq.ood_loader(dataset=v), "mnsit", "mnist"),
        # (difflib's closest name is 'mnist': was asked 'mnist')
        (lambda v: pyrouq.ood_loader(dataset=v), "F-MNIST", "fashion-mnist"),
        (lambda v: pyrouq.ood_loader(dataset=v), "f_mnist", "fashion-mnist"),
        (lambda v: plot_uncertainty_distributions(torch.full((2, 2), 0.5), kind=v), "histogram",
         "hist"),
        (lambda v: plot_uncertainty_distributions(torch.full((2, 2), 0.5), kind=v), "cdf",
         "ecdf"),
    ],
)  # fmt: skip
def test_another_word_or_a_typo_for_a_dataset_or_plot_kind_is_asked_did_you_mean(
    call, given, meant
):
    # was: only a slip of case or spaces was asked ('fashion': the names listed, none meant)
    with pytest.raises(ValueError, match=rf"Unknown \w+ {given!r} \(did you mean {meant!r}\?\)"):
        call(given)


@pytest.mark.parametrize("given", ["kmnist", "EMNIST", "qmnist"])
def test_another_mnist_like_data_set_is_not_asked_did_you_mean_mnist(given):
    # was: "(did you mean 'mnist'?)", a data set the user did not mean, one letter away
    with pytest.raises(ValueError) as caught:
        pyrouq.ood_loader(dataset=given)
    assert str(caught.value).startswith(f"Unknown dataset {given!r}: expected 'fashion-mnist'")


def test_a_name_that_slipped_from_none_gets_no_guess_and_a_slip_is_not_taken():
    with pytest.raises(ValueError) as caught:
        pyrouq.bayesian(nn.Linear(3, 2), likelihood="poisson")
    assert "did you mean" not in str(caught.value)
    assert str(caught.value).startswith("Unknown likelihood 'poisson': expected one of")
    model, guide = _model_and_guide()
    with pytest.raises(ValueError, match=r"Unknown distributed_draws 'Identical' \(did you mean "):
        fit(model, guide, [toy_data(8)], epochs=1, num_data=8, distributed_draws="Identical",
            **QUIET)  # fmt: skip


# -- 5. flags ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        (0, "Pass progress=False."),
        (1, "Pass progress=True."),
        (np.int64(0), "Pass progress=False."),
        ("False", "Pass progress=False, a bool (not a string)."),
        ("no", "Pass progress=True or progress=False."),
        (None, "Pass progress=True or progress=False."),
    ],
)
def test_a_flag_that_is_no_bool_is_told_what_to_pass(value, fix):
    # was: "Expected progress to be True or False, got 0." and no more
    model, guide = _model_and_guide()
    expected = f"Expected progress to be True or False, got {value!r}. {fix}"
    with pytest.raises(TypeError, match=f"^{re.escape(expected)}$"):
        fit(model, guide, [toy_data(8)], epochs=1, num_data=8, progress=value)


# -- 6. mean_set_size() of a list ----------------------------------------------------------------


def test_mean_set_size_of_a_list_is_told_to_convert_it_not_to_pass_intervals():
    # was: "...; for intervals pass the tuple (lo, hi) that intervals() returns", which
    # mean_set_size() refuses in turn
    for call in (
        lambda: mean_set_size([[True, False], [True, True]]),
        lambda: class_conditional_coverage([[True, False]], torch.tensor([0])),
    ):
        with pytest.raises(TypeError) as caught:
            call()
        assert str(caught.value).endswith(
            "got list; convert a list of boolean rows with torch.tensor(sets), or make sets "
            "with conformal(val_preds, val_targets).predict_sets(preds)."
        )
    rows = [torch.tensor([True, False]), torch.tensor([True, True])]
    with pytest.raises(TypeError, match=r"convert a list of boolean rows with torch.stack\(sets"):
        mean_set_size(rows)
    assert mean_set_size(torch.stack(rows)) == 1.5
    with pytest.raises(TypeError, match=r"intervals \(lo, hi\) have neither a size in classes"):
        mean_set_size([torch.zeros(3), torch.ones(3)])
    with pytest.raises(TypeError, match=r"for intervals pass the tuple \(lo, hi\) that intervals"
                       r"\(\) returns, for sets an \(N, C\) boolean tensor"):  # fmt: skip
        coverage([[True, False]], torch.tensor([0]))


# -- 7. fit(num_data=) against the loader ------------------------------------------------------


def _model_and_guide():
    torch.manual_seed(0)
    model = tiny_mlp()
    return model, mean_field_guide(model)


def test_fit_warns_of_a_num_data_below_the_dataset_naming_both():
    # was: trained silently, the likelihood weighed 16/12 times less against the KL
    x, y = toy_data(16)
    model, guide = _model_and_guide()
    with pytest.warns(UserWarning) as caught:
        result = fit(model, guide, ArrayLoader(x, y, batch_size=8), epochs=1, num_data=12,
                     **QUIET)  # fmt: skip
    told = [str(w.message) for w in caught if "num_data" in str(w.message)]
    assert told == [
        "fit(num_data=12) is below the 16 examples of train_loader's dataset: the likelihood is "
        "scaled by N/B as if the training set were 12 examples, so the data weigh 1.33 times "
        "less against the KL than they would with N = 16. Pass num_data=16, or leave it out "
        "(fit() reads it from the loader); keep it only if the loader draws from a larger set "
        "on purpose."
    ]
    assert caught[0].filename == __file__  # the user's line
    assert result.num_data == 12  # warned, not changed


def test_fit_takes_num_data_equal_to_the_examples_counted_without_a_word():
    x, y = toy_data(16)
    subset = torch.utils.data.SubsetRandomSampler(range(10))  # N: the 10 indices drawn from
    loaders = [
        (ListLoader(x, y, 8), 16),
        (torch.utils.data.DataLoader(ListLoader(x, y, 8).dataset, 5, sampler=subset), 10),
        (ListLoader(x, y, 8), 40),  # above the dataset: each rank's shard, say
    ]
    for loader, n in loaders:
        model, guide = _model_and_guide()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert fit(model, guide, loader, epochs=1, num_data=n, **QUIET).num_data == n


def test_fit_refuses_a_batch_of_more_than_num_data_examples():
    # was: trained with the likelihood scaled by N/B = 4/16 < 1
    x, y = toy_data(16)
    model, guide = _model_and_guide()
    message = (
        r"^fit\(\): batch 1 of epoch 1 holds 16 examples, more than N = 4, the training-set "
        r"size \(num_data\): the likelihood's scale N/B = 4/16 is below 1, though a training "
        r"set of N examples has no batch of more than N\. Pass num_data=N, the number of "
        r"training examples, or leave it out for a loader with a sized dataset; for the "
        r"per-example loss mean CE \+ k \* KL, keep N and pass kl_weight=k \* N\.$"
    )
    with pytest.raises(ValueError, match=message):
        fit(model, guide, [(x, y)], epochs=1, num_data=4, **QUIET)
    model, guide = _model_and_guide()
    with pytest.warns(UserWarning, match=r"fit\(num_data=4\) is below the 16 examples"):
        with pytest.raises(ValueError, match=r"batch 1 of epoch 1 holds 8 examples, more than"):
            fit(model, guide, ListLoader(x, y, 8), epochs=1, num_data=4, **QUIET)


def test_fit_lets_a_sampler_with_replacement_draw_batches_above_num_data():
    x, y = toy_data(6)
    data = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.RandomSampler(data, replacement=True, num_samples=16)
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler)
    model, guide = _model_and_guide()
    assert fit(model, guide, loader, epochs=1, **QUIET).num_data == 6  # batches of 8 of N = 6
