"""Audit 12: regression end to end against closed forms, and checkpoints / resume round trips.

References are independent of pyrouq: the conjugate posterior of a Bayesian linear regression
(and its mean-field optimum), torch.distributions.Normal, the law of total variance computed
from the draws, the pickle opcodes of the file, and a run never stopped.
"""

from __future__ import annotations

import io
import pickletools
import warnings
import zipfile

import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from _toy import StopAfter
from torch import nn

import pyrouq
from pyrouq import (
    MLP,
    BatchEnsembleMLP,
    BayesianMLP,
    CheckpointError,
    Gaussian,
    TrainingInterrupted,
    batchensemble,
    bayesian,
    fit,
    load,
    mean_field_guide,
    predict,
    rank1,
    save,
)
from pyrouq.tabular import ArrayLoader, Standardizer

# -- regression against closed forms ------------------------------------------------------------


def _conjugate_data():
    """40 points with x in [1, 3] (weight and bias correlated a posteriori), noise sd 0.5."""
    g = torch.Generator().manual_seed(0)
    x = 1.0 + 2.0 * torch.rand(40, 1, generator=g)
    y = 0.8 * x[:, 0] - 0.3 + 0.5 * torch.randn(40, generator=g)
    return x, y


def test_mean_field_linear_regression_recovers_the_conjugate_posterior():
    sigma, tau = 0.5, 1.0
    x, y = _conjugate_data()
    design = torch.cat([x, torch.ones_like(x)], 1).double()
    precision = design.T @ design / sigma**2 + torch.eye(2, dtype=torch.float64) / tau**2
    cov = torch.linalg.inv(precision)
    exact_mean = cov @ design.T @ y.double() / sigma**2
    marginal_sd = cov.diagonal().sqrt()
    # the mean-field optimum of a Gaussian posterior: the exact means, sd 1/sqrt(precision_ii)
    mean_field_sd = precision.diagonal().rsqrt()
    assert bool((marginal_sd > 3 * mean_field_sd).all())  # the two references differ here

    torch.manual_seed(1)
    model = bayesian(nn.Linear(1, 1), prior=tau, likelihood=Gaussian(scale=sigma))
    guide = mean_field_guide(model)
    fit(
        model,
        guide,
        ArrayLoader(x, y, batch_size=40, seed=0),
        epochs=2000,
        lr=0.05,
        kl_weight=1.0,
        progress=False,
        seed=0,
    )
    loc = torch.stack([guide.site_loc("weight").flatten()[0], guide.site_loc("bias")[0]]).double()
    sd = torch.stack([guide.site_scale("weight").flatten()[0], guide.site_scale("bias")[0]])
    # single-draw SVI with a decaying learning rate: its last-step noise is a few % of an sd
    assert ((loc.detach() - exact_mean).abs() / marginal_sd).max() < 0.15
    ratio = sd.detach().double() / mean_field_sd
    assert bool(((ratio - 1).abs() < 0.12).all()), ratio


def test_predictive_moments_are_the_law_of_total_variance_of_the_draws():
    torch.manual_seed(0)
    sigma = 0.3
    model = bayesian(nn.Linear(1, 1), likelihood=Gaussian(sigma))
    guide = mean_field_guide(model, init_scale=0.4)
    x = torch.linspace(-2, 2, 9)[:, None]
    p = predict(model, x, guide, num_samples=4000, seed=0)
    loc = p.loc[..., 0].double()  # (S, N)
    # each draw is a line: w_s x + b_s (the same weights for every input)
    w, b = (loc[:, -1] - loc[:, 0]) / 4, (loc[:, -1] + loc[:, 0]) / 2
    torch.testing.assert_close(loc, w[:, None] * x[:, 0].double() + b[:, None], rtol=0, atol=1e-5)
    assert torch.equal(p.scale, torch.full_like(p.scale, sigma))
    by_hand = sigma**2 + ((loc - loc.mean(0)) ** 2).mean(0)  # E[var] + var[E], over the S
    torch.testing.assert_close(p.variance[:, 0].double(), by_hand, rtol=1e-5, atol=0)
    torch.testing.assert_close(p.mean[:, 0].double(), loc.mean(0), rtol=0, atol=1e-6)
    u = p.uncertainty()
    torch.testing.assert_close(u.aleatoric, torch.full((9,), sigma**2), rtol=1e-6, atol=0)
    torch.testing.assert_close(u.total, u.aleatoric + u.epistemic)
    # and the guide's closed form: Var(w x + b) = x^2 s_w^2 + s_b^2 (S = 4000: ~2 % error)
    s_w, s_b = guide.site_scale("weight").flatten()[0], guide.site_scale("bias")[0]
    exact = (x[:, 0] ** 2 * s_w**2 + s_b**2).detach()
    torch.testing.assert_close(u.epistemic, exact, rtol=0.1, atol=0)


