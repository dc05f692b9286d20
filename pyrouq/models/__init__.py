"""Networks: plain ``MLP`` / ``LeNet`` and their Bayesian (Pyro model) counterparts.

Every pyrouq model follows one contract (see DESIGN.md): ``forward(x, y=None) -> logits`` of
shape ``(B, C)`` (Bayesian; ``(S, B, C)`` when the weights carry S draws) or ``(M, B, C)``
(BatchEnsemble, M members); logits are recorded as ``pyro.deterministic("logits")`` and labels
observed at ``"obs"`` inside ``pyro.plate("data")``, scaled by N/B so that a minibatch of B out
of N training points estimates the full-data likelihood.

The plain networks are ``nn.Sequential`` with named layers (``conv1``, ``fc1``, ...), and the
Bayesian models name their latent sites after them (``"conv1.weight"``, ``"fc1.bias"``, ...), so
weights copy across by name.
"""

from pyrouq.models._observe import observe
from pyrouq.models.batchensemble import (
    BatchEnsembleLeNet,
    BatchEnsembleMLP,
    BatchEnsembleNetwork,
    batchensemble,
)
from pyrouq.models.bayesian import DEFAULT_PRIOR_SCALE, BayesianLeNet, BayesianMLP
from pyrouq.models.plain import MLP, LeNet

__all__ = [
    "DEFAULT_PRIOR_SCALE",
    "MLP",
    "BatchEnsembleLeNet",
    "BatchEnsembleMLP",
    "BatchEnsembleNetwork",
    "BayesianLeNet",
    "BayesianMLP",
    "LeNet",
    "batchensemble",
    "observe",
]
