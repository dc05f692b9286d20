"""Eighth audit: pyrouq's models and guides driven by Pyro's own machinery, as a Pyro user
writes it (SVI with Pyro's ELBOs, autoguides, Predictive, poutine, NUTS, the param store,
validation on and off), against pyrouq's own routes and hand-computed values."""

from __future__ import annotations

import math
import warnings

import pyro
import pytest
import torch
from _toy import ListLoader, loaded_copy, toy_data
from pyro import poutine
from pyro.infer import MCMC, NUTS, SVI, Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from pyro.infer.util import is_validation_enabled
from pyro.poutine.util import site_is_subsample
from torch import nn

import pyrouq

N = 40


def _net(out=2):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, out))


def _family(kind):
    """A pyrouq model of each family (N = 40 set) and its targets for ``toy_data``."""
    x, y = toy_data(N)
    if kind == "bayesian":
        return pyrouq.bayesian(_net(), num_data=N), y
    if kind == "last_layer":
        return pyrouq.bayesian(_net(), select="last_layer", num_data=N), y
    if kind == "BayesianMLP":
        torch.manual_seed(0)
        return pyrouq.BayesianMLP(in_features=3, hidden_features=8, out_features=2, num_data=N), y
    if kind == "rank1":
        return pyrouq.rank1(_net(), 2, num_data=N), y
    if kind == "gaussian":
        return pyrouq.bayesian(_net(1), likelihood="gaussian", num_data=N), x[:, 0]
    assert kind == "learned"
    return pyrouq.bayesian(_net(1), likelihood=pyrouq.Gaussian("learned"), num_data=N), x[:, 0]


FAMILIES = ["bayesian", "last_layer", "BayesianMLP", "rank1", "gaussian", "learned"]


def _state(*modules):
    return {
        f"{i}.{k}": v.detach().clone()
        for i, m in enumerate(modules)
        for k, v in m.state_dict().items()
    }


# --------------------------------------------------------------------------------------------
# SVI with Pyro's ELBOs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FAMILIES)
def test_svi_with_trace_mean_field_elbo_is_kl_weighted_elbo_step_for_step(kind):
    """Pyro's TraceMeanField_ELBO (analytic KL) and KLWeightedELBO(kl_weight=1) give the same
    loss on one seed, and SVI with either trains the same parameters step for step: the
    guide, the point estimates and a learned noise scale (which SVI with KLWeightedELBO
    used to leave at its initial value)."""
    x, _ = toy_data(N)
    runs = []
    for loss in (TraceMeanField_ELBO(), pyrouq.KLWeightedELBO(kl_weight=1.0)):
        model, y = _family(kind)
        # (no scale at a prior's: a dead unit's gradient there is 0, or 1e-8 by rounding,
        # and Adam's first step is lr * sign(g) for either)
        guide = pyrouq.mean_field_guide(model, init_scale=0.05)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), loss)
        pyro.set_rng_seed(1)
        losses = [svi.step(x[:16], y[:16]) for _ in range(3)]
        runs.append((losses, _state(model, guide)))
    (theirs, their_state), (ours, our_state) = runs
    assert ours == pytest.approx(theirs, rel=1e-5)
    assert their_state.keys() == our_state.keys()
    for key in their_state:
        torch.testing.assert_close(our_state[key], their_state[key], atol=1e-5, rtol=1e-5)
    if kind == "learned":  # trained, by both: softplus(raw) is 1 at the start
        raw = our_state["0.likelihood.raw_scale"]
        assert not torch.allclose(raw, torch.tensor([math.log(math.expm1(1.0))]))


