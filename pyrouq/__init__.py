"""pyrouq: Bayesian uncertainty for PyTorch, built on Pyro.

Shape convention: S posterior draws or ensemble members, N inputs, C classes (D outputs for
regression).

The public names are re-exported here; see ``__all__``. arviz and matplotlib are imported only
by :mod:`pyrouq.diagnostics` and :mod:`pyrouq.plotting`, on first use.
"""

__version__ = "0.1.0"

from pyrouq.calibration import (
    ConformalClassifier,
    ConformalRegressor,
    TemperatureScaler,
    class_conditional_coverage,
    conformal,
    coverage,
    mean_set_size,
    temperature_scale,
)
from pyrouq.checkpoint import Checkpoint, CheckpointError, load, save
from pyrouq.convert import (
    BatchEnsembleNetwork,
    BayesianNetwork,
    NoGradLayersWarning,
    batchensemble,
    bayesian,
    rank1,
)
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
    TrainingInterrupted,
    fit,
    mean_field_guide,
)
from pyrouq.likelihoods import Categorical, Gaussian
from pyrouq.mcmc import MCMCResult, mcmc
from pyrouq.metrics import evaluate, format_table
from pyrouq.models import (
    MLP,
    BatchEnsembleLeNet,
    BatchEnsembleMLP,
    BayesianLeNet,
    BayesianMLP,
    LeNet,
    ResidualCNN,
)
from pyrouq.nn import (
    BatchEnsembleConv1d,
    BatchEnsembleConv2d,
    BatchEnsembleConv3d,
    BatchEnsembleConvTranspose1d,
    BatchEnsembleConvTranspose2d,
    BatchEnsembleConvTranspose3d,
    BatchEnsembleLinear,
    BayesianConv2d,
    BayesianLinear,
)
from pyrouq.plotting import (
    plot_calibration,
    plot_image_grid,
    plot_most_uncertain,
    plot_regression,
    plot_reliability,
    plot_risk_coverage,
    plot_rotation,
    plot_training_curves,
    plot_uncertainty_distributions,
    save_figures,
)
from pyrouq.predictive import Predictions, predict
from pyrouq.regression import GaussianPredictions
from pyrouq.rotation import evaluate_rotations, format_rotation_table, rotate
from pyrouq.tabular import ArrayLoader, Standardizer, train_test_split
from pyrouq.uncertainty import Decomposition, decompose

__all__ = [
    "MLP",
    "ArrayLoader",
    "BatchEnsembleConv1d",
    "BatchEnsembleConv2d",
    "BatchEnsembleConv3d",
    "BatchEnsembleConvTranspose1d",
    "BatchEnsembleConvTranspose2d",
    "BatchEnsembleConvTranspose3d",
    "BatchEnsembleLeNet",
    "BatchEnsembleLinear",
    "BatchEnsembleMLP",
    "BatchEnsembleNetwork",
    "BayesianConv2d",
    "BayesianLeNet",
    "BayesianLinear",
    "BayesianMLP",
    "BayesianNetwork",
    "Categorical",
    "Checkpoint",
    "CheckpointError",
    "ConformalClassifier",
    "ConformalRegressor",
    "Decomposition",
    "EpochRecord",
    "FitResult",
    "Gaussian",
    "GaussianPredictions",
    "KLWeightedELBO",
    "LeNet",
    "MCMCResult",
    "MeanFieldGuide",
    "NoGradLayersWarning",
    "PSISResult",
    "Predictions",
    "ResidualCNN",
    "Standardizer",
    "TemperatureScaler",
    "TrainingInterrupted",
    "__version__",
    "batchensemble",
    "bayesian",
    "class_conditional_coverage",
    "conformal",
    "coverage",
    "decompose",
    "evaluate",
    "evaluate_rotations",
    "fashion_mnist_arrays",
    "fit",
    "format_rotation_table",
    "format_table",
    "load",
    "load_fashion_mnist",
    "load_mnist",
    "mcmc",
    "mean_field_guide",
    "mean_set_size",
    "mnist_arrays",
    "ood_loader",
    "plot_calibration",
    "plot_image_grid",
    "plot_most_uncertain",
    "plot_regression",
    "plot_reliability",
    "plot_risk_coverage",
    "plot_rotation",
    "plot_training_curves",
    "plot_uncertainty_distributions",
    "predict",
    "psis_diagnostic",
    "rank1",
    "rotate",
    "save",
    "save_figures",
    "summary",
    "temperature_scale",
    "to_inference_data",
    "train_test_split",
]
