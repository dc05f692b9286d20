"""Eleventh audit: fitting and predicting BatchEnsemble and rank-1 networks against
independent, hand-written references.

* fit() on a BatchEnsemble is checked step for step against M explicit members (member m's
  weight ``W * (s_m r_m^T)``, its own bias, the input repeated to every member) trained with
  ``torch.optim.Adam`` on the members' summed negative log-likelihood scaled N/B (what the
  docs say the loss is), with per-member and shared BatchNorm, minibatches not divisible by M
  and members outnumbering the batch;
* predict()'s member probabilities and decompositions against the members' softmax by hand;
* the factors' initialisation against its documented distributions;
* rank-1: the KL of its factors against the closed form, the ELBO against Pyro's own, and the
  draw-major flattening ``s = k * M + m`` against a hand loop.

Everything runs in float64, so the references agree to rounding (in float32, Adam turns the
rounding noise of gradients that vanish exactly, such as a bias feeding a per-member
BatchNorm, into full-size steps, and the two runs drift apart there).
"""

from __future__ import annotations

import math

import pyro
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pyrouq
from pyrouq import batchensemble, fit, load, mean_field_guide, predict, rank1, save
from pyrouq.nn import BatchEnsembleLinear


@pytest.fixture(autouse=True)
def _float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _member_weight(layer, m: int) -> torch.Tensor:
    """Member m's Linear weight ``diag(s_m) W diag(r_m)``, written out."""
    return layer.s[m][:, None] * layer.weight * layer.r[m][None, :]


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in model.named_parameters()
    }


def _batches(x, y, size):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, x.shape[0], size)]


# -------------------------------------------------------------------------------------------
# BatchEnsemble: fit() and predict() against M explicit members
# -------------------------------------------------------------------------------------------


def _explicit_members(params, x, num_members, norms, buffers, training):
    """The members of ``Linear(5, 6) -> [BatchNorm1d(6)] -> Tanh -> Linear(6, 3)`` run as M
    explicit networks (the shared BatchNorm, if any, over all members' rows), ``(M, B, 3)``."""
    hidden = []
    for m in range(num_members):
        w = params["net.0.s"][m][:, None] * params["net.0.weight"] * params["net.0.r"][m][None]
        hidden.append(F.linear(x, w, params["net.0.bias"][m]))
    if norms == "per_member":
        hidden = [
            F.batch_norm(
                h,
                buffers[f"net.1.norms.{m}.running_mean"],
                buffers[f"net.1.norms.{m}.running_var"],
                params[f"net.1.norms.{m}.weight"],
                params[f"net.1.norms.{m}.bias"],
                training,
                0.1,
                1e-5,
            )
            for m, h in enumerate(hidden)
        ]
    elif norms == "shared":
        folded = F.batch_norm(
            torch.cat(hidden),
            buffers["net.1.running_mean"],
            buffers["net.1.running_var"],
            params["net.1.weight"],
            params["net.1.bias"],
            training,
            0.1,
            1e-5,
        )
        hidden = list(folded.chunk(num_members))
    last = "net.3" if norms else "net.2"
    outs = []
    for m, h in enumerate(hidden):
        w = (
            params[f"{last}.s"][m][:, None]
            * params[f"{last}.weight"]
            * params[f"{last}.r"][m][None]
        )
        outs.append(F.linear(torch.tanh(h), w, params[f"{last}.bias"][m]))
    return torch.stack(outs)


