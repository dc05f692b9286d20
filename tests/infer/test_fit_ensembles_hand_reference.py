"""Thirteenth audit: BatchEnsemble and rank-1 fitting against hand-written references.

Each check writes the M members out as explicit networks (member m's weight
``s_m[:, None] * W * r_m[None]``, its own bias, every member on the full batch) and compares
fit()'s and the ELBO's numbers with plain torch on the same batches: the loss scaled N/B, the
gradients of the shared W, of r, s, the per-member biases and norms, and the parameters after
Adam steps; a learned Gaussian noise shared by the members; rank-1 with BatchNorm (shared or
per member) under several particles; tied weights; a resumed run against an uninterrupted one.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from _toy import StopAfter
from torch import nn

import pyrouq
from pyrouq import ArrayLoader, TrainingInterrupted, batchensemble, fit, mean_field_guide, rank1


def _member_weight(params, name, m, weight=None):
    w = params[f"net.{weight or name}.weight"]
    return params[f"net.{name}.s"][m][:, None] * w * params[f"net.{name}.r"][m][None]


def _leaves(model):
    return {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}


def _nll(logits, y, n):
    """The members' summed negative log-likelihood, scaled N/B."""
    members, batch = logits.shape[:2]
    log_lik = torch.distributions.Categorical(logits=logits).log_prob(y.expand(members, -1))
    return -(n / batch) * log_lik.sum()


def _conv_members(params, x, members):
    """``Conv2d(2, 3, 3, padding=1) -> BatchNorm2d(3) (per member) -> ReLU -> Flatten ->
    Linear(48, 64) -> ReLU -> Linear(64, 5)``, the members written out, ``(M, B, 5)``."""
    outs = []
    for m in range(members):
        conv_r = params["net.0.r"][m].reshape(1, -1, 1, 1)
        w = params["net.0.weight"] * params["net.0.s"][m].reshape(-1, 1, 1, 1) * conv_r
        h = F.conv2d(x, w, params["net.0.bias"][m], padding=1)
        norm = f"net.1.norms.{m}"
        h = F.batch_norm(h, None, None, params[f"{norm}.weight"], params[f"{norm}.bias"], True)
        h = F.linear(h.relu().flatten(1), _member_weight(params, "4", m), params["net.4.bias"][m])
        outs.append(F.linear(h.relu(), _member_weight(params, "6", m), params["net.6.bias"][m]))
    return torch.stack(outs)


def test_conv_ensemble_loss_and_gradients_match_explicit_members_in_float32():
    """A per-member BatchNorm (CPU member passes) and a linear layer wider than its
    activations (members' scaled activations instead of their weights)."""
    torch.manual_seed(0)
    n, batch, members = 12, 4, 3
    x, y = torch.randn(n, 2, 4, 4), torch.randint(0, 5, (n,))
    net = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1),
        nn.BatchNorm2d(3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(48, 64),
        nn.ReLU(),
        nn.Linear(64, 5),
    )
    ensemble = batchensemble(net, members)
    params = _leaves(ensemble)
    expected = _nll(_conv_members(params, x[:batch], members), y[:batch], n)
    expected.backward()
    ensemble.num_data = n
    loss = pyrouq.KLWeightedELBO().loss_and_grads(ensemble, None, x[:batch], y[:batch])
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    for name, value in ensemble.named_parameters():
        scale = params[name].grad.abs().max().item()
        torch.testing.assert_close(
            value.grad, params[name].grad, rtol=0, atol=1e-6 * max(scale, 1.0), msg=name
        )


