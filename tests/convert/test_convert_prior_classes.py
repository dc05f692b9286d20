"""bayesian(prior=) given a class: one of one's own with a constructor ``(name, param)`` is
still a prior function, a distribution class is told the instance its own parameters make, and
an instance keeps its route."""

from __future__ import annotations

import math
import re

import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import bayesian


class FanInNormal(dist.Normal):
    """A prior function as a class: ``FanInNormal(name, param)`` is Normal(0, 1/sqrt(fan_in))."""

    def __init__(self, name, param):
        super().__init__(0.0, 1.0 / math.sqrt(param.shape[-1]))

    def expand(self, batch_shape, _instance=None):
        return dist.Normal(self.loc, self.scale).expand(batch_shape)


class LaplaceFactory:
    """A prior function as a class whose ``__new__`` returns the prior."""

    def __new__(cls, name, param):
        return dist.Laplace(0.0, 0.25 if name.endswith("weight") else 3.0)


class Normal64(dist.Normal):
    """A subclass that keeps Normal's constructor (loc, scale)."""


def _scales(model):
    return {site: prior.base_dist.scale.unique().tolist() for site, prior in model.priors().items()}


def test_a_class_with_a_constructor_of_its_own_is_still_a_prior_function():
    """bayesian(prior=) documents a callable ``(name, param) -> prior``; a class with its own
    constructor is one, and was asked for every site until classes were refused outright."""
    net = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    assert _scales(bayesian(net, prior=FanInNormal)) == {
        "0.weight": [pytest.approx(0.5)],  # fan-in 4
        "0.bias": [pytest.approx(1 / math.sqrt(3))],  # a bias of 3: its last dim
        "1.weight": [pytest.approx(1 / math.sqrt(3))],
        "1.bias": [pytest.approx(1 / math.sqrt(2))],
    }
    assert _scales(bayesian(net, prior=LaplaceFactory)) == {
        "0.weight": [0.25],
        "0.bias": [3.0],
        "1.weight": [0.25],
        "1.bias": [3.0],
    }


@pytest.mark.parametrize(
    ("prior", "told"),
    [
        (dist.Gamma, "the class Gamma itself; pass an instance with its parameters, e.g. "
         "dist.Gamma(...)."),
        (dist.StudentT, "the class StudentT itself; pass an instance with its parameters, e.g. "
         "dist.StudentT(...)."),
        (Normal64, "the class Normal64 itself; pass an instance, e.g. Normal64(0.0, 1.0)."),
        ({"0": FanInNormal}, "the class FanInNormal itself; pass an instance with its "
         "parameters, e.g. FanInNormal(...)."),
        (float, "the class float itself."),
    ],
)  # fmt: skip
def test_a_distribution_class_is_told_the_instance_its_parameters_make(prior, told):
    """Gamma(0.0, 1.0) and StudentT(0.0, 1.0) are invalid (a concentration, a df of 0), and
    neither Normal64 nor FanInNormal is in pyro.distributions: the hint said so for each."""
    with pytest.raises(TypeError) as refused:
        bayesian(nn.Sequential(nn.Linear(3, 2)), prior=prior)
    # one prior= for every site is named so (it was 'The prior of '0.weight'', the first
    # site's alone); a dict's entry by the site it is the prior of
    subject = "The prior of '0.weight'" if isinstance(prior, dict) else "prior="
    by_site = "" if isinstance(prior, dict) else " (or a dict of them by site name)"
    assert str(refused.value) == (
        f"{subject} must be a float (the scale of Normal(0, s)) or a pyro.distributions "
        f"distribution{by_site}, got {told}"
    )


