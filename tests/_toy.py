"""Toy data and models shared by the inference tests (not a test module)."""

from __future__ import annotations

import copy

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from pyro.poutine.messenger import Messenger
from torch import nn
from torch.distributions import constraints

from pyrouq import GaussianPredictions, Predictions
from pyrouq.models import BayesianMLP


def tiny_mlp(**kw):
    return BayesianMLP(in_features=3, hidden_features=20, out_features=2, **kw)


def toy_data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


class ListLoader(list):
    """A list of batches with a sized .dataset, like a DataLoader."""

    def __init__(self, x, y, batch_size):
        super().__init__(
            (x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)
        )
        self.dataset = torch.utils.data.TensorDataset(x, y)


class MisbehavesInAWorker(torch.nn.Linear):
    """A Linear layer that, when it runs in a child process (an MCMC chain worker), ends that
    process at once (``then="exit"``: exit code 3; ``then="kill"``: SIGKILL, as a worker
    killed for memory), raises
    (``then="raise"``) or stalls for ten minutes (``then="stall"``: a chain that would run
    long); in the main process, a plain Linear."""

    def __init__(self, in_features: int, out_features: int, then: str):
        super().__init__(in_features, out_features)
        self.then = then

    def forward(self, x):
        import multiprocessing
        import os
        import time

        if multiprocessing.parent_process() is not None:
            if self.then == "exit":
                os._exit(3)
            if self.then == "kill":
                import signal

                os.kill(os.getpid(), signal.SIGKILL)
            if self.then == "raise":
                raise ArithmeticError("a chain's own error")
            time.sleep(600)
        return super().forward(x)


class StopAfter:
    """A fit() callback that stops the run (as Ctrl-C does) at the end of epoch ``epoch``."""

    def __init__(self, epoch):
        self.epoch = epoch

    def __call__(self, record):
        if record.epoch == self.epoch:
            raise KeyboardInterrupt


def sampled_linear(in_features, out_features, bias_scale=None):
    """``PyroModule[nn.Linear]`` with a Normal(0, 1) ``PyroSample`` weight, and a Normal(0,
    bias_scale) one for its bias when given (else the bias is an ordinary parameter)."""
    layer = PyroModule[nn.Linear](in_features, out_features)
    shape = [out_features, in_features]
    layer.weight = PyroSample(dist.Normal(0.0, 1.0).expand(shape).to_event(2))
    if bias_scale is not None:
        layer.bias = PyroSample(dist.Normal(0.0, bias_scale).expand([out_features]).to_event(1))
    return layer


MCMC_OPTIONS = {"num_samples": 3, "warmup_steps": 3, "seed": 0, "progress": False}
"""The shortest NUTS run the MCMC tests take (3 draws after 3 warm-up steps, seed 0)."""


def regression_data(n=12):
    """``y = x1 - x2 + 0.3 noise`` on ``(n, 2)`` inputs: the MCMC tests' regression."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    return x, x @ torch.tensor([1.0, -1.0]) + 0.3 * torch.randn(n, generator=g)


def regression_model():
    """A Bayesian ``Linear(2, 1)`` with Gaussian noise 0.3 (pyrouq imported lazily)."""
    from pyrouq import Gaussian, bayesian

    return bayesian(nn.Linear(2, 1), likelihood=Gaussian(0.3))


HALF_SITE = 22_000
"""A site whose float16 sums (its KL, its log-densities) pass float16's 65,504."""


def _half_prior(name):
    z, o = torch.zeros(HALF_SITE, dtype=torch.float16), torch.ones(HALF_SITE, dtype=torch.float16)
    return {
        "normal": lambda: dist.Normal(z, o),
        "laplace": lambda: dist.Laplace(z, o),
        "studentt": lambda: dist.StudentT(3 * o, z, o),
    }[name]()


def half_site_model(prior="normal", event=False):
    """A Pyro model of one's own: a float16 site of 22k values (in a plate, or one event of
    ``.to_event(1)``), 60 of which make the logits."""

    def model(x, y=None):
        p = _half_prior(prior)
        if event:
            w = pyro.sample("w", p.to_event(1))
        else:
            with pyro.plate("weights", HALF_SITE):
                w = pyro.sample("w", p)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=x @ w[:60].float().reshape(20, 3)), obs=y)

    return model


def half_site_guide(event=False):
    """A hand-written float16 Normal guide of the same site, at scale 0.01."""

    def guide(x, y=None):
        g = torch.Generator().manual_seed(5)
        loc = pyro.param("loc", lambda: (torch.randn(HALF_SITE, generator=g) * 0.2).half())
        scale = pyro.param(
            "scale",
            lambda: torch.full((HALF_SITE,), 0.01, dtype=torch.float16),
            constraint=constraints.positive,
        )
        q = dist.Normal(loc, scale)
        if event:
            pyro.sample("w", q.to_event(1))
        else:
            with pyro.plate("weights", HALF_SITE):
                pyro.sample("w", q)

    return guide


