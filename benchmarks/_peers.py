"""Optional peers timed beside pyrouq when importable (never a dependency of pyrouq).

torch-uncertainty's ``bayesian_lenet`` with its ``ELBOLoss`` (per-example convention,
``kl_weight=1/10000`` and 3 samples in its tutorial).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

TU_KL_WEIGHT = 1e-4


def torch_uncertainty_available() -> bool:
    try:
        import torch_uncertainty.losses
        import torch_uncertainty.models.classification.lenet  # noqa: F401
    except Exception:  # any import failure: the peer is simply not timed
        return False
    return True


def tu_train_epoch(train: Iterable, num_samples: int) -> Callable[[], None]:
    """One epoch of torch-uncertainty's Bayesian LeNet with its ELBO loss (Adam, lr 2e-2)."""
    from torch_uncertainty.losses import ELBOLoss
    from torch_uncertainty.models.classification.lenet import bayesian_lenet

    model = bayesian_lenet(1, 10)
    model.train()
    loss = ELBOLoss(model, torch.nn.CrossEntropyLoss(), TU_KL_WEIGHT, num_samples)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)

    def epoch() -> None:
        for x, y in train:
            optimizer.zero_grad()
            loss(x, y).backward()
            optimizer.step()

    return epoch


def tu_predict(x: torch.Tensor, num_samples: int, batch_size: int) -> Callable[[], None]:
    """S stochastic forward passes of torch-uncertainty's Bayesian LeNet over ``x``."""
    from torch_uncertainty.models.classification.lenet import bayesian_lenet

    model = bayesian_lenet(1, 10, num_samples=num_samples).eval()

    @torch.no_grad()
    def run() -> None:
        for start in range(0, x.shape[0], batch_size):
            model(x[start : start + batch_size]).softmax(-1)

    return run
