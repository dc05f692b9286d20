"""Audit of predict(), the uncertainty decompositions and fit()'s options against independent
references: a hand loop over guide traces (pyro.poutine.trace / replay), numpy in float64, a
hand-written torch Adam loop and the KL-weighted ELBO computed by hand."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _toy import ListLoader, toy_data
from pyro import poutine
from torch import nn

from pyrouq import Gaussian, bayesian, decompose, fit, mean_field_guide, predict


def _bayesian(likelihood="categorical", outputs=2, init_scale=0.3):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, outputs))
    model = bayesian(net, prior=0.7, likelihood=likelihood)
    return model, mean_field_guide(model, init_scale=init_scale)


def _hand_draws(model, guide, x, num_samples, seed):
    """S runs of the guide (one after another, from ``seed``), then the model replayed on each
    draw: the ``"logits"`` / the observed Normal of each run, in float64."""
    torch.manual_seed(seed)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(num_samples)]
    with torch.no_grad():
        return [poutine.trace(poutine.replay(model, trace=t)).get_trace(x) for t in traces]


# --------------------------------------------------------------------------------------------
# predict() against a hand loop; the decompositions against numpy
# --------------------------------------------------------------------------------------------


def test_predict_is_the_softmax_of_the_model_replayed_on_each_guide_run_in_order():
    model, guide = _bayesian()
    x, _ = toy_data(30)
    torch.manual_seed(3)
    probs = predict(model, x, guide, num_samples=5, progress=False).probs
    runs = _hand_draws(model, guide, x, 5, seed=3)
    hand = torch.stack([torch.softmax(r.nodes["logits"]["value"].double(), -1) for r in runs])
    assert probs.shape == (5, 30, 2)
    assert torch.allclose(probs.double(), hand, atol=1e-6, rtol=0)
    assert (hand[0] - hand[1]).abs().max() > 1e-2  # the draws differ: the order is checked


def test_decompositions_are_numpys_in_float64():
    model, guide = _bayesian()
    x, _ = toy_data(30)
    torch.manual_seed(3)
    p = predict(model, x, guide, num_samples=6, progress=False).probs.double()
    q = p.numpy()
    mean = q.mean(0)

    def h(r):
        return -(r * np.log(r)).sum(-1)

    total, expected = h(mean), h(q).mean(0)
    d = decompose(p)
    assert np.allclose(d.total.numpy(), total, atol=1e-12)
    assert np.allclose(d.aleatoric.numpy(), expected, atol=1e-12)
    assert np.allclose(d.epistemic.numpy(), total - expected, atol=1e-12)
    assert (total - expected).max() > 1e-3  # a mutual information worth checking
    bits = decompose(p, base=2)
    assert np.allclose(bits.epistemic.numpy(), (total - expected) / math.log(2), atol=1e-12)
    v = decompose(p, "variance")
    assert np.allclose(v.total.numpy(), (mean * (1 - mean)).sum(-1), atol=1e-12)
    assert np.allclose(v.aleatoric.numpy(), (q * (1 - q)).sum(-1).mean(0), atol=1e-12)
    assert np.allclose(v.epistemic.numpy(), q.var(0).sum(-1), atol=1e-12)
    z = decompose(p, "zero_one")
    assert np.allclose(z.total.numpy(), 1 - mean.max(-1), atol=1e-12)
    assert np.allclose(z.aleatoric.numpy(), (1 - q.max(-1)).mean(0), atol=1e-12)


def test_gaussian_predictions_split_the_variance_by_the_law_of_total_variance():
    model, guide = _bayesian(Gaussian("heteroscedastic"), outputs=2)
    x, _ = toy_data(30)
    torch.manual_seed(5)
    p = predict(model, x, guide, num_samples=6, progress=False)
    runs = _hand_draws(model, guide, x, 6, seed=5)
    loc = torch.stack([r.nodes["obs"]["fn"].base_dist.loc for r in runs]).double()
    scale = torch.stack([r.nodes["obs"]["fn"].base_dist.scale for r in runs]).double()
    assert torch.allclose(p.loc.double(), loc, atol=1e-6) and p.loc.shape == (6, 30, 1)
    assert torch.allclose(p.scale.double(), scale, atol=1e-6)
    mu, sd = loc.numpy()[..., 0], scale.numpy()[..., 0]
    d = p.uncertainty()
    assert np.allclose(d.aleatoric.double().numpy(), (sd**2).mean(0), rtol=1e-5)
    assert np.allclose(d.epistemic.double().numpy(), mu.var(0), rtol=1e-4, atol=1e-7)
    assert np.allclose(d.total.double().numpy(), (sd**2).mean(0) + mu.var(0), rtol=1e-5)


def test_predict_seeds_batch_sizes_and_loaders_agree():
    model, guide = _bayesian()
    x, y = toy_data(40)

    def run(data, seed=3, **kw):
        torch.manual_seed(seed)
        return predict(model, data, guide, num_samples=4, progress=False, **kw)

    ref = run(x)
    # (a DataLoader without generator= takes a seed from torch's stream first: documented)
    data = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=9, generator=torch.Generator())
    assert torch.equal(run(x).probs, ref.probs)
    assert (run(x, seed=4).probs - ref.probs).abs().max() > 1e-2
    for other in (
        run(x, batch_size=7),
        run(x, parallel=False),
        run(x, max_draw_bytes=256),  # the draws in chunks, x read once per chunk
        run([x[:13], x[13:]]),
        run(loader),
    ):
        assert torch.allclose(other.probs, ref.probs, atol=1e-6, rtol=0)
    assert torch.equal(other.targets, y)


# --------------------------------------------------------------------------------------------
# predict(): labels that are not one per input of their batch (fixed)
# --------------------------------------------------------------------------------------------


def test_predict_leaves_out_labels_that_are_not_one_per_input_of_their_batch():
    model, guide = _bayesian()
    x, y = toy_data(20)
    # 20 labels for 20 inputs, but 5 for the first batch of 10: they would be misaligned
    batches = [(x[:10], y[:5]), (x[10:], y[5:])]
    with pytest.warns(UserWarning) as caught:
        p = predict(model, batches, guide, num_samples=3, progress=False)
    assert p.targets is None
    message = " ".join(str(w.message) for w in caught)
    assert "the labels x yields cannot be the predictions' targets (batch 1 of x holds 10 " in (
        message
    )
    assert "inputs and labels of shape (5,), not one label per input)" in message
    assert "Pass targets to evaluate()" in message
    # a 0-d label (a batch's one number) is no label per input either: warned, not a crash
    with pytest.warns(UserWarning, match=r"batch 2 of x holds 10 inputs and labels of shape \(\)"):
        p = predict(model, [(x[:10], y[:10]), (x[10:], y[0])], guide, 2, progress=False)
    assert p.targets is None


# --------------------------------------------------------------------------------------------
# fit() against a hand-written torch loop and the ELBO by hand
# --------------------------------------------------------------------------------------------


def _lr_factor(step, total, warmup):
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(step - warmup, total - warmup) / (total - warmup)))


@pytest.mark.parametrize("schedule", ["warmup_cosine", "constant"])
def test_plain_fit_is_a_torch_adam_loop_on_n_over_b_scaled_cross_entropy(schedule):
    x, y = toy_data(40)
    torch.manual_seed(0)
    start = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    ours, hand = copy.deepcopy(start), copy.deepcopy(start)
    result = fit(ours, None, ListLoader(x, y, 12), epochs=3, lr=0.05, lr_schedule=schedule,
                 progress=False, seed=0)  # fmt: skip
    loader = ListLoader(x, y, 12)  # 12, 12, 12, 4: the last batch scaled by 40/4
    adam = torch.optim.Adam(hand.parameters(), lr=0.05, fused=True)
    total, step, losses = 3 * len(loader), 0, []
    for _ in range(3):
        epoch = []
        for xb, yb in loader:
            factor = _lr_factor(step, total, int(0.2 * total)) if schedule != "constant" else 1
            adam.param_groups[0]["lr"] = 0.05 * factor
            loss = F.cross_entropy(hand(xb), yb, reduction="sum") * (40 / xb.shape[0])
            adam.zero_grad()
            loss.backward()
            adam.step()
            step += 1
            epoch.append(loss.item())
        losses.append(sum(epoch) / len(epoch))
    assert result.steps == 12
    assert np.allclose(result.losses, losses, rtol=1e-6, atol=0)
    for a, b in zip(ours.parameters(), hand.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("kl_weight", "particles"), [(1.0, 1), (0.3, 2), (0.0, 1)])
def test_bayesian_fits_first_step_is_the_kl_weighted_elbo_by_hand(kl_weight, particles):
    model, guide = _bayesian(init_scale=0.2)
    x, y = toy_data(40)
    xb, yb = x[:10], y[:10]
    kl = 0.0  # analytic KL(N(mu, sd) || N(0, 0.7)), summed over every weight
    for site in guide.sites:
        mu, sd = guide.site_loc(site).double(), guide.site_scale(site).double()
        kl += (torch.log(0.7 / sd) + (sd**2 + mu**2) / (2 * 0.49) - 0.5).sum().item()
    hand_model = copy.deepcopy(model)
    hand_model.num_data = 40
    nll = 0.0
    for run in _hand_draws_with_labels(hand_model, copy.deepcopy(guide), xb, yb, particles, 11):
        logits = run.nodes["logits"]["value"].double()
        nll += 40 / 10 * F.cross_entropy(logits, yb, reduction="sum").item() / particles
    result = fit(model, guide, [(xb, yb)], epochs=1, num_data=40, kl_weight=kl_weight,
                 num_particles=particles, seed=11, progress=False)  # fmt: skip
    record = result.history[0]
    assert record.kl == pytest.approx(kl, rel=1e-6)
    assert record.nll == pytest.approx(nll, rel=1e-6)
    assert record.loss == pytest.approx(nll + kl_weight * kl, rel=1e-6)
    assert (result.kl_weight, result.num_particles, result.num_data) == (kl_weight, particles, 40)


def _hand_draws_with_labels(model, guide, x, y, num_samples, seed):
    torch.manual_seed(seed)
    traces = [poutine.trace(guide).get_trace(x, y) for _ in range(num_samples)]
    with torch.no_grad():
        return [poutine.trace(poutine.replay(model, trace=t)).get_trace(x, y) for t in traces]


# --------------------------------------------------------------------------------------------
# fit() and predict(): bad numbers say what to pass (fixed)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "error", "message"),
    [
        ({"epochs": -1}, ValueError,
         r"Expected epochs to be an integer >= 1, got -1\. Pass the number of passes over "
         r"train_loader, e\.g\. epochs=10\."),
        ({"lr": 0}, ValueError,
         r"Expected lr > 0 \(a finite float\), got 0\. Pass a number, e\.g\. lr=1e-3"),
        ({"lr": "1e-3"}, ValueError,  # (a string: it said "got '1e-3'. Pass a number")
         r"Expected lr > 0 \(a finite float\), got '1e-3' \(a string: pass a float, lr=0\.001\)\. "
         r"Pass a number, e\.g\. lr=1e-3"),
        ({"num_particles": 0}, ValueError,
         r"Expected num_particles to be an integer >= 1, got 0\. Pass the number of draws from "
         r"the guide per step, e\.g\. num_particles=1"),
        ({"kl_weight": "auto"}, TypeError,
         r"Expected kl_weight to be a float >= 0 or None, got 'auto'\. Pass a number, e\.g\. "
         r"kl_weight=1\.0 \(the exact ELBO\), or leave it out for the default"),
        ({"kl_weight": "0.1"}, TypeError,  # (KLWeightedELBO's hint, 7109f60; fit() had none)
         r"Expected kl_weight to be a float >= 0 or None, got '0\.1' \(a string: pass a float, "
         r"kl_weight=0\.1\)\. Pass a number, e\.g\. kl_weight=1\.0 \(the exact ELBO\), or leave"),
        ({"kl_weight": -1}, ValueError,
         r"Expected kl_weight to be a finite float >= 0, got -1\. kl_weight = 1 is the exact"),
        ({"num_data": 0}, ValueError,
         r"Expected num_data to be a positive integer, got 0\. Pass the training-set size N"),
    ],
)  # fmt: skip
def test_fit_refuses_bad_numbers_saying_what_to_pass(option, error, message):
    model, guide = _bayesian()
    x, y = toy_data(20)
    before = [p.detach().clone() for p in guide.parameters()]
    kwargs = {"epochs": 1, "progress": False, **option}
    with pytest.raises(error, match=message):
        fit(model, guide, ListLoader(x, y, 10), **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(before, guide.parameters(), strict=True))


@pytest.mark.parametrize(
    ("loader", "message"),
    [
        ([], r"train_loader yielded no batches .* in epoch 1\. Pass a loader with batches"),
        ([{"x": torch.zeros(4, 3), "y": torch.zeros(4, dtype=torch.long)}],
         r"train_loader must yield \(x, y\) tensor pairs; batch 1 of epoch 1 is a dict with keys "
         r"'x', 'y'\. Map it to pairs"),
        ([(torch.zeros(4, 3), torch.zeros(3, dtype=torch.long))],
         r"expected labels y of shape \(4,\) to match the 4 inputs, got shape \(3,\)\. Pass one "
         r"integer label per input"),
        ([(torch.zeros(4, 3), torch.zeros(4))],
         r"labels of dtype torch\.float32, expected an integer dtype \(class indices: y\.long\(\)"),
    ],
)  # fmt: skip
def test_fit_refuses_bad_loaders_saying_what_to_do(loader, message):
    model, guide = _bayesian()
    with pytest.raises((TypeError, ValueError), match=message):
        fit(model, guide, loader, epochs=1, num_data=4, progress=False)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"num_samples": 0},
         r"Expected num_samples to be a positive integer, got 0\. Pass e\.g\. num_samples=32"),
        ({"num_samples": "4"},
         r"Expected num_samples to be a positive integer, got '4'\. Pass e\.g\. num_samples="),
        ({"batch_size": 0},
         r"Expected batch_size to be a positive integer, got 0\. Pass e\.g\. batch_size=256"),
    ],
)  # fmt: skip
def test_predict_refuses_bad_counts_saying_what_to_pass(option, message):
    model, guide = _bayesian()
    with pytest.raises(ValueError, match=message):
        predict(model, torch.zeros(4, 3), guide, progress=False, **option)
