"""How ``pyrouq fit`` refuses a factory's model that is not a classifier of the data set's
labels: one whose likelihood refuses them as its targets (a regression: a
:class:`~pyrouq.Gaussian` likelihood, or one of the user's own), which ``--method plain`` keeps
as it is and ``--method bayesian`` of a BatchEnsemble keeps as the ensemble's. The command
trains on the data set's class labels, which fit() refused as targets of such a likelihood, in
Python's words ("for real targets use y.float() ... Fix the targets"), after the run had
begun. The likelihood is asked, as fit() asks it (its ``target_problem``), not named."""

from __future__ import annotations

from typing import Any


def refuse_regression(net: Any, spec: str, classes: int) -> str | None:
    """The command's refusal of ``net``, the factory's network, when its likelihood refuses
    the labels of ``classes`` classes as targets (every --method keeps it or refuses the
    model); None otherwise. A DistributedDataParallel, DataParallel or torch.compile wrapper
    is seen through (fit() trains the model inside, whose likelihood DataParallel's attributes
    hide)."""
    import torch  # (the command imports torch when it needs it)

    from pyrouq._wrappers import unwrapped
    from pyrouq.likelihoods import likelihood_of

    inner = unwrapped(net)
    likelihood = likelihood_of(inner)
    problem = getattr(likelihood, "target_problem", None)
    if problem is None or problem(torch.arange(classes), None) is None:
        return None
    returned = type(inner).__name__
    if inner is not net:
        returned = f"{type(net).__name__} holding {returned}"
    real = problem(torch.zeros(classes), None) is None  # (a regression takes real values)
    return (
        f"factory {spec!r} returned {returned} with the likelihood {likelihood!r}, "
        + ("a regression of real-valued targets" if real else "which refuses class labels")
        + f"; pyrouq fit trains a classifier of the data set's {classes} classes on their "
        "labels: build it in the factory with the Categorical likelihood (the default: leave "
        "likelihood= out), or make the factory return the plain network for --method to convert"
    )
