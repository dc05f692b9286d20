from __future__ import annotations

import pyro
import pytest
import torch
from pyro import poutine
from torch import nn

from pyrouq.infer import mean_field_guide
from pyrouq.models import MLP, BatchEnsembleMLP, BayesianLeNet, BayesianMLP
from pyrouq.predictive import DEFAULT_NUM_SAMPLES, Predictions, predict


def tiny_bayes():
    return BayesianMLP(in_features=4, hidden_features=8, out_features=3)


def test_bayesian_predict_shapes_and_default_draws():
    model = tiny_bayes()
    guide = mean_field_guide(model, init_scale=0.3)
    x = torch.randn(10, 4)
    p = predict(model, x, guide)
    assert p.probs.shape == (DEFAULT_NUM_SAMPLES, 10, 3)
    torch.testing.assert_close(p.probs.sum(-1), torch.ones(DEFAULT_NUM_SAMPLES, 10))
    assert p.mean_probs.shape == (10, 3) and p.predicted.shape == (10,)
    # draws differ (a real posterior) ...
    assert not torch.allclose(p.probs[0], p.probs[1])


def test_same_draws_serve_every_batch_and_parallel_equals_sequential():
    model = BayesianLeNet()
    guide = mean_field_guide(model, init_scale=0.05)
    x = torch.randn(12, 1, 28, 28)
    pyro.set_rng_seed(3)
    whole = predict(model, x, guide, num_samples=5, batch_size=12, parallel=False)
    pyro.set_rng_seed(3)
    batched = predict(model, x, guide, num_samples=5, batch_size=4, parallel=True)
    torch.testing.assert_close(whole.probs, batched.probs, rtol=1e-4, atol=1e-5)


def test_draw_s_is_one_network():
    """probs[s] equals the model run on its own with the s-th guide draw."""
    model = tiny_bayes()
    guide = mean_field_guide(model, init_scale=0.3)
    x = torch.randn(6, 4)
    pyro.set_rng_seed(0)
    p = predict(model, x, guide, num_samples=3, batch_size=2)
    pyro.set_rng_seed(0)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(3)]
    for s, trace in enumerate(traces):
        expected = poutine.replay(model, trace=trace)(x).softmax(-1)
        torch.testing.assert_close(p.probs[s], expected)


def test_batchensemble_members_are_the_draws():
    model = BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=3, num_members=4)
    x = torch.randn(7, 4)
    p = predict(model, x, batch_size=3)
    assert p.probs.shape == (4, 7, 3)
    torch.testing.assert_close(p.probs, model(x).softmax(-1))
    with pytest.raises(ValueError, match=r"num_samples=8 given for a BatchEnsemble: its 4 members"):
        predict(model, x, num_samples=8)


def test_plain_network_is_one_draw():
    net = MLP(in_features=4, hidden_features=8, out_features=3)
    x = torch.randn(5, 4)
    p = predict(net, x)
    assert p.probs.shape == (1, 5, 3)
    torch.testing.assert_close(p.probs[0], net(x).softmax(-1))
    assert p.uncertainty().epistemic.abs().max() < 1e-6
    with pytest.raises(ValueError, match="deterministic network"):
        predict(net, x, num_samples=3)


def test_any_pyro_model_recording_logits():
    def model(x, y=None):
        w = pyro.sample("w", pyro.distributions.Normal(torch.zeros(4, 2), 1.0).to_event(2))
        logits = x @ w
        with pyro.plate("data", x.shape[0]):
            pyro.deterministic("logits", logits, event_dim=1)
            pyro.sample("obs", pyro.distributions.Categorical(logits=logits), obs=y)

    guide = pyro.infer.autoguide.AutoNormal(model)
    x = torch.randn(6, 4)
    guide(x, torch.randint(0, 2, (6,)))
    p = predict(model, x, guide, num_samples=4)
    assert p.probs.shape == (4, 6, 2)


def test_loader_input_keeps_targets_and_device():
    model = tiny_bayes()
    guide = mean_field_guide(model)
    x, y = torch.randn(9, 4), torch.randint(0, 3, (9,))
    loader = [(x[:5], y[:5]), (x[5:], y[5:])]
    p = predict(model, loader, guide, num_samples=2)
    assert torch.equal(p.targets, y)
    assert p.probs.device == x.device
    metrics = p.evaluate()
    assert set(metrics) >= {"acc", "nll", "ece"}


def test_from_probs_and_uncertainty():
    probs = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5]]])
    p = Predictions.from_probs(probs)
    d = p.uncertainty("entropy", base=2)
    # input 0: members disagree completely -> 1 bit epistemic, 0 aleatoric
    torch.testing.assert_close(d.epistemic, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(d.aleatoric, torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(d.total, d.aleatoric + d.epistemic)
    with pytest.raises(ValueError, match="No targets"):
        p.evaluate()


def test_bad_inputs():
    model = tiny_bayes()
    guide = mean_field_guide(model)
    with pytest.raises(ValueError, match="has latent sites: pass its fitted guide"):
        predict(model, torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"Expected batch_size to be a positive integer, got 0"):
        predict(model, torch.randn(2, 4), guide, batch_size=0)
    with pytest.raises(ValueError, match=r"Expected num_samples to be a positive integer"):
        predict(model, torch.randn(2, 4), guide, num_samples=0)
    with pytest.raises(ValueError, match="x is empty"):
        predict(model, torch.randn(0, 4), guide)
    with pytest.raises(ValueError, match=r"shape \(S, N, C\)"):
        Predictions.from_probs(torch.ones(3, 2) / 2)
    with pytest.raises(TypeError, match=r"must return logits of shape \(B, C\)"):
        predict(nn.Flatten(0), torch.randn(2, 4))


def test_model_left_in_its_mode():
    net = MLP(in_features=4, hidden_features=8, out_features=3)
    net.train()
    predict(net, torch.randn(2, 4))
    assert net.training
