from __future__ import annotations

import time

import pyro
import pytest
import torch
from _toy import ListLoader
from pyro import poutine
from torch import nn

import pyrouq
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


def test_draws_are_the_guide_runs_to_the_bit():
    """predict's S draws are those of S runs of the guide, bit for bit (sites of sizes that
    are not multiples of 16, where the standard-normal draw has a tail of its own)."""
    net = nn.Sequential(nn.Conv2d(1, 5, 3), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 4 * 4, 3))
    model = pyrouq.bayesian(net)
    guide = mean_field_guide(model, init_scale=0.3)
    x = torch.randn(6, 1, 6, 6)
    pyro.set_rng_seed(0)
    p = predict(model, x, guide, num_samples=3, batch_size=6, parallel=False, progress=False)
    pyro.set_rng_seed(0)
    traces = [poutine.trace(guide).get_trace(x) for _ in range(3)]
    for s, trace in enumerate(traces):
        with torch.no_grad():
            expected = poutine.replay(model, trace=trace)(x).softmax(-1)
        assert torch.equal(p.probs[s], expected)


def test_batchensemble_members_are_the_draws():
    model = BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=3, num_members=4)
    x = torch.randn(7, 4)
    p = predict(model, x, batch_size=3)
    assert p.probs.shape == (4, 7, 3)
    torch.testing.assert_close(p.probs, model(x).softmax(-1))
    with pytest.raises(ValueError, match=r"num_samples=8 given for a BatchEnsemble: its 4 members"):
        predict(model, x, num_samples=8)


@pytest.mark.parametrize("bad", [0, True, 2.5])
def test_a_num_samples_that_is_no_count_is_told_to_leave_it_out_where_any_count_is_refused(bad):
    """A BatchEnsemble, a plain network or posterior_samples take no num_samples: its refusal
    of one that is no positive integer advised num_samples=32, which the next check refuses."""
    ensemble = BatchEnsembleMLP(in_features=4, hidden_features=8, out_features=3, num_members=4)
    net = MLP(in_features=4, hidden_features=8, out_features=3)
    bayes = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    draws = {site: torch.zeros(2, *shape) for site, shape in bayes.latent_sites().items()}
    x = torch.randn(3, 4)
    for call, words in (
        (lambda: predict(ensemble, x, num_samples=bad), "members are fixed, not sampled, so S = 4"),
        (lambda: predict(net, x, num_samples=bad), "deterministic network (MLP) gives S = 1"),
        (
            lambda: predict(bayes, x, posterior_samples=draws, num_samples=bad),
            "the number of draws in posterior_samples",
        ),
    ):
        with pytest.raises(ValueError, match="positive integer") as refusal:
            call()
        assert "Leave it out: " in str(refusal.value) and words in str(refusal.value)
        assert "num_samples=32" not in str(refusal.value)
    guide = mean_field_guide(bayes)  # where draws are taken, a number of them is the advice
    with pytest.raises(ValueError, match=r"Pass e.g. num_samples=32 \(draws\), or leave it out"):
        predict(bayes, x, guide, num_samples=bad)


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
    # without a guide, a Pyro model written as a function runs S times from its prior, as a
    # PyroModule does: S draws that differ, each one network on every input batch (its
    # weights drawn once, on the first batch)
    pyro.set_rng_seed(0)
    prior = predict(model, x, num_samples=5)
    assert prior.probs.shape == (5, 6, 2)
    assert not torch.allclose(prior.probs[0], prior.probs[1])
    # each draw is a network x @ w: its log-probabilities' class difference is linear in x
    gaps = prior.probs.log().diff(dim=-1).squeeze(-1)  # (S, N)
    w_gap = torch.linalg.lstsq(x, gaps.T).solution  # (4, S)
    torch.testing.assert_close(x @ w_gap, gaps.T, rtol=1e-4, atol=1e-4)
    # the same networks whatever the batch size: a run also samples "obs", one value per
    # input of the first batch, which moves none of the draws
    for batch_size in (2, 5):
        pyro.set_rng_seed(0)
        split = predict(model, x, num_samples=5, batch_size=batch_size)
        torch.testing.assert_close(split.probs, prior.probs)


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
    torch.testing.assert_close(d.total, torch.tensor([1.0, 1.0]))  # p̄ = [.5, .5] for both
    torch.testing.assert_close(d.total, d.aleatoric + d.epistemic)
    with pytest.raises(ValueError, match="No targets"):
        p.evaluate()