def test_heteroscedastic_nll_is_normal_log_prob_of_the_softplus_scales():
    torch.manual_seed(0)
    lik = Gaussian("heteroscedastic", min_scale=1e-3)
    outputs = torch.randn(3, 5, 4)  # S draws, B inputs, D = 2 means then 2 raw scales
    y = torch.randn(5, 2)
    scale = 1e-3 + F.softplus(outputs[..., 2:])
    reference = -torch.distributions.Normal(outputs[..., :2], scale).log_prob(y).sum()
    torch.testing.assert_close(lik.nll(outputs, y), reference)
    loc, predicted = lik.predictive(outputs)
    assert torch.equal(loc, outputs[..., :2]) and torch.allclose(predicted, scale)
    one = torch.randn(5, 2)  # D = 1: targets (N,) and (N, 1) score alike
    reference = torch.distributions.Normal(one[:, :1], 1e-3 + F.softplus(one[:, 1:]))
    expected = -reference.log_prob(y[:, :1]).sum()
    torch.testing.assert_close(lik.nll(one, y[:, 0]), expected)
    torch.testing.assert_close(lik.nll(one, y[:, :1]), expected)


def test_targets_n_and_n1_train_alike_and_several_outputs_keep_their_columns():
    torch.manual_seed(0)
    x = torch.randn(24, 2)
    y = 2 * x[:, 0] + 1 + 0.1 * torch.randn(24)
    runs = []
    for targets in (y, y[:, None]):
        torch.manual_seed(0)
        model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))
        guide = mean_field_guide(model)
        r = fit(
            model,
            guide,
            ArrayLoader(x, targets, batch_size=8, seed=0),
            epochs=2,
            progress=False,
            seed=0,
        )
        runs.append(([h.loss for h in r.history], predict(model, x, guide, 4, seed=0).loc))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])

    two = torch.stack([y, -y], 1)
    model = bayesian(nn.Linear(2, 2), likelihood=Gaussian("learned"))
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, two, batch_size=8, seed=0), epochs=1, progress=False)
    p = predict(model, ArrayLoader(x, two, batch_size=8, shuffle=False), guide, 3, seed=0)
    assert tuple(p.loc.shape) == (3, 24, 2) and torch.equal(p.targets, two)
    torch.testing.assert_close(p.scale[0, 0], F.softplus(model.likelihood.raw_scale).detach())
    model = bayesian(nn.Linear(2, 2), likelihood=Gaussian(0.3))
    with pytest.raises(ValueError, match=r"targets of shape \(24,\), expected \(N, 2\)"):
        fit(
            model,
            mean_field_guide(model),
            ArrayLoader(x, y, batch_size=8),
            epochs=1,
            progress=False,
        )