def test_trace_elbo_agrees_with_the_analytic_kl_in_expectation():
    """Trace_ELBO estimates the KL by Monte Carlo: over 4000 vectorised particles of one seed
    its loss is the analytic one (TraceMeanField_ELBO's and KLWeightedELBO's, equal to each
    other to float rounding) up to that estimate's error, about 0.08 here."""
    x, y = toy_data(N)
    model = pyrouq.BayesianMLP(in_features=3, hidden_features=8, out_features=2, num_data=N)
    guide = pyrouq.mean_field_guide(model, init_scale=0.1)
    losses = []
    for cls in (Trace_ELBO, TraceMeanField_ELBO, pyrouq.KLWeightedELBO):
        kw = {} if cls is pyrouq.KLWeightedELBO else {"max_plate_nesting": 1}
        elbo = cls(num_particles=4000, vectorize_particles=True, **kw)
        pyro.set_rng_seed(0)
        losses.append(elbo.loss(model, guide, x[:16], y[:16]))
    mc, analytic, ours = losses
    assert ours == pytest.approx(analytic, rel=1e-6)
    assert abs(mc - analytic) < 0.4


# --------------------------------------------------------------------------------------------
# Pyro's autoguides through fit, predict and to_inference_data
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "auto", [AutoNormal, AutoDiagonalNormal, AutoLowRankMultivariateNormal, AutoDelta]
)
@pytest.mark.parametrize("kind", ["last_layer", "rank1", "gaussian"])
def test_autoguides_fit_predict_and_export_what_pyros_condition_computes(kind, auto):
    """fit() with an autoguide minimises Trace_ELBO (the same loss on one seed); the exported
    draws, run through the model by poutine.condition, give the exported log-likelihood:
    Pyro's log-probability of "obs" (rank-1: of the draw's member mixture), and predict() of
    those draws is the softmax of the conditioned model's logits."""
    pytest.importorskip("arviz")
    x, _ = toy_data(N)
    model, y = _family(kind)
    guide = auto(model)
    result = pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=2, kl_weight=1.0, progress=False)
    assert len(result.losses) == 2 and all(math.isfinite(v) for v in result.losses)
    pyro.set_rng_seed(3)
    theirs = Trace_ELBO().loss(model, guide, x[:16], y[:16])
    pyro.set_rng_seed(3)
    assert pyrouq.KLWeightedELBO(1.0).loss(model, guide, x[:16], y[:16]) == pytest.approx(
        theirs, rel=1e-5
    )
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=3)
    draws = {k: torch.as_tensor(v.values[0]) for k, v in idata.posterior.items()}
    assert set(draws) == set(model.latent_sites())
    log_lik, logits = [], []
    model.eval()
    for s in range(3):
        cond = poutine.condition(model, data={k: v[s] for k, v in draws.items()})
        trace = poutine.trace(cond).get_trace(x, y)
        trace.compute_log_prob()
        if kind == "rank1":  # per member (M, N): their equal-weight mixture, by hand
            log_lik.append(trace.nodes["obs"]["log_prob"].logsumexp(0) - math.log(2))
            logits.append(trace.nodes["logits"]["value"].log_softmax(-1).exp().mean(0))
        else:  # Pyro's own, unscaled
            log_lik.append(trace.nodes["obs"]["log_prob"])
            if kind != "gaussian":
                logits.append(trace.nodes["logits"]["value"].softmax(-1))
    got = torch.as_tensor(idata.log_likelihood["obs"].values[0])
    torch.testing.assert_close(got, torch.stack(log_lik).double(), atol=1e-5, rtol=1e-5)
    preds = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    if kind == "last_layer":
        torch.testing.assert_close(preds.probs, torch.stack(logits), atol=1e-6, rtol=1e-5)
    elif kind == "rank1":  # S * M draws, draw-major: their mean over members is the mixture
        mixture = preds.probs.reshape(3, 2, N, 2).mean(1)
        torch.testing.assert_close(mixture, torch.stack(logits), atol=1e-6, rtol=1e-5)


def test_an_autoguide_is_not_saved_by_pyrouq_and_the_message_names_the_param_store():
    model, _ = _family("last_layer")
    guide = AutoNormal(model)
    with pytest.raises(pyrouq.CheckpointError, match=r"got AutoNormal.*pyro.get_param_store"):
        pyrouq.save("never-written.pt", model, guide)


# --------------------------------------------------------------------------------------------
# Predictive
# --------------------------------------------------------------------------------------------


