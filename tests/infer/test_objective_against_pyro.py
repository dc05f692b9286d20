"""The objective and the guide against Pyro's own tools on a Pyro model of the user's own (fit()
is Pyro's SVI loop with Trace_ELBO step for step, particles sequential or vectorised; a
kl_weight is Trace_ELBO with the latent sites scaled in model and guide, priors under the
model's own poutine.scale / mask and a local latent site in a subsampled plate included), and
a guide passed in the model's place, which is refused in words (KLWeightedELBO and
psis_diagnostic() gave numbers under Pyro's warnings, fit() told the guide to observe its
targets)."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal, AutoNormalMessenger, init_to_mean
from pyro.nn import PyroModule

import pyrouq

N = 40


@pytest.fixture(autouse=True)
def _fresh_store():
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


class Regression(PyroModule):
    """A hand-written Pyro regression: global weights, a positive noise scale, a prior under
    the model's own poutine.scale, a masked one, and one local latent per data point."""

    def __init__(self, local=False):
        super().__init__()
        self.num_data = N
        self.local = local

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        b = pyro.sample("b", dist.Normal(0.0, 1.0))
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        mean = (x * w.unsqueeze(-2)).sum(-1) + b.unsqueeze(-1)
        if self.local:
            with poutine.scale(scale=0.5):
                mean = mean + pyro.sample("c", dist.Normal(0.0, 2.0)).unsqueeze(-1)
            with poutine.mask(mask=torch.tensor(False)):
                mean = mean + pyro.sample("d", dist.Normal(0.0, 1.0)).unsqueeze(-1)
        with pyro.plate("data", self.num_data, subsample=torch.arange(len(x))):
            if self.local:
                mean = mean + 0.1 * pyro.sample("z", dist.Normal(0.0, 1.0))
            return pyro.sample("obs", dist.Normal(mean, s.unsqueeze(-1)), obs=y)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(N, generator=g)


def _store():
    return {name: value.detach().clone() for name, value in pyro.get_param_store().items()}


@pytest.mark.parametrize("vectorize", [False, True])
def test_fit_of_a_pyro_model_of_ones_own_is_pyros_svi_with_trace_elbo_step_for_step(vectorize):
    """Two epochs of 4 batches, 3 particles, kl_weight 1, constant lr: fit()'s epoch losses
    and final parameters are those of pyro.infer.SVI(Trace_ELBO) with pyro.optim.Adam under
    the same seed (the autoguide set up first, as fit() sets it up on a fork of the stream)."""
    x, y = _data()
    loader = ListLoader(x, y, 10)
    model = Regression()
    guide = AutoNormal(model, init_loc_fn=init_to_mean)
    result = pyrouq.fit(
        model, guide, loader, epochs=2, num_particles=3, vectorize_particles=vectorize,
        lr_schedule="constant", optim=lambda p: torch.optim.Adam(p, lr=0.05), seed=0,
        progress=False,
    )  # fmt: skip
    assert result.kl_weight == 1.0  # (real-valued targets: the exact ELBO by default)
    ours = _store()

    pyro.clear_param_store()
    model = Regression()
    guide = AutoNormal(model, init_loc_fn=init_to_mean)
    guide(x[:2], y[:2])
    loss = Trace_ELBO(num_particles=3, vectorize_particles=vectorize)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), loss)
    pyro.set_rng_seed(0)
    losses = [svi.step(xb, yb) for _ in range(2) for xb, yb in loader]
    assert [r.loss for r in result.history] == pytest.approx(
        [sum(losses[:4]) / 4, sum(losses[4:]) / 4], rel=1e-6
    )
    reference = _store()
    assert ours.keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-6)


