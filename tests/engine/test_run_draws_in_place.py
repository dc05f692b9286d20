"""A network that changes its drawn weight in place as it runs (``self.weight.clamp_(-c, c)`` in
forward, with gradients or under ``no_grad`` as a max-norm bound does): the engine hands it a
copy of each draw autograd may hold, so ``KLWeightedELBO.differentiable_loss(...).backward()``
works (torch refused it before: "Output 0 of Unbind is a view ... modified inplace" for
vectorised particles, "one of the variables needed for gradient computation has been modified
by an inplace operation" in the user's own backward for a site drawn LogNormal, "a leaf
Variable that requires grad is being used in an in-place operation" on fit()'s particle by
particle route) and its loss and gradients are those of the same network changing the weight
out of place (the straight-through bound for the one under ``no_grad``); the draws stay as
drawn."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from pyrouq import KLWeightedELBO, _engine, bayesian, mean_field_guide

BOUND, NUM_DATA = 0.3, 50
GAMMA = dist.Gamma(torch.tensor(2.0, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64))
LAPLACE = dist.Laplace(
    torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
)
PRIORS = {"normal": 1.0, "gamma": GAMMA, "laplace": LAPLACE}


class _Bounded(nn.Linear):
    """A Linear layer that bounds its weight to [-BOUND, BOUND] as it runs: in place
    (``clamp_``, with gradients or under ``no_grad``) or out of place, the reference (the
    ``no_grad`` bound passes the gradient straight through, as the in-place one does)."""

    def __init__(self, how: str):
        super().__init__(4, 5)
        self.how = how

    def forward(self, x):
        w = self.weight
        if self.how == "clamp_":
            w.clamp_(-BOUND, BOUND)
        elif self.how == "no_grad clamp_":
            with torch.no_grad():
                w.clamp_(-BOUND, BOUND)
        elif self.how == "clamp":
            w = w.clamp(-BOUND, BOUND)
        elif self.how == "straight through":
            w = w + (w.clamp(-BOUND, BOUND) - w).detach()
        return F.linear(x, w, self.bias)  # ("none": the weight as drawn)


REFERENCE = {"clamp_": "clamp", "no_grad clamp_": "straight through"}


def _model(how: str, prior):
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = nn.Sequential(_Bounded(how), nn.Tanh(), nn.Linear(5, 3)).double()
    if prior is GAMMA:  # positive weights, where a Gamma prior's guide starts from them
        with torch.no_grad():
            for p in net.parameters():
                p.uniform_(0.1, 0.6)
    model = bayesian(net, prior=prior, num_data=NUM_DATA)
    return model, mean_field_guide(model, init_scale=0.1)


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 4, dtype=torch.float64, generator=g), torch.randint(
        0, 3, (6,), generator=g
    )


def _loss_and_grads(how, prior, particles, vectorize, route, kind="cpu"):
    model, guide = _model(how, prior)
    x, y = _data()
    elbo = KLWeightedELBO(num_particles=particles, vectorize_particles=vectorize)
    torch.manual_seed(7)
    with _engine.schedule(kind):
        if route == "differentiable_loss":
            loss = elbo.differentiable_loss(model, guide, x, y)
            loss.backward()
            loss = float(loss.detach())
        else:  # fit()'s: several particles back-propagated one at a time on CPU
            loss = elbo.loss_and_grads(model, guide, x, y)
    return loss, {n: p.grad.clone() for n, p in guide.named_parameters()}


CASES = [  # (particles, vectorize, route, schedule)
    (1, False, "differentiable_loss", "cpu"),
    (3, False, "differentiable_loss", "cpu"),
    (3, True, "differentiable_loss", "cpu"),
    (3, True, "differentiable_loss", "accelerator"),  # one vmap pass over the draws
    (3, False, "loss_and_grads", "cpu"),
    (3, True, "loss_and_grads", "cpu"),
]


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # (vmap's clamp_)
@pytest.mark.parametrize("how", list(REFERENCE))
@pytest.mark.parametrize("prior", list(PRIORS))
@pytest.mark.parametrize(("particles", "vectorize", "route", "kind"), CASES)
def test_a_network_bounding_its_draw_in_place_trains_as_the_bound_out_of_place(
    how, prior, particles, vectorize, route, kind
):
    loss, grads = _loss_and_grads(how, PRIORS[prior], particles, vectorize, route, kind)
    want_loss, want = _loss_and_grads(
        REFERENCE[how], PRIORS[prior], particles, vectorize, route, kind
    )
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert grads.keys() == want.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want[name], rtol=1e-6, atol=1e-6, msg=name)


def test_the_bound_changes_draws_so_the_comparison_can_fail():
    # the clamp binds: the two networks' losses differ from the unbounded network's
    bounded, _ = _loss_and_grads("clamp_", 1.0, 1, False, "differentiable_loss")
    model, guide = _model("clamp_", 1.0)
    model.net[0].how = "none"
    x, y = _data()
    torch.manual_seed(7)
    free = KLWeightedELBO().loss(model, guide, x, y)
    assert abs(bounded - free) > 1e-3


@pytest.mark.parametrize("leaf", [True, False])
def test_outputs_with_gradients_leave_the_draws_as_drawn(leaf):
    # three draws taken by unbind: torch refused the bound on the first ("Output 0 of Unbind
    # is a view ... modified inplace"), reworded as a refusal that named the site
    torch.manual_seed(0)
    model = bayesian(nn.Sequential(_Bounded("no_grad clamp_"), nn.ReLU(), nn.Linear(5, 2)))
    loc = {k: v.detach().clone().requires_grad_() for k, v in model.template().items()}
    noise = {k: 0.5 * torch.randn(3, *v.shape) for k, v in loc.items()}
    if leaf:
        draws = {k: (loc[k] + noise[k]).detach().requires_grad_() for k in loc}
    else:
        draws = {k: loc[k] + noise[k] for k in loc}
    before = {k: v.detach().clone() for k, v in draws.items()}
    x = torch.randn(5, 4)
    out = model.outputs(x, draws)
    for k, v in draws.items():
        assert torch.equal(v.detach(), before[k]), k
    assert float(before["0.weight"].abs().max()) > BOUND
    # by hand: each draw's first weight bounded, its gradient passed straight through
    expected = []
    for s in range(3):
        w = draws["0.weight"][s]
        w = w + (w.clamp(-BOUND, BOUND) - w).detach()
        h = F.relu(F.linear(x, w, draws["0.bias"][s]))
        expected.append(F.linear(h, draws["2.weight"][s], draws["2.bias"][s]))
    expected = torch.stack(expected)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    roots = list(draws.values()) if leaf else list(loc.values())
    got = torch.autograd.grad(out.square().sum(), roots)
    want = torch.autograd.grad(expected.square().sum(), roots)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