def test_predictions_in_float64_keep_their_class_targets():
    probs = torch.tensor([[[0.7, 0.3], [0.2, 0.8]]])
    p = Predictions(probs, torch.tensor([0, 1]))
    for wide in (p.double(), p.to(torch.float64)):
        assert wide.probs.dtype == torch.float64 and wide.targets.dtype == torch.int64
        torch.testing.assert_close(wide.probs, probs.double())
        assert wide.evaluate()["acc"] == 1.0


def test_predicted_class_is_the_metrics_one_in_a_near_tie():
    # seven draws whose means of classes 0 and 1 are 1e-8 apart: float64 puts class 0 ahead,
    # the float32 mean class 1 (found by a seeded search over near-ties)
    two = [[0.3386770188808441, 0.4851120710372925], [0.2810700833797455, 0.4355899691581726],
           [0.2232152819633484, 0.48594731092453003], [0.4851120412349701, 0.33867695927619934],
           [0.250932902097702, 0.2810700833797455], [0.48594728112220764, 0.250932902097702],
           [0.435589998960495, 0.22321531176567078]]  # fmt: skip
    probs = torch.tensor(two)
    probs = torch.cat([probs, 1 - probs.sum(-1, keepdim=True)], -1)[:, None, :]
    assert probs.mean(0).argmax(-1).tolist() == [1]  # the float32 mean
    p = Predictions(probs, torch.tensor([0]))
    by_metrics = int(p.probs.double().mean(0).argmax(-1))
    assert by_metrics == 0 and pyrouq.metrics.acc(p, torch.tensor([0])) == 1.0
    assert p.predicted.tolist() == [by_metrics]
    # metrics.evaluate takes the targets the predictions carry, as Predictions.evaluate does
    assert pyrouq.metrics.evaluate(p) == p.evaluate()
    with pytest.raises(ValueError, match=r"No targets: pass targets=\(N,\) labels"):
        pyrouq.metrics.evaluate(p.probs)
    gaussian = pyrouq.GaussianPredictions(torch.zeros(2, 3, 1), torch.ones(2, 3, 1))
    with pytest.raises(ValueError, match=r"\(N, D\)"):  # a regression's own message
        pyrouq.metrics.evaluate(gaussian)


def test_a_network_changing_its_input_in_place_sees_it_as_it_came_in_every_chunk():
    class Standardise(nn.Module):  # an in-place first op
        def forward(self, x):
            return x.sub_(0.5).mul_(2.0)

    torch.manual_seed(0)
    model = pyrouq.bayesian(nn.Sequential(Standardise(), nn.Linear(4, 3), nn.BatchNorm1d(3)))
    guide = mean_field_guide(model)
    x0 = torch.randn(6, 4)
    passes = []
    for limit in ({}, {"max_draw_bytes": 1}):  # all draws in one pass over x, or one a pass
        x = x0.clone()
        pyro.set_rng_seed(0)
        passes.append(predict(model, x, guide, num_samples=4, **limit).probs)
        torch.testing.assert_close(x, (x0 - 0.5) * 2.0)  # once, as calling the network would
    assert torch.equal(passes[1], passes[0])
    y0 = torch.tensor([0, 1, 2, 0, 1, 2])  # a list of batches, of pairs, a loader of views
    for make in (lambda: [x0[:4].clone(), (x0[4:].clone(), y0[4:])],
                 lambda: ListLoader(x0.clone(), y0, 4)):  # fmt: skip
        pyro.set_rng_seed(0)
        chunked = predict(model, make(), guide, num_samples=4, max_draw_bytes=1).probs
        assert torch.equal(chunked, passes[0])
    # batchnorm_data is read once a draw, each time as it came, and left as it was
    same = {k: torch.randn(shape).expand(3, *shape) for k, shape in model.latent_sites().items()}
    train = torch.randn(8, 4)
    kept = train.clone()
    refit = predict(model, x0, posterior_samples=same, batchnorm_data=train).probs
    assert torch.equal(train, kept)
    assert torch.equal(refit[1], refit[0]) and torch.equal(refit[2], refit[0])


