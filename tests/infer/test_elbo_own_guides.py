"""Audit of training a Pyro user's own models and guides (fourth round): the KL-weighted ELBO of
hand-written guides (their own pyro.factor, sites drawn in another order than the model's)
against Pyro's Trace_ELBO on the same draws, and fit()'s and the ELBO's messages for a model
run without its labels or on batches of a plate of all N points."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import EnumeratedMixture
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO, config_enumerate
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule
from torch.distributions import constraints

import pyrouq


class Softmax(PyroModule):
    """Softmax regression, its likelihood ``lab`` (not "obs") in a plate of N = 40 points."""

    def __init__(self, subsample=True):
        super().__init__()
        self.num_data, self.subsample = 40, subsample

    def forward(self, x, y=None):
        w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
        logits = x @ w
        size = x.shape[0] if self.subsample else None
        with pyro.plate("data", self.num_data, subsample_size=size):
            pyro.sample("lab", dist.Categorical(logits=logits), obs=y)
        return logits


def _data(n=40):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def _guide(factor=None):
    """A mean-field guide of ``w`` with pyro.param constraints, with a ``pyro.factor`` of
    ``0.7 sum w^2`` (``has_rsample=factor``) when ``factor`` is not None."""

    def guide(x, y=None):
        loc = pyro.param("loc", torch.zeros(4, 3))
        scale = pyro.param("scale", torch.full((4, 3), 0.5), constraint=constraints.positive)
        w = pyro.sample("w", dist.Normal(loc, scale).to_event(2))
        if factor is not None:
            pyro.factor("tilt", 0.7 * w.square().sum(), has_rsample=factor)

    return guide


def _loss_and_grads(elbo, model, guide, x, y, seed=3):
    pyro.set_rng_seed(seed)
    with poutine.trace(param_only=True) as params:
        loss = elbo.loss_and_grads(model, guide, x, y)
    tensors = {name: site["value"].unconstrained() for name, site in params.trace.nodes.items()}
    grads = {name: t.grad.clone() for name, t in tensors.items()}
    for t in tensors.values():
        t.grad = None
    return loss, grads


# -- the guide's own pyro.factor is part of log q ------------------------------------------------


@pytest.mark.parametrize("kl_weight", [1.0, 0.3])
def test_a_guides_own_pyro_factor_is_part_of_log_q_as_in_trace_elbo(kl_weight):
    """Trace_ELBO subtracts a guide's pyro.factor as part of log q; it was left out (a loss
    1.556 nats low on this draw, the factor's gradient missing)."""
    x, y = _data(8)
    model = Softmax()
    plain, tilted = _guide(), _guide(factor=True)
    plain(x, y)
    elbo = pyrouq.KLWeightedELBO(kl_weight)
    theirs = [_loss_and_grads(Trace_ELBO(), model, g, x, y) for g in (plain, tilted)]
    ours = [_loss_and_grads(elbo, model, g, x, y) for g in (plain, tilted)]
    pyro.set_rng_seed(3)
    w = poutine.trace(plain).get_trace(x, y).nodes["w"]["value"]
    factor = float(0.7 * w.detach().square().sum())
    assert theirs[1][0] - theirs[0][0] == pytest.approx(factor, rel=1e-5)
    assert ours[1][0] - ours[0][0] == pytest.approx(kl_weight * factor, rel=1e-5)
    terms = []
    for g in (plain, tilted):
        pyro.set_rng_seed(3)
        terms.append(elbo.terms(model, g, x, y))
    assert float(terms[1].kl - terms[0].kl) == pytest.approx(factor, rel=1e-5)
    assert float(terms[1].nll) == pytest.approx(float(terms[0].nll), rel=1e-6)
    for name in ("loc", "scale"):  # the factor's gradient: d(0.7 sum w^2), weighted
        extra = ours[1][1][name] - ours[0][1][name]
        torch.testing.assert_close(extra, kl_weight * (theirs[1][1][name] - theirs[0][1][name]))
        assert extra.abs().max() > 0.1


def test_a_guides_pyro_factor_without_rsample_is_refused_naming_has_rsample():
    x, y = _data(8)
    guide = _guide(factor=False)
    with pytest.raises(ValueError, match=r"pyro.factor\('tilt'.*has_rsample=True"):
        pyrouq.KLWeightedELBO().loss(Softmax(), guide, x, y)


def test_a_guides_observed_discrete_site_is_part_of_log_q_without_a_sampler():
    """An observed site of the guide (not a factor) needs no reparameterised sampler: its
    value is given. It is part of log q, as in Trace_ELBO."""
    x, y = _data(8)
    model = Softmax()

    def guide(x, y=None):
        _guide()(x, y)
        pyro.sample("seen", dist.Bernoulli(0.3), obs=torch.tensor(1.0))

    plain = _guide()
    for elbo in (pyrouq.KLWeightedELBO(1.0), Trace_ELBO()):  # (ours: w's KL in closed form)
        added = _loss_and_grads(elbo, model, guide, x, y)[0]
        assert added - _loss_and_grads(elbo, model, plain, x, y)[0] == pytest.approx(
            math.log(0.3), rel=1e-5
        )


