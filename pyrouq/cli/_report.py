"""What ``pyrouq fit`` and ``pyrouq evaluate`` report: fit's line of each epoch as it ends, the
evaluation on the test split (tables, plots, metrics.json) and the post-hoc calibration of
``evaluate --calibrate / --conformal``."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pyrouq._words import as_typed
from pyrouq.cli._build import CommandError


class EpochLines:
    """`pyrouq fit`'s line of each epoch (loss, its NLL and KL, running train accuracy, time),
    printed when the epoch ends: called with its record as fit()'s callback, after the epoch's
    checkpoint is written. A log (``--no-progress`` under a batch scheduler) shows each epoch
    as it finishes, and a run stopped by Ctrl-C or SIGTERM has printed the epochs it finished.
    :meth:`history` prints the records of a history not printed yet, in order: one trained
    in full and finished without training, an interrupted one's. A resumed run's earlier
    epochs are :meth:`hold`-en until fit() has taken the run (its resume checks passed, its
    first epoch ended) or it stopped training (:meth:`release`): a refused ``--resume``
    prints none of them before its error. Each epoch is printed once."""

    def __init__(self) -> None:
        self.printed: set[int] = set()
        self.held: list[Any] = []

    def hold(self, records: Any) -> None:
        self.held = list(records)

    def release(self) -> None:
        """Print the held records (a resumed run's earlier epochs)."""
        held, self.held = self.held, []
        for record in held:
            self._line(record)

    def __call__(self, record: Any) -> None:
        self.release()  # (the earlier epochs first)
        self._line(record)

    def history(self, records: Any) -> None:
        self.release()
        for record in records:
            self._line(record)

    def _line(self, record: Any) -> None:
        from pyrouq._progress import write

        if record.epoch in self.printed:
            return
        self.printed.add(record.epoch)
        write(  # beside fit()'s progress bar, flushed
            f"epoch {record.epoch}: loss {record.loss:.4g} (nll {record.nll:.4g}, "
            f"kl {record.kl:.4g}), train acc {100 * record.train_acc:.2f} %, "
            f"{record.seconds:.1f} s"
        )


def _calibrate(
    preds: Any, labels: Any, args: argparse.Namespace, factory: str | None
) -> dict[str, Any]:
    """Temperature scaling and/or conformal sets, fitted on a seeded half of the test set
    (the validation half) and reported on the other half; tables printed before and after.
    ``factory``: the run's (None: a model of pyrouq's own), which the warnings may name."""
    import pyrouq
    from pyrouq._temperature_warnings import temperature_words
    from pyrouq.cli._temperature_words import in_command_words

    n = labels.shape[0]
    order = _randperm(n, args.seed)
    val, rest = order[: n // 2], order[n // 2 :]

    def part(index: Any) -> Any:
        return pyrouq.Predictions(preds.probs[:, index], labels[index])

    val_preds, eval_preds = part(val), part(rest)
    targets = labels[rest]
    out: dict[str, Any] = {"validation_size": len(val), "evaluation_size": len(rest)}
    print(
        f"\nCalibration: fitted on {len(val)} test images (seed {args.seed}), reported on the "
        f"other {len(rest)}"
    )
    if args.calibrate == "temperature":
        with temperature_words(in_command_words(args.data_root, factory)):
            scaler = pyrouq.temperature_scale(val_preds)
        before = pyrouq.evaluate(eval_preds, targets)
        scaled_val, eval_preds = scaler(val_preds), scaler(eval_preds)
        after = pyrouq.evaluate(eval_preds, targets)
        val_preds = scaled_val
        out["temperature"] = scaler.temperature
        out["before"], out["after"] = before, after
        keys = ("acc", "nll", "brier", "ece", "aece")
        print(f"temperature {scaler.temperature:.4f}")
        print(f"{'':8}{'before':>10}{'after':>10}")
        for key in keys:
            print(f"{key:8}{before[key]:>10.4f}{after[key]:>10.4f}")
    if args.conformal is not None:
        print(f"\nConformal sets at alpha = {as_typed(args.conformal)}:")
        print(f"{'score':8}{'threshold':>11}{'coverage':>10}{'mean size':>11}")
        out["conformal"] = {}
        for score in ("lac", "aps", "raps"):
            predictor = pyrouq.conformal(
                val_preds, alpha=args.conformal, score=score, seed=args.seed
            )
            assert isinstance(predictor, pyrouq.ConformalClassifier)
            sets = predictor.predict_sets(eval_preds)
            row = {
                "threshold": predictor.threshold,
                "coverage": pyrouq.coverage(sets, targets),
                "mean_set_size": pyrouq.mean_set_size(sets),
            }
            out["conformal"][score] = row
            print(
                f"{score:8}{row['threshold']:>11.4f}{row['coverage']:>10.4f}"
                f"{row['mean_set_size']:>11.3f}"
            )
    return out


def _randperm(n: int, seed: int) -> Any:
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------
# shared steps
# --------------------------------------------------------------------------------------------


def _ood_images(dataset: str, ood: str, args: argparse.Namespace) -> Any:
    """The out-of-distribution images (normalised like the training data), or None."""
    import pyrouq

    if ood == "auto":
        ood = "fashion-mnist" if dataset == "mnist" else "mnist"
    if ood == "none":
        return None
    try:
        loader = pyrouq.ood_loader(1024, root=args.data_root, dataset=ood)  # type: ignore[arg-type]
    except FileNotFoundError:
        # --data-root (or $PYROUQ_DATA) holds the training data set only: the OOD set is a
        # test split, and both test splits ship with pyrouq
        from pyrouq._idx import _BUNDLED_ROOT

        loader = pyrouq.ood_loader(1024, root=_BUNDLED_ROOT, dataset=ood)  # type: ignore[arg-type]
    return loader.transform(loader.images)


@contextlib.contextmanager
def _finite(images: str, model: Any, guide: Any) -> Iterator[None]:
    """predict()'s refusal of NaN or inf probabilities (its advice: check the model outputs)
    in the command's words where the weights diverged in training without a non-finite loss
    (the last update's), which a lower --lr avoids: non-finite weights, or every image's
    outputs (weights so large that the outputs overflow). Otherwise as it came: the network's
    own arithmetic fails on the inputs it names."""
    try:
        yield
    except ValueError as err:
        import torch

        text = " ".join(str(err).split())
        if not text.startswith("Expected finite probs"):
            raise
        held = [*model.parameters(), *(guide.parameters() if guide is not None else ())]
        counted = re.search(r"\((\d+) of (\d+) inputs;", text)
        every = counted is not None and counted[1] == counted[2]
        if not every and all(bool(torch.isfinite(p).all()) for p in held):
            raise
        which = f"{counted[1]} of the {counted[2]}" if counted else "some"
        raise CommandError(
            f"the trained network predicts NaN or inf probabilities for {which} "
            f"{images} images (did its weights diverge in training, after the last finite "
            "loss?); fit the run again with a lower --lr"
        ) from None


def _members(model: Any) -> int | None:
    """M of a BatchEnsemble or rank-1 model (pyrouq's, as a run builds them), else None."""
    from pyrouq.convert import BatchEnsembleNetwork, BayesianNetwork

    if isinstance(model, (BatchEnsembleNetwork, BayesianNetwork)) and model.num_members:
        return int(model.num_members)
    return None


def _evaluate(
    model: Any,
    guide: Any,
    test: Any,
    num_samples: int | None,
    dataset: str,
    ood: str,
    args: argparse.Namespace,
    result: Any = None,
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    import pyrouq
    from pyrouq import metrics as metrics_module
    from pyrouq import plotting
    from pyrouq.predictive import class_predictions

    start = time.perf_counter()
    x = test.transform(test.images)  # one tensor: predict picks its own batches
    progress = not args.no_progress
    with _finite("test", model, guide):
        preds = class_predictions(
            pyrouq.predict(model, x, guide, num_samples=num_samples, progress=progress), "pyrouq"
        )
    ood_preds = None
    x_ood = _ood_images(dataset, ood, args)
    if x_ood is not None:
        with _finite("out-of-distribution", model, guide):
            ood_preds = class_predictions(
                pyrouq.predict(
                    model, x_ood.to(x.device), guide, num_samples=num_samples, progress=progress
                ),
                "pyrouq",
            )
    # one network, or one posterior draw (S = 1), has no disagreement between draws: its mutual
    # information is 0
    single = preds.probs.shape[0] == 1
    score: Literal["entropy", "mutual_information"] = "entropy" if single else "mutual_information"
    metrics: dict[str, Any] = dict(
        pyrouq.evaluate(
            preds, test.labels, ood=ood_preds, ood_score=score if ood_preds is not None else None
        )
    )
    print()
    print(pyrouq.format_table(metrics))
    if ood_preds is not None:
        metrics["ood_score"] = score
    if ood_preds is not None and not single:
        metrics["ood_auroc_entropy"] = metrics_module.ood_auroc(  # only this metric again
            metrics_module.ood_scores(preds.probs, "entropy"),
            metrics_module.ood_scores(ood_preds.probs, "entropy"),
        )
    # S, the predictions averaged: a rank-1 model's draws x members, which --num-samples and
    # config.json count in draws; its M (null without members) says how many there are
    metrics["num_samples"] = preds.probs.shape[0]
    metrics["members"] = _members(model)
    metrics["eval_seconds"] = time.perf_counter() - start
    if ood_preds is not None and single:
        # a guide's one draw (--num-samples 1) could be more: a network without one cannot
        one = (
            "one posterior draw (--num-samples 1) has no mutual information; pass "
            "--num-samples 2 or more for it"
            if guide is not None
            else "one network has no mutual information"
        )
        print(f"(OOD score: predictive entropy; {one})")
    elif ood_preds is not None:
        print(f"(OOD score: mutual information; with entropy the AUROC is "
              f"{metrics['ood_auroc_entropy']:.4f})")  # fmt: skip
    preds, labels = preds.to("cpu"), test.labels.cpu()
    first = pyrouq.Predictions.from_probs(preds.probs[:, :32])
    figures = {
        "reliability": plotting.plot_reliability(preds, labels),
        "risk_coverage": plotting.plot_risk_coverage(preds, labels),
        "image_grid": plotting.plot_image_grid(
            first, test.transform(test.images[:32]).cpu(), labels[:32]
        ),
        "most_uncertain": plotting.plot_most_uncertain(preds, x.cpu(), targets=labels, k=6),
        "uncertainty": plotting.plot_uncertainty_distributions(
            preds, ood_preds.to("cpu") if ood_preds is not None else None
        ),
    }
    if result is not None:
        figures["training_curves"] = plotting.plot_training_curves(result)
    return metrics, figures, preds


#: The plots a run folder holds: `fit` writes ``<name>.png``, `evaluate` ``<name>-evaluate.png``
#: (and ``rotation-evaluate.png`` with ``--shift rotate``).
RUN_PLOTS = (
    "reliability",
    "risk_coverage",
    "image_grid",
    "most_uncertain",
    "uncertainty",
    "training_curves",
)


def _write_metrics(out: Path, metrics: dict[str, Any], name: str = "metrics.json") -> None:
    (out / name).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


def _save_plots(figures: dict[str, Any], out: Path) -> list[Path]:
    from pyrouq.plotting import save_figures

    return save_figures(figures, out)
