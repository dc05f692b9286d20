"""Audit of predict()'s and fit()'s options against independent references: fit() with
autoguides and a KL weight against a hand loop of Pyro's ELBO with the latent sites scaled
by the weight (torch's Adam), predict() with a guide written as a function against its traces
replayed by hand, the uncertainty decomposition of predict()'s own draws against numpy; and
the fixes: a guide needing the targets, entropy()'s dim, fit()'s progress bar over a loader
without a length."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, sampled_linear, toy_data
from pyro import poutine
from pyro.infer.autoguide import AutoDiagonalNormal, AutoLowRankMultivariateNormal, AutoNormal
from pyro.nn import PyroModule
from torch import nn

from pyrouq import bayesian, fit, mean_field_guide, predict
from pyrouq.uncertainty import entropy


class _LatentScale(poutine.messenger.Messenger):
    """Scale the latent (unobserved) sites by ``weight``: the KL-weighted ELBO of DESIGN.md,
    ``-(N/B) sum log p(y | x, w) + weight * KL``, as Pyro's own ELBO of the scaled programs."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def _pyro_sample(self, msg):
        if not msg["is_observed"]:
            msg["scale"] = msg["scale"] * self.weight


def _network():
    return nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 2))


# --------------------------------------------------------------------------------------------
# fit() against a hand loop of Pyro's ELBO
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("autoguide", "kl_weight", "particles"),
    [
        (AutoNormal, 0.3, 1),
        (AutoDiagonalNormal, 1.0, 2),
        (AutoLowRankMultivariateNormal, 0.3, 1),
    ],
)
def test_fit_with_an_autoguide_is_pyros_elbo_with_the_latent_sites_scaled(
    autoguide, kl_weight, particles
):
    local = pyro.settings.get("module_local_params")
    pyro.settings.set(module_local_params=True)  # the two copies keep their own parameters
    try:
        x, y = toy_data(25)
        loader = ListLoader(x, y, 10)  # batches of 10, 10, 5: N/B differs on the last
        torch.manual_seed(1)
        model = bayesian(_network(), num_data=25)
        guide = autoguide(model)
        guide(x[:2], y[:2])  # its parameters made, so that both copies start from them
        ours_model, ours_guide = copy.deepcopy(model), copy.deepcopy(guide)
        hand_model, hand_guide = copy.deepcopy(model), copy.deepcopy(guide)
        result = fit(
            ours_model, ours_guide, loader, epochs=2, lr=0.01, lr_schedule="constant",
            kl_weight=kl_weight, num_particles=particles, seed=5, progress=False,
        )  # fmt: skip

        pyro.set_rng_seed(5)
        params = list(hand_model.parameters()) + list(hand_guide.parameters())
        optimizer = torch.optim.Adam(params, lr=0.01)
        elbo = pyro.infer.Trace_ELBO(num_particles=particles)
        hand_model.train()
        losses = []
        for _ in range(2):
            total = 0.0
            for xb, yb in loader:
                optimizer.zero_grad()
                scaled = _LatentScale(kl_weight)
                loss = elbo.differentiable_loss(scaled(hand_model), scaled(hand_guide), xb, yb)
                loss.backward()
                optimizer.step()
                total += loss.item()
            losses.append(total / len(loader))
    finally:
        pyro.settings.set(module_local_params=local)
    assert result.steps == 6 and result.num_data == 25 and result.kl_weight == kl_weight
    assert np.allclose(result.losses, losses, rtol=1e-5, atol=0)
    for ours, hand in zip(ours_guide.parameters(), hand_guide.parameters(), strict=True):
        assert torch.allclose(ours, hand, rtol=0, atol=1e-5)
    start = dict(guide.named_parameters())
    moved = max((p - start[k]).abs().max() for k, p in ours_guide.named_parameters())
    assert moved > 1e-3  # the run trained: the comparison is of something


def test_each_epoch_records_its_loss_as_the_nll_plus_the_weighted_kl():
    x, y = toy_data(37)
    torch.manual_seed(0)
    model = bayesian(_network())
    guide = mean_field_guide(model)
    records = []
    result = fit(model, guide, ListLoader(x, y, 10), epochs=2, kl_weight=0.3, seed=0,
                 progress=False, callbacks=[records.append])  # fmt: skip
    assert records == list(result.history)
    for record in result.history:
        assert record.loss == pytest.approx(record.nll + 0.3 * record.kl, rel=1e-6)
        assert record.kl > 0 and record.nll > 0


# --------------------------------------------------------------------------------------------
# predict() with a guide written as a function
# --------------------------------------------------------------------------------------------


class _OwnModel(PyroModule):
    def __init__(self):
        super().__init__()
        self.lin = sampled_linear(3, 2)

    def forward(self, x, y=None):
        logits = self.lin(x)
        pyro.deterministic("logits", logits)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def _guide_body():
    loc = pyro.param("w_loc", torch.linspace(-1, 1, 6).reshape(2, 3))
    pyro.sample("lin.weight", dist.Normal(loc, 0.5).to_event(2))


