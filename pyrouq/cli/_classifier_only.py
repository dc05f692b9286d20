"""How ``pyrouq fit`` refuses a factory's model that is not a classifier: one built with a
:class:`~pyrouq.Gaussian` likelihood (a regression), which ``--method plain`` keeps as it is and
``--method bayesian`` of a BatchEnsemble keeps as the ensemble's. The command trains on the
data set's class labels, which fit() refused as targets of a regression, in Python's words
("for real targets use y.float() ... Fix the targets"), after the run had begun."""

from __future__ import annotations

from typing import Any


def refuse_regression(net: Any, spec: str, classes: int) -> str | None:
    """The command's refusal of ``net``, the factory's network, when it holds a Gaussian
    likelihood (every --method keeps it or refuses the model); None otherwise. A
    DistributedDataParallel, DataParallel or torch.compile wrapper is seen through (fit()
    trains the model inside, whose likelihood DataParallel's attributes hide)."""
    from pyrouq._wrappers import unwrapped  # (the command imports torch when it needs it)
    from pyrouq.likelihoods import Gaussian

    inner = unwrapped(net)
    likelihood = getattr(inner, "likelihood", None)
    if not isinstance(likelihood, Gaussian):
        return None
    returned = type(inner).__name__
    if inner is not net:
        returned = f"{type(net).__name__} holding {returned}"
    return (
        f"factory {spec!r} returned {returned} with the likelihood {likelihood!r}, "
        f"a regression of real-valued targets; pyrouq fit trains a classifier of the data "
        f"set's {classes} classes on their labels: build it in the factory with the "
        "Categorical likelihood (the default: leave likelihood= out), or make the factory "
        "return the plain network for --method to convert"
    )
