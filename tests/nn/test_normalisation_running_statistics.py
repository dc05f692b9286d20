"""Thirteenth audit: normalisation layers (BatchNorm1d/2d/3d with and without affine parameters,
momentum None or other, InstanceNorm tracking running statistics, GroupNorm, LayerNorm,
LocalResponseNorm) through bayesian(), fit(), predict(), batchensemble() / rank1(), save / load
and mcmc(), each against torch run by hand on the same batches or the same weights."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from _toy import ListLoader, toy_data
from torch import nn
from torch.func import functional_call

from pyrouq import (
    batchensemble,
    bayesian,
    fit,
    load,
    mcmc,
    mean_field_guide,
    predict,
    rank1,
    save,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _images(shape, n=24):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *shape, generator=g)
    return x, (x.flatten(1).mean(1) > 0).long()


FIRST_LAYERS = {
    "bn1d": (lambda: nn.BatchNorm1d(3), (3,)),
    "bn1d_no_affine": (lambda: nn.BatchNorm1d(3, affine=False), (3,)),
    "bn1d_cumulative": (lambda: nn.BatchNorm1d(3, momentum=None), (3,)),
    "bn1d_momentum_0.3": (lambda: nn.BatchNorm1d(3, momentum=0.3), (3,)),
    "bn2d": (lambda: nn.BatchNorm2d(2, momentum=None), (2, 3, 3)),
    "bn3d": (lambda: nn.BatchNorm3d(2), (2, 2, 2, 2)),
    "instancenorm1d": (lambda: nn.InstanceNorm1d(2, affine=True, track_running_stats=True), (2, 5)),
}


@pytest.mark.parametrize("case", list(FIRST_LAYERS))
def test_fit_moves_running_statistics_as_torch_does_on_the_same_batches(case):
    # The first layer sees the raw batches: its statistics after 2 epochs of 2 particles a step
    # are those of a fresh copy of it run in training mode on each batch twice (the look fit()
    # takes at the first examples, in eval mode, moves nothing), to the bit.
    make, shape = FIRST_LAYERS[case]
    x, y = _images(shape) if len(shape) > 1 else toy_data(24)
    torch.manual_seed(1)
    layer = make()
    width = int(torch.tensor(shape).prod())
    net = nn.Sequential(layer, nn.Flatten(), nn.Linear(width, 4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(net)
    batches = ListLoader(x, y, 8)
    fit(model, mean_field_guide(model), batches, epochs=2, num_particles=2, progress=False, seed=0)
    reference = copy.deepcopy(layer).train()
    for _ in range(2):
        for xb, _yb in batches:
            reference(xb)
            reference(xb)
    got = model.net[0]
    assert torch.equal(got.running_mean, reference.running_mean)
    assert torch.equal(got.running_var, reference.running_var)
    assert int(got.num_batches_tracked) == int(reference.num_batches_tracked)
    if isinstance(layer, nn.modules.batchnorm._BatchNorm):
        assert int(got.num_batches_tracked) == 12  # 2 epochs x 3 steps x 2 particles
    assert not model.training and not got.training


def _conv_net():
    torch.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, momentum=None),
        nn.InstanceNorm2d(4, affine=True, track_running_stats=True), nn.LocalResponseNorm(2),
        nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.LayerNorm(64), nn.Linear(64, 2),
    )  # fmt: skip


def _fitted_conv_model():
    x, y = _images((1, 6, 6))
    model = bayesian(_conv_net())
    guide = mean_field_guide(model)
    fit(model, guide, ListLoader(x, y, 8), epochs=1, progress=False, seed=0)
    return model, guide, x


def _draws(model, count=3):
    """``count`` fixed weight draws: the template moved by 0.05 per draw."""
    return {
        k: torch.stack([v + 0.05 * s for s in range(count)]) for k, v in model.template().items()
    }


def _by_hand(model, draws, x):
    """Every draw's probabilities from the plain network in eval mode, with the model's
    buffers (running statistics) and point estimates and the draw's weights."""
    plain = copy.deepcopy(model.net).eval()
    state = plain.state_dict()
    out = []
    for s in range(next(iter(draws.values())).shape[0]):
        weights = {**state, **{k: v[s] for k, v in draws.items()}}
        with torch.no_grad():
            out.append(functional_call(plain, weights, (x,)).softmax(-1))
    return torch.stack(out)


def test_predict_runs_every_draw_on_the_running_statistics_and_an_input_alone_as_in_a_batch():
    model, guide, x = _fitted_conv_model()
    before = copy.deepcopy(model.state_dict())
    draws = _draws(model)
    got = predict(model, x, posterior_samples=draws, progress=False).probs
    torch.testing.assert_close(got, _by_hand(model, draws, x), rtol=0, atol=1e-6)
    alone = predict(model, x[5:6], posterior_samples=draws, progress=False).probs
    torch.testing.assert_close(alone, got[:, 5:6], rtol=0, atol=1e-6)
    # the guide's draws too: one input alone, or a batch of one at a time, as in the batch
    kw = {"num_samples": 4, "seed": 2, "progress": False}
    whole = predict(model, x, guide, **kw).probs
    torch.testing.assert_close(predict(model, x[:1], guide, **kw).probs, whole[:, :1])
    torch.testing.assert_close(predict(model, x, guide, batch_size=1, **kw).probs, whole)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing moved