def test_a_standardizer_maps_predictions_back_to_the_targets_units():
    torch.manual_seed(0)
    x = torch.randn(30, 2) * 5 + 3
    y = 100 * x[:, :1] + 1000 + torch.randn(30, 1)
    scaler = Standardizer.fit(x, y)
    torch.testing.assert_close(scaler.y_mean, y.mean(0))
    torch.testing.assert_close(scaler.y_std, y.std(0))  # unbiased, as documented
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.2))
    guide = mean_field_guide(model)
    fit(
        model,
        guide,
        ArrayLoader(*scaler.transform(x, y), batch_size=10, seed=0),
        epochs=2,
        progress=False,
    )
    standard = predict(model, scaler.transform_x(x), guide, 5, seed=0)
    original = scaler.inverse(standard)
    torch.testing.assert_close(original.loc, standard.loc * scaler.y_std + scaler.y_mean)
    torch.testing.assert_close(original.scale, standard.scale * scaler.y_std)
    rmse = float((original.mean.double() - y.double()).square().mean().sqrt())
    assert original.evaluate(y)["rmse"] == pytest.approx(rmse, rel=1e-6)


# -- checkpoints: bit-exact round trips ----------------------------------------------------------


def _net(out=2):
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, out))


def _het_net():
    return _net(4)


_X = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
_LABELS = torch.arange(16) % 2
_TARGETS = torch.randn(16, 2, generator=torch.Generator().manual_seed(1))

_KINDS = {
    "bayesian_batchnorm": (lambda: bayesian(_net()), True, _LABELS, _net),
    "batchensemble": (lambda: batchensemble(_net(), 3), False, _LABELS, _net),
    "rank1": (lambda: rank1(_net(), 3), True, _LABELS, _net),
    "bayesian_mlp": (
        lambda: BayesianMLP(in_features=3, hidden_features=8, out_features=2),
        True,
        _LABELS,
        None,
    ),
    "batchensemble_mlp": (
        lambda: BatchEnsembleMLP(in_features=3, hidden_features=8, out_features=2, num_members=2),
        False,
        _LABELS,
        None,
    ),
    "plain_mlp": (
        lambda: MLP(in_features=3, hidden_features=8, out_features=2),
        False,
        _LABELS,
        None,
    ),
    "plain_network": (_net, False, _LABELS, _net),
    "gaussian_fixed": (lambda: bayesian(_net(), likelihood=Gaussian(0.3)), True, _TARGETS, _net),
    "gaussian_learned": (
        lambda: bayesian(_net(), likelihood=Gaussian("learned")),
        True,
        _TARGETS,
        _net,
    ),
    "gaussian_heteroscedastic": (
        lambda: bayesian(_het_net(), likelihood=Gaussian("heteroscedastic")),
        True,
        _TARGETS,
        _het_net,
    ),
    "gaussian_noise_prior_per_output": (
        lambda: bayesian(_net(), likelihood=Gaussian(dist.HalfNormal(torch.tensor([1.0, 2.0])))),
        True,
        _TARGETS,
        _net,
    ),
    "batchensemble_gaussian": (
        lambda: batchensemble(_net(), 2, likelihood=Gaussian("learned")),
        False,
        _TARGETS,
        _net,
    ),
    "guide_init_from": ("init_from", True, _LABELS, _net),
}


def _draws(p):
    return p.probs if hasattr(p, "probs") else torch.stack([p.loc, p.scale])


@pytest.mark.parametrize("kind", list(_KINDS))
def test_save_load_is_bit_exact_for_every_model_kind(kind, tmp_path):
    build, has_guide, y, skeleton = _KINDS[kind]
    torch.manual_seed(0)
    model = bayesian(_net()) if build == "init_from" else build()
    guide = None
    if has_guide:
        guide = mean_field_guide(model, init_from=_net() if build == "init_from" else None)
    fit(model, guide, ArrayLoader(_X, y, batch_size=8, seed=0), epochs=1, progress=False, seed=0)
    path = save(tmp_path / "c.pt", model, guide)
    restored = load(path, module=skeleton() if skeleton else None)
    for mine, theirs in ((model, restored.model), (guide, restored.guide)):
        if mine is None:
            assert theirs is None
            continue
        a, b = mine.state_dict(), theirs.state_dict()
        assert list(a) == list(b)
        assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
    model.eval()
    if isinstance(
        model, pyrouq.BayesianNetwork | pyrouq.BatchEnsembleNetwork | BayesianMLP | BatchEnsembleMLP
    ):
        draws = 3 if guide is not None else None
        before = predict(model, _X, guide, draws, seed=4)
        after = predict(restored.model, _X, restored.guide, draws, seed=4)
        assert torch.equal(_draws(before), _draws(after))
    else:
        with torch.no_grad():
            assert torch.equal(model(_X), restored.model(_X))


