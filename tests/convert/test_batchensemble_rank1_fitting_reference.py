"""BatchEnsemble and rank-1 fitting and prediction against hand-written references.

The members are written out as plain networks (member m's weight ``diag(s_m) W diag(r_m)``,
its own bias and norm copy, every member on every input of the batch) and trained with
``torch.optim.Adam`` on the loss written out by hand: the members' summed negative
log-likelihood scaled N/B for a BatchEnsemble, plus the closed-form KL of every member row's
Gaussian to ``Normal(1, prior_scale)`` under reparameterised draws for a rank-1 network, in
float64 so that fit()'s numbers agree to rounding over several Adam steps. Predictions and
their entropy decomposition are checked against numpy.
"""

from __future__ import annotations

import copy
import math
import os

import numpy as np
import pyro
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical, Normal, kl_divergence

import pyrouq
from pyrouq import (
    KLWeightedELBO,
    batchensemble,
    fit,
    mean_field_guide,
    predict,
    rank1,
)

F64 = torch.float64


def _leaves(module):
    return {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}


def _weight(params, layer, m, factors=None):
    """Member m's weight of linear layer ``layer``: ``s_m[:, None] * W * r_m[None]``."""
    r, s = (
        params[f"net.{layer}.{f}"] if factors is None else factors[f"{layer}.{f}"] for f in "rs"
    )
    return s[m][:, None] * params[f"net.{layer}.weight"] * r[m][None]


def _summed_nll(logits, y, n):
    """``-(N/B) sum_m sum_b log p(y_b | member m)`` of logits ``(M, B, C)``."""
    members, batch = logits.shape[:2]
    return -(n / batch) * Categorical(logits=logits).log_prob(y.expand(members, -1)).sum()


# --------------------------------------------------------------------------------------------
# BatchEnsemble: fit() against explicit members trained with torch's Adam
# --------------------------------------------------------------------------------------------


def _conv_net():
    """Conv -> Tanh -> BatchNorm -> ReLU -> Linear: no parameter whose gradient vanishes (a
    conv's factor s or bias right before a BatchNorm would have none, and Adam would then
    normalise rounding noise into full-size steps)."""
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1), nn.Tanh(), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
        nn.Linear(3 * 5 * 5, 4),
    ).to(F64)  # fmt: skip


def _conv_members(p, stats, x, members, norms):
    """The members by hand, ``(M, B, 4)``; BatchNorm in training mode moves ``stats``."""
    hidden = []
    for m in range(members):
        conv_r = p["net.0.r"][m].reshape(1, -1, 1, 1)
        w = p["net.0.weight"] * p["net.0.s"][m].reshape(-1, 1, 1, 1) * conv_r
        hidden.append(F.conv2d(x, w, p["net.0.bias"][m], padding=1).tanh())
    if norms == "shared":  # statistics over every member's rows, one set of running ones
        names = ["net.2"] * members
        both = (p["net.2.weight"], p["net.2.bias"])
        mean, var, count = (stats[f"net.2.{k}"] for k in ("running_mean", "running_var", "count"))
        hidden = F.batch_norm(torch.cat(hidden), mean, var, *both, True, 0.1, 1e-5).chunk(members)
        count += 1
    else:
        names = [f"net.2.norms.{m}" for m in range(members)]
        normed = []
        for h, name in zip(hidden, names, strict=True):
            both = (p[f"{name}.weight"], p[f"{name}.bias"])
            mean, var = stats[f"{name}.running_mean"], stats[f"{name}.running_var"]
            normed.append(F.batch_norm(h, mean, var, *both, True, 0.1, 1e-5))
            stats[f"{name}.count"] += 1
        hidden = normed
    outs = [
        F.linear(h.relu().flatten(1), _weight(p, "5", m), p["net.5.bias"][m])
        for m, h in enumerate(hidden)
    ]
    return torch.stack(outs)


