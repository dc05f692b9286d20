"""The KL-weighted ELBO and the mean-field guide against independent computations, and the
defects an audit of them found."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from pyro import poutine
from torch import nn

from pyrouq import Gaussian, batchensemble, bayesian, fit, mcmc, predict, rank1
from pyrouq.infer import KLWeightedELBO, mean_field_guide

N, B = 100, 6
SITES = {"0.weight": (4, 3), "0.bias": (4,), "2.weight": (2, 4), "2.bias": (2,)}


def _net(positive=False):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    if positive:
        with torch.no_grad():
            for p in net.parameters():
                p.abs_().add_(0.5)
    return net


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(B, 3, generator=g), torch.randint(0, 2, (B,), generator=g)


def _hand_model(priors, kl_weight):
    """The same network written as a Pyro model by hand, its latent sites scaled by
    ``kl_weight`` (what kl_weight means) and its likelihood by N/B."""

    def model(x, y):
        with poutine.scale(scale=kl_weight):
            w = {
                s: pyro.sample(s, priors[s].expand(shape).to_event(len(shape)))
                for s, shape in SITES.items()
            }
        h = torch.tanh(F.linear(x, w["0.weight"], w["0.bias"]))
        logits = F.linear(h, w["2.weight"], w["2.bias"])
        with pyro.plate("data", B), poutine.scale(scale=N / B):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)

    return model


def _hand_guide(guide, kl_weight):
    def run(x, y):
        with poutine.scale(scale=kl_weight):
            for s, shape in SITES.items():
                q = dist.Normal(guide.site_loc(s), guide.site_scale(s)).to_event(len(shape))
                pyro.sample(s, q)

    return run


_PRIORS = {
    "float": (0.7, {s: dist.Normal(0.0, 0.7) for s in SITES}),
    "dict by prefix, Laplace (Monte Carlo)": (
        {"0": 0.3, "2.weight": dist.Laplace(0.0, 1.0)},
        {
            "0.weight": dist.Normal(0.0, 0.3),
            "0.bias": dist.Normal(0.0, 0.3),
            "2.weight": dist.Laplace(0.0, 1.0),
            "2.bias": dist.Normal(0.0, 1.0),
        },
    ),
    "callable, Cauchy": (
        lambda name, p: 0.2 if name.endswith("bias") else dist.Cauchy(0.0, 1.0),
        {s: dist.Normal(0.0, 0.2) if s.endswith("bias") else dist.Cauchy(0.0, 1.0) for s in SITES},
    ),
    "Normal with batch shape": (
        {"0.weight": dist.Normal(torch.zeros(4, 1), torch.linspace(0.5, 2.0, 3)), "2": 0.1},
        {
            "0.weight": dist.Normal(torch.zeros(4, 1), torch.linspace(0.5, 2.0, 3)),
            "0.bias": dist.Normal(0.0, 1.0),
            "2.weight": dist.Normal(0.0, 0.1),
            "2.bias": dist.Normal(0.0, 0.1),
        },
    ),
}


@pytest.mark.parametrize("case", list(_PRIORS))
@pytest.mark.parametrize("kl_weight", [0.3, 1.0])
@pytest.mark.parametrize("particles", [1, 3])
def test_loss_and_gradients_are_pyros_mean_field_elbo_on_the_same_draws(case, kl_weight, particles):
    prior, by_hand = _PRIORS[case]
    model = bayesian(_net(), prior=prior, num_data=N)
    guide = mean_field_guide(model, init_scale=0.3)
    params = [*guide.loc.values(), *guide.rho.values()]
    x, y = _data()
    elbo = KLWeightedELBO(kl_weight, num_particles=particles)
    pyro.set_rng_seed(3)
    ours = elbo.differentiable_loss(model, guide, x, y)
    ours_grads = torch.autograd.grad(ours, params)
    pyro.set_rng_seed(3)
    terms = elbo.terms_and_grads(model, guide, x, y)  # what fit() calls
    reference = pyro.infer.TraceMeanField_ELBO(num_particles=particles)
    pyro.set_rng_seed(3)
    theirs = reference.differentiable_loss(
        _hand_model(by_hand, kl_weight), _hand_guide(guide, kl_weight), x, y
    )
    theirs_grads = torch.autograd.grad(theirs, params)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(terms.loss, theirs.detach(), rtol=1e-5, atol=1e-4)
    for mine, ref, param in zip(ours_grads, theirs_grads, params, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(param.grad, ref, rtol=1e-4, atol=1e-4)


def test_a_lognormal_guided_layer_is_not_run_at_its_log_weights_by_local_reparameterisation():
    """A prior on (0, inf) gives a site a LogNormal guide, its location log-space: local
    reparameterisation used that location as the weights' mean (outputs 0.27 where the
    network gives 3.52)."""
    net = _net(positive=True)
    x, _ = _data()
    y = torch.randint(0, 2, (B,))
    for prior in (dist.LogNormal(0.0, 1.0), {"2": dist.Gamma(2.0, 2.0)}):
        model = bayesian(net, prior=prior, num_data=N, local_reparameterization=True)
        guide = mean_field_guide(model, init_scale=1e-4)
        pyro.set_rng_seed(0)
        terms = KLWeightedELBO().terms(model, guide, x, y)
        torch.testing.assert_close(terms.outputs, net(x).detach(), rtol=0, atol=5e-3)
        # several particles, vectorised: every particle's outputs, each of the network
        elbo = KLWeightedELBO(num_particles=2, vectorize_particles=True)
        pyro.set_rng_seed(0)
        terms = elbo.terms_and_grads(model, guide, x, y)
        assert terms.outputs.shape == (2, B, 2)
        torch.testing.assert_close(terms.outputs[1], net(x).detach(), rtol=0, atol=5e-3)
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in guide.parameters())


def test_local_reparameterisation_with_lognormal_sites_is_unbiased():
    """Its expected NLL is the weight-sampling path's (a mix: layer 0 local, layer 2 whole)."""
    net = _net(positive=True)
    x, y = _data()
    means = {}
    for local in (False, True):
        model = bayesian(
            net, prior={"2": dist.Gamma(2.0, 2.0)}, num_data=N, local_reparameterization=local
        )
        guide = mean_field_guide(model, init_scale=0.3)
        elbo = KLWeightedELBO()
        nlls = []
        for seed in range(200):
            pyro.set_rng_seed(seed)
            nlls.append(elbo.terms(model, guide, x, y).nll)
        means[local] = torch.stack(nlls).mean()
    torch.testing.assert_close(means[True], means[False], rtol=0.03, atol=0)