def test_predictives_draws_start_later_in_the_stream_than_predicts_as_the_readme_says():
    """README: under one seed Predictive (parallel=False) first runs the guide to guess the
    plate nesting, so its draws are predict()'s, started later in the random stream; passed
    as posterior_samples they are predicted to the bit of Predictive's own logits."""
    x, _ = toy_data(N)
    model = pyrouq.bayesian(nn.Linear(3, 2), num_data=N)
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    pyro.set_rng_seed(0)
    out = Predictive(model, guide=guide, num_samples=5)(x)
    pyro.set_rng_seed(0)
    ours = pyrouq.predict(model, x, guide, num_samples=8, progress=False).probs
    theirs = out["logits"].softmax(-1)
    shifts = [k for k in range(1, 4) if torch.allclose(theirs, ours[k : k + 5], atol=1e-6)]
    assert shifts and not torch.allclose(theirs[0], ours[0], atol=1e-3)
    lat = {k: v for k, v in out.items() if k in model.latent_sites()}
    again = pyrouq.predict(model, x, posterior_samples=out, progress=False).probs  # obs, logits
    torch.testing.assert_close(again, theirs)  # of other runs are left out
    torch.testing.assert_close(
        pyrouq.predict(model, x, posterior_samples=lat, progress=False).probs, theirs
    )


@pytest.mark.parametrize("kind", ["bayesian", "rank1", "gaussian"])
def test_parallel_predictive_draws_are_predicted_as_predictive_computes_them(kind):
    x, _ = toy_data(N)
    model, _ = _family(kind)
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    out = Predictive(model, guide=guide, num_samples=6, parallel=True)(x)
    lat = {k: v for k, v in out.items() if k in model.latent_sites()}
    preds = pyrouq.predict(model, x, posterior_samples=lat, progress=False)
    if kind == "gaussian":
        torch.testing.assert_close(preds.loc, out["outputs"].reshape(preds.loc.shape))
    else:  # rank-1: (S, M, N, C) flattened draw-major into S * M draws
        logits = out["logits"].reshape(-1, N, 2)
        torch.testing.assert_close(preds.probs, logits.softmax(-1))


# --------------------------------------------------------------------------------------------
# poutine
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bayesian", "last_layer", "rank1", "gaussian"])
def test_trace_sites_are_named_and_shaped_as_documented(kind):
    """Latent sites by dotted path in the parameters' shapes (rank-1: the factors, (M, in)
    and (M, out)); the outputs recorded as a deterministic site; "obs" inside the "data" plate
    (and rank-1's "members") with scale N/B."""
    x, _ = toy_data(N)
    model, y = _family(kind)
    trace = poutine.trace(model).get_trace(x[:10], y[:10])
    latent = {
        n: tuple(s["value"].shape)
        for n, s in trace.nodes.items()
        if s["type"] == "sample" and not s["is_observed"] and not site_is_subsample(s)
    }
    expected = {
        "bayesian": {"0.weight": (8, 3), "0.bias": (8,), "2.weight": (2, 8), "2.bias": (2,)},
        "last_layer": {"2.weight": (2, 8), "2.bias": (2,)},
        "rank1": {"0.r": (2, 3), "0.s": (2, 8), "2.r": (2, 8), "2.s": (2, 2)},
        "gaussian": {"0.weight": (8, 3), "0.bias": (8,), "2.weight": (1, 8), "2.bias": (1,)},
    }[kind]
    assert latent == expected
    recorded = "outputs" if kind == "gaussian" else "logits"
    site = trace.nodes[recorded]
    assert site["infer"].get("_deterministic") and site["is_observed"]
    assert tuple(site["value"].shape) == (
        (2, 10, 2) if kind == "rank1" else (10, 1 if kind == "gaussian" else 2)
    )
    obs = trace.nodes["obs"]
    plates = [f.name for f in obs["cond_indep_stack"]]
    assert plates == (["data", "members"] if kind == "rank1" else ["data"])
    assert obs["scale"] == pytest.approx(N / 10)
    assert torch.equal(obs["value"].reshape(-1), y[:10])