@pytest.mark.parametrize("norms", ["per_member", "shared"])
def test_batchensemble_fit_is_adam_on_the_members_summed_nll(norms):
    """Two epochs of two batches: the epoch losses and training accuracies, every parameter
    and BatchNorm's running statistics and step counts agree with the members trained by
    hand, each member seeing every input of every batch."""
    torch.manual_seed(0)
    n, batch, members = 10, 5, 3
    x, y = torch.randn(n, 2, 5, 5, dtype=F64), torch.randint(0, 4, (n,))
    ensemble = batchensemble(_conv_net(), members, norms=norms)
    params = _leaves(ensemble)
    stats = {
        k.replace("num_batches_tracked", "count"): v.detach().clone()
        for k, v in ensemble.named_buffers()
    }
    adam = torch.optim.Adam(list(params.values()), lr=1e-2)
    batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]
    losses, accuracies = [], []
    for _ in range(2):
        for xb, yb in batches:
            logits = _conv_members(params, stats, xb, members, norms)
            loss = _summed_nll(logits, yb, n)
            guess = logits.detach().softmax(-1).mean(0).argmax(-1)  # the members' mean
            accuracies.append((guess == yb).double().mean().item())
            adam.zero_grad()
            loss.backward()
            adam.step()
            losses.append(loss.item())
    result = fit(
        ensemble, None, batches, epochs=2, lr=1e-2, lr_schedule="constant", num_data=n,
        progress=False,
    )  # fmt: skip
    assert result.losses == pytest.approx([np.mean(losses[:2]), np.mean(losses[2:])], rel=1e-12)
    got_acc = [r.train_acc for r in result.history]
    assert got_acc == pytest.approx([np.mean(accuracies[:2]), np.mean(accuracies[2:])])
    for name, value in ensemble.named_parameters():
        torch.testing.assert_close(value, params[name], rtol=0, atol=1e-12, msg=name)
    for name, value in ensemble.named_buffers():
        key = name.replace("num_batches_tracked", "count")
        torch.testing.assert_close(value, stats[key].to(value.dtype), rtol=0, atol=1e-12)
    assert [b.item() for k, b in ensemble.named_buffers() if k.endswith("tracked")] == [4] * (
        members if norms == "per_member" else 1
    )


# --------------------------------------------------------------------------------------------
# rank-1: the ELBO under real draws, fit() over Adam steps, predict() with a guide
# --------------------------------------------------------------------------------------------

SCALE = 0.2  # the rank-1 prior's standard deviation in these tests


def _rank1():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3)).to(F64)
    model = rank1(net, 3, prior_scale=SCALE)
    return model, mean_field_guide(model, init_scale=0.1)


def _guide_leaves(guide):
    """The guide's locations and its scales' free parameters (``softplus(rho)``), by site."""
    loc = {s: guide.site_loc(s).detach().clone().requires_grad_() for s in guide.sites}
    rho = {
        s: torch.log(torch.expm1(guide.site_scale(s).detach())).requires_grad_()
        for s in guide.sites
    }
    return loc, rho


def _rank1_members(params, factors, x):
    """The M members of ``Linear(3, 5) -> Tanh -> Linear(5, 3)`` under ``factors``."""
    outs = []
    for m in range(3):
        h = F.linear(x, _weight(params, "0", m, factors), params["net.0.bias"][m]).tanh()
        outs.append(F.linear(h, _weight(params, "2", m, factors), params["net.2.bias"][m]))
    return torch.stack(outs)


def _rank1_loss(params, loc, rho, eps_per_particle, x, y, n, kl_weight):
    """``mean_particles(summed NLL) + kl_weight * sum_sites KL(N(loc, softplus(rho)) ||
    N(1, SCALE))``, the KL in closed form (torch's, over every entry)."""
    nll = 0.0
    for eps in eps_per_particle:
        factors = {s: loc[s] + F.softplus(rho[s]) * eps[s] for s in loc}
        nll = nll + _summed_nll(_rank1_members(params, factors, x), y, n)
    prior = Normal(torch.tensor(1.0, dtype=F64), torch.tensor(SCALE, dtype=F64))
    kl = sum(kl_divergence(Normal(loc[s], F.softplus(rho[s])), prior).sum() for s in loc)
    return nll / len(eps_per_particle) + kl_weight * kl


