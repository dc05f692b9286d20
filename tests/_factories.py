"""Factories for `pyrouq fit package.module:factory` in the CLI tests (not a test module)."""

from __future__ import annotations

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
