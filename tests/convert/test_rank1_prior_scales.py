"""Review 8b: a refused seeded fit() leaves the streams alone for its later argument checks
too; a float64 rank-1 network takes a prior scale float64 holds; a tensor of prior scales is
told what works."""

from __future__ import annotations

import random

import numpy as np
import pyro.distributions as dist
import pytest
import torch
from torch import nn

import pyrouq

torch.set_num_threads(1)


def _streams() -> tuple[torch.Tensor, np.ndarray, float]:
    return torch.rand(3), np.random.rand(3), random.random()  # noqa: NPY002


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the legacy global state a user seeds
    random.seed(seed)


@pytest.mark.parametrize("bad", ["num_data", "no_guide", "unsized", "callbacks"])
def test_a_seeded_fit_refused_for_a_later_argument_leaves_the_streams_alone(bad):
    """fit(seed=0) seeded torch, numpy and random before these checks, so a refused call had
    reseeded the caller's streams (the docstring: a refused call seeds nothing)."""
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Linear(3, 2), num_data=8)
    guide = None if bad == "no_guide" else pyrouq.mean_field_guide(model)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    kwargs = {
        "num_data": {"num_data": 0},
        "no_guide": {},
        "unsized": {},
        "callbacks": {"callbacks": 5},
    }[bad]
    if bad == "unsized":
        model = pyrouq.bayesian(nn.Linear(3, 2))  # no N: a list of batches cannot tell it
        guide = pyrouq.mean_field_guide(model)
    _seed_all(7)
    expected = _streams()
    _seed_all(7)
    with pytest.raises((ValueError, TypeError)):
        pyrouq.fit(model, guide, [(x, y)], epochs=1, seed=0, progress=False, **kwargs)
    got = _streams()
    assert torch.equal(got[0], expected[0])
    assert np.array_equal(got[1], expected[1])
    assert got[2] == expected[2]


def test_a_float64_rank1_network_takes_a_prior_scale_that_float64_holds():
    """The prior is made in float64 and cast to the factors' dtype; 1e-50 (0 in float32, the
    default dtype) was refused as "not a positive finite torch.float32 (the factors' dtype)"
    for factors in float64."""
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()
    model = pyrouq.rank1(net, 2, prior_scale=1e-50)
    scale = model.priors()["0.r"].base_dist.scale
    assert scale.dtype == torch.float64
    assert bool((scale == 1e-50).all())
    with pytest.raises(ValueError, match=r"torch\.float32"):  # a float32 network: still refused
        pyrouq.rank1(nn.Linear(3, 2), 2, prior_scale=1e-50)


def test_a_tensor_of_prior_scales_is_told_a_fix_that_works():
    """A (2, 3) tensor of scales was told to pass float(t), which raises for it."""
    net = nn.Sequential(nn.Linear(3, 2))
    scales = torch.full((2, 3), 0.5)
    with pytest.raises(TypeError, match=r"prior=\{'0.weight': dist.Normal\(0.0, t\)\}"):
        pyrouq.bayesian(net, prior={"0.weight": scales})
    model = pyrouq.bayesian(net, prior={"0.weight": dist.Normal(0.0, scales)})  # the advice
    assert torch.equal(model.priors()["0.weight"].base_dist.scale, scales)
    with pytest.raises(TypeError, match=r"float\(t\)"):  # one element: float(t) works
        pyrouq.bayesian(net, prior=torch.tensor(0.5))