def test_the_file_holds_tensors_and_plain_data_and_a_pickled_object_is_refused(tmp_path):
    model = bayesian(_net(), likelihood=Gaussian(dist.HalfNormal(1.0)))
    path = save(tmp_path / "c.pt", model, mean_field_guide(model), metadata={"run": [1, "a"]})
    with zipfile.ZipFile(path) as archive:
        (pkl,) = [n for n in archive.namelist() if n.endswith("data.pkl")]
        ops = list(pickletools.genops(io.BytesIO(archive.read(pkl))))
    imported = set()
    for i, (op, arg, _) in enumerate(ops):
        if op.name == "GLOBAL":
            imported.add(arg.split(" ")[0] + "." + arg.split(" ")[1])
        if op.name == "STACK_GLOBAL":
            imported.add(f"{ops[i - 2][1]}.{ops[i - 1][1]}")
    allowed = {"torch._utils._rebuild_tensor_v2", "collections.OrderedDict"}
    assert imported - allowed <= {"torch.FloatStorage", "torch.LongStorage"}, imported
    payload = torch.load(path, weights_only=True)
    assert payload["format"] == "pyrouq.checkpoint" and isinstance(payload["description"], str)

    marker = tmp_path / "ran"

    class RunsCode:
        def __reduce__(self):
            return (marker.touch, ())

    torch.save({**payload, "metadata": RunsCode()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="contains pickled Python objects, which pyrouq"):
        load(tmp_path / "evil.pt", module=_net())
    assert not marker.exists()


@pytest.mark.parametrize(
    ("skeleton", "message"),
    [
        (
            lambda: nn.Sequential(nn.Linear(3, 9), nn.BatchNorm1d(9), nn.ReLU(), nn.Linear(9, 2)),
            r"parameter '0.weight' is shape \(8, 3\) in the checkpoint and shape \(9, 3\) in the "
            r"skeleton",
        ),
        (
            lambda: nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)),
            r"parameter '1.weight' is shape \(8,\) in the checkpoint and absent in the skeleton",
        ),
        (
            lambda: nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2)),
            r"module '2' is a ReLU in the checkpoint and a Tanh in the skeleton",
        ),
    ],
)
def test_a_skeleton_that_does_not_match_names_the_first_difference(skeleton, message, tmp_path):
    model = bayesian(_net(), likelihood=Gaussian(0.3))
    path = save(tmp_path / "c.pt", model, mean_field_guide(model))
    with pytest.raises(CheckpointError, match=message):
        load(path, module=skeleton())


def test_damaged_newer_and_state_dict_files_are_refused_clearly(tmp_path):
    model = bayesian(_net())
    path = save(tmp_path / "c.pt", model, mean_field_guide(model))
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="is not a readable checkpoint: it is truncated or"):
        load(tmp_path / "cut.pt", module=_net())
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, "format_version": 99}, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError, match=r"format version 99; this pyrouq reads versions"):
        load(tmp_path / "newer.pt", module=_net())
    # torch.save(net.state_dict()): say what the file is and how to use it
    torch.save(_net().state_dict(), tmp_path / "state.pt")
    with pytest.raises(
        CheckpointError,
        match=r"got a dict of 9 tensors and no 'format' entry: a state_dict\(\) \(of a model or "
        r"a guide\) or an MCMCResult's samples, saved with torch\.save\. .*"
        r"x\.load_state_dict\(torch\.load\(path, weights_only=True\)\) on the one it came from, "
        r"then pyrouq\.save\(path, model, guide\)",
    ):
        load(tmp_path / "state.pt")
    # a guide's state_dict, and the same file given to fit(resume_from=...)
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.5))
    guide = mean_field_guide(model)
    torch.save(guide.state_dict(), tmp_path / "guide.pt")
    with pytest.raises(CheckpointError, match=r"\(of a model or a guide\)"):
        load(tmp_path / "guide.pt")
    x = torch.randn(8, 2)
    with pytest.raises(CheckpointError, match=r"A run to resume needs the checkpoint "
                       r"fit\(checkpoint=\.\.\.\) writes\."):  # fmt: skip
        fit(model, guide, [(x, x[:, :1])], epochs=1, num_data=8, progress=False,
            resume_from=tmp_path / "guide.pt")  # fmt: skip