def test_condition_fixes_weights_and_the_logits_are_the_plain_networks():
    x, y = toy_data(N)
    net = _net()
    model = pyrouq.bayesian(net, num_data=N)
    weights = {k: v.detach().clone() for k, v in net.state_dict().items()}
    trace = poutine.trace(poutine.condition(model, data=weights)).get_trace(x, y)
    torch.testing.assert_close(trace.nodes["logits"]["value"], net(x))
    assert all(trace.nodes[k]["is_observed"] for k in weights)
    w = torch.randn(2, 8)
    trace = poutine.trace(poutine.condition(model, data={"2.weight": w})).get_trace(x, y)
    drawn = {k: trace.nodes[k]["value"] for k in ("0.weight", "0.bias", "2.bias")}
    reference = loaded_copy(net, {**drawn, "2.weight": w})
    torch.testing.assert_close(trace.nodes["logits"]["value"], reference(x))
    torch.testing.assert_close(trace.nodes["_RETURN"]["value"], reference(x))


def test_block_replay_and_scale_act_on_a_pyrouq_model_as_on_any_pyro_model():
    x, y = toy_data(N)
    net = _net()
    model = pyrouq.bayesian(net, num_data=N)
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    hidden = poutine.trace(poutine.block(model, hide=["obs"])).get_trace(x, y)
    assert "obs" not in hidden.nodes and "logits" in hidden.nodes
    guide_trace = poutine.trace(guide).get_trace(x, y)
    replayed = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    drawn = {k: guide_trace.nodes[k]["value"] for k in model.latent_sites()}
    for k, v in drawn.items():
        assert torch.equal(replayed.nodes[k]["value"], v)
    torch.testing.assert_close(replayed.nodes["logits"]["value"], loaded_copy(net, drawn)(x))
    scaled = poutine.trace(poutine.scale(poutine.replay(model, trace=guide_trace), 0.5))
    halved = scaled.get_trace(x, y)
    replayed.compute_log_prob()
    halved.compute_log_prob()
    for k in ("0.weight", "obs"):
        assert float(halved.nodes[k]["log_prob_sum"].detach()) == pytest.approx(
            0.5 * float(replayed.nodes[k]["log_prob_sum"].detach()), rel=1e-6
        )
    pyro.set_rng_seed(0)
    theirs = TraceMeanField_ELBO().loss(poutine.scale(model, 0.5), poutine.scale(guide, 0.5), x, y)
    pyro.set_rng_seed(0)
    full = pyrouq.KLWeightedELBO(1.0).loss(model, guide, x, y)
    assert theirs == pytest.approx(0.5 * full, rel=1e-5)


def test_pyros_model_inspection_sees_the_plates_and_render_model_draws_them():
    from pyro.infer.inspect import get_model_relations

    x, _ = toy_data(N)
    model, y = _family("rank1")
    relations = get_model_relations(model, model_args=(x[:10], y[:10]))
    assert relations["plate_sample"] == {"data": ["logits", "obs"], "members": ["logits", "obs"]}
    assert relations["sample_dist"]["obs"] == "Categorical"
    assert relations["sample_sample"]["obs"] == ["0.r", "0.s", "2.r", "2.s"]
    pytest.importorskip("graphviz")
    graph = pyro.render_model(model, model_args=(x[:10], y[:10]))
    assert "members" in graph.source and "obs" in graph.source


# --------------------------------------------------------------------------------------------
# Pyro's NUTS run directly
# --------------------------------------------------------------------------------------------


