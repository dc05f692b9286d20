"""Review of KLWeightedELBO's log-density shape check under validation: the shape read off a
site (its distribution's shapes, value, scale, mask) must not refuse what Pyro's Trace_ELBO
takes on the density itself."""

from __future__ import annotations

from typing import ClassVar

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions import TorchDistribution, constraints
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO

import pyrouq


class _SummedNormal(TorchDistribution):
    """A unit-variance Normal likelihood of a whole vector, returned as one number: its shapes
    say one log-density per entry, its log_prob sums them (Pyro takes the sum's shape)."""

    arg_constraints: ClassVar[dict] = {}
    support = constraints.real

    def __init__(self, loc, batch_shape=()):
        self.loc = loc
        super().__init__(torch.Size(batch_shape), torch.Size(), validate_args=False)

    def log_prob(self, value):
        return dist.Normal(self.loc, 1.0).log_prob(value).sum()


def _data():
    torch.manual_seed(0)
    x = torch.randn(12, 2)
    return x, x @ torch.tensor([1.0, -2.0]) + 0.3 * torch.randn(12)


def _guide(x, y):
    loc = pyro.param("loc", torch.tensor([0.5, -1.0]))
    pyro.sample("w", dist.Normal(loc, torch.tensor([0.3, 0.2])).to_event(1))


@pytest.fixture(autouse=True)
def _validation_on():
    pyro.clear_param_store()
    with pyro.validation_enabled(True):
        yield
    pyro.clear_param_store()


@pytest.mark.parametrize("declared", [(), (12,)], ids=["batch_shape ()", "batch_shape (12,)"])
def test_a_likelihood_summed_by_its_own_log_prob_is_taken_as_pyros_elbos_take_it(declared):
    """The shape read off the site is [12], the density's is []: Trace_ELBO takes it, and so
    must KLWeightedELBO (it refused it: 'invalid log_prob shape ... actual [12]'). The loss is
    TraceMeanField_ELBO's and the by-hand -log p(y | w) + KL(q || p) at the same draw."""
    x, y = _data()

    def model(x, y):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        pyro.sample("obs", _SummedNormal(x @ w, declared), obs=y)

    pyro.set_rng_seed(3)
    ours = pyrouq.KLWeightedELBO(kl_weight=1.0).loss(model, _guide, x, y)
    pyro.set_rng_seed(3)
    reference = TraceMeanField_ELBO().loss(model, _guide, x, y)
    assert ours == pytest.approx(reference, rel=1e-5)
    pyro.set_rng_seed(3)
    assert isinstance(Trace_ELBO().loss(model, _guide, x, y), float)  # (Pyro takes it)
    pyro.set_rng_seed(3)
    q = dist.Normal(torch.tensor([0.5, -1.0]), torch.tensor([0.3, 0.2]))
    w = q.sample()  # (the guide's draw under the same seed)
    nll = -dist.Normal(x @ w, 1.0).log_prob(y).sum()
    kl = torch.distributions.kl_divergence(q, dist.Normal(torch.zeros(2), 1.0)).sum()
    assert ours == pytest.approx(float(nll + kl), rel=1e-5)


def test_a_mask_around_a_whole_model_is_still_refused_with_the_densitys_shape():
    """The refusal stands where the density itself has the wrong shape, in Pyro's words."""
    x, y = _data()

    def model(x, y):
        with pyro.poutine.mask(mask=torch.arange(12) < 5):
            w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
            with pyro.plate("data", 12):
                pyro.sample("obs", dist.Normal(x @ w, 1.0), obs=y)

    expected = r'at site "w", invalid log_prob shape\s+Expected \[\], actual \[12\]'
    for elbo in (Trace_ELBO(), pyrouq.KLWeightedELBO(kl_weight=1.0)):
        with pytest.raises(ValueError, match=expected):
            elbo.loss(model, _guide, x, y)
