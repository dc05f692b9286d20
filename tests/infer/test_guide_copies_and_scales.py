"""Leftovers of earlier audits: guide copies and the param store, huge kl_weight / init_scale,
init_scale given beside init_scale_relative, meta-device printing, unsigned zeros in tables,
2-d noise priors, the equal-width ECE against a numpy reference."""

from __future__ import annotations

import copy
import gc
import inspect

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from _toy import ListLoader, tiny_mlp, toy_data

import pyrouq
from pyrouq import KLWeightedELBO, fit, load, mean_field_guide, save
from pyrouq.likelihoods import Gaussian
from pyrouq.metrics import aece, ece, format_table
from pyrouq.nn import BatchEnsembleLinear, BayesianLinear
from pyrouq.rotation import format_rotation_table


def _snapshot(guide):
    return {k: v.detach().clone() for k, v in guide.state_dict().items()}


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# -- 1. copy.deepcopy(guide) ------------------------------------------------------------------


def test_a_deep_copy_of_a_guide_is_fitted_apart_from_the_original():
    pyro.set_rng_seed(0)
    x, y = toy_data()
    loader = ListLoader(x, y, 20)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    fit(model, guide, loader, epochs=1, progress=False)  # the original is in the store
    twin = copy.deepcopy(guide)
    assert twin.name != guide.name
    before = _snapshot(guide)
    fit(model, twin, loader, epochs=2, progress=False)
    assert _same(before, _snapshot(guide))  # the original is untouched
    assert not _same(before, _snapshot(twin))  # and the copy was trained
    store = pyro.get_param_store()
    for g in (guide, twin):  # the store holds each guide's own tensors, under its own name
        for key, param in g.named_parameters():
            assert store[f"{g.name}$$${key}"] is param, (g.name, key)
    twin_after = _snapshot(twin)
    fit(model, guide, loader, epochs=1, progress=False)  # the original trained in turn
    assert _same(twin_after, _snapshot(twin))
    name = twin.name
    del twin, g  # its entries leave the store with it, the original's stay
    gc.collect()
    assert not [k for k in store.keys() if k.startswith(name + "$$$")]
    assert [k for k in store.keys() if k.startswith(guide.name + "$$$")]


# -- 2. kl_weight and init_scale too large for a float ------------------------------------------


def test_a_kl_weight_too_large_for_a_float_is_refused_in_words():
    message = r"Expected kl_weight to be a finite float >= 0, got about 10\*\*400\. kl_weight = 1"
    with pytest.raises(ValueError, match=message):
        KLWeightedELBO(10**400)
    model = tiny_mlp()
    guide = mean_field_guide(model)
    x, y = toy_data()
    with pytest.raises(ValueError, match=message):
        fit(model, guide, ListLoader(x, y, 20), epochs=1, kl_weight=10**400, progress=False)
    with pytest.raises(ValueError, match=r"got about -10\*\*5000\."):  # (no 5000-digit repr)
        KLWeightedELBO(-(10**5000))
    assert KLWeightedELBO(10**300).kl_weight == 1e300  # a large int a float holds is taken
    with pytest.raises(ValueError, match=r"Expected init_scale > 0 \(a finite float\), got abo"):
        mean_field_guide(model, init_scale=10**400)


# -- 3. init_scale passed at its default value beside init_scale_relative -----------------------


def test_init_scale_at_its_default_value_beside_init_scale_relative_is_refused():
    model = tiny_mlp()
    with pytest.raises(
        ValueError, match=r"got init_scale=0.01 and init_scale_relative=0.1: .* Pass one of them"
    ):
        mean_field_guide(model, init_scale=1e-2, init_scale_relative=0.1)
    assert inspect.signature(mean_field_guide).parameters["init_scale"].default == 0.01
    plain = mean_field_guide(model)  # the default is still 1e-2
    assert torch.allclose(plain.site_scale("fc1.bias"), torch.full((20,), 1e-2))
    relative = mean_field_guide(model, init_scale_relative=0.1)
    loc = relative.site_loc("fc1.weight").detach()
    expected = (0.1 * loc.abs()).clamp_min(1e-6)
    assert torch.allclose(relative.site_scale("fc1.weight").detach(), expected, rtol=1e-5)


def test_a_relative_guide_still_loads_from_its_checkpoint(tmp_path):
    model = tiny_mlp()
    guide = mean_field_guide(model, init_scale_relative=0.1)
    ckpt = load(save(tmp_path / "c.pt", model, guide))
    assert ckpt.guide.init_scale_relative == 0.1
    assert torch.equal(ckpt.guide.site_scale("fc2.bias"), guide.site_scale("fc2.bias"))


# -- 4. the meta device ----------------------------------------------------------------------


