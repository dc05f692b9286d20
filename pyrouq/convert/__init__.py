"""Bring your own network: :func:`bayesian` and :func:`batchensemble` for any ``nn.Module``.

Both deep-copy the module (the original is never changed) and walk its parameters, not its
layer classes, so nested containers, residual connections, normalisation layers and
torchvision models convert as they are:

* :func:`bayesian` makes the selected parameters latent Pyro sites named by their dotted path
  (``layer1.0.conv1.weight``), each with a prior; the others (normalisation layers, anything not
  selected) stay ordinary parameters, trained by :func:`pyrouq.fit` as point estimates. The
  network then runs with sampled weights through :func:`torch.func.functional_call`.
* :func:`batchensemble` puts a BatchEnsemble layer (:mod:`pyrouq.nn`) in place of every
  ``nn.Linear`` and convolution, nested ones included; members are folded into the batch, and
  every member gets its own copy of the normalisation layers (``norms="shared"``: one for all).
* :func:`rank1` composes the two: the rank-1 Bayesian network, a BatchEnsemble whose members'
  factors are latent (``bayesian(batchensemble(module, M, norms="shared"),
  prior=Normal(1, 0.1))``; its members share the normalisation layers by default).

Both results follow the pyrouq model contract (DESIGN.md): ``forward(x, y=None)`` returns
outputs ``(B, D)`` (``(*S, B, D)`` under stacked weight draws) or ``(M, B, D)`` (ensembles),
records them (``"logits"`` for classification) and observes ``y`` at ``"obs"`` inside
``pyro.plate("data")``, scaled N/B, through the model's likelihood.
"""

from pyrouq._engine._layer_calls import NoGradLayersWarning
from pyrouq.convert._batchensemble import BatchEnsembleNetwork, batchensemble
from pyrouq.convert._bayesian import BayesianNetwork, bayesian
from pyrouq.convert._rank1 import DEFAULT_RANK1_PRIOR_SCALE, rank1
from pyrouq.convert._select import (
    DEFAULT_PRIOR_SCALE,
    PriorSpec,
    SelectSpec,
    SitePrior,
    module_record,
    select_parameters,
)

__all__ = [
    "DEFAULT_PRIOR_SCALE",
    "DEFAULT_RANK1_PRIOR_SCALE",
    "BatchEnsembleNetwork",
    "BayesianNetwork",
    "NoGradLayersWarning",
    "PriorSpec",
    "SelectSpec",
    "SitePrior",
    "batchensemble",
    "bayesian",
    "module_record",
    "rank1",
    "select_parameters",
]