def test_rank1_fit_is_adam_on_the_exact_elbo_of_the_factors():
    """fit()'s default kl_weight for a rank-1 network is 1 (the exact ELBO); two epochs of
    two batches, one draw of every member's factors a step (each site drawn in the guide's
    order, ``loc + softplus(rho) * eps``), against the same loss and Adam by hand."""
    model, guide = _rank1()
    n, batch = 8, 4
    x, y = torch.randn(n, 3, dtype=F64), torch.randint(0, 3, (n,))
    params = _leaves(model)
    loc, rho = _guide_leaves(guide)
    adam = torch.optim.Adam([*params.values(), *loc.values(), *rho.values()], lr=1e-2)
    batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]
    torch.manual_seed(5)  # what fit(seed=5) seeds
    losses = []
    for _ in range(2):
        for xb, yb in batches:
            eps = {s: torch.empty(loc[s].shape, dtype=F64).normal_() for s in guide.sites}
            loss = _rank1_loss(params, loc, rho, [eps], xb, yb, n, kl_weight=1.0)
            adam.zero_grad()
            loss.backward()
            adam.step()
            losses.append(loss.item())
    result = fit(
        model, guide, batches, epochs=2, lr=1e-2, lr_schedule="constant", num_data=n, seed=5,
        progress=False,
    )  # fmt: skip
    assert result.kl_weight == 1.0
    assert result.losses == pytest.approx([np.mean(losses[:2]), np.mean(losses[2:])], rel=1e-12)
    for name, value in model.named_parameters():
        torch.testing.assert_close(value, params[name], rtol=0, atol=1e-12, msg=name)
    for site in guide.sites:
        torch.testing.assert_close(guide.site_loc(site), loc[site], rtol=0, atol=1e-12)
        torch.testing.assert_close(
            guide.site_scale(site), F.softplus(rho[site]), rtol=0, atol=1e-12
        )


@pytest.mark.parametrize(("particles", "vectorize"), [(2, False), (3, True)])
def test_rank1_elbo_with_several_particles_under_real_draws(particles, vectorize):
    """Guide scales of 0.1 (real draws, not the locations): the loss and every gradient of
    W, the biases and the guide's locations and scales, against the loss by hand with the
    particles' draws taken in the same order (one particle after another, site by site; or
    every particle of a site at once when vectorised)."""
    model, guide = _rank1()
    x, y = torch.randn(4, 3, dtype=F64), torch.randint(0, 3, (4,))
    model.num_data = 8
    params = _leaves(model)
    loc, rho = _guide_leaves(guide)
    torch.manual_seed(11)
    if vectorize:
        stacked = {s: torch.empty((particles, *loc[s].shape), dtype=F64).normal_() for s in loc}
        eps = [{s: v[i] for s, v in stacked.items()} for i in range(particles)]
    else:
        eps = [
            {s: torch.empty(loc[s].shape, dtype=F64).normal_() for s in loc}
            for _ in range(particles)
        ]
    expected = _rank1_loss(params, loc, rho, eps, x, y, 8, kl_weight=0.5)
    leaves = [*params.values(), *loc.values(), *rho.values()]
    grads = torch.autograd.grad(expected, leaves)
    torch.manual_seed(11)
    elbo = KLWeightedELBO(kl_weight=0.5, num_particles=particles, vectorize_particles=vectorize)
    loss = elbo.loss_and_grads(model, guide, x, y)
    assert loss == pytest.approx(expected.item(), rel=1e-12)
    names = [*params, *(f"loc {s}" for s in loc), *(f"rho {s}" for s in rho)]
    expected_grads = dict(zip(names, grads, strict=True))
    for name, value in model.named_parameters():
        torch.testing.assert_close(value.grad, expected_grads[name], rtol=1e-10, atol=1e-12)
    guide_params = dict(guide.named_parameters())  # loc.<site> and rho.<site>, "." as "__"
    for site in guide.sites:
        for kind in ("loc", "rho"):
            got = guide_params[f"{kind}.{site.replace('.', '__')}"].grad
            want = expected_grads[f"{kind} {site}"]
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=f"{kind} {site}")


