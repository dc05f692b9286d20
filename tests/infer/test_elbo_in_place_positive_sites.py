"""KLWeightedELBO's particles back-propagated one at a time (``loss_and_grads`` on CPU, fit()'s
path with ``num_particles`` > 1), for a network that bounds its drawn weight in place under
``no_grad`` (a max-norm constraint) at sites with a prior on (0, inf): their LogNormal draw is
``exp``'s output, which ``exp``'s backward reads, so a bound written into it made the backward
pass fail in torch's words ("modified by an inplace operation", or "Output 2 of Unbind is a
view and its base ... has been modified inplace" with vectorised particles) where the same
network with Normal sites trains. The gradients are checked against the KL-weighted ELBO
written by hand from the draws the network saw."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pyrouq import KLWeightedELBO, bayesian, mean_field_guide

COUNT, NUM_DATA, BOUND = 3, 50, 0.3
PRIOR = dist.Gamma(torch.tensor(2.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64))


class _Seen(nn.Linear):
    """A Linear layer that records the weight and bias each run reads (as drawn) and then, with
    ``bound``, clamps its weight to [-bound, bound] in place, under no_grad."""

    def __init__(self, in_features: int, out_features: int, bound: float | None = None):
        super().__init__(in_features, out_features)
        self.bound, self.seen = bound, []

    def forward(self, x):
        self.seen.append((self.weight.detach().clone(), self.bias.detach().clone()))
        if self.bound is not None:
            with torch.no_grad():
                self.weight.clamp_(-self.bound, self.bound)
        return super().forward(x)


def _setup(bound: float | None):
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = nn.Sequential(_Seen(4, 5, bound), nn.Tanh(), _Seen(5, 3)).double()
    with torch.no_grad():  # positive weights, as a Gamma prior's guide starts from them
        for p in net.parameters():
            p.uniform_(0.1, 0.5)
    model = bayesian(net, prior=PRIOR, num_data=NUM_DATA)
    guide = mean_field_guide(model, init_scale=0.1)
    x = torch.randn(6, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (6,))
    KLWeightedELBO().loss(model, guide, x, y)  # (the guide's parameters registered)
    return model, guide, x, y


def _step(vectorize: bool, bound: float | None):
    model, guide, x, y = _setup(bound)
    for layer in (model.net[0], model.net[2]):
        layer.seen.clear()
    elbo = KLWeightedELBO(num_particles=COUNT, vectorize_particles=vectorize)
    torch.manual_seed(7)
    loss = elbo.loss_and_grads(model, guide, x, y)
    return model, guide, x, y, loss


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_bound_in_place_on_positive_sites_trains_as_the_elbo_written_by_hand(vectorize):
    model, guide, x, y, loss = _step(vectorize, BOUND)
    first, last = model.net[0].seen, model.net[2].seen
    assert len(first) == len(last) == COUNT  # one run per particle
    assert any(bool((w > BOUND).any()) for w, _ in first)  # the bound changed draws
    # the ELBO by hand: each particle's draws w = exp(loc + scale * eps), eps read back from
    # what the network saw; its NLL with the first weight bounded (the network's value, the
    # gradient passed through the bound as the network's in-place bound passes it), the KL's
    # Monte Carlo estimate with the draws as drawn, kl_weight 1
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    loc = {s: guide.site_loc(s) for s in names}
    scale = {s: guide.site_scale(s) for s in names}
    nll = kl = torch.zeros((), dtype=torch.float64)
    for (w0, b0), (w1, b1) in zip(first, last, strict=True):
        drawn = dict(zip(names, (w0, b0, w1, b1), strict=True))
        eps = {s: ((v.log() - loc[s]) / scale[s]).detach() for s, v in drawn.items()}
        w = {s: torch.exp(loc[s] + scale[s] * eps[s]) for s in names}
        bounded = w["0.weight"] + (w["0.weight"].clamp(-BOUND, BOUND) - w["0.weight"]).detach()
        out = F.linear(torch.tanh(F.linear(x, bounded, w["0.bias"])), w["2.weight"], w["2.bias"])
        nll = nll - NUM_DATA / len(x) * torch.log_softmax(out, -1).gather(1, y[:, None]).sum()
        for s in names:
            log_q = dist.LogNormal(loc[s], scale[s]).log_prob(w[s]).sum()
            kl = kl + log_q - PRIOR.log_prob(w[s]).sum()
    by_hand = (nll + kl) / COUNT
    params = list(guide.parameters())
    expected = torch.autograd.grad(by_hand, params)
    assert loss == pytest.approx(float(by_hand.detach()), rel=1e-12)
    for p, g in zip(params, expected, strict=True):
        torch.testing.assert_close(p.grad, g, rtol=1e-9, atol=1e-9 * float(g.abs().max()))


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_bound_that_changes_no_value_leaves_the_gradients_to_the_bit(vectorize):
    _, guide, _, _, plain_loss = _step(vectorize, None)
    plain = {n: p.grad.clone() for n, p in guide.named_parameters()}
    _, guide, _, _, bounded_loss = _step(vectorize, 1e6)
    assert bounded_loss == plain_loss
    for name, p in guide.named_parameters():
        assert torch.equal(p.grad, plain[name]), name
