"""How ``pyrouq fit FACTORY --method bayesian`` warns of a factory's BatchEnsemble whose rank-1
factors get a ``Normal(0, --prior-scale)`` prior: :func:`pyrouq.bayesian` warns in Python's
words ("pass prior=dist.Normal(1.0, 0.1), or build it with pyrouq.rank1(net, M)"), which a
command-line user cannot follow; the command's way out is the plain network and
``--method rank1``. bayesian() gives the same warning (category, place: the command's call of
it, module ``pyrouq.cli._build``) in these words, so the filters (``-W ignore:factory``,
``-W error``) and the once-per-place registries meet only the words the user sees."""

from __future__ import annotations

from collections.abc import Callable


def in_command_words(spec: str, network: str) -> Callable[[float], str]:
    """The warning of a ``Normal(0, prior)`` prior on the rank-1 factors of the factory
    ``spec``'s BatchEnsemble (class ``network``), for the command's user, given the prior."""
    from pyrouq.convert import DEFAULT_RANK1_PRIOR_SCALE

    def words(prior: float) -> str:
        return (
            f"factory {spec!r}, --method bayesian: puts a Normal(0, {prior!r}) prior "
            f"(--prior-scale {prior!r}) on the rank-1 factors of the {network} it returned, "
            "which start near 1 and scale the shared weights: that prior pulls them to 0. "
            f"--method rank1 gives them Normal(1, {DEFAULT_RANK1_PRIOR_SCALE}): make the "
            "factory return the plain network the ensemble was made from and pick --method "
            "rank1."
        )

    return words