class _LatentScale(poutine.messenger.Messenger):
    """Scales every latent (unobserved) sample site by ``weight``."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"]:
            msg["scale"] = msg["scale"] * self.weight


@pytest.mark.parametrize("particles", [1, 2])
@pytest.mark.parametrize("kl_weight", [1.0, 0.4, 0.0])
def test_a_kl_weight_is_trace_elbo_with_the_latents_scaled_around_scaled_and_masked_priors(
    kl_weight, particles
):
    """Priors under the model's own poutine.scale (0.5) and mask (False), and a local latent in
    a plate of 10 of N = 40 (scale 4 in model and guide): the loss is Trace_ELBO's on the model
    and guide with every latent site scaled by kl_weight, on the same draws."""
    x, y = _data()
    x, y = x[:10], y[:10]
    model = Regression(local=True)
    guide = AutoNormal(model)
    guide(x, y)
    pyro.set_rng_seed(0)
    ours = pyrouq.KLWeightedELBO(kl_weight, num_particles=particles).loss(model, guide, x, y)
    pyro.set_rng_seed(0)
    scaled = _LatentScale(kl_weight)
    reference = Trace_ELBO(num_particles=particles).loss(scaled(model), scaled(guide), x, y)
    assert ours == pytest.approx(reference, rel=1e-6)


# -- a guide in the model's place ----------------------------------------------------------------


def _fitted_pair(make_guide):
    x, y = toy_data(20)
    model = tiny_mlp(num_data=20)
    guide = make_guide(model)
    if not isinstance(guide, pyrouq.MeanFieldGuide):
        guide(x, y)
    return model, guide, x, y


_CALLS = {
    "fit": (
        lambda m, g, x, y: pyrouq.fit(g, m, ListLoader(x, y, 10), epochs=1, progress=False),
        "fit() expected the model first, got a guide ({}) in its place (the model and its guide "
        "swapped?). Pass them in order: fit(model, guide, train_loader, ...).",
    ),
    "fit without guide": (
        lambda m, g, x, y: pyrouq.fit(g, None, ListLoader(x, y, 10), epochs=1, progress=False),
        "fit() expected the model first, got a guide ({}) in its place",
    ),
    "elbo": (
        lambda m, g, x, y: pyrouq.KLWeightedELBO().loss(g, m, x, y),
        "KLWeightedELBO expected the model first, got a guide ({}) in its place (the model and "
        "its guide swapped?). Pass them in order: elbo.loss(model, guide, x, y), SVI(model, "
        "guide, optim, elbo).",
    ),
    "elbo without guide": (
        lambda m, g, x, y: pyrouq.KLWeightedELBO().loss(g, None, x, y),
        "KLWeightedELBO expected the model first, got a guide ({}) in its place",
    ),
    "svi": (
        lambda m, g, x, y: SVI(g, m, pyro.optim.Adam({"lr": 0.1}), pyrouq.KLWeightedELBO()).step(
            x, y
        ),
        "KLWeightedELBO expected the model first, got a guide ({}) in its place",
    ),
    "psis": (
        lambda m, g, x, y: pyrouq.psis_diagnostic(g, m, x, y),
        "psis_diagnostic() expected the model first, got a guide ({}) in its place (the model "
        "and its guide swapped?). Pass them in order: psis_diagnostic(model, guide, x, y).",
    ),
    "to_inference_data": (
        lambda m, g, x, y: pyrouq.to_inference_data(g, m, x, y, num_samples=4),
        "to_inference_data() expected the model first, got a guide ({}) in its place",
    ),
}


@pytest.mark.parametrize("make_guide", [pyrouq.mean_field_guide, AutoNormal])
@pytest.mark.parametrize("call", list(_CALLS))
def test_a_guide_passed_in_the_models_place_is_refused_naming_the_order(call, make_guide):
    """The swap used to give a number (KLWeightedELBO: 656682 nats; psis_diagnostic(): k-hat
    inf, "the variational approximation is unreliable") under Pyro's warnings, or refusals
    that misled: fit() told the guide to observe its targets, or an AutoNormal's sites to be
    missing from the pyrouq model."""
    model, guide, x, y = _fitted_pair(make_guide)
    run, words = _CALLS[call]
    with pytest.raises(TypeError) as info:
        run(model, guide, x, y)
    assert str(info.value).startswith(words.format(type(guide).__name__))


def test_a_messenger_guide_in_the_models_place_is_refused_too():
    model, _, x, y = _fitted_pair(pyrouq.mean_field_guide)
    guide = AutoNormalMessenger(poutine.block(model, hide=["obs"]))
    with pytest.raises(TypeError, match=r"got a guide \(AutoNormalMessenger\) in its place"):
        pyrouq.fit(guide, model, ListLoader(x, y, 10), epochs=1, progress=False)


def test_the_model_and_guide_in_order_still_train():
    model, guide, x, y = _fitted_pair(pyrouq.mean_field_guide)
    result = pyrouq.fit(model, guide, ListLoader(x, y, 10), epochs=1, progress=False, seed=0)
    assert result.steps == 2