def test_a_guide_function_taking_y_optional_predicts_as_its_traces_replayed():
    def guide(x, y=None):
        _guide_body()

    model = _OwnModel()
    x, _ = toy_data(11)
    probs = predict(model, x, guide, num_samples=4, seed=3, batch_size=4, progress=False).probs
    torch.manual_seed(3)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(4)]
    with torch.no_grad():
        runs = [poutine.trace(poutine.replay(model, trace=t)).get_trace(x) for t in traces]
    hand = torch.stack([torch.softmax(r.nodes["logits"]["value"], -1) for r in runs])
    assert probs.shape == (4, 11, 2)
    assert torch.allclose(probs, hand, rtol=0, atol=1e-6)
    assert (hand[0] - hand[1]).abs().max() > 1e-2  # the draws differ: the order is checked


def test_a_guide_that_needs_the_targets_is_refused_saying_to_give_y_a_default():
    def guide(x, y):
        _guide_body()

    with pytest.raises(TypeError) as caught:
        predict(_OwnModel(), toy_data(20)[0], guide, num_samples=3, progress=False)
    message = str(caught.value)
    assert message.startswith("predict(): the guide 'guide' cannot run on the inputs alone (")
    assert "missing 1 required positional argument: 'y'" in message
    assert "Write it as guide(x, y=None)" in message
    assert "posterior_samples=" in message


def test_an_error_inside_a_guide_taking_x_alone_is_its_own():
    def guide(x):
        raise TypeError("the guide's own mistake")

    with pytest.raises(TypeError, match=r"^the guide's own mistake$"):
        predict(_OwnModel(), toy_data(5)[0], guide, num_samples=2, progress=False)


# --------------------------------------------------------------------------------------------
# Decompositions of predict()'s draws against numpy; entropy()'s dim
# --------------------------------------------------------------------------------------------


def test_the_entropy_decomposition_of_predicts_draws_is_numpys():
    x, _ = toy_data(37)
    torch.manual_seed(0)
    model = bayesian(_network())
    guide = mean_field_guide(model, init_scale=0.5)
    # a batch size that does not divide N, one draw and many
    for s in (1, 300):
        p = predict(model, x, guide, num_samples=s, batch_size=8, seed=1, progress=False)
        q = p.probs.double().numpy()
        mean = q.mean(0)
        total = -(mean * np.log(mean)).sum(-1)
        expected = -(q * np.log(q)).sum(-1).mean(0)
        d = p.uncertainty()
        assert np.allclose(d.total.numpy(), total, rtol=0, atol=1e-6)
        assert np.allclose(d.aleatoric.numpy(), expected, rtol=0, atol=1e-6)
        assert np.allclose(d.epistemic.numpy(), total - expected, rtol=0, atol=1e-6)
        if s == 1:
            assert torch.equal(d.epistemic, torch.zeros(37))
        else:
            assert (total - expected).max() > 1e-3


def test_entropy_along_another_dim_is_numpys():
    probs = torch.softmax(torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), 0)
    q = probs.double().numpy()
    assert np.allclose(entropy(probs, dim=0).numpy(), -(q * np.log(q)).sum(0), atol=1e-6)
    assert np.allclose(entropy(probs, dim=-2, base=2).numpy(), -(q * np.log2(q)).sum(0))


@pytest.mark.parametrize("dim", [2, -3, 1.0, True])
def test_entropy_refuses_a_dim_that_is_not_one_of_the_probs(dim):
    probs = torch.full((4, 2), 0.5)
    with pytest.raises(ValueError) as caught:
        entropy(probs, dim=dim)
    assert str(caught.value) == (
        f"Expected dim to be an integer in [-2, 1], a dimension of probs (shape (4, 2)), got "
        f"{dim!r}. Pass its class dimension, e.g. dim=-1."
    )


# --------------------------------------------------------------------------------------------
# fit()'s progress bar
# --------------------------------------------------------------------------------------------


def test_the_progress_bar_over_a_loader_without_a_length_shows_no_total():
    x, y = toy_data(40)
    model = bayesian(_network())
    guide = mean_field_guide(model)
    batches = [(x[i : i + 10], y[i : i + 10]) for i in range(0, 40, 10)]
    shown = io.StringIO()
    with contextlib.redirect_stderr(shown):
        result = fit(model, guide, (b for b in batches), epochs=1, num_data=40,
                     lr_schedule="constant", progress=True)  # fmt: skip
    assert result.steps == 4
    assert "step" in shown.getvalue()  # the bar was shown
    assert "/1 " not in shown.getvalue() and "%" not in shown.getvalue()  # not "0/1", "0%"
    sized = io.StringIO()
    with contextlib.redirect_stderr(sized):
        fit(model, guide, batches, epochs=2, num_data=40, progress=True)
    assert "0/8 " in sized.getvalue()  # a loader with a length: epochs * len(loader) steps