def test_one_example_without_its_batch_dimension_and_integer_draws_are_told_what_to_do():
    model = pyrouq.bayesian(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    guide = mean_field_guide(model)
    for network, g in ((nn.Linear(4, 3), None), (model, guide)):
        with pytest.raises(
            ValueError, match=r"returned outputs of shape \(3,\) for 4 inputs"
        ) as caught:
            predict(network, torch.randn(4), g)
        assert caught.value.__notes__ == [
            "predict(): x's batches have shape (4,): if x is one example, give it a batch "
            "dimension, x.unsqueeze(0); if it is N examples of one feature, x.unsqueeze(-1)."
        ]
        assert "Swapping" not in str(caught.value)
    whole = {
        k: torch.ones(2, *shape, dtype=torch.long) for k, shape in model.latent_sites().items()
    }
    with pytest.raises(TypeError, match=r"posterior_samples: site '0.weight' holds torch.int64 "
                       r"draws, expected floating-point weights\. Convert them: "
                       r"posterior_samples\['0.weight'\].float\(\)\."):  # fmt: skip
        predict(model, torch.randn(5, 4), posterior_samples=whole)


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
    with pytest.raises(ValueError, match=r"Flatten.forward returned outputs of shape \(8,\) "
                       r"for 2 inputs; pyrouq needs one row of outputs per input, \(2, D\)\. "
                       r"Reshape them to \(B, D\) inside the network\.$"):  # fmt: skip
        predict(nn.Flatten(0), torch.randn(2, 4))


def test_model_left_in_its_mode():
    net = MLP(in_features=4, hidden_features=8, out_features=3)
    net.train()
    predict(net, torch.randn(2, 4))
    assert net.training
    net.eval()
    predict(net, torch.randn(2, 4))
    assert not net.training


def _bn_model(seed=0):
    """A Bayesian conv net with BatchNorm after a short fit (statistics over many draws)."""
    from pyrouq import bayesian, fit

    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)
    )
    model = bayesian(net)
    guide = mean_field_guide(model)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(0, 3, (64,))
    loader = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]
    fit(model, guide, _Sized(loader, 64), epochs=2, progress=False, seed=seed)
    return model, guide, x, loader


class _Sized(list):
    def __init__(self, batches, n):
        super().__init__(batches)
        self.dataset = range(n)


def test_batchnorm_data_reestimates_each_draws_statistics():
    model, guide, x, loader = _bn_model()
    draws = [guide.sample() for _ in range(2)]
    samples = {site: torch.stack([d[site] for d in draws]) for site in draws[0]}
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    default = predict(model, x[:8], posterior_samples=samples)
    refit = predict(model, x[:8], posterior_samples=samples, batchnorm_data=loader,
                    batchnorm_batches=3)  # fmt: skip
    # the model is left as it was: statistics, counters and mode
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # by hand: per draw, reset the statistics, average them over the first 3 batches in train
    # mode, then predict in eval mode
    bn = model.net[1]
    for s, draw in enumerate(draws):
        model.eval()
        bn.reset_running_stats()
        bn.momentum, bn.training = None, True
        with torch.no_grad():
            for xb, _ in loader[:3]:
                model.outputs(xb, draw)
            bn.training = False
            expected = torch.softmax(model.outputs(x[:8], draw), -1)
        torch.testing.assert_close(refit.probs[s], expected, rtol=0, atol=1e-6)
        assert not torch.allclose(default.probs[s], expected, atol=1e-3)
    # the guide path takes its draws as usual, then re-estimates per draw
    pyro.set_rng_seed(1)
    a = predict(model, x, guide, num_samples=3, batchnorm_data=torch.cat([b[0] for b in loader]))
    pyro.set_rng_seed(1)
    b = predict(model, x, guide, num_samples=3, batchnorm_data=torch.cat([b[0] for b in loader]))
    assert torch.equal(a.probs, b.probs) and a.probs.shape == (3, 64, 3)


def test_batchnorm_data_on_a_rank1_network_keeps_members_draw_major():
    from pyrouq import fit, rank1

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    model = rank1(net, 2)
    guide = mean_field_guide(model)
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    fit(model, guide, _Sized([(x[:16], y[:16]), (x[16:], y[16:])], 32), epochs=1,
        progress=False, seed=0)  # fmt: skip
    before = {k: v.clone() for k, v in model.state_dict().items()}
    preds = predict(model, x, guide, num_samples=3, batchnorm_data=x)
    assert preds.probs.shape == (6, 32, 3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # a last batch of one input (BatchNorm1d cannot take its statistics) is left out
    pyro.set_rng_seed(0)
    ragged = predict(model, x, guide, num_samples=3, batchnorm_data=x[:17], batch_size=16)
    pyro.set_rng_seed(0)
    whole = predict(model, x, guide, num_samples=3, batchnorm_data=x[:16], batch_size=16)
    assert torch.equal(ragged.probs, whole.probs)
    with pytest.raises(ValueError, match=r"batches hold one input each: BatchNorm statistics "
                       r"need at least 2 inputs a batch"):  # fmt: skip
        predict(model, x, guide, batchnorm_data=x[:1])


def test_batchnorm_data_refuses_what_it_cannot_use():
    model, guide, x, loader = _bn_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"without posterior draws: .* needs a guide or "
                       r"posterior_samples.*leave batchnorm_data out"):  # fmt: skip
        predict(model.net, x, batchnorm_data=loader)
    plain = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    with pytest.raises(ValueError, match="BayesianMLP has no BatchNorm layer with running "
                       "statistics to re-estimate"):  # fmt: skip
        predict(plain, torch.randn(3, 4), mean_field_guide(plain), batchnorm_data=loader)
    with pytest.raises(TypeError, match="expects batchnorm_data as a tensor or an iterable"):
        predict(model, x, guide, batchnorm_data=[{"x": x}])
    with pytest.raises(ValueError, match="batchnorm_data that holds no inputs: it is empty"):
        predict(model, x, guide, batchnorm_data=[])
    with pytest.raises(ValueError, match="Expected batchnorm_batches to be a positive integer, "
                       "got 0"):  # fmt: skip
        predict(model, x, guide, batchnorm_data=loader, batchnorm_batches=0)
    # a refused run leaves the statistics alone
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class _Slow(nn.Linear):
    def forward(self, x):
        time.sleep(0.9)
        return super().forward(x)


