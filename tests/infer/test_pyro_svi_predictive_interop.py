"""Audit 13: pyrouq's models, guides and ELBO used with Pyro's own tools (SVI, Predictive,
poutine, autoguides, the param store, set_rng_seed), and `pyrouq fit` with a factory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoDelta, AutoDiagonalNormal, AutoNormal

import pyrouq
from pyrouq.cli import main


@pytest.fixture(autouse=True)
def _validation_on():
    pyro.clear_param_store()
    with pyro.validation_enabled(True):
        yield
    pyro.clear_param_store()


def _fitted(make_guide=pyrouq.mean_field_guide):
    x, y = toy_data(40)
    pyro.set_rng_seed(0)
    model = tiny_mlp(num_data=40)
    guide = make_guide(model)
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=2, progress=False, seed=0)
    return model, guide, x, y


# poutine.mask around a whole model: refused as Trace_ELBO refuses it ----------------------


@pytest.mark.parametrize("make_guide", [pyrouq.mean_field_guide, AutoNormal])
def test_a_data_mask_around_the_whole_model_is_refused_as_pyros_elbos_refuse_it(make_guide):
    """A mask of one entry per data point around the whole model masks the weight sites too;
    Pyro's ELBOs refuse the site's log-density shape under validation. KLWeightedELBO used to
    count each weight's log p once per kept point (a loss 6x too large), silently."""
    model, guide, x, y = _fitted(make_guide)
    masked = poutine.mask(model, mask=torch.arange(40) < 25)
    expected = r'at site "fc1\.weight", invalid log_prob shape\s+Expected \[\], actual \[40\]'
    for elbo in (Trace_ELBO(), TraceMeanField_ELBO(), pyrouq.KLWeightedELBO(kl_weight=1.0)):
        with pytest.raises(ValueError, match=expected):
            elbo.loss(masked, guide, x, y)


def test_a_mask_on_the_observations_only_is_taken_as_pyros_trace_mean_field_elbo_takes_it():
    """The right way to mask points of a pyrouq model: a handler that masks the "obs" site
    only. The loss is TraceMeanField_ELBO's (analytic KL for the Normal sites), and the
    likelihood of the masked points is left out (checked against a by-hand sum)."""
    model, guide, x, y = _fitted()
    keep = torch.arange(40) < 25

    class MaskObs(pyro.poutine.messenger.Messenger):
        def _process_message(self, msg):
            if msg["name"] == "obs":
                msg["mask"] = keep

    pyro.set_rng_seed(2)
    ours = pyrouq.KLWeightedELBO(kl_weight=1.0).loss(MaskObs()(model), guide, x, y)
    pyro.set_rng_seed(2)
    pyros = TraceMeanField_ELBO().loss(MaskObs()(model), guide, x, y)
    assert ours == pytest.approx(pyros, rel=1e-5)
    # by hand: the same draw, -(N/B) sum_kept log p(y | w) + sum_site KL(q || p)
    pyro.set_rng_seed(2)
    guide_trace = poutine.trace(guide).get_trace(x, y)
    model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    logits = model_trace.nodes["logits"]["value"]
    log_p = torch.log_softmax(logits, -1).gather(1, y[:, None]).squeeze(1)
    kl = sum(
        torch.distributions.kl_divergence(
            guide_trace.nodes[s]["fn"], model_trace.nodes[s]["fn"]
        ).sum()
        for s in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    )
    assert ours == pytest.approx(float((-log_p[keep].sum() + kl).detach()), rel=1e-5)


# KLWeightedELBO with a plain Pyro model -----------------------------------------------------


