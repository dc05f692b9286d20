"""Networks: plain ``MLP`` / ``LeNet`` and their Bayesian and BatchEnsemble front doors, and
the plain ``ResidualCNN``.

``ResidualCNN`` is a residual network with BatchNorm, the "bring your own network" example: it
has no front doors (convert it with :func:`pyrouq.bayesian` / :func:`pyrouq.batchensemble`), and
its checkpoints are loaded with a skeleton, ``load(path, module=ResidualCNN(...))``.

The front doors are thin: ``BayesianLeNet()`` is ``bayesian(LeNet())`` with a Normal prior of
``prior_scale``, ``BatchEnsembleLeNet()`` is ``batchensemble(LeNet(), M)``, with input checks and
a configuration that checkpoints rebuild without a skeleton. Every pyrouq model follows one
contract (see DESIGN.md and :mod:`pyrouq.convert`).

``MLP`` and ``LeNet`` are ``nn.Sequential`` with named layers (``conv1``, ``fc1``, ...), and the
Bayesian models name their latent sites after them (``"conv1.weight"``, ``"fc1.bias"``, ...), so
weights copy across by name.
"""

# The converters live in pyrouq.convert (documented there); importable from here as before.
from pyrouq.convert import BatchEnsembleNetwork as BatchEnsembleNetwork
from pyrouq.convert import BayesianNetwork as BayesianNetwork
from pyrouq.convert import batchensemble as batchensemble
from pyrouq.convert import bayesian as bayesian
from pyrouq.models._batchensemble import BatchEnsembleLeNet, BatchEnsembleMLP
from pyrouq.models._bayesian import DEFAULT_PRIOR_SCALE, BayesianLeNet, BayesianMLP
from pyrouq.models.plain import MLP, LeNet, ResidualCNN

__all__ = [
    "DEFAULT_PRIOR_SCALE",
    "MLP",
    "BatchEnsembleLeNet",
    "BatchEnsembleMLP",
    "BayesianLeNet",
    "BayesianMLP",
    "LeNet",
    "ResidualCNN",
]
