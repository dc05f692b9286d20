"""Eleventh audit: normalisation layers (BatchNorm with and without running statistics,
momentum=None, affine=False, SyncBatchNorm outside a process group) through fit(), predict(),
save / load and resume, against plain torch run by hand with the same weights."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from _toy import ListLoader
from torch import nn

import pyrouq
from pyrouq import batchensemble, bayesian, fit, mean_field_guide, predict

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

X = torch.randn(24, 4, generator=torch.Generator().manual_seed(0))
Y = (X[:, 0] > 0).long()


def _net(sync=False, **bn):
    torch.manual_seed(1)
    net = nn.Sequential(
        nn.Linear(4, 6, bias=False), nn.BatchNorm1d(6, momentum=None, **bn), nn.ReLU(),
        nn.Linear(6, 2, bias=False), nn.BatchNorm1d(2, affine=False),
    )  # fmt: skip
    return nn.SyncBatchNorm.convert_sync_batchnorm(net) if sync else net


@pytest.mark.parametrize("sync", [False, True])
def test_a_plain_network_with_batchnorm_trains_as_a_hand_adam_loop(sync):
    # fit() of a plain network is maximum likelihood, -(N/B) sum log p, by torch's Adam: the
    # parameters and running statistics (momentum None: the cumulative average; affine=False)
    # are a hand loop's on the same batches; a SyncBatchNorm outside a process group is a
    # BatchNorm. (The layers before the norms have no bias: its gradient is 0 up to rounding,
    # which Adam would blow up into steps of lr.)
    net, ref = _net(sync), _net()
    batches = ListLoader(X, Y, 8)
    fit(net, None, batches, epochs=2, lr=0.05, lr_schedule="constant", progress=False)
    optim = torch.optim.Adam(ref.parameters(), lr=0.05)
    for _ in range(2):
        for xb, yb in batches:
            optim.zero_grad()
            (F.cross_entropy(ref(xb), yb, reduction="sum") * 24 / len(xb)).backward()
            optim.step()
    got = net.state_dict()
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)
    assert int(got["1.num_batches_tracked"]) == 6 and not net.training


def _without_running_statistics():
    torch.manual_seed(2)
    return nn.Sequential(
        nn.Linear(4, 6), nn.BatchNorm1d(6, track_running_stats=False), nn.ReLU(), nn.Linear(6, 2)
    )


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble"])
def test_predict_normalises_each_batch_of_x_without_running_statistics(kind):
    # eval mode, as torch: a BatchNorm without running statistics takes each batch's own
    net = _without_running_statistics()
    if kind == "bayesian":
        model = bayesian(net)
        guide = mean_field_guide(model, init_scale=1e-20)  # every draw at the means
        got = predict(model, X, guide, num_samples=2, batch_size=8, progress=False).probs[0]
    else:
        model, guide = batchensemble(net, 2, r_std=0.0, s_std=0.0), None  # members = net
        got = predict(model, X, batch_size=8, progress=False).probs[0]
    net.eval()
    with torch.no_grad():
        expected = torch.cat([net(X[i : i + 8]).softmax(-1) for i in (0, 8, 16)])
        whole = net(X).softmax(-1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, whole, atol=1e-3)  # the batch matters


@pytest.mark.parametrize("kind", ["bayesian", "batchensemble", "plain"])
def test_a_batch_of_one_input_without_running_statistics_is_told_in_predicts_words(kind):
    net = _without_running_statistics()
    model = {"bayesian": bayesian, "batchensemble": lambda n: batchensemble(n, 2)}.get(
        kind, lambda n: n
    )(net)
    guide = mean_field_guide(model) if kind == "bayesian" else None
    samples = 2 if kind == "bayesian" else None
    with pytest.raises(ValueError) as info:  # 17 = 2 * 8 + 1
        predict(model, X[:17], guide, num_samples=samples, batch_size=8, progress=False)
    message = str(info.value)
    assert message.startswith("predict(): batch 3 of x holds 1 input of shape (4,)")
    assert "track_running_stats=False" in message
    assert "batch_size=8 leaves 1 of x's 17 inputs alone" in message
    assert isinstance(info.value.__cause__, ValueError)  # torch's own words kept beneath
    # a batch of one of batchnorm_data keeps its own words (the network has running
    # statistics there): pyrouq's refusal, not x's
    if kind == "bayesian":
        tracked = bayesian(_net())
        with pytest.raises(ValueError, match="batchnorm_data whose batches hold one input"):
            predict(tracked, X[:4], mean_field_guide(tracked), num_samples=1,
                    batchnorm_data=X[:1], progress=False)  # fmt: skip


def test_predict_uses_running_statistics_and_leaves_modes_and_buffers_alone():
    net = _net()
    model = bayesian(net)
    guide = mean_field_guide(model, init_scale=1e-20)
    fit(model, guide, ListLoader(X, Y, 8), epochs=1, progress=False, seed=0)
    model.train()  # left in training mode by the user: predict() runs eval, puts it back
    model.net[4].eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probs = predict(model, X, guide, num_samples=3, batch_size=5, progress=False).probs
    assert model.training and model.net[1].training and not model.net[4].training
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    plain = copy.deepcopy(net)
    weights = {k.removeprefix("net."): v for k, v in model.net.state_dict().items()}
    weights |= guide.means()
    plain.load_state_dict(weights)
    with torch.no_grad():
        expected = plain.eval()(X).softmax(-1)
    for s in range(3):
        torch.testing.assert_close(probs[s], expected, rtol=1e-5, atol=1e-6)


class _Stop:
    def __call__(self, record):
        if record.epoch == 1:
            raise KeyboardInterrupt


@pytest.mark.parametrize("kind", ["bayesian", "per_member", "shared"])
def test_resume_and_load_keep_cumulative_statistics_and_their_counts(kind, tmp_path):
    # momentum=None averages over num_batches_tracked: a run resumed from its checkpoint
    # must find the count as it was to end where the unbroken run ends
    def build():
        torch.manual_seed(3)
        if kind == "bayesian":
            model = bayesian(_net())
            return model, mean_field_guide(model)
        return batchensemble(_net(), 2, norms=kind), None

    def loader():
        return pyrouq.ArrayLoader(X, Y, batch_size=8, seed=0)

    whole, whole_guide = build()
    fit(whole, whole_guide, loader(), epochs=2, progress=False, seed=0)
    broken, broken_guide = build()
    with pytest.raises(pyrouq.TrainingInterrupted):
        fit(broken, broken_guide, loader(), epochs=2, progress=False, seed=0,
            checkpoint=tmp_path / "run.pt", callbacks=[_Stop()])  # fmt: skip
    resumed, resumed_guide = build()
    fit(resumed, resumed_guide, loader(), epochs=2, progress=False, seed=0,
        resume_from=tmp_path / "run.pt")  # fmt: skip
    pyrouq.save(tmp_path / "whole.pt", whole, whole_guide)
    loaded = pyrouq.load(tmp_path / "whole.pt", module=_net()).model
    counts = [int(v) for k, v in resumed.state_dict().items() if k.endswith("batches_tracked")]
    assert counts == [6] * (2 if kind == "shared" or kind == "bayesian" else 4)
    for other in (resumed, loaded):
        got = other.state_dict()
        for key, value in whole.state_dict().items():
            assert torch.equal(got[key], value), key