def test_a_long_prediction_shows_a_progress_bar_and_a_quick_one_nothing(capsys):
    net = _Slow(4, 3)
    x = torch.randn(12, 4)
    predict(net, x, batch_size=4)  # 3 batches, about 2.7 s: the bar shows after 2 s
    shown = capsys.readouterr().err
    assert "predict" in shown and "/3" in shown
    predict(net, x, batch_size=4, progress=False)
    predict(nn.Linear(4, 3), x, batch_size=4)  # quick: no bar
    assert capsys.readouterr().err == ""


class _Reads(list):
    """A list of batches that counts how often it is read (a loader with shuffle=False)."""

    shuffle = False

    def __init__(self, batches):
        super().__init__(batches)
        self.reads = 0

    def __iter__(self):
        self.reads += 1
        return super().__iter__()


def _bytes_per_draw(guide):
    return sum(guide.site_loc(s).numel() * 4 for s in guide.sites)


def test_draws_over_max_draw_bytes_are_taken_in_chunks_with_the_same_predictions():
    """A network whose S draws do not fit in max_draw_bytes is predicted chunk by chunk, x
    read once per chunk, with the predictions of one chunk to the bit (and the labels once)."""
    model = tiny_bayes()
    guide = mean_field_guide(model, init_scale=0.3)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    pyro.set_rng_seed(4)
    whole = predict(model, x, guide, num_samples=7, batch_size=4)
    per_draw = _bytes_per_draw(guide)
    for limit in (per_draw, 3 * per_draw - 1, 3 * per_draw):  # chunks of 1, 2 and 3 draws
        pyro.set_rng_seed(4)
        chunked = predict(model, x, guide, num_samples=7, batch_size=4, max_draw_bytes=limit)
        assert torch.equal(chunked.probs, whole.probs)
    batches = _Reads([(x[:4], y[:4]), (x[4:], y[4:])])
    pyro.set_rng_seed(4)
    read = predict(model, batches, guide, num_samples=7, max_draw_bytes=3 * per_draw)
    assert batches.reads == 3  # 3 + 3 + 1 draws
    assert torch.equal(read.probs, whole.probs) and torch.equal(read.targets, y)
    # a DataLoader that does not shuffle takes a seed from the global stream each time it is
    # read; the draws go on where they stopped all the same
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    pyro.set_rng_seed(4)
    once = predict(model, loader, guide, num_samples=7)
    pyro.set_rng_seed(4)
    read = predict(model, loader, guide, num_samples=7, max_draw_bytes=per_draw)
    assert torch.equal(read.probs, once.probs) and torch.equal(read.targets, y)


def test_chunked_draws_of_a_rank1_network_and_a_latent_noise_stay_in_order():
    from pyro import distributions as dist

    from pyrouq import bayesian, rank1
    from pyrouq.likelihoods import Gaussian

    torch.manual_seed(0)
    model = rank1(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), 2)
    guide = mean_field_guide(model, init_scale=0.3)
    x = torch.randn(6, 4)
    pyro.set_rng_seed(2)
    whole = predict(model, x, guide, num_samples=5)
    pyro.set_rng_seed(2)
    chunked = predict(model, x, guide, num_samples=5, max_draw_bytes=2 * _bytes_per_draw(guide))
    assert chunked.probs.shape == (10, 6, 3) and torch.equal(chunked.probs, whole.probs)

    regressor = bayesian(nn.Linear(4, 2), likelihood=Gaussian(dist.HalfNormal(1.0)))
    guide = mean_field_guide(regressor, init_scale=0.3)
    pyro.set_rng_seed(2)
    whole = predict(regressor, x, guide, num_samples=5)
    pyro.set_rng_seed(2)
    chunked = predict(regressor, x, guide, num_samples=5, max_draw_bytes=1)
    assert torch.equal(chunked.loc, whole.loc) and torch.equal(chunked.scale, whole.scale)
    assert chunked.scale[0].sub(chunked.scale[1]).abs().max() > 0  # each draw its own noise


