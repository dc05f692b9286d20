"""``Gaussian(dist.HalfNormal)``, the class where a prior instance belongs, is told so and what
to pass, as ``bayesian(prior=dist.Normal)`` is (it said "got DistributionMeta")."""

from __future__ import annotations

import pyro.distributions as dist
import pytest

from pyrouq import Gaussian


@pytest.mark.parametrize("cls", [dist.HalfNormal, dist.Gamma])
def test_a_noise_prior_class_is_told_to_be_an_instance(cls):
    with pytest.raises(TypeError) as info:
        Gaussian(cls)
    message = str(info.value)
    assert f"got the class {cls.__name__} itself; pass an instance with its parameters" in message
    assert "e.g. dist.HalfNormal(1.0)" in message
    assert "DistributionMeta" not in message


def test_a_noise_prior_instance_is_still_taken():
    assert Gaussian(dist.HalfNormal(1.0)).mode != "fixed"
