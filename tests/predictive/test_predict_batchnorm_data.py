"""Audit 5: BatchNorm statistics through predict(batchnorm_data=...), checked against plain
torch: SWAG's bn_update weighs every batch by its size."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pyrouq
from pyrouq import mean_field_guide, predict


def _draws(model, count=2):
    guide = mean_field_guide(model)
    with torch.no_grad():
        draws = [guide.sample() for _ in range(count)]
    return {k: torch.stack([d[k] for d in draws]) for k in model.latent_sites()}


def test_batchnorm_data_pools_batches_of_unequal_size_as_swag_does():
    # a BatchNorm first sees the data itself: its re-estimated statistics must be the mean of
    # all the rows and the size-weighted mean of the batches' unbiased variances
    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 4)))
    samples = _draws(model)
    train = torch.randn(11, 3) * torch.tensor([1.0, 3.0, 0.5]) + torch.tensor([2.0, -1.0, 0.0])
    x = torch.randn(5, 3)
    loader = [train[:5], train[5:7], train[7:]]  # 5, 2 and 4 rows
    bn = model.net[0]
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    for data, batch_size in ((loader, 1024), (train, 4)):  # a tensor: 4, 4 and 3 rows
        got = predict(model, x, posterior_samples=samples, batchnorm_data=data,
                      batch_size=batch_size, progress=False).probs  # fmt: skip
        parts = loader if data is loader else list(train.split(4))
        mean = train.double().mean(0)
        var = sum(p.shape[0] * p.double().var(0) for p in parts) / train.shape[0]
        for s in range(2):
            h = (x.double() - mean) / (var + bn.eps).sqrt() * bn.weight.double() + bn.bias.double()
            w, b = samples["1.weight"][s].double(), samples["1.bias"][s].double()
            expected = torch.softmax(h @ w.T + b, -1).float()
            torch.testing.assert_close(got[s], expected, rtol=0, atol=1e-6)
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())
    assert bn.momentum == 0.1 and not bn._forward_pre_hooks


@pytest.mark.parametrize("kind", ["momentum_none", "sync", "residual"])
def test_batchnorm_data_matches_a_hand_bn_update_after_a_latent_layer(kind):
    torch.manual_seed(1)
    if kind == "residual":
        net, shape = pyrouq.ResidualCNN(num_classes=3, width=2), (1, 8, 8)
    else:
        norm = nn.BatchNorm1d(6, momentum=None) if kind == "momentum_none" else nn.SyncBatchNorm(6)
        net, shape = nn.Sequential(nn.Linear(4, 6), norm, nn.ReLU(), nn.Linear(6, 3)), (4,)
    model = pyrouq.bayesian(net)
    samples = _draws(model)
    train, x = torch.randn(11, *shape), torch.randn(4, *shape)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    momenta = [m.momentum for m in norms]
    got = predict(model, x, posterior_samples=samples, batchnorm_data=train, batch_size=4,
                  progress=False).probs  # fmt: skip
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())
    assert [m.momentum for m in norms] == momenta
    for s in range(2):  # SWAG's bn_update by hand: momentum b / (n + b), batches 4, 4, 3
        draw = {k: v[s] for k, v in samples.items()}
        model.eval()
        for m in norms:
            m.reset_running_stats()
            m.train()
        with torch.no_grad():
            for n, batch in zip((0, 4, 8), train.split(4), strict=True):
                for m in norms:
                    m.momentum = batch.shape[0] / (n + batch.shape[0])
                model.outputs(batch, draw)
            model.eval()
            expected = torch.softmax(model.outputs(x, draw), -1)
        model.load_state_dict(kept)
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        torch.testing.assert_close(got[s], expected, rtol=0, atol=1e-6)


def test_a_failing_reestimate_leaves_statistics_momentum_and_modes_as_they_were():
    class Fails(nn.Module):
        calls = 0

        def forward(self, x):
            Fails.calls += 1
            if Fails.calls == 2:
                raise RuntimeError("second pass fails")
            return x

    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6, momentum=None),
                                          Fails(), nn.Dropout(0.5), nn.Linear(6, 3)))  # fmt: skip
    samples = _draws(model)
    model.train()
    model.net[1].eval()  # a BatchNorm kept in eval mode by the user
    modes = [m.training for m in model.modules()]
    kept = {k: v.clone() for k, v in model.state_dict().items()}
    Fails.calls = 0  # the second of the two re-estimating passes fails
    with pytest.raises(RuntimeError, match="second pass fails"):
        predict(model, torch.randn(4, 4), posterior_samples=samples,
                batchnorm_data=torch.randn(8, 4), batch_size=4, progress=False)  # fmt: skip
    bn = model.net[1]
    assert bn.momentum is None and not bn._forward_pre_hooks
    assert [m.training for m in model.modules()] == modes
    assert all(torch.equal(kept[k], v) for k, v in model.state_dict().items())


class _KeywordAndEmptyCalls(nn.Module):
    """Calls its BatchNorm by keyword, first on no rows (a mask that picks none)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        self.bn(input=x[x[:, 0] > 1e9])  # empty: moves nothing
        return self.fc(self.bn(input=x))


def test_batchnorm_data_takes_a_keyword_call_and_an_empty_first_call():
    # the re-estimate's momentum hook read args[0] (IndexError for bn(input=h)) and divided 0
    # rows by 0 rows seen (ZeroDivisionError), where torch's cumulative average ran
    torch.manual_seed(0)
    model = pyrouq.bayesian(_KeywordAndEmptyCalls())
    samples = _draws(model)
    train = torch.randn(7, 3) * 2.0 + 1.0
    x = torch.randn(4, 3)
    got = predict(model, x, posterior_samples=samples, batchnorm_data=[train[:4], train[4:]],
                  progress=False).probs  # fmt: skip
    bn = model.net.bn
    mean = train.double().mean(0)
    var = (4 * train[:4].double().var(0) + 3 * train[4:].double().var(0)) / 7
    for s in range(2):
        h = (x.double() - mean) / (var + bn.eps).sqrt() * bn.weight.double() + bn.bias.double()
        w, b = samples["fc.weight"][s].double(), samples["fc.bias"][s].double()
        expected = torch.softmax(h @ w.T + b, -1).float()
        torch.testing.assert_close(got[s], expected, rtol=0, atol=1e-6)
