"""Review of the day's later API changes (1deabab's messages, 7f3647f's positional order):
a common mistaken call that the new order lets through to a misleading error, and messages
whose suggested fix fails or silently gives a wrong value when tried."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyrouq


def _preds(n: int, seed: int) -> pyrouq.Predictions:
    g = torch.Generator().manual_seed(seed)
    return pyrouq.Predictions.from_probs(torch.softmax(torch.randn(4, n, 3, generator=g), -1))


# -- evaluate(predictions, targets, ood, ood_score) -------------------------------------------


def test_evaluate_given_ood_predictions_as_targets_says_where_they_go():
    """evaluate(preds, ood) binds ood to targets; the message said "wrap it with
    torch.as_tensor(...)", which fails on Predictions."""
    preds, ood, y = _preds(8, 0), _preds(5, 1), torch.arange(8) % 3
    with pytest.raises(TypeError, match=r"got Predictions; predictions on out-of-distribution "):
        pyrouq.evaluate(preds, ood)
    with pytest.raises(TypeError, match=r"predictions\.evaluate\(targets, ood=ood\)"):
        preds.evaluate(ood)
    # the fixes it names work, and score the OOD inputs
    assert pyrouq.evaluate(preds, y, ood)["ood_auroc"] == preds.evaluate(y, ood=ood)["ood_auroc"]


def test_evaluate_given_a_score_as_ood_says_the_score_goes_fourth():
    preds, ood, y = _preds(8, 0), _preds(5, 1), torch.arange(8) % 3
    with pytest.raises(TypeError, match=r"got the string 'entropy'; an OOD score goes fourth"):
        pyrouq.evaluate(preds, y, "entropy")
    by_name = pyrouq.evaluate(preds, y, ood=ood, ood_score="entropy")
    assert pyrouq.evaluate(preds, y, ood, "entropy") == by_name


def test_evaluate_given_another_string_or_a_dict_as_ood_is_not_told_of_loaders_or_scores():
    """A data set's name as ood was told 'an OOD score goes fourth, evaluate(predictions,
    targets, ood, 'svhn')', a fix that fails; a dict 'got dict, a loader or batches of
    inputs?'. Now a name slipped from a score's gets that score, another string the
    predictions to pass, a dict its 'probs' or one set at a time."""
    preds, ood, y = _preds(8, 0), _preds(5, 1), torch.arange(8) % 3
    with pytest.raises(TypeError, match=r"ood, 'max_prob'\)\.$"):
        pyrouq.evaluate(preds, y, "Max-Prob")
    with pytest.raises(TypeError) as info:  # (close to 'entropy', but no slip from it)
        pyrouq.evaluate(preds, y, "energy")
    assert str(info.value).endswith(
        "got the string 'energy'; an OOD score goes fourth, evaluate(predictions, targets, ood, "
        "ood_score) with ood_score one of 'mutual_information', 'entropy', 'max_prob', "
        "'variance' (did you mean 'entropy'?)."
    )
    with pytest.raises(TypeError) as info:
        pyrouq.evaluate(preds, y, "svhn")
    assert str(info.value) == (
        "Expected ood to be predictions on out-of-distribution inputs, got the string 'svhn' "
        "(a file or a data set's name?). evaluate() scores predictions, not inputs: predict on "
        "them first, ood=pyrouq.predict(model, ood_inputs, guide), as for the in-distribution "
        "ones."
    )
    told = r"got a dict \(keys 'probs'\)\. Pass its probabilities, ood=ood\['probs'\], or the "
    with pytest.raises(TypeError, match=told + r"Predictions predict\(\) returned\.$"):
        pyrouq.evaluate(preds, y, {"probs": ood.probs})
    told = r"got a dict \(keys 'svhn', 'noise'\)\. Pass one set's predictions at a time, e\.g\. "
    with pytest.raises(TypeError, match=told + r"\{name: evaluate\(predictions, targets, ood=p\)"):
        pyrouq.evaluate(preds, y, {"svhn": ood, "noise": ood})
    assert pyrouq.evaluate(preds, y, ood.probs) == pyrouq.evaluate(preds, y, ood)  # the fix