@pytest.mark.parametrize(
    ("norms", "num_members", "batch"),
    [(None, 3, 8), (None, 7, 3), (None, 1, 8), ("per_member", 3, 7), ("shared", 4, 7)],
    ids=["plain-M3", "M-above-batch", "M1", "per-member-bn", "shared-bn"],
)
def test_fit_and_predict_match_explicit_members_trained_with_adam(norms, num_members, batch):
    torch.manual_seed(0)
    n = 20  # batches of 8, 8, 4 or 7, 7, 6 or 3, ..., 2: none a multiple of every M
    x, y = torch.randn(n, 5), torch.randint(0, 3, (n,))
    layers = [nn.Linear(5, 6)] + ([nn.BatchNorm1d(6)] if norms else []) + [nn.Tanh()]
    net = nn.Sequential(*layers, nn.Linear(6, 3))
    ensemble = batchensemble(net, num_members, **({"norms": norms} if norms else {}))
    params = _snapshot(ensemble)
    buffers = {k: v.detach().clone() for k, v in ensemble.named_buffers()}
    names = [k for k in params if params[k].requires_grad]
    adam = torch.optim.Adam([params[k] for k in names], lr=1e-2)
    batches = _batches(x, y, batch)
    expected_losses = []
    for _ in range(2):
        losses = []
        for xb, yb in batches:
            logits = _explicit_members(params, xb, num_members, norms, buffers, True)
            log_lik = torch.distributions.Categorical(logits=logits).log_prob(
                yb.expand(num_members, -1)
            )
            loss = -(n / xb.shape[0]) * log_lik.sum()  # the members' NLLs summed, scaled N/B
            adam.zero_grad()
            loss.backward()
            adam.step()
            losses.append(loss.item())
        expected_losses.append(sum(losses) / len(losses))

    result = fit(
        ensemble,
        None,
        batches,
        epochs=2,
        lr=1e-2,
        lr_schedule="constant",
        num_data=n,
        progress=False,
    )

    assert result.losses == pytest.approx(expected_losses, rel=1e-10)
    # (a bias feeding a per-member BatchNorm has a zero gradient, whose rounding noise Adam
    # scales to ~1e-9 steps: 1e-7 is far below the 1e-2 steps a wrong gradient would take)
    fitted = dict(ensemble.named_parameters())
    for k in names:
        torch.testing.assert_close(fitted[k], params[k], rtol=1e-7, atol=1e-7)
    for k, value in ensemble.named_buffers():
        if not k.endswith("num_batches_tracked"):
            torch.testing.assert_close(value, buffers[k], rtol=1e-7, atol=1e-7)

    preds = predict(ensemble, x, batch_size=3)  # input batches fewer than the members too
    with torch.no_grad():
        probs = _explicit_members(params, x, num_members, norms, buffers, False).softmax(-1)
    assert preds.probs.shape == (num_members, n, 3)
    torch.testing.assert_close(preds.probs, probs, rtol=1e-7, atol=1e-9)
    probs = preds.probs  # the decompositions by hand, on the members' probabilities
    mean = probs.mean(0)
    entropy = -(probs * probs.log()).sum(-1)
    decomposition = preds.uncertainty()
    torch.testing.assert_close(decomposition.total, -(mean * mean.log()).sum(-1))
    torch.testing.assert_close(decomposition.aleatoric, entropy.mean(0))
    mutual_information = -(mean * mean.log()).sum(-1) - entropy.mean(0)
    torch.testing.assert_close(decomposition.epistemic, mutual_information, atol=1e-12, rtol=0)
    if num_members == 1:  # one member: no disagreement
        assert decomposition.epistemic.abs().max() < 1e-12
    else:
        assert decomposition.epistemic.min() > 0
    variance = preds.uncertainty("variance")
    torch.testing.assert_close(variance.epistemic, probs.var(0, unbiased=False).sum(-1))
    torch.testing.assert_close(variance.aleatoric, (probs * (1 - probs)).sum(-1).mean(0))


def test_fit_twice_trains_on_with_a_fresh_adam():
    torch.manual_seed(1)
    x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))
    net = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3))
    ensemble = batchensemble(net, 2)
    params = _snapshot(ensemble)
    batches = _batches(x, y, 5)
    for _ in range(2):  # fit() twice: a new Adam each time, from where the last one left off
        adam = torch.optim.Adam(list(params.values()), lr=1e-2)
        for xb, yb in batches:
            logits = _explicit_members(params, xb, 2, None, {}, True)
            loss = (
                -(12 / xb.shape[0])
                * torch.distributions.Categorical(logits=logits).log_prob(yb.expand(2, -1)).sum()
            )
            adam.zero_grad()
            loss.backward()
            adam.step()
        fit(
            ensemble,
            None,
            batches,
            epochs=1,
            lr=1e-2,
            lr_schedule="constant",
            num_data=12,
            progress=False,
        )
    for k, value in ensemble.named_parameters():
        torch.testing.assert_close(value, params[k], rtol=1e-9, atol=1e-10, msg=k)


def test_one_member_with_unit_factors_is_the_plain_network():
    torch.manual_seed(2)
    net = nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 4)
    ).eval()
    ensemble = batchensemble(net, 1, r_std=0.0, s_std=0.0)
    x = torch.randn(5, 1, 6, 6)
    preds = predict(ensemble, x)
    torch.testing.assert_close(preds.probs[0], net(x).softmax(-1))