class EnumeratedMixture(PyroModule):
    """A two-component mixture whose assignment ``z`` is enumerated (``config_enumerate``):
    Pyro's recipe guides it with ``AutoNormal(poutine.block(model, hide=["z"]))``, which
    pyrouq's ELBO (no enumeration) refuses."""

    @pyro.infer.config_enumerate
    def forward(self, x, y=None):
        locs = pyro.sample("locs", dist.Normal(0.0, 5.0).expand([2]).to_event(1))
        with pyro.plate("data", 20, subsample_size=len(x)):
            z = pyro.sample("z", dist.Bernoulli(0.5))
            pyro.sample("y", dist.Normal(locs[z.long()], 1.0), obs=y)


class PyroClassifier(PyroModule):
    """A Pyro user's own Bayesian softmax regression (DESIGN.md's model contract): a
    :func:`sampled_linear` layer with a Normal(0, 1) bias, a ``"data"`` plate and an ``"obs"``
    Categorical site."""

    def __init__(self, in_features=2, num_classes=3):
        super().__init__()
        self.fc = sampled_linear(in_features, num_classes, bias_scale=1.0)

    def forward(self, x, y=None):
        logits = self.fc(x)
        with pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


class RaisesItsOwn(nn.Module):
    """A network whose forward raises ``error``, an error of its own (none about its inputs'
    shape), with a ``Linear(2, out_features)`` to convert."""

    def __init__(self, error, out_features=1):
        super().__init__()
        self.fc = nn.Linear(2, out_features)
        self.error = error

    def forward(self, x):
        raise self.error


def recording_sgd(seen):
    """An ``optim=`` for :func:`pyrouq.fit`: ``torch.optim.SGD`` (lr 0.1) that appends the
    learning rate of every step to the list ``seen``."""

    def optim(params):
        sgd = torch.optim.SGD(params, lr=0.1)
        step = sgd.step

        def recorded(*args, **kwargs):
            seen.append(sgd.param_groups[0]["lr"])
            return step(*args, **kwargs)

        sgd.step = recorded  # type: ignore[method-assign]
        return sgd

    return optim


class LatentScale(Messenger):
    """Scales every latent (unobserved) sample site by ``weight``: what ``kl_weight`` means in
    Pyro's terms."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"]:
            msg["scale"] = msg["scale"] * self.weight


def loaded_copy(net: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    """A copy of ``net`` in eval mode with ``weights`` loaded as its own parameters (the plain
    reference a converted network's draw is compared with)."""
    ref = copy.deepcopy(net)
    state = ref.state_dict()
    state.update(weights)
    ref.load_state_dict(state)
    return ref.eval()


def hand_made_chains(n, num_chains=2, num_draws=4):
    """A Bayesian linear regression (noise 0.5) on ``n`` inputs and chains of draws of its
    weights, as mcmc() returns them, without running a sampler: ``(result, x, y)``; the
    energy of chain c, draw d is ``c * num_draws + d``."""
    import pyrouq

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=g)
    y = x @ torch.tensor([1.0, -1.0]) + 0.3 * torch.randn(n, generator=g)
    model = pyrouq.bayesian(nn.Linear(2, 1), likelihood=pyrouq.Gaussian(0.5))
    shape = (num_chains, num_draws)
    samples = {
        "weight": torch.randn(*shape, 1, 2, generator=g),
        "bias": torch.randn(*shape, 1, generator=g),
    }
    stats = {
        "diverging": torch.zeros(shape, dtype=torch.bool),
        "step_size": torch.full(shape, 0.1, dtype=torch.float64),
        "tree_depth": torch.full(shape, 2),
        "energy": torch.arange(num_chains * num_draws, dtype=torch.float64).reshape(shape),
    }
    result = pyrouq.MCMCResult(samples, stats, "nuts", 10, model=model, x=x, y=y)
    return result, x, y


class Flattened(nn.Module):
    """``layer`` with its outputs flattened to ``(B, -1)``: a bare layer as a network."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x).flatten(1)


class NextParam(nn.Module):
    """A forward reading ``next(self.parameters())`` for the dtype: none is left there where
    every parameter is latent (pyrouq holds latent weights as buffers)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x.to(next(self.parameters()).dtype))


class NoisyMLP(BayesianMLP):
    """A BayesianMLP subclass whose own forward gives logits [0, eps], eps a local site drawn
    per input (the weights sampled, then left out), recorded as "logits"."""

    def forward(self, x, y=None):
        for site, prior in self.priors().items():
            pyro.sample(site, prior)
        with pyro.plate("data", x.shape[0]):
            eps = pyro.sample("eps", dist.Normal(0.0, 1.0))
            logits = torch.stack([torch.zeros_like(eps), eps], -1)
            pyro.deterministic("logits", logits)
            pyro.sample("obs", dist.Categorical(logits=logits), obs=y)
        return logits


def toy_class_predictions(n=20, s=3, c=3):
    """Predictions of ``s`` random draws over ``n`` inputs of ``c`` classes (labels n % c)."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(s, n, c, generator=g), -1)
    return Predictions(probs, torch.arange(n) % c)


def toy_gaussian_predictions(n=20, d=1):
    """GaussianPredictions of 3 random draws over ``n`` inputs of ``d`` outputs."""
    g = torch.Generator().manual_seed(1)
    loc = torch.randn(3, n, d, generator=g)
    scale = torch.rand(3, n, d, generator=g) + 0.5
    return GaussianPredictions(loc, scale, torch.randn(n, d, generator=g))