def _regression(x, y=None):
    w = pyro.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    s = pyro.sample("s", dist.HalfNormal(1.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("obs", dist.Normal(x @ w, s), obs=y)


def _regression_guide(x, y=None):
    loc = pyro.param("loc", torch.tensor([0.5, -1.0]))
    scale = pyro.param("sc", torch.tensor([0.3, 0.2]), constraint=dist.constraints.positive)
    pyro.sample("w", dist.Normal(loc, scale).to_event(1))
    pyro.sample("s", dist.LogNormal(pyro.param("a", torch.tensor(-0.5)), 0.2))


@pytest.mark.parametrize("kl_weight", [1.0, 0.3, 0.0])
def test_kl_weighted_elbo_of_a_plain_pyro_model_is_the_hand_weighted_elbo(kl_weight):
    """-log p(y | w) + k * (KL_w analytic + log q(s) - log p(s)) at the same draw; with k = 1
    it is TraceMeanField_ELBO."""
    torch.manual_seed(0)
    x = torch.randn(30, 2)
    y = x @ torch.tensor([1.0, -2.0]) + 0.3 * torch.randn(30)
    pyro.set_rng_seed(1)
    ours = pyrouq.KLWeightedELBO(kl_weight=kl_weight).loss(_regression, _regression_guide, x, y)
    pyro.set_rng_seed(1)
    g = poutine.trace(_regression_guide).get_trace(x, y)
    m = poutine.trace(poutine.replay(_regression, trace=g)).get_trace(x, y)
    w, s = g.nodes["w"]["value"], g.nodes["s"]["value"]
    nll = -dist.Normal(x @ w, s).log_prob(y).sum()
    kl_w = torch.distributions.kl_divergence(g.nodes["w"]["fn"], m.nodes["w"]["fn"]).sum()
    mc_s = g.nodes["s"]["fn"].log_prob(s) - dist.HalfNormal(1.0).log_prob(s)
    assert ours == pytest.approx(float(nll + kl_weight * (kl_w + mc_s)), rel=1e-5)
    if kl_weight == 1.0:
        pyro.set_rng_seed(1)
        assert ours == pytest.approx(
            TraceMeanField_ELBO().loss(_regression, _regression_guide, x, y), rel=1e-5
        )


# Predictive, autoguides, the param store, set_rng_seed ---------------------------------------


def test_pyros_predictive_and_predict_agree_at_the_same_guide():
    model, guide, x, _ = _fitted()
    pyro.set_rng_seed(0)
    samples = Predictive(model, guide=guide, num_samples=2000, return_sites=["logits"])(x)
    preds = pyrouq.predict(model, x, guide=guide, num_samples=2000, progress=False, seed=0)
    assert preds.probs.shape == (2000, 40, 2)
    assert torch.allclose(torch.softmax(samples["logits"], -1).mean(0), preds.mean_probs, atol=0.01)
    names = set(Predictive(model, guide=guide, num_samples=2)(x))
    assert names == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "logits", "obs"}


@pytest.mark.parametrize("make_guide", [AutoDiagonalNormal, AutoDelta])
def test_other_autoguides_trained_by_svi_predict_as_predictive_does(make_guide):
    x, y = toy_data(40)
    pyro.set_rng_seed(0)
    model = tiny_mlp(num_data=40)
    guide = make_guide(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    for _ in range(20):
        svi.step(x, y)
    preds = pyrouq.predict(model, x, guide=guide, num_samples=2000, progress=False, seed=1)
    run = Predictive(model, guide=guide, num_samples=2000, return_sites=["logits"], parallel=True)
    reference = torch.softmax(run(x)["logits"], -1)
    assert torch.allclose(preds.mean_probs, reference.mean(0), atol=0.02)
    if make_guide is AutoDelta:  # a point estimate: every draw the network at the median
        median = guide.median(x, y)
        logits = poutine.condition(model, data=median)(x)
        assert torch.allclose(preds.probs, torch.softmax(logits, -1).expand(2000, -1, -1))
        assert float(preds.uncertainty().epistemic.abs().max()) < 1e-6


def test_a_saved_param_store_gives_a_new_autonormal_the_same_predictions(tmp_path):
    model, guide, x, y = _fitted(AutoNormal)
    before = pyrouq.predict(model, x, guide=guide, num_samples=8, progress=False, seed=3).probs
    pyro.get_param_store().save(tmp_path / "store.pt")
    pyro.clear_param_store()
    new_model = tiny_mlp(num_data=40)
    new_guide = AutoNormal(new_model)
    pyro.get_param_store().load(tmp_path / "store.pt")
    new_guide(x[:2], y[:2])  # (an autoguide builds itself on its first run)
    after = pyrouq.predict(new_model, x, guide=new_guide, num_samples=8, progress=False, seed=3)
    assert torch.equal(after.probs, before)
    pyro.set_rng_seed(7)
    a = pyrouq.predict(new_model, x, guide=new_guide, num_samples=5, progress=False).probs
    pyro.set_rng_seed(7)
    b = pyrouq.predict(new_model, x, guide=new_guide, num_samples=5, progress=False).probs
    assert torch.equal(a, b) and not torch.equal(a[0], a[1])


# pyrouq fit with a factory: the same seed, the same run ------------------------------------


def test_a_factory_run_repeats_under_its_seed_and_records_the_factory(tmp_path, monkeypatch):
    (tmp_path / "audit13_nets.py").write_text(
        "import torch.nn as nn\n"
        "def make():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.ReLU(), nn.Linear(8, 10))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["fit", "audit13_nets:make", "--method", "last-layer", "--epochs", "1",
            "--train-size", "64", "--batch-size", "32", "--num-samples", "2", "--seed", "4",
            "--device", "cpu", "--no-progress"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    sys.modules.pop("audit13_nets", None)

    def metrics(run: str) -> dict:
        found = json.loads(Path(tmp_path, run, "metrics.json").read_text())
        return {k: v for k, v in found.items() if not k.endswith("_seconds")}

    assert metrics("a") == metrics("b")
    assert metrics("a")["num_samples"] == 2 and metrics("a")["seed"] == 4
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["factory"], config["method"], config["train_size"]) == (
        "audit13_nets:make",
        "last-layer",
        64,
    )
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--epochs", "0", "--out", str(tmp_path / "c")])
    assert refused.value.code == 2 and not (tmp_path / "c").exists()


# poutine.condition on "obs": the same model as model(x, y) --------------------------------


@pytest.mark.parametrize("kind", ["categorical", "ensemble"])
def test_targets_given_by_condition_are_scaled_by_n_over_b_as_targets_passed_in(kind):
    """poutine.condition(model, data={"obs": y})(x) is model(x, y) to a Pyro user, as it is
    for a model with pyro.plate("data", N, subsample_size=B). The likelihood of the minibatch
    of 10 of 40 points was scaled by 1 there, not 4 (Trace_ELBO 217.18 against 238.54,
    KLWeightedELBO alike), silently."""
    x, y = toy_data(40)
    if kind == "ensemble":
        model = pyrouq.batchensemble(torch.nn.Linear(3, 2), 2)
        model.num_data = 40
    else:
        model = tiny_mlp(num_data=40)
    conditioned = poutine.condition(model, data={"obs": y[:10]})
    given = poutine.trace(model).get_trace(x[:10], y[:10]).nodes["obs"]
    trace = poutine.trace(conditioned).get_trace(x[:10])
    assert trace.nodes["obs"]["is_observed"] and trace.nodes["obs"]["scale"] == 4.0
    assert given["scale"] == 4.0
    if kind == "ensemble":
        return

    def empty_guide(x, y=None):
        pass

    guide = pyrouq.mean_field_guide(model)
    for elbo in (Trace_ELBO(), pyrouq.KLWeightedELBO(kl_weight=1.0)):
        pyro.set_rng_seed(0)
        passed = elbo.loss(model, guide, x[:10], y[:10])
        pyro.set_rng_seed(0)
        assert elbo.loss(conditioned, guide, x[:10]) == pytest.approx(passed, rel=1e-6)


def test_regression_targets_conditioned_in_another_shape_than_the_site_holds_are_refused():
    """A Gaussian's "obs" holds (B, 1) targets for one output; condition() giving (B,) ones
    was scored broadcast against the (B, 1) means (Trace_ELBO 712.1 against 367.1 for the
    targets passed in), silently. (B, 1) ones give the loss of the targets passed in."""
    x, _ = toy_data(40)
    y = 2 * x[:, 0]
    torch.manual_seed(0)
    model = pyrouq.bayesian(torch.nn.Linear(3, 1), likelihood="gaussian", num_data=40)
    guide = pyrouq.mean_field_guide(model)
    flat = poutine.condition(model, data={"obs": y[:10]})
    with pytest.raises(ValueError, match=r"gives its 'obs' site targets of shape \(10,\), "):
        Trace_ELBO().loss(flat, guide, x[:10])
    with pytest.raises(ValueError, match=r"Condition on y.reshape\(10, 1\), or pass the targ"):
        pyrouq.KLWeightedELBO(1.0).loss(flat, guide, x[:10])
    column = poutine.condition(model, data={"obs": y[:10, None]})
    pyro.set_rng_seed(0)
    passed = Trace_ELBO().loss(model, guide, x[:10], y[:10])
    pyro.set_rng_seed(0)
    assert Trace_ELBO().loss(column, guide, x[:10]) == pytest.approx(passed, rel=1e-6)


def test_a_predictive_given_draws_holding_obs_still_runs_on_a_model_without_n():
    """Pyro's Predictive conditions on every site of its posterior_samples, "obs" included
    (another Predictive's output): on a model built without num_data it ran and still runs
    (the scale is 1 there, as before), in both of Predictive's modes."""
    x, _ = toy_data(40)
    torch.manual_seed(0)
    model = pyrouq.bayesian(torch.nn.Linear(3, 2))
    guide = pyrouq.mean_field_guide(model)
    for parallel in (False, True):
        draws = Predictive(model, guide=guide, num_samples=3, parallel=parallel)(x[:5])
        given = {k: v for k, v in draws.items() if k != "logits"}  # (weights and "obs")
        again = Predictive(model, given, parallel=parallel, return_sites=["logits"])(x[:5])
        torch.testing.assert_close(again["logits"], draws["logits"])


def test_targets_conditioned_against_a_gaussian_of_two_outputs_are_refused_as_the_site_holds():
    """The shape check read the site's shape off a (B,) -> (B, 1) reshape alone: for a
    Gaussian of 2 outputs, (B,) targets were told 'Condition on y.reshape(10, 1)', which then
    ran, each target scored against both means, silently; (B, 1) labels of a classifier met
    Pyro's own words. Both now name the site's shape, and targets of that shape give the loss
    of the targets passed in."""
    x, _ = toy_data(40)
    torch.manual_seed(0)
    y = torch.randn(10, 2)
    model = pyrouq.bayesian(torch.nn.Linear(3, 2), likelihood="gaussian", num_data=40)
    guide = pyrouq.mean_field_guide(model)
    for given in (y[:, 0], y[:, :1]):
        with pytest.raises(ValueError, match=r"expected \(10, 2\) as the site holds them: Pyro"):
            Trace_ELBO().loss(poutine.condition(model, data={"obs": given}), guide, x[:10])
    with pytest.raises(ValueError, match=r"Condition on targets of shape \(10, 2\), one per "):
        Trace_ELBO().loss(poutine.condition(model, data={"obs": y[:, 0]}), guide, x[:10])
    pyro.set_rng_seed(0)
    passed = Trace_ELBO().loss(model, guide, x[:10], y)
    pyro.set_rng_seed(0)
    conditioned = poutine.condition(model, data={"obs": y})
    assert Trace_ELBO().loss(conditioned, guide, x[:10]) == pytest.approx(passed, rel=1e-6)
    labels = toy_data(40)[1][:10, None]
    column = poutine.condition(tiny_mlp(num_data=40), data={"obs": labels})
    with pytest.raises(ValueError, match=r"expected \(10,\) as the site .*y.reshape\(10,\), or"):
        poutine.trace(column).get_trace(x[:10])


def test_conditioned_targets_are_told_a_reshape_only_where_it_keeps_them_with_their_inputs():
    """(D, B) targets of a Gaussian of D = 2 outputs were told 'Condition on y.reshape(10, 2)',
    which runs and pairs them with the wrong inputs, silently; a classifier's labels of
    another count were told 'one per output of each input'. The transpose is told y.T, and
    followed gives the loss of the targets passed in; a classifier is told one label per
    input."""
    x, _ = toy_data(40)
    torch.manual_seed(0)
    y = torch.randn(10, 2)
    model = pyrouq.bayesian(torch.nn.Linear(3, 2), likelihood="gaussian", num_data=40)
    guide = pyrouq.mean_field_guide(model)
    flipped = y.T.contiguous()
    with pytest.raises(ValueError, match=r"of shape \(2, 10\), expected .* Condition on y\.T, or"):
        Trace_ELBO().loss(poutine.condition(model, data={"obs": flipped}), guide, x[:10])
    pyro.set_rng_seed(0)
    passed = Trace_ELBO().loss(model, guide, x[:10], y)
    pyro.set_rng_seed(0)
    followed = Trace_ELBO().loss(poutine.condition(model, data={"obs": flipped.T}), guide, x[:10])
    assert followed == pytest.approx(passed, rel=1e-6)
    labels = toy_data(40)[1][:5]
    fewer = poutine.condition(tiny_mlp(num_data=40), data={"obs": labels})
    with pytest.raises(ValueError, match=r"Condition on targets of shape \(10,\), one label per "):
        poutine.trace(fewer).get_trace(x[:10])


def test_the_conditioned_value_is_the_one_pyro_gives_the_site():
    """The value checked and scaled is the one Pyro gives "obs": of nested condition()s the
    outermost's (applied last), none where a block() hides the site from the handler (Pyro
    leaves it unobserved there: nothing to check); (S, D, B) targets are told y.mT."""
    x, _ = toy_data(40)
    torch.manual_seed(0)
    y = torch.randn(10, 2)
    model = pyrouq.bayesian(torch.nn.Linear(3, 2), likelihood="gaussian", num_data=40)
    guide = pyrouq.mean_field_guide(model)
    pyro.set_rng_seed(0)
    passed = Trace_ELBO().loss(model, guide, x[:10], y)
    nested = poutine.condition(poutine.condition(model, data={"obs": y[:, 0]}), data={"obs": y})
    pyro.set_rng_seed(0)
    assert Trace_ELBO().loss(nested, guide, x[:10]) == pytest.approx(passed, rel=1e-6)
    hidden = poutine.condition(poutine.block(model, hide=["obs"]), data={"obs": y[:, 0]})
    trace = poutine.trace(hidden).get_trace(x[:10])
    assert "obs" not in trace.nodes  # (hidden from the trace too: drawn, not observed)
    stacked = poutine.condition(model, data={"obs": y.T[None]})
    with pytest.raises(ValueError, match=r"of shape \(1, 2, 10\), .* Condition on y\.mT, or"):
        Trace_ELBO().loss(stacked, guide, x[:10])
