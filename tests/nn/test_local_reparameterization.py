"""Local reparameterisation: the output distribution, the training path and the flag."""

from __future__ import annotations

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from _toy import ListLoader, tiny_mlp, toy_data
from pyro import poutine
from pyro.infer.autoguide import AutoNormal

from pyrouq.infer import KLWeightedELBO, fit, mean_field_guide
from pyrouq.models import BayesianLeNet, BayesianMLP
from pyrouq.nn import BayesianConv2d, BayesianLinear

DRAWS = 40_000
"""Draws per moment check: the relative standard error of a variance is sqrt(2 / S) = 0.7 %."""

VAR_TOL = 0.05
"""Largest relative error allowed on any output's variance (7 standard errors)."""

MEAN_TOL = 5.0
"""Largest error allowed on any output's mean, in standard errors sqrt(var / S)."""


def normal_params(weight_shape, bias_shape):
    """Locations and scales with scales in [0.2, 0.6] (so sigma and sigma^2 differ by 1.7-5x)
    and bias scales large enough that dropping the bias variance shows."""
    g = torch.Generator().manual_seed(1)
    w_loc = torch.randn(weight_shape, generator=g)
    w_scale = 0.2 + 0.4 * torch.rand(weight_shape, generator=g)
    b_loc = torch.randn(bias_shape, generator=g)
    b_scale = 0.8 + 0.2 * torch.rand(bias_shape, generator=g)
    return w_loc, w_scale, b_loc, b_scale


def moment_errors(samples, mean, var):
    """Worst error of the empirical means (in standard errors) and variances (relative) of
    ``samples`` ``(S, ...)`` against ``mean`` and ``var``."""
    n = samples.shape[0]
    mean_err = ((samples.mean(0) - mean).abs() / (var / n).sqrt()).max().item()
    var_err = (samples.var(0) / var - 1).abs().max().item()
    return mean_err, var_err


def check_against_weight_sampling(layer, x, apply, bias_shape):
    """Both samplers match the analytic moments; deliberately wrong variances do not."""
    w_loc, w_scale, b_loc, b_scale = normal_params(layer.weight_shape, bias_shape)
    mean, var = layer.moments_with(x, w_loc, w_scale, b_loc, b_scale)

    # reference: whole weights drawn from Normal(loc, scale) and applied to x, independently of
    # the layer's code
    weights = w_loc + w_scale * torch.randn(DRAWS, *w_loc.shape)
    biases = b_loc + b_scale * torch.randn(DRAWS, *b_loc.shape)
    reference = apply(weights, biases)
    mean_err, var_err = moment_errors(reference, mean, var)
    assert mean_err < MEAN_TOL and var_err < VAR_TOL

    # local reparameterisation: pre-activations drawn directly
    assert layer.local_reparameterization
    local = layer.sample_with(x, w_loc, w_scale, b_loc, b_scale, num_draws=DRAWS)
    assert local.shape == (DRAWS, *mean.shape)
    mean_err, var_err = moment_errors(local, mean, var)
    assert mean_err < MEAN_TOL and var_err < VAR_TOL
    # the two samplers agree with each other (two-sample check of the variances)
    assert (local.var(0) / reference.var(0) - 1).abs().max() < 2 * VAR_TOL

    # the tolerance is tight enough to catch a wrong variance: scale instead of scale^2, or a
    # missing bias variance, are far outside it for the weight-sampling reference
    wrong_scale = layer.forward_with(x.square(), w_scale, b_scale)
    wrong_no_bias = layer.forward_with(x.square(), w_scale.square(), torch.zeros_like(b_scale))
    for wrong in (wrong_scale, wrong_no_bias):
        assert moment_errors(reference, mean, wrong)[1] > 4 * VAR_TOL


def test_linear_output_distribution_matches_weight_sampling():
    layer = BayesianLinear(5, 4, local_reparameterization=True)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))

    def apply(w, b):  # (S, out, in), (S, out) -> (S, B, out)
        return torch.einsum("bi,soi->sbo", x, w) + b.unsqueeze(1)

    check_against_weight_sampling(layer, x, apply, (4,))


