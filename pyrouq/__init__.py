"""pyrouq: Bayesian uncertainty for PyTorch, built on Pyro.

The public names are re-exported here; see ``__all__``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from pyrouq.data import (
    fashion_mnist_arrays,
    load_fashion_mnist,
    load_mnist,
    mnist_arrays,
    ood_loader,
)

__all__ = [
    "__version__",
    "fashion_mnist_arrays",
    "load_fashion_mnist",
    "load_mnist",
    "mnist_arrays",
    "ood_loader",
]