def test_a_pyro_mcmc_run_is_predicted_and_its_export_advice_works():
    """NUTS on a pyrouq model: predict() of its draws (or the run) is the softmax of x W^T + b
    by hand; to_inference_data refuses the run and says how to export it with arviz, whose
    advice works on a model with point estimates (torch.no_grad(), var_name='obs')."""
    az = pytest.importorskip("arviz")
    x, y = toy_data(N)
    model = pyrouq.bayesian(nn.Linear(3, 2), num_data=N)
    pyro.set_rng_seed(0)
    run = MCMC(NUTS(model), num_samples=5, warmup_steps=5, disable_progbar=True)
    run.run(x, y)
    samples = run.get_samples()
    by_hand = (
        torch.einsum("ni,sci->snc", x, samples["weight"]) + samples["bias"][:, None]
    ).softmax(-1)
    for given in (samples, run):
        preds = pyrouq.predict(model, x, posterior_samples=given, progress=False)
        torch.testing.assert_close(preds.probs, by_hand)
    advice = r"arviz.from_pyro\(mcmc\) \(under torch.no_grad\(\).*var_name='obs'"
    with pytest.raises(TypeError, match=advice):
        pyrouq.to_inference_data(run, x=x, y=y)
    head, _ = _family("last_layer")
    pyro.set_rng_seed(0)
    run = MCMC(NUTS(head), num_samples=5, warmup_steps=5, disable_progbar=True)
    run.run(x, y)
    with pytest.raises(RuntimeError, match="requires grad"):  # arviz's own failure
        az.from_pyro(run)
    with torch.no_grad():
        idata = az.from_pyro(run)
    assert idata.log_likelihood["obs"].shape == (1, 5, N)
    with pytest.warns(UserWarning):  # (few draws: arviz's own warnings)
        assert math.isfinite(float(az.loo(idata, var_name="obs").elpd_loo))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # torch's, while Pyro traces
def test_pyros_jit_elbos_and_jit_nuts_are_refused_with_the_way_out():
    x, y = toy_data(N)
    model, _ = _family("bayesian")
    guide = pyrouq.mean_field_guide(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-2}), pyro.infer.JitTrace_ELBO())
    with pytest.raises(RuntimeError, match=r"torch.jit.trace refuses.*Use Trace_ELBO"):
        svi.step(x, y)
    run = MCMC(
        NUTS(
            pyrouq.bayesian(nn.Linear(3, 2), num_data=N), jit_compile=True, ignore_jit_warnings=True
        ),
        num_samples=2,
        warmup_steps=2,
        disable_progbar=True,
    )
    with pytest.raises(RuntimeError, match=r"BayesianNetwork runs its network with torch.func"):
        run.run(x, y)


def test_a_batchensemble_still_traces_under_pyros_jit_elbo():
    x, y = toy_data(N)
    ensemble = pyrouq.batchensemble(_net(), 2)
    ensemble.num_data = N

    def empty_guide(x, y=None):
        pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's TracerWarnings, FutureWarning
        jitted = pyro.infer.JitTrace_ELBO().loss(ensemble, empty_guide, x, y)
    assert jitted == pytest.approx(Trace_ELBO().loss(ensemble, empty_guide, x, y), rel=1e-5)


# --------------------------------------------------------------------------------------------
# The param store
# --------------------------------------------------------------------------------------------


def _point_estimate_key(model):
    keys = [k for k in pyro.get_param_store().keys() if k.endswith("net$$$0.weight")]
    assert len(keys) == 1, keys
    return keys[0]


@pytest.mark.parametrize("make_guide", [pyrouq.mean_field_guide, AutoNormal])
def test_the_param_store_holds_the_fit_and_survives_clearing(make_guide):
    x, _ = toy_data(N)
    model, y = _family("last_layer")
    guide = make_guide(model)
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=2, progress=False)
    store = pyro.get_param_store()
    names = set(store.keys())
    if make_guide is AutoNormal:
        guide_names = {
            f"AutoNormal.{p}.2.{w}" for p in ("locs", "scales") for w in ("weight", "bias")
        }
    else:
        guide_names = {
            f"{guide.name}$$${p}.2__{w}" for p in ("loc", "rho") for w in ("weight", "bias")
        }
    assert guide_names <= names and len(names - guide_names) == 2  # + the first layer's two
    assert store[_point_estimate_key(model)] is model.net[0].weight
    pyro.set_rng_seed(0)
    before = pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    assert torch.equal(pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs, before)
    result = pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, progress=False)
    assert math.isfinite(result.losses[0])