def test_a_reloaded_model_keeps_its_statistics_and_predicts_to_the_bit(tmp_path):
    model, guide, x = _fitted_conv_model()
    save(tmp_path / "m.pt", model, guide)
    ck = load(tmp_path / "m.pt", module=_conv_net())
    for name in ("1", "2"):
        ours, theirs = model.net.get_submodule(name), ck.model.net.get_submodule(name)
        assert torch.equal(ours.running_mean, theirs.running_mean)
        assert torch.equal(ours.running_var, theirs.running_var)
        assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked)
    assert int(ck.model.net[1].num_batches_tracked) == 3 and ck.model.net[1].momentum is None
    kw = {"num_samples": 4, "seed": 2, "progress": False}
    assert torch.equal(
        predict(ck.model, x, ck.guide, **kw).probs, predict(model, x, guide, **kw).probs
    )


@pytest.mark.parametrize(
    ("convert", "norms"),
    [("batchensemble", "per_member"), ("batchensemble", "shared"), ("rank1", "shared"),
     ("rank1", "per_member")],
)  # fmt: skip
def test_members_statistics_are_their_own_rows_or_the_folded_batchs(convert, norms, tmp_path):
    # per_member: each member's copy sees that member's rows, the batch itself (the members
    # differ only after the first converted layer); shared: one layer sees the folded batch, the
    # batch repeated once per member
    x, y = toy_data(24)
    batches = ListLoader(x, y, 8)
    torch.manual_seed(1)
    first = nn.BatchNorm1d(3, momentum=None)

    def net():
        torch.manual_seed(1)
        return nn.Sequential(
            nn.BatchNorm1d(3, momentum=None), nn.Linear(3, 4), nn.GroupNorm(2, 4), nn.ReLU(),
            nn.Linear(4, 2),
        )  # fmt: skip

    if convert == "batchensemble":
        model, guide = batchensemble(net(), 3, norms=norms), None
    else:
        model = rank1(net(), 3, norms=norms)
        guide = mean_field_guide(model)
    fit(model, guide, batches, epochs=2, progress=False, seed=0)
    reference = first.train()
    for _ in range(2):
        for xb, _yb in batches:
            reference(xb if norms == "per_member" else xb.repeat(3, 1))
    layers = list(model.net[0].norms) if norms == "per_member" else [model.net[0]]
    assert len(layers) == (3 if norms == "per_member" else 1)
    for layer in layers:
        assert torch.equal(layer.running_mean, reference.running_mean)
        torch.testing.assert_close(layer.running_var, reference.running_var, rtol=1e-6, atol=0)
        assert int(layer.num_batches_tracked) == 6
    kw = {"num_samples": 2, "seed": 1} if guide is not None else {}
    whole = predict(model, x, guide, progress=False, **kw).probs
    alone = predict(model, x[3:4], guide, progress=False, **kw).probs
    torch.testing.assert_close(alone, whole[:, 3:4], rtol=0, atol=1e-6)
    save(tmp_path / "m.pt", model, guide)
    ck = load(tmp_path / "m.pt", module=net())
    assert torch.equal(predict(ck.model, x, ck.guide, progress=False, **kw).probs, whole)


def test_mcmc_runs_batchnorm_on_its_running_statistics_and_leaves_them_alone():
    x, y = toy_data(16)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    model = bayesian(net)
    with torch.no_grad():
        model.net[1].running_mean.fill_(0.3)
        model.net[1].running_var.fill_(2.0)
    before = copy.deepcopy(model.net[1].state_dict())
    modes: list[bool] = []
    hook = model.net[1].register_forward_pre_hook(lambda m, a: modes.append(m.training))
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = mcmc(
            model, x, y, num_samples=3, warmup_steps=3, num_chains=1, seed=0, progress=False,
            parallel=False,
        )  # fmt: skip
    hook.remove()
    assert modes and not any(modes)  # every pass in eval mode
    assert model.training and model.net[1].training  # modes put back
    after = model.net[1].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    draws = {k: v.reshape(-1, *v.shape[2:]) for k, v in result.samples.items()}
    got = predict(model, x, posterior_samples=result, progress=False).probs
    torch.testing.assert_close(got, _by_hand(model, draws, x), rtol=0, atol=1e-6)


def test_a_non_finite_step_leaves_the_statistics_of_the_last_finite_one():
    x, y = toy_data(24)
    x = x.clone()
    x[10, 1] = float("nan")  # in the second batch of 8
    torch.manual_seed(1)
    first = nn.BatchNorm1d(3, momentum=None)
    model = bayesian(nn.Sequential(copy.deepcopy(first), nn.Linear(3, 2)))
    with pytest.raises(FloatingPointError, match="at epoch 1, step 2"):
        fit(
            model, mean_field_guide(model), ListLoader(x, y, 8), epochs=1, progress=False,
            seed=0, check_inputs=False,
        )  # fmt: skip
    reference = first.train()
    reference(x[:8])
    assert torch.equal(model.net[0].running_mean, reference.running_mean)
    assert torch.equal(model.net[0].running_var, reference.running_var)
    assert int(model.net[0].num_batches_tracked) == 1