def test_rank1_predict_with_a_guide_is_every_member_under_each_draw_in_turn():
    """S = K * M, draw-major: prediction ``k * M + m`` is member m under the k-th draw of
    every site (drawn site by site, draw after draw, from the seeded stream)."""
    model, guide = _rank1()
    model.eval()
    x = torch.randn(5, 3, dtype=F64)
    pyro.set_rng_seed(3)
    probs = predict(model, x, guide, num_samples=4).probs
    pyro.set_rng_seed(3)
    params = {k: v.detach() for k, v in model.named_parameters()}
    expected = []
    for _ in range(4):
        factors = {
            s: guide.site_loc(s).detach()
            + guide.site_scale(s).detach()
            * torch.empty(guide.site_loc(s).shape, dtype=F64).normal_()
            for s in guide.sites
        }
        expected.append(_rank1_members(params, factors, x).softmax(-1))
    torch.testing.assert_close(probs, torch.cat(expected), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# predict(): members into predictions, against numpy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("members", "n"), [(1, 4), (16, 3), (3, 7)])
def test_batchensemble_predictions_and_decomposition_match_numpy(members, n):
    """Per-member BatchNorm in prediction (eval: each copy's own running statistics), input
    batches of 2: probs are each member's softmax, the prediction their mean, the epistemic
    part the mutual information across members (0 for one member)."""
    torch.manual_seed(members)
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))
    ensemble = batchensemble(net, members)
    with torch.no_grad():
        for norm in ensemble.net[1].norms:
            norm.running_mean.normal_()
            norm.running_var.uniform_(0.5, 2.0)
            norm.weight.normal_()
            norm.bias.normal_()
        ensemble.net[0].bias.normal_()
        ensemble.net[3].bias.normal_()
    x = torch.randn(n, 4)
    got = predict(ensemble, x, batch_size=2)

    def arr(t):
        return t.detach().double().numpy()

    first, last = ensemble.net[0], ensemble.net[3]
    probs = []
    for m in range(members):
        norm = ensemble.net[1].norms[m]
        h = arr(x) @ arr(first.effective_weight(m)).T + arr(first.bias[m])
        h = (h - arr(norm.running_mean)) / np.sqrt(arr(norm.running_var) + norm.eps)
        h = np.tanh(h * arr(norm.weight) + arr(norm.bias))
        out = h @ arr(last.effective_weight(m)).T + arr(last.bias[m])
        e = np.exp(out - out.max(-1, keepdims=True))
        probs.append(e / e.sum(-1, keepdims=True))
    probs = np.stack(probs)
    mean = probs.mean(0)

    def entropy(p):
        return -(p * np.log(p)).sum(-1)

    parts = got.uncertainty("entropy")
    assert got.probs.shape == (members, n, 3)
    np.testing.assert_allclose(arr(got.probs), probs, rtol=0, atol=1e-6)
    np.testing.assert_allclose(arr(got.mean_probs), mean, rtol=0, atol=1e-6)
    assert got.predicted.tolist() == mean.argmax(-1).tolist()
    np.testing.assert_allclose(arr(parts.total), entropy(mean), rtol=0, atol=1e-6)
    np.testing.assert_allclose(arr(parts.aleatoric), entropy(probs).mean(0), rtol=0, atol=1e-6)
    mutual = entropy(mean) - entropy(probs).mean(0)
    np.testing.assert_allclose(arr(parts.epistemic), mutual, rtol=0, atol=1e-6)
    assert ensemble.training  # predict() put its modes back