def test_gaussian_ensemble_with_a_learned_noise_trains_as_explicit_members_with_adam():
    """One learned noise scale per output, shared by the members, from softplus(raw) = 1."""
    torch.manual_seed(1)
    n, batch, members = 12, 4, 3
    x, y = torch.randn(n, 3), torch.randn(n, 2)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    ensemble = batchensemble(net, members, likelihood=pyrouq.Gaussian("learned"))
    params = {
        k: v.detach().clone().requires_grad_()
        for k, v in ensemble.named_parameters()
        if k != "likelihood.raw_scale"  # made on the first batch
    }
    raw = torch.full((2,), math.log(math.expm1(1.0)), requires_grad=True)
    adam = torch.optim.Adam([*params.values(), raw], lr=1e-2)
    batches = [(x[i : i + batch], y[i : i + batch]) for i in range(0, n, batch)]
    losses = []
    for xb, yb in batches:
        outs = []
        for m in range(members):
            h = F.linear(xb, _member_weight(params, "0", m), params["net.0.bias"][m]).tanh()
            outs.append(F.linear(h, _member_weight(params, "2", m), params["net.2.bias"][m]))
        noise = torch.distributions.Normal(torch.stack(outs), F.softplus(raw))
        loss = -(n / batch) * noise.log_prob(yb.expand(members, -1, -1)).sum()
        adam.zero_grad()
        loss.backward()
        adam.step()
        losses.append(loss.item())
    result = fit(
        ensemble, None, batches, epochs=1, lr=1e-2, lr_schedule="constant", num_data=n,
        progress=False,
    )  # fmt: skip
    assert result.losses == pytest.approx([sum(losses) / len(losses)], rel=1e-6)
    fitted = dict(ensemble.named_parameters())
    torch.testing.assert_close(fitted.pop("likelihood.raw_scale"), raw, rtol=0, atol=1e-6)
    for name, value in fitted.items():
        torch.testing.assert_close(value, params[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("norms", ["shared", "per_member"])
@pytest.mark.parametrize(("particles", "vectorize"), [(1, False), (2, False), (2, True)])
def test_rank1_with_batchnorm_matches_the_members_by_hand(norms, particles, vectorize):
    """Guide scales near 0: every particle is the guide's locations, so the NLL (averaged over
    particles, scaled N/B) and the gradients of W, the biases and the norms are those of the
    members at the locations, BatchNorm over the folded batch (shared) or each member's rows."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(2)
        n, batch, members = 12, 5, 3
        x, y = torch.randn(batch, 4), torch.randint(0, 3, (batch,))
        net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))
        model = rank1(net, members, norms=norms)
        guide = mean_field_guide(model, init_scale=1e-12)
        with torch.no_grad():
            for name, p in guide.named_parameters():
                if name.startswith("loc."):
                    p.add_(0.3 * torch.randn_like(p))
        params = _leaves(model)
        loc = {s: guide.site_loc(s).detach() for s in guide.sites}
        hidden = []
        for m in range(members):
            w = loc["0.s"][m][:, None] * params["net.0.weight"] * loc["0.r"][m][None]
            hidden.append(F.linear(x, w, params["net.0.bias"][m]))
        if norms == "shared":
            both = params["net.1.weight"], params["net.1.bias"]
            hidden = F.batch_norm(torch.cat(hidden), None, None, *both, True).chunk(members)
        else:
            hidden = [
                F.batch_norm(
                    h,
                    None,
                    None,
                    params[f"net.1.norms.{m}.weight"],
                    params[f"net.1.norms.{m}.bias"],
                    True,
                )
                for m, h in enumerate(hidden)
            ]
        outs = []
        for m in range(members):
            w = loc["3.s"][m][:, None] * params["net.3.weight"] * loc["3.r"][m][None]
            outs.append(F.linear(hidden[m].tanh(), w, params["net.3.bias"][m]))
        expected = _nll(torch.stack(outs), y, n)
        expected.backward()
        model.num_data = n
        elbo = pyrouq.KLWeightedELBO(
            kl_weight=1.0, num_particles=particles, vectorize_particles=vectorize
        )
        terms = elbo.terms_and_grads(model, guide, x, y)
        assert terms.nll.item() == pytest.approx(expected.item(), rel=1e-9)
        for name, value in model.named_parameters():
            torch.testing.assert_close(value.grad, params[name].grad, rtol=1e-7, atol=1e-7)
        tracked = [b.item() for k, b in model.named_buffers() if k.endswith("batches_tracked")]
        assert tracked == [particles] * (1 if norms == "shared" else members)
    finally:
        torch.set_default_dtype(previous)


def test_tied_weights_get_the_gradient_of_every_layer_sharing_them():
    """A tied W (and a block called twice) stays one W: its gradient sums every use, each
    layer keeping its own factors and per-member biases."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 6)
            self.b = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6))
            self.b[2].weight = self.b[0].weight
            self.c = nn.Linear(6, 3)

        def forward(self, x):
            h = self.a(x).relu()
            return self.c(self.b(self.b(h)))

    torch.manual_seed(3)
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    ensemble = batchensemble(Net(), 3)
    params = _leaves(ensemble)
    assert "net.b.2.weight" not in params and "net.b.2.r" in params

    def layer(name, m, h, weight=None):
        return F.linear(h, _member_weight(params, name, m, weight), params[f"net.{name}.bias"][m])

    outs = []
    for m in range(3):
        h = layer("a", m, x).relu()
        for _ in range(2):
            h = layer("b.2", m, layer("b.0", m, h).tanh(), weight="b.0")
        outs.append(layer("c", m, h))
    expected = _nll(torch.stack(outs), y, 5)
    expected.backward()
    ensemble.num_data = 5
    loss = pyrouq.KLWeightedELBO().loss_and_grads(ensemble, None, x, y)
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    for name, value in ensemble.named_parameters():
        torch.testing.assert_close(value.grad, params[name].grad, rtol=1e-5, atol=1e-5)


def test_a_resumed_ensemble_run_ends_where_the_uninterrupted_one_does(tmp_path):
    """Per-member BatchNorm (running statistics), dropout (the run's random stream) and Adam's
    moments all come back from the checkpoint."""
    x, y = torch.randn(24, 5), torch.randint(0, 3, (24,))

    def build():
        torch.manual_seed(4)
        net = nn.Sequential(
            nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(0.2), nn.Linear(6, 3)
        )
        return batchensemble(net, 3)

    def run(model, **options):
        loader = ArrayLoader(x, y, batch_size=5, seed=0)
        return fit(model, None, loader, epochs=3, progress=False, **options)

    whole = build()
    uninterrupted = run(whole, seed=3)
    with pytest.raises(TrainingInterrupted):
        run(build(), seed=3, checkpoint=tmp_path / "c.pt", callbacks=[StopAfter(1)])
    resumed_model = build()
    with torch.no_grad():
        for p in resumed_model.parameters():
            p.add_(1.0)  # what it holds is replaced by the checkpoint's
    resumed = run(resumed_model, resume_from=tmp_path / "c.pt")
    assert resumed.losses == uninterrupted.losses
    expected, got = whole.state_dict(), resumed_model.state_dict()
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        assert torch.equal(value, got[key]), key


def test_several_particles_are_refused_for_an_ensemble_with_nothing_to_draw():
    ensemble = batchensemble(nn.Sequential(nn.Linear(3, 3)), 2)
    x, y = torch.randn(4, 3), torch.randint(0, 3, (4,))
    expected = (
        r"num_particles=2 given for BatchEnsembleNetwork, which has no latent sites .*every "
        r"particle would repeat the same pass\. Leave num_particles=1\."
    )
    with pytest.raises(ValueError, match=expected):
        fit(copy.deepcopy(ensemble), None, [(x, y)], epochs=1, num_data=4, num_particles=2,
            progress=False)  # fmt: skip
