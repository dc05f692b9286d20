"""pyrouq: Bayesian uncertainty for PyTorch, built on Pyro.

Shape convention: S posterior draws or ensemble members, N inputs, C classes.

The public names are re-exported here; see ``__all__``. arviz and matplotlib are imported only
by :mod:`pyrouq.diagnostics` and :mod:`pyrouq.plotting`, on first use.
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
from pyrouq.diagnostics import PSISResult, psis_diagnostic, summary, to_inference_data
from pyrouq.infer import (
    EpochRecord,
    FitResult,
    KLWeightedELBO,
    MeanFieldGuide,
    fit,
    mean_field_guide,
)
from pyrouq.metrics import evaluate, format_table
from pyrouq.models import (
    MLP,
    BatchEnsembleLeNet,
    BatchEnsembleMLP,
    BatchEnsembleNetwork,
    BayesianLeNet,
    BayesianMLP,
    LeNet,
    batchensemble,
)
from pyrouq.nn import BatchEnsembleConv2d, BatchEnsembleLinear, BayesianConv2d, BayesianLinear
from pyrouq.predictive import Predictions, predict
from pyrouq.uncertainty import Decomposition, decompose

__all__ = [
    "MLP",
    "BatchEnsembleConv2d",
    "BatchEnsembleLeNet",
    "BatchEnsembleLinear",
    "BatchEnsembleMLP",
    "BatchEnsembleNetwork",
    "BayesianConv2d",
    "BayesianLeNet",
    "BayesianLinear",
    "BayesianMLP",
    "Decomposition",
    "EpochRecord",
    "FitResult",
    "KLWeightedELBO",
    "LeNet",
    "MeanFieldGuide",
    "PSISResult",
    "Predictions",
    "__version__",
    "batchensemble",
    "decompose",
    "evaluate",
    "fashion_mnist_arrays",
    "fit",
    "format_table",
    "load_fashion_mnist",
    "load_mnist",
    "mean_field_guide",
    "mnist_arrays",
    "ood_loader",
    "predict",
    "psis_diagnostic",
    "summary",
    "to_inference_data",
]
