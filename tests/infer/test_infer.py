from __future__ import annotations

import math
import pickle
import warnings

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from pyro import poutine

from pyrouq.checkpoint import CheckpointError
from pyrouq.convert import bayesian
from pyrouq.infer import KLWeightedELBO, MeanFieldGuide, fit, mean_field_guide
from pyrouq.likelihoods import Gaussian
from pyrouq.models import MLP, BayesianLeNet, BayesianMLP


class TracedGuide(MeanFieldGuide):
    """A MeanFieldGuide subclass overriding forward: KLWeightedELBO traces it (guide run,
    model replayed) instead of drawing from its locations and scales directly."""

    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


def traced_copy(model, guide):
    copy = TracedGuide(model, init_scale=guide.init_scale)
    copy.load_state_dict(guide.state_dict())
    return copy


@pytest.mark.parametrize("kl_weight", [0.0, 0.3, 1.0, 5.0])
def test_loss_is_scaled_nll_plus_weighted_analytic_kl(kl_weight):
    model = tiny_mlp(num_data=1000)
    guide = mean_field_guide(model, init_scale=0.1)
    x, y = toy_data(10)
    pyro.set_rng_seed(7)
    loss = KLWeightedELBO(kl_weight).differentiable_loss(model, guide, x, y)

    # independent recomputation from the same draws
    pyro.set_rng_seed(7)
    guide_trace = poutine.trace(guide).get_trace(x, y)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    obs = model_trace.nodes["obs"]
    nll = -(1000 / 10) * obs["fn"].log_prob(y).sum()
    kl = 0.0
    for site in guide.sites:
        q = guide_trace.nodes[site]["fn"]
        p = model_trace.nodes[site]["fn"]
        kl = kl + torch.distributions.kl_divergence(q, p).sum()
    torch.testing.assert_close(loss, nll + kl_weight * kl)
    # and by hand for one site: KL(N(m, s) || N(0, 1)) = log(1/s) + (s^2 + m^2)/2 - 1/2
    m, s = guide.site_loc("fc2.bias"), guide.site_scale("fc2.bias")
    by_hand = (torch.log(1 / s) + (s**2 + m**2) / 2 - 0.5).sum()
    q = guide_trace.nodes["fc2.bias"]["fn"]
    p = model_trace.nodes["fc2.bias"]["fn"]
    torch.testing.assert_close(torch.distributions.kl_divergence(q, p), by_hand)


@pytest.mark.parametrize("vectorised", [False, True])
def test_kl_term_equals_torch_kl_divergence_for_non_standard_normal_priors(vectorised):
    # a Normal prior of any location and scale, given as a float, a distribution or per site,
    # gets the same KL as torch.distributions.kl_divergence of the guide and the prior (taken
    # with the first particle's draws, or apart from vectorised particles' draws)
    options = {"num_particles": 2, "vectorize_particles": True} if vectorised else {}
    import pyrouq

    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    model = pyrouq.bayesian(
        net,
        prior={
            "0.weight": dist.Normal(0.5, 0.3),
            "0.bias": 2.0,
            "2": dist.Normal(-1.0, 4.0),
            "2.weight": dist.Normal(torch.linspace(-1.0, 1.0, 10).reshape(2, 5), 0.5),
        },
        num_data=100,
    )
    guide = mean_field_guide(model, init_scale=0.2)
    x, y = toy_data(10)
    terms = KLWeightedELBO(**options).terms(model, guide, x, y)
    expected = sum(
        torch.distributions.kl_divergence(
            dist.Normal(guide.site_loc(site), guide.site_scale(site)).to_event(prior.event_dim),
            prior,
        )
        for site, prior in model.priors().items()
    )
    torch.testing.assert_close(terms.kl, expected.detach(), rtol=1e-6, atol=0.0)
    # the hand-written form for one site: log(s0 / s) + (s^2 + (m - m0)^2) / (2 s0^2) - 1/2
    m, s = guide.site_loc("2.bias"), guide.site_scale("2.bias")
    by_hand = (torch.log(4.0 / s) + (s**2 + (m + 1.0) ** 2) / 32.0 - 0.5).sum()
    one = torch.distributions.kl_divergence(dist.Normal(m, s).to_event(1), model.priors()["2.bias"])
    torch.testing.assert_close(one, by_hand)
    # and the KL's gradient is that of torch's closed form: the loss's gradients at two KL
    # weights, with the same draws, differ by it
    guide.zero_grad()
    expected.backward()
    closed_form = [p.grad.clone() for p in guide.parameters()]

    def grads(g, kl_weight):
        pyro.set_rng_seed(0)
        g.zero_grad()
        KLWeightedELBO(kl_weight=kl_weight, **options).terms(model, g, x, y).loss.backward()
        return [p.grad.clone() for p in g.parameters()]

    three, one = grads(guide, 3.0), grads(guide, 1.0)
    for a, b, kl_grad in zip(three, one, closed_form, strict=True):
        tol = 1e-5 * a.abs().max().item()
        torch.testing.assert_close((a - b) / 2, kl_grad, rtol=1e-4, atol=tol)
    if not vectorised:  # the traced path, which differentiates torch's closed form
        for a, b in zip(three, grads(traced_copy(model, guide), 3.0), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item())


