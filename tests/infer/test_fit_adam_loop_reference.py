"""fit(), the KL-weighted ELBO and the mean-field guide against independent computations (a
second audit), and the defects it found."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample

from pyrouq import BayesianMLP, KLWeightedELBO, bayesian, fit, mean_field_guide


def _batches(n=17, classes=3, size=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 3, generator=g), torch.randint(0, classes, (n,), generator=g)
    return [(x[i : i + size], y[i : i + size]) for i in range(0, n, size)]


def test_fit_is_a_hand_written_fused_adam_loop_on_the_elbo_step_for_step():
    """fit() with a warm-up-cosine schedule, two particles, kl_weight 0.3 and a last batch of
    5 of N = 17 is torch's fused Adam on KLWeightedELBO's gradients, the learning rate set
    before each step: the same parameters to the bit and the same per-epoch mean losses."""
    batches = _batches()

    def make():
        torch.manual_seed(0)
        model = BayesianMLP(in_features=3, hidden_features=5, out_features=3)
        return model, mean_field_guide(model, init_scale=0.05)

    model, guide = make()
    result = fit(model, guide, batches, epochs=3, num_data=17, lr=0.05, kl_weight=0.3,
                 num_particles=2, seed=4, progress=False)  # fmt: skip
    hand_model, hand_guide = make()
    hand_model.num_data = 17
    optimizer = torch.optim.Adam(hand_guide.parameters(), lr=0.05, fused=True)
    elbo = KLWeightedELBO(0.3, 2)
    pyro.set_rng_seed(4)
    total, warmup, losses = 9, 1, []  # w = int(0.2 * 9) = 1
    for step in range(total):
        if step < warmup:
            factor = (step + 1) / warmup
        else:
            factor = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * factor
        optimizer.zero_grad()
        losses.append(float(elbo.terms_and_grads(hand_model, hand_guide, *batches[step % 3]).loss))
        optimizer.step()
    for ours, theirs in zip(guide.parameters(), hand_guide.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    assert result.losses == [sum(losses[i : i + 3]) / 3 for i in (0, 3, 6)]
    assert result.steps == 9 and result.num_data == 17 and result.kl_weight == 0.3


def test_the_kl_of_a_large_site_is_the_closed_form_to_float_rounding():
    """The analytic KL of a 2M-weight layer near its prior (the terms 0.5 scale^2 / s^2 and
    0.5 cancel) was taken from float32 dot products of the whole site: 2.0 nats off the exact
    176942.79 (float64), where summing torch's elementwise KL in float32 is within 0.02 (11M
    weights: 45 to 220 nats off). Now the sums of a large site are taken by rows."""
    torch.manual_seed(0)
    model = BayesianMLP(in_features=1000, hidden_features=2000, out_features=2, num_data=10)
    guide = mean_field_guide(model)
    with torch.no_grad():
        for key, value in guide.state_dict().items():  # (tensors sharing the guide's memory)
            if key.startswith("loc."):
                value.normal_(0, 0.05)
            else:  # rho: scale = softplus(rho), a scale in [0.5, 1.5]
                scale = torch.empty_like(value).uniform_(0.5, 1.5)
                value.copy_(scale + torch.log(-torch.expm1(-scale)))
        assert all(0.5 <= float(guide.site_scale(s).min()) for s in guide.sites)
    x, y = torch.randn(2, 1000), torch.tensor([0, 1])
    kl = KLWeightedELBO().terms(model, guide, x, y).kl
    exact = sum(
        torch.distributions.kl_divergence(
            dist.Normal(guide.site_loc(s).double(), guide.site_scale(s).double()),
            dist.Normal(torch.zeros((), dtype=torch.float64), 1.0),
        ).sum()
        for s in guide.sites
    )
    exact = float(exact.detach())
    assert exact == pytest.approx(176942.79, abs=0.01)  # the 2,002,000 weights drawn above
    assert abs(float(kl) - exact) < 0.1


def test_train_acc_is_the_fraction_of_correct_examples_in_float64():
    """EpochRecord.train_acc was rounded to float32 (8/23 read 0.3478260934352875): it is the
    exact fraction, as the losses are float64 means."""
    torch.manual_seed(0)
    model = BayesianMLP(in_features=3, hidden_features=4, out_features=2).double()
    guide = mean_field_guide(model, init_scale=1e-12)
    x, y = torch.randn(23, 3, dtype=torch.float64), torch.randint(0, 2, (23,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=5)
    record = fit(model, guide, loader, epochs=1, lr=1e-300, lr_schedule="constant",
                 progress=False, seed=0).history[0]  # fmt: skip
    correct = int((model.outputs(x, guide.means()).argmax(-1) == y).sum())
    assert 0 < correct < 23
    assert record.train_acc == correct / 23


class _Regression(PyroModule):
    """A Bayesian linear regression written in Pyro (Pyro's tutorial's)."""

    def __init__(self):
        super().__init__()
        self.lin = PyroModule[torch.nn.Linear](3, 1)
        self.lin.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 3]).to_event(2))
        self.lin.bias = PyroSample(dist.Normal(0.0, 1.0).expand([1]).to_event(1))
        self.num_data = None

    def forward(self, x, y=None):
        mean = self.lin(x).squeeze(-1)
        with pyro.plate("data", self.num_data or len(x), subsample_size=len(x)):
            pyro.sample("obs", dist.Normal(mean, 0.5), obs=y)
        return mean


def test_a_non_finite_loss_from_nan_targets_of_ones_own_regression_names_the_targets():
    """A Pyro regression of one's own judges its targets itself (it may mask missing ones), so
    a NaN target shows as a non-finite loss at the first step, whose message said only
    'Lower lr, check the inputs for NaN/inf' (nothing had been trained; the inputs were
    clean): it names the targets too."""
    torch.manual_seed(0)
    x = torch.randn(23, 3)
    y = x.sum(-1)
    y[4] = math.nan
    pyro.clear_param_store()
    model = _Regression()
    with pytest.raises(FloatingPointError, match=r"epoch 1, step 1.*inputs and targets for NaN"):
        fit(model, AutoNormal(model), [(x[:10], y[:10]), (x[10:], y[10:])], epochs=1,
            num_data=23, progress=False)  # fmt: skip


def test_init_from_takes_a_compiled_network():
    # torch.compile(net) names its parameters "_orig_mod.0.weight": init_from refused it
    def net():
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    model, trained = bayesian(net()), net()  # (the model's own start is not init_from's)
    guide = mean_field_guide(model, init_from=torch.compile(trained))
    assert torch.equal(guide.site_loc("2.weight"), trained[2].weight)
    assert not torch.equal(guide.site_loc("2.weight"), model.net[2].weight)
