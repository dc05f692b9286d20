"""Audit of the public contract: DESIGN.md's names, the model contract, the exact KL-weighted
ELBO (against a hand computation in float64), predict()'s types and decompositions (against
numpy), arviz groups, the API pages' coverage of ``pyrouq.__all__`` (their docstrings linking
no private name), and a side-effect free ``import pyrouq``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from torch import nn

import pyrouq

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# import pyrouq
# --------------------------------------------------------------------------------------------

_STATE = """
import json, sys, torch, pyro
import pyro.infer.util as iu, pyro.distributions.util as du, pyro.poutine.runtime as rt
def state():
    return dict(
        threads=torch.get_num_threads(), interop=torch.get_num_interop_threads(),
        dtype=str(torch.get_default_dtype()), grad=torch.is_grad_enabled(),
        deterministic=torch.are_deterministic_algorithms_enabled(),
        anomaly=torch.is_anomaly_enabled(), matmul=torch.get_float32_matmul_precision(),
        rng=torch.random.get_rng_state().tolist(), infer_validation=iu.is_validation_enabled(),
        dist_validation=du.is_validation_enabled(), params=list(pyro.get_param_store().keys()),
        stack=len(rt._PYRO_STACK), print_options=str(torch._tensor_str.PRINT_OPTS.__dict__),
    )
