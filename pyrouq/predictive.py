"""The shared predictive API: any pyrouq model (and more) to ``(S, N, C)`` probabilities.

Shape convention, used everywhere in pyrouq: S posterior draws or ensemble members, N inputs,
C classes.

* Bayesian model + guide: S = ``num_samples`` draws of the weights from the guide. The same S
  draws serve every input batch, so draw s is one network evaluated on all N inputs.
* BatchEnsemble (no guide): S = M members.
* A plain ``nn.Module`` returning logits ``(B, C)``: S = 1.
* Any other Pyro model returning logits, or recording a ``"logits"`` site: S = ``num_samples``
  runs (with its guide if given).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pyro
import torch
from pyro import poutine
from torch import Tensor, nn

from pyrouq._util import check_int, has_latent_sites, module_device
from pyrouq.uncertainty import Decomposition, Measure, _check_probs, decompose

__all__ = [
    "DEFAULT_ANGLES",
    "DEFAULT_NUM_SAMPLES",
    "Predictions",
    "evaluate_rotations",
    "format_rotation_table",
    "predict",
]

DEFAULT_NUM_SAMPLES = 32
"""Posterior draws used by :func:`predict` for a Bayesian model when num_samples is None."""


@dataclass(frozen=True, eq=False)
class Predictions:
    """Predictive probabilities of S draws or members on N inputs.

    Attributes
    ----------
    probs : torch.Tensor
        ``(S, N, C)``: ``probs[s, n]`` is the class distribution of draw/member s on input n.
    targets : torch.Tensor or None
        ``(N,)`` labels, when :func:`predict` read them from a loader of ``(x, y)`` batches.

    Examples
    --------
    >>> import torch
    >>> p = Predictions.from_probs(torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]]))
    >>> p.mean_probs
    tensor([[0.7000, 0.3000]])
    >>> p.predicted
    tensor([0])
    >>> d = p.uncertainty("zero_one")
    >>> round(d.total.item(), 4), round(d.aleatoric.item(), 4), round(d.epistemic.item(), 4)
    (0.3, 0.3, 0.0)
    """

    probs: Tensor
    targets: Tensor | None = field(default=None)

    @classmethod
    def from_probs(cls, probs: Tensor, targets: Tensor | None = None) -> Predictions:
        """Wrap any ``(S, N, C)`` probability tensor (checked: non-negative, rows sum to 1)."""
        _check_probs(probs, "probs", 3)
        return cls(probs=probs, targets=targets)

    @property
    def num_samples(self) -> int:
        """S, the number of draws or members."""
        return int(self.probs.shape[0])

    @property
    def num_inputs(self) -> int:
        """N."""
        return int(self.probs.shape[1])

    @property
    def num_classes(self) -> int:
        """C."""
        return int(self.probs.shape[2])

    @cached_property
    def mean_probs(self) -> Tensor:
        """``(N, C)`` mean predictive distribution p̄ (the Bayesian model average)."""
        return self.probs.mean(0)

    @cached_property
    def predicted(self) -> Tensor:
        """``(N,)`` predicted class, ``argmax_c p̄_c``."""
        return self.mean_probs.argmax(-1)

    def uncertainty(self, measure: Measure = "entropy", base: float = math.e) -> Decomposition:
        """Total = aleatoric + epistemic, each ``(N,)``; see :func:`pyrouq.uncertainty.decompose`.

        Parameters
        ----------
        measure : {"entropy", "variance", "zero_one"}, default "entropy"
        base : float, default e
            Logarithm base of the entropy measure (2 for bits).
        """
        return decompose(self.probs, measure=measure, base=base)

    def evaluate(
        self,
        targets: Tensor | None = None,
        ood: Predictions | Tensor | None = None,
        ood_score: str = "mutual_information",
    ) -> dict[str, float]:
        """Every metric of :func:`pyrouq.metrics.evaluate` (targets default to ``self.targets``)."""
        from pyrouq.metrics import evaluate

        if targets is None:
            targets = self.targets
        if targets is None:
            raise ValueError(
                "No targets: pass targets=(N,) labels, or predict from a loader of (x, y) "
                "batches so the Predictions carry them."
            )
        return evaluate(self, targets, ood=ood, ood_score=ood_score)  # type: ignore[arg-type]

    def to(self, device: torch.device | str) -> Predictions:
        """A copy on ``device``."""
        targets = None if self.targets is None else self.targets.to(device)
        return Predictions(self.probs.to(device), targets)

    def __repr__(self) -> str:
        return (
            f"Predictions(S={self.num_samples}, N={self.num_inputs}, C={self.num_classes}, "
            f"device={self.probs.device})"
        )


# --------------------------------------------------------------------------------------------
# predict()
# --------------------------------------------------------------------------------------------


def _batches(x: Tensor | Iterable, batch_size: int) -> Iterable[tuple[Tensor, Tensor | None]]:
    if torch.is_tensor(x):
        for start in range(0, x.shape[0], batch_size):
            yield x[start : start + batch_size], None
        return
    for batch in x:
        if torch.is_tensor(batch):
            yield batch, None
        elif isinstance(batch, (tuple, list)) and batch and torch.is_tensor(batch[0]):
            target = batch[1] if len(batch) > 1 and torch.is_tensor(batch[1]) else None
            yield batch[0], target
        else:
            raise TypeError(
                f"predict() expects x as a tensor or an iterable of tensors / (x, y) batches; "
                f"a batch was {type(batch).__name__}."
            )


def _is_ensemble(model: nn.Module) -> bool:
    return isinstance(getattr(model, "num_members", None), int) and not has_latent_sites(model)


def _logits_of(model: Any, x: Tensor) -> Tensor:
    """Run a model and return its logits: the return value, or its ``"logits"`` site."""
    out = model(x)
    if torch.is_tensor(out) and out.dim() >= 2:
        return out
    trace = poutine.trace(model).get_trace(x)
    if "logits" not in trace.nodes:
        raise TypeError(
            f"{type(model).__name__} returned {type(out).__name__} and recorded no 'logits' "
            "site; predict() needs a model that returns logits (..., B, C) or records "
            "pyro.deterministic('logits', ...)."
        )
    return trace.nodes["logits"]["value"]


def draw_guide(guide: Any, num_samples: int, args: tuple) -> dict[str, Tensor]:
    """S draws of every latent site of the guide, stacked: ``{site: (S, *shape)}``.

    A :class:`~pyrouq.MeanFieldGuide` is sampled directly, one draw after another (the draws
    its traces would give); any other guide is traced once per draw on ``args``.
    """
    from pyrouq.infer.guide import MeanFieldGuide

    draws: dict[str, list[Tensor]] = {}
    if isinstance(guide, MeanFieldGuide) and type(guide).forward is MeanFieldGuide.forward:
        for _ in range(num_samples):
            for site, value in guide.sample().items():
                draws.setdefault(site, []).append(value.detach())
        return {name: torch.stack(values) for name, values in draws.items()}
    for _ in range(num_samples):
        trace = poutine.trace(guide).get_trace(*args)
        for name, site in trace.nodes.items():
            if site["type"] == "sample" and not site["is_observed"]:
                draws.setdefault(name, []).append(site["value"].detach())
    return {name: torch.stack(values) for name, values in draws.items()}


def _softmax(logits: Tensor) -> Tensor:
    return torch.softmax(logits.float(), -1)


@torch.no_grad()
def predict(
    model: nn.Module | Any,
    x: Tensor | Iterable,
    guide: Any = None,
    *,
    num_samples: int | None = None,
    batch_size: int = 1024,
    parallel: bool = True,
) -> Predictions:
    """Predictive probabilities ``(S, N, C)`` of a model on inputs ``x``.

    Parameters
    ----------
    model : PyroModule or nn.Module
        A pyrouq model (Bayesian, BatchEnsemble), any Pyro model returning logits or recording
        ``"logits"``, or a plain ``nn.Module`` returning logits ``(B, C)``.
    x : torch.Tensor or iterable
        ``(N, ...)`` inputs, or a loader yielding input tensors or ``(x, y)`` batches (then the
        labels are kept as ``Predictions.targets``).
    guide : callable, optional
        The fitted guide of a Bayesian model.
    num_samples : int, optional
        Posterior draws S for a Bayesian model (default 32). Must stay None for a
        BatchEnsemble (S = its M members) and a plain network (S = 1).
    batch_size : int, default 1024
        Inputs per forward pass when ``x`` is a tensor. Memory stays bounded: at most
        ``max(batch_size, B)`` (input, draw) pairs are evaluated per pass.
    parallel : bool, default True
        For pyrouq Bayesian models, hand several draws to one pass when the input batch is
        smaller than ``batch_size`` (on accelerators they run as one ``vmap`` pass; on CPU,
        where that is slower, one draw at a time anyway); otherwise loop over draws. Results
        are identical either way.

    Returns
    -------
    Predictions
        On the device of ``x`` (of the first batch for a loader).

    Examples
    --------
    >>> import torch
    >>> from pyrouq.models import BayesianMLP
    >>> from pyrouq.infer import mean_field_guide
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> guide = mean_field_guide(model)
    >>> predict(model, torch.randn(10, 4), guide, num_samples=5).probs.shape
    torch.Size([5, 10, 3])
    """
    batch_size = check_int("batch_size", batch_size)
    if num_samples is not None:
        check_int("num_samples", num_samples)
    device = module_device(model, guide)
    likelihood = getattr(model, "likelihood", None)
    to_probs = likelihood.predictive if likelihood is not None else _softmax
    was_training = model.training if isinstance(model, nn.Module) else None
    if isinstance(model, nn.Module):
        model.eval()
    try:
        with pyro.validation_enabled(False):
            if guide is not None:
                run = _bayesian_runner(
                    model, guide, num_samples or DEFAULT_NUM_SAMPLES, parallel, batch_size
                )
            elif has_latent_sites(model):
                raise ValueError(
                    f"{type(model).__name__} has latent sites: pass its fitted guide, "
                    "predict(model, x, guide), to draw from the posterior."
                )
            elif isinstance(model, pyro.nn.PyroModule) and _is_ensemble(model):
                if num_samples is not None:
                    raise ValueError(
                        f"num_samples={num_samples} given for a BatchEnsemble: its "
                        f"{model.num_members} members are fixed, not sampled, so S = "
                        f"{model.num_members}. Leave num_samples=None."
                    )
                run = _ensemble_runner(model)
            elif isinstance(model, pyro.nn.PyroModule):
                run = _sampled_runner(model, num_samples or DEFAULT_NUM_SAMPLES)
            else:
                if num_samples is not None:
                    raise ValueError(
                        f"num_samples={num_samples} given for a deterministic network "
                        f"({type(model).__name__}): S = 1. Leave num_samples=None."
                    )
                run = _plain_runner(model)
            probs, targets, out_device = [], [], None
            for xb, yb in _batches(x, batch_size):
                if out_device is None:
                    out_device = xb.device
                if device is not None:
                    xb = xb.to(device)
                logits = run(xb)
                probs.append(to_probs(logits).to(out_device))
                if yb is not None:
                    targets.append(yb.to(out_device))
    finally:
        if was_training:
            model.train()
    if not probs:
        raise ValueError("predict() got no inputs: x is empty.")
    all_probs = torch.cat(probs, dim=1)
    all_targets = torch.cat(targets) if len(targets) == len(probs) else None
    return Predictions(all_probs, all_targets)


def _plain_runner(model: nn.Module):
    def run(x: Tensor) -> Tensor:
        logits = model(x)
        if not torch.is_tensor(logits) or logits.dim() != 2:
            raise TypeError(
                f"{type(model).__name__} must return logits of shape (B, C), got "
                f"{getattr(logits, 'shape', type(logits).__name__)}."
            )
        return logits.unsqueeze(0)

    return run


def _ensemble_runner(model: nn.Module):
    outputs = getattr(model, "outputs", None)

    def run(x: Tensor) -> Tensor:
        return outputs(x) if callable(outputs) else model(x)

    return run


def _sampled_runner(model: Any, num_samples: int):
    def run(x: Tensor) -> Tensor:
        return torch.stack([_logits_of(model, x) for _ in range(num_samples)])

    return run


def _bayesian_runner(model: Any, guide: Any, num_samples: int, parallel: bool, batch_size: int):
    """Draw the weights once (at the first batch), then evaluate every input batch under the
    same S draws, ``chunk`` draws per pass so that at most ``max(batch_size, B)`` (input, draw)
    pairs are evaluated at once."""
    draws: dict[str, Tensor] = {}
    direct = getattr(model, "outputs", None) if has_latent_sites(model) else None

    def logits(x: Tensor, data: dict[str, Tensor]) -> Tensor:
        if direct is not None:
            return direct(x, data)
        return _logits_of(poutine.condition(model, data=data), x)

    def run(x: Tensor) -> Tensor:
        if not draws:
            drawn = draw_guide(guide, num_samples, (x,))
            if direct is not None:  # the model's latent sites only (autoguides add others)
                sites = model.latent_sites()
                missing = [site for site in sites if site not in drawn]
                if missing:
                    raise ValueError(
                        f"The guide did not sample the model's latent site(s) {missing[:3]}: "
                        f"it does not belong to {type(model).__name__}. Build the guide for "
                        "this model, e.g. mean_field_guide(model)."
                    )
                drawn = {site: drawn[site] for site in sites}
            draws.update(drawn)
        stackable = parallel and direct is not None
        chunk = min(num_samples, max(1, batch_size // x.shape[0])) if stackable else 1
        out = []
        for start in range(0, num_samples, chunk):
            stop = min(start + chunk, num_samples)
            if stop - start == 1:
                out.append(logits(x, {k: v[start] for k, v in draws.items()}).unsqueeze(0))
            else:
                out.append(logits(x, {k: v[start:stop] for k, v in draws.items()}))
        return torch.cat(out)

    return run


# --------------------------------------------------------------------------------------------
# Rotated inputs (distribution shift)
# --------------------------------------------------------------------------------------------

DEFAULT_ANGLES: tuple[int, ...] = tuple(range(0, 181, 15))
"""Angles (degrees) of :func:`evaluate_rotations`: 0, 15, ..., 180."""

_ROTATION_KEYS = ("angle", "acc", "ece", "epistemic", "total")


@torch.no_grad()
def evaluate_rotations(
    model: nn.Module | Any,
    x: Tensor,
    y: Tensor,
    guide: Any = None,
    *,
    angles: Iterable[float] = DEFAULT_ANGLES,
    num_samples: int | None = None,
    batch_size: int = 1024,
    measure: Measure = "entropy",
    normalized: bool = True,
) -> list[dict[str, float]]:
    """Accuracy, calibration and uncertainty of a model on rotated copies of ``x``.

    For each angle, ``x`` is rotated with :func:`pyrouq.data.rotate` and passed to
    :func:`predict`; the metrics are those of :mod:`pyrouq.metrics` on the mean predictive
    probabilities, so the row at angle 0 agrees with :func:`pyrouq.metrics.evaluate`.

    Every angle sees the same S posterior draws (common random numbers): the torch RNG state
    is saved before the first angle and restored before each other one, so the rows differ by
    the rotation alone, not by Monte Carlo noise. Afterwards the RNG has advanced as after one
    :func:`predict` call.

    Parameters
    ----------
    model, guide, num_samples, batch_size
        As in :func:`predict`.
    x : torch.Tensor
        ``(N, 1, 28, 28)`` or ``(N, 784)`` images (any single-channel square images).
    y : torch.Tensor
        ``(N,)`` integer labels.
    angles : iterable of float, default ``(0, 15, ..., 180)``
        Rotation angles in degrees, counter-clockwise.
    measure : {"entropy", "variance", "zero_one"}, default "entropy"
        Uncertainty measure of the ``epistemic`` and ``total`` columns (see
        :func:`pyrouq.uncertainty.decompose`); with ``"entropy"`` they are the mutual
        information and the predictive entropy in nats.
    normalized : bool, default True
        Whether ``x`` carries the MNIST normalisation; decides the background value that
        rotates in (see :func:`pyrouq.data.rotate`).

    Returns
    -------
    list of dict of str to float
        One row per angle, in the given order, with keys ``angle`` (degrees), ``acc``,
        ``ece`` (fractions, 15 equal-width bins), ``epistemic`` and ``total`` (means over the
        N inputs). Print them with :func:`format_rotation_table`, plot them with
        :func:`pyrouq.plotting.plot_rotation`.

    Examples
    --------
    >>> from pyrouq.models import MLP
    >>> rows = evaluate_rotations(MLP(), torch.randn(8, 1, 28, 28), torch.arange(8), angles=[0, 90])
    >>> [row["angle"] for row in rows], sorted(rows[0])
    ([0.0, 90.0], ['acc', 'angle', 'ece', 'epistemic', 'total'])
    """
    from pyrouq.data import _check_angle, rotate
    from pyrouq.metrics import _prepare_probs, acc, ece
    from pyrouq.uncertainty import _check_measure

    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        bad = "x" if not isinstance(x, Tensor) else "y"
        raise TypeError(
            f"evaluate_rotations() expects x and y as tensors (images (N, ...) and labels "
            f"(N,)), got {bad} of type {type(x if bad == 'x' else y).__name__}; concatenate "
            "the batches of a loader with torch.cat first."
        )
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(
            f"Expected y of shape (N,) = ({x.shape[0]},), one label per image of x, got shape "
            f"{tuple(y.shape)}."
        )
    _check_measure(measure)
    angles = [_check_angle(a, "each angle") for a in angles]
    if not angles:
        raise ValueError("Expected at least one angle, got none; pass e.g. angles=(0, 45, 90).")
    device = module_device(model, guide) or x.device
    rng = _rng_state(device)
    rows = []
    for i, angle in enumerate(angles):
        if i:
            _set_rng_state(device, rng)
        preds = predict(
            model,
            rotate(x, angle, normalized=normalized),
            guide,
            num_samples=num_samples,
            batch_size=batch_size,
        )
        probs = _prepare_probs(preds.probs)  # float64, as in pyrouq.metrics.evaluate
        parts = decompose(probs, measure)
        rows.append(
            {
                "angle": angle,
                "acc": acc(probs, y),
                "ece": ece(probs, y),
                "epistemic": float(parts.epistemic.mean()),
                "total": float(parts.total.mean()),
            }
        )
    return rows


def format_rotation_table(rows: Iterable[dict[str, float]]) -> str:
    """Format the rows of :func:`evaluate_rotations` as one fixed-width text table.

    Accuracy and ECE are shown as percentages, the uncertainties with 5 decimals, in the box
    style of :func:`pyrouq.metrics.format_table`.

    Examples
    --------
    >>> print(format_rotation_table([
    ...     {"angle": 0.0, "acc": 0.9912, "ece": 0.0041, "epistemic": 0.0123, "total": 0.0456},
    ...     {"angle": 90.0, "acc": 0.1534, "ece": 0.4012, "epistemic": 0.3012, "total": 1.2345},
    ... ]))
    ┌───────┬────────┬────────┬───────────┬─────────┐
    │ Angle │    Acc │    ECE │ Epistemic │   Total │
    ├───────┼────────┼────────┼───────────┼─────────┤
    │    0° │ 99.12% │  0.41% │   0.01230 │ 0.04560 │
    │   90° │ 15.34% │ 40.12% │   0.30120 │ 1.23450 │
    └───────┴────────┴────────┴───────────┴─────────┘
    """
    rows = _check_rotation_rows(rows)
    header = ["Angle", "Acc", "ECE", "Epistemic", "Total"]
    body = [
        [
            f"{row['angle']:g}°",
            f"{row['acc']:.2%}",
            f"{row['ece']:.2%}",
            f"{row['epistemic']:.5f}",
            f"{row['total']:.5f}",
        ]
        for row in rows
    ]
    widths = [max(len(line[j]) for line in [header, *body]) for j in range(len(header))]
    bars = ["─" * (w + 2) for w in widths]

    def line(cells: list[str]) -> str:
        return "│ " + " │ ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " │"

    out = ["┌" + "┬".join(bars) + "┐", line(header), "├" + "┼".join(bars) + "┤"]
    out += [line(cells) for cells in body]
    out.append("└" + "┴".join(bars) + "┘")
    return "\n".join(out)


def _check_rotation_rows(rows: object) -> list[dict[str, float]]:
    """The rows of :func:`evaluate_rotations` as a list, or a TypeError / ValueError."""
    if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, Iterable):
        raise TypeError(
            f"Expected rows to be a list of dicts (the output of evaluate_rotations()), got "
            f"{type(rows).__name__}."
        )
    out = list(rows)
    if not out:
        raise ValueError("Expected at least one row, got none; pass evaluate_rotations(...).")
    for row in out:
        missing = [k for k in _ROTATION_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            raise ValueError(
                f"A rotation row lacks the key(s) {missing}; expected dicts with keys "
                f"{list(_ROTATION_KEYS)}, as evaluate_rotations() returns them."
            )
    return out


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    """The torch CPU RNG state and, on an accelerator, the state of ``device``'s generator."""
    if device.type == "cuda":
        return torch.get_rng_state(), torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.get_rng_state(), torch.mps.get_rng_state()
    return torch.get_rng_state(), None


def _set_rng_state(device: torch.device, state: tuple[Tensor, Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        if device.type == "cuda":
            torch.cuda.set_rng_state(state[1], device)
        else:
            torch.mps.set_rng_state(state[1])
