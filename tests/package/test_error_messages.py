"""Error-message sweep: each refusal below says what was expected, what came and what to do
(a fix where one exists), and none names a cause that is not the case.

Every case is triggered through the public API and matches the part of the message the sweep
added; each failed on the message it replaced.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import CheckpointError
from pyrouq.regression import mixture_crps


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def _class_preds(n: int = 10) -> tuple[pyrouq.Predictions, torch.Tensor]:
    probs = torch.softmax(torch.randn(2, n, 2), -1)
    return pyrouq.Predictions.from_probs(probs), torch.arange(n) % 2


def _gauss_preds(n: int = 5) -> pyrouq.GaussianPredictions:
    return pyrouq.GaussianPredictions(torch.randn(2, n, 1), torch.ones(2, n, 1))


# --------------------------------------------------------------------------------------------
# Layers and converters
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer",
    [
        lambda: pyrouq.BayesianLinear(3, 2),
        lambda: pyrouq.BatchEnsembleLinear(3, 2, 2),
    ],
)
def test_layer_given_an_array_is_told_to_convert_it(layer):
    with pytest.raises(TypeError, match=r"input, got ndarray; convert it with torch\.as_tensor"):
        layer()(np.zeros((2, 3), dtype=np.float32))


def test_converting_a_class_says_to_build_the_network():
    with pytest.raises(
        TypeError,
        match=r"Expected an nn.Module to make Bayesian, got the class Linear\. Build the "
        r"network: Linear\(\.\.\.\)",
    ):
        pyrouq.bayesian(nn.Linear)


@pytest.mark.parametrize(
    ("convert", "what"),
    [
        (lambda: pyrouq.bayesian(None), "make Bayesian, got NoneType"),
        (lambda: pyrouq.batchensemble("net", 2), "convert into a BatchEnsemble, got str"),
    ],
)
def test_converting_a_non_module_says_what_to_pass(convert, what):
    with pytest.raises(TypeError, match=rf"{what}\. Pass the network, e\.g\. nn\.Sequential"):
        convert()


def test_init_from_a_state_dict_says_to_load_it_into_a_network():
    model = pyrouq.bayesian(_net())
    with pytest.raises(
        TypeError,
        match=r"init_from to be a trained plain nn.Module, got OrderedDict: load it into a "
        r"network .*net\.load_state_dict\(state\), and pass init_from=net",
    ):
        pyrouq.mean_field_guide(model, init_from=_net().state_dict())


# --------------------------------------------------------------------------------------------
# Recalibration
# --------------------------------------------------------------------------------------------


def test_temperature_scale_of_a_tensor_says_how_to_wrap_it():
    preds, y = _class_preds()
    with pytest.raises(
        TypeError,
        match=r"got Tensor; wrap probabilities as pyrouq\.Predictions\.from_probs\(val_preds\)",
    ):
        pyrouq.temperature_scale(preds.probs, y)


def test_temperature_scale_of_regression_predictions_points_to_conformal():
    with pytest.raises(
        TypeError,
        match=r"got GaussianPredictions; a regression model's predictions get calibrated "
        r"intervals from conformal\(val_preds, val_targets\)",
    ):
        pyrouq.temperature_scale(_gauss_preds(), torch.zeros(5))


def test_conformal_score_of_the_other_task_says_so():
    preds, y = _class_preds()
    with pytest.raises(
        ValueError,
        match=r"Unknown score 'abs' for classification: expected 'lac', 'aps' or 'raps': 'abs' "
        r"scores regression \(GaussianPredictions\), and val_preds are a classification "
        r"model's Predictions\. Pass one of these, or leave score out \(its default, 'lac'\)",
    ):
        pyrouq.conformal(preds, y, score="abs")
    with pytest.raises(ValueError, match=r"'lac' scores classification .*its default, 'abs'"):
        pyrouq.conformal(_gauss_preds(), torch.zeros(5), score="lac")


def test_conformal_score_in_upper_case_names_the_lower_case_one():
    preds, y = _class_preds()
    with pytest.raises(ValueError, match=r"are lower case\) .*\. Pass score='aps'\.$"):
        pyrouq.conformal(preds, y, score="APS")
    with pytest.raises(ValueError, match=r"are lower case\) .*\. Pass score='cqr'\.$"):
        pyrouq.conformal(_gauss_preds(), torch.zeros(5), score="CQR")


def test_sets_as_a_numpy_array_are_named_an_array_not_bool():
    # it said "got bool.", of a boolean array: the dtype of the array it had not read
    with pytest.raises(
        TypeError, match=r"got ndarray; convert an array with torch\.as_tensor\(sets\)\.$"
    ):
        pyrouq.mean_set_size(np.ones((3, 2), dtype=bool))


def test_float_sets_are_told_to_become_boolean():
    with pytest.raises(TypeError, match=r"got torch\.float32; convert 0/1 .*with sets\.bool\(\)"):
        pyrouq.coverage(torch.ones(3, 2), torch.zeros(3, dtype=torch.long))


# --------------------------------------------------------------------------------------------
# Regression predictions and the scaler
# --------------------------------------------------------------------------------------------


def test_interval_level_out_of_range_gives_an_example():
    with pytest.raises(ValueError, match=r"got 1\.5; e\.g\. 0\.9 \(a 90 % interval\)\."):
        _gauss_preds().interval(1.5)
    with pytest.raises(ValueError, match=r"got 0; e\.g\. 0\.9 \(the 90 % quantile\)\."):
        _gauss_preds().quantile(0)


def test_non_finite_regression_targets_name_their_rows():
    y = torch.tensor([0.0, 1.0, float("nan"), 2.0, float("inf")])
    with pytest.raises(ValueError, match=r"NaN or inf in 2 of 5 rows \(rows \[2, 4\]\)"):
        _gauss_preds().evaluate(y)


def test_mixture_crps_names_the_type_and_the_conversion():
    # it said "got <class 'list'>."
    with pytest.raises(
        TypeError,
        match=r"expected loc as a tensor, got list; convert it with torch\.as_tensor\(loc\)\.$",
    ):
        mixture_crps([0.0], torch.ones(2, 5), torch.zeros(5))


def test_plot_regression_train_y_as_a_list_says_to_convert_it():
    pytest.importorskip("matplotlib")
    with pytest.raises(TypeError, match=r"train_y .*got list; pass torch\.as_tensor\(train_y\)"):
        pyrouq.plot_regression(
            _gauss_preds(), torch.randn(5), train_x=torch.randn(5), train_y=[0.0] * 5
        )


def test_standardizer_inverse_of_a_tensor_says_how_to_rescale_it():
    scaler = pyrouq.Standardizer.fit(torch.randn(4, 3), torch.randn(4))
    with pytest.raises(
        TypeError, match=r"got Tensor; for a tensor of .*t \* scaler\.y_std \+ scaler\.y_mean"
    ):
        scaler.inverse(torch.randn(4))


def test_gaussian_model_given_list_targets_says_to_convert_them():
    model = pyrouq.bayesian(nn.Linear(3, 1), likelihood="gaussian", num_data=5)
    with pytest.raises(TypeError, match=r"got list\. Convert them with torch\.as_tensor\(y, "):
        model(torch.randn(5, 3), [0.0] * 5)


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------


def test_save_with_the_model_first_says_the_path_comes_first(tmp_path):
    # torch.save(obj, f) takes the object first; pyrouq.save(model, path) said only
    # "expected str, bytes or os.PathLike object, not BatchEnsembleNetwork"
    model = pyrouq.batchensemble(_net(), 2)
    with pytest.raises(
        TypeError,
        match=r"save\(\) expects a file path \(str or pathlib\.Path\) as path, got "
        r"BatchEnsembleNetwork; the path comes first .*save\('model\.pt', model\)",
    ):
        pyrouq.save(model, tmp_path / "m.pt")
    assert not list(tmp_path.iterdir())


def test_load_of_a_non_path_names_it():
    with pytest.raises(
        TypeError, match=r"load\(\) expects a file path .*got int; pass the file pyrouq\.save"
    ):
        pyrouq.load(3)


def test_metadata_that_is_not_json_names_where(tmp_path):
    model = pyrouq.batchensemble(_net(), 2)
    with pytest.raises(
        CheckpointError,
        match=r"got metadata\['m'\]\['acc'\]\[1\] of type Tensor\. Convert tensors with",
    ):
        pyrouq.save(tmp_path / "m.pt", model, metadata={"m": {"acc": [0.5, torch.tensor(0.9)]}})


# --------------------------------------------------------------------------------------------
# MCMC and its draws
# --------------------------------------------------------------------------------------------


def test_mcmc_with_fewer_targets_says_to_pass_one_per_input():
    model = pyrouq.bayesian(_net())
    with pytest.raises(ValueError, match=r"got 5 and 4\. Pass every point and one target per"):
        pyrouq.mcmc(
            model,
            torch.randn(5, 3),
            torch.zeros(4, dtype=torch.long),
            num_samples=2,
            warmup_steps=2,
            progress=False,
        )


def test_posterior_samples_of_unequal_counts_say_what_to_do():
    model = pyrouq.bayesian(_net())
    draws = {
        site: torch.zeros(2 if k == 0 else 3, *shape)
        for k, (site, shape) in enumerate(model.latent_sites().items())
    }
    with pytest.raises(ValueError, match=r"draw s is one value of every site.*value\[:S\]"):
        pyrouq.predict(model, torch.randn(4, 3), posterior_samples=draws, progress=False)


# --------------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------------


def test_summary_of_a_missing_group_blames_no_batchensemble():
    # a guide export has a posterior; asked for a group it lacks, the message said "A
    # BatchEnsemble export has no posterior: pass group='posterior_predictive'"
    pytest.importorskip("arviz")
    model = pyrouq.bayesian(_net())
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(6, 3), torch.arange(6) % 2
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=4)
    with pytest.raises(ValueError, match=r"no 'prior' group; .*\. Pass one of them as group=\.$"):
        pyrouq.summary(idata, group="prior")