def test_bayesian_layers_and_models_print_on_the_meta_device():
    with torch.device("meta"):
        layer = BayesianLinear(3, 2, prior_scale=0.5)
    assert repr(layer) == "BayesianLinear(weight_shape=(2, 3), prior=Normal(0, ...))"
    assert "prior=Normal(0, 0.5)" in repr(BayesianLinear(3, 2, prior_scale=0.5))  # (CPU)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    noisy = Gaussian(dist.HalfNormal(torch.tensor(2.0)))
    text = repr(pyrouq.bayesian(net, likelihood=noisy).to("meta"))
    assert "SitePrior(Normal(loc=..., scale=...))" in text
    assert "SitePrior(HalfNormal(scale=...))" in text
    assert "SitePrior(Normal(loc=0, scale=1))" in repr(pyrouq.bayesian(net))  # (CPU)


def test_effective_weight_refuses_a_meta_index_in_words():
    layer = BatchEnsembleLinear(3, 2, 4)
    with pytest.raises(ValueError, match=r"got tensor\(\.\.\., device='meta'.*: a meta tensor has"):
        layer.effective_weight(torch.tensor(1, device="meta"))
    r, s, w = layer.r.detach(), layer.s.detach(), layer.weight.detach()
    expected = torch.diag(s[1]) @ w @ torch.diag(r[1])
    assert torch.allclose(layer.effective_weight(torch.tensor(1)).detach(), expected)


# -- 5. negative zeros in the tables ---------------------------------------------------------


def test_tables_print_negative_zeros_unsigned():
    table = format_table({"acc": -0.0, "nll": -0.0, "ece": -1e-9, "brier": -0.5})
    assert "│ Acc            │    0.00% │" in table
    assert "│ NLL            │  0.00000 │" in table
    assert "│ ECE            │    0.00% │" in table
    assert "│ Brier          │ -0.50000 │" in table  # a negative number keeps its sign
    assert "-0.00" not in table
    row = {"angle": -0.0, "acc": -0.0, "ece": 0.1, "epistemic": -1e-9, "total": 1.0}
    rotation = format_rotation_table([row, {**row, "angle": -30.0}])
    assert "│    0° │ 0.00% │ 10.00% │   0.00000 │ 1.00000 │" in rotation
    assert "│  -30° │" in rotation
    assert "-0" not in rotation.replace("-30", "")


# -- 7. a noise prior of two dims ------------------------------------------------------------


def test_a_noise_prior_of_two_dims_is_refused_when_built():
    with pytest.raises(
        ValueError,
        match=r"Expected a noise prior of batch shape \(\) \(one noise for all outputs\) or \(D,\) "
        r"\(one per output\), got HalfNormal\(\) with batch shape \(2, 2\)\. Build it",
    ):
        Gaussian(dist.HalfNormal(torch.ones(2, 2)))
    assert Gaussian(dist.HalfNormal(torch.ones(3))).latent_sites() == {"sigma": torch.Size([3])}


# -- 8. ECE's bins -----------------------------------------------------------------------------


def _numpy_ece(probs, targets, num_bins):
    p = probs.double().numpy()
    conf, pred = p.max(1), p.argmax(1)
    correct = (pred == targets.numpy()).astype(np.float64)
    edges = np.arange(num_bins + 1, dtype=np.float64) / num_bins
    bins = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, num_bins - 1)
    _, inverse = np.unique(bins, return_inverse=True)
    gap = np.bincount(inverse, correct) - np.bincount(inverse, conf)
    return float(np.abs(gap).sum() / len(conf))


def _numpy_aece(probs, targets, num_bins):
    p = probs.double().numpy()
    conf, pred = p.max(1), p.argmax(1)
    order = np.argsort(conf, kind="stable")
    correct = (pred == targets.numpy()).astype(np.float64)[order]
    total = sum(
        abs(c.sum() - k.sum())
        for c, k in zip(
            np.array_split(correct, num_bins), np.array_split(conf[order], num_bins), strict=True
        )
    )
    return float(total / len(conf))


@pytest.mark.parametrize("num_bins", [1, 15, 100, 2**16, 10**6])
def test_ece_and_aece_match_a_numpy_reference(num_bins):
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(5000, 10, generator=g, dtype=torch.float64) * 2, -1)
    targets = torch.randint(0, 10, (5000,), generator=g)
    assert ece(probs, targets, num_bins=num_bins) == pytest.approx(
        _numpy_ece(probs, targets, num_bins), abs=1e-12
    )
    if num_bins <= 100:  # (numpy's split into a million arrays is slow)
        assert aece(probs, targets, num_bins=num_bins) == pytest.approx(
            _numpy_aece(probs, targets, num_bins), abs=1e-12
        )