@pytest.mark.parametrize(
    ("prior", "told"),
    [
        ("0.5", "prior= must be a float (the scale of Normal(0, s)) or a pyro.distributions "
         "distribution (or a dict of them by site name), got str (a string: pass a float, "
         "prior=0.5)."),
        ("-1", "got str (a string: pass a float > 0)."),
        ({"0": "0.5"}, "The prior of '0.weight' must be a float (the scale of Normal(0, s)) or "
         "a pyro.distributions distribution, got str (a string: pass the float 0.5)."),
    ],
)  # fmt: skip
def test_a_prior_scale_given_as_a_string_is_told_the_float(prior, told):
    """A string holding the scale was refused as 'got str.' alone, where prior_scale= of
    rank1() and init_scale= were told the float to pass (text_hint)."""
    with pytest.raises(TypeError) as refused:
        bayesian(nn.Sequential(nn.Linear(3, 2)), prior=prior)
    assert str(refused.value).endswith(told), str(refused.value)


def test_a_distribution_instance_and_torch_classes_keep_their_routes():
    """An instance is expanded as before, and torch's own class is refused like Pyro's."""
    model = bayesian(nn.Sequential(nn.Linear(3, 2)), prior=dist.Laplace(0.0, 0.7))
    assert _scales(model) == {"0.weight": [pytest.approx(0.7)], "0.bias": [pytest.approx(0.7)]}
    with pytest.raises(
        TypeError, match=r"got the class Normal itself; pass an instance, e\.g\. dist\.Normal\("
    ):
        bayesian(nn.Sequential(nn.Linear(3, 2)), prior=torch.distributions.Normal)


class ScaledNormal(dist.Normal):
    """A class with a constructor of its own that is no prior function: ``(scale)`` alone."""

    def __init__(self, scale):
        super().__init__(0.0, scale)


@pytest.mark.parametrize(
    ("prior", "shown"),
    [(lambda name: 0.5, "<lambda>(name)"), (ScaledNormal, "ScaledNormal(scale)")],
)
def test_a_prior_function_of_another_signature_is_told_how_it_is_called(prior, shown):
    """prior=lambda name: ... failed in Python's words, "<lambda>() takes 1 positional argument
    but 2 were given", naming neither prior= nor (name, param); select= said both."""
    with pytest.raises(TypeError) as refused:
        bayesian(nn.Sequential(nn.Linear(3, 2)), prior=prior)
    assert str(refused.value).startswith(
        f"A prior= function is called as prior(name, param) for each latent site, and {shown} "
        "cannot take those two arguments. Pass e.g. lambda name, param:"
    )
    assert _scales(bayesian(nn.Linear(3, 2), prior=lambda name, param: 0.5)) == {
        "weight": [0.5], "bias": [0.5]
    }  # fmt: skip
    # one prior for every site works too, and is now said (it was told only of a lambda)
    said = re.findall(
        r"\(prior=(\d\.\d)\) or a distribution instance \(prior=(dist\.[^)]*\))", str(refused.value)
    )
    assert said == [("0.1", "dist.Normal(0.0, 0.1)")], str(refused.value)
    for written in said[0]:  # as written
        model = bayesian(nn.Linear(3, 2), prior=eval(written, {"dist": dist}))
        assert _scales(model) == {"weight": [pytest.approx(0.1)], "bias": [pytest.approx(0.1)]}


class ExpandedScaledNormal(ScaledNormal):
    """ScaledNormal with the .expand() torch asks of a subclass with an __init__ of its own."""

    def expand(self, batch_shape, _instance=None):
        return dist.Normal(self.loc, self.scale).expand(batch_shape)


def test_a_distribution_class_of_another_signature_is_told_when_its_instance_works():
    net = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(
        TypeError,
        match=r"ScaledNormal\(\.\.\.\) built with its arguments would "
        r"be one too once ScaledNormal defines \.expand\(\), which torch asks",
    ):
        bayesian(net, prior=ScaledNormal)
    told = r"\(prior=dist\.Normal\(0\.0, 0\.1\), or ExpandedScaledNormal\(\.\.\.\) built with"
    with pytest.raises(TypeError, match=told + r" its arguments\)\.$"):
        bayesian(net, prior=ExpandedScaledNormal)
    model = bayesian(net, prior=ExpandedScaledNormal(0.2))  # as said
    assert _scales(model) == {"0.weight": [pytest.approx(0.2)], "0.bias": [pytest.approx(0.2)]}