def test_init_from_the_plain_network_of_a_rank1_model_says_to_pass_its_batchensemble():
    net = _net()
    model = rank1(net, 2)
    with pytest.raises(ValueError, match=r"has no parameter\(s\) \['0.r'.*a rank-1 model starts "
                       r"from a trained pyrouq.batchensemble\(net, 2\)"):  # fmt: skip
        mean_field_guide(model, init_from=net)
    with pytest.raises(ValueError, match=r"'0.r' has shape \(3, 3\), expected \(2, 3\).*"
                       r"batchensemble\(net, 2\)"):  # fmt: skip
        mean_field_guide(model, init_from=batchensemble(net, 3))
    with pytest.raises(ValueError, match=r"e.g. the module passed to bayesian\(\)"):
        mean_field_guide(bayesian(net), init_from=nn.Sequential(nn.Linear(3, 4)))


def test_a_model_cast_after_its_guide_was_built_is_refused_with_a_clear_message():
    model = bayesian(_net(), num_data=N)
    guide = mean_field_guide(model)
    model.double()
    x, y = _data()
    message = r"guide's site '0.weight' is torch.float32 on cpu, the model's torch.float64"
    with pytest.raises(ValueError, match="KLWeightedELBO: the " + message):
        KLWeightedELBO().loss(model, guide, x, y)
    with pytest.raises(ValueError, match=r"fit\(\): the " + message):
        fit(model, guide, [(x, y)], epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"predict\(\): the " + message):
        predict(model, x, guide, num_samples=2, progress=False)
    guide.double()  # cast alike: it runs
    assert torch.isfinite(torch.tensor(KLWeightedELBO().loss(model, guide, x, y)))