def test_a_site_the_network_does_not_use_gets_the_gradient_of_its_kl_alone():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used = torch.nn.Linear(3, 2)
            self.spare = torch.nn.Linear(3, 2)  # selected, never called

        def forward(self, x):
            return self.used(x)

    model = bayesian(Net(), prior=0.5, num_data=50)
    guide = mean_field_guide(model, init_scale=0.2)
    x, y = toy_data(4)

    def grads(g):
        pyro.set_rng_seed(0)
        g.zero_grad()
        KLWeightedELBO(kl_weight=2.0).terms(model, g, x, y).loss.backward()
        return dict(g.named_parameters()), [p.grad.clone() for p in g.parameters()]

    params, direct = grads(guide)
    for a, b in zip(direct, grads(traced_copy(model, guide))[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item())
    # d/dloc of 2 * KL(N(loc, s) || N(0, 0.5)) = 2 * loc / 0.25
    loc = guide.site_loc("spare.weight")
    torch.testing.assert_close(params["loc.spare__weight"].grad, 8.0 * loc.detach())


def test_kl_term_is_analytic_zero_variance_across_seeds():
    model = tiny_mlp(num_data=100)
    guide = mean_field_guide(model, init_scale=0.2)
    x, y = toy_data(10)
    elbo = KLWeightedELBO()
    kls, nlls = [], []
    for seed in range(5):
        pyro.set_rng_seed(seed)
        terms = elbo.terms(model, guide, x, y)
        kls.append(terms.kl.item())
        nlls.append(terms.nll.item())
    assert max(kls) - min(kls) == 0.0
    assert max(nlls) - min(nlls) > 0.0  # the likelihood term is Monte Carlo


def test_every_guide_site_has_an_analytic_kl_against_its_prior():
    model = tiny_mlp(num_data=100)
    x, y = toy_data(10)

    def analytic_sites(guide):
        guide_trace = poutine.trace(guide).get_trace(x, y)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
        count = 0
        for name in model.latent_sites():
            try:
                torch.distributions.kl_divergence(
                    guide_trace.nodes[name]["fn"], model_trace.nodes[name]["fn"]
                )
                count += 1
            except NotImplementedError:
                pass
        return count

    assert analytic_sites(mean_field_guide(model)) == 4


def test_vectorized_and_sequential_particles_agree_in_distribution():
    model = tiny_mlp(num_data=40)
    guide = mean_field_guide(model, init_scale=0.3)
    x, y = toy_data(40)
    n = 400
    pyro.set_rng_seed(0)
    vec = KLWeightedELBO(num_particles=n, vectorize_particles=True).loss(model, guide, x, y)
    pyro.set_rng_seed(1)
    single = KLWeightedELBO()
    seq = torch.tensor([single.loss(model, guide, x, y) for _ in range(n)])
    # both estimate the same expectation; the tolerance is 4 standard errors
    se = seq.std().item() / math.sqrt(n)
    assert abs(vec - seq.mean().item()) < 4 * math.sqrt(2) * se
    assert seq.std() > 0


def test_vectorized_particles_on_lenet_shapes():
    model = BayesianLeNet(num_data=100)
    guide = mean_field_guide(model)
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    terms = KLWeightedELBO(num_particles=3, vectorize_particles=True).terms(model, guide, x, y)
    assert terms.outputs.shape == (3, 4, 10)
    assert torch.isfinite(terms.loss)


def _small_batch(model, n):
    """n inputs for a tiny MLP or a LeNet, labels 0, 1, ..., n - 1 for the LeNet."""
    if isinstance(model, BayesianLeNet):
        return torch.randn(n, 1, 28, 28), torch.arange(n)
    return toy_data(n)


@pytest.mark.parametrize("nesting", [float("inf"), 1, 2])
@pytest.mark.parametrize("guide_kind", ["mean_field", "mean_field_traced", "auto_normal"])
@pytest.mark.parametrize("make", [tiny_mlp, lambda **kw: BayesianLeNet(**kw)])
def test_vectorized_particles_count_the_likelihood_once(make, guide_kind, nesting):
    # With (nearly) zero guide scales every particle draws the same weights, so P vectorised
    # particles must give the NLL of one. fit() uses max_plate_nesting=2, where particles
    # sit outside the "members" dim: the likelihood was once broadcast over P x P draws.
    from pyro.infer.autoguide import AutoNormal

    model = make(num_data=100)
    x, y = _small_batch(model, 6)
    if guide_kind == "auto_normal":
        guide = AutoNormal(model, init_scale=1e-7)
        guide(x, y)
    else:
        guide = mean_field_guide(model, init_scale=1e-7)
    if guide_kind == "mean_field_traced":
        guide = traced_copy(model, guide)
    one = KLWeightedELBO(max_plate_nesting=nesting).terms(model, guide, x, y)
    vec = KLWeightedELBO(num_particles=3, vectorize_particles=True, max_plate_nesting=nesting)
    three = vec.terms(model, guide, x, y)
    assert three.outputs.shape[0] == 3 and three.outputs.shape[-2:] == (6, model.num_classes)
    torch.testing.assert_close(three.nll, one.nll, rtol=1e-4, atol=0)
    # an autoguide's KL is a one-draw estimate, log q(aux) - log p(w) (its auxiliary sites'
    # log-density varies with each draw by about 1 %); counted once, not P times, all the same
    rtol = 0.05 if guide_kind == "auto_normal" else 1e-5
    torch.testing.assert_close(three.kl, one.kl, rtol=rtol, atol=0)


@pytest.mark.parametrize("particles", [1, 2])
@pytest.mark.parametrize("make", [tiny_mlp, lambda **kw: BayesianLeNet(**kw)])
def test_mean_field_path_gives_the_traced_numbers(make, particles):
    # KLWeightedELBO skips the guide and model traces for a MeanFieldGuide: the same draws
    # (same order), the same loss and gradients as replaying the guide's trace
    model = make(num_data=100)
    x, y = _small_batch(model, 5)
    guide = mean_field_guide(model, init_scale=0.1)
    elbo = KLWeightedELBO(kl_weight=0.5, num_particles=particles, max_plate_nesting=2)

    def loss_and_grads(guide):
        pyro.set_rng_seed(3)
        guide.zero_grad()
        terms = elbo.terms(model, guide, x, y)
        terms.loss.backward()
        return terms, [p.grad.clone() for p in guide.parameters()]

    direct, direct_grads = loss_and_grads(guide)
    traced, traced_grads = loss_and_grads(traced_copy(model, guide))
    if particles == 1:  # the same draws: the same outputs, bit for bit
        assert torch.equal(direct.outputs, traced.outputs)
    # the fast NLL, and the KL summed in float64 from three sums per site (once, not per
    # particle): rounding only
    torch.testing.assert_close(direct.loss, traced.loss, rtol=1e-6, atol=0)
    # the direct path back-propagates the likelihood's fused cross-entropy, the traced one
    # Categorical.log_prob: the same gradients up to rounding
    for a, b in zip(direct_grads, traced_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * b.abs().max().item())


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("make", [tiny_mlp, lambda **kw: BayesianLeNet(**kw)])
def test_particle_by_particle_gradients_are_those_of_the_loss(make, vectorize):
    # terms_and_grads back-propagates one particle at a time (fit's path); same draws, same
    # loss and gradients as back-propagating terms().loss in one go
    model = make(num_data=100)
    x, y = _small_batch(model, 5)
    guide = mean_field_guide(model, init_scale=0.1)
    elbo = KLWeightedELBO(kl_weight=0.3, num_particles=3, vectorize_particles=vectorize)

    def run(method):
        pyro.set_rng_seed(5)
        guide.zero_grad()
        terms = method(model, guide, x, y)
        if terms.loss.requires_grad:
            terms.loss.backward()
        return terms, [p.grad.clone() for p in guide.parameters()]

    whole, whole_grads = run(elbo.terms)
    split, split_grads = run(elbo.terms_and_grads)
    assert not split.loss.requires_grad
    torch.testing.assert_close(split.loss, whole.loss.detach(), rtol=1e-6, atol=0)
    torch.testing.assert_close(split.nll, whole.nll, rtol=1e-6, atol=0)
    torch.testing.assert_close(split.kl, whole.kl, rtol=0, atol=0)
    assert split.outputs.shape == whole.outputs.shape

    def assert_same_grads(grads):
        # rounding only: the per-particle terms are summed in another order
        for a, b in zip(grads, whole_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * b.abs().max().item())

    assert_same_grads(split_grads)
    pyro.set_rng_seed(5)
    guide.zero_grad()
    assert elbo.loss_and_grads(model, guide, x, y) == pytest.approx(
        float(whole.loss.detach()), rel=1e-6
    )
    assert_same_grads([p.grad for p in guide.parameters()])


@pytest.mark.filterwarnings("ignore:Found vars in model but not guide")  # Pyro's check, traced
@pytest.mark.parametrize("traced", [False, True])
def test_elbo_without_labels_says_so(traced):
    model = tiny_mlp(num_data=40)
    guide = mean_field_guide(model)
    if traced:
        guide = traced_copy(model, guide)
    x, _ = toy_data(6)
    for elbo in (KLWeightedELBO(), KLWeightedELBO(num_particles=3, vectorize_particles=True)):
        # (the site quoted 'obs', as predict()'s words do; it was "obs")
        told = r"needs the labels: the model's site 'obs' was not observed \(y=None\)"
        with pytest.raises(ValueError, match=told):
            elbo.terms_and_grads(model, guide, x)


def test_direct_nll_is_the_traced_observation_term():
    model = BayesianLeNet(num_data=60)
    guide = mean_field_guide(model, init_scale=1e-30)  # every draw is the mean
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([3, 1, 4, 1])
    weights = guide.means()
    terms = KLWeightedELBO().terms(model, guide, x, y)
    trace = poutine.trace(poutine.condition(model, data=weights)).get_trace(x, y)
    traced = -(trace.nodes["obs"]["fn"].log_prob(y) * trace.nodes["obs"]["scale"]).sum()
    torch.testing.assert_close(terms.nll, traced)
    assert terms.nll.item() > 0 and terms.outputs.shape == (4, 10)
    torch.testing.assert_close(model.outputs(x, weights), trace.nodes["logits"]["value"])
    with pytest.raises(
        ValueError, match=r"labels in \[1, 10\], expected class indices in \[0, 9\]"
    ):
        KLWeightedELBO().terms(model, guide, x, torch.tensor([3, 1, 4, 10]))


def test_model_subclass_overriding_forward_is_traced():
    calls = []

    class Logged(BayesianMLP):
        def forward(self, x, y=None):
            calls.append(x.shape[0])
            return super().forward(x, y)

    model = Logged(in_features=3, hidden_features=20, out_features=2, num_data=40)
    guide = mean_field_guide(model)
    x, y = toy_data(7)
    terms = KLWeightedELBO().terms(model, guide, x, y)
    assert calls == [7]  # its forward ran: the guide was traced and the model replayed
    assert torch.isfinite(terms.loss)
    KLWeightedELBO().terms(tiny_mlp(num_data=40), mean_field_guide(tiny_mlp()), x, y)
    assert calls == [7]


@pytest.mark.parametrize("make", [tiny_mlp, lambda **kw: BayesianLeNet(**kw)])
def test_plain_pyro_svi_trains(make):
    model = make(num_data=40)
    if isinstance(model, BayesianLeNet):
        x = torch.randn(40, 1, 28, 28)
        y = (x.mean((1, 2, 3)) > 0).long()
    else:
        x, y = toy_data(40)
    guide = mean_field_guide(model, init_scale=1e-3)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), loss=KLWeightedELBO(1e-3))
    losses = [svi.step(x, y) for _ in range(40)]
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5
    # Pyro's optimizer saw the guide's parameters: they moved
    assert any(name.startswith(guide.name) for name in pyro.get_param_store().keys())