@pytest.mark.parametrize("make_guide", [pyrouq.mean_field_guide, AutoNormal])
def test_a_loaded_param_store_gives_the_model_and_guide_its_values(tmp_path, make_guide):
    """pyro.get_param_store().save / load, Pyro's way to keep a fit: what was saved is what
    predict() and SVI then use, the model's point estimates and a mean_field_guide's
    parameters included (they used to keep the values they held, the loaded ones ignored)."""
    x, _ = toy_data(N)
    model, y = _family("last_layer")
    guide = make_guide(model)
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=2, progress=False)
    path = str(tmp_path / "store.pt")
    pyro.get_param_store().save(path)
    pyro.set_rng_seed(0)
    saved = pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs
    pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=3, lr=0.1, progress=False)
    pyro.set_rng_seed(0)
    moved = pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs
    assert not torch.allclose(moved, saved, atol=1e-3)
    pyro.get_param_store().load(path)
    pyro.set_rng_seed(0)
    torch.testing.assert_close(
        pyrouq.predict(model, x, guide, num_samples=4, progress=False).probs, saved
    )
    pyro.get_param_store().load(path)  # then Pyro's SVI trains the module's own tensors
    first = model.net[0].weight.detach().clone()
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    for _ in range(2):
        svi.step(x, y)
    assert not torch.equal(model.net[0].weight, first)
    assert pyro.get_param_store()[_point_estimate_key(model)] is model.net[0].weight


def test_a_param_store_entry_of_another_shape_is_refused_naming_it():
    x, _ = toy_data(N)
    model, y = _family("last_layer")
    guide = pyrouq.mean_field_guide(model)
    model(x[:2], y[:2])
    key = _point_estimate_key(model)
    pyro.get_param_store().set_state({"params": {key: torch.zeros(5, 5)}, "constraints": {}})
    shapes = r"of shape \(5, 5\), but the parameter of that name has shape \(8, 3\)"
    with pytest.raises(ValueError, match=rf"holds '.*net\$\$\$0\.weight' {shapes}.*clear_param"):
        pyrouq.predict(model, x, guide, num_samples=2, progress=False)


def test_module_local_params_fit_predict_and_pyros_elbo_module_train_the_same_parameters():
    """README: under module_local_params fit() and predict() work, and Pyro's ELBO module
    with a torch optimizer trains the model's point estimates and the guide."""
    x, _ = toy_data(N)
    pyro.settings.set(module_local_params=True)
    try:
        model, y = _family("last_layer")
        guide = pyrouq.mean_field_guide(model)
        pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=1, progress=False)
        assert pyrouq.predict(model, x, guide, num_samples=2, progress=False).probs.shape == (
            2,
            N,
            2,
        )
        elbo = Trace_ELBO()(model, guide)
        before = _state(model, guide)
        optimizer = torch.optim.Adam(elbo.parameters(), lr=0.05)
        optimizer.zero_grad()
        elbo(x, y).backward()
        optimizer.step()
        after = _state(model, guide)
        moved = {k for k in before if not torch.equal(before[k], after[k])}
        assert {"0.net.0.weight", "0.net.0.bias", "1.loc.2__weight", "1.rho.2__bias"} <= moved
    finally:
        pyro.settings.set(module_local_params=False)


# --------------------------------------------------------------------------------------------
# Validation on and off
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("validate", [True, False])
def test_fit_and_predict_leave_pyros_validation_as_set_and_train_alike(validate):
    x, _ = toy_data(N)
    runs = []
    for flag in (validate, not validate):
        pyro.enable_validation(flag)
        pyro.clear_param_store()  # (a second AutoNormal would take the first one's)
        model, y = _family("last_layer")
        guide = AutoNormal(model)
        result = pyrouq.fit(model, guide, ListLoader(x, y, 20), epochs=2, seed=0, progress=False)
        assert is_validation_enabled() is flag
        assert torch.distributions.Distribution._validate_args is flag
        pyro.set_rng_seed(0)
        probs = pyrouq.predict(model, x, guide, num_samples=3, progress=False).probs
        assert is_validation_enabled() is flag
        runs.append((result.losses, probs))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-6)
    torch.testing.assert_close(runs[0][1], runs[1][1])
    pyro.enable_validation(validate)
    pyro.clear_param_store()
    model, _ = _family("last_layer")
    fives = ListLoader(x, torch.full((N,), 5), 20)
    with pytest.raises(ValueError, match=r"labels in \[5, 5\], expected class indices in \[0, 1\]"):
        pyrouq.fit(model, AutoNormal(model), fives, epochs=1, progress=False)