def test_each_conv_member_is_its_own_explicit_network():
    """Grouped and transposed convolutions, members outnumbering the inputs: member m of the
    ensemble is the network with weights ``W * s_m * r_m`` laid out by hand."""
    torch.manual_seed(3)
    net = nn.Sequential(
        nn.Conv2d(4, 6, 3, padding=1, groups=2),
        nn.ReLU(),
        nn.ConvTranspose2d(6, 4, 2, stride=2, groups=2),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 3),
    )
    ensemble = batchensemble(net, 5).eval()
    x = torch.randn(2, 4, 4, 4)
    got = ensemble.outputs(x)
    conv, tconv, fc = ensemble.net[0], ensemble.net[2], ensemble.net[4]
    for m in range(5):
        r_in = conv.r[m].reshape(2, 1, 2).expand(2, 3, 2).reshape(6, 2)  # groups of in-channels
        w = conv.weight * conv.s[m].reshape(6, 1, 1, 1) * r_in.reshape(6, 2, 1, 1)
        h = F.conv2d(x, w, conv.bias[m], padding=1, groups=2).relu()
        s_out = tconv.s[m].reshape(2, 1, 2).expand(2, 3, 2).reshape(6, 2)  # (in, out / groups)
        w = tconv.weight * tconv.r[m].reshape(6, 1, 1, 1) * s_out.reshape(6, 2, 1, 1)
        h = F.conv_transpose2d(h, w, tconv.bias[m], stride=2, groups=2).flatten(1)
        expected = F.linear(h, _member_weight(fc, m), fc.bias[m])
        torch.testing.assert_close(got[m], expected, msg=f"member {m}")


# -------------------------------------------------------------------------------------------
# The factors' initialisation, num_members, num_samples
# -------------------------------------------------------------------------------------------


def test_factor_initialisation_follows_its_documented_distributions():
    torch.manual_seed(4)
    base = nn.Linear(1000, 1000)
    default = batchensemble(base, 4).net[0]  # r, s ~ N(1, 0.5): 4000 draws each
    for factor in (default.r, default.s):
        assert factor.mean().item() == pytest.approx(1.0, abs=0.03)
        assert factor.std().item() == pytest.approx(0.5, abs=0.02)
        assert not torch.equal(factor[0], factor[1])  # every member its own draw
    given = batchensemble(base, 4, r_mean=2.0, r_std=0.1, s_mean=-1.0, s_std=0.2).net[0]
    assert given.r.mean().item() == pytest.approx(2.0, abs=0.01)
    assert given.r.std().item() == pytest.approx(0.1, abs=0.005)
    assert given.s.mean().item() == pytest.approx(-1.0, abs=0.02)
    assert given.s.std().item() == pytest.approx(0.2, abs=0.01)
    signs = batchensemble(base, 4, init="random_sign").net[0]
    for factor in (signs.r, signs.s):
        assert set(factor.unique().tolist()) == {-1.0, 1.0}
        assert (factor > 0).double().mean().item() == pytest.approx(0.5, abs=0.03)
    # the shared weight and every member's bias are the base layer's
    assert torch.equal(default.weight, base.weight)
    assert torch.equal(default.bias, base.bias.expand(4, -1))


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, 2.5, "3"])
def test_bad_num_members_are_refused_in_house_style(bad):
    net = nn.Sequential(nn.Linear(4, 3))
    expected = rf"Expected num_members to be an integer >= 1, got {bad!r}\..*4 is a common"
    for build in (
        lambda: batchensemble(net, bad),
        lambda: rank1(net, bad),
        lambda: pyrouq.BatchEnsembleMLP(4, 5, 3, num_members=bad),
        lambda: BatchEnsembleLinear(4, 3, bad),
    ):
        with pytest.raises(ValueError, match=expected):
            build()


@pytest.mark.parametrize("num_samples", [1, 3])
def test_num_samples_must_stay_none_for_a_batchensemble(num_samples):
    ensemble = batchensemble(nn.Sequential(nn.Linear(4, 3)), 3)
    expected = (
        rf"num_samples={num_samples} given for a BatchEnsemble: its 3 members are fixed, not "
        r"sampled, so S = 3\. Leave num_samples=None"
    )
    with pytest.raises(ValueError, match=expected):
        predict(ensemble, torch.randn(2, 4), num_samples=num_samples)


