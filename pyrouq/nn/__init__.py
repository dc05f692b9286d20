"""Layers: Bayesian layers (``PyroSample`` weight priors) and BatchEnsemble layers.

Bayesian layers are standalone Pyro modules for hand-written Pyro models; their weight and bias
may carry leading sample dimensions ``(S, ...)`` (vectorised particles, ``Predictive(parallel=
True)``), and the output then is ``(S, B, ...)``. (Networks made Bayesian by
:func:`pyrouq.bayesian` keep their own layers; see :mod:`pyrouq.convert`.)

BatchEnsemble layers are what :func:`pyrouq.batchensemble` puts in place of every ``nn.Linear``
and convolution: M members folded into the batch, input and output ``(M * B, ...)``
(member-major: rows ``m * B ... (m + 1) * B - 1`` belong to member m). With
``norms="per_member"`` every normalisation layer becomes a :class:`BatchEnsembleNorm`, one copy
per member.
"""

from pyrouq.nn._batchensemble import BATCHENSEMBLE_LAYERS as BATCHENSEMBLE_LAYERS
from pyrouq.nn._batchensemble import NORM_LAYERS as NORM_LAYERS
from pyrouq.nn._batchensemble import (
    BatchEnsembleConv1d,
    BatchEnsembleConv2d,
    BatchEnsembleConv3d,
    BatchEnsembleConvTranspose1d,
    BatchEnsembleConvTranspose2d,
    BatchEnsembleConvTranspose3d,
    BatchEnsembleLinear,
    BatchEnsembleNorm,
)
from pyrouq.nn._batchensemble import FactorInit as FactorInit
from pyrouq.nn._bayesian import BayesianConv2d, BayesianLinear

__all__ = [
    "BatchEnsembleConv1d",
    "BatchEnsembleConv2d",
    "BatchEnsembleConv3d",
    "BatchEnsembleConvTranspose1d",
    "BatchEnsembleConvTranspose2d",
    "BatchEnsembleConvTranspose3d",
    "BatchEnsembleLinear",
    "BatchEnsembleNorm",
    "BayesianConv2d",
    "BayesianLinear",
]