# -- an analytic KL only where the guide draws the site after the model's earlier ones ------------


class Hierarchy(PyroModule):
    """``s ~ Gamma(2, 2)``, ``w ~ Normal(0, s)`` (its prior hangs on ``s``), ``lab`` ~ w x."""

    def __init__(self):
        super().__init__()
        self.num_data = 40

    def forward(self, x, y=None):
        s = pyro.sample("s", dist.Gamma(2.0, 2.0))
        w = pyro.sample("w", dist.Normal(0.0, s).expand([4, 3]).to_event(2))
        with pyro.plate("data", self.num_data, subsample_size=x.shape[0]):
            pyro.sample("lab", dist.Categorical(logits=x @ w), obs=y)


def _reversed_guide(x, y=None):
    """Draws ``w`` first, then ``s`` given ``w``: the model's order reversed."""
    loc = pyro.param("w_loc", torch.zeros(4, 3))
    scale = pyro.param("w_scale", torch.full((4, 3), 0.5), constraint=constraints.positive)
    w = pyro.sample("w", dist.Normal(loc, scale).to_event(2))
    shift = pyro.param("s_shift", torch.tensor(-0.3))
    pyro.sample("s", dist.LogNormal(shift + 0.8 * w.abs().mean().log(), 0.2))


def test_a_site_the_guide_draws_before_its_priors_parents_is_not_integrated_out_alone():
    """w's prior hangs on s, which the guide draws after w, from q(s | w): KL(q(w) || p(w | s))
    at the drawn s is a biased estimate (on a toy of this form, 1.531 nats where Trace_ELBO's
    expectation is 1.267). Then the site's term is log q(w) - log p(w | s), as in Trace_ELBO:
    the loss and gradients are Trace_ELBO's on the same draw (s has no analytic pair)."""
    x, y = _data(8)
    model = Hierarchy()
    _reversed_guide(x, y)
    theirs = _loss_and_grads(Trace_ELBO(), model, _reversed_guide, x, y)
    ours = _loss_and_grads(pyrouq.KLWeightedELBO(1.0), model, _reversed_guide, x, y)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-6)
    for name in theirs[1]:
        torch.testing.assert_close(ours[1][name], theirs[1][name], rtol=1e-5, atol=1e-6)


class _Shifted(pyrouq.BayesianMLP):
    """A BayesianMLP whose subclass adds sites of its own: ``s ~ Gamma(2, 2)`` and a shift of
    the inputs ``~ Normal(0, s)``, its prior hanging on ``s``."""

    def forward(self, x, y=None):
        s = pyro.sample("s", dist.Gamma(2.0, 2.0))
        shift = pyro.sample("shift", dist.Normal(0.0, s).expand([3]).to_event(1))
        return super().forward(x + shift, y)


def test_a_pyrouq_subclass_own_sites_keep_the_order_rule():
    """A pyrouq network's own priors are fixed (analytic in any order), but not the sites a
    subclass adds: ``shift`` drawn before ``s`` took the closed form at the drawn s, 2.96 nats
    above Trace_ELBO's expectation over 400 draws (260.675 against 257.719); 0.62 now, within
    two of Trace_ELBO's standard errors (0.29)."""
    torch.manual_seed(0)
    model = _Shifted(in_features=3, hidden_features=8, out_features=3, num_data=10)
    network = pyrouq.mean_field_guide(model)

    def guide(x, y=None):
        loc = pyro.param("sh_loc", torch.zeros(3))
        scale = pyro.param("sh_scale", torch.full((3,), 0.5), constraint=constraints.positive)
        shift = pyro.sample("shift", dist.Normal(loc, scale).to_event(1))
        pyro.sample("s", dist.LogNormal(-0.3 + 0.8 * shift.abs().mean().log(), 0.2))
        network(x, y)

    x, y = torch.randn(10, 3), torch.randint(0, 3, (10,))
    guide(x, y)
    means = []
    for elbo in (pyrouq.KLWeightedELBO(), Trace_ELBO()):
        pyro.set_rng_seed(0)
        means.append(sum(float(elbo.loss(model, guide, x, y)) for _ in range(400)) / 400)
    assert abs(means[0] - means[1]) < 1.5, means


def test_a_guide_in_the_models_order_keeps_the_analytic_kl_of_trace_mean_field_elbo():
    def guide(x, y=None):
        s = pyro.sample("s", dist.Gamma(pyro.param("a", torch.tensor(3.0)), 3.0))
        loc = pyro.param("w_loc", torch.zeros(4, 3))
        pyro.sample("w", dist.Normal(loc, 0.4 * s).to_event(2))

    x, y = _data(8)
    model = Hierarchy()
    guide(x, y)
    theirs = _loss_and_grads(TraceMeanField_ELBO(), model, guide, x, y)
    ours = _loss_and_grads(pyrouq.KLWeightedELBO(1.0), model, guide, x, y)
    assert ours[0] == pytest.approx(theirs[0], rel=1e-6)
    for name in theirs[1]:
        torch.testing.assert_close(ours[1][name], theirs[1][name], rtol=1e-5, atol=1e-6)