before = state()
import pyrouq
after = state()
heavy = ("arviz", "matplotlib", "torchvision", "scipy", "xarray")
heavy = sorted(m for m in heavy if m in sys.modules)
print(json.dumps(dict(changed=[k for k in before if before[k] != after[k]], heavy=heavy)))
"""


def test_import_pyrouq_changes_no_global_torch_or_pyro_state():
    out = subprocess.run(
        [sys.executable, "-c", _STATE], capture_output=True, text=True, check=True, timeout=120
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"changed": [], "heavy": []}


# --------------------------------------------------------------------------------------------
# The API pages document every top-level name
# --------------------------------------------------------------------------------------------


def _api_modules() -> list[str]:
    """``API_MODULES`` of docs/conf.py, read without running it (it writes the pages)."""
    tree = ast.parse((ROOT / "docs" / "conf.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "API_MODULES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError("docs/conf.py has no API_MODULES")


def test_every_top_level_name_is_documented_on_a_module_page():
    # conf.py's api/index.rst maps each name of pyrouq.__all__ to the first API page whose
    # module lists it in __all__ as the same object; a name found on no page has no entry
    modules = [importlib.import_module(f"pyrouq.{m}") for m in _api_modules()]
    missing = [
        name
        for name in pyrouq.__all__
        if not name.startswith("__")
        and not any(
            name in getattr(mod, "__all__", ())
            and getattr(mod, name, None) is getattr(pyrouq, name)
            for mod in modules
        )
    ]
    assert missing == []
    assert len(set(pyrouq.__all__)) == len(pyrouq.__all__)


def test_every_constant_and_type_alias_of_an_api_module_is_documented_on_its_page():
    # autodoc documents a module's data members only where their doc is in that module's own
    # source: 15 names of the API modules' __all__ that they import (DEFAULT_PRIOR_SCALE,
    # K_HAT_GOOD, PriorSpec, MAX_BARS, FORMAT_VERSION, ...) were on no page, and :data:
    # references to them led nowhere; docs/_data_members.py writes them there from the doc
    # where each is written, which LikelihoodName and FORMAT_VERSION lacked
    pytest.importorskip("sphinx.pycode")
    path = ROOT / "docs" / "_data_members.py"
    spec = importlib.util.spec_from_file_location("_docs_data_members", path)
    assert spec is not None and spec.loader is not None
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    found = {m: data.imported_data(m) for m in _api_modules()}
    assert {m: [n for n, doc in names.items() if doc is None] for m, names in found.items()} == {
        m: [] for m in found
    }
    shown = {(m, n) for m, names in found.items() for n in names}
    assert {("diagnostics", "K_HAT_GOOD"), ("convert", "PriorSpec")} <= shown
    assert ("likelihoods", "LikelihoodName") not in shown  # autodoc's: written in its module
    entries = data.entries("checkpoint")
    assert ".. py:data:: FORMAT_VERSION\n   :module: pyrouq.checkpoint\n   :value: 3\n" in entries
    assert data.shown_value(data.importlib.import_module("pyrouq.plotting").Component) == (
        "Literal['total', 'aleatoric', 'epistemic']"
    )


def test_the_api_pages_docstrings_link_no_private_name():
    # Likelihood.observe linked pyrouq.likelihoods._conditioned.conditioned_value, and
    # select_parameters pyrouq.convert._sites.latent_sites_of: a page's reader meets a name
    # with no page of its own; say it in words
    private = re.compile(r":(?:func|class|meth|attr|data|mod|obj):`~?[\w.]*\._\w[\w.]*`")
    found = []
    for module in (importlib.import_module(f"pyrouq.{m}") for m in _api_modules()):
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            members = [(name, obj)]
            if inspect.isclass(obj):
                members += [
                    (f"{name}.{k}", getattr(v, "fget", v))
                    for k, v in vars(obj).items()
                    if not k.startswith("_")
                ]
            for where, member in members:
                doc = member.__doc__ if callable(member) or inspect.ismodule(member) else None
                found += [(where, link) for link in private.findall(doc or "")]
    assert found == []


# --------------------------------------------------------------------------------------------
# DESIGN.md's names and arguments
# --------------------------------------------------------------------------------------------

_DESIGN_NAMES = (
    "bayesian batchensemble BayesianMLP BayesianLeNet MLP LeNet KLWeightedELBO fit "
    "mean_field_guide predict Predictions GaussianPredictions Decomposition decompose evaluate "
    "to_inference_data psis_diagnostic mcmc MCMCResult temperature_scale TemperatureScaler "
    "conformal Categorical Gaussian save load load_mnist load_fashion_mnist"
).split()


@pytest.mark.parametrize("name", _DESIGN_NAMES)
def test_design_names_are_top_level(name):
    assert name in pyrouq.__all__


def _defaults(func) -> dict:
    return {
        n: p.default
        for n, p in inspect.signature(func).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def test_design_arguments_and_defaults():
    assert (
        _defaults(pyrouq.bayesian).items()
        >= {
            "prior": 1.0,
            "select": None,
            "likelihood": "categorical",
        }.items()
    )
    assert (
        inspect.signature(pyrouq.bayesian).parameters["prior"].kind
        is inspect.Parameter.KEYWORD_ONLY
    )
    assert _defaults(pyrouq.batchensemble).items() >= {"use_base_weights": True}.items()
    assert {"r_mean", "r_std", "s_mean", "s_std"} <= set(_defaults(pyrouq.batchensemble))
    assert (
        _defaults(pyrouq.predict).items()
        >= {
            "guide": None,
            "num_samples": None,
            "posterior_samples": None,
        }.items()
    )
    assert "batch_size" in _defaults(pyrouq.predict)
    for func in (pyrouq.decompose, pyrouq.Predictions.uncertainty):
        assert _defaults(func) == {"measure": "entropy", "base": math.e}
    assert _defaults(pyrouq.evaluate)["ood"] is None
    assert _defaults(pyrouq.KLWeightedELBO)["kl_weight"] == 1.0
    assert list(inspect.signature(pyrouq.to_inference_data).parameters)[:5] == [
        "model",
        "guide",
        "x",
        "y",
        "num_samples",
    ]
    assert list(inspect.signature(pyrouq.psis_diagnostic).parameters)[:4] == [
        "model",
        "guide",
        "x",
        "y",
    ]
    params = inspect.signature(pyrouq.mcmc).parameters
    assert list(params)[:3] == ["model", "x", "y"]
    assert {"num_samples", "warmup_steps", "num_chains"} <= set(params)
    assert list(inspect.signature(pyrouq.temperature_scale).parameters)[:2] == [
        "val_preds",
        "val_targets",
    ]
    assert list(inspect.signature(pyrouq.conformal).parameters)[:4] == [
        "val_preds",
        "val_targets",
        "alpha",
        "score",
    ]
    assert [f for f in pyrouq.Decomposition.__dataclass_fields__] == [
        "total",
        "aleatoric",
        "epistemic",
    ]


# --------------------------------------------------------------------------------------------
# The model contract
# --------------------------------------------------------------------------------------------

N, B = 50, 6


def _sites(model, x, y):
    trace = poutine.trace(model).get_trace(x, y)
    return trace, {n: s for n, s in trace.nodes.items() if s["type"] == "sample"}


def _models():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    return {
        "BayesianMLP": pyrouq.BayesianMLP(3, 4, 2, num_data=N),
        "bayesian": pyrouq.bayesian(net, num_data=N),
        "BatchEnsembleMLP": pyrouq.BatchEnsembleMLP(3, 4, 2, num_members=3, num_data=N),
        "batchensemble": pyrouq.batchensemble(net, 3),
    }


@pytest.mark.parametrize("kind", ["BayesianMLP", "bayesian", "BatchEnsembleMLP", "batchensemble"])
def test_model_contract_logits_obs_plate_and_scale(kind):
    model = _models()[kind]
    model.num_data = N
    x, y = torch.randn(B, 3), torch.randint(0, 2, (B,))
    assert list(inspect.signature(model.forward).parameters) == ["x", "y"]
    assert inspect.signature(model.forward).parameters["y"].default is None
    trace, sites = _sites(model, x, y)
    members = 3 if kind.lower().startswith("batch") else None
    shape = (B, 2) if members is None else (members, B, 2)
    out = trace.nodes["_RETURN"]["value"]
    assert tuple(out.shape) == shape
    assert sites["logits"]["infer"].get("_deterministic") is True
    assert torch.equal(sites["logits"]["value"], out)
    obs = sites["obs"]
    assert obs["is_observed"] and torch.equal(obs["value"], y)
    assert "data" in [f.name for f in obs["cond_indep_stack"]]
    assert obs["scale"] == pytest.approx(N / B, rel=1e-15)
    latent = [n for n, s in sites.items() if not s["is_observed"] and n not in ("data", "members")]
    if members is None:  # a prior on every weight and bias, Normal(0, 1) by default
        names = {"BayesianMLP": ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]}
        expected = names.get(kind, ["0.weight", "0.bias", "2.weight", "2.bias"])
        assert sorted(latent) == sorted(expected)
        assert {n: tuple(sites[n]["value"].shape) for n in latent} == {
            n: tuple(shape) for n, shape in model.latent_sites().items()
        }
        for name in latent:
            base = sites[name]["fn"].base_dist
            assert torch.all(base.loc == 0) and torch.all(base.scale == 1)
    else:  # BatchEnsemble: no latent sites
        assert latent == []
    # y=None: outputs, obs not observed, and no num_data needed
    model.num_data = None
    assert tuple(model(x).shape) == shape
    with pytest.raises(ValueError, match=r"num_data is not set.*Pass num_data=N"):
        poutine.trace(model).get_trace(x, y)


def test_gaussian_model_records_outputs_and_observes_obs():
    model = pyrouq.bayesian(nn.Linear(3, 1), likelihood=pyrouq.Gaussian(0.3), num_data=N)
    _, sites = _sites(model, torch.randn(B, 3), torch.randn(B, 1))
    assert "outputs" in sites and "logits" not in sites
    assert sites["obs"]["scale"] == pytest.approx(N / B, rel=1e-15)


def test_pyro_predictive_gives_leading_sample_dims():
    model = pyrouq.BayesianMLP(3, 4, 2, num_data=N)
    guide = pyrouq.mean_field_guide(model)
    x = torch.randn(B, 3)
    out = pyro.infer.Predictive(model, guide=guide, num_samples=5, parallel=True)(x)
    assert tuple(out["logits"].shape) == (5, B, 2)
    draws = {k: v for k, v in out.items() if k not in ("obs", "logits")}
    seq = pyro.infer.Predictive(model, posterior_samples=draws, parallel=False)(x)["logits"]
    assert torch.allclose(seq, out["logits"], atol=1e-6)
    preds = pyrouq.predict(model, x, posterior_samples=draws, progress=False)
    torch.testing.assert_close(preds.probs, torch.softmax(out["logits"], -1))


# --------------------------------------------------------------------------------------------
# The KL-weighted ELBO, exactly as DESIGN.md writes it
# --------------------------------------------------------------------------------------------


def _hand_loss(model, guide, x, y, kl_weight, prior_scale):
    """-(N/B) sum log p(y | x, w) + kl_weight * KL(q || p), w drawn by tracing the guide,
    the network and the Normal-Normal KL written out."""
    trace = poutine.trace(guide).get_trace(x, y)
    w = {n: s["value"] for n, s in trace.nodes.items() if s["type"] == "sample"}
    h = torch.relu(x @ w["fc1.weight"].T + w["fc1.bias"])
    logits = h @ w["fc2.weight"].T + w["fc2.bias"]
    nll = -(N / x.shape[0]) * torch.log_softmax(logits, -1).gather(1, y[:, None]).sum()
    kl = 0.0
    for name in w:
        q = trace.nodes[name]["fn"].base_dist
        mu, sd = q.loc, q.scale
        kl = kl + (torch.log(prior_scale / sd) + (sd**2 + mu**2) / (2 * prior_scale**2) - 0.5).sum()
    return nll + kl_weight * kl


@pytest.mark.parametrize("kl_weight", [0.0, 0.3, 1.0, 2.5])
def test_kl_weighted_elbo_is_design_formula_in_float64(kl_weight):
    torch.manual_seed(0)
    prior_scale = 0.5  # float32 holds it exactly, so the .double() model's prior is 0.5
    model = pyrouq.BayesianMLP(3, 4, 2, num_data=N, prior_scale=prior_scale).double()
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    x, y = torch.randn(B, 3, dtype=torch.float64), torch.randint(0, 2, (B,))
    elbo = pyrouq.KLWeightedELBO(kl_weight=kl_weight)
    pyro.set_rng_seed(1)
    loss = elbo.differentiable_loss(model, guide, x, y)
    params = list(guide.parameters())
    grads = torch.autograd.grad(loss, params)
    pyro.set_rng_seed(1)
    hand = _hand_loss(model, guide, x, y, kl_weight, prior_scale)
    hand_grads = torch.autograd.grad(hand, params)
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(hand.item(), rel=1e-12, abs=1e-12)
    for g, h in zip(grads, hand_grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-10, atol=1e-12)
    # three sequential particles: the mean of three such losses
    pyro.set_rng_seed(2)
    three = pyrouq.KLWeightedELBO(kl_weight=kl_weight, num_particles=3).loss(model, guide, x, y)
    pyro.set_rng_seed(2)
    hands = [_hand_loss(model, guide, x, y, kl_weight, prior_scale).item() for _ in range(3)]
    assert three == pytest.approx(sum(hands) / 3, rel=1e-12)


def test_kl_weight_one_with_an_autoguide_is_pyros_trace_elbo():
    from pyro.infer.autoguide import AutoNormal

    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(3, 4, 2, num_data=N).double()
    guide = AutoNormal(model, init_scale=0.2)
    x, y = torch.randn(B, 3, dtype=torch.float64), torch.randint(0, 2, (B,))
    guide(x, y)  # its parameters initialised (from the prior's median) before the draws
    pyro.set_rng_seed(3)
    ref = pyro.infer.Trace_ELBO().loss(model, guide, x, y)
    pyro.set_rng_seed(3)
    assert pyrouq.KLWeightedELBO(1.0).loss(model, guide, x, y) == pytest.approx(ref, rel=1e-12)


def test_batchensemble_loss_is_the_scaled_log_likelihood_of_every_member():
    torch.manual_seed(0)
    model = pyrouq.BatchEnsembleMLP(3, 4, 2, num_members=3, num_data=N).double()
    x, y = torch.randn(B, 3, dtype=torch.float64), torch.randint(0, 2, (B,))
    logits = model(x)  # (M, B, C)
    hand = -(N / B) * torch.log_softmax(logits, -1).gather(2, y.expand(3, B)[..., None]).sum()
    loss = pyrouq.KLWeightedELBO(kl_weight=0.3).loss(model, None, x, y)
    assert loss == pytest.approx(hand.item(), rel=1e-12)


# --------------------------------------------------------------------------------------------
# predict() and the decompositions
# --------------------------------------------------------------------------------------------


def test_predict_returns_the_documented_types_and_shapes():
    torch.manual_seed(0)
    model = pyrouq.BayesianMLP(3, 4, 2, num_data=N)
    guide = pyrouq.mean_field_guide(model)
    x = torch.randn(20, 3)
    preds = pyrouq.predict(model, x, guide, num_samples=7, progress=False)
    assert type(preds) is pyrouq.Predictions
    assert preds.probs.shape == (7, 20, 2)
    assert preds.mean_probs.shape == (20, 2) and preds.predicted.shape == (20,)
    torch.testing.assert_close(preds.mean_probs, preds.probs.mean(0))
    assert pyrouq.predict(model, x, guide, progress=False).probs.shape[0] == 32
    ensemble = pyrouq.BatchEnsembleMLP(3, 4, 2, num_members=3)
    assert pyrouq.predict(ensemble, x, progress=False).probs.shape == (3, 20, 2)
    with pytest.raises(ValueError, match=r"num_samples=3 given for a BatchEnsemble"):
        pyrouq.predict(ensemble, x, num_samples=3, progress=False)
    regression = pyrouq.bayesian(nn.Linear(3, 1), likelihood="gaussian", num_data=N)
    reg = pyrouq.predict(
        regression, x, pyrouq.mean_field_guide(regression), num_samples=4, progress=False
    )
    assert type(reg) is pyrouq.GaussianPredictions and reg.loc.shape == (4, 20, 1)


def _numpy_decompositions(p: np.ndarray, base: float) -> dict:
    mean = p.mean(0)

    def h(q):
        return -(q * np.log(q)).sum(-1) / np.log(base)

    return {
        "entropy": (h(mean), h(p).mean(0)),
        "variance": ((mean * (1 - mean)).sum(-1), (p * (1 - p)).sum(-1).mean(0), p.var(0).sum(-1)),
        "zero_one": (1 - mean.max(-1), (1 - p.max(-1)).mean(0)),
    }


@pytest.mark.parametrize("base", [math.e, 2.0])
def test_decompositions_match_numpy_and_add_up(base):
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(5, 8, 4, generator=g, dtype=torch.float64) * 2, -1)
    ref = _numpy_decompositions(probs.numpy(), base)
    for measure, (total, aleatoric, *epistemic) in ref.items():
        d = pyrouq.Predictions.from_probs(probs).uncertainty(measure, base=base)
        np.testing.assert_allclose(d.total.numpy(), total, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(d.aleatoric.numpy(), aleatoric, rtol=1e-12, atol=1e-15)
        if epistemic:
            np.testing.assert_allclose(d.epistemic.numpy(), epistemic[0], rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(d.total, d.aleatoric + d.epistemic, rtol=0, atol=1e-15)
        f32 = pyrouq.decompose(probs.float(), measure, base=base)
        assert (f32.total - f32.aleatoric - f32.epistemic).abs().max() <= 1e-6


def test_gaussian_uncertainty_is_the_law_of_total_variance():
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(4, 10, 1, generator=g, dtype=torch.float64)
    scale = torch.rand(4, 10, 1, generator=g, dtype=torch.float64) + 0.1
    d = pyrouq.GaussianPredictions(loc, scale).uncertainty()
    torch.testing.assert_close(d.aleatoric, (scale**2).mean(0)[:, 0])
    torch.testing.assert_close(d.epistemic, loc.var(0, correction=0)[:, 0])
    torch.testing.assert_close(d.total, d.aleatoric + d.epistemic, rtol=0, atol=1e-15)


def test_evaluate_returns_exactly_the_design_keys_as_floats():
    g = torch.Generator().manual_seed(0)
    preds = pyrouq.Predictions.from_probs(torch.softmax(torch.randn(5, 8, 4, generator=g), -1))
    ood = pyrouq.Predictions.from_probs(torch.softmax(torch.randn(5, 6, 4, generator=g), -1))
    targets = torch.randint(0, 4, (8,), generator=g)
    keys = (
        "acc nll brier ece aece aurc augrc cov_at_5_risk risk_at_80_cov disagreement "
        "expected_entropy mutual_information"
    ).split()
    plain = pyrouq.evaluate(preds, targets)
    assert sorted(plain) == sorted(keys)
    with_ood = pyrouq.evaluate(preds, targets, ood=ood)
    assert sorted(with_ood) == sorted([*keys, "ood_auroc", "ood_aupr", "ood_fpr95"])
    assert all(type(v) is float for v in with_ood.values())
    metrics = importlib.import_module("pyrouq.metrics")
    for key in keys:  # each metric is a function of the same name in metrics.py
        assert getattr(metrics, key)(preds.probs, targets) == pytest.approx(plain[key])
    loc = torch.randn(3, 5, 1, generator=g, dtype=torch.float64)
    reg = pyrouq.GaussianPredictions(loc, torch.ones_like(loc), torch.zeros(5, 1, dtype=loc.dtype))
    assert sorted(reg.evaluate()) == sorted(
        "rmse mae nll crps coverage_50 coverage_90 coverage_95 width_50 width_90 width_95 "
        "calibration_error".split()
    )


# --------------------------------------------------------------------------------------------
# arviz
# --------------------------------------------------------------------------------------------


def test_inference_data_groups_and_pointwise_log_likelihood():
    torch.manual_seed(0)
    x, y = torch.randn(12, 2), torch.randint(0, 2, (12,))
    model = pyrouq.BayesianMLP(2, 3, 2, num_data=12)
    guide = pyrouq.mean_field_guide(model, init_scale=0.3)
    idata = pyrouq.to_inference_data(model, guide, x, y, num_samples=8)
    assert {"posterior", "posterior_predictive", "log_likelihood", "observed_data"} <= set(
        idata.groups()
    )
    assert "obs" in idata.posterior_predictive and "obs" in idata.observed_data
    # pointwise and unscaled (not N/B): az.loo reads one value per point and draw
    draws = {k: torch.as_tensor(idata.posterior[k].values[0]) for k in idata.posterior.data_vars}
    logits = pyro.infer.Predictive(model, posterior_samples=draws)(x)["logits"]
    ref = torch.log_softmax(logits, -1).gather(2, y.expand(8, 12)[..., None])[..., 0]
    np.testing.assert_allclose(idata.log_likelihood["obs"].values[0], ref.numpy(), atol=1e-5)
    result = pyrouq.mcmc(
        model,
        x,
        y,
        num_samples=5,
        warmup_steps=5,
        num_chains=2,
        seed=0,
        progress=False,
        parallel=False,
    )
    chains = pyrouq.to_inference_data(result)
    assert dict(chains.posterior.sizes)["chain"] == 2 and dict(chains.posterior.sizes)["draw"] == 5
    assert "sample_stats" in chains.groups()


def test_design_spelling_of_the_zero_one_measure_is_accepted():
    """DESIGN.md writes the measure "zero-one"; the package's "zero_one" refused it."""
    probs = torch.softmax(torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(0)), -1)
    dashed = pyrouq.decompose(probs, "zero-one")
    underscored = pyrouq.decompose(probs, "zero_one")
    assert torch.equal(dashed.total, underscored.total)
    assert torch.equal(dashed.epistemic, underscored.epistemic)
    assert torch.equal(
        pyrouq.Predictions.from_probs(probs).uncertainty("zero-one").total, dashed.total
    )


