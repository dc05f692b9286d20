"""A float32 network trains and reports the same under a float64 default dtype
(``torch.set_default_dtype(torch.float64)``, as some notebooks set it): the sums the loss and
the KL start from are float32 zeros, not the default dtype's, which promoted a float32
network's reported loss to float64 (it differed in the seventh digit)."""

from __future__ import annotations

import pyro
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data

from pyrouq import KLWeightedELBO, fit, mean_field_guide


def _run(num_particles: int, vectorize: bool, default: torch.dtype):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = tiny_mlp()  # float32, built before the default changes
    x, y = toy_data(24)
    guide = mean_field_guide(model)
    before = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        result = fit(
            model,
            guide,
            ListLoader(x, y, 8),
            epochs=2,
            seed=3,
            num_particles=num_particles,
            vectorize_particles=vectorize,
            progress=False,
        )
    finally:
        torch.set_default_dtype(before)
    return result.losses, [r.kl for r in result.history], model.state_dict()


@pytest.mark.parametrize(("num_particles", "vectorize"), [(1, False), (2, False), (2, True)])
def test_a_float32_network_reports_the_same_losses_under_a_float64_default(
    num_particles, vectorize
):
    losses, kls, weights = _run(num_particles, vectorize, torch.float32)
    got_losses, got_kls, got_weights = _run(num_particles, vectorize, torch.float64)
    assert (got_losses, got_kls) == (losses, kls)
    assert all(torch.equal(got_weights[k], weights[k]) for k in weights)


def test_the_elbo_terms_of_a_float32_network_stay_float32_under_a_float64_default():
    pyro.clear_param_store()
    model = tiny_mlp(num_data=8)
    x, y = toy_data(8)
    guide = mean_field_guide(model)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        terms = KLWeightedELBO().terms(model, guide, x, y)
    finally:
        torch.set_default_dtype(before)
    assert (terms.loss.dtype, terms.nll.dtype, terms.kl.dtype) == (torch.float32,) * 3
