"""Plots of evaluation results: reliability, risk-coverage, uncertainty distributions,
training curves and rotated inputs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from pyrouq._metric_ood import check_ood_predictions
from pyrouq._numbers import is_real
from pyrouq._util import check_int
from pyrouq.metrics import (
    NUM_BINS,
    _error_counts,
    _prepare,
    aurc,
    ece,
    equal_width_bins,
    ood_auroc,
    risk_at_80_cov,
    warn_other_draws,
)
from pyrouq.plotting._common import (
    _COMPONENTS,
    _KIND_WORDS,
    _KINDS,
    DistributionKind,
    _check_choice,
    _figure_and_axes,
    _probs,
    _pyplot,
    _targets,
    closes_its_figures,
    ink,
    lone_point,
)
from pyrouq.plotting._dense import thinned
from pyrouq.uncertainty import Measure, _check_measure, decompose

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pyrouq.infer import EpochRecord, FitResult
    from pyrouq.predictive import Predictions

#: Most bins of :func:`plot_reliability`: its 5-inch axes are about 1000 pixels wide at 200 dpi,
#: so more bars are thinner than a pixel (and each is a patch: 20000 took 28 s to draw).
_MAX_DIAGRAM_BINS = 1000
#: Most bins of :func:`plot_uncertainty_distributions`' histograms: its panels are about 3
#: inches wide, so more bins are thinner than a pixel (10**4 bins took 10 s, 10**5 over a minute).
_MAX_HISTOGRAM_BINS = 1000


# ---------------------------------------------------------------------------------------------
# Calibration and selective prediction


@closes_its_figures
def plot_reliability(
    predictions_or_probs: Predictions | Tensor,
    targets: Tensor | None = None,
    *,
    num_bins: int = NUM_BINS,
    ax: Axes | None = None,
) -> Figure:
    """Reliability diagram with its ECE, and the histogram of confidences below it.

    The confidence of an input is ``max_c p̄_c``; bins are equal-width and left-closed, with a
    confidence of 1.0 in the last bin, exactly as :func:`pyrouq.metrics.ece` bins them. Each
    bar is the accuracy of a bin, the red part the gap to its mean confidence. The ECE in the
    title is :func:`pyrouq.metrics.ece` (15 bins; the title says so when ``num_bins`` differs).

    Parameters
    ----------
    predictions_or_probs : Predictions or Tensor
        ``(S, N, C)`` or ``(N, C)`` probabilities.
    targets : Tensor, optional
        ``(N,)`` labels; default ``predictions_or_probs.targets``.
    num_bins : int, default 15
        Number of bins of the diagram, at most 1000 (one bar each; the ECE of any number of
        bins is :func:`pyrouq.metrics.ece`'s).
    ax : matplotlib Axes, optional
        Draw the reliability diagram alone into this axes (no histogram of confidences; the
        figure's layout is left as it is) and return its figure; no figure is made. Default:
        a new figure with both.

    Returns
    -------
    Figure
        Two axes: the reliability diagram (title ``Reliability diagram (acc …, ECE …)``) and
        the fraction of inputs per bin; with ``ax``, the figure of ``ax``.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])  # (N, C), S = 1
    >>> fig = plot_reliability(probs, torch.tensor([0, 0, 1, 1]))
    >>> [ax.get_title() for ax in fig.axes]  # ECE = (0.1 + 0.2 + 0.6 + 0.3) / 4
    ['Reliability diagram (acc 75.00%, ECE 30.00%)', '']
    >>> plt.close(fig)
    """
    num_bins = check_int("num_bins", num_bins, hint="The ECE uses 15 bins.")
    if num_bins > _MAX_DIAGRAM_BINS:
        raise ValueError(
            f"Expected num_bins <= {_MAX_DIAGRAM_BINS} for a reliability diagram (one bar per "
            f"bin; more are thinner than a pixel), got {num_bins}. For the ECE of that many "
            "bins call pyrouq.metrics.ece(probs, targets, num_bins=...)."
        )
    pbar, y = _prepare(
        _probs(predictions_or_probs, "predictions_or_probs"),
        _targets(targets, predictions_or_probs),
    )
    conf, pred = pbar.max(-1)
    correct = (pred == y).to(conf.dtype)
    edges, bins = equal_width_bins(conf, num_bins)
    counts = torch.bincount(bins, minlength=num_bins).to(conf.dtype)
    sum_conf = conf.new_zeros(num_bins).index_add_(0, bins, conf)
    sum_correct = conf.new_zeros(num_bins).index_add_(0, bins, correct)
    filled = counts > 0
    acc_b = torch.where(filled, sum_correct / counts.clamp_min(1), torch.nan).numpy()
    conf_b = torch.where(filled, sum_conf / counts.clamp_min(1), torch.nan).numpy()
    centers = ((edges[:-1] + edges[1:]) / 2).numpy()
    value = ece(pbar, y)
    accuracy = float(correct.mean())

    ax_n = None
    if ax is None:
        fig, (ax, ax_n) = _pyplot().subplots(
            2, 1, figsize=(5.0, 6.0), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
        )
    else:
        fig, ax = _figure_and_axes(ax, (5.0, 6.0))
    ax.bar(centers, acc_b, width=1 / num_bins, edgecolor="black", lw=0.5, label="accuracy")
    ax.bar(
        centers,
        conf_b - acc_b,
        bottom=acc_b,
        width=1 / num_bins,
        color="tab:red",
        alpha=0.35,
        edgecolor="tab:red",
        lw=0.5,
        label="gap to confidence",
    )
    ax.plot([0, 1], [0, 1], "--", color=ink(), lw=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=8)
    note = "" if num_bins == NUM_BINS else f" ({NUM_BINS} bins)"
    ax.set_title(f"Reliability diagram (acc {accuracy:.2%}, ECE {value:.2%}{note})")
    if ax_n is None:  # the user's axes: the diagram alone, the layout theirs
        ax.set_xlabel("confidence (max. mean probability)")
        return fig
    ax_n.bar(centers, (counts / counts.sum()).numpy(), width=1 / num_bins, color="tab:gray")
    ax_n.set_xlabel("confidence (max. mean probability)")
    ax_n.set_ylabel("fraction")
    fig.tight_layout()
    return fig


@closes_its_figures
def plot_risk_coverage(
    predictions_or_probs: Predictions | Tensor,
    targets: Tensor | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """Risk-coverage curve with its AURC, the optimal curve and the Risk@80Cov point.

    The selective risk at coverage ``k / N`` is the error rate among the k most confident
    inputs (confidence ``max_c p̄_c``, ties averaged), exactly as :func:`pyrouq.metrics.aurc`
    integrates it; the AURC in the title is :func:`pyrouq.metrics.aurc`. The optimal curve
    ranks every error last (same accuracy, perfect ranking); the dotted line is the overall
    error rate (a random ranking).

    Of more than 100,000 inputs, each curve is drawn through the first, last, lowest and
    highest point of each 1/4096 of the coverage axis: within 1/4096 of the axes' width of
    every point (0.1 pixel at 100 dpi, 0.3 at 300 dpi), as the figure shows them, and the
    ``loc="best"`` legend weighs those points, not a million (the lines' data are those
    points; the AURC in the title is of all of them).

    Parameters
    ----------
    predictions_or_probs : Predictions or Tensor
        ``(S, N, C)`` or ``(N, C)`` probabilities.
    targets : Tensor, optional
        ``(N,)`` labels; default ``predictions_or_probs.targets``.
    ax : matplotlib Axes, optional
        Draw into this axes (the figure's layout is left as it is) and return its figure; no
        figure is made. Default: a new figure.

    Returns
    -------
    Figure
        One axes, titled ``Risk-coverage curve (AURC …)``; with ``ax``, the figure of ``ax``.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])  # (N, C), S = 1
    >>> fig, ax = plt.subplots()
    >>> plot_risk_coverage(probs, torch.tensor([0, 0, 1, 1]), ax=ax) is fig
    True
    >>> ax.get_title()  # the least confident input is the error: risks 0, 0, 0, 1/4
    'Risk-coverage curve (AURC 6.25%)'
    >>> plt.close(fig)
    """
    pbar, y = _prepare(
        _probs(predictions_or_probs, "predictions_or_probs"),
        _targets(targets, predictions_or_probs),
    )
    n = pbar.shape[0]
    errors = _error_counts(pbar, y)
    k = torch.arange(1, n + 1, dtype=errors.dtype, device=errors.device)
    risk = errors / k
    total_errors = float(errors[-1])
    best = (k - (n - total_errors)).clamp_min(0) / k
    value, at_80 = aurc(pbar, y), risk_at_80_cov(pbar, y)

    own = ax is None
    fig, ax = _figure_and_axes(ax, (5.5, 4.0))
    coverage, risk_, best_ = (k / n).numpy(), risk.numpy(), best.numpy()
    curve = thinned(coverage, risk_)  # (all of them up to THIN_ABOVE inputs)
    model_label = f"model (AURC {value:.2%})"
    ax.plot(coverage[curve], risk_[curve], lw=1.5, label=model_label, **lone_point(n))
    best_label = f"optimal (AURC {float(best.mean()):.2%})"  # (one input: its point, an x)
    curve = thinned(coverage, best_)
    ax.plot(coverage[curve], best_[curve], "g--", lw=1, label=best_label, **lone_point(n, "x"))
    ax.axhline(total_errors / n, color="gray", ls=":", lw=1, label="random ranking")
    at_80_label = f"Risk@80Cov {at_80:.2%}"
    ax.plot([(4 * n + 4) // 5 / n], [at_80], "o", color=ink(), ms=4, label=at_80_label)
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("coverage")
    ax.set_ylabel("selective risk (error rate)")
    ax.legend(fontsize=8)
    ax.set_title(f"Risk-coverage curve (AURC {value:.2%})")
    if own:
        fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Uncertainty, training, distribution shift


@closes_its_figures
def plot_uncertainty_distributions(
    in_dist: Predictions | Tensor,
    ood: Predictions | Tensor | None = None,
    *,
    measure: Measure = "entropy",
    kind: DistributionKind = "hist",
    bins: int = 30,
) -> Figure:
    """Distributions of total, aleatoric and epistemic uncertainty, in-distribution vs OOD.

    With ``ood``, each panel's title gives the OOD AUROC of that part used as the score
    (:func:`pyrouq.metrics.ood_auroc`, OOD positive): for ``measure="entropy"`` the total and
    epistemic panels equal ``evaluate(..., ood_score="entropy")`` and
    ``ood_score="mutual_information"``. The total, a function of ``p̄`` alone, is scored from
    ``p̄``, so inputs of one ``p̄`` tie (``"zero_one"``: as ``ood_score="max_prob"``).

    Parameters
    ----------
    in_dist : Predictions or Tensor
        ``(S, N, C)`` (or ``(N, C)``) probabilities on in-distribution inputs.
    ood : Predictions or Tensor, optional
        ``(S, M, C)`` probabilities on out-of-distribution inputs, best with the S of
        ``in_dist`` (``(M, C)`` is one draw). With another S the total panel warns as
        ``evaluate(..., ood_score="entropy")`` does (the mean of more disagreeing draws is
        less certain), and the epistemic panel, the draws' disagreement, which grows with S,
        draws no OOD series (as ``ood_score="mutual_information"`` is refused); the aleatoric
        panel, a mean over the draws, compares. The OOD inputs themselves (images, a loader)
        are refused: pass ``predict(model, ood_inputs, guide)``.
    measure : {"entropy", "variance", "zero_one"}, default "entropy"
        Uncertainty measure of :func:`pyrouq.uncertainty.decompose`.
    kind : {"hist", "ecdf"}, default "hist"
        Density histograms (common bin edges) or empirical CDFs. An ECDF of more than
        100,000 inputs is drawn through the first and last of its steps in each 1/4096 of
        its x range: within 1/4096 of the panel's width of every step (under 0.07 pixel at
        100 dpi, 0.2 at 300 dpi), as the figure shows it, and the ``loc="best"`` legends
        weigh those steps, not a million (the lines' data are those steps).
    bins : int, default 30
        Number of histogram bins, at most 1000 (more are thinner than a pixel); unused by
        ``kind="ecdf"``.

    Returns
    -------
    Figure
        A new figure of three axes: total, aleatoric, epistemic (no ``ax=``: it draws three
        panels). For one draw (S = 1, a plain network), whose epistemic part is 0 for every
        input, the epistemic axes says so and draws nothing.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> in_dist = torch.tensor([[[0.9, 0.1]] * 3, [[0.9, 0.1]] * 3])  # S = 2 draws agree
    >>> ood = torch.tensor([[[0.9, 0.1]] * 2, [[0.1, 0.9]] * 2])  # they disagree
    >>> fig = plot_uncertainty_distributions(in_dist, ood)
    >>> [ax.get_title().splitlines()[1] for ax in fig.axes]  # total, aleatoric, epistemic
    ['OOD AUROC 100.00%', 'OOD AUROC 50.00%', 'OOD AUROC 100.00%']
    >>> plt.close(fig)
    """
    _check_measure(measure)
    _check_choice("kind", kind, _KINDS, _KIND_WORDS)
    bins = check_int("bins", bins, hint="It is the number of histogram bins, e.g. bins=30.")
    if kind == "hist" and bins > _MAX_HISTOGRAM_BINS:
        raise ValueError(
            f"Expected bins <= {_MAX_HISTOGRAM_BINS} for the histograms (each panel is about 3 "
            f"inches wide: more bins are thinner than a pixel, and 10**5 of them take over a "
            f"minute to draw), got {bins}. Pass fewer bins, e.g. bins=30, or kind='ecdf', which "
            "has no bins."
        )
    p_in = _probs(in_dist, "in_dist")
    one_draw = p_in.shape[0] == 1  # its epistemic part is 0 for every input: not drawn
    parts_in = decompose(p_in, measure)
    parts_out, other_draws = None, False
    if ood is not None:  # (the OOD inputs themselves, or a loader of them: told to predict)
        check_ood_predictions(ood, p_in.shape[-1], "plot_uncertainty_distributions()")
        p_out = _probs(ood, "ood")
        if p_out.shape[-1] != p_in.shape[-1]:
            given = ood if isinstance(ood, Tensor) else ood.probs  # the shape passed, not (S, M, C)
            raise ValueError(
                f"Expected ood with C={p_in.shape[-1]} classes like in_dist, got shape "
                f"{tuple(given.shape)}; predict both with the same model."
            )
        warn_other_draws(p_in, p_out, "the total panel")  # (evaluate()'s words)
        other_draws = p_out.shape[0] != p_in.shape[0]  # no epistemic comparison, as evaluate()
        parts_out = decompose(p_out, measure)

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12.0, 3.6))
    for ax, name in zip(axes, _COMPONENTS, strict=True):
        series = [("in-distribution", getattr(parts_in, name), "tab:blue")]
        title = f"{name} ({measure})"
        if name == "epistemic" and one_draw:
            text = "0 for every input:\none draw (S = 1) has\nno disagreement"
            ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")
            ax.set_title(title + "\nnot drawn for S = 1", fontsize=10)
            ax.set_xlabel(f"{name} uncertainty")
            continue
        if parts_out is not None and name == "epistemic" and other_draws:
            title += (  # (which count is which: the in-distribution draws are p_in's)
                f"\nOOD not drawn: S = {len(p_in)} (in-distribution)\nvs {len(p_out)} (OOD)"
            )
        elif parts_out is not None:
            out_values = getattr(parts_out, name)
            series.append(("OOD", out_values, "tab:orange"))
            scores = (getattr(parts_in, name), out_values)
            if name == "total":
                # a function of p̄ alone, scored from p̄ as one draw (H(p̄) as evaluate(
                # ood_score="entropy") scores): aleatoric + epistemic can round one way for one
                # input and the other way for another of equal p̄
                means = p_in.mean(0, keepdim=True), p_out.mean(0, keepdim=True)
                scores = (decompose(means[0], measure).total, decompose(means[1], measure).total)
            title += f"\nOOD AUROC {ood_auroc(*scores):.2%}"
        if kind == "hist":  # (the ECDFs need no edges)
            values = torch.cat([v for _, v, _ in series])
            lo, hi = float(values.min()), float(values.max())
            if not hi - lo > 1e-9 * max(abs(lo), abs(hi)):  # one value (to rounding): a bar
                hi = lo + max(1e-6, 1e-6 * abs(lo))
            edges = np.linspace(lo, hi, bins + 1)
        for label, v, color in series:
            data = v.numpy()
            if kind == "hist":
                # one filled outline per series: 30 bar patches per series measured 0.3 s
                # more per figure (most of it in tight_layout) and look the same
                ax.hist(
                    data,
                    bins=edges,
                    density=True,
                    histtype="stepfilled",
                    alpha=0.5,
                    color=color,
                    label=label,
                )
            else:
                # from 0 at the smallest value, as matplotlib's Axes.ecdf draws it: without
                # that jump one input drew a lone point (nothing), and N inputs began at 1/N
                xs = np.sort(data)
                xs, fractions = np.concatenate([xs[:1], xs]), np.arange(xs.size + 1) / xs.size
                curve = thinned(xs, fractions)  # (all of them up to THIN_ABOVE inputs)
                ax.step(xs[curve], fractions[curve], where="post", color=color, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"{name} uncertainty")
        ax.set_ylabel("density" if kind == "hist" else "fraction of inputs ≤ x")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


@closes_its_figures
def plot_training_curves(fit_result: FitResult | Sequence[EpochRecord]) -> Figure:
    """Loss, KL and training accuracy per epoch of a :func:`pyrouq.infer.fit` run.

    Parameters
    ----------
    fit_result : FitResult or sequence of EpochRecord
        What :func:`pyrouq.infer.fit` returned (or its ``history``).

    Returns
    -------
    Figure
        A new figure of three axes (no ``ax=``: it draws several panels): the loss (negative
        ELBO estimate) with its expected-NLL term, ``KL(q || p)`` (0 for BatchEnsemble), and
        the training accuracy (left out for a regression, which has none); the title gives the
        final values. Where the last epoch's accuracy is NaN, the title gives the last finite
        one and its epoch, e.g. ``train acc 93.00% (epoch 2)``.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import torch
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> from pyrouq import BayesianMLP, fit, mean_field_guide
    >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    >>> model = BayesianMLP(in_features=4, hidden_features=8, out_features=3)
    >>> guide = mean_field_guide(model)
    >>> loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    >>> result = fit(model, guide, loader, epochs=2, progress=False, seed=0)
    >>> fig = plot_training_curves(result)
    >>> [ax.get_title() for ax in fig.axes]
    ['Loss per epoch (nats)', 'KL(q || p) (nats, unweighted)', 'Training accuracy (%)']
    >>> plt.close(fig)
    """
    history = getattr(fit_result, "history", fit_result)
    fields = ("epoch", "loss", "nll", "kl", "train_acc", "seconds")
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
        raise TypeError(
            f"Expected fit_result to be a FitResult (what pyrouq.fit returns) or a sequence of "
            f"EpochRecord, got {type(fit_result).__name__}."
        )
    if not history:
        raise ValueError(
            "Expected fit_result with at least one epoch, got an empty history; plot after "
            "fit(..., epochs >= 1) has run."
        )
    for record in history:
        if not all(hasattr(record, f) for f in fields):
            raise TypeError(
                f"Expected EpochRecord entries with fields {list(fields)}, got "
                f"{type(record).__name__}; pass the FitResult that pyrouq.fit returned."
            )
        odd = [f for f in fields if not is_real(getattr(record, f))]
        if odd:
            raise TypeError(
                f"Expected EpochRecord fields {odd} to be numbers, got "
                f"{', '.join(repr(getattr(record, f)) for f in odd)} (epoch {record.epoch!r}); "
                "pass the FitResult that pyrouq.fit returned."
            )
    epochs = [r.epoch for r in history]
    last = history[-1]
    marker = "o-" if len(history) < 30 else "-"

    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    accuracy = any(math.isfinite(r.train_acc) for r in history)  # none for regression
    fig, axes = plt.subplots(1, 3 if accuracy else 2, figsize=(12.0 if accuracy else 8.0, 3.4))
    ax_loss, ax_kl = axes[:2]
    ax_loss.plot(epochs, [r.loss for r in history], marker, ms=3, label="loss (neg. ELBO)")
    ax_loss.plot(epochs, [r.nll for r in history], marker, ms=3, label="expected NLL")
    ax_loss.set_title("Loss per epoch (nats)", fontsize=10)
    ax_loss.legend(fontsize=8)
    ax_kl.plot(epochs, [r.kl for r in history], marker, ms=3, color="tab:green")
    ax_kl.set_title("KL(q || p) (nats, unweighted)", fontsize=10)
    if accuracy:
        ax_acc = axes[2]
        acc = [100 * r.train_acc for r in history]
        ax_acc.plot(epochs, acc, marker, ms=3, color="tab:purple")
        ax_acc.set_title("Training accuracy (%)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    seconds = sum(r.seconds for r in history)
    acc_note = ""
    if accuracy:  # the last finite one: an epoch without accuracy would read "nan%"
        at = next(r for r in reversed(history) if math.isfinite(r.train_acc))
        acc_note = f", train acc {at.train_acc:.2%}" + (
            "" if at is last else f" (epoch {at.epoch})"
        )
    fig.suptitle(
        f"{len(history)} epoch{'s' if len(history) != 1 else ''} in {seconds:.1f} s: final "
        f"loss {last.loss:.5g}, KL {last.kl:.5g}{acc_note}",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


@closes_its_figures
def plot_rotation(rows: Sequence[Mapping[str, float]]) -> Figure:
    """Accuracy, ECE and uncertainty against the rotation angle.

    Parameters
    ----------
    rows : list of dict
        What :func:`pyrouq.rotation.evaluate_rotations` returned: one dict per angle with
        keys ``angle``, ``acc``, ``ece``, ``epistemic``, ``total``, each a finite number, the
        ``acc`` and ``ece`` fractions in [0, 1] (NaN, inf and percentages are refused with a
        ValueError, before a figure is made).

    Returns
    -------
    Figure
        A new figure of three axes (no ``ax=``: it draws three panels) against the angle
        (degrees): accuracy and ECE (%), the mean epistemic and the mean total uncertainty;
        the first title gives the accuracy at the smallest and the largest angle.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> rows = [
    ...     {"angle": 0, "acc": 0.98, "ece": 0.01, "epistemic": 0.02, "total": 0.1},
    ...     {"angle": 90, "acc": 0.4, "ece": 0.3, "epistemic": 0.3, "total": 1.2},
    ... ]
    >>> fig = plot_rotation(rows)
    >>> fig.axes[0].get_title()
    'Accuracy 98.00% at 0°, 40.00% at 90°'
    >>> plt.close(fig)
    """
    from pyrouq.rotation import _check_rotation_rows

    table = sorted(_check_rotation_rows(rows), key=lambda r: r["angle"])
    angles = [r["angle"] for r in table]
    first, last = table[0], table[-1]

    plt = _pyplot()
    fig, (ax_acc, ax_epi, ax_tot) = plt.subplots(1, 3, figsize=(13.0, 3.6))
    ax_acc.plot(angles, [100 * r["acc"] for r in table], "o-", ms=3, label="accuracy")
    ax_acc.plot(angles, [100 * r["ece"] for r in table], "s--", ms=3, label="ECE")
    ax_acc.set_ylabel("%")
    ax_acc.set_ylim(0, 100)
    ax_acc.legend(fontsize=8)
    ax_acc.set_title(
        f"Accuracy {first['acc']:.2%} at {first['angle']:g}°, "
        f"{last['acc']:.2%} at {last['angle']:g}°",
        fontsize=10,
    )
    ax_epi.plot(angles, [r["epistemic"] for r in table], "o-", ms=3, color="tab:red")
    ax_epi.set_title("Mean epistemic uncertainty", fontsize=10)
    ax_tot.plot(angles, [r["total"] for r in table], "o-", ms=3, color="tab:gray")
    ax_tot.set_title("Mean total uncertainty", fontsize=10)
    for ax in (ax_acc, ax_epi, ax_tot):
        ax.set_xlabel("rotation angle (degrees)")
        ax.set_xticks(_labelled_angles(angles))
    for ax in (ax_epi, ax_tot):
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


def _labelled_angles(angles: list[float], most: int = 7) -> list[float]:
    """At most ``most`` of the sorted ``angles`` to label, the first and the last among them:
    every ``step``-th, the fewest steps that span them (73 angles 0..360 by 5: every 12th,
    0, 60, ..., 360), then the last, where the steps do not end on it (the one before it
    dropped where nearer to it than half a step, so that their labels do not crowd)."""
    last = len(angles) - 1
    step = max(1, -(-last // (most - 1)))
    picked = list(range(0, last, step))
    if len(picked) > 1 and last - picked[-1] < step / 2:
        picked.pop()
    return [angles[i] for i in [*picked, last]]