def test_conv_output_distribution_matches_weight_sampling():
    layer = BayesianConv2d(2, 3, kernel_size=3, padding=1, local_reparameterization=True)
    x = torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(2))
    patches = F.unfold(x, kernel_size=3, padding=1)  # (B, C*k*k, H*W)

    def apply(w, b):  # (S, out, C, k, k), (S, out) -> (S, B, out, H, W)
        out = torch.einsum("bcl,soc->sbol", patches, w.flatten(2)) + b[:, None, :, None]
        return out.unflatten(-1, (5, 5))

    check_against_weight_sampling(layer, x, apply, (3,))


def test_stacked_input_gives_one_draw_per_slice():
    layer = BayesianConv2d(2, 3, kernel_size=3, local_reparameterization=True)
    params = normal_params(layer.weight_shape, (3,))
    x = torch.randn(4, 5, 2, 7, 7)
    assert layer.sample_with(x, *params, num_draws=9).shape == (4, 5, 3, 5, 5)
    layer.local_reparameterization = False
    assert layer.sample_with(x, *params).shape == (4, 5, 3, 5, 5)
    assert layer.sample_with(x[0], *params, num_draws=6).shape == (6, 5, 3, 5, 5)


def test_local_elbo_same_kl_and_unbiased_nll_with_lower_variance():
    model = tiny_mlp(num_data=40)
    guide = mean_field_guide(model, init_scale=0.3)
    x, y = toy_data(40)
    elbo = KLWeightedELBO()
    weight_terms = elbo.terms(model, guide, x, y)
    model.local_reparameterization = True
    local_terms = elbo.terms(model, guide, x, y)
    torch.testing.assert_close(local_terms.kl, weight_terms.kl)  # analytic both ways

    # per-draw NLL of the two estimators, S draws each (one ELBO evaluation each)
    n = 2000

    def per_draw_nll():
        with torch.no_grad():
            return torch.stack([elbo.terms(model, guide, x, y).nll for _ in range(n)])

    local = per_draw_nll()
    model.local_reparameterization = False
    weights = per_draw_nll()
    # the Pyro path (guide draws replayed at the weight sites), n vectorised particles
    pyro_path = KLWeightedELBO(num_particles=n, vectorize_particles=True).terms(model, guide, x, y)
    se = math.sqrt((local.var() + weights.var()).item() / n)
    assert abs(local.mean().item() - pyro_path.nll.item()) < 4 * se
    assert abs(weights.mean().item() - pyro_path.nll.item()) < 4 * se
    assert local.std() < 0.5 * weights.std()  # independent noise per example averages out


def test_gradients_reach_loc_and_rho():
    model = BayesianLeNet(num_data=100, local_reparameterization=True)
    guide = mean_field_guide(model, init_scale=0.05)
    x, y = torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    loss = KLWeightedELBO(num_particles=2, vectorize_particles=True).differentiable_loss(
        model, guide, x, y
    )
    loss.backward()
    for params in (guide.loc, guide.rho):
        for name, p in params.items():
            assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("vectorize", [False, True])
def test_fit_with_the_flag_trains(vectorize):
    x, y = toy_data(200)
    model = tiny_mlp(local_reparameterization=True)
    guide = mean_field_guide(model, init_scale=0.01)
    result = fit(
        model,
        guide,
        ListLoader(x, y, 50),
        epochs=8,
        lr=0.05,
        num_particles=2,
        vectorize_particles=vectorize,
        progress=False,
        seed=0,
    )
    first, last = result.history[0], result.history[-1]
    assert last.loss < 0.7 * first.loss
    assert last.loss == pytest.approx(last.nll + result.kl_weight * last.kl, rel=1e-6)
    assert last.train_acc > 0.85