def test_a_state_dict_files_advice_covers_autoguides_and_mcmc_samples(tmp_path):
    """An AutoNormal's state_dict loads only into a guide that has run once (before: torch's
    "Unexpected key(s)"), which the advice did not say; and torch.save(result.samples) was
    told of as a state_dict alone."""
    from pyro.infer.autoguide import AutoNormal

    torch.manual_seed(0)
    x = torch.randn(8, 2)
    y = x[:, :1]
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.5), num_data=8)
    guide = AutoNormal(model)
    guide(x, y)
    torch.save(guide.state_dict(), tmp_path / "auto.pt")
    with pytest.raises(CheckpointError) as info:
        load(tmp_path / "auto.pt")
    assert (
        "An autoguide (AutoNormal) makes its parameters on its first run: call guide(x, y) once "
        "before loading into it (pyrouq.save() stores mean_field_guide() guides only)."
    ) in str(info.value)
    state = torch.load(tmp_path / "auto.pt", weights_only=True)
    with pytest.raises(RuntimeError, match="Unexpected key"):  # what the advice avoids
        AutoNormal(model).load_state_dict(state)
    again = AutoNormal(model)
    again(x, y)
    again.load_state_dict(state)  # as the advice says
    # an MCMCResult's samples saved with torch.save
    result = pyrouq.mcmc(model, x, y, num_samples=2, warmup_steps=2, num_chains=1, seed=0,
                         progress=False)  # fmt: skip
    torch.save(result.samples, tmp_path / "samples.pt")
    with pytest.raises(CheckpointError) as info:
        load(tmp_path / "samples.pt")
    assert "a state_dict() (of a model or a guide) or an MCMCResult's samples, saved with " in (
        str(info.value)
    )
    assert "An MCMCResult's samples: save the result itself, pyrouq.save(path, result)." in (
        str(info.value)
    )
    assert load(save(tmp_path / "result.pt", result)).samples.keys() == result.samples.keys()


def test_save_makes_missing_folders_and_a_failed_overwrite_keeps_the_old_file(
    tmp_path, monkeypatch
):
    model = bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.5))
    guide = mean_field_guide(model)
    path = save(tmp_path / "a" / "b" / "c.pt", model, guide)
    before = path.read_bytes()

    def crashes(obj, f, *args, **kwargs):  # a full disk half-way through the write
        f.write(b"PK\x03\x04 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", crashes)
    with torch.no_grad():
        model.net.weight.add_(1.0)
    with pytest.raises(OSError, match="No space left"):
        save(path, model, guide)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["c.pt"]  # no temporary left behind
    assert not torch.equal(load(path, module=nn.Linear(2, 1)).model.net.weight, model.net.weight)


# -- resume --------------------------------------------------------------------------------------


def _run(kind):
    torch.manual_seed(1)
    if kind == "regression":
        model = bayesian(_net(), likelihood=Gaussian("learned"))
        return model, mean_field_guide(model), _TARGETS
    if kind == "noise_prior":
        model = bayesian(_net(), likelihood=Gaussian(dist.HalfNormal(1.0)))
        return model, mean_field_guide(model), _TARGETS
    return batchensemble(_net(), 2, likelihood=Gaussian(0.4)), None, _TARGETS