def test_gaussian_batchensemble_predictions_match_numpy():
    """Heteroscedastic members: each member's mean and ``1e-3 + softplus(raw)`` scale; the
    aleatoric variance is the members' mean variance, the epistemic one the variance of
    their means (law of total variance, population variance over the M members)."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 2))
    ensemble = batchensemble(net, 4, likelihood=pyrouq.Gaussian("heteroscedastic"))
    with torch.no_grad():
        ensemble.net[0].bias.normal_()
        ensemble.net[2].bias.normal_()
    x = torch.randn(5, 2)
    got = predict(ensemble, x)
    first, last = ensemble.net[0], ensemble.net[2]
    loc, scale = [], []
    for m in range(4):
        w0, w2 = (layer.effective_weight(m).detach().double().numpy() for layer in (first, last))
        b0, b2 = (layer.bias[m].detach().double().numpy() for layer in (first, last))
        out = np.tanh(x.double().numpy() @ w0.T + b0) @ w2.T + b2
        loc.append(out[:, 0])
        scale.append(1e-3 + np.log1p(np.exp(out[:, 1])))
    loc, scale = np.stack(loc), np.stack(scale)
    np.testing.assert_allclose(got.loc[..., 0].double().numpy(), loc, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got.scale[..., 0].double().numpy(), scale, rtol=0, atol=1e-6)
    parts = got.uncertainty()
    aleatoric, epistemic = (scale**2).mean(0), loc.var(0)
    np.testing.assert_allclose(parts.aleatoric.double().numpy(), aleatoric, rtol=1e-5)
    np.testing.assert_allclose(parts.epistemic.double().numpy(), epistemic, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# BatchEnsembleLeNet: members, checkpoints, float64
# --------------------------------------------------------------------------------------------


def test_batchensemble_lenet_members_checkpoint_and_float64(tmp_path):
    """Member m is a plain LeNet with the effective weights and member biases; a checkpoint
    rebuilds the same function; ``.to(float64)`` computes the float32 outputs in float64 and
    trains and predicts in float64."""
    torch.manual_seed(0)
    lenet = pyrouq.LeNet()
    ensemble = pyrouq.BatchEnsembleLeNet(num_members=3, base=lenet)
    with torch.no_grad():
        for layer in ensemble.net.modules():
            if hasattr(layer, "effective_weight"):
                layer.bias.normal_()
    x = torch.randn(5, 1, 28, 28)
    out = ensemble(x).detach()
    for m in range(3):
        plain = copy.deepcopy(lenet)
        state = {}
        for name, layer in ensemble.net.named_modules():
            if hasattr(layer, "effective_weight"):
                state[f"{name}.weight"] = layer.effective_weight(m).detach()
                state[f"{name}.bias"] = layer.bias[m].detach()
        plain.load_state_dict(state)
        torch.testing.assert_close(out[m], plain(x).detach(), rtol=1e-5, atol=1e-5)
    path = pyrouq.save(os.fspath(tmp_path / "lenet.pt"), ensemble)
    loaded = pyrouq.load(path).model
    assert type(loaded) is pyrouq.BatchEnsembleLeNet
    assert torch.equal(loaded(x), out)

    wide = copy.deepcopy(ensemble).to(F64)
    torch.testing.assert_close(wide(x.double()).detach(), out.double(), rtol=1e-5, atol=1e-5)
    assert predict(wide, x).probs.dtype == F64
    result = fit(wide, None, [(x, torch.arange(5))], epochs=1, num_data=5, progress=False)
    assert math.isfinite(result.losses[0])
    assert all(p.dtype == F64 for p in wide.parameters())


def test_a_forward_of_ones_own_runs_once_per_member_on_cpu():
    """What the class docstring says of side effects: on CPU (no norm shared by the members
    in training) a buffer the forward updates moves M times a call, by B rows each."""

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))
            self.register_buffer("rows", torch.zeros(()))
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            self.calls += 1
            self.rows += x.shape[0]
            return self.fc(x)

    ensemble = batchensemble(Counting(), 3)
    seen = []
    ensemble.net.fc.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    ensemble(torch.randn(4, 3))
    assert (ensemble.net.calls.item(), ensemble.net.rows.item()) == (3, 12)
    assert seen == [(4, 3)] * 3