def test_a_guide_cast_after_it_was_built_is_told_the_models_own_dtype():
    """The refusal's example of the fix was guide.double() whatever the model's dtype: for a
    float32 model beside a guide cast to float64 it would change nothing. It names the call
    that casts the guide as the model now, and that call runs."""
    model = bayesian(_net(), num_data=N)
    guide = mean_field_guide(model).double()
    x, y = _data()
    told = r"Cast or move the guide as the model \(guide.to\('cpu', torch.float32\)\)"
    with pytest.raises(ValueError, match=told):
        KLWeightedELBO().loss(model, guide, x, y)
    guide.to("cpu", torch.float32)  # (as told)
    assert torch.isfinite(torch.tensor(KLWeightedELBO().loss(model, guide, x, y)))


def test_a_tied_weight_is_one_site_with_one_kl_term():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Linear(3, 3)
            self.out = nn.Linear(3, 3)
            self.out.weight = self.emb.weight

        def forward(self, x):
            return self.out(torch.tanh(self.emb(x)))

    torch.manual_seed(0)
    net = Tied()
    model = bayesian(net, prior={"out.weight": 0.2}, num_data=5)
    guide = mean_field_guide(model, init_scale=0.1, init_from=Tied())
    assert guide.sites == ("emb.weight", "emb.bias", "out.bias")
    x, y = torch.randn(5, 3), torch.randint(0, 3, (5,))
    kl = KLWeightedELBO().terms(model, guide, x, y).kl
    by_hand = sum(
        torch.distributions.kl_divergence(
            dist.Normal(guide.site_loc(s), guide.site_scale(s)),
            dist.Normal(0.0, 0.2 if s == "emb.weight" else 1.0),
        ).sum()
        for s in guide.sites
    )
    torch.testing.assert_close(kl, by_hand.detach())


def test_a_layer_with_only_its_bias_lognormal_guided_is_drawn_whole_by_local_reparameterisation():
    """As the README says: a weight *or bias* prior on (0, inf) takes the layer off the local
    path (the bias's log-space location was added to the pre-activations: off by 1.35)."""
    net = _net()
    with torch.no_grad():
        net[2].bias.abs_().add_(2.0)
    x, y = _data()
    model = bayesian(
        net, prior={"2.bias": dist.Gamma(2.0, 2.0)}, num_data=N, local_reparameterization=True
    )
    guide = mean_field_guide(model, init_scale=1e-4)
    assert guide.positive == ("2.bias",)
    pyro.set_rng_seed(0)
    terms = KLWeightedELBO().terms(model, guide, x, y)
    torch.testing.assert_close(terms.outputs, net(x).detach(), rtol=0, atol=5e-3)


def test_an_init_scale_that_is_zero_in_the_models_dtype_is_refused():
    # 1e-46 is 0 in float32: the guide built, and the first step's KL was inf
    model = bayesian(nn.Linear(3, 2))
    with pytest.raises(ValueError, match=r"the initial scale of site 'weight' \(1e-46\) is 0 in "
                       r"torch.float32, so its KL would be infinite\. Pass an init_scale of at "
                       r"least \d\.\de-45, the smallest scale torch.float32 holds here; below "
                       r"1.18e-38, .*\(the default init_scale is 0.01\)\."):  # fmt: skip
        mean_field_guide(model, init_scale=1e-46)
    guide = mean_field_guide(model.double(), init_scale=1e-46)  # representable in float64
    assert guide.site_scale("weight").min().item() == pytest.approx(1e-46)


