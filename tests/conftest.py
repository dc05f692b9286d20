"""Global test state: one torch thread; every test starts seeded, with an empty param store
and validation on."""

from __future__ import annotations

import pyro
import pytest
import torch

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
