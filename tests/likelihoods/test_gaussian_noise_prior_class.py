"""``Gaussian(scale)`` given a class where a noise scale belongs: a distribution class (Pyro's,
torch's or one's own subclass) is told to pass an instance of a prior; any other class
(``float``, a module class) is named and no more, since an instance of it would be refused too
(it was told to pass "an instance with its parameters, e.g. dist.HalfNormal(1.0)")."""

from __future__ import annotations

import functools

import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import Gaussian

EXPECTED = (
    "Expected the Gaussian noise scale to be a float > 0, 'learned', 'heteroscedastic' or a "
    "pyro.distributions prior, got "
)


class OwnNoise(dist.HalfNormal):
    """A user's own noise prior class."""


def _message(scale) -> str:
    with pytest.raises(TypeError) as caught:
        Gaussian(scale)
    return str(caught.value)


@pytest.mark.parametrize(
    "cls", [float, nn.Softplus, torch.Tensor], ids=["float", "Softplus", "Tensor"]
)
def test_a_class_that_is_no_distribution_is_named_without_asking_for_its_instance(cls):
    assert _message(cls) == f"{EXPECTED}the class {cls.__name__} itself."


@pytest.mark.parametrize(
    "cls",
    [OwnNoise, torch.distributions.HalfNormal, dist.LogNormal],
    ids=["own", "torch", "pyro"],
)
def test_a_distribution_class_is_told_to_pass_an_instance(cls):
    assert _message(cls) == (
        f"{EXPECTED}the class {cls.__name__} itself; pass an instance with its parameters, "
        "e.g. dist.HalfNormal(1.0)."
    )
    assert Gaussian(OwnNoise(1.0)).mode == "latent"  # (an instance is taken)


def test_a_partial_of_a_distribution_class_is_named_as_what_it_is():
    assert _message(functools.partial(dist.HalfNormal, 1.0)) == f"{EXPECTED}partial."