def test_two_models_never_share_parameters():
    x, y = toy_data(40)
    models = [tiny_mlp(num_data=40), tiny_mlp(num_data=40)]
    guides = [mean_field_guide(m) for m in models]
    assert guides[0].name != guides[1].name
    before = [g.site_loc("fc1.weight").detach().clone() for g in guides]
    svis = [
        pyro.infer.SVI(m, g, pyro.optim.Adam({"lr": 1e-2}), loss=KLWeightedELBO())
        for m, g in zip(models, guides, strict=True)
    ]
    for _ in range(5):
        svis[0].step(x, y)
    after_first = [g.site_loc("fc1.weight").detach().clone() for g in guides]
    assert not torch.equal(after_first[0], before[0])
    assert torch.equal(after_first[1], before[1])  # untouched by training the other one
    for _ in range(5):
        svis[1].step(x, y)
    assert torch.equal(guides[0].site_loc("fc1.weight"), after_first[0])
    assert not torch.equal(guides[1].site_loc("fc1.weight"), before[1])


def test_param_store_entries_go_with_the_guide():
    import gc

    model = tiny_mlp(num_data=40)
    guide = mean_field_guide(model)
    x, y = toy_data(10)
    pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), KLWeightedELBO()).step(x, y)
    prefix = guide.name
    assert any(k.startswith(prefix) for k in pyro.get_param_store().keys())
    del guide
    gc.collect()
    assert not any(k.startswith(prefix) for k in pyro.get_param_store().keys())


def test_guide_initialisation():
    torch.manual_seed(0)
    model = BayesianMLP()
    guide = mean_field_guide(model, init_scale=0.05)
    loc = guide.site_loc("fc1.weight")
    bound = 1 / math.sqrt(784)  # torch's default Linear init is U(-1/sqrt(in), 1/sqrt(in))
    assert loc.abs().max() <= bound and loc.std() > 0.5 * bound / math.sqrt(3)
    torch.testing.assert_close(guide.site_scale("fc2.weight"), torch.full((10, 256), 0.05))
    plain = MLP()
    from_plain = mean_field_guide(model, init_from=plain)
    for name, param in plain.named_parameters():
        assert torch.equal(from_plain.site_loc(name), param)


def test_relative_initial_scales_follow_the_weights():
    """MOPED: sigma = 0.1 * |w| per weight, 1e-6 for a weight of 0, 0.1 in log space for a
    positive site; the option is in the guide's repr and checkpoint config."""
    torch.manual_seed(0)
    plain = MLP()
    with torch.no_grad():
        plain.fc1.bias[:3] = 0.0
    guide = mean_field_guide(BayesianMLP(), init_from=plain, init_scale_relative=0.1)
    for name, param in plain.named_parameters():
        expected = (0.1 * param.detach().abs()).clamp_min(1e-6)
        torch.testing.assert_close(guide.site_scale(name), expected, rtol=1e-5, atol=0)
    assert guide.site_scale("fc1.bias")[:3].tolist() == pytest.approx([1e-6] * 3, rel=1e-4)
    assert "init_scale_relative=0.1" in repr(guide)
    assert guide.checkpoint_config() == {"init_scale": 0.01, "init_scale_relative": 0.1}
    noisy = bayesian(torch.nn.Linear(2, 1), likelihood=Gaussian(dist.HalfNormal(1.0)))
    lognormal = mean_field_guide(noisy, init_scale_relative=0.2)
    (positive,) = lognormal.positive
    torch.testing.assert_close(lognormal.site_scale(positive), torch.tensor(0.2))


def test_init_from_names_the_normalisation_layers_it_leaves_behind():
    def net(seed=0):
        torch.manual_seed(seed)
        return torch.nn.Sequential(
            torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
        )

    trained = net()
    trained(torch.randn(8, 3))  # train mode: new running statistics
    for seed in (0, 1):  # the latent sites' start values are the guide's: never named
        with pytest.warns(
            UserWarning,
            match=r"keep their values where init_from's differ "
            r"\(1.running_mean, 1.running_var, 1.num_batches_tracked\).*"
            r"pyrouq.bayesian\(trained\)",
        ):
            mean_field_guide(bayesian(net(seed)), init_from=trained)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guide = mean_field_guide(bayesian(trained), init_from=trained)  # nothing left behind
    assert torch.equal(guide.site_loc("0.weight"), trained[0].weight)


def test_init_from_names_the_layers_the_model_lacks():
    """A trained network with a layer more than the model's (a deeper one) is not of the
    model's structure: the guide takes the weights the two share, and the rest is named."""
    from pyrouq import batchensemble, rank1

    torch.manual_seed(0)
    model = bayesian(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)))
    deeper = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2)
    )
    with pytest.warns(
        UserWarning,
        match=r"init_from \(Sequential\) holds parameters or buffers that BayesianNetwork's "
        r"network lacks \(2.weight, 2.bias\): it is not a network of the model's structure",
    ):
        guide = mean_field_guide(model, init_from=deeper)
    assert torch.equal(guide.site_loc("1.weight"), deeper[1].weight)
    with warnings.catch_warnings():  # the network of the model's structure: nothing to say
        warnings.simplefilter("error")
        mean_field_guide(model, init_from=torch.nn.Sequential(*deeper[:2]))
        # nor for rank-1, whose trained BatchEnsemble holds per-member norms ('1.norms.0.weight')
        net = torch.nn.Sequential(
            torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
        )
        mean_field_guide(rank1(net, 2), init_from=batchensemble(net, 2))


def test_a_float64_model_gets_a_float64_guide_and_predictions():
    from pyrouq import predict

    model = BayesianMLP().double()
    guide = mean_field_guide(model, init_from=MLP())  # a float32 init_from: the model's dtype
    assert {p.dtype for p in guide.parameters()} == {torch.float64}
    preds = predict(model, torch.randn(3, 1, 28, 28), guide, num_samples=2)
    assert preds.probs.dtype == torch.float64
    assert preds.probs.sum(-1).sub(1).abs().max() < 1e-12  # float32 would miss this