def test_saved_members_and_their_norms_predict_as_before(tmp_path):
    torch.manual_seed(5)
    x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))
    make = lambda: nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))  # noqa: E731
    ensemble = batchensemble(make(), 3)  # per-member BatchNorm: each its own statistics
    fit(ensemble, None, _batches(x, y, 6), epochs=2, num_data=12, progress=False)
    save(tmp_path / "be.pt", ensemble)
    loaded = load(tmp_path / "be.pt", module=make()).model
    assert loaded.num_members == 3
    torch.testing.assert_close(predict(loaded, x).probs, predict(ensemble, x).probs, rtol=0, atol=0)


# -------------------------------------------------------------------------------------------
# rank-1
# -------------------------------------------------------------------------------------------


def _rank1_model(num_members=3, prior_scale=0.2, init_scale=0.05):
    torch.manual_seed(6)
    net = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    model = rank1(net, num_members, prior_scale=prior_scale)
    return model, mean_field_guide(model, init_scale=init_scale)


def test_rank1_kl_and_elbo_match_the_closed_form_and_pyros_elbo():
    model, guide = _rank1_model()
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.3 * torch.randn_like(p))  # locations off 1, scales apart
    closed_form = sum(
        (
            math.log(0.2)
            - guide.site_scale(s).log()
            + (guide.site_scale(s) ** 2 + (guide.site_loc(s) - 1) ** 2) / (2 * 0.2**2)
            - 0.5
        ).sum()
        for s in guide.sites
    ).item()
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    model.num_data = 10

    def loss(elbo):
        pyro.set_rng_seed(5)
        return elbo.loss(model, guide, x, y)

    weighted = loss(pyrouq.KLWeightedELBO(kl_weight=1.0))
    assert weighted - loss(pyrouq.KLWeightedELBO(kl_weight=0.0)) == pytest.approx(closed_form)
    assert weighted == pytest.approx(loss(pyro.infer.TraceMeanField_ELBO()), rel=1e-10)
    # fit() reports the same unweighted KL (a step too small to move anything)
    options = dict(lr=1e-30, lr_schedule="constant", kl_weight=0.5, num_data=10, progress=False)
    record = fit(model, guide, [(x, y)], epochs=1, **options).history[0]
    assert record.kl == pytest.approx(closed_form, rel=1e-10)
    assert record.loss - record.nll == pytest.approx(0.5 * closed_form, rel=1e-8)


@pytest.mark.parametrize("batch_size", [1024, 4], ids=["draws-stacked", "draw-by-draw"])
def test_rank1_predictions_are_draw_major(batch_size):
    model, guide = _rank1_model()
    draws = {k: v.detach() for k, v in guide.sample(4).items()}  # (K, M, features)
    x = torch.randn(6, 4)
    preds = predict(model, x, posterior_samples=draws, batch_size=batch_size)
    params = dict(model.named_parameters())
    expected = torch.empty(4 * 3, 6, 3)
    with torch.no_grad():
        for k in range(4):
            for m in range(3):
                h = x
                for i in ("0", "2"):
                    w = draws[f"{i}.s"][k, m][:, None] * params[f"net.{i}.weight"]
                    h = F.linear(h, w * draws[f"{i}.r"][k, m][None], params[f"net.{i}.bias"][m])
                    h = h.tanh() if i == "0" else h
                expected[k * 3 + m] = h.softmax(-1)  # s = k * M + m
    torch.testing.assert_close(preds.probs, expected)


def test_rank1_guide_draws_keep_each_member_in_its_place():
    """Guide scales near 0: every draw of member m is member m's location, so output s is
    member s % M's."""
    model, guide = _rank1_model(init_scale=1e-9)
    x = torch.randn(6, 4)
    preds = predict(model, x, guide, num_samples=2)
    assert preds.probs.shape == (2 * 3, 6, 3)
    at_locations = predict(
        model, x, posterior_samples={k: v[None] for k, v in model.template().items()}
    )
    torch.testing.assert_close(preds.probs, at_locations.probs.repeat(2, 1, 1), atol=1e-7, rtol=0)


def test_rank1_default_draws_are_at_least_one_per_member_set():
    """K defaults to 32 // M, and to one draw when M exceeds 32."""
    torch.manual_seed(7)
    net = nn.Sequential(nn.Linear(4, 3))
    x = torch.randn(2, 4)
    for members, total in ((3, 30), (40, 40)):
        model = rank1(net, members)
        assert predict(model, x, mean_field_guide(model)).probs.shape[0] == total
