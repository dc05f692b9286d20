"""The error of a checkpoint that cannot be written or read, with what a caller (the command
line's `pyrouq evaluate`) needs to tell it in its own words as attributes, not message text."""

from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read (unreadable, unsafe, or of another model).

    Examples
    --------
    >>> import os, tempfile
    >>> from pyrouq import BatchEnsembleMLP, BayesianMLP, load, save
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = save(os.path.join(folder, "model.pt"), BatchEnsembleMLP(4, 8, 3))
    ...     print(type(load(path).model).__name__)
    ...     try:
    ...         load(path, model_class=BayesianMLP)
    ...     except CheckpointError as error:
    ...         print("holds a BatchEnsembleMLP, expected a BayesianMLP" in str(error))
    BatchEnsembleMLP
    True

    Where load() refuses for want of a skeleton or for a skeleton that does not fit, the
    error says so in attributes too (each None otherwise; the message is the same):

    - ``held_class``: the file holds a network and load() got no ``module=`` to rebuild it
      from; the qualified class of that network, which ``held_plain`` says is plain (else
      converted from it).
    - ``held_wrapper``: the file (of an earlier pyrouq) holds the network in a wrapper, and
      the skeleton must be in it too: ``"torch.compile"``, ``"torch.nn.DataParallel"`` or
      ``"torch.nn.parallel.DistributedDataParallel"``.
    - ``skeleton_mismatch``: the ``module=`` skeleton given cannot take the file's values;
      why, a sentence (the message without its advice on what to do).
    """

    def __init__(
        self,
        *args: object,
        held_class: str | None = None,
        held_plain: bool | None = None,
        held_wrapper: str | None = None,
        skeleton_mismatch: str | None = None,
    ) -> None:
        super().__init__(*args)
        self.held_class, self.held_plain = held_class, held_plain
        self.held_wrapper, self.skeleton_mismatch = held_wrapper, skeleton_mismatch
