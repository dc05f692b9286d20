"""Factories for `pyrouq fit package.module:factory` in the CLI tests (not a test module)."""

from __future__ import annotations

import torch
from torch import nn

from pyrouq import ResidualCNN


def tiny_residual() -> nn.Module:
    return ResidualCNN(width=4)


def needs_weights() -> nn.Module:
    raise FileNotFoundError("weights.pt")


def not_a_module() -> str:
    return "resnet"


def flat_mlp() -> nn.Module:
    """Takes flat (B, 784) inputs: fails on the (B, 1, 28, 28) images the CLI loads."""
    return nn.Sequential(nn.Linear(784, 10))


class _Interrupts(nn.Module):
    """Raises KeyboardInterrupt (as Ctrl-C does) at its first run in training mode, or at its
    first run once trained (its weights moved by an optimizer step)."""

    def __init__(self, when: str):
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.when = when
        self.start = self.fc.weight.detach().clone()

    def forward(self, x):
        trained = not self.fc.weight.detach().equal(self.start)
        if (self.when == "training" and self.training) or (self.when != "training" and trained):
            raise KeyboardInterrupt
        return self.fc(x.flatten(1))


def interrupted_setup() -> nn.Module:
    """Ctrl-C at the network's first run, in fit()'s checks before training starts."""
    return _Interrupts("training")


def interrupted_evaluation() -> nn.Module:
    """Ctrl-C once training is over, when the run is evaluated."""
    return _Interrupts("evaluation")


def five_classes() -> nn.Module:
    """Five outputs per image: MNIST has ten classes."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 5))


def exits() -> nn.Module:
    raise SystemExit(3)


def lazy() -> nn.Module:
    """A lazy layer: its weight takes its shape from the first batch."""
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(10))


NOT_CALLABLE = 3


class _FirstInputScale(nn.Module):
    """Takes its scale from the first input it sees (as Glow's ActNorm does)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(()))
        self.register_buffer("started", torch.zeros((), dtype=torch.bool))

    def forward(self, x):
        if not bool(self.started):
            self.scale.fill_(float(x.std()) + 1e-6)
            self.started.fill_(True)
        return x / self.scale


def first_input_scale() -> nn.Module:
    return nn.Sequential(_FirstInputScale(), nn.Flatten(), nn.Linear(784, 10))


def batchnorm_mlp() -> nn.Module:
    """An MLP with BatchNorm1d, which refuses a batch of one input in training mode."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(784, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10)
    )


def stop_fit_after_first_epoch(monkeypatch) -> None:
    """Make `pyrouq fit` stop after its first epoch as on Ctrl-C (a callback raising
    KeyboardInterrupt, after the command's own callbacks), for the tests of interrupted runs."""
    import pyrouq

    real_fit = pyrouq.fit

    def stopped(*args, callbacks=(), **kwargs):
        def stop(record):
            raise KeyboardInterrupt

        return real_fit(*args, **kwargs, callbacks=[*callbacks, stop])

    monkeypatch.setattr(pyrouq, "fit", stopped)
