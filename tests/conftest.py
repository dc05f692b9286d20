"""Global test state: one torch thread; every test starts seeded, with an empty param store
and validation on."""

from __future__ import annotations

import socket

import pyro
import pytest
import torch
import torch.distributed

# The suite runs on one torch thread, whatever the machine's core count: float reductions
# split across threads round differently (tests comparing runs to the bit would then hang on
# the count), and the tests that start processes (distributed ranks, MCMC chains, the CLI)
# would oversubscribe the cores. One test file used to set this at its import, for every
# test collected with it; tests needing other counts set them and put this one back.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _pyro_state():
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    pyro.enable_validation(True)
    yield
    pyro.enable_validation(False)
    pyro.clear_param_store()


@pytest.fixture(scope="session")
def shared_data():
    """The raw files in ../shared/data (torchvision layout), or skip where they are absent."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (root / "MNIST" / "raw").is_dir():
        pytest.skip(f"{root} not present")
    return root


@pytest.fixture
def gloo_group():
    """A one-process torch.distributed group (gloo, on a free local port) for the test's
    duration: what fit() sees as a process group, without spawning ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
