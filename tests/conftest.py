"""Global test state: every test starts seeded, with an empty param store and validation on."""

from __future__ import annotations

import pyro
import pytest


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