def test_evaluate_given_a_scores_short_name_is_told_pyrouqs_name():
    """'msp' and 'mi' as ood (the usual short names of max_prob and mutual_information) were
    told they looked like 'a file or a data set's name'; as ood_score, only the names there
    are."""
    preds, ood, y = _preds(8, 0), _preds(5, 1), torch.arange(8) % 3
    with pytest.raises(TypeError) as info:
        pyrouq.evaluate(preds, y, "msp")
    assert str(info.value).endswith(
        "got the string 'msp'; an OOD score goes fourth, evaluate(predictions, targets, ood, "
        "'max_prob') ('max_prob' is pyrouq's name for msp)."
    )
    with pytest.raises(TypeError, match=r"ood, 'mutual_information'\) \('mutual_information' "
                       r"is pyrouq's name for MI\)\.$"):  # fmt: skip
        pyrouq.evaluate(preds, y, "MI")
    with pytest.raises(ValueError, match=r"Unknown ood_score 'msp' \(did you mean 'max_prob'\? "
                       r"pyrouq's name for msp\); expected one of"):  # fmt: skip
        pyrouq.evaluate(preds, y, ood, "msp")
    assert pyrouq.evaluate(preds, y, ood, "max_prob")["ood_auroc"] >= 0  # the name it gives


# -- prediction sets --------------------------------------------------------------------------


def test_probabilities_given_as_sets_are_not_told_to_call_bool():
    """coverage(probs, y) was told "convert 0/1 membership indicators with sets.bool()":
    done, every class of a probability above 0 is in the set, and coverage reads 1.0."""
    preds, y = _preds(30, 2), torch.arange(30) % 3
    probs = preds.mean_probs
    assert pyrouq.coverage(probs.bool(), y) == 1.0  # what that fix gave, silently
    with pytest.raises(
        TypeError, match=r"values other than 0 and 1, so no 0/1 .*predict_sets"
    ) as err:
        pyrouq.coverage(probs, y)
    assert "convert 0/1 membership indicators with sets.bool()" not in str(err.value)
    with pytest.raises(TypeError, match=r"predict_sets\(preds\)"):
        pyrouq.mean_set_size(probs)
    sets = pyrouq.conformal(preds, y, alpha=0.2).predict_sets(preds)  # the fix it names
    assert 0.0 <= pyrouq.coverage(sets, y) <= 1.0
    # 0/1 indicators in a float tensor still get the .bool() hint, which works for them
    indicators = sets.float()
    with pytest.raises(TypeError, match=r"convert 0/1 membership indicators with sets\.bool"):
        pyrouq.coverage(indicators, y)
    assert pyrouq.coverage(indicators.bool(), y) == pyrouq.coverage(sets, y)


# -- mcmc(model, x, y, num_samples, warmup_steps, num_chains) ---------------------------------


def test_mcmc_with_a_guide_where_the_data_go_is_told_so_with_counts_given_by_position():
    """mcmc(model, guide, x, y, 10, 10), to_inference_data's order, shifts y into num_samples:
    the refusal blamed num_samples ("pass a Python number, e.g. int(t)") instead of the guide."""
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(3, 2)))
    guide = pyrouq.mean_field_guide(model)
    x, y = torch.randn(6, 3), torch.arange(6) % 2
    with pytest.raises(TypeError, match=r"got MeanFieldGuide for x\. It takes no guide"):
        pyrouq.mcmc(model, guide, x, y, 10, 10, progress=False)
    with pytest.raises(TypeError, match=r"got NoneType for y\. NUTS samples the posterior"):
        pyrouq.mcmc(model, x, None, 10, 10, progress=False)


def test_mcmc_in_one_autocast_block_runs_the_current_point_estimates():
    """predict(), to_inference_data() and psis_diagnostic() drop autocast's cached casts;
    mcmc() (chains in this process) did not: after the point estimates changed in place (a
    checkpoint loaded, fit() in the same block), its chains ran the old ones' casts."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    model = pyrouq.bayesian(net, select=["2.weight", "2.bias"])  # layer 0: point estimates

    def draws():
        result = pyrouq.mcmc(model, x, y, 3, 3, 1, seed=0, progress=False, parallel=False)
        return result.samples["2.weight"]

    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = draws()
        with torch.no_grad():
            model.net[0].weight.mul_(0.0)
            model.net[0].bias.fill_(-1.0)  # every hidden unit off
        after = draws()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a fresh block: no cached casts
        fresh = draws()
    assert not torch.equal(before, fresh)
    assert torch.equal(after, fresh)


def test_predict_given_a_draw_count_as_the_guide_is_told_where_it_goes():
    model = pyrouq.BayesianMLP(4, 5, 3, num_data=10)
    with pytest.raises(TypeError, match=r"got an int\. The draw count comes after the guide: "):
        pyrouq.predict(model, torch.randn(3, 4), 32, progress=False)