def _state(model, guide):
    modules = (model,) if guide is None else (model, guide)
    return [t.clone() for m in modules for t in m.state_dict().values()]


@pytest.mark.parametrize("kind", ["regression", "noise_prior", "ensemble"])
def test_an_interrupted_run_resumed_ends_as_the_run_never_stopped(kind, tmp_path):
    model, guide, y = _run(kind)
    whole = fit(
        model,
        guide,
        ArrayLoader(_X, y, batch_size=6, seed=0),
        epochs=3,
        progress=False,
        seed=0,
        checkpoint=tmp_path / "whole.pt",
    )
    expected = _state(model, guide)
    expected_optimizer = torch.load(tmp_path / "whole.pt", weights_only=True)["optimizer"]

    model, guide, y = _run(kind)
    with pytest.raises(TrainingInterrupted):
        fit(
            model,
            guide,
            ArrayLoader(_X, y, batch_size=6, seed=0),
            epochs=3,
            progress=False,
            seed=0,
            checkpoint=tmp_path / "part.pt",
            callbacks=[StopAfter(1)],
        )
    model, guide, y = _run(kind)  # a fresh process would build them anew
    resumed = fit(
        model,
        guide,
        ArrayLoader(_X, y, batch_size=6, seed=0),
        epochs=3,
        progress=False,
        resume_from=tmp_path / "part.pt",
        checkpoint=tmp_path / "part.pt",
    )
    assert all(torch.equal(a, b) for a, b in zip(expected, _state(model, guide), strict=True))
    assert [h.loss for h in whole.history] == [h.loss for h in resumed.history]
    optimizer = torch.load(tmp_path / "part.pt", weights_only=True)["optimizer"]
    for a, b in zip(expected_optimizer["state"].values(), optimizer["state"].values(), strict=True):
        assert all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def test_resuming_with_another_model_likelihood_or_prior_is_refused(tmp_path):
    def run(**kw):
        model = bayesian(_net(), likelihood=Gaussian(0.3), **kw)
        return model, mean_field_guide(model)

    model, guide = run()
    loader = ArrayLoader(_X, _TARGETS, batch_size=6, seed=0)
    with pytest.raises(TrainingInterrupted):
        fit(
            model,
            guide,
            loader,
            epochs=3,
            progress=False,
            seed=0,
            checkpoint=tmp_path / "c.pt",
            callbacks=[StopAfter(1)],
        )

    def resume(model, guide, **kw):
        fit(
            model,
            guide,
            ArrayLoader(_X, _TARGETS, batch_size=6, seed=0),
            epochs=3,
            progress=False,
            resume_from=tmp_path / "c.pt",
            **kw,
        )

    other = bayesian(_net(), likelihood=Gaussian(0.5))
    with pytest.raises(
        CheckpointError,
        match=r"config\['likelihood'\]\['scale'\] is 0.3 there "
        r"and 0.5 in the model",
    ):
        resume(other, mean_field_guide(other))
    wider = nn.Sequential(nn.Linear(3, 9), nn.BatchNorm1d(9), nn.ReLU(), nn.Linear(9, 2))
    other = bayesian(wider, likelihood=Gaussian(0.3))
    with pytest.raises(CheckpointError, match=r"module\['parameters'\]\['0.weight'\] is \[8, 3\]"):
        resume(other, mean_field_guide(other))
    other, other_guide = run(prior=0.5)
    with pytest.raises(
        CheckpointError,
        match=r"the prior Normal\(loc=0, scale=1\) of site "
        r"'0.weight', but the model has Normal\(loc=0, scale=0.5\)",
    ):
        resume(other, other_guide)
    other = batchensemble(_net(), 2, likelihood=Gaussian(0.3))
    with pytest.raises(CheckpointError, match="holds a BayesianNetwork, but the model is a "):
        resume(other, None)
    model, guide = run()  # another kl_weight: documented as a warning, the run goes on
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume(model, guide, kl_weight=0.5)
    assert any("trained with kl_weight=1.0 under kl_weight=0.5" in str(w.message) for w in caught)
