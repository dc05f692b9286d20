"""Helpers shared by the CLI tests (not a test module): a command's one-line refusal, and a
network that presses Ctrl-C inside a training run, with its factory for `pyrouq fit
_cli:ctrl_c_net`."""

from __future__ import annotations

import os
import signal

from torch import nn

from pyrouq.cli import main


def one_line_error(capsys, argv):
    assert main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyrouq: error: ") and err.count("\n") == 1, err
    return err


class CtrlCAt(nn.Module):
    """An MNIST network with BatchNorm and dropout that sends this process SIGINT (Ctrl-C) in
    its ``at``-th forward pass in training mode (0: never); ``width`` hidden units. From its
    ``nan_at``-th such pass on, its outputs are NaN; in its ``raise_at``-th it raises
    KeyboardInterrupt, as a second Ctrl-C inside a step does (0: never)."""

    at = 0
    width = 16
    nan_at = 0
    raise_at = 0

    def __init__(self):
        super().__init__()
        w = CtrlCAt.width
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(784, w), nn.BatchNorm1d(w), nn.ReLU(), nn.Dropout(0.3),
            nn.Linear(w, 10),
        )  # fmt: skip
        self.passes = 0

    def forward(self, x):
        if self.training:
            self.passes += 1
            if self.passes == CtrlCAt.at:
                os.kill(os.getpid(), signal.SIGINT)
            if self.passes == CtrlCAt.raise_at:
                raise KeyboardInterrupt
            if 0 < CtrlCAt.nan_at <= self.passes:
                return self.body(x) * float("nan")
        return self.body(x)


def ctrl_c_net() -> nn.Module:  # `pyrouq fit _cli:ctrl_c_net`
    return CtrlCAt()


def ctrl_c_net_at_3() -> nn.Module:  # `pyrouq fit _cli:ctrl_c_net_at_3`: Ctrl-C at pass 3
    CtrlCAt.at = 3
    return CtrlCAt()