def test_guide_sites_are_normal_of_prior_shape():
    model = tiny_mlp()
    guide = mean_field_guide(model)
    trace = poutine.trace(guide).get_trace()
    for name, shape in model.latent_sites().items():
        fn = trace.nodes[name]["fn"]
        assert isinstance(fn, dist.Independent) and isinstance(fn.base_dist, dist.Normal)
        assert fn.event_shape == shape and fn.batch_shape == ()


def test_fit_history_and_learning():
    x, y = toy_data(200)
    loader = ListLoader(x, y, 50)
    model = tiny_mlp()
    guide = mean_field_guide(model, init_scale=0.01)
    result = fit(model, guide, loader, epochs=8, lr=0.05, progress=False, seed=0)
    assert model.num_data == 200 and result.num_data == 200
    assert len(result.history) == 8 and result.steps == 32
    first, last = result.history[0], result.history[-1]
    assert last.loss < first.loss
    assert last.loss == pytest.approx(last.nll + result.kl_weight * last.kl, rel=1e-6)
    assert last.train_acc > 0.85
    assert all(r.seconds > 0 for r in result.history)


def test_fit_kl_weight_enters_the_loss():
    x, y = toy_data(40)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    result = fit(model, guide, ListLoader(x, y, 40), epochs=1, kl_weight=0.25, progress=False)
    record = result.history[0]
    assert record.loss == pytest.approx(record.nll + 0.25 * record.kl, rel=1e-6)


@pytest.mark.parametrize("kind", ["plain", "bayesian"])
def test_int32_labels_train_as_int64_ones_do(kind):
    # numpy hands out int32 labels: fit() takes them, and trains as on int64 labels
    x, y = toy_data(40)

    def run(labels):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        model = bayesian(net) if kind == "bayesian" else net
        guide = mean_field_guide(model) if kind == "bayesian" else None
        result = fit(model, guide, ListLoader(x, labels, 20), epochs=2, progress=False, seed=0)
        return [record.loss for record in result.history]

    assert run(y.int()) == run(y)


def test_fit_same_seed_same_history():
    x, y = toy_data(80)

    def run():
        torch.manual_seed(0)
        model = tiny_mlp()
        guide = mean_field_guide(model)
        fit(model, guide, ListLoader(x, y, 20), epochs=2, progress=False, seed=3)
        return [guide.site_loc(s).detach() for s in guide.sites]

    for a, b in zip(run(), run(), strict=True):
        assert torch.equal(a, b)


def test_fit_seed_repeats_an_autoguide_that_starts_at_random():
    from pyro.infer.autoguide import AutoDiagonalNormal

    x, y = toy_data(48)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 8), torch.nn.ReLU(),
                              torch.nn.Linear(8, 2))  # fmt: skip
    losses = []
    for outside in (1, 2):  # the global state before fit() differs
        pyro.clear_param_store()  # where autoguides keep their parameters, by name
        torch.manual_seed(outside)
        model = bayesian(net)
        result = fit(model, AutoDiagonalNormal(model), ListLoader(x, y, 24), epochs=2,
                     progress=False, seed=0)  # fmt: skip
        losses.append([record.loss for record in result.history])
    assert losses[0] == losses[1]


def test_fit_refuses_before_training_what_it_could_not_store(tmp_path):
    x, y = toy_data(48)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    before = [p.detach().clone() for p in guide.parameters()]
    with pytest.raises(CheckpointError, match=r"metadata must hold JSON values .*\.tolist\(\)"):
        fit(model, guide, ListLoader(x, y, 24), epochs=2, progress=False,
            checkpoint=tmp_path / "c.pt", metadata={"lr": torch.tensor(0.1)})  # fmt: skip
    for callbacks in (print, None):
        with pytest.raises(TypeError, match=r"callbacks to be a sequence of callables.*\[print\]"):
            fit(model, guide, ListLoader(x, y, 24), epochs=2, progress=False, callbacks=callbacks)
    assert all(torch.equal(a, b) for a, b in zip(before, guide.parameters(), strict=True))
    assert not (tmp_path / "c.pt").exists()
    with pytest.warns(UserWarning, match=r"no checkpoint= was given: it is not kept") as record:
        fit(model, guide, ListLoader(x, y, 24), epochs=1, progress=False, metadata={"a": 1})
    assert {w.filename for w in record if "not kept" in str(w.message)} == {__file__}  # here
    calls = []  # a generator of callbacks is read once and each called every epoch
    fit(model, guide, ListLoader(x, y, 24), epochs=2, progress=False,
        callbacks=(c for c in [calls.append]))  # fmt: skip
    assert len(calls) == 2


def test_fit_takes_the_models_own_num_data_and_refuses_numpy_batches_before_training():
    import numpy as np

    x, y = toy_data(24)
    model = bayesian(torch.nn.Linear(x.shape[1], 2), num_data=240)
    guide = mean_field_guide(model)
    fit(model, guide, [(x, y)], epochs=1, progress=False)  # a list: no sized .dataset
    assert model.num_data == 240
    before = [p.detach().clone() for p in guide.parameters()]
    with pytest.raises(TypeError, match=r"batch 1 of epoch 1 is \(ndarray, ndarray\)\. Convert "
                       r"them with torch.as_tensor"):  # fmt: skip
        fit(model, guide, [(x.numpy(), y.numpy().astype(np.int64))], epochs=1, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(before, guide.parameters(), strict=True))
    with pytest.warns(UserWarning, match=r"has no length: the learning rate stays constant") as w:
        fit(model, guide, iter([(x, y)]), epochs=1, progress=False)
    assert {r.filename for r in w if "no length" in str(r.message)} == {__file__}  # here

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield x, y

    with pytest.warns(UserWarning, match=r"\(DataLoader\) has no length"):  # len() raises
        fit(model, guide, torch.utils.data.DataLoader(Stream(), batch_size=None), epochs=1,
            progress=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(model, guide, iter([(x, y)]), epochs=1, progress=False, lr_schedule="constant")


def test_a_label_of_minus_100_is_not_dropped_when_checks_are_off():
    # cross_entropy's default ignore_index is -100: the fast NLL must not skip such a row
    x, y = toy_data(8)
    y = y.clone()
    y[1] = -100
    model = tiny_mlp()
    with pytest.raises(ValueError, match=r"labels in \[-100, 1\], expected class indices"):
        fit(model, mean_field_guide(model), [(x, y)], epochs=1, num_data=8, progress=False,
            check_inputs=False)  # fmt: skip


def test_a_float64_network_runs_under_its_prior_draws():
    from pyro.infer.autoguide import AutoNormal

    x, y = toy_data(24)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 4), torch.nn.ReLU(),
                              torch.nn.Linear(4, 2)).double()  # fmt: skip
    model = bayesian(net, prior={"0": 1.0, "2": dist.Normal(0.0, 2.0)})
    assert {model.prior_of(s).base().mean.dtype for s in model.latent_sites()} == {torch.float64}
    assert model(x.double()).dtype == torch.float64  # weights drawn from the prior
    assert pyro.infer.Predictive(model, num_samples=2)(x.double())["logits"].dtype == (
        torch.float64
    )
    guide = AutoNormal(model)
    fit(model, guide, ListLoader(x.double(), y, 12), epochs=1, progress=False, seed=0)


def _fitted(optim, tmp_path=None, **kwargs):
    x, y = toy_data(80)
    torch.manual_seed(0)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    rate = {"lr": 0.03} if optim is None else {}  # (optim's own lr otherwise)
    fit(model, guide, ListLoader(x, y, 20), epochs=3, optim=optim, progress=False, seed=1,
        **rate, **kwargs)  # fmt: skip
    return model, guide


