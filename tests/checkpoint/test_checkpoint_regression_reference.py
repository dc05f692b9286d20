"""Regression likelihoods against torch.distributions.Normal, and checkpoints of regression and
convolutional networks against the run never saved: damaged bytes, version-2 files, noise-prior
families, resuming inside an epoch."""

from __future__ import annotations

import random

import pyro
import pyro.distributions as dist
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pyrouq import (
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
from pyrouq.tabular import ArrayLoader

_G = torch.Generator().manual_seed(0)
_X = torch.randn(30, 3, generator=_G)
_Y = torch.randn(30, 2, generator=_G)


def _bn_net(out=2):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, out))


def _values(*modules):
    return [t.detach().clone() for m in modules if m is not None for t in m.state_dict().values()]


# -- the likelihood against torch.distributions.Normal ------------------------------------------


def test_learned_noise_nll_and_its_gradient_are_normals_through_softplus():
    out = torch.randn(5, 3, dtype=torch.float64)
    y = torch.randn(5, 3, dtype=torch.float64)
    raw = torch.tensor([0.1, -0.5, 2.0], dtype=torch.float64)
    lik = Gaussian("learned")
    lik.prepare(out)
    with torch.no_grad():
        lik.raw_scale.copy_(raw)
    nll = lik.nll(out, y)
    nll.backward()
    reference_raw = raw.clone().requires_grad_()
    reference = -torch.distributions.Normal(out, F.softplus(reference_raw)).log_prob(y).sum()
    reference.backward()
    assert nll.item() == pytest.approx(reference.item(), rel=1e-12)
    assert torch.allclose(lik.raw_scale.grad, reference_raw.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("prior", [dist.HalfNormal(1.0), dist.HalfNormal(torch.ones(2))])
def test_latent_noise_under_a_particle_plate_scores_each_particle_with_its_own_sigma(prior):
    model = bayesian(nn.Linear(3, 2), likelihood=Gaussian(prior), num_data=30)
    guide = mean_field_guide(model)

    def plated(fn):
        def run(*args):
            with pyro.plate("particles", 3, dim=-3):
                return fn(*args)

        return run

    torch.manual_seed(1)
    drawn = pyro.poutine.trace(plated(guide)).get_trace(_X)
    ran = pyro.poutine.trace(pyro.poutine.replay(plated(model), trace=drawn)).get_trace(_X, _Y)
    sigma = drawn.nodes["sigma"]["value"].reshape(3, 1, -1)  # (3, 1, 1) or (3, 1, 2)
    means = ran.nodes["outputs"]["value"].reshape(3, 30, 2)
    site = ran.nodes["obs"]
    got = site["fn"].log_prob(site["value"]).reshape(3, 30)
    expected = torch.distributions.Normal(means, sigma).log_prob(_Y).sum(-1)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)


# -- checkpoints ------------------------------------------------------------------------------


def test_damaged_bytes_are_refused_or_load_the_saved_values(tmp_path):
    model = bayesian(_bn_net(), likelihood=Gaussian("learned"))
    model.likelihood.prepare(torch.zeros(1, 2))
    guide = mean_field_guide(model)
    data = save(tmp_path / "c.pt", model, guide, metadata={"a": 1}).read_bytes()
    expected = _values(model, guide)
    rng = random.Random(0)
    cases = [data[:k] for k in rng.sample(range(1, len(data)), 15)]
    for k in rng.sample(range(len(data)), 45):
        flipped = bytearray(data)
        flipped[k] ^= 1 << rng.randrange(8)
        cases.append(bytes(flipped))
    for damaged in cases:
        (tmp_path / "d.pt").write_bytes(damaged)
        try:
            back = load(tmp_path / "d.pt", module=_bn_net())
        except CheckpointError:
            continue
        got = _values(back.model, back.guide)
        assert back.metadata == {"a": 1}
        assert len(got) == len(expected) and all(map(torch.equal, got, expected))


def test_a_version_2_file_takes_the_site_start_values_from_the_skeleton(tmp_path):
    model = bayesian(_bn_net(), likelihood=Gaussian("learned"))
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(_X, _Y, batch_size=10, seed=0), epochs=1, progress=False)
    payload = torch.load(save(tmp_path / "c.pt", model, guide), weights_only=True)
    sites = {f"net.{s}" for s in model.network_sites()}
    state = {k: v for k, v in payload["model"].items() if k not in sites}  # as version 2 wrote
    torch.save({**payload, "format_version": 2, "model": state}, tmp_path / "v2.pt")
    back = load(tmp_path / "v2.pt", module=_bn_net())
    before = predict(model, _X, guide, 3, seed=1)
    after = predict(back.model, _X, back.guide, 3, seed=1)
    assert torch.equal(before.loc, after.loc) and torch.equal(before.scale, after.scale)


