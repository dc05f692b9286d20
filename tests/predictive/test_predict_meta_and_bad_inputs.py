"""The fifth audit of predict(): the inputs it got wrong-footed on. A model or inputs on the
meta device (shapes, no values) failed inside torch ("Tensor.item() cannot be called on meta
tensors", "Cannot copy out of meta tensor"); x given as None, a number or a dict failed with
"'NoneType' object is not iterable" or read the dict's keys as batches ("a batch was a str")."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import MLP, BayesianMLP, mean_field_guide, predict


def test_a_model_on_the_meta_device_is_refused_saying_to_load_its_weights():
    model = MLP(4, 8, 3).to("meta")
    with pytest.raises(ValueError, match=r"the model is on the meta device .*to_empty"):
        predict(model, torch.randn(5, 4), progress=False)
    # with a guide elsewhere: said before the guide check (which told to move the guide there)
    torch.manual_seed(0)
    bayes = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    guide = mean_field_guide(bayes)
    with pytest.raises(ValueError, match=r"the model is on the meta device .*to_empty"):
        predict(bayes.to("meta"), torch.randn(5, 4), guide, num_samples=2, progress=False)


def test_inputs_on_the_meta_device_are_refused_saying_to_pass_real_values():
    torch.manual_seed(0)
    model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    guide = mean_field_guide(model)
    x = torch.randn(5, 4, device="meta")
    with pytest.raises(ValueError, match=r"x is on the meta device .*real device"):
        predict(model, x, guide, num_samples=2, progress=False)
    with pytest.raises(ValueError, match=r"x is on the meta device"):
        predict(MLP(4, 8, 3), x, progress=False)
    # a model and inputs of real values still predict
    assert predict(MLP(4, 8, 3), torch.randn(5, 4), progress=False).probs.shape == (1, 5, 3)


@pytest.mark.parametrize(
    ("x", "came"),
    [(None, "None"), (3, "an int"), ({"x": torch.randn(5, 4)}, "a dict"), ("test.pt", "a str")],
)
def test_x_that_is_no_batch_nor_iterable_of_batches_is_refused_naming_what_came(x, came):
    with pytest.raises(TypeError, match=rf"got {came}\. Pass a tensor \(N, \.\.\.\) or a Data"):
        predict(MLP(4, 8, 3), x, progress=False)


def test_one_draw_without_its_draw_dimension_is_told_to_add_it():
    # each site's first dim was read as its S: "every site the same number S of draws, got
    # {'0.weight': 4, '0.bias': 4, '2.weight': 2, '2.bias': 2} ... cut them to value[:S]"
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    one = {site: value.clone() for site, value in model.template().items()}
    x = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"without the draw dimension: .* For one draw, pass "
                       r"\{site: value\[None\] for site, value in"):  # fmt: skip
        pyrouq.predict(model, x, posterior_samples=one, progress=False)
    fixed = {site: value[None] for site, value in one.items()}  # the advice, taken
    probs = pyrouq.predict(model, x, posterior_samples=fixed, progress=False).probs
    torch.testing.assert_close(probs[0], torch.softmax(model.plain_network()(x), -1))


@pytest.mark.parametrize("samples", [{}, {"foo": torch.randn(2, 3)}, "renamed"])
def test_draws_of_no_site_of_the_model_are_told_which_sites_it_has(samples):
    # none of the model's sites present: "one value of each site ... pass value[None]"
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)))
    if samples == "renamed":
        samples = {f"net.{k}": v[None].expand(2, *v.shape) for k, v in model.template().items()}
    with pytest.raises(ValueError, match=r"site '0\.weight' .*is not in posterior_samples"):
        pyrouq.predict(model, torch.randn(5, 3), posterior_samples=samples, progress=False)