def test_default_adam_is_torch_adam_to_the_bit():
    # fit's default optimizer is pyrouq's own Adam (no torch._dynamo import); the schedule
    # changes the learning rate at every step, so its param_groups are exercised too. To the
    # bit against torch's fused kernel, as documented: torch.optim.Adam()'s default
    # (multi-tensor) update rounds differently on some CPUs (AMD EPYC: 6e-8 apart)
    _, ours = _fitted(None)
    _, theirs = _fitted(lambda params: torch.optim.Adam(params, lr=0.03, fused=True))
    for name in ours.sites:
        assert torch.equal(ours.site_loc(name), theirs.site_loc(name)), name
        assert torch.equal(ours.site_scale(name), theirs.site_scale(name)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_default_adam_matches_torch_adam_whatever_the_gradient_layout(dtype):
    # where every gradient shares its parameter's layout the update runs in torch's fused
    # kernel: torch.optim.Adam(fused=True)'s values to the bit; a channels-last gradient of a
    # contiguous parameter goes through the multi-tensor ops; either is torch.optim.Adam()'s
    # update to float rounding (the fused kernel rounds a few entries otherwise: this test
    # once compared to the bit and passed on its data alone)
    from pyrouq.infer._adam import Adam

    torch.manual_seed(0)
    start = [torch.randn(4, 1, 3, 3, dtype=dtype), torch.randn(3, 144, dtype=dtype),
             torch.randn(200, dtype=dtype)]  # fmt: skip

    def run(make, mixed_layouts):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        optimizer = make(params)
        for step in range(4):
            for p in params:
                grad = torch.sin(3 * p.detach() + step)
                if mixed_layouts and p.dim() == 4 and step % 2:
                    grad = grad.contiguous(memory_format=torch.channels_last)
                p.grad = grad
            optimizer.step()
        return params

    ours = run(lambda ps: Adam(ps, lr=0.05), mixed_layouts=False)
    fused = run(lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True), mixed_layouts=False)
    for a, b in zip(ours, fused, strict=True):
        assert torch.equal(a, b) and a.dtype == dtype
    for mixed in (False, True):
        ours = run(lambda ps: Adam(ps, lr=0.05), mixed)
        theirs = run(lambda ps: torch.optim.Adam(ps, lr=0.05), mixed)
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_default_adam_state_loads_into_torch_adam_and_back(tmp_path):
    from pyrouq.checkpoint import load

    path = tmp_path / "run.pt"
    model, guide = _fitted(None, checkpoint=path)
    saved = load(path).optimizer_state
    params = list(model.parameters()) + list(guide.parameters())  # fit's order
    torch_adam = torch.optim.Adam(params, lr=0.03)
    torch_adam.load_state_dict(saved)  # torch's layout: positions, the group's switches
    assert torch_adam.state_dict()["param_groups"] == saved["param_groups"]
    for position, state in saved["state"].items():
        assert float(state["step"]) == 12.0  # 3 epochs of 4 batches
        assert torch.equal(torch_adam.state[params[position]]["exp_avg"], state["exp_avg"])


def test_fit_stops_on_non_finite_loss_and_keeps_parameters():
    x, y = toy_data(40)
    x_bad = x.clone()
    x_bad[25] = float("inf")
    model = tiny_mlp()
    guide = mean_field_guide(model)
    loader = ListLoader(x_bad, y, 20)
    before_second = {}

    class Spy(list):
        dataset = loader.dataset

        def __iter__(self):
            for i, batch in enumerate(loader):
                if i == 1:
                    before_second.update(
                        {s: guide.site_loc(s).detach().clone() for s in guide.sites}
                    )
                yield batch

    with pytest.raises(FloatingPointError, match=r"Non-finite loss .* at epoch 1, step 2"):
        fit(model, guide, Spy(), epochs=1, progress=False, check_inputs=False,
            lr_schedule="constant")  # fmt: skip
    for site, value in before_second.items():
        assert torch.equal(guide.site_loc(site), value)


@pytest.mark.parametrize("kl_weight", [1e300, 1e38])
def test_a_kl_weight_that_overflows_the_loss_is_named_not_init_scale(kl_weight):
    # the advice was "Lower lr, ... or use a smaller init_scale": at the first step (no lr
    # yet), where a smaller init_scale makes the KL larger
    x, y = toy_data(40)
    model = tiny_mlp()
    with pytest.raises(FloatingPointError) as info:
        fit(model, mean_field_guide(model), ListLoader(x, y, 20), epochs=1,
            kl_weight=kl_weight, progress=False)  # fmt: skip
    told = str(info.value)
    assert told.startswith("Non-finite loss (inf) at epoch 1, step 1; ")
    assert f"The KL term overflowed it: kl_weight * KL = {kl_weight:g} * " in told
    overflow = info.value.overflow  # the figures as attributes (the command reads them)
    assert (overflow.kl_weight, overflow.dtype) == (kl_weight, torch.float32)
    assert 0 < overflow.kl < 1e6 and 0 < overflow.nll < 1e3  # (the KL of 20-unit layers)
    assert f"kl_weight * KL = {overflow.figures}. Pass a smaller kl_weight" in told
    info.value.add_note("(raised in rank 1)")  # kept, as a FloatingPointError's notes are
    again = pickle.loads(pickle.dumps(info.value))  # (a process's error, sent back)
    assert (str(again), again.overflow) == (told, overflow)
    assert again.__notes__ == ["(raised in rank 1)"]
    assert "in float32 (largest 3.4e+38). Pass a smaller kl_weight (1 is the exact ELBO" in told
    assert "Lower lr" not in told
    model = tiny_mlp()
    fit(model, mean_field_guide(model), ListLoader(x, y, 20), epochs=1, kl_weight=1e30,
        progress=False)  # the KL term in range: trains  # fmt: skip


def test_the_advice_for_a_non_finite_loss_names_the_kl_term_only_where_it_is_the_cause():
    from pyrouq.infer._nonfinite import USUAL_FIX, loss_fix

    assert loss_fix(math.inf, 25.9, 505.8, 1e38, torch.float32) == (
        "The KL term overflowed it: kl_weight * KL = 1e+38 * 505.8 = 5.06e+40, beside an NLL "
        "of 25.9, in float32 (largest 3.4e+38). Pass a smaller kl_weight (1 is the exact ELBO; "
        "kl_weight = k * N for a loss of mean NLL + k * KL per example); an init_scale further "
        "below the prior's scale would make the KL larger."
    )  # (90960c4: not "a smaller init_scale would make the KL larger", true below it only)
    # a weight the dtype cannot hold: its product with a KL of 0 is NaN, though "0" here
    assert loss_fix(math.nan, 25.9, 0.0, 1e39, torch.float32).startswith(
        "The KL term overflowed it: kl_weight * KL = 1e+39 * 0 = 0, beside an NLL of 25.9"
    )
    # a KL or NLL that is itself inf (a scale of 0, inf in the data): no smaller kl_weight helps
    assert loss_fix(math.inf, 25.9, math.inf, 1.0, torch.float32) == USUAL_FIX
    assert loss_fix(math.inf, math.inf, 505.8, 1e38, torch.float32) == USUAL_FIX
    assert loss_fix(math.inf, 1e38, 5.0, 1.0, torch.float32) == USUAL_FIX  # the NLL's the larger


