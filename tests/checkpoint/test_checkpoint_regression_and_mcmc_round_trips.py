"""Checkpoint audit 6: regression models with each noise model predict bit for bit the same
after save -> load, a resumed run ends where the uninterrupted one does, an MCMC result comes
back exactly, a hand-set ``default_kl_weight`` survives, and a checkpoint whose pickled class
names got a flipped byte is reported as damaged, not as one carrying pickled objects."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch
from torch import nn

from pyrouq import (
    ArrayLoader,
    BayesianMLP,
    CheckpointError,
    Gaussian,
    bayesian,
    fit,
    load,
    mcmc,
    mean_field_guide,
    predict,
    rank1,
    save,
)
from pyrouq.infer.fit import default_kl_weight


def net(outputs: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, outputs))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 3, generator=g)
    return x, 2 * x[:, :1] + 0.1 * torch.randn(30, 1, generator=g)


NOISE = {
    "fixed": (lambda: Gaussian(0.3), 1),
    "learned": (lambda: Gaussian("learned"), 1),
    "heteroscedastic": (lambda: Gaussian("heteroscedastic", min_scale=0.02), 2),
    "latent": (lambda: Gaussian(dist.Gamma(torch.full((1,), 2.0), 3.0)), 1),
}


@pytest.mark.parametrize("noise", sorted(NOISE))
def test_a_regression_model_predicts_the_same_after_save_and_load(tmp_path, noise):
    likelihood, outputs = NOISE[noise]
    x, y = data()
    model = bayesian(net(outputs), likelihood=likelihood(), num_data=123)
    guide = mean_field_guide(model)
    fit(model, guide, ArrayLoader(x, y, batch_size=10, seed=0), epochs=2, progress=False, seed=0)
    save(tmp_path / "r.pt", model, guide)
    back = load(tmp_path / "r.pt", module=net(outputs))
    torch.manual_seed(1)
    before = predict(model, x, guide, num_samples=4, progress=False)
    torch.manual_seed(1)
    after = predict(back.model, x, back.guide, num_samples=4, progress=False)
    assert torch.equal(before.loc, after.loc) and torch.equal(before.scale, after.scale)
    assert back.model.likelihood.describe() == model.likelihood.describe()
    assert (back.model.num_data, back.model.given_num_data) == (30, 123)
    saved = guide.state_dict()
    assert all(torch.equal(v, back.guide.state_dict()[k]) for k, v in saved.items())


class _Stop(Exception):
    pass


def _stop_after_two(record):
    if record.epoch >= 2:
        raise _Stop


def test_a_resumed_regression_run_ends_where_the_uninterrupted_one_does(tmp_path):
    x, y = data()

    def build():
        model = rank1(net(), 2, likelihood=Gaussian("learned"))
        return model, mean_field_guide(model)

    whole, whole_guide = build()
    one = fit(whole, whole_guide, ArrayLoader(x, y, batch_size=10, seed=0), epochs=4,
              progress=False, seed=3)  # fmt: skip
    cut, cut_guide = build()
    with pytest.raises(_Stop):
        fit(cut, cut_guide, ArrayLoader(x, y, batch_size=10, seed=0), epochs=4, progress=False,
            seed=3, checkpoint=tmp_path / "c.pt", callbacks=[_stop_after_two])  # fmt: skip
    torch.manual_seed(99)
    fresh, fresh_guide = build()
    two = fit(fresh, fresh_guide, ArrayLoader(x, y, batch_size=10, seed=0), epochs=4,
              progress=False, resume_from=tmp_path / "c.pt")  # fmt: skip
    for a, b in ((whole, fresh), (whole_guide, fresh_guide)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert [r.loss for r in one.history] == [r.loss for r in two.history]


def test_an_mcmc_result_comes_back_exactly(tmp_path):
    x, y = data()
    model = bayesian(net(), likelihood=Gaussian(dist.HalfNormal(1.0)))
    result = mcmc(model, x, y, num_samples=6, warmup_steps=6, num_chains=2, seed=0,
                  progress=False, parallel=False)  # fmt: skip
    back = load(save(tmp_path / "mcmc.pt", result, metadata={"run": 1}))
    assert list(back.samples) == list(result.samples)
    for saved, got in ((result.samples, back.samples), (result.sample_stats, back.sample_stats)):
        assert all(torch.equal(v, got[k]) and v.dtype == got[k].dtype for k, v in saved.items())
    assert (back.kernel, back.warmup_steps, back.seconds) == ("nuts", 6, result.seconds)
    assert back.metadata == {"run": 1} and back.divergences == result.divergences
    torch.manual_seed(1)
    before = predict(model, x, posterior_samples=result, progress=False)
    torch.manual_seed(1)
    after = predict(model, x, posterior_samples=back, progress=False)
    assert torch.equal(before.loc, after.loc) and torch.equal(before.scale, after.scale)


@pytest.mark.parametrize("kind", ["bayesian", "rank1", "front door", "likelihood"])
@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_hand_set_default_kl_weight_survives_save_and_load(tmp_path, kind):
    skeleton = None if kind == "front door" else (lambda: net(1 if kind == "likelihood" else 2))
    if kind == "likelihood":
        likelihood = Gaussian(0.3)
        likelihood.default_kl_weight = 0.1  # fit()'s kl_weight by default: 1.0 otherwise
        model = bayesian(net(), likelihood=likelihood)
    else:
        model = {"bayesian": lambda: bayesian(net(2)), "rank1": lambda: rank1(net(2), 2),
                 "front door": lambda: BayesianMLP(3, 6, 2)}[kind]()  # fmt: skip
        model.default_kl_weight = 0.3  # 0.02 (a classifier's) or 1.0 (rank-1) otherwise
    wanted = default_kl_weight(model)
    save(tmp_path / "k.pt", model)
    back = load(tmp_path / "k.pt", module=skeleton and skeleton())
    assert default_kl_weight(back.model) == wanted
    save(tmp_path / "again.pt", back.model)
    again = load(tmp_path / "again.pt", module=skeleton and skeleton())
    assert default_kl_weight(again.model) == wanted


@pytest.mark.filterwarnings(r"ignore:save\(\).*saved without a guide")  # model alone
def test_a_flipped_byte_in_a_pickled_class_name_is_reported_as_damage(tmp_path):
    path = save(tmp_path / "c.pt", BayesianMLP(3, 6, 2))
    raw = path.read_bytes()
    assert b"collections\nOrderedDict" in raw
    path.write_bytes(raw.replace(b"collections\nOrderedDict", b"collections\nOrderedDicu"))
    with pytest.raises(CheckpointError) as err:
        load(path)
    message = str(err.value)
    assert "truncated or corrupted" in message and "fails its checksum" in message
    assert "pickled Python objects" not in message