@pytest.mark.parametrize(
    "prior",
    [
        dist.Gamma(torch.tensor([2.0, 3.0]), torch.tensor([4.0, 5.0])),
        dist.LogNormal(-1.0, 0.5),
        dist.HalfCauchy(0.4),
        dist.InverseGamma(3.0, 2.0),
    ],
    ids=["gamma_per_output", "lognormal", "halfcauchy", "inversegamma"],
)
def test_a_noise_prior_comes_back_with_its_parameters_and_draws(prior, tmp_path):
    model = bayesian(nn.Linear(3, 2), likelihood=Gaussian(prior))
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(_X, _Y, batch_size=10, seed=0), epochs=1, progress=False)
    back = load(save(tmp_path / "c.pt", model, guide), module=nn.Linear(3, 2))
    theirs = back.model.likelihood.priors()["sigma"]
    points = torch.tensor([0.5, 1.5]).reshape(2, *[1] * len(prior.batch_shape))
    expected = prior.log_prob(points)  # one noise per output: a joint density over them
    assert torch.equal(theirs.log_prob(points), expected.sum(-1) if prior.batch_shape else expected)
    before = predict(model, _X, guide, 3, seed=2)
    after = predict(back.model, _X, back.guide, 3, seed=2)
    assert torch.equal(before.loc, after.loc) and torch.equal(before.scale, after.scale)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, stride=2)
        self.bn = nn.BatchNorm2d(2)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class _ConvNet(nn.Module):
    def __init__(self, out):
        super().__init__()
        self.block = _Block()
        self.head = nn.Linear(2 * 4 * 4, out)

    def forward(self, x):
        return self.head(self.block(x).flatten(1))


@pytest.mark.parametrize("kind", ["rank1_fixed", "batchensemble_heteroscedastic"])
def test_a_nested_conv_batchnorm_regression_predicts_the_same_after_load(kind, tmp_path):
    x, y = torch.randn(8, 1, 10, 10, generator=_G), torch.randn(8, 2, generator=_G)
    torch.manual_seed(0)
    if kind == "rank1_fixed":
        model, skeleton = rank1(_ConvNet(2), 2, likelihood=Gaussian(0.5)), _ConvNet(2)
        guide, draws = mean_field_guide(model), 3
    else:
        heads = Gaussian("heteroscedastic")
        model, skeleton = batchensemble(_ConvNet(4), 3, likelihood=heads), _ConvNet(4)
        guide, draws = None, None
    fit(model, guide, ArrayLoader(x, y, batch_size=4, seed=0), epochs=1, progress=False)
    back = load(save(tmp_path / "c.pt", model, guide), module=skeleton)
    assert all(map(torch.equal, _values(model, guide), _values(back.model, back.guide)))
    before = predict(model, x, guide, draws, seed=1)
    after = predict(back.model, x, back.guide, draws, seed=1)
    assert torch.equal(before.loc, after.loc) and torch.equal(before.scale, after.scale)


def _stopping(loader, at):
    """``loader`` raising KeyboardInterrupt (Ctrl-C) when it is asked for its ``at``-th batch,
    counted over the epochs: the run stops between two steps of an epoch."""
    served = [0]
    base = type(loader)

    class Stopping(base):  # type: ignore[misc, valid-type]
        def __iter__(self):
            for batch in super().__iter__():
                served[0] += 1
                if served[0] == at:
                    raise KeyboardInterrupt
                yield batch

    loader.__class__ = Stopping
    return loader


def _array_loader():
    return ArrayLoader(_X, _Y, batch_size=7, seed=0)


def _data_loader():
    data = torch.utils.data.TensorDataset(_X, _Y)
    order = torch.Generator().manual_seed(3)
    return torch.utils.data.DataLoader(data, batch_size=7, shuffle=True, generator=order)


@pytest.mark.parametrize("make", [_array_loader, _data_loader], ids=["arrays", "dataloader"])
def test_a_regression_stopped_inside_an_epoch_resumes_to_the_bit(make, tmp_path):
    def build():
        torch.manual_seed(0)
        model = bayesian(_bn_net(), likelihood=Gaussian(dist.HalfNormal(1.0)))
        return model, mean_field_guide(model)

    model, guide = build()
    whole = fit(model, guide, make(), epochs=3, progress=False, seed=0, kl_weight=0.5)
    expected = _values(model, guide)
    model, guide = build()
    with pytest.raises(TrainingInterrupted):  # the 3rd batch of epoch 2 (5 batches an epoch)
        fit(
            model,
            guide,
            _stopping(make(), 8),
            epochs=3,
            progress=False,
            seed=0,
            kl_weight=0.5,
            checkpoint=tmp_path / "c.pt",
        )
    assert torch.load(tmp_path / "c.pt", weights_only=True)["training"]["epoch_steps"] == 2
    model, guide = build()
    resumed = fit(
        model, guide, make(), epochs=3, progress=False, kl_weight=0.5, resume_from=tmp_path / "c.pt"
    )
    assert all(map(torch.equal, expected, _values(model, guide)))
    assert [h.loss for h in resumed.history] == [h.loss for h in whole.history]