def test_plain_pyro_svi_uses_the_local_path_and_updates_the_guide():
    x, y = toy_data(40)
    model = tiny_mlp(num_data=40, local_reparameterization=True)
    guide = mean_field_guide(model, init_scale=1e-3)
    before = {s: v.clone() for s, v in guide.means().items()}
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), loss=KLWeightedELBO(1e-3))
    losses = [svi.step(x, y) for _ in range(30)]
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])
    assert all(not torch.equal(before[s], guide.site_loc(s)) for s in guide.sites)


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_flag_round_trips_through_config(cls):
    model = cls(local_reparameterization=True)
    assert model.config["local_reparameterization"] is True
    rebuilt = cls(**model.config)
    assert rebuilt.local_reparameterization
    layers = {site.rpartition(".")[0] for site in rebuilt.latent_sites()}
    assert set(rebuilt.local_layers()) == layers  # every layer draws its pre-activations
    assert not cls().local_reparameterization
    assert cls().config["local_reparameterization"] is False
    rebuilt.local_reparameterization = False  # the setter updates the layers and config
    assert not rebuilt.local_reparameterization
    assert cls(**rebuilt.config).config == cls().config


@pytest.mark.parametrize("cls", [BayesianMLP, BayesianLeNet])
def test_flag_leaves_the_pyro_model_unchanged(cls):
    x = torch.randn(3, 1, 28, 28)
    traces = []
    for flag in (False, True):
        pyro.set_rng_seed(5)
        traces.append(poutine.trace(cls(local_reparameterization=flag)).get_trace(x))
    plain, local = traces
    assert list(plain.nodes) == list(local.nodes)  # the same PyroSample sites
    for name in plain.nodes:
        if plain.nodes[name]["type"] == "sample":
            torch.testing.assert_close(plain.nodes[name]["value"], local.nodes[name]["value"])
    model = cls(local_reparameterization=True)
    guide = mean_field_guide(model)
    samples = pyro.infer.Predictive(model, guide=guide, num_samples=3, parallel=True)(x)
    assert samples["logits"].shape == (3, 3, 10)


def test_other_guides_warn_and_sample_weights():
    x, y = toy_data(10)
    model = tiny_mlp(num_data=10, local_reparameterization=True)
    guide = AutoNormal(model)
    with pytest.warns(UserWarning, match="with a MeanFieldGuide only.*with AutoNormal"):
        terms = KLWeightedELBO().terms(model, guide, x, y)
    assert torch.isfinite(terms.loss)


def test_a_local_layer_inside_a_users_model_warns_that_it_is_sampled():
    """BayesianLinear(local_reparameterization=True) in a PyroModule of the user's own: the
    ELBO cannot draw its pre-activations (no MeanFieldGuide of a pyrouq model), and says so."""
    from pyro.nn import PyroModule

    class Net(PyroModule):
        def __init__(self):
            super().__init__()
            self.fc = BayesianLinear(4, 3, local_reparameterization=True)

        def forward(self, x, y=None):
            logits = self.fc(x)
            with pyro.plate("data", len(x)):
                pyro.sample("obs", pyro.distributions.Categorical(logits=logits), obs=y)
            return logits

    model = Net()
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    guide = AutoNormal(model)
    expected = (
        r"Net's layer 'fc' \(BayesianLinear\) has local_reparameterization=True, .* weights "
        r"are sampled instead"
    )
    with pytest.warns(UserWarning, match=expected) as record:
        KLWeightedELBO().terms(model, guide, x, y)
        KLWeightedELBO().loss(model, guide, x, y)
        fit(model, guide, ListLoader(x, y, 5), epochs=1, progress=False)
    # at the caller's lines: loss() and fit() named pyrouq's elbo.py (stacklevel=3 fell short)
    assert {w.filename for w in record if "sampled instead" in str(w.message)} == {__file__}