def test_a_scale_mixture_prior_gets_a_guide_on_its_components_support():
    """Bayes by Backprop's scale-mixture prior (a MixtureSameFamily of two Normals) lies on
    the real line: mean_field_guide refused it, reading its support's wrapper as another
    support. A mixture of LogNormals gets the LogNormal guide, as a LogNormal prior does."""
    weights = dist.Categorical(torch.tensor([0.5, 0.5]))
    normals = dist.MixtureSameFamily(
        weights, dist.Normal(torch.zeros(2), torch.tensor([1.0, 0.01]))
    )
    lognormals = dist.MixtureSameFamily(weights, dist.LogNormal(torch.zeros(2), torch.ones(2)))
    for prior, positive in ((normals, ()), (lognormals, ("2.weight", "2.bias"))):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        model = bayesian(net, prior={"0": 1.0, "2": prior}, num_data=64)
        if positive:  # the network's signed weights start clamped: said once
            with pytest.warns(UserWarning, match=r"get a LogNormal guide, started at their"):
                guide = mean_field_guide(model)
        else:
            guide = mean_field_guide(model)
        assert guide.positive == positive
        x = torch.randn(64, 4)
        loader = [(x[:32], (x[:32, 0] > 0).long()), (x[32:], (x[32:, 0] > 0).long())]
        result = fit(model, guide, loader, epochs=2, progress=False)
        assert all(math.isfinite(r.loss) and math.isfinite(r.kl) for r in result.history)
        assert predict(model, x, guide, num_samples=3, progress=False).probs.shape == (3, 64, 3)


@pytest.mark.parametrize(
    "prior", [dist.Poisson(2.0), dist.Geometric(0.5), dist.Categorical(torch.ones(3))]
)
def test_a_discrete_prior_is_refused_by_the_guide_not_taken_for_one_on_0_inf(prior):
    """A Poisson or Geometric prior (integers from 0 on, no upper bound) was read as a prior on
    (0, inf): mean_field_guide fitted its weights a LogNormal (clamping their start) and fit()
    trained against the Poisson's log-density at non-integers, silently. Every discrete
    support is now refused in words, as mcmc() refuses it (no advice to sample it there); a
    noise prior on such a support is refused by the Gaussian likelihood too."""
    model = bayesian(nn.Linear(3, 2), prior={"weight": prior})
    with pytest.raises(ValueError) as err:
        mean_field_guide(model)
    name = type(prior).__name__
    assert str(err.value).startswith(
        f"mean_field_guide(): the prior of site 'weight' ({name}) is discrete (support "
    )
    assert "Give the site a continuous prior" in str(err.value)
    assert "mcmc()" not in str(err.value)
    with pytest.raises(ValueError, match=r"Expected a noise prior with positive support"):
        Gaussian(prior)


class _DependentSupport(dist.TorchDistribution):
    """A prior of one's own declaring torch's ``constraints.dependent`` placeholder as its
    support, whose ``is_discrete`` raises NotImplementedError."""

    arg_constraints: dict = {}  # noqa: RUF012 (torch reads it off the class)
    support = torch.distributions.constraints.dependent

    def __init__(self):
        super().__init__(torch.Size(), torch.Size())

    def log_prob(self, value):
        return -(value**2)


def test_a_prior_whose_support_torch_cannot_tell_is_refused_in_words():
    """The check for a discrete prior read ``support.is_discrete``, which torch's ``dependent``
    placeholder raises NotImplementedError for: mean_field_guide() and Gaussian(scale=) failed
    in torch's words (".is_discrete cannot be determined statically") instead of naming the
    support they cannot fit, as they did before that check."""
    model = bayesian(nn.Linear(3, 2), prior={"weight": _DependentSupport()})
    with pytest.raises(
        ValueError, match=r"^mean_field_guide\(\): the prior of site 'weight' "
    ) as err:
        mean_field_guide(model)
    # not "has support Dependent(); ... or sample it by mcmc()", which failed in torch's words
    told = "(_DependentSupport) declares torch's constraints.dependent placeholder as its support"
    assert told in str(err.value) and "by mcmc()" not in str(err.value)
    assert "Declare the support its values lie in, in its class" in str(err.value)
    with pytest.raises(ValueError, match=r"^mcmc\(\): the prior of site 'weight' ") as err:
        mcmc(model, torch.randn(4, 3), torch.randn(4, 2), num_samples=2, warmup_steps=1)
    assert told in str(err.value) and "cannot map it to the real line" in str(err.value)
    with pytest.raises(ValueError, match=r"Expected a noise prior with positive support"):
        Gaussian(_DependentSupport())