def test_chunked_draws_with_batchnorm_data():
    model, guide, x, _ = _bn_model()
    pyro.set_rng_seed(1)
    whole = predict(model, x, guide, num_samples=3, batchnorm_data=x)
    pyro.set_rng_seed(1)
    chunked = predict(model, x, guide, num_samples=3, batchnorm_data=x, max_draw_bytes=1)
    assert torch.equal(chunked.probs, whole.probs)
    # a shuffling loader as batchnorm_data: read once, every chunk of draws sees its batches
    shuffled = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, *x.shape[1:])), batch_size=8, shuffle=True
    )
    both = []
    for max_draw_bytes in (2**30, 1):
        pyro.set_rng_seed(1)
        both.append(predict(model, x, guide, num_samples=4, batchnorm_data=shuffled,
                            batchnorm_batches=2, max_draw_bytes=max_draw_bytes).probs)  # fmt: skip
    assert torch.equal(both[0], both[1])


def test_draws_over_max_draw_bytes_from_a_loader_read_once_are_held_with_a_warning():
    model = tiny_bayes()
    guide = mean_field_guide(model, init_scale=0.3)
    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    pyro.set_rng_seed(4)
    whole = predict(model, x, guide, num_samples=4)
    shuffled = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=10, shuffle=True
    )
    for source in (shuffled, (b for b in [x[:5], x[5:]])):
        pyro.set_rng_seed(4)
        held = r"predict\(\) holds all 4 weight draws at once \(0\.00 GiB, more than max_draw"
        with pytest.warns(UserWarning, match=held) as record:
            preds = predict(model, source, guide, num_samples=4, max_draw_bytes=1)
        assert record[0].filename == __file__  # the user's line, not torch's no_grad wrapper
        assert preds.probs.shape == (4, 10, 3)
    torch.testing.assert_close(preds.probs, whole.probs)  # the generator: the same inputs
    # a DataLoader given a generator takes its seed from it, not from torch's stream
    in_order = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=4, generator=torch.Generator()
    )
    pyro.set_rng_seed(4)
    torch.testing.assert_close(predict(model, in_order, guide, num_samples=4).probs, whole.probs)
    with pytest.raises(ValueError, match=r"Expected max_draw_bytes to be a positive integer, "
                       r"got 0"):  # fmt: skip
        predict(model, x, guide, max_draw_bytes=0)


def test_float64_posterior_samples_run_a_float32_model():
    """Draws from numpy or arviz are float64: they are taken in the model's dtype."""
    model = tiny_bayes()
    x = torch.randn(5, 4)
    draws = {k: torch.randn(3, *shape) for k, shape in model.latent_sites().items()}
    ours = predict(model, x, posterior_samples={k: v.double() for k, v in draws.items()})
    torch.testing.assert_close(ours.probs, predict(model, x, posterior_samples=draws).probs)
    # numpy's own arrays (arviz's posterior .values) too: a TypeError said "got dict"
    from_numpy = predict(model, x, posterior_samples={k: v.numpy() for k, v in draws.items()})
    torch.testing.assert_close(from_numpy.probs, ours.probs)
    # reversed (negative strides) and big-endian arrays: torch refuses both as they are
    odd = {k: v.double().numpy()[::-1].astype(">f8") for k, v in draws.items()}
    reversed_draws = predict(model, x, posterior_samples=odd)
    torch.testing.assert_close(reversed_draws.probs, ours.probs.flip(0))


class TokenBag(torch.nn.Module):
    """Token indices (B, T) of any length T: mean of their embeddings, then a linear layer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 4)
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, tokens):
        return self.fc(self.emb(tokens).mean(1))


def test_two_input_batches_of_other_widths_are_two_batches_not_a_pair():
    """Token batches of lengths 7 and 9 are two batches of inputs (the (x, y) check refused
    them as a pair for a moment); batches of other ranks are still read as a pair."""
    model = pyrouq.bayesian(TokenBag())
    first, second = torch.randint(0, 20, (4, 7)), torch.randint(0, 20, (4, 9))
    preds = predict(model, [first, second], mean_field_guide(model), num_samples=2,
                    progress=False)  # fmt: skip
    assert preds.probs.shape == (2, 8, 3)