def test_the_advice_where_only_the_sum_of_finite_float16_terms_overflows_names_the_dtype():
    from pyrouq.infer._nonfinite import USUAL_FIX, loss_fix

    nll, kl = torch.tensor([40000.0, 30000.0], dtype=torch.float16)  # each finite in float16
    loss = nll + kl
    assert math.isinf(float(loss)) and loss.dtype == torch.float16  # 70,000 > 65,504
    told = loss_fix(float(loss), float(nll), float(kl), 1.0, loss.dtype)
    assert told == (  # was USUAL_FIX: lr, NaN in the data or init_scale, none the cause
        "The sum overflowed it: NLL + kl_weight * KL = 40000 + 30000 = 7e+04, past float16's "
        "largest 6.55e+04, though each term is finite. The NLL sums a batch's log-likelihood "
        "scaled to the N training points (N/B times it), so it grows with N; a lower lr does "
        "not help. Train in bfloat16 (net.bfloat16(): the same memory, float32's range) or in "
        "float32."
    )
    assert loss_fix(math.inf, 3e38, 1e38, 1.0, torch.float32).endswith(
        "Train in float64 (net.double())."
    )
    assert loss_fix(math.inf, 30000.0, 20000.0, 1.0, torch.float16) == USUAL_FIX  # sum in range


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.filterwarnings("ignore:Error detected in")
def test_a_nan_under_torchs_anomaly_detection_is_noted_with_fits_words():
    # the backward pass raised torch's "Function ... returned nan values" before fit()'s own
    # check of the loss, without its words on what was kept and what to do
    x, y = toy_data(40)
    x_bad = x.clone()
    x_bad[25] = float("inf")
    model = tiny_mlp()
    guide = mean_field_guide(model)
    before = {s: guide.site_loc(s).detach().clone() for s in guide.sites}
    with (
        torch.autograd.detect_anomaly(),
        pytest.raises(RuntimeError, match=r"returned nan values") as info,
    ):
        fit(model, guide, ListLoader(x_bad, y, 20), epochs=1, progress=False,
            check_inputs=False, lr_schedule="constant")  # fmt: skip
    assert getattr(info.value, "__notes__", None) == [
        "(fit(): torch's anomaly detection stopped the backward pass of epoch 1, step 2 at a "
        "NaN, before fit()'s own check of the loss; training stopped and the parameters and "
        "normalisation statistics of the last finite step are kept. Lower lr, check the inputs "
        "and targets for NaN/inf, or use a smaller init_scale.)"
    ]
    # the first step's parameters (finite) are kept: the second step was not taken
    first_step = {s: guide.site_loc(s) for s in guide.sites}
    assert any(not torch.equal(first_step[s], before[s]) for s in before)
    assert all(torch.isfinite(v).all() for v in first_step.values())


def _norm_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 3)
    )


def _statistics(net: torch.nn.Module) -> list[torch.Tensor]:
    return [b.detach().clone() for b in net.buffers() if b.dim() == 1 or b.dim() == 0]


def _keeping_statistics(loader, model, kept: list) -> ListLoader:
    """``loader``, which puts ``model``'s statistics in ``kept`` before its second batch."""

    class Spy(list):
        dataset = loader.dataset

        def __iter__(self):
            for i, batch in enumerate(loader):
                if i == 1:
                    kept.extend(_statistics(model))
                yield batch

    return Spy()


@pytest.mark.parametrize("way", ["plain", "bayesian", "batchensemble"])
def test_refused_step_leaves_the_normalisation_statistics_of_the_last_finite_step(way):
    """A step whose loss is non-finite (or whose forward fails) updated the BatchNorm running
    statistics in its forward pass; they are put back with the parameters: inf running
    variances made every later prediction the same."""
    from pyrouq import batchensemble

    x, y = toy_data(40)
    x_bad = x.clone()
    x_bad[25] = float("inf")
    net = _norm_net()
    model = {"plain": lambda: net, "bayesian": lambda: bayesian(net),
             "batchensemble": lambda: batchensemble(net, 2)}[way]()  # fmt: skip
    guide = mean_field_guide(model) if way == "bayesian" else None
    before_second: list[torch.Tensor] = []
    loader = _keeping_statistics(ListLoader(x_bad, y, 20), model, before_second)
    with pytest.raises(FloatingPointError, match=r"parameters and normalisation statistics"):
        fit(model, guide, loader, epochs=1, progress=False, lr_schedule="constant",
            check_inputs=False)  # fmt: skip
    after = _statistics(model)
    assert len(after) == len(before_second) >= 3
    for kept, now in zip(before_second, after, strict=True):
        assert torch.equal(kept, now)
        assert bool(torch.isfinite(now.double()).all())