def test_bad_flag_and_mismatched_guide():
    with pytest.raises(TypeError, match="Expected local_reparameterization to be True or False"):
        BayesianMLP(local_reparameterization="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Expected local_reparameterization to be True or False"):
        BayesianLinear(2, 3, local_reparameterization=1)  # type: ignore[arg-type]
    model = tiny_mlp(num_data=10, local_reparameterization=True)
    other = mean_field_guide(
        BayesianMLP(in_features=3, hidden_features=20, out_features=2, num_hidden=2)
    )
    x, y = toy_data(10)
    with pytest.raises(ValueError, match="differ from the model's latent sites"):
        KLWeightedELBO().terms(model, other, x, y)


def test_layers_whose_weights_attention_reads_are_drawn_whole():
    """nn.MultiheadAttention reads out_proj's weight as a tensor, never calling the layer:
    local reparameterisation cannot draw its pre-activations, so its sites are drawn whole
    (they once kept the network's initial weights in training, ignoring the guide)."""
    from torch import nn

    from pyrouq import bayesian

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Linear(4, 8)
            self.att = nn.MultiheadAttention(8, 2, batch_first=True)
            self.head = nn.Linear(8, 3)

        def forward(self, x):
            h = self.emb(x)
            h, _ = self.att(h, h, h)
            return self.head(h.mean(1))

    torch.manual_seed(0)
    x, y = torch.randn(6, 5, 4), torch.randint(0, 3, (6,))
    local = bayesian(Net(), local_reparameterization=True, num_data=6)
    assert set(local.local_layers()) == {"emb", "head"}
    whole = bayesian(local.plain_network(), num_data=6)
    losses = []
    for model in (local, whole):
        guide = mean_field_guide(model, init_scale=1e-8)
        with torch.no_grad():
            guide.site_loc("att.out_proj.weight").mul_(3.0)  # away from the initial weights
        losses.append(KLWeightedELBO(kl_weight=0.0).terms(model, guide, x, y).nll)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=0)


def test_layers_a_forward_shows_it_cannot_draw_by_pre_activations_are_drawn_whole():
    """A layer called twice (one weight, not two independent noises), a Linear on (B, T, F)
    inputs (not one noise per token) and a layer whose weight the forward reads as a tensor
    (not the network's initial weight) train as if drawn whole: the same expected NLL."""
    from torch import nn

    from pyrouq import bayesian

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = nn.Linear(2, 2, bias=False), nn.Linear(2, 2)

        def forward(self, x):
            return self.out(self.fc(self.fc(x)))

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x).mean(1)

    class ReadsWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return F.linear(x, self.fc.weight, self.fc.bias)

    torch.manual_seed(0)
    cases = [(Twice(), torch.randn(8, 2)), (Tokens(), torch.randn(8, 16, 3)),
             (ReadsWeight(), torch.randn(8, 3))]  # fmt: skip
    y = torch.randint(0, 2, (8,))
    elbo, n, gaps = KLWeightedELBO(kl_weight=0.0), 1000, []
    for net, x in cases:
        means = []
        for local in (True, False):
            model = bayesian(net, local_reparameterization=local, num_data=8)
            guide = mean_field_guide(model, init_scale=1.0)
            with torch.no_grad():
                for site in model.latent_sites():
                    guide.site_loc(site).add_(0.5)  # away from the network's own weights
                if isinstance(net, Twice):  # E[W W] = I + 2 I, against I with two noises
                    guide.site_loc("fc.weight").copy_(torch.eye(2))
                    guide.site_loc("out.weight").copy_(torch.diag(torch.tensor([3.0, -3.0])))
            with torch.no_grad():  # each draw's NLL and logits
                terms = [elbo.terms(model, guide, x, y) for _ in range(n)]
                draws = torch.stack(
                    [torch.cat([t.nll.view(1), t.outputs.flatten()]) for t in terms]
                )
            means.append((draws.mean(0), draws.var(0)))
        (a, va), (b, vb) = means
        z = ((a - b).abs() / ((va + vb) / n).sqrt()).max().item()  # the largest of 17 or more
        gaps.append((type(net).__name__, round(z, 1)))
    assert all(z < 4.5 for _, z in gaps), gaps