def test_design_positional_arguments_are_taken_in_designs_order():
    """DESIGN.md writes predict(model, x, guide, num_samples, batch_size, posterior_samples),
    to_inference_data(model, guide, x, y, num_samples), evaluate(predictions, targets, ood,
    ood_score), mcmc(model, x, y, num_samples, warmup_steps, num_chains) and
    batchensemble(module, M, use_base_weights, r_mean, r_std, s_mean, s_std); the package
    took all but the first few as keywords only, and evaluate's first as predictions_or_probs."""
    torch.manual_seed(0)
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    model = pyrouq.bayesian(torch.nn.Sequential(torch.nn.Linear(4, 3)), num_data=12)
    guide = pyrouq.mean_field_guide(model)
    pyro.set_rng_seed(1)
    by_position = pyrouq.predict(model, x, guide, 4, 5, None, progress=False)
    pyro.set_rng_seed(1)
    by_name = pyrouq.predict(model, x, guide, num_samples=4, batch_size=5, progress=False)
    assert torch.equal(by_position.probs, by_name.probs)
    assert pyrouq.evaluate(predictions=by_name, targets=y) == pyrouq.evaluate(by_name, y)
    ood = by_name.probs[:, :4]
    assert pyrouq.evaluate(by_name, y, ood, "entropy") == pyrouq.evaluate(
        by_name, y, ood=ood, ood_score="entropy"
    )
    pyro.set_rng_seed(2)
    idata = pyrouq.to_inference_data(model, guide, x, y, 3)
    assert idata.posterior.sizes["draw"] == 3
    members = pyrouq.batchensemble(torch.nn.Sequential(torch.nn.Linear(4, 3)), 2, True, 1.0, 0.0)
    assert members.options["r_std"] == 0.0
    result = pyrouq.mcmc(model, x, y, 3, 2, 1, progress=False, seed=0)
    assert result.samples[next(iter(result.samples))].shape[:2] == (1, 3)