def test_step_whose_forward_fails_leaves_the_normalisation_statistics():
    class FailsSecondTime(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _norm_net()
            self.calls = 0

        def forward(self, x):
            out = self.body(x)  # the BatchNorm updates its statistics first
            self.calls += self.training and x.shape[0] == 20
            if self.calls == 2:
                raise RuntimeError("a failure of the network's own, after its BatchNorm")
            return out

    x, y = toy_data(40)
    net = FailsSecondTime()
    kept: list[torch.Tensor] = []
    with pytest.raises(RuntimeError, match="a failure of the network's own"):
        fit(net, None, _keeping_statistics(ListLoader(x, y, 20), net, kept), epochs=1,
            progress=False)  # fmt: skip
    assert len(kept) == 3
    assert all(torch.equal(a, b) for a, b in zip(kept, _statistics(net), strict=True))


def test_lazy_norms_train_and_a_guides_norm_statistics_are_put_back_too():
    """A lazy BatchNorm's statistics cannot be copied before its first forward pass (fit
    failed on them when its probe did not run the network); a guide's BatchNorm statistics
    are put back with the model's."""
    from pyro.nn import PyroModule, PyroParam

    class Net(torch.nn.Sequential):
        num_classes = 3  # states its classes: fit()'s probe does not run it

    torch.manual_seed(0)
    net = Net(torch.nn.LazyLinear(6), torch.nn.LazyBatchNorm1d(), torch.nn.ReLU(),
              torch.nn.Linear(6, 3))  # fmt: skip
    x, y = torch.randn(40, 4), torch.randint(0, 3, (40,))
    fit(net, None, [(x[:20], y[:20]), (x[20:], y[20:])], num_data=40, epochs=1, progress=False)
    assert net[1].running_mean.shape == (6,) and bool(net[1].running_mean.abs().sum() > 0)

    class Model(PyroModule):
        calls = 0

        def forward(self, x, y=None):
            w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
            if self.training and y is not None:
                self.calls += 1
                if self.calls == 3:
                    raise RuntimeError("the model fails after the guide ran")
            with pyro.plate("data", 40, subsample_size=x.shape[0]):
                pyro.sample("obs", dist.Categorical(logits=x @ w), obs=y)

    class Guide(PyroModule):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(3)
            self.loc = PyroParam(torch.zeros(3, 2))

        def forward(self, x, y=None):
            features = self.bn(x)  # amortisation features, say
            pyro.sample("w", dist.Normal(self.loc + 0 * features.mean(), 0.1).to_event(2))

    x = torch.randn(40, 3)
    y = torch.randint(0, 2, (40,))
    guide = Guide()
    kept: list[torch.Tensor] = []

    class Spy(list):
        def __iter__(self):
            for batch in list.__iter__(self):
                kept.append(guide.bn.running_mean.clone())
                yield batch

    with pytest.raises(RuntimeError, match="the model fails after the guide ran"):
        fit(Model(), guide, Spy([(x[:20], y[:20]), (x[20:], y[20:])]), epochs=2, num_data=40,
            progress=False)  # fmt: skip
    assert len(kept) >= 3 and not torch.equal(kept[0], kept[-1])
    assert torch.equal(guide.bn.running_mean, kept[-1])


def test_a_run_that_raises_leaves_the_model_in_eval_mode():
    """As fit() documents; a callback's error, a refused batch or a non-finite loss left it
    in training mode."""
    net = _norm_net()
    x, y = toy_data(40)

    def fails(record):
        raise RuntimeError("a callback's own error")

    with pytest.raises(RuntimeError, match="a callback's own error"):
        fit(net, None, ListLoader(x, y, 20), epochs=2, progress=False, callbacks=[fails])
    assert not net.training and not net[1].training


def test_fit_bad_arguments():
    x, y = toy_data(20)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    loader = ListLoader(x, y, 10)
    with pytest.raises(ValueError, match=r"Expected epochs to be an integer >= 1, got 0"):
        fit(model, guide, loader, epochs=0)
    with pytest.raises(ValueError, match=r"Expected num_particles to be an integer >= 1, got 0"):
        fit(model, guide, loader, epochs=1, num_particles=0)
    with pytest.raises(ValueError, match="train_loader is empty"):
        fit(model, guide, ListLoader(x[:0], y[:0], 10), epochs=1)
    with pytest.raises(ValueError, match=r"yielded no batches \(a DataLoader with drop_last=True "
                       r"and a batch_size above N yields none"):  # fmt: skip
        fit(model, guide, [], epochs=1, num_data=10)
    with pytest.raises(ValueError, match="Cannot tell the training-set size N"):
        fit(model, guide, [(x, y)], epochs=1)
    # a list of batches fit() refuses: said first, not after asking for num_data=N (two
    # refusals in a row, the first of them no help)
    told = r"must yield \(x, y\) tensor pairs; batch 1 of epoch 1 is \({} of"
    with pytest.raises(TypeError, match=told.format("dict")):
        fit(model, guide, [({"x": x}, y)], epochs=1)
    with pytest.raises(TypeError, match=told.format("tuple")):
        fit(model, guide, ((((x, x), y),)), epochs=1)
    with pytest.raises(ValueError, match=r"has latent sites but guide is None"):
        fit(model, None, loader, epochs=1)
    one_shot = ((x[i : i + 10], y[i : i + 10]) for i in range(0, 20, 10))
    with pytest.raises(ValueError, match=r"train_loader is an iterator \(generator\), which "
                       r"yields its batches once, but epochs=2\. Pass something that can be "
                       r"iterated once per epoch"):  # fmt: skip
        fit(model, guide, one_shot, epochs=2, num_data=20, progress=False)
    assert fit(model, guide, one_shot, epochs=1, num_data=20, progress=False,
               lr_schedule="constant").steps == 2  # fmt: skip
    # a plain network's first examples are looked at (its number of classes) and put back
    plain = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    one_shot = ((x[i : i + 10], y[i : i + 10]) for i in range(0, 20, 10))
    assert fit(plain, None, one_shot, epochs=1, num_data=20, progress=False,
               lr_schedule="constant").steps == 2  # fmt: skip


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_kl_weight(bad):
    with pytest.raises(ValueError, match=r"Expected kl_weight to be a finite float >= 0"):
        KLWeightedELBO(kl_weight=bad)


def test_a_kl_weight_of_minus_0_is_0():
    # -0.0 >= 0 passed, and the repr and a fit's record showed kl_weight=-0.0
    elbo = KLWeightedELBO(kl_weight=-0.0)
    assert math.copysign(1.0, elbo.kl_weight) == 1.0 and "kl_weight=-0" not in repr(elbo)
    x, y = torch.randn(8, 4), torch.arange(8) % 3
    model = bayesian(torch.nn.Linear(4, 3))
    guide = mean_field_guide(model)
    result = fit(model, guide, [(x, y)], epochs=1, num_data=8, kl_weight=-0.0, progress=False)
    assert "kl_weight=0.0," in repr(result) and math.copysign(1.0, result.kl_weight) == 1.0


def test_a_fit_results_repr_is_one_short_line_its_history_whole():
    # a notebook cell ending in fit(...) showed every epoch's record in full precision (~170
    # characters an epoch: a screenful for a 100-epoch run); the repr gives their number and
    # the last one's figures, rounded, and the records stay whole in .history
    from pyrouq.infer import EpochRecord, FitResult

    records = tuple(
        EpochRecord(e, 1000.0 / e + 0.123456, 900.0 / e, 2000.0 + 1.0 / 3, 0.987654, 0.25)
        for e in range(1, 101)
    )
    result = FitResult(records, num_data=60000, kl_weight=0.01, num_particles=1, steps=4700)
    assert repr(result) == (
        "FitResult(history=<100 epochs, last: loss=10.12, nll=9, kl=2000, train_acc=0.9877>, "
        "num_data=60000, kl_weight=0.01, num_particles=1, steps=4700, seconds=25.0)"
    )
    assert result.history == records and result.losses[-1] == 1000.0 / 100 + 0.123456
    one = FitResult(records[:1], num_data=8, kl_weight=0.0, num_particles=2, steps=2)
    assert repr(one).startswith("FitResult(history=<1 epoch, last: loss=1000,")
    none = FitResult((), num_data=8, kl_weight=0.02, num_particles=1, steps=0)
    assert repr(none).startswith("FitResult(history=<0 epochs>, num_data=8, kl_weight=0.02,")


def test_an_epoch_records_repr_is_rounded_its_figures_whole():
    # a record (fit()'s callbacks get one; result.history holds them) showed each float in full
    # precision (137 characters); the repr rounds them as FitResult's does
    from pyrouq.infer import EpochRecord

    record = EpochRecord(3, 1000.0 / 3 + 0.123456, 900.0 / 7, 2000.0 + 1.0 / 3, 0.987654321, 0.25)
    assert repr(record) == (
        "EpochRecord(epoch=3, loss=333.5, nll=128.6, kl=2000, train_acc=0.9877, seconds=0.2)"
    )
    assert record.loss == 1000.0 / 3 + 0.123456 and record.train_acc == 0.987654321
    odd = EpochRecord(1, None, 1.0, 1.0, math.nan, 1)  # type: ignore[arg-type]
    assert repr(odd) == "EpochRecord(epoch=1, loss=None, nll=1, kl=1, train_acc=nan, seconds=1.0)"


def test_a_fit_without_a_kl_term_leaves_kl_weight_out_of_its_repr():
    # a BatchEnsemble's (or a plain network's) fit showed kl_weight=0.02, the default, which
    # weighs nothing there (no guide: the loss is the NLL alone); the attribute stays
    from pyrouq.convert import batchensemble

    x, y = torch.randn(8, 4), torch.arange(8) % 3
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    for model in (batchensemble(net, 2), torch.nn.Linear(4, 3)):
        result = fit(model, None, [(x, y)], epochs=1, num_data=8, progress=False)
        assert ", num_data=8, num_particles=1, steps=1," in repr(result)
        assert result.kl_weight == 0.02 and result.history[-1].kl == 0.0
    model = bayesian(torch.nn.Linear(4, 3))
    result = fit(model, mean_field_guide(model), [(x, y)], epochs=1, num_data=8, progress=False)
    assert ", num_data=8, kl_weight=0.02, num_particles=1, steps=1," in repr(result)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_bad_init_scale(bad):
    with pytest.raises(ValueError, match=r"Expected init_scale > 0"):
        mean_field_guide(tiny_mlp(), init_scale=bad)
    with pytest.raises(
        ValueError, match=r"Expected init_scale_relative > 0 .*init_scale_relative \* \|loc\|"
    ):
        mean_field_guide(tiny_mlp(), init_scale_relative=bad)


def test_absolute_and_relative_initial_scales_together_are_refused():
    with pytest.raises(
        ValueError, match=r"init_scale=0.05 and init_scale_relative=0.1: .* Pass one of them"
    ):
        mean_field_guide(tiny_mlp(), init_scale=0.05, init_scale_relative=0.1)


def test_guide_for_unsupported_model_and_mismatched_init_from():
    with pytest.raises(TypeError, match="needs a pyrouq Bayesian model"):
        mean_field_guide(MLP())
    with pytest.raises(
        ValueError, match=r"init_from parameter 'fc1.weight' has shape \(256, 784\)"
    ):
        mean_field_guide(BayesianMLP(hidden_features=128), init_from=MLP())


def test_init_from_a_trained_batchensemble_starts_a_rank1_guide():
    from pyrouq import batchensemble, rank1

    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ensemble = batchensemble(net, 2)
    with torch.no_grad():
        ensemble.net[0].r.fill_(2.0)
        ensemble.net[2].s.fill_(0.5)
    model = rank1(net, 2)
    guide = mean_field_guide(model, init_from=ensemble)
    assert torch.equal(guide.site_loc("0.r"), torch.full((2, 4), 2.0))
    assert torch.equal(guide.site_loc("2.s"), torch.full((2, 3), 0.5))
    with pytest.raises(TypeError, match=r"init_from is a Bayesian model \(BayesianNetwork\): its "
                       r"weights are drawn from its guide"):  # fmt: skip
        mean_field_guide(model, init_from=model)


def _frozen(params):
    return torch.optim.SGD(params, lr=0.0)  # the network stays as built: its accuracy is known


@pytest.mark.parametrize("kind", ["plain", "bayesian", "batchensemble"])
def test_train_acc_counts_the_examples_the_steps_saw(kind):
    from pyrouq import batchensemble, predict
    from pyrouq.models import MLP

    x, y = toy_data(110)
    torch.manual_seed(0)
    net = MLP(in_features=3, hidden_features=4, out_features=2)
    guide = None
    if kind == "plain":
        model = net
        expected = net(x).argmax(-1)
    elif kind == "bayesian":
        model = bayesian(net)
        guide = mean_field_guide(model, init_scale=1e-7)  # draws = the means, to argmax
        expected = net(x).argmax(-1)
    else:
        model = batchensemble(net, 3)
        expected = predict(model, x, progress=False).probs.mean(0).argmax(-1)
    hits = (expected == y).float()
    assert 0.2 < hits.mean() < 0.8  # a number that tells the ways of counting apart
    # batches of 50, 50, 10: the count of correct examples over the epoch, not a mean of
    # per-batch accuracies
    result = fit(model, guide, ListLoader(x, y, 50), epochs=2, optim=_frozen, progress=False)
    for record in result.history:
        assert record.train_acc == pytest.approx(hits.mean().item())
    assert hits.mean().item() != pytest.approx(
        (hits[:50].mean() + hits[50:100].mean() + hits[100:].mean()).item() / 3
    )


def test_memory_reuse_on_cpu_changes_no_result(monkeypatch):
    from pyrouq import batchensemble, predict
    from pyrouq.models import ResidualCNN

    x, y = torch.randn(16, 1, 12, 12), torch.randint(0, 10, (16,))
    runs = []
    for setting in ("1", "0"):
        monkeypatch.setenv("PYROUQ_REUSE_MEMORY", setting)
        torch.manual_seed(0)
        model = batchensemble(ResidualCNN(width=4), 2)
        fit(model, None, [(x[:8], y[:8]), (x[8:], y[8:])], epochs=2, num_data=16,
            progress=False, seed=0)  # fmt: skip
        runs.append(predict(model, x).probs)
    torch.testing.assert_close(runs[0], runs[1], rtol=0, atol=0)


@pytest.mark.parametrize("autoguide", ["AutoNormal", "AutoDiagonalNormal"])
def test_kl_weight_1_is_pyros_elbo_for_autoguides_and_fits_their_scales(autoguide):
    """An autoguide draws auxiliary sites ("*_unconstrained", "_AutoDiagonalNormal_latent")
    and makes the model's sites Delta transforms of them: their log-density is part of
    log q(w), or the loss misses the guide's entropy (which rewards wide scales) and fit() shrinks
    the scales toward 0."""
    from pyro.infer import Trace_ELBO
    from pyro.infer import autoguide as autoguides
    from torch import nn

    torch.manual_seed(0)
    x = torch.randn(30, 3)
    y = x @ torch.tensor([[1.0, -1.0], [0.5, 0.0], [0.0, 2.0]]) + 0.5 * torch.randn(30, 2)
    pyro.clear_param_store()
    model = bayesian(nn.Linear(3, 2), likelihood=Gaussian(0.5), num_data=30)
    guide = getattr(autoguides, autoguide)(model)
    guide(x, y)
    many = {"num_particles": 5000, "vectorize_particles": True, "max_plate_nesting": 1}
    with torch.no_grad():
        pyro.set_rng_seed(0)
        ours = KLWeightedELBO(**many).loss(model, guide, x, y)
        pyro.set_rng_seed(0)
        pyros = Trace_ELBO(**many).loss(model, guide, x, y)
    assert ours == pytest.approx(pyros, abs=0.3)
    # fit() then finds the mean-field optimum: each weight's sd is 1 / sqrt of the diagonal
    # of the posterior precision, sum_n x_nj^2 / sigma^2 + 1 under the prior Normal(0, 1)
    fit(model, guide, ListLoader(x, y, 30), epochs=600, lr=0.05, progress=False, seed=0)
    optimum = (x.square().sum(0) / 0.5**2 + 1.0).rsqrt()
    with torch.no_grad():
        draws = torch.stack([guide(x, y)["weight"] for _ in range(1000)])
    torch.testing.assert_close(draws.std(0), optimum.expand(2, 3), rtol=0.2, atol=0)


def test_fit_warns_when_a_users_pyro_model_does_not_scale_its_likelihood():
    from pyro.infer.autoguide import AutoNormal
    from pyro.nn import PyroModule

    class Logistic(PyroModule):
        def __init__(self, scaled):
            super().__init__()
            self.scaled, self.num_data = scaled, None

        def forward(self, x, y=None):
            w = pyro.sample("w", dist.Normal(torch.zeros(3, 2), 1.0).to_event(2))
            logits = x @ w
            if self.scaled:  # the batch stands for the num_data points: scale N/B
                plate = pyro.plate("data", self.num_data, subsample_size=len(x))
            else:
                plate = pyro.plate("data", len(x))
            with plate:
                pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
            return logits

    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    loader = ListLoader(x, y, 10)
    pyro.clear_param_store()
    expected = (
        r"fit\(\): Logistic observes its targets without the factor N/B: on 10 of N = 40 "
        r"examples the likelihood's scale is 1"
    )
    with pytest.warns(UserWarning, match=expected):
        model = Logistic(False)
        fit(model, AutoNormal(model), loader, epochs=1, progress=False)
    pyro.clear_param_store()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = Logistic(True)
        fit(model, AutoNormal(model), loader, epochs=1, progress=False)


class _NoisyData(torch.utils.data.Dataset):
    """Examples with noise drawn from numpy's and Python's global generators, as augmentations
    written with numpy or ``random`` draw it (in the main process: num_workers=0)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        import random

        import numpy as np

        noise = float(np.random.randn()) + random.gauss(0.0, 1.0)  # noqa: NPY002
        return self.x[i] + 0.1 * noise, self.y[i]


def test_resume_is_exact_for_a_loader_drawing_from_numpy_and_python(tmp_path):
    # the checkpoint keeps numpy's and Python's global states as well as torch's: a resumed
    # run's augmentations draw what the uninterrupted run's drew in the same epochs
    from _toy import StopAfter

    from pyrouq.infer import TrainingInterrupted

    x, y = toy_data(40)

    def run(**kw):
        torch.manual_seed(0)
        model = tiny_mlp()
        guide = mean_field_guide(model)
        loader = torch.utils.data.DataLoader(_NoisyData(x, y), batch_size=20, shuffle=True)
        result = fit(model, guide, loader, epochs=3, progress=False, seed=0, **kw)
        return [record.loss for record in result.history], guide.site_loc("fc1.weight").detach()

    straight, weights = run()
    path = tmp_path / "run.pt"
    with pytest.raises(TrainingInterrupted):
        run(checkpoint=path, callbacks=[StopAfter(1)])
    resumed, resumed_weights = run(resume_from=path)
    assert resumed == straight
    assert torch.equal(resumed_weights, weights)
