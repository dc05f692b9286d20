"""What :func:`~pyrouq.infer.fit` returns: one :class:`EpochRecord` per epoch and the run's
:class:`FitResult`, whose repr is one short line (a notebook shows it when a cell ends with
``fit(...)``), its attributes holding every figure."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EpochRecord:
    """What one epoch of :func:`fit` measured.

    Attributes
    ----------
    epoch : int
        1-based.
    loss : float
        Mean over the epoch's steps of the minibatch loss (an estimate of the full-data
        negative ELBO, in nats, with the KL weighted).
    nll : float
        Mean of the expected negative log-likelihood term ``-(N/B) sum_batch log p(y|x,w)``.
    kl : float
        Mean of the (unweighted) ``KL(q || p)``; 0 for models without latent sites.
    train_acc : float
        Running accuracy over the epoch's training examples, a fraction in [0, 1] (``pyrouq
        fit`` prints it as a percent: 0.9877 is its "98.77 %"), read off the outputs each step
        computed anyway (in training mode, before that step's update): under the step's
        weight draw (Bayesian; the first particle's, or with ``vectorize_particles`` the
        particles' mean prediction), of the members' mean prediction (ensemble), of the network
        (plain); as Keras and Lightning report it, so it costs no extra pass. ``nan`` for
        regression models and for Pyro models without a ``"logits"`` site.
    seconds : float
        Wall time of the epoch (under torch.distributed, the longest of the ranks': every rank
        reports the same record).

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> import pyrouq
    >>> model = pyrouq.bayesian(nn.Linear(4, 3))
    >>> data = pyrouq.ArrayLoader(torch.randn(8, 4), torch.arange(8) % 3, batch_size=4, seed=0)
    >>> result = pyrouq.fit(model, pyrouq.mean_field_guide(model), data, epochs=2, progress=False)
    >>> record = result.history[-1]
    >>> record.epoch, record.kl > 0, 0 <= record.train_acc <= 1, record.seconds >= 0
    (2, True, True, True)

    Its repr rounds the figures as :class:`FitResult`'s does (the attributes hold them whole):

    >>> EpochRecord(3, 333.4567893, 128.5714286, 2000.333333, 0.987654321, 0.2512345678)
    EpochRecord(epoch=3, loss=333.5, nll=128.6, kl=2000, train_acc=0.9877, seconds=0.3)
    """

    epoch: int
    loss: float
    nll: float
    kl: float
    train_acc: float
    seconds: float

    def __repr__(self) -> str:
        # (to 4 significant digits and the seconds to 0.1, as `pyrouq fit` prints them, where
        # the dataclass's repr gives each float in full: 137 characters a record)
        specs = {"loss": ".4g", "nll": ".4g", "kl": ".4g", "train_acc": ".4g", "seconds": ".1f"}
        figures = ", ".join(
            f"{name}={_rounded(getattr(self, name), spec)}" for name, spec in specs.items()
        )
        return f"EpochRecord(epoch={self.epoch!r}, {figures})"


def _rounded(value: object, spec: str) -> str:
    """``value`` in ``spec`` if a number, else its repr (a record made by hand may hold any)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return format(float(value), spec)
    return repr(value)


@dataclass(frozen=True)
class FitResult:
    """The outcome of :func:`fit`.

    Attributes
    ----------
    history : tuple of EpochRecord
        One record per completed epoch.
    num_data : int
        Training-set size N used for the N/B scaling.
    kl_weight : float
        The weight of the KL term in the loss. A fit without a guide (a BatchEnsemble, a
        plain network: the NLL alone, no KL term) holds the weight it was given or the
        default, which weighs nothing there; its repr leaves it out.
    num_particles : int
    steps : int
        Optimizer steps taken.

    Examples
    --------
    >>> import torch
    >>> from torch import nn
    >>> import pyrouq
    >>> model = pyrouq.bayesian(nn.Linear(4, 3))
    >>> data = pyrouq.ArrayLoader(torch.randn(8, 4), torch.arange(8) % 3, batch_size=4, seed=0)
    >>> result = pyrouq.fit(model, pyrouq.mean_field_guide(model), data, epochs=2, progress=False)
    >>> len(result.history), result.num_data, result.steps, len(result.losses)
    (2, 8, 4, 2)

    Its repr is one line: the number of epochs and the last one's figures, rounded (every
    record, in full, is in ``history``):

    >>> records = (EpochRecord(1, 13.0, 11.0, 120.0, 0.25, 1.5),
    ...            EpochRecord(2, 12.3456, 10.1234, 110.6789, 0.4375, 1.5))
    >>> FitResult(records, num_data=8, kl_weight=0.02, num_particles=1, steps=4)
    ... # doctest: +NORMALIZE_WHITESPACE
    FitResult(history=<2 epochs, last: loss=12.35, nll=10.12, kl=110.7, train_acc=0.4375>,
              num_data=8, kl_weight=0.02, num_particles=1, steps=4, seconds=3.0)
    """

    history: tuple[EpochRecord, ...]
    num_data: int
    kl_weight: float
    num_particles: int
    steps: int
    _weighs_kl: bool = field(default=True, repr=False)  # False: no guide, so no KL term

    @property
    def losses(self) -> list[float]:
        """Per-epoch mean loss."""
        return [r.loss for r in self.history]

    @property
    def seconds(self) -> float:
        """Total training time."""
        return sum(r.seconds for r in self.history)

    def __repr__(self) -> str:
        # One line: the number of epochs and the last one's figures (to 4 significant digits,
        # as `pyrouq fit` prints them; train_acc as the attribute holds it, a fraction, where
        # the command prints a percent), not every record in full precision; kl_weight left
        # out of a fit without a KL term (no guide), where it weighs nothing.
        n = len(self.history)
        history = f"<{n} epoch{'' if n == 1 else 's'}"
        if n:
            last = self.history[-1]
            history += (
                f", last: loss={last.loss:.4g}, nll={last.nll:.4g}, kl={last.kl:.4g}, "
                f"train_acc={last.train_acc:.4g}"
            )
        return (
            f"FitResult(history={history}>, num_data={self.num_data}, "
            + (f"kl_weight={self.kl_weight!r}, " if self._weighs_kl else "")
            + f"num_particles={self.num_particles}, "
            f"steps={self.steps}, seconds={self.seconds:.1f})"
        )