# -- messages ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Found vars in model but not guide")  # Pyro's own check
def test_a_likelihood_not_named_obs_run_without_labels_is_told_to_pass_them():
    """It was called a latent site missing from the guide, to be fixed with
    mean_field_guide(model), which refuses a Pyro model of one's own."""
    x, _ = _data(8)
    with pytest.raises(ValueError, match=r"needs the labels.*'lab'.*y=None.*loss\(model, guide, x"):
        pyrouq.KLWeightedELBO().loss(Softmax(), _guide(), x)


@pytest.mark.filterwarnings("ignore:Found vars in model but not guide")  # Pyro's own check
def test_a_latent_site_missing_from_the_guide_of_ones_own_model_names_autonormal():
    x, y = _data(8)
    with pytest.raises(ValueError) as caught:
        pyrouq.KLWeightedELBO().loss(Hierarchy(), poutine.block(_reversed_guide, hide=["s"]), x, y)
    assert "latent site 's' is missing from the guide" in str(caught.value)
    assert "pyro.infer.autoguide.AutoNormal(model)" in str(caught.value)
    assert "mean_field_guide" not in str(caught.value)


@pytest.mark.parametrize("guide", ["autonormal", "function"])
def test_a_plate_of_all_n_points_over_a_minibatch_is_told_to_subsample(guide):
    """Pyro's own "Shape mismatch inside plate('data') at site lab dim -1, 40 vs 20" came
    alone, without the way out."""
    x, y = _data()
    model = Softmax(subsample=False)
    made = AutoNormal(model) if guide == "autonormal" else _guide()
    with pytest.raises(ValueError) as caught:
        pyrouq.fit(
            model, made, [(x[:20], y[:20]), (x[20:], y[20:])], epochs=1, num_data=40, progress=False
        )
    message = str(caught.value)
    assert "Shape mismatch inside plate('data')" in message
    assert "pyro.plate('data', self.num_data, subsample_size=len(x))" in message
    assert "N = 40" in message and "batch of 20" in message


class _FeaturesBug(Softmax):
    """Its data plate subsampled, but a plate of 4 features holding a draw of 3."""

    def forward(self, x, y=None):
        with pyro.plate("features", 4):
            pyro.sample("b", dist.Normal(0.0, 1.0).expand([3]))
        return super().forward(x, y)


def test_another_plates_mismatch_gets_no_subsampling_hint():
    """The hint fired on any plate's shape mismatch while N != B (here plate('features'),
    4 vs 3): the wrong way out."""
    x, y = _data()
    model = _FeaturesBug()
    with pytest.raises(ValueError, match=r"plate\('features'\) at site b dim -1, 4 vs 3") as caught:
        pyrouq.fit(model, AutoNormal(model), [(x[:20], y[:20]), (x[20:], y[20:])], epochs=1,
                   num_data=40, progress=False)  # fmt: skip
    assert "subsample_size" not in str(caught.value)


@pytest.mark.filterwarnings("ignore:Found vars in model but not guide")  # Pyro's own check
def test_a_one_argument_models_enumerated_site_is_not_told_it_lacks_labels():
    """Pyro's usual ``model(data)`` has no label slot: its enumerated site missing from the
    guide was blamed on labels not passed (and an AutoNormal, which refuses discrete sites)."""

    @config_enumerate
    def model(data):
        weights = pyro.sample("weights", dist.Dirichlet(torch.ones(2)))
        with pyro.plate("data", len(data)):
            assignment = pyro.sample("assignment", dist.Categorical(weights))
            pyro.sample("obs", dist.Normal(assignment.float(), 1.0), obs=data)

    data = torch.randn(6)
    guide = AutoNormal(poutine.block(model, hide=["assignment"]))
    with pytest.raises(ValueError, match="'assignment' is missing from the guide, left out for"):
        pyrouq.KLWeightedELBO().loss(model, guide, data)


@pytest.mark.filterwarnings("ignore:Found vars in model but not guide")  # Pyro's own check
def test_an_enumerated_site_left_out_of_the_guide_is_told_to_use_trace_enum_under_svi():
    """Through SVI (not fit()), it was told to build AutoNormal(model), which refuses it."""
    model = EnumeratedMixture()
    guide = AutoNormal(poutine.block(model, hide=["z"]))  # Pyro's recipe for enumeration
    x, y = torch.zeros(20, 1), torch.randn(20)
    svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), pyrouq.KLWeightedELBO())
    with pytest.raises(ValueError, match=r"discrete latent site 'z'.*TraceEnum_ELBO"):
        svi.step(x, y)


def test_ones_own_model_with_latent_sites_and_no_guide_is_told_to_pass_one():
    """It was told "Nothing to train: Softmax and the guide have no parameters"."""
    x, y = _data()
    with pytest.raises(ValueError, match=r"samples the latent site\(s\) \['w'\] but guide is None"):
        pyrouq.fit(Softmax(), None, [(x[:20], y[:20])], epochs=1, num_data=40, progress=False)