def test_the_forward_run_again_finds_the_running_statistics_as_they_were():
    from torch import nn

    from pyrouq import bayesian

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = nn.Linear(3, 3), nn.BatchNorm1d(3)

        def forward(self, x):
            return self.norm(self.fc(self.fc(x)))

    torch.manual_seed(0)
    model = bayesian(Twice(), local_reparameterization=True, num_data=8)
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 3), torch.randint(0, 3, (8,))
    model.train()
    KLWeightedELBO().terms(model, guide, x, y)  # the first forward finds fc called twice
    assert int(model.net.norm.num_batches_tracked) == 1  # moved once, by the forward kept


def test_the_forward_run_again_finds_the_networks_own_buffers_as_they_were():
    """A buffer the network's own forward changes (a counter, a moving average) was moved by
    the first forward and again by the run that replaced it: twice for one step."""
    from torch import nn

    from pyrouq import bayesian

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.register_buffer("calls", torch.zeros(()))
            self.register_buffer("mean", torch.zeros(3))

        def forward(self, x):
            self.calls += 1
            with torch.no_grad():
                self.mean.mul_(0.5).add_(0.5 * x.mean(0))
            return self.fc(self.fc(x))

    torch.manual_seed(0)
    model = bayesian(Counting(), local_reparameterization=True, num_data=8)
    guide = mean_field_guide(model)
    x, y = torch.randn(8, 3), torch.randint(0, 3, (8,))
    KLWeightedELBO().terms(model, guide, x, y)  # the first forward finds fc called twice
    assert float(model.net.calls) == 1.0
    torch.testing.assert_close(model.net.mean, 0.5 * x.mean(0))


def test_finding_layers_to_draw_whole_costs_no_random_numbers_nor_input(tmp_path):
    """A resumed run finds its layers again with a fresh network: it must draw as the run that
    found them before (the same history), and every particle sees the input as it came."""
    from torch import nn

    from pyrouq import bayesian

    class Tokens(nn.Module):  # a Linear on (B, T, F) inputs, drawn whole, found by a forward
        def __init__(self, in_place=False):
            super().__init__()
            self.fc, self.out = nn.Linear(3, 4), nn.Linear(4, 2)
            self.in_place = in_place

        def forward(self, x):
            x = x.mul_(2.0) if self.in_place else x * 2.0  # changes its input, or not
            return self.out(torch.tanh(self.fc(x)).mean(1))

    def fresh(in_place=False):
        torch.manual_seed(0)
        model = bayesian(Tokens(in_place), local_reparameterization=True, num_data=16)
        return model, mean_field_guide(model)

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 5, 3, generator=g), torch.randint(0, 2, (8,), generator=g))
            for _ in range(2)]  # fmt: skip
    same = {"progress": False, "seed": 0, "lr_schedule": "constant"}
    model, guide = fresh()
    whole = fit(model, guide, data, epochs=2, **same)
    first, _ = fresh()
    path = tmp_path / "run.pt"
    fit(first, mean_field_guide(first), data, epochs=1, checkpoint=path, **same)
    again, resumed_guide = fresh()  # a new process builds the model afresh
    resumed = fit(again, resumed_guide, data, epochs=2, resume_from=path, **same)
    assert [r.loss for r in resumed.history] == [r.loss for r in whole.history]
    for site in model.latent_sites():
        assert torch.equal(resumed_guide.site_loc(site), guide.site_loc(site))
    # particles, vectorized or not, each see x as it came (near-point guide: all alike)
    model, _ = fresh(in_place=True)
    point = mean_field_guide(model, init_scale=1e-12)
    x, y = data[0]
    nlls = [
        KLWeightedELBO(num_particles=n, vectorize_particles=v).terms(model, point, x.clone(), y).nll
        for n, v in ((1, False), (4, False), (4, True))
    ]
    torch.testing.assert_close(nlls[1], nlls[0])
    torch.testing.assert_close(nlls[2], nlls[0])
